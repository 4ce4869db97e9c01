//! Address handles that answer a received datagram: `ibv_init_ah_from_wc` and
//! `ibv_create_ah_from_wc`, computed as rdma-core's libibverbs computes them (verbs.c).
//!
//! A UD receive buffer starts with 40 bytes of GRH. On RoCEv2 they hold the packet's IPv6
//! header, or its 20-byte IPv4 header in the last 20 bytes (the first 20 are what the
//! driver left there: rxe and our engine zero them). The attribute points back at the
//! packet's source: its GID (IPv4-mapped for IPv4) is the destination, the source GID index
//! is the port's entry for the address the packet was sent to, hop limit and traffic class
//! are the packet's (TTL and TOS for IPv4), the flow label is the low 20 bits of the GRH's
//! first word; `dlid`, `sl` and `src_path_bits` are the completion's `slid`, `sl` and
//! `dlid_path_bits`.
//!
//! A completion without `IBV_WC_GRH` gives a non-global attribute, which rdma-core does not
//! refuse; an AH made from it is, on a RoCE port (EINVAL, as the kernel's
//! `rdma_check_ah_attr` and our `ibv_create_ah` refuse any non-global AH there). verbs.h
//! says `grh` is ignored then, so it may be NULL (rdma-core would read it regardless: it
//! copies the flow label from it, as we do when it is not NULL).

use core::ffi::c_int;
use std::net::Ipv4Addr;

use engine::GRH_LEN;
use wire::ipv4::{Ipv4, IPV4_HEADER_LEN, IP_PROTO_UDP};
use wire::ipv6::Ipv6;

use crate::abi::{ibv_ah, ibv_ah_attr, ibv_context, ibv_pd, ibv_wc};
use crate::device::ctx;
use crate::{fail, set_errno};

/// `IBV_WC_GRH`: the receive buffer starts with a GRH.
const IBV_WC_GRH: u32 = 1;

/// Where the IPv4 header sits in a RoCEv2 GRH buffer: its last 20 bytes.
const IPV4_AT: usize = GRH_LEN - IPV4_HEADER_LEN;

/// The GRH `next_hdr` of RoCE v1 (an IB BTH follows): rdma-core's `IB_NEXT_HDR`.
const IB_NEXT_HDR: u8 = 0x1b;

/// The two kinds of GID a GRH can name (rdma-core's `enum ibv_gid_type_sysfs`). Every GID
/// of our port is RoCE v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GidType {
    /// RoCE v1 (or IB): an IB GRH.
    RoceV1,
    /// RoCE v2: an IP header.
    RoceV2,
}

/// Which IP header the 40 bytes hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Header {
    /// IPv4 in the last 20 bytes.
    V4,
    /// IPv6 (or an IB GRH) in all 40.
    V6,
}

/// rdma-core's `get_grh_header_version`: version 6 in the first word means IPv6 unless the
/// last 20 bytes are a well-formed IPv4 header (IHL 5, checksum right), since a driver may
/// leave anything in front of an IPv4 header; otherwise IPv4 needs version 4 there.
fn header_of(grh: &[u8; GRH_LEN]) -> Result<Header, c_int> {
    let v6 = Ipv6::new_unchecked(&grh[..]);
    let v4 = Ipv4::new_unchecked(&grh[IPV4_AT..]);
    if v6.version() != 6 {
        return if v4.version() == 4 {
            Ok(Header::V4)
        } else {
            Err(libc::EPROTONOSUPPORT)
        };
    }
    if v4.ihl() != 5 {
        return Ok(Header::V6);
    }
    // The checksum as rdma-core checks it: computed with the field zeroed, compared with
    // the one stored.
    let mut copy = [0u8; IPV4_HEADER_LEN];
    copy.copy_from_slice(&grh[IPV4_AT..]);
    let mut recomputed = Ipv4::new_unchecked(&mut copy[..]);
    recomputed.fill_checksum();
    if recomputed.checksum() == v4.checksum() {
        Ok(Header::V4)
    } else {
        Ok(Header::V6)
    }
}

