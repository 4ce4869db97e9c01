//! Two hosts on one machine for the tests: two network namespaces joined by a veth pair.
//! Shared by the namespace tests of the CLI, the daemon and the drop-ins (the others include
//! this file with `#[path]`).
//!
//! Creating namespaces needs root (`ip netns`, as CI runs); without it the test FAILS saying
//! so, never passes silently. The namespaces are deleted on drop, even when a test fails.

#![allow(dead_code)]

use std::process::Command;

/// Run `ip args`; the error says which command failed and why.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces `a` and `b`, veth `va` in `a` (10.77.`subnet`.1) and `vb` in `b`
/// (10.77.`subnet`.2). Deleted on drop (the veth pair goes with them).
pub struct Hosts {
    /// Namespace of host a.
    pub a: String,
    /// Namespace of host b.
    pub b: String,
    /// The veth end in a.
    pub va: String,
    /// The veth end in b.
    pub vb: String,
    /// Address of host a.
    pub addr_a: String,
    /// Address of host b.
    pub addr_b: String,
}

impl Hosts {
    pub fn new(tag: &str, subnet: u8, mtu: u32) -> Hosts {
        let pid = std::process::id() % 100_000;
        let h = Hosts {
            a: format!("softrdma-{tag}-{pid}-a"),
            b: format!("softrdma-{tag}-{pid}-b"),
            va: format!("sr{tag}{pid}a"),
            vb: format!("sr{tag}{pid}b"),
            addr_a: format!("10.77.{subnet}.1"),
            addr_b: format!("10.77.{subnet}.2"),
        };
        let vb = h.vb.clone();
        // Leftovers of an earlier run of this very process id would make `add` fail.
        let _ = ip(&["netns", "del", &h.a]);
        let _ = ip(&["netns", "del", &h.b]);
        if let Err(e) = ip(&["netns", "add", &h.a]) {
            panic!(
                "this test needs root and `ip netns` (CI runs as root); creating a network \
                 namespace failed: {e}"
            );
        }
        // From here on, Drop cleans up whatever was made.
        let mtu = mtu.to_string();
        let cidr_a = format!("{}/24", h.addr_a);
        let cidr_b = format!("{}/24", h.addr_b);
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", &h.b],
            vec!["link", "add", &h.va, "type", "veth", "peer", "name", &vb],
            vec!["link", "set", &h.va, "netns", &h.a],
            vec!["link", "set", &vb, "netns", &h.b],
            vec!["-n", &h.a, "link", "set", &h.va, "mtu", &mtu],
            vec!["-n", &h.b, "link", "set", &vb, "mtu", &mtu],
            vec!["-n", &h.a, "addr", "add", &cidr_a, "dev", &h.va],
            vec!["-n", &h.b, "addr", "add", &cidr_b, "dev", &vb],
            vec!["-n", &h.a, "link", "set", "lo", "up"],
            vec!["-n", &h.b, "link", "set", "lo", "up"],
            vec!["-n", &h.a, "link", "set", &h.va, "up"],
            vec!["-n", &h.b, "link", "set", &vb, "up"],
        ];
        for s in steps {
            if let Err(e) = ip(&s) {
                panic!("setting up the namespaces failed: {e}");
            }
        }
        h
    }

    /// `cmd args` inside namespace `ns`.
    pub fn exec(ns: &str, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]).args(args);
        c
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}
