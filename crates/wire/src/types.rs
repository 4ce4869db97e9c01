//! Newtypes for the numbers of the IBA transport that must not be mixed up.

use core::fmt;

const MASK24: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number (BTH.PSN).
///
/// PSNs wrap modulo 2^24, so they have no total order and deliberately no `Ord` impl: compare
/// with [`Psn::distance_from`], [`Psn::is_before`] and [`Psn::is_after`] (IBA 9.7.1: a
/// responder treats the half of the PSN space behind its expected PSN as duplicates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The PSN space is 2^24 wide.
    pub const MODULUS: u32 = 1 << 24;
    /// The largest PSN value.
    pub const MAX: Psn = Psn(MASK24);

    /// A PSN from the low 24 bits of `v` (higher bits are dropped).
    #[inline]
    pub const fn new(v: u32) -> Psn {
        Psn(v & MASK24)
    }

    /// The PSN as a number in `0..2^24`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// This PSN advanced by `n`, wrapping modulo 2^24.
    #[allow(clippy::should_implement_trait)] // takes a count, not a Psn: `Add<Psn>` would be wrong
    #[inline]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & MASK24)
    }

    /// This PSN moved back by `n`, wrapping modulo 2^24.
    #[allow(clippy::should_implement_trait)] // takes a count, not a Psn
    #[inline]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & MASK24)
    }

    /// The PSN after this one.
    #[inline]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Signed distance `self - other` in the range `(-2^23, 2^23]`: positive when `self` is
    /// ahead of `other` by less than half the PSN space.
    #[inline]
    pub const fn distance_from(self, other: Psn) -> i32 {
        let d = self.0.wrapping_sub(other.0) & MASK24;
        if d > (1 << 23) {
            d as i32 - (1 << 24)
        } else {
            d as i32
        }
    }

    /// True when `self` comes strictly before `other` (within half the PSN space).
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance_from(other) < 0
    }

    /// True when `self` comes strictly after `other` (within half the PSN space).
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        self.distance_from(other) > 0
    }
}