/// rdma-core's `ibv_find_gid_index`: the first entry of the port's table that is `gid` with
/// type `ty`. Running off the table is what `ibv_query_gid` fails with: EINVAL, as is a
/// port other than 1. An index beyond 255 cannot be an `sgid_index` (rdma-core would
/// truncate it): EINVAL too.
fn gid_index(gids: &[[u8; 16]], port_num: u8, gid: &[u8; 16], ty: GidType) -> Result<u8, c_int> {
    if port_num != 1 || ty != GidType::RoceV2 {
        return Err(libc::EINVAL);
    }
    gids.iter()
        .position(|g| g == gid)
        .and_then(|i| u8::try_from(i).ok())
        .ok_or(libc::EINVAL)
}

/// The attribute of an AH that answers the datagram `wc` reports, on port `port_num`
/// whose GID table is `gids`, with `grh` the first 40 bytes of its receive buffer (needed
/// only when `wc` has `IBV_WC_GRH`; EINVAL if it is missing then).
pub(crate) fn ah_attr_from_wc(
    gids: &[[u8; 16]],
    port_num: u8,
    wc: &ibv_wc,
    grh: Option<&[u8; GRH_LEN]>,
) -> Result<ibv_ah_attr, c_int> {
    let mut a = ibv_ah_attr {
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        port_num,
        ..ibv_ah_attr::default()
    };
    // rdma-core takes the flow label from the first word whatever the header is.
    if let Some(g) = grh {
        a.grh.flow_label = Ipv6::new_unchecked(&g[..]).flow_label();
    }
    if wc.wc_flags & IBV_WC_GRH == 0 {
        return Ok(a);
    }
    let grh = grh.ok_or(libc::EINVAL)?;
    let first = Ipv6::new_unchecked(&grh[..]);
    a.is_global = 1;
    match header_of(grh)? {
        Header::V4 => {
            let ip = Ipv4::new_unchecked(&grh[IPV4_AT..]);
            // A multicast destination is in no GID table.
            if ip.dst_addr().is_multicast() {
                return Err(libc::EINVAL);
            }
            let ours = mapped(ip.dst_addr());
            a.grh.sgid_index = gid_index(gids, port_num, &ours, GidType::RoceV2)?;
            a.grh.dgid = mapped(ip.src_addr());
            a.grh.hop_limit = ip.ttl();
            a.grh.traffic_class = ip.tos();
        }
        Header::V6 => {
            let dst = first.dst_addr().octets();
            if dst[0] == 0xff {
                return Err(libc::EINVAL);
            }
            let ty = match first.next_header() {
                IP_PROTO_UDP => GidType::RoceV2,
                IB_NEXT_HDR => GidType::RoceV1,
                _ => return Err(libc::EPROTONOSUPPORT),
            };
            a.grh.dgid = first.src_addr().octets();
            a.grh.sgid_index = gid_index(gids, port_num, &dst, ty)?;
            a.grh.hop_limit = first.hop_limit();
            a.grh.traffic_class = first.traffic_class();
        }
    }
    Ok(a)
}

