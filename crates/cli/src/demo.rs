//! `softrdma demo`: a few-second tour of the verbs model between two devices on loopback
//! (127.0.0.1 and 127.0.0.2), narrated, ending with short benchmark tables beside the
//! raw-socket baseline. Both devices are softrdmad's when a daemon answers and serves both
//! addresses (or `--backend daemon`), else both are embedded in this process.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softrdma::{
    AccessFlags, BackendKind, Buffer, Device, MemoryRegion, Qp, QpType, WcFlags, WcOpcode,
    DEFAULT_QKEY, GRH_LEN,
};

use crate::perf::{self, PerfArgs, Test};
use crate::tool::{backend_description, open_device, BackendArg, DeviceOptions, Result, ToolError};

/// Options of `softrdma demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// UDP port of the two devices [default: 4791 (RoCEv2), or softrdmad's]. Embedded
    /// devices whose port is taken on 127.0.0.1 or 127.0.0.2 (another demo, a daemon that
    /// does not serve both) use a free one instead, and the demo says so.
    #[arg(long)]
    pub udp_port: Option<u16>,
    /// Skip the benchmark tables at the end.
    #[arg(long)]
    pub no_bench: bool,
    /// Write every packet device A sends and receives to a pcap file (embedded devices).
    #[arg(long, value_name = "FILE.pcap")]
    pub capture: Option<std::path::PathBuf>,
    /// Backend of both devices: embedded (in this process) or daemon (softrdmad's devices on
    /// 127.0.0.1 and 127.0.0.2). Default: $SOFTRDMA_BACKEND, else embedded when --capture
    /// asks for it, else softrdmad when it answers on its socket and serves both addresses
    /// (and --udp-port, if given), else embedded.
    #[arg(long, value_enum, value_name = "KIND")]
    pub backend: Option<BackendArg>,
}

const WAIT: Option<Duration> = Some(Duration::from_secs(5));

struct Host {
    name: &'static str,
    dev: Device,
    cq: softrdma::Cq,
    qp: Qp,
    mr: MemoryRegion<Buffer>,
}

fn host(name: &'static str, ip: IpAddr, opts: &DeviceOptions) -> Result<Host> {
    let dev = open_device(ip, opts)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(64)?;
    let qp = pd.qp_builder(&cq, &cq).build()?;
    let mr = pd.register(
        Buffer::zeroed(4096),
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
    )?;
    Ok(Host {
        name,
        dev,
        cq,
        qp,
        mr,
    })
}

fn check(cond: bool, what: impl Into<String>) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(ToolError::Verify(what.into()))
    }
}

