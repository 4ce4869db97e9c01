//! Unmodified Debian rdma_cm programs (rdmacm-utils, perftest `-R`) as two processes on one
//! host through the drop-ins `libibverbs.so.1` + `librdmacm.so.1`: on two embedded devices
//! (server 127.0.0.1, client 127.0.0.2) and on one `softrdmad` of the test's own. Each run
//! asserts both exit statuses and what the programs print about the data they moved.

mod cm_programs;
#[path = "../../ibverbs/tests/common/mod.rs"]
mod common;
mod rdmacm_lib;

use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use cm_programs::{
    cmtime, ece, managed_qp, mckey, perftest, rdma_server_client, rping, ucmatose, udaddy, Sides,
    LIMIT,
};
use common::{describe, free_udp_port, require, run, verbs_command, Backend, On, TestDaemon};

/// Server and client on this host, on `Backend`'s devices.
struct OneHost {
    backend: Backend,
    /// The embedded devices' UDP port.
    udp: u16,
    /// The test daemon, on `Backend::Daemon`; killed on drop.
    daemon: Option<TestDaemon>,
    /// Where the embedded devices record their packets (`server.pcap`, `client.pcap`),
    /// decoded when a run fails.
    captures: tempfile::TempDir,
    /// One pair at a time: busy-polling programs side by side starve each other on a small
    /// machine. Held until the daemon is gone (fields drop in order).
    _one: MutexGuard<'static, ()>,
}

impl OneHost {
    fn new(backend: Backend) -> OneHost {
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        OneHost {
            backend,
            udp: free_udp_port(),
            daemon: match backend {
                Backend::Daemon => Some(TestDaemon::start(&["127.0.0.1"])),
                Backend::Embedded => None,
            },
            captures: tempfile::tempdir().expect("capture directory"),
            _one: one,
        }
    }

    /// `command` with its embedded device recording into `captures/<side>.pcap` (a client
    /// run again starts the file afresh); unchanged on the daemon, whose device records
    /// only with `--capture`.
    fn recorded(&self, mut command: Command, side: &str) -> Command {
        if self.daemon.is_none() {
            command.env(
                "SOFTRDMA_CAPTURE",
                self.captures.path().join(format!("{side}.pcap")),
            );
        }
        command
    }

    fn on<'a>(&'a self, addr: &'a str) -> On<'a> {
        match &self.daemon {
            Some(daemon) => On::Daemon { daemon, addr },
            None => On::Embedded {
                addr,
                port: self.udp,
            },
        }
    }
}

impl Sides for OneHost {
    fn server(&self, prog: &str, args: &[&str]) -> Command {
        self.recorded(verbs_command(prog, args, self.on("127.0.0.1")), "server")
    }

    fn client(&self, prog: &str, args: &[&str]) -> Command {
        self.recorded(
            verbs_command(prog, args, self.on(self.client_addr())),
            "client",
        )
    }

    fn server_addr(&self) -> &str {
        "127.0.0.1"
    }

    fn client_addr(&self) -> &str {
        match self.backend {
            Backend::Daemon => "127.0.0.1",
            Backend::Embedded => "127.0.0.2",
        }
    }

    fn assert_alive(&mut self) {
        if let Some(d) = self.daemon.as_mut() {
            d.assert_alive();
        }
    }

    fn server_listens(&self) -> Option<u64> {
        self.daemon.as_ref().map(TestDaemon::cm_listens)
    }

    fn evidence(&self) -> String {
        ["server", "client"]
            .iter()
            .map(|side| self.captures.path().join(format!("{side}.pcap")))
            .filter(|pcap| pcap.exists())
            .map(|pcap| format!("{}:\n{}", pcap.display(), common::decoded(&pcap).1))
            .collect()
    }
}

#[test]
fn rping_passes_three_pings_between_two_embedded_devices() {
    rping(&mut OneHost::new(Backend::Embedded), "0.0.0.0");
}

#[test]
fn rping_passes_three_pings_on_the_daemon() {
    rping(&mut OneHost::new(Backend::Daemon), "0.0.0.0");
}

#[test]
fn ucmatose_moves_data_over_two_connections_between_two_embedded_devices() {
    ucmatose(&mut OneHost::new(Backend::Embedded));
}

#[test]
fn ucmatose_moves_data_over_two_connections_on_the_daemon() {
    ucmatose(&mut OneHost::new(Backend::Daemon));
}

