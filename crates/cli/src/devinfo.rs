//! `softrdma devinfo`: what `ibv_devinfo` prints, for the device on an address: softrdmad's
//! when a daemon serves it, else an embedded one (see [`crate::tool::DeviceOptions`]).

use std::fmt::Write as _;
use std::net::IpAddr;

use engine::{AtomicCap, PortState};
use softrdma::{DeviceAttr, Gid, PortAttr};

use crate::tool::{
    backend_description, device_name, open_device, BackendArg, DeviceOptions, Result,
};

/// Options of `softrdma devinfo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevinfoArgs {
    /// Local address of the device (its GID 0).
    #[arg(long, default_value = "127.0.0.1")]
    pub addr: IpAddr,
    /// UDP port the device receives on [default: 4791, or softrdmad's]. A port softrdmad
    /// does not serve opens an embedded device.
    #[arg(long)]
    pub udp_port: Option<u16>,
    /// Backend: embedded (a device in this process) or daemon (softrdmad's device on the
    /// address). Default: $SOFTRDMA_BACKEND, else softrdmad when it answers on its socket
    /// and serves the address (and --udp-port, if given), else embedded.
    #[arg(long, value_enum, value_name = "KIND")]
    pub backend: Option<BackendArg>,
    /// Print every device attribute and the GID table, as `ibv_devinfo -v` does.
    #[arg(short, long)]
    pub verbose: bool,
    /// Keep the device open this many seconds after printing (to watch an idle device's CPU
    /// use or capture).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub hold: u64,
}

/// Open the device and print its attributes.
pub fn run(args: &DevinfoArgs) -> Result<()> {
    let opts = DeviceOptions {
        backend: args.backend.map(Into::into),
        udp_port: args.udp_port,
        ..DeviceOptions::default()
    };
    let dev = open_device(args.addr, &opts)?;
    let text = format_devinfo(
        &Header {
            name: &device_name(&dev),
            backend: &backend_description(&dev),
            bound: &dev.local_addr().to_string(),
        },
        &dev.query_device(),
        &dev.query_port()?,
        &dev.gids(),
        args.verbose,
    );
    print!("{text}");
    if args.hold > 0 {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::thread::sleep(std::time::Duration::from_secs(args.hold));
    }
    Ok(())
}