/// Run the tour, narrating to `out`.
pub fn run(args: &DemoArgs, out: &mut dyn Write) -> Result<()> {
    macro_rules! say {
        ($($t:tt)*) => {{ let _ = writeln!(out, $($t)*); let _ = out.flush(); }};
    }
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let kind = choose_backend(args, &[a_ip, b_ip])?;
    let daemon = kind == BackendKind::Daemon;
    if daemon {
        say!("softrdma demo: RDMA in software, RoCEv2 over UDP, two devices of softrdmad.\n");
    } else {
        say!("softrdma demo: RDMA in software, RoCEv2 over UDP, two devices in this process.\n");
    }
    // Embedded devices need the port free on both addresses; softrdmad's serve theirs.
    let port = match (daemon, args.udp_port) {
        (true, p) => p,
        (false, p) => {
            let wanted = p.unwrap_or(wire::ROCEV2_UDP_PORT);
            let port = pick_udp_port(wanted, &[a_ip, b_ip])?;
            if port != wanted {
                say!(
                    "(UDP port {wanted} is taken here; using {port}. Packets still carry destination port 4791\n \
                     inside the engine, so captures decode as RoCEv2.)\n"
                );
            }
            Some(port)
        }
    };
    let args = &DemoArgs {
        udp_port: port,
        ..args.clone()
    };
    let opts = DeviceOptions {
        backend: Some(kind),
        udp_port: args.udp_port,
        ..DeviceOptions::default()
    };
    {
        if daemon {
            say!("1. Open two soft RDMA devices: softrdmad runs them, this process drives them");
            say!("   over its control socket and work and completion rings in shared memory.");
        } else {
            say!("1. Open two soft RDMA devices (each owns a UDP socket and a progress thread).");
        }
        let a = host(
            "A",
            a_ip,
            &DeviceOptions {
                capture: args.capture.clone(),
                ..opts.clone()
            },
        )?;
        let b = host("B", b_ip, &opts)?;
        let (ba, bb) = (backend_description(&a.dev), backend_description(&b.dev));
        if ba == bb {
            say!("   Backend: {ba}");
        } else {
            say!("   Backend: A {ba}, B {bb}");
        }
        for h in [&a, &b] {
            let port = h.dev.query_port()?;
            say!(
                "   device {} on {}  GID {}  active MTU {}  max QPs {}",
                h.name,
                h.dev.local_addr(),
                h.dev.gid(0)?,
                port.active_mtu.bytes(),
                h.dev.query_device().max_qp
            );
        }

        say!("\n2. Each side: a protection domain, a completion queue, a 4 KiB memory region,");
        say!("   and an RC queue pair. They swap QPN, PSN, GID and the region's address/rkey");
        say!("   (across hosts `softrdma::handshake` does this over TCP) and walk INIT -> RTR -> RTS.");
        let ea = a.qp.endpoint(Some(a.mr.remote(..)?))?;
        let eb = b.qp.endpoint(Some(b.mr.remote(..)?))?;
        a.qp.connect(&eb)?;
        b.qp.connect(&ea)?;
        say!(
            "   A: QPN {:#08x} rkey {:#010x}   B: QPN {:#08x} rkey {:#010x}   both {:?}",
            a.qp.qpn(),
            a.mr.rkey(),
            b.qp.qpn(),
            b.mr.rkey(),
            a.qp.state()?
        );
        let b_mr = eb
            .mr
            .ok_or_else(|| ToolError::Verify("B advertised no region".into()))?;

        say!("\n3. SEND / RECV: B posts a receive buffer; A sends a message into it.");
        let msg = b"hello from A over RoCEv2";
        b.qp.recv(10, &[b.mr.sge(0..256)?])?;
        a.mr.write(0, msg)?;
        a.qp.send(1, &[a.mr.sge(0..msg.len())?])?;
        let sent = a.cq.wait_ok(WAIT)?;
        let got = b.cq.wait_ok(WAIT)?;
        let mut text = vec![0u8; got.byte_len as usize];
        b.mr.read(0, &mut text)?;
        check(text == msg, "B received other bytes than A sent")?;
        say!(
            "   A completion: {:?}   B completion: {:?}, {} bytes: {:?}",
            sent.opcode,
            got.opcode,
            got.byte_len,
            String::from_utf8_lossy(&text)
        );

        say!("\n4. RDMA WRITE: A writes straight into B's memory; B posts nothing and gets no completion.");
        let w = b"placed by A with RDMA WRITE";
        a.mr.write(512, w)?;
        let at = b_mr
            .offset(1024)
            .ok_or_else(|| ToolError::Verify("offset".into()))?;
        a.qp.write(2, &[a.mr.sge(512..512 + w.len())?], &at)?;
        check(
            a.cq.wait_ok(WAIT)?.opcode == WcOpcode::RdmaWrite,
            "WRITE completion",
        )?;
        let mut seen = vec![0u8; w.len()];
        b.mr.read(1024, &mut seen)?;
        check(seen == w, "B's memory does not hold what A wrote")?;
        check(
            b.cq.poll_one()?.is_none(),
            "a WRITE produced a completion at B",
        )?;
        say!(
            "   B's memory at +1024 now reads {:?}",
            String::from_utf8_lossy(&seen)
        );

        say!("\n5. RDMA READ: B leaves data in its region; A fetches it without B's CPU.");
        let r = b"B's data, fetched by A";
        b.mr.write(2048, r)?;
        let from = b_mr
            .offset(2048)
            .ok_or_else(|| ToolError::Verify("offset".into()))?;
        a.qp.read(3, &[a.mr.sge(1024..1024 + r.len())?], &from)?;
        check(
            a.cq.wait_ok(WAIT)?.opcode == WcOpcode::RdmaRead,
            "READ completion",
        )?;
        let mut fetched = vec![0u8; r.len()];
        a.mr.read(1024, &mut fetched)?;
        check(fetched == r, "A read other bytes than B holds")?;
        say!("   A fetched {:?}", String::from_utf8_lossy(&fetched));

        say!("\n6. ATOMICS on an 8-byte word in B's memory (B's word starts at 100).");
        b.mr.write_u64(3072, 100)?;
        let word = b_mr
            .offset(3072)
            .ok_or_else(|| ToolError::Verify("offset".into()))?;
        a.qp.fetch_add(4, a.mr.sge(2048..2056)?, &word, 5)?;
        a.cq.wait_ok(WAIT)?;
        let (old, now) = (a.mr.read_u64(2048)?, b.mr.read_u64(3072)?);
        check(
            old == 100 && now == 105,
            format!("fetch-and-add: old {old}, now {now}"),
        )?;
        say!("   fetch_add(5):          returned {old}, B's word is now {now}");
        a.qp.compare_swap(5, a.mr.sge(2056..2064)?, &word, 105, 7)?;
        a.cq.wait_ok(WAIT)?;
        let (old, now) = (a.mr.read_u64(2056)?, b.mr.read_u64(3072)?);
        check(
            old == 105 && now == 7,
            format!("compare-and-swap: old {old}, now {now}"),
        )?;
        say!("   compare_swap(105 -> 7): returned {old}, B's word is now {now}");

        say!("\n7. UD message: a datagram QP on each device, no connection. A sends one packet");
        say!("   through an address handle built from B's GID, to B's UD QPN with the Q_Key;");
        say!("   B's receive buffer gets the 40-byte GRH first, and the completion names A's QP.");
        ud_message(&a, &b, a_ip, b_ip, out)?;

        match (a.dev.try_runtime(), b.dev.try_runtime()) {
            (Some(ra), Some(rb)) => {
                let (ca, cb) = (ra.io_counters(), rb.io_counters());
                say!(
                    "\n   Datagrams so far: A sent {} / received {}, B sent {} / received {} (UDP port {}).",
                    ca.tx_datagrams,
                    ca.rx_datagrams,
                    cb.tx_datagrams,
                    cb.rx_datagrams,
                    a.dev.local_addr().port()
                );
            }
            _ => {
                let (ta, ra) = packets(&a.dev)?;
                let (tb, rb) = packets(&b.dev)?;
                say!(
                    "\n   Packets so far, by softrdmad's device counters (shared with its other clients;"
                );
                say!(
                    "   `softrdma stat` shows them all): A sent {ta} / received {ra}, B sent {tb} / received {rb}."
                );
            }
        }
        let _ = (a.name, b.name);
    }
    if args.no_bench {
        say!("\ndemo done.");
        return Ok(());
    }
    say!("\n8. Short benchmarks (perftest tables) with raw sockets on the same path beside them.");
    for (test, size, iters) in [(Test::WriteBw, 65536, 3000), (Test::WriteLat, 2, 3000)] {
        let pa = PerfArgs {
            peer: None,
            size: Some(size),
            all: false,
            iters: Some(iters),
            tx_depth: None,
            qps: 1,
            duration: None,
            port: 0,
            report_gbits: false,
            bind: None,
            udp_port: args.udp_port,
            backend: Some(if daemon {
                BackendArg::Daemon
            } else {
                BackendArg::Embedded
            }),
            mtu: 4096,
            atomic_type: perf::AtomicType::FETCH_AND_ADD,
            baseline: true,
            loopback: true,
            capture: None,
            events: false,
            busy: false,
            busy_poll: None,
            embedded_busy_poll: None,
            gid_index: 0,
            ib_dev: None,
            ib_port: 1,
            cpu_freq: false,
        };
        say!(
            "\n$ softrdma {} --loopback -s {size} -n {iters} --baseline{}",
            test.name(),
            if daemon { " --backend daemon" } else { "" }
        );
        perf::run(test, &pa, out)?;
    }
    say!("\ndemo done: every step checked its result.");
    Ok(())
}

