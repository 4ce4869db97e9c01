//! One host of a two-namespace test: a network namespace of [`Hosts`], its address, and the
//! `softrdmad` serving that address on UDP 4791 (one daemon per host, as on real machines).
//! Shared by the libibverbs and librdmacm drop-ins' namespace tests, which include this file
//! beside `common` and `hosts` (it uses both as `crate::common` and `crate::hosts`).

#![allow(dead_code)]

use std::process::{Command, Stdio};

use crate::common::{configure, On, TestDaemon};
use crate::hosts::Hosts;

/// One host: its namespace, address and daemon.
pub struct Host<'a> {
    /// Its network namespace.
    pub ns: &'a str,
    /// The address its daemon serves.
    pub addr: &'a str,
    /// Its `softrdmad`, killed on drop.
    pub daemon: TestDaemon,
}

impl<'a> Host<'a> {
    /// Start the namespace's daemon on its address.
    pub fn new(ns: &'a str, addr: &'a str) -> Host<'a> {
        let daemon =
            TestDaemon::start_with(&[addr], Some(4791), |bin, args| Hosts::exec(ns, bin, args));
        Host { ns, addr, daemon }
    }

    /// `prog args` inside the namespace with the drop-in library on the host's daemon.
    pub fn command(&self, prog: &str, args: &[&str]) -> Command {
        let mut c = Hosts::exec(self.ns, prog, args);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        configure(
            &mut c,
            On::Daemon {
                daemon: &self.daemon,
                addr: self.addr,
            },
        );
        c
    }
}