/// `ibv_mtu` enum value of an MTU in bytes.
/// A GUID as `ibv_devinfo` and sysfs write it: four groups of four hex digits.
pub(crate) fn guid_text(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        g >> 48,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

fn mtu_enum(bytes: usize) -> u32 {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

/// What `devinfo` says about the device besides its attributes.
#[derive(Debug, Clone, Copy)]
pub struct Header<'a> {
    /// The device's name (`hca_id`): softrdmad's (`srxe0`...) or `softrdma0`.
    pub name: &'a str,
    /// Its backend, as [`crate::tool::backend_description`] words it.
    pub backend: &'a str,
    /// The address and UDP port it receives on.
    pub bound: &'a str,
}

/// Render the device as `ibv_devinfo` does (tab-indented `name:\tvalue` lines), with its
/// backend and address.
pub fn format_devinfo(
    h: &Header<'_>,
    d: &DeviceAttr,
    p: &PortAttr,
    gids: &[Gid],
    verbose: bool,
) -> String {
    let mut s = String::new();
    // `writeln!` into a String cannot fail.
    let _ = writeln!(s, "hca_id:\t{} (UDP {})", h.name, h.bound);
    let _ = writeln!(s, "\tbackend:\t\t\t{}", h.backend);
    let _ = writeln!(s, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(s, "\tfw_ver:\t\t\t\t{}", d.fw_ver);
    let _ = writeln!(s, "\tnode_guid:\t\t\t{}", guid_text(d.node_guid));
    let _ = writeln!(s, "\tsys_image_guid:\t\t\t{}", guid_text(d.sys_image_guid));
    let _ = writeln!(s, "\tvendor_id:\t\t\t{:#06x}", d.vendor_id);
    let _ = writeln!(s, "\tvendor_part_id:\t\t\t{}", d.vendor_part_id);
    let _ = writeln!(s, "\thw_ver:\t\t\t\t{:#x}", d.hw_ver);
    let _ = writeln!(s, "\tphys_port_cnt:\t\t\t{}", d.phys_port_cnt);
    if verbose {
        let atomic = match d.atomic_cap {
            AtomicCap::None => "ATOMIC_NONE (0)",
            AtomicCap::Hca => "ATOMIC_HCA (1)",
            AtomicCap::Glob => "ATOMIC_GLOB (2)",
        };
        let rows: [(&str, String); 22] = [
            ("max_mr_size", format!("{:#x}", d.max_mr_size)),
            ("page_size_cap", format!("{:#x}", d.page_size_cap)),
            ("max_qp", d.max_qp.to_string()),
            ("max_qp_wr", d.max_qp_wr.to_string()),
            ("max_sge", d.max_sge.to_string()),
            ("max_sge_rd", d.max_sge_rd.to_string()),
            ("max_cq", d.max_cq.to_string()),
            ("max_cqe", d.max_cqe.to_string()),
            ("max_mr", d.max_mr.to_string()),
            ("max_pd", d.max_pd.to_string()),
            ("max_qp_rd_atom", d.max_qp_rd_atom.to_string()),
            ("max_qp_init_rd_atom", d.max_qp_init_rd_atom.to_string()),
            ("max_res_rd_atom", d.max_res_rd_atom.to_string()),
            ("atomic_cap", atomic.to_string()),
            ("max_mw", d.max_mw.to_string()),
            ("max_ah", d.max_ah.to_string()),
            ("max_srq", d.max_srq.to_string()),
            ("max_srq_wr", d.max_srq_wr.to_string()),
            ("max_srq_sge", d.max_srq_sge.to_string()),
            ("max_pkeys", d.max_pkeys.to_string()),
            ("max_inline_data", d.max_inline_data.to_string()),
            ("local_ca_ack_delay", "15".to_string()),
        ];
        for (k, v) in rows {
            let tabs = if k.len() >= 15 { "\t\t" } else { "\t\t\t" };
            let _ = writeln!(s, "\t{k}:{tabs}{v}");
        }
    }
    let state = match p.state {
        PortState::Active => "PORT_ACTIVE (4)",
        _ => "PORT_DOWN (1)",
    };
    let _ = writeln!(s, "\t\tport:\t1");
    let _ = writeln!(s, "\t\t\tstate:\t\t\t{state}");
    let (max, act) = (p.max_mtu.bytes(), p.active_mtu.bytes());
    let _ = writeln!(s, "\t\t\tmax_mtu:\t\t{max} ({})", mtu_enum(max));
    let _ = writeln!(s, "\t\t\tactive_mtu:\t\t{act} ({})", mtu_enum(act));
    let _ = writeln!(s, "\t\t\tsm_lid:\t\t\t0");
    let _ = writeln!(s, "\t\t\tport_lid:\t\t0");
    let _ = writeln!(s, "\t\t\tport_lmc:\t\t0x00");
    let _ = writeln!(s, "\t\t\tlink_layer:\t\tEthernet");
    if verbose {
        let _ = writeln!(s, "\t\t\tmax_msg_sz:\t\t{:#x}", p.max_msg_sz);
        let _ = writeln!(s, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
        let _ = writeln!(s, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
        for (i, g) in gids.iter().enumerate() {
            let _ = writeln!(s, "\t\t\tGID[{i:3}]:\t\t{g}, RoCE v2 ({})", g.to_ip());
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_the_ibv_devinfo_fields() {
        let d = DeviceAttr::default();
        let dev = open_device(
            "127.0.0.1".parse().unwrap(),
            &DeviceOptions {
                backend: Some(softrdma::BackendKind::Embedded),
                udp_port: Some(27391),
                ..DeviceOptions::default()
            },
        )
        .unwrap();
        let p = dev.query_port().unwrap();
        let h = Header {
            name: "softrdma0",
            backend: "embedded",
            bound: "127.0.0.1:27391",
        };
        let out = format_devinfo(&h, &d, &p, &dev.gids(), true);
        for key in [
            "hca_id:\tsoftrdma0 (UDP 127.0.0.1:27391)",
            "backend:\t\t\tembedded",
            "transport:",
            "fw_ver:",
            "phys_port_cnt:",
            "max_qp:",
            "state:\t\t\tPORT_ACTIVE (4)",
            "active_mtu:\t\t4096 (5)",
            "link_layer:\t\tEthernet",
            "GID[  0]:",
            "127.0.0.1",
        ] {
            assert!(out.contains(key), "{key} missing from\n{out}");
        }
    }
}
