//! `ibv_devices` and `ibv_devinfo` (Debian ibverbs-utils, unmodified) list and describe the
//! devices of a `softrdmad` (the default backend), and the embedded device, through the
//! drop-in library.

mod common;

use std::time::Duration;

use common::{describe, free_udp_port, require, run, verbs_command, On, TestDaemon};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn ibv_devices_lists_every_device_of_the_daemon_with_its_guid() {
    require("ibv_devices", "ibverbs-utils");
    let d = TestDaemon::start(&["127.0.0.1", "127.0.0.2"]);
    let on = On::Daemon {
        daemon: &d,
        addr: "127.0.0.1",
    };
    let o = run(verbs_command("ibv_devices", &[], on), LIMIT);
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for (name, addr) in [("srxe0", "7f000001"), ("srxe1", "7f000002")] {
        let line = text
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no {name} line: {}", describe(&o)));
        // The GUID is "SR" (0x5352), the UDP port, then the IPv4 address.
        assert!(line.trim_end().ends_with(addr), "{line}");
        assert!(
            line.contains(&format!("5352{:04x}", d.port)),
            "{line} (port {})",
            d.port
        );
    }
}

#[test]
fn ibv_devinfo_shows_an_active_roce_port_of_the_daemon() {
    require("ibv_devinfo", "ibverbs-utils");
    let d = TestDaemon::start(&["127.0.0.1"]);
    let on = On::Daemon {
        daemon: &d,
        addr: "127.0.0.1",
    };
    let o = run(verbs_command("ibv_devinfo", &[], on), LIMIT);
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "hca_id:\tsrxe0",
        "phys_port_cnt:\t\t\t1",
        "PORT_ACTIVE (4)",
        "active_mtu:\t\t4096 (5)",
        "link_layer:\t\tEthernet",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{}", describe(&o));
    }
}

#[test]
fn ibv_devinfo_verbose_prints_the_device_limits_and_gid() {
    require("ibv_devinfo", "ibverbs-utils");
    let d = TestDaemon::start(&["127.0.0.2"]);
    let on = On::Daemon {
        daemon: &d,
        addr: "127.0.0.2",
    };
    let o = run(verbs_command("ibv_devinfo", &["-v"], on), LIMIT);
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in ["max_qp:", "max_cqe:", "atomic_cap:", "GID[  0]:"] {
        assert!(text.contains(want), "missing {want:?} in\n{}", describe(&o));
    }
    // GID 0 is the IPv4-mapped address of the device (RoCE v2).
    assert!(
        text.contains("::ffff:127.0.0.2")
            || text.contains("0000:0000:0000:0000:0000:ffff:7f00:0002"),
        "{}",
        describe(&o)
    );
}

#[test]
fn ibv_devinfo_describes_the_embedded_device() {
    require("ibv_devinfo", "ibverbs-utils");
    let on = On::Embedded {
        addr: "127.0.0.2",
        port: free_udp_port(),
    };
    let o = run(verbs_command("ibv_devinfo", &["-v"], on), LIMIT);
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in ["hca_id:\tsoftrdma0", "PORT_ACTIVE (4)", "GID[  0]:"] {
        assert!(text.contains(want), "missing {want:?} in\n{}", describe(&o));
    }
}
