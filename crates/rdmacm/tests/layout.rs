//! Every struct, field offset and constant librdmacm shares with C, compared with what
//! rdma-core's own headers (Debian librdmacm-dev, libibverbs-dev) say, by compiling a C
//! program against them.

use std::mem::{offset_of, size_of};
use std::process::Command;

use rdmacm::ffi::*;

/// (what, C expression, Rust value).
type Row = (String, String, usize);

macro_rules! rows {
    ($( $cty:literal = $rty:ty { $( $cf:literal => $($rf:ident).+ ),* $(,)? } )*) => {{
        let mut v: Vec<Row> = Vec::new();
        $(
            v.push((
                format!("sizeof {}", $cty),
                format!("sizeof({})", $cty),
                size_of::<$rty>(),
            ));
            $(
                v.push((
                    format!("{}.{}", $cty, $cf),
                    format!("offsetof({}, {})", $cty, $cf),
                    offset_of!($rty, $($rf).+),
                ));
            )*
        )*
        v
    }};
}

fn layout_rows() -> Vec<Row> {
    rows! {
        "union ibv_gid" = ibv_gid {}
        "struct ibv_qp" = ibv_qp {
            "context" => context, "qp_context" => qp_context, "pd" => pd,
            "send_cq" => send_cq, "recv_cq" => recv_cq, "srq" => srq, "handle" => handle,
            "qp_num" => qp_num, "state" => state, "qp_type" => qp_type,
        }
        "struct ibv_pd" = ibv_pd { "context" => context }
        "struct ibv_qp_cap" = ibv_qp_cap {
            "max_send_wr" => max_send_wr, "max_recv_wr" => max_recv_wr,
            "max_send_sge" => max_send_sge, "max_recv_sge" => max_recv_sge,
            "max_inline_data" => max_inline_data,
        }
        "struct ibv_qp_init_attr" = ibv_qp_init_attr {
            "qp_context" => qp_context, "send_cq" => send_cq, "recv_cq" => recv_cq,
            "srq" => srq, "cap" => cap, "qp_type" => qp_type, "sq_sig_all" => sq_sig_all,
        }
        "struct ibv_qp_init_attr_ex" = ibv_qp_init_attr_ex_head {
            "qp_context" => qp_context, "cap" => cap, "qp_type" => qp_type,
            "sq_sig_all" => sq_sig_all, "comp_mask" => comp_mask, "pd" => pd,
        }
        "struct ibv_srq_init_attr" = ibv_srq_init_attr { "srq_context" => srq_context, "attr" => attr }
        "struct ibv_global_route" = ibv_global_route {
            "dgid" => dgid, "flow_label" => flow_label, "sgid_index" => sgid_index,
            "hop_limit" => hop_limit, "traffic_class" => traffic_class,
        }
        "struct ibv_ah_attr" = ibv_ah_attr {
            "grh" => grh, "dlid" => dlid, "sl" => sl, "src_path_bits" => src_path_bits,
            "static_rate" => static_rate, "is_global" => is_global, "port_num" => port_num,
        }
        "struct ibv_qp_attr" = ibv_qp_attr {
            "qp_state" => qp_state, "cur_qp_state" => cur_qp_state, "path_mtu" => path_mtu,
            "path_mig_state" => path_mig_state, "qkey" => qkey, "rq_psn" => rq_psn,
            "sq_psn" => sq_psn, "dest_qp_num" => dest_qp_num,
            "qp_access_flags" => qp_access_flags, "cap" => cap, "ah_attr" => ah_attr,
            "alt_ah_attr" => alt_ah_attr, "pkey_index" => pkey_index,
            "alt_pkey_index" => alt_pkey_index, "en_sqd_async_notify" => en_sqd_async_notify,
            "sq_draining" => sq_draining, "max_rd_atomic" => max_rd_atomic,
            "max_dest_rd_atomic" => max_dest_rd_atomic, "min_rnr_timer" => min_rnr_timer,
            "port_num" => port_num, "timeout" => timeout, "retry_cnt" => retry_cnt,
            "rnr_retry" => rnr_retry, "alt_port_num" => alt_port_num,
            "alt_timeout" => alt_timeout, "rate_limit" => rate_limit,
        }
        "struct ibv_ece" = ibv_ece { "vendor_id" => vendor_id, "options" => options, "comp_mask" => comp_mask }
        "struct ibv_sa_path_rec" = ibv_sa_path_rec {
            "dgid" => dgid, "sgid" => sgid, "dlid" => dlid, "slid" => slid,
            "raw_traffic" => raw_traffic, "flow_label" => flow_label, "hop_limit" => hop_limit,
            "traffic_class" => traffic_class, "reversible" => reversible,
            "numb_path" => numb_path, "pkey" => pkey, "sl" => sl,
            "mtu_selector" => mtu_selector, "mtu" => mtu, "rate_selector" => rate_selector,
            "rate" => rate, "packet_life_time_selector" => packet_life_time_selector,
            "packet_life_time" => packet_life_time, "preference" => preference,
        }
        "struct rdma_ib_addr" = rdma_ib_addr { "sgid" => sgid, "dgid" => dgid, "pkey" => pkey }
        "struct rdma_addr" = rdma_addr {
            "src_addr" => src, "src_storage" => src, "dst_addr" => dst, "dst_storage" => dst,
            "addr.ibaddr" => ibaddr,
        }
        "struct rdma_route" = rdma_route { "addr" => addr, "path_rec" => path_rec, "num_paths" => num_paths }
        "struct rdma_event_channel" = rdma_event_channel { "fd" => fd }
        "struct rdma_cm_id" = rdma_cm_id {
            "verbs" => verbs, "channel" => channel, "context" => context, "qp" => qp,
            "route" => route, "ps" => ps, "port_num" => port_num, "event" => event,
            "send_cq_channel" => send_cq_channel, "send_cq" => send_cq,
            "recv_cq_channel" => recv_cq_channel, "recv_cq" => recv_cq, "srq" => srq,
            "pd" => pd, "qp_type" => qp_type,
        }
        "struct rdma_conn_param" = rdma_conn_param {
            "private_data" => private_data, "private_data_len" => private_data_len,
            "responder_resources" => responder_resources, "initiator_depth" => initiator_depth,
            "flow_control" => flow_control, "retry_count" => retry_count,
            "rnr_retry_count" => rnr_retry_count, "srq" => srq, "qp_num" => qp_num,
        }
        "struct rdma_ud_param" = rdma_ud_param {
            "private_data" => private_data, "private_data_len" => private_data_len,
            "ah_attr" => ah_attr, "qp_num" => qp_num, "qkey" => qkey,
        }
        "struct rdma_cm_event" = rdma_cm_event {
            "id" => id, "listen_id" => listen_id, "event" => event, "status" => status,
            "param" => param, "param.conn" => param, "param.ud" => param,
        }
        "struct rdma_addrinfo" = rdma_addrinfo {
            "ai_flags" => ai_flags, "ai_family" => ai_family, "ai_qp_type" => ai_qp_type,
            "ai_port_space" => ai_port_space, "ai_src_len" => ai_src_len,
            "ai_dst_len" => ai_dst_len, "ai_src_addr" => ai_src_addr,
            "ai_dst_addr" => ai_dst_addr, "ai_src_canonname" => ai_src_canonname,
            "ai_dst_canonname" => ai_dst_canonname, "ai_route_len" => ai_route_len,
            "ai_route" => ai_route, "ai_connect_len" => ai_connect_len,
            "ai_connect" => ai_connect, "ai_next" => ai_next,
        }
        "struct rdma_cm_join_mc_attr_ex" = rdma_cm_join_mc_attr_ex {
            "comp_mask" => comp_mask, "join_flags" => join_flags, "addr" => addr,
        }
    }
}

