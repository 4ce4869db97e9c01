//! Hostile peers against UC and UD QPs (and an SRQ and a memory window behind them):
//! well-formed packets with valid ICRCs but random opcodes, PSNs, keys, Q_Keys, lengths and
//! addresses, some of them to a multicast group two UD QPs joined (or to the multicast QPN
//! alone). Nothing may panic, the QPs stay usable, and whatever lands in memory lands only
//! where a key allowed it.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::*;
use engine::{
    AccessFlags, Counter, Engine, EngineConfig, Instant, MwBind, MwType, QpState, QpType, RecvWr,
    SendWr, SrqAttr,
};
use sim::Rng;
use wire::{
    BthRepr, DethRepr, IpRepr, Ipv4Repr, Opcode, Psn, Qkey, Qpn, RethRepr, Rkey, TransportRepr,
};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 0, 0, 7);
const BASE: u64 = 0x5000_0000;
const LEN: usize = 1 << 20;

#[test]
fn random_uc_and_ud_packets_never_break_the_engine() {
    let seed = sim::seeds::seeds_from_env(1)[0];
    let mut rng = Rng::new(seed ^ 0x0405_711e);
    let mem = TestMemory::default();
    mem.add_region(OWNER, BASE, LEN);
    // A fenced-off tail the keys below never cover: it must stay zero.
    let guarded = BASE + (LEN as u64) - 0x1000;
    let mut e = Engine::new(
        EngineConfig::new(vec![IpAddr::V4(B)], seed),
        Box::new(mem.clone()),
    );
    let pd = e.alloc_pd().unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND;
    let mr = e.reg_mr(pd, OWNER, BASE, guarded - BASE, access).unwrap();
    let srq = e
        .create_srq(
            pd,
            &SrqAttr {
                max_wr: 64,
                max_sge: 2,
                srq_limit: 8,
            },
        )
        .unwrap();
    let ud = new_qp4(&mut e, pd, QpType::Ud, 64, Some(srq), None);
    ud_up(&mut e, ud.qpn, 0x1234);
    let mc = new_qp4(&mut e, pd, QpType::Ud, 64, None, None);
    ud_up(&mut e, mc.qpn, 0x1234);
    e.attach_mcast(ud.qpn, GROUP.into()).unwrap();
    e.attach_mcast(mc.qpn, GROUP.into()).unwrap();
    let uc = new_qp4(&mut e, pd, QpType::Uc, 64, None, None);
    connect4(
        &mut e,
        QpType::Uc,
        uc.qpn,
        IpAddr::V4(A),
        0x99,
        engine::PathMtu::Mtu1024,
        0,
        0,
    );
    let uc2 = new_qp4(&mut e, pd, QpType::Uc, 64, Some(srq), None);
    connect4(
        &mut e,
        QpType::Uc,
        uc2.qpn,
        IpAddr::V4(A),
        0x9a,
        engine::PathMtu::Mtu1024,
        0,
        0,
    );
    let mw = e.alloc_mw(pd, MwType::Type2).unwrap();
    let mw_rkey = engine::inc_rkey(mw.rkey);
    let bind = MwBind {
        mr: mr.handle,
        addr: BASE,
        length: 0x1_0000,
        access: AccessFlags::REMOTE_WRITE,
    };
    e.post_send(uc.qpn, SendWr::bind_mw(1, mw.handle, mw_rkey, bind))
        .unwrap();
    let mut buf = vec![0u8; 9000];
    let now = Instant::from_nanos(0);
    while e.poll_transmit(now, &mut buf).is_some() {}
    assert_eq!(e.query_mw(mw.handle).unwrap(), (mw_rkey, true));

    let qpns = [ud.qpn, uc.qpn, uc2.qpn];
    let opcodes: Vec<Opcode> = (0u8..=0xff)
        .filter_map(|c| Opcode::from_u8(c).ok())
        .filter(|o| {
            let t = o.transport();
            t == wire::Transport::Uc || t == wire::Transport::Ud || (rng.chance(0.3))
        })
        .collect();
    let mut psn = [0u32; 3];
    let mut pkt = vec![0u8; 9000];
    const N: usize = 20_000;
    for i in 0..N {
        let q = rng.below(3) as usize;
        let op = opcodes[rng.below(opcodes.len() as u64) as usize];
        if rng.chance(0.8) {
            psn[q] = psn[q].wrapping_add(1) & 0xff_ffff;
        } else {
            psn[q] = rng.below(1 << 24) as u32;
        }
        // One packet in five is for the group: mostly to the multicast QPN, sometimes to a
        // QP's own; mostly to the group's address, sometimes to ours.
        let (dst, dest_qp) = if rng.chance(0.2) {
            (
                if rng.chance(0.9) { GROUP } else { B },
                if rng.chance(0.8) {
                    engine::MULTICAST_QPN
                } else {
                    qpns[q]
                },
            )
        } else {
            (B, qpns[q])
        };
        let mut bth = BthRepr::new(op, Qpn::new(dest_qp), Psn::new(psn[q]));
        bth.solicited = rng.chance(0.1);
        let mut t = TransportRepr::new(bth);
        let ext = op.ext();
        let plen = match rng.below(4) {
            0 => 0,
            1 => 1024,
            2 => rng.below(1100) as usize,
            _ => rng.below(4200) as usize,
        };
        if ext.reth {
            let va = match rng.below(3) {
                0 => BASE + rng.below(LEN as u64),
                1 => BASE + rng.below(0x1_0000),
                _ => rng.next_u64(),
            };
            let rkey = match rng.below(4) {
                0 => mr.rkey,
                1 => mw_rkey,
                2 => mw.rkey,
                _ => Rkey::new(rng.next_u64() as u32),
            };
            let dma_len = if rng.chance(0.5) {
                plen as u32
            } else {
                rng.next_u64() as u32
            };
            t.reth = Some(RethRepr { va, rkey, dma_len });
        }
        if ext.deth {
            let qkey = if rng.chance(0.7) {
                0x1234
            } else {
                rng.next_u64() as u32
            };
            t.deth = Some(DethRepr {
                qkey: Qkey::new(qkey),
                src_qp: Qpn::new(rng.below(1 << 24) as u32),
            });
        }
        if ext.immdt {
            t.immdt = Some(rng.next_u64() as u32);
        }
        if ext.ieth {
            t.ieth = Some(if rng.chance(0.5) { mw_rkey } else { mr.rkey });
        }
        if ext.aeth {
            t.aeth = Some(wire::AethRepr {
                syndrome: wire::Syndrome::ACK_NO_CREDIT,
                msn: wire::Msn::new(0),
            });
        }
        if ext.atomic_eth {
            t.atomic_eth = Some(wire::AtomicEthRepr {
                va: BASE,
                rkey: mr.rkey,
                swap_add: 1,
                compare: 0,
            });
        }
        if ext.atomic_ack_eth {
            t.atomic_ack_eth = Some(wire::AtomicAckEthRepr { orig: 0 });
        }
        let payload: Vec<u8> = (0..plen).map(|k| (i + k) as u8).collect();
        let src = if rng.chance(0.9) {
            A
        } else {
            Ipv4Addr::new(10, 0, 0, 9)
        };
        let ip = IpRepr::V4(Ipv4Repr {
            src,
            dst,
            tos: 0,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            payload_len: 0,
        });
        let Ok(n) = wire::emit_packet(&ip, 0xc000, wire::ROCEV2_UDP_PORT, &t, &payload, &mut pkt)
        else {
            continue;
        };
        e.handle_datagram(now, &pkt[..n]);
        while e.poll_transmit(now, &mut buf).is_some() {}
        // Keep receives posted and completions drained.
        if e.srq_len(srq).unwrap() < 16 {
            for k in 0..32u64 {
                let at = BASE + 0x2_0000 + (k % 16) * 0x2000;
                let _ = e.post_srq_recv(
                    srq,
                    RecvWr::new(k, vec![engine::Sge::new(at, 0x2000, mr.lkey)]),
                );
            }
        }
        let _ = e.post_recv(
            mc.qpn,
            RecvWr::new(
                i as u64,
                vec![engine::Sge::new(BASE + 0x9_0000, 0x2000, mr.lkey)],
            ),
        );
        let _ = e.post_recv(
            uc.qpn,
            RecvWr::new(
                i as u64,
                vec![engine::Sge::new(BASE + 0x8_0000, 0x2000, mr.lkey)],
            ),
        );
        for q in [ud, uc, uc2, mc] {
            let _ = e.poll_cq(q.recv_cq, usize::MAX);
            let _ = e.poll_cq(q.send_cq, usize::MAX);
        }
        while let Some(ev) = e.get_async_event() {
            e.ack_async_event(&ev);
        }
    }
    let c = e.counters();
    assert!(
        c.get(Counter::RxPackets) > (N / 4) as u64,
        "{:?}",
        c.get(Counter::RxPackets)
    );
    assert!(c.get(Counter::RxQkeyMismatch) > 0);
    assert!(c.get(Counter::UcMessageDropped) > 0);
    assert!(c.get(Counter::RxMcastDelivered) > 0);
    assert!(c.get(Counter::RxMcastMismatch) > 0);
    assert!(
        e.qp_counters(mc.qpn)
            .unwrap()
            .get(Counter::RxMcastDelivered)
            > 0
    );
    for q in [ud, uc, uc2, mc] {
        assert_eq!(
            e.query_qp(q.qpn).unwrap().qp_state,
            QpState::Rts,
            "UC / UD never fail on input"
        );
    }
    assert_eq!(
        mem.get(OWNER, guarded, 0x1000),
        vec![0; 0x1000],
        "no write outside every key"
    );
}
