//! `ibv_devices` and `ibv_devinfo` (Debian ibverbs-utils, unmodified) list and describe the
//! softrdma device through the drop-in library.

mod common;

use std::time::Duration;

use common::{describe, free_udp_port, require, run, verbs_command};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn ibv_devices_lists_the_softrdma_device_with_its_guid() {
    require("ibv_devices", "ibverbs-utils");
    let o = run(
        verbs_command("ibv_devices", &[], "127.0.0.1", free_udp_port()),
        LIMIT,
    );
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("softrdma0"))
        .unwrap_or_else(|| panic!("no device line: {}", describe(&o)));
    // The GUID is "SR" (0x5352), the UDP port, then the IPv4 address 127.0.0.1.
    assert!(line.trim_end().ends_with("7f000001"), "{line}");
    assert!(line.contains("5352"), "{line}");
}

#[test]
fn ibv_devinfo_shows_an_active_roce_port() {
    require("ibv_devinfo", "ibverbs-utils");
    let o = run(
        verbs_command("ibv_devinfo", &[], "127.0.0.1", free_udp_port()),
        LIMIT,
    );
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "hca_id:\tsoftrdma0",
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
    let o = run(
        verbs_command("ibv_devinfo", &["-v"], "127.0.0.2", free_udp_port()),
        LIMIT,
    );
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