#[test]
fn udaddy_resolves_the_servers_ud_qps_and_exchanges_datagrams_between_two_embedded_devices() {
    udaddy(&mut OneHost::new(Backend::Embedded));
}

#[test]
fn udaddy_resolves_the_servers_ud_qps_and_exchanges_datagrams_on_the_daemon() {
    udaddy(&mut OneHost::new(Backend::Daemon));
}

/// mckey through one daemon: receiver and senders are processes on its one device.
#[test]
fn mckey_delivers_a_senders_datagrams_to_a_receiver_that_joined_the_group_on_the_daemon() {
    mckey(&mut OneHost::new(Backend::Daemon), "239.7.7.7");
}

/// mckey between two embedded devices (two processes, 127.0.0.1 and 127.0.0.2 on one UDP
/// port): the datagrams cross `lo` from the sender's device to the group's IP address,
/// which the receiver's device joined when its QP attached.
#[test]
fn mckey_delivers_a_senders_datagrams_to_a_receiver_that_joined_the_group_between_two_embedded_devices(
) {
    mckey(&mut OneHost::new(Backend::Embedded), "239.7.7.6");
}

#[test]
fn rdma_server_and_rdma_client_exchange_a_message_between_two_embedded_devices() {
    rdma_server_client(&mut OneHost::new(Backend::Embedded));
}

#[test]
fn rdma_server_and_rdma_client_exchange_a_message_on_the_daemon() {
    rdma_server_client(&mut OneHost::new(Backend::Daemon));
}

#[test]
fn qps_the_programs_move_themselves_connect_between_two_embedded_devices() {
    managed_qp(&mut OneHost::new(Backend::Embedded));
}

#[test]
fn qps_the_programs_move_themselves_connect_on_the_daemon() {
    managed_qp(&mut OneHost::new(Backend::Daemon));
}

#[test]
fn ece_set_on_each_side_reaches_the_other_and_a_refusal_says_35_between_two_embedded_devices() {
    ece(&mut OneHost::new(Backend::Embedded));
}

#[test]
fn ece_set_on_each_side_reaches_the_other_and_a_refusal_says_35_on_the_daemon() {
    ece(&mut OneHost::new(Backend::Daemon));
}

#[test]
fn cmtime_connects_and_disconnects_twenty_ids_between_two_embedded_devices() {
    cmtime(&mut OneHost::new(Backend::Embedded));
}

#[test]
fn cmtime_connects_and_disconnects_twenty_ids_on_the_daemon() {
    cmtime(&mut OneHost::new(Backend::Daemon));
}

#[test]
fn ib_write_bw_with_rdma_cm_between_two_embedded_devices() {
    perftest(&mut OneHost::new(Backend::Embedded), "ib_write_bw", "65536");
}

#[test]
fn ib_read_bw_with_rdma_cm_between_two_embedded_devices() {
    perftest(&mut OneHost::new(Backend::Embedded), "ib_read_bw", "65536");
}

#[test]
fn ib_send_lat_with_rdma_cm_between_two_embedded_devices() {
    perftest(&mut OneHost::new(Backend::Embedded), "ib_send_lat", "2");
}

#[test]
fn ib_write_bw_with_rdma_cm_on_the_daemon() {
    perftest(&mut OneHost::new(Backend::Daemon), "ib_write_bw", "65536");
}

#[test]
fn ib_read_bw_with_rdma_cm_on_the_daemon() {
    perftest(&mut OneHost::new(Backend::Daemon), "ib_read_bw", "65536");
}

#[test]
fn ib_send_lat_with_rdma_cm_on_the_daemon() {
    perftest(&mut OneHost::new(Backend::Daemon), "ib_send_lat", "2");
}

#[test]
fn with_another_libibverbs_every_call_fails_with_one_clear_message() {
    require("rping", "rdmacm-utils");
    // Only librdmacm.so.1 on the path: the program loads Debian's libibverbs.
    let dir = std::env::temp_dir().join(format!("softrdma-rdmacm-only-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let link = dir.join("librdmacm.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(rdmacm_lib::built(), &link).expect("symlink");
    let mut c = Command::new("rping");
    c.args(["-c", "-a", "127.0.0.1", "-p", "1"])
        .env("LD_LIBRARY_PATH", &dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let o = run(c, LIMIT);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!o.status.success(), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("is not softrdma's").count(),
        1,
        "{}",
        describe(&o)
    );
}
