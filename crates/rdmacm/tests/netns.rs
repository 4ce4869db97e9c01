//! The unmodified Debian rdma_cm programs between two hosts: two network namespaces joined by
//! a veth pair with the usual 1500-byte MTU, the server in one and the client in the other,
//! each through the drop-ins `libibverbs.so.1` + `librdmacm.so.1` on the `softrdmad` of its
//! namespace (one daemon per host, serving the namespace's address on UDP 4791). The same
//! programs, arguments and checks as on one host (programs.rs, [`cm_programs`]); here the CM
//! MADs and the data cross a real link between two daemons.
//!
//! Needs root (`ip netns`, as CI runs); without it the test FAILS saying so.

mod cm_programs;
#[path = "../../ibverbs/tests/common/mod.rs"]
mod common;
#[path = "../../cli/tests/hosts/mod.rs"]
mod hosts;
#[path = "../../ibverbs/tests/netns_host/mod.rs"]
mod netns_host;
mod rdmacm_lib;

use std::process::Command;
use std::time::Instant;

use cm_programs::{
    cmtime, ece, managed_qp, mckey, perftest, rdma_server_client, rping, ucmatose, udaddy, Sides,
};
use hosts::Hosts;
use netns_host::Host;

/// The server on host a, the client on host b.
struct TwoHosts<'a> {
    a: Host<'a>,
    b: Host<'a>,
}

impl Sides for TwoHosts<'_> {
    fn server(&self, prog: &str, args: &[&str]) -> Command {
        self.a.command(prog, args)
    }

    fn client(&self, prog: &str, args: &[&str]) -> Command {
        self.b.command(prog, args)
    }

    fn server_addr(&self) -> &str {
        self.a.addr
    }

    fn client_addr(&self) -> &str {
        self.b.addr
    }

    fn assert_alive(&mut self) {
        self.a.daemon.assert_alive();
        self.b.daemon.assert_alive();
    }

    fn server_listens(&self) -> Option<u64> {
        Some(self.a.daemon.cm_listens())
    }
}

/// One program run between the hosts, with its checks.
type Run = fn(&mut TwoHosts);

#[test]
fn rdma_cm_programs_run_between_two_network_namespaces() {
    let h = Hosts::new("cm", 8, 1500);
    // Declared after the namespaces: the daemons are killed before the namespaces go.
    let mut hosts = TwoHosts {
        a: Host::new(&h.a, &h.addr_a),
        b: Host::new(&h.b, &h.addr_b),
    };
    let runs: [(&str, Run); 13] = [
        // The server binds its own address: the device whose GID table holds it.
        ("rping", |s| {
            let own = s.a.addr;
            rping(s, own)
        }),
        ("ucmatose", |s| ucmatose(s)),
        ("udaddy", |s| udaddy(s)),
        // The receiver's daemon joins the group's IP address on its veth; the sender's
        // datagrams to the group cross the link.
        ("mckey", |s| mckey(s, "239.7.8.9")),
        ("rdma_server+rdma_client", |s| rdma_server_client(s)),
        ("cmtime", |s| cmtime(s)),
        ("managed_qp", |s| managed_qp(s)),
        ("ece", |s| ece(s)),
        // The port reports the MTU the 1500-byte link carries, so no packet is too big for
        // the veth.
        ("ib_write_bw -R", |s| perftest(s, "ib_write_bw", "65536")),
        ("ib_read_bw -R", |s| perftest(s, "ib_read_bw", "65536")),
        ("ib_send_lat -R", |s| perftest(s, "ib_send_lat", "2")),
        ("ib_write_lat -R", |s| perftest(s, "ib_write_lat", "2")),
        // The wildcard listens on every device of host a's daemon.
        ("rping, server on 0.0.0.0", |s| rping(s, "0.0.0.0")),
    ];
    for (name, run) in runs {
        let start = Instant::now();
        run(&mut hosts);
        println!("{name}: passed in {:.1?}", start.elapsed());
    }
}