impl fmt::Display for Psn {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A 24-bit queue pair number (BTH.DestQP, DETH.SrcQP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Qpn(u32);

impl Qpn {
    /// QP1, the General Services Interface QP (CM MADs on UD).
    pub const GSI: Qpn = Qpn(1);
    /// QPN 0xFFFFFF, the destination QP of every multicast datagram (IBA's multicast QPN;
    /// no QP of a device ever has it).
    pub const MULTICAST: Qpn = Qpn(MASK24);

    /// A QPN from the low 24 bits of `v` (higher bits are dropped: for numbers taken from
    /// 24-bit header fields, or known to fit).
    #[inline]
    pub const fn new(v: u32) -> Qpn {
        Qpn(v & MASK24)
    }

    /// The QPN `v`, or `None` if it does not fit in 24 bits: for numbers from outside (a
    /// peer's message, a C caller, a command line), where dropping the high bits would
    /// quietly name another QP.
    ///
    /// ```
    /// use wire::types::Qpn;
    /// assert_eq!(Qpn::try_new(0x12_3456).map(Qpn::value), Some(0x12_3456));
    /// assert_eq!(Qpn::try_new(0x0100_0000), None);
    /// ```
    #[inline]
    pub const fn try_new(v: u32) -> Option<Qpn> {
        if v > MASK24 {
            None
        } else {
            Some(Qpn(v))
        }
    }

    /// The QPN as a number in `0..2^24`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Qpn {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// The number in hex, with the format's width and flags (tools print QPNs as `{:06x}`, as
/// `ibv_rc_pingpong` does).
impl fmt::LowerHex for Qpn {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A 24-bit message sequence number (AETH.MSN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Msn(u32);

impl Msn {
    /// An MSN from the low 24 bits of `v`.
    #[inline]
    pub const fn new(v: u32) -> Msn {
        Msn(v & MASK24)
    }

    /// The MSN as a number in `0..2^24`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The MSN after this one, wrapping modulo 2^24.
    #[inline]
    pub const fn next(self) -> Msn {
        Msn(self.0.wrapping_add(1) & MASK24)
    }
}

impl fmt::Display for Msn {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A 32-bit remote key (RETH, AtomicETH, IETH): names a memory region or window remotely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rkey(pub u32);

impl Rkey {
    /// An R_Key from its 32-bit value.
    #[inline]
    pub const fn new(v: u32) -> Rkey {
        Rkey(v)
    }

    /// The 32-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Rkey {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// The key in hex, with the format's width and flags.
impl fmt::LowerHex for Rkey {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A 32-bit local key: names a memory region in the SGEs of this process's work requests
/// (never on the wire, unlike an [`Rkey`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lkey(pub u32);

impl Lkey {
    /// An L_Key from its 32-bit value.
    #[inline]
    pub const fn new(v: u32) -> Lkey {
        Lkey(v)
    }

    /// The 32-bit value (what an SGE carries).
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Lkey {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// The key in hex, with the format's width and flags.
impl fmt::LowerHex for Lkey {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A 32-bit queue key (DETH.Q_Key) that a UD receiver checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Qkey(pub u32);

impl Qkey {
    /// A Q_Key from its 32-bit value.
    #[inline]
    pub const fn new(v: u32) -> Qkey {
        Qkey(v)
    }

    /// The 32-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// IBA 10.2.4: a Q_Key with the high bit set is "controlled" (only privileged consumers
    /// may send with it).
    #[inline]
    pub const fn is_controlled(self) -> bool {
        self.0 & 0x8000_0000 != 0
    }
}

impl fmt::Display for Qkey {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// The path MTU values IBA defines (payload bytes per packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes (ibv value 1).
    Mtu256,
    /// 512 bytes (ibv value 2).
    Mtu512,
    /// 1024 bytes (ibv value 3).
    Mtu1024,
    /// 2048 bytes (ibv value 4).
    Mtu2048,
    /// 4096 bytes (ibv value 5).
    Mtu4096,
}

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// Payload bytes per packet.
    #[inline]
    pub const fn bytes(self) -> usize {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The MTU whose size is exactly `n` bytes, if IBA defines one.
    #[inline]
    pub const fn from_bytes(n: usize) -> Option<Mtu> {
        match n {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// The largest MTU that is not larger than `n` bytes (e.g. for an Ethernet MTU minus
    /// headers), if any.
    #[inline]
    pub const fn largest_within(n: usize) -> Option<Mtu> {
        if n >= 4096 {
            Some(Mtu::Mtu4096)
        } else if n >= 2048 {
            Some(Mtu::Mtu2048)
        } else if n >= 1024 {
            Some(Mtu::Mtu1024)
        } else if n >= 512 {
            Some(Mtu::Mtu512)
        } else if n >= 256 {
            Some(Mtu::Mtu256)
        } else {
            None
        }
    }

    /// The `enum ibv_mtu` value (IBV_MTU_256 = 1 … IBV_MTU_4096 = 5).
    #[inline]
    pub const fn to_ibv(self) -> u8 {
        match self {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
        }
    }

    /// The MTU for an `enum ibv_mtu` value, if valid.
    #[inline]
    pub const fn from_ibv(v: u8) -> Option<Mtu> {
        match v {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
}

/// The transport service an opcode belongs to (top three bits of BTH.OpCode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connection (0b000).
    Rc,
    /// Unreliable Connection (0b001).
    Uc,
    /// Reliable Datagram (0b010), not implemented by softrdma.
    Rd,
    /// Unreliable Datagram (0b011).
    Ud,
    /// Congestion Notification Packet (0b100, RoCEv2 Annex A17).
    Cnp,
    /// Extended Reliable Connection (0b101), not implemented by softrdma.
    Xrc,
}

impl Transport {
    /// The transport named by the top three bits of an opcode, if any (0b110 and 0b111 are
    /// manufacturer specific).
    #[inline]
    pub const fn from_opcode_bits(code: u8) -> Option<Transport> {
        match code >> 5 {
            0 => Some(Transport::Rc),
            1 => Some(Transport::Uc),
            2 => Some(Transport::Rd),
            3 => Some(Transport::Ud),
            4 => Some(Transport::Cnp),
            5 => Some(Transport::Xrc),
            _ => None,
        }
    }

    /// The short name ("RC", "UC", …).
    #[inline]
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qpn_new_masks_and_try_new_refuses_what_does_not_fit() {
        assert_eq!(Qpn::new(0x0123_4567).value(), 0x23_4567);
        assert_eq!(Qpn::try_new(0xff_ffff), Some(Qpn::new(0xff_ffff)));
        assert_eq!(Qpn::try_new(0), Some(Qpn::new(0)));
        assert_eq!(Qpn::try_new(0x0100_0000), None);
        assert_eq!(Qpn::try_new(u32::MAX), None);
        assert_eq!(Qpn::try_new(0xff_ffff), Some(Qpn::MULTICAST));
        assert_eq!(
            format!("{:06x} {:#x}", Qpn::new(0x11), Qpn::new(0x11)),
            "000011 0x11"
        );
        assert_eq!(format!("{:#x}", Rkey::new(0x1234)), "0x1234");
    }

    #[test]
    fn psn_masks_and_wraps() {
        assert_eq!(Psn::new(0x0123_4567).value(), 0x23_4567);
        assert_eq!(Psn::MAX.next(), Psn::new(0));
        assert_eq!(Psn::new(0xff_fffe).add(5), Psn::new(3));
        assert_eq!(Psn::new(2).sub(5), Psn::new(0xff_fffd));
        assert_eq!(Psn::new(3).add(u32::MAX), Psn::new(2));
    }

    #[test]
    fn psn_distance_is_signed_and_wraps() {
        assert_eq!(Psn::new(10).distance_from(Psn::new(3)), 7);
        assert_eq!(Psn::new(3).distance_from(Psn::new(10)), -7);
        assert_eq!(Psn::new(1).distance_from(Psn::MAX), 2);
        assert_eq!(Psn::MAX.distance_from(Psn::new(1)), -2);
        // Exactly half the space apart counts as ahead: the range is (-2^23, 2^23].
        assert_eq!(Psn::new(1 << 23).distance_from(Psn::new(0)), 1 << 23);
        assert_eq!(Psn::new(0).distance_from(Psn::new(1 << 23)), 1 << 23);
        assert_eq!(
            Psn::new((1 << 23) + 1).distance_from(Psn::new(0)),
            -((1 << 23) - 1)
        );
        assert!(Psn::MAX.is_before(Psn::new(0)));
        assert!(Psn::new(0).is_after(Psn::MAX));
        assert!(!Psn::new(5).is_after(Psn::new(5)));
        assert!(!Psn::new(5).is_before(Psn::new(5)));
    }

    #[test]
    fn distance_agrees_with_add_everywhere_near_wrap() {
        for base in [0, 1, 0x7f_ffff, 0x80_0000, 0xff_fff0, 0xff_ffff] {
            for n in [0u32, 1, 2, 100, (1 << 23) - 1, 1 << 23] {
                let p = Psn::new(base);
                assert_eq!(p.add(n).distance_from(p), n as i32, "base {base} n {n}");
                if n != 1 << 23 {
                    assert_eq!(p.sub(n).distance_from(p), -(n as i32), "base {base} n {n}");
                }
            }
        }
    }

    #[test]
    fn qpn_and_msn_are_24_bit() {
        assert_eq!(Qpn::new(0xff12_3456).value(), 0x12_3456);
        assert_eq!(Msn::new(0xff_ffff).next(), Msn::new(0));
        assert_eq!(Qpn::new(0x11).to_string(), "0x11");
    }

    #[test]
    fn mtu_table() {
        for (i, m) in Mtu::ALL.iter().enumerate() {
            assert_eq!(m.bytes(), 256 << i);
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(*m));
            assert_eq!(m.to_ibv(), i as u8 + 1);
            assert_eq!(Mtu::from_ibv(m.to_ibv()), Some(*m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from_ibv(0), None);
        assert_eq!(Mtu::from_ibv(6), None);
        assert_eq!(
            Mtu::largest_within(1500 - 40 - 8 - 12 - 4),
            Some(Mtu::Mtu1024)
        );
        assert_eq!(Mtu::largest_within(100), None);
    }

    #[test]
    fn keys() {
        assert!(Qkey(0x8000_0001).is_controlled());
        assert!(!Qkey::new(0x1111_1111).is_controlled());
        assert_eq!(Rkey::new(7).value(), 7);
    }

    #[test]
    fn transport_bits() {
        assert_eq!(Transport::from_opcode_bits(0x64), Some(Transport::Ud));
        assert_eq!(Transport::from_opcode_bits(0x81), Some(Transport::Cnp));
        assert_eq!(Transport::from_opcode_bits(0xc0), None);
    }
}
