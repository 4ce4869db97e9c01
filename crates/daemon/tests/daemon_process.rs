//! The `softrdmad` process: default devices, IPv6, one daemon per socket, clean shutdown.

mod common;

use abi::client::Client;
use common::{connected_pair, Daemon};
use engine::{RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge};

#[test]
fn by_default_every_interface_is_a_device_and_loopback_only_when_asked() {
    let d = Daemon::start_with(|_| vec!["--loopback".into()]);
    let devs = d.client().list_devices().unwrap();
    assert!(!devs.is_empty());
    for (i, dev) in devs.iter().enumerate() {
        assert_eq!(dev.name, format!("srxe{i}"));
        assert_eq!(dev.index, i as u32);
        assert_eq!(dev.port, d.port);
        assert!(!dev.addrs.is_empty(), "{dev:?}");
    }
    let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let has_lo = |devs: &[abi::proto::DeviceInfo]| devs.iter().any(|d| d.addrs.contains(&lo));
    assert!(has_lo(&devs), "--loopback includes lo: {devs:?}");
    let others = devs.iter().filter(|d| !d.addrs.contains(&lo)).count();
    drop(d);
    if others > 0 {
        // Without --loopback, loopback is left out when the host has another interface.
        let d = Daemon::start_with(|_| vec![]);
        let devs = d.client().list_devices().unwrap();
        assert!(!has_lo(&devs), "{devs:?}");
        assert_eq!(devs.len(), others);
    }
}

#[test]
fn rc_works_over_ipv6() {
    let d = Daemon::start_with(|_| vec!["--addr".into(), "::1".into()]);
    let (mut a, mut b) = connected_pair(&d, 4096);
    b.client
        .post_recv(
            b.qp,
            &RecvWr::new(
                1,
                vec![Sge {
                    addr: b.buf.addr(),
                    length: 64,
                    lkey: b.lkey,
                }],
            ),
        )
        .unwrap();
    a.client
        .post_send(
            a.qp,
            &SendWr {
                wr_id: 2,
                op: SendOp::Send,
                flags: SendFlags::from_bits_truncate(2),
                payload: SendPayload::Inline(b"over ipv6".to_vec().into()),
            },
        )
        .unwrap();
    assert_eq!(a.wait(1)[0].status, 0);
    assert_eq!(b.wait(1)[0].byte_len, 9);
    assert_eq!(b.buf.read(0, 9), b"over ipv6");
    let s = d.stats();
    assert!(
        s.get("srxe0.rx_packets") >= 2,
        "device counters are exported"
    );
}

#[test]
fn a_second_daemon_on_the_same_socket_refuses_and_sigterm_removes_the_socket() {
    let d = Daemon::start();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_softrdmad"))
        .args(["--addr", "127.0.0.1", "--port", &(d.port + 1).to_string()])
        .arg("--socket")
        .arg(&d.socket)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already listens"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The first daemon still serves.
    Client::connect(&d.socket).unwrap();
    let pid = nix::unistd::Pid::from_raw(d.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let mut d = d;
    let status = d.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!d.socket.exists(), "the socket file is removed on SIGTERM");
}

#[test]
fn another_clients_lkey_is_useless_on_my_qp() {
    let d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    b.buf.write(0, b"secret of b");
    a.client
        .post_recv(
            a.qp,
            &RecvWr::new(
                1,
                vec![Sge {
                    addr: a.buf.addr(),
                    length: 64,
                    lkey: a.lkey,
                }],
            ),
        )
        .unwrap();
    // a SENDs from b's buffer with b's lkey: the MR is in b's PD, not a's QP's.
    a.client
        .post_send(
            a.qp,
            &SendWr {
                wr_id: 5,
                op: SendOp::Send,
                flags: SendFlags::from_bits_truncate(2),
                payload: SendPayload::Sges(
                    vec![Sge {
                        addr: b.buf.addr(),
                        length: 11,
                        lkey: b.lkey,
                    }]
                    .into(),
                ),
            },
        )
        .unwrap();
    let w = a.wait(1);
    assert_eq!(w[0].wr_id, 5);
    assert_ne!(w[0].status, 0, "a foreign lkey must fail: {w:?}");
    assert_eq!(b.buf.read(0, 11), b"secret of b");
}