fn value_rows() -> Vec<Row> {
    let mut v: Vec<Row> = Vec::new();
    let mut c = |name: &str, val: usize| v.push((name.to_string(), name.to_string(), val));
    let events = [
        ("RDMA_CM_EVENT_ADDR_RESOLVED", ev::ADDR_RESOLVED),
        ("RDMA_CM_EVENT_ADDR_ERROR", ev::ADDR_ERROR),
        ("RDMA_CM_EVENT_ROUTE_RESOLVED", ev::ROUTE_RESOLVED),
        ("RDMA_CM_EVENT_ROUTE_ERROR", ev::ROUTE_ERROR),
        ("RDMA_CM_EVENT_CONNECT_REQUEST", ev::CONNECT_REQUEST),
        ("RDMA_CM_EVENT_CONNECT_RESPONSE", ev::CONNECT_RESPONSE),
        ("RDMA_CM_EVENT_CONNECT_ERROR", ev::CONNECT_ERROR),
        ("RDMA_CM_EVENT_UNREACHABLE", ev::UNREACHABLE),
        ("RDMA_CM_EVENT_REJECTED", ev::REJECTED),
        ("RDMA_CM_EVENT_ESTABLISHED", ev::ESTABLISHED),
        ("RDMA_CM_EVENT_DISCONNECTED", ev::DISCONNECTED),
        ("RDMA_CM_EVENT_DEVICE_REMOVAL", ev::DEVICE_REMOVAL),
        ("RDMA_CM_EVENT_MULTICAST_JOIN", ev::MULTICAST_JOIN),
        ("RDMA_CM_EVENT_MULTICAST_ERROR", ev::MULTICAST_ERROR),
        ("RDMA_CM_EVENT_ADDR_CHANGE", ev::ADDR_CHANGE),
        ("RDMA_CM_EVENT_TIMEWAIT_EXIT", ev::TIMEWAIT_EXIT),
    ];
    for (n, x) in events {
        c(n, x as usize);
    }
    for (n, x) in [
        ("RDMA_PS_IPOIB", ps::IPOIB),
        ("RDMA_PS_TCP", ps::TCP),
        ("RDMA_PS_UDP", ps::UDP),
        ("RDMA_PS_IB", ps::IB),
        ("RDMA_UDP_QKEY", RDMA_UDP_QKEY),
        ("IBV_QP_INIT_ATTR_PD", IBV_QP_INIT_ATTR_PD),
        ("IBV_QPS_RESET", qps::RESET),
        ("IBV_QPS_INIT", qps::INIT),
        ("IBV_QPS_RTR", qps::RTR),
        ("IBV_QPS_RTS", qps::RTS),
        ("IBV_QPT_RC", qpt::RC),
        ("IBV_QPT_UD", qpt::UD),
        ("IBV_ACCESS_LOCAL_WRITE", ACCESS_LOCAL_WRITE),
        ("IBV_ACCESS_REMOTE_WRITE", ACCESS_REMOTE_WRITE),
        ("IBV_ACCESS_REMOTE_READ", ACCESS_REMOTE_READ),
        ("IBV_ACCESS_REMOTE_ATOMIC", ACCESS_REMOTE_ATOMIC),
    ] {
        c(n, x as usize);
    }
    for (n, x) in [
        ("RAI_PASSIVE", RAI_PASSIVE),
        ("RAI_NUMERICHOST", RAI_NUMERICHOST),
        ("RAI_NOROUTE", RAI_NOROUTE),
        ("RAI_FAMILY", RAI_FAMILY),
        ("IBV_QP_STATE", qp_mask::STATE),
        ("IBV_QP_ACCESS_FLAGS", qp_mask::ACCESS_FLAGS),
        ("IBV_QP_PKEY_INDEX", qp_mask::PKEY_INDEX),
        ("IBV_QP_PORT", qp_mask::PORT),
        ("IBV_QP_QKEY", qp_mask::QKEY),
        ("IBV_QP_SQ_PSN", qp_mask::SQ_PSN),
        ("RDMA_OPTION_ID", opt::LEVEL_ID),
        ("RDMA_OPTION_IB", opt::LEVEL_IB),
        ("RDMA_OPTION_ID_TOS", opt::ID_TOS),
        ("RDMA_OPTION_ID_REUSEADDR", opt::ID_REUSEADDR),
        ("RDMA_OPTION_ID_AFONLY", opt::ID_AFONLY),
        ("RDMA_OPTION_ID_ACK_TIMEOUT", opt::ID_ACK_TIMEOUT),
        ("RDMA_OPTION_IB_PATH", opt::IB_PATH),
    ] {
        c(n, x as usize);
    }
    let mut o =
        |label: &str, expr: &str, val: usize| v.push((label.to_string(), expr.to_string(), val));
    o(
        "ibv_device_attr.max_qp_rd_atom",
        "offsetof(struct ibv_device_attr, max_qp_rd_atom)",
        DEVICE_ATTR_MAX_QP_RD_ATOM,
    );
    o(
        "ibv_device_attr.max_qp_init_rd_atom",
        "offsetof(struct ibv_device_attr, max_qp_init_rd_atom)",
        DEVICE_ATTR_MAX_QP_INIT_RD_ATOM,
    );
    o(
        "ibv_port_attr.active_mtu",
        "offsetof(struct ibv_port_attr, active_mtu)",
        PORT_ATTR_ACTIVE_MTU,
    );
    o(
        "ibv_port_attr.gid_tbl_len",
        "offsetof(struct ibv_port_attr, gid_tbl_len)",
        PORT_ATTR_GID_TBL_LEN,
    );
    v
}