/// The backend of both demo devices (on `ips`): `--backend`, else `$SOFTRDMA_BACKEND`, else
/// embedded for `--capture`, else softrdmad's when it answers and would serve every address
/// (and `--udp-port`), else embedded: one backend for both, so that an embedded device never
/// sends to a port only softrdmad's device would listen on, or the other way round.
fn choose_backend(args: &DemoArgs, ips: &[IpAddr]) -> Result<BackendKind> {
    if let Some(b) = args.backend {
        return Ok(b.into());
    }
    if let Some(k) = BackendKind::from_env()? {
        return Ok(k);
    }
    if args.capture.is_some() {
        return Ok(BackendKind::Embedded);
    }
    for ip in ips {
        let mut b = Device::builder(*ip);
        if let Some(p) = args.udp_port {
            b = b.port(p);
        }
        if b.choose_backend()? != BackendKind::Daemon {
            return Ok(BackendKind::Embedded);
        }
    }
    Ok(BackendKind::Daemon)
}

/// Packets a daemon device sent and received (its engine counters, by name).
fn packets(dev: &Device) -> Result<(u64, u64)> {
    let v = dev.counter_values()?;
    let get = |name: &str| v.iter().find(|(n, _)| n == name).map_or(0, |&(_, x)| x);
    Ok((get("tx_packets"), get("rx_packets")))
}