/// The RoCEv2 GID of an IPv4 address.
fn mapped(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// [`ah_attr_from_wc`] on C pointers; EINVAL for a NULL or foreign one.
///
/// # Safety
/// Each pointer is NULL or valid: `context` from `ibv_open_device`, `wc` a completion,
/// `grh` the start of its receive buffer (40 bytes).
unsafe fn attr_from_c(
    context: *mut ibv_context,
    port_num: u8,
    wc: *const ibv_wc,
    grh: *const u8,
) -> Result<ibv_ah_attr, c_int> {
    if wc.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: NULL or a context of ours (the caller's contract); NULL gives None.
    let cx = unsafe { ctx(context) }.ok_or(libc::EINVAL)?;
    // SAFETY: non-NULL, the caller's completion (read unaligned: no alignment is promised).
    let wc = unsafe { wc.read_unaligned() };
    // SAFETY: non-NULL `struct ibv_grh *`: the 40 bytes a UD receive buffer starts with.
    let grh = (!grh.is_null()).then(|| unsafe { grh.cast::<[u8; GRH_LEN]>().read_unaligned() });
    let gids: Vec<[u8; 16]> = cx.dev().gids().iter().map(|g| g.0).collect();
    ah_attr_from_wc(&gids, port_num, &wc, grh.as_ref())
}

/// `int ibv_init_ah_from_wc(ctx *, u8 port_num, wc *, grh *, ah_attr *)`: 0, or -1 with
/// errno (EINVAL for NULL pointers, a destination not in the GID table, a multicast one or
/// another port; EPROTONOSUPPORT for bytes that are no IP header).
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *const ibv_wc,
    grh: *const u8,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    if ah_attr.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: forwarded; NULLs are refused inside.
    match unsafe { attr_from_c(context, port_num, wc, grh) } {
        Ok(a) => {
            // SAFETY: non-NULL, the caller's struct ibv_ah_attr.
            unsafe { ah_attr.write_unaligned(a) };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `struct ibv_ah *ibv_create_ah_from_wc(pd *, wc *, grh *, u8 port_num)`: an AH on `pd`
/// that answers the datagram, or NULL with errno (that of [`ibv_init_ah_from_wc`], else
/// that of `ibv_create_ah`).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *const ibv_wc,
    grh: *const u8,
    port_num: u8,
) -> *mut ibv_ah {
    if pd.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a non-NULL PD comes from ibv_alloc_pd; its context is checked inside.
    let context = unsafe { (*pd).context };
    // SAFETY: forwarded; NULLs are refused inside.
    let mut a = match unsafe { attr_from_c(context, port_num, wc, grh) } {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    // SAFETY: a PD of ours and an attribute on our stack.
    unsafe { crate::verbs::ibv_create_ah(pd, &mut a) }
}

symver!(ibv_init_ah_from_wc, ibv_create_ah_from_wc);

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: [u8; 4] = [192, 0, 2, 1];
    const PEER: [u8; 4] = [192, 0, 2, 9];

    fn gid_table() -> Vec<[u8; 16]> {
        vec![
            "2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
            mapped(Ipv4Addr::from(OURS)),
        ]
    }

    fn wc(flags: u32) -> ibv_wc {
        ibv_wc {
            wr_id: 0,
            status: 0,
            opcode: 128,
            vendor_err: 0,
            byte_len: 48,
            imm_data: 0,
            qp_num: 17,
            src_qp: 18,
            wc_flags: flags,
            pkey_index: 0,
            slid: 0x1234,
            sl: 3,
            dlid_path_bits: 5,
        }
    }

    /// A GRH buffer as RoCEv2 over IPv4 leaves it: zeros, then the IPv4 header.
    fn v4_grh(src: [u8; 4], dst: [u8; 4], ttl: u8, tos: u8) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        let mut ip = Ipv4::new_unchecked(&mut g[IPV4_AT..]);
        ip.set_version_ihl();
        ip.set_tos(tos);
        ip.set_total_len(60);
        ip.set_ttl(ttl);
        ip.set_protocol(IP_PROTO_UDP);
        ip.set_src_addr(src.into());
        ip.set_dst_addr(dst.into());
        ip.fill_checksum();
        g
    }

    fn v6_grh(src: &str, dst: &str, next: u8) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        // Version 6, traffic class 0x2e, flow label 0xabcde.
        g[..4].copy_from_slice(&(6u32 << 28 | 0x2e << 20 | 0xabcde).to_be_bytes());
        g[6] = next;
        g[7] = 17;
        g[8..24].copy_from_slice(&src.parse::<std::net::Ipv6Addr>().unwrap().octets());
        g[24..].copy_from_slice(&dst.parse::<std::net::Ipv6Addr>().unwrap().octets());
        g
    }

    #[test]
    fn an_ipv4_datagram_is_answered_from_the_gid_it_was_sent_to() {
        let a = ah_attr_from_wc(
            &gid_table(),
            1,
            &wc(IBV_WC_GRH),
            Some(&v4_grh(PEER, OURS, 61, 0x48)),
        )
        .unwrap();
        assert_eq!(a.is_global, 1);
        assert_eq!(a.grh.dgid, mapped(PEER.into()));
        assert_eq!(a.grh.sgid_index, 1);
        assert_eq!((a.grh.hop_limit, a.grh.traffic_class), (61, 0x48));
        assert_eq!(a.grh.flow_label, 0);
        assert_eq!(
            (a.dlid, a.sl, a.src_path_bits, a.port_num),
            (0x1234, 3, 5, 1)
        );
    }

    #[test]
    fn an_ipv6_datagram_takes_class_label_and_hop_limit_from_its_header() {
        let a = ah_attr_from_wc(
            &gid_table(),
            1,
            &wc(IBV_WC_GRH),
            Some(&v6_grh("2001:db8::9", "2001:db8::1", IP_PROTO_UDP)),
        )
        .unwrap();
        assert_eq!(a.is_global, 1);
        assert_eq!(
            a.grh.dgid,
            "2001:db8::9"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
        assert_eq!(a.grh.sgid_index, 0);
        assert_eq!(
            (a.grh.hop_limit, a.grh.traffic_class, a.grh.flow_label),
            (17, 0x2e, 0xabcde)
        );
    }

    #[test]
    fn version_6_in_front_of_a_valid_ipv4_header_is_ipv4() {
        // A driver may leave anything in the first 20 bytes; the checksum decides.
        let mut g = v4_grh(PEER, OURS, 64, 0);
        g[0] = 0x60;
        assert_eq!(header_of(&g), Ok(Header::V4));
        g[IPV4_AT + 8] ^= 1; // TTL changed: the checksum no longer holds
        assert_eq!(header_of(&g), Ok(Header::V6));
    }

    #[test]
    fn without_a_grh_the_attribute_is_not_global_and_nothing_is_looked_up() {
        let a = ah_attr_from_wc(&[], 7, &wc(0), None).unwrap();
        assert_eq!(a.is_global, 0);
        assert_eq!(
            (a.dlid, a.sl, a.src_path_bits, a.port_num),
            (0x1234, 3, 5, 7)
        );
        // A GRH buffer given anyway only lends its flow label, as in rdma-core.
        let g = v6_grh("2001:db8::9", "2001:db8::1", IP_PROTO_UDP);
        let a = ah_attr_from_wc(&[], 1, &wc(0), Some(&g)).unwrap();
        assert_eq!((a.is_global, a.grh.flow_label), (0, 0xabcde));
    }

    #[test]
    fn bad_grhs_fail_with_rdma_cores_errno() {
        let t = gid_table();
        let w = wc(IBV_WC_GRH);
        let not_ours = v4_grh(PEER, [192, 0, 2, 7], 64, 0);
        assert_eq!(
            ah_attr_from_wc(&t, 1, &w, Some(&not_ours)).err(),
            Some(libc::EINVAL)
        );
        let multicast = v4_grh(PEER, [224, 0, 0, 1], 64, 0);
        assert_eq!(
            ah_attr_from_wc(&t, 1, &w, Some(&multicast)).err(),
            Some(libc::EINVAL)
        );
        let other_port = v4_grh(PEER, OURS, 64, 0);
        assert_eq!(
            ah_attr_from_wc(&t, 2, &w, Some(&other_port)).err(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            ah_attr_from_wc(&t, 1, &w, Some(&[0; GRH_LEN])).err(),
            Some(libc::EPROTONOSUPPORT)
        );
        let roce_v1 = v6_grh("2001:db8::9", "2001:db8::1", IB_NEXT_HDR);
        assert_eq!(
            ah_attr_from_wc(&t, 1, &w, Some(&roce_v1)).err(),
            Some(libc::EINVAL)
        );
        let tcp = v6_grh("2001:db8::9", "2001:db8::1", 6);
        assert_eq!(
            ah_attr_from_wc(&t, 1, &w, Some(&tcp)).err(),
            Some(libc::EPROTONOSUPPORT)
        );
        let v6_multicast = v6_grh("2001:db8::9", "ff02::1", IP_PROTO_UDP);
        assert_eq!(ah_attr_from_wc(&t, 1, &w, None).err(), Some(libc::EINVAL));
        assert_eq!(
            ah_attr_from_wc(&t, 1, &w, Some(&v6_multicast)).err(),
            Some(libc::EINVAL)
        );
    }
}