/// Make sure the rdma-core headers are there (Debian librdmacm-dev, libibverbs-dev).
fn require_headers() {
    if std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists()
        && std::path::Path::new("/usr/include/infiniband/verbs.h").exists()
    {
        return;
    }
    let st = Command::new("apt-get")
        .args([
            "install",
            "-y",
            "--no-install-recommends",
            "librdmacm-dev",
            "libibverbs-dev",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status();
    assert!(
        std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists(),
        "rdma-core headers missing and apt-get did not install them ({st:?})"
    );
}

#[test]
fn every_shared_struct_and_constant_matches_rdma_cores_headers() {
    require_headers();
    // ibv_qp, ibv_pd and ibv_qp_init_attr_ex are declared up to the fields librdmacm
    // uses (it never allocates them): their offsets count, not their sizes.
    let prefixes = [
        "struct ibv_qp",
        "struct ibv_pd",
        "struct ibv_qp_init_attr_ex",
    ];
    let rows: Vec<Row> = layout_rows()
        .into_iter()
        .filter(|(what, _, _)| !prefixes.iter().any(|p| what == &format!("sizeof {p}")))
        .chain(value_rows())
        .collect();
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\
         #include <infiniband/sa.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (_, expr, _) in &rows {
        src.push_str(&format!("  printf(\"%lld\\n\", (long long)({expr}));\n"));
    }
    src.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("rdmacm-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let c = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c, src).expect("write C file");
    let cc = Command::new("cc")
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().expect("run layout program");
    let text = String::from_utf8_lossy(&out.stdout);
    let got: Vec<i64> = text
        .lines()
        .map(|l| l.trim().parse().expect("number"))
        .collect();
    assert_eq!(got.len(), rows.len());
    let wrong: Vec<String> = rows
        .iter()
        .zip(&got)
        .filter(|((_, _, r), c)| *r as i64 != **c)
        .map(|((what, _, r), c)| format!("{what}: C {c}, Rust {r}"))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "layout differs:\n{}", wrong.join("\n"));
    // Not vacuous: every struct and constant above was compared.
    assert!(rows.len() > 150, "{} rows", rows.len());
}