/// Step 7: one UD SEND from A to B, checked: payload, length with the GRH, source QP, the
/// GRH's addresses (for IPv4 its last 20 bytes are the IPv4 header, as Linux RoCE writes it).
fn ud_message(a: &Host, b: &Host, a_ip: IpAddr, b_ip: IpAddr, out: &mut dyn Write) -> Result<()> {
    let make = |h: &Host| -> Result<(softrdma::Cq, Qp)> {
        let cq = h.dev.create_cq(8)?;
        let qp =
            h.qp.pd()
                .qp_builder(&cq, &cq)
                .qp_type(QpType::Ud)
                .qkey(DEFAULT_QKEY)
                .build()?;
        Ok((cq, qp))
    };
    let (a_cq, a_ud) = make(a)?;
    let (b_cq, b_ud) = make(b)?;
    // B: a receive of up to 256 bytes behind the GRH, at +3328 in its region.
    const AT: usize = 3328;
    b_ud.recv(20, &[b.mr.sge(AT..AT + GRH_LEN + 256)?])?;
    let ah = a.qp.pd().create_ah(b.dev.gid(0)?)?;
    let msg = b"a UD datagram from A";
    a.mr.write(3072, msg)?;
    a_ud.send_ud(
        21,
        &[a.mr.sge(3072..3072 + msg.len())?],
        &ah,
        b_ud.qpn(),
        DEFAULT_QKEY,
    )?;
    check(
        a_cq.wait_ok(WAIT)?.opcode == WcOpcode::Send,
        "UD send completion",
    )?;
    let wc = b_cq.wait_ok(WAIT)?;
    check(wc.opcode == WcOpcode::Recv, "UD receive completion")?;
    check(
        wc.byte_len as usize == GRH_LEN + msg.len(),
        format!(
            "UD receive of {} bytes, expected {GRH_LEN} + {}",
            wc.byte_len,
            msg.len()
        ),
    )?;
    check(
        wc.src_qp == a_ud.qpn(),
        format!(
            "UD source QP {:#x}, expected A's {:#x}",
            wc.src_qp,
            a_ud.qpn()
        ),
    )?;
    check(
        wc.wc_flags.contains(WcFlags::GRH),
        "UD completion without the GRH flag",
    )?;
    let mut grh = [0u8; GRH_LEN];
    b.mr.read(AT, &mut grh)?;
    let mut text = vec![0u8; msg.len()];
    b.mr.read(AT + GRH_LEN, &mut text)?;
    check(text == msg, "B received other bytes than A sent over UD")?;
    // IPv4: the header sits in the GRH's last 20 bytes; source at +12, destination at +16.
    let v4 = |o: usize| IpAddr::V4(Ipv4Addr::new(grh[o], grh[o + 1], grh[o + 2], grh[o + 3]));
    let (src, dst) = (v4(20 + 12), v4(20 + 16));
    check(
        grh[20] >> 4 == 4 && src == a_ip && dst == b_ip,
        format!("the GRH names {src} -> {dst}, expected {a_ip} -> {b_ip}"),
    )?;
    let _ = writeln!(
        out,
        "   A: UD QPN {:#08x} -> B: UD QPN {:#08x}, Q_Key {DEFAULT_QKEY:#010x}",
        a_ud.qpn(),
        b_ud.qpn()
    );
    let _ = writeln!(
        out,
        "   B completion: {:?}, {} bytes = {GRH_LEN}-byte GRH + {:?}",
        wc.opcode,
        wc.byte_len,
        String::from_utf8_lossy(&text)
    );
    let _ = writeln!(
        out,
        "   from source QP {:#08x}; GRH (IPv4 header in its last 20 bytes): {src} -> {dst}",
        wc.src_qp
    );
    let _ = out.flush();
    Ok(())
}

/// `preferred` if a UDP socket can bind it on every address of `ips`, else a port the OS hands
/// out that can (tried a few times: another program may take it in between).
fn pick_udp_port(preferred: u16, ips: &[IpAddr]) -> Result<u16> {
    let free_on_all = |port: u16| {
        ips.iter()
            .all(|ip| std::net::UdpSocket::bind((*ip, port)).is_ok())
    };
    if free_on_all(preferred) {
        return Ok(preferred);
    }
    for _ in 0..16 {
        let probe = std::net::UdpSocket::bind((ips[0], 0))
            .map_err(crate::tool::io_ctx("find a free UDP port"))?;
        let port = probe
            .local_addr()
            .map_err(crate::tool::io_ctx("find a free UDP port"))?
            .port();
        drop(probe);
        if free_on_all(port) {
            return Ok(port);
        }
    }
    Err(ToolError::Usage(format!(
        "UDP port {preferred} is taken and no free port was found; pass --udp-port"
    )))
}
