//! Counters for every packet dropped and every error raised, by reason, per QP and per
//! device (what `rdma statistic` shows for a hardware NIC).

macro_rules! counters {
    ($( $(#[$doc:meta])* $var:ident = $name:literal, )*) => {
        /// One counted event. Each variant's doc says when it is counted.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Counter {
            $( $(#[$doc])* $var, )*
        }

        impl Counter {
            /// Every counter, in display order.
            pub const ALL: &'static [Counter] = &[ $( Counter::$var, )* ];

            /// The counter's name as tools print it.
            pub const fn name(self) -> &'static str {
                match self { $( Counter::$var => $name, )* }
            }
        }
    };
}

counters! {
    /// A packet was accepted by the ingress checks.
    RxPackets = "rx_packets",
    /// Bytes of accepted packets (whole IP packets).
    RxBytes = "rx_bytes",
    /// A packet was emitted by `poll_transmit`.
    TxPackets = "tx_packets",
    /// Bytes of emitted packets.
    TxBytes = "tx_bytes",
    /// Dropped: the bytes are not a well-formed RoCEv2 packet.
    RxMalformed = "rx_malformed",
    /// Dropped: the ICRC does not match (corruption), and under
    /// [`crate::Ipv4IdentPolicy::Recover`] no IPv4 identification makes it match either.
    RxBadIcrc = "rx_bad_icrc",
    /// Under [`crate::Ipv4IdentPolicy::Recover`]: the ICRC failed with the IPv4 ID in the
    /// header the host rebuilt and held for another one, found from the ICRC; the packet
    /// went on to the other ingress checks.
    RxIcrcIdRecovered = "rx_icrc_id_recovered",
    /// Dropped: the destination IP is not one of this port's GIDs.
    RxNotOurAddress = "rx_not_our_address",
    /// A Congestion Notification Packet arrived (ignored: no congestion control yet).
    RxCnp = "rx_cnp",
    /// Dropped: no QP has the destination QPN.
    RxUnknownQp = "rx_unknown_qp",
    /// A MAD arrived on QP1 and waits for the device's host ([`crate::Engine::poll_mad`]).
    RxMads = "rx_mads",
    /// Dropped: a MAD arrived on QP1 while the host had [`crate::gsi`]'s whole queue to
    /// take.
    RxGsiOverflow = "rx_gsi_overflow",
    /// A MAD left from QP1.
    TxMads = "tx_mads",
    /// Dropped: the QP's state does not accept this packet (RESET, INIT, ERR, or a response
    /// before RTS).
    RxBadQpState = "rx_bad_qp_state",
    /// Dropped: the opcode does not belong to the QP's transport (or is a CNP).
    RxBadOpcode = "rx_bad_opcode",
    /// Dropped: the BTH P_Key does not match the QP's.
    RxPkeyMismatch = "rx_pkey_mismatch",
    /// Dropped: the source address is not the connected peer of the QP.
    RxAddressMismatch = "rx_address_mismatch",
    /// Dropped: a duplicate request (already executed) was seen; it was re-ACKed or replayed.
    RespDuplicateRequest = "resp_duplicate_request",
    /// Dropped: a request arrived ahead of the expected PSN (a gap).
    RespOutOfSequence = "resp_out_of_sequence",
    /// NAK PSN Sequence Error sent (once per gap).
    RespSeqErrNakSent = "resp_seq_err_nak_sent",
    /// RNR NAK sent: a SEND or WRITE with immediate found no receive WQE.
    RespRnrNakSent = "resp_rnr_nak_sent",
    /// NAK Invalid Request sent (bad opcode sequence, bad length, misaligned atomic...).
    RespInvalidRequestNakSent = "resp_invalid_request_nak_sent",
    /// NAK Remote Access Error sent (bad rkey, PD, bounds or rights).
    RespRemoteAccessNakSent = "resp_remote_access_nak_sent",
    /// NAK Remote Operational Error sent (a local failure at the responder).
    RespRemoteOpNakSent = "resp_remote_op_nak_sent",
    /// A duplicate RDMA READ or ATOMIC was answered again from the responder resources.
    RespReplayed = "resp_replayed",
    /// A duplicate READ / ATOMIC had no responder resource left to replay from: dropped.
    RespReplayMissing = "resp_replay_missing",
    /// A receive message overflowed its receive WQE (LOC_LEN_ERR at the responder).
    RespLocalLengthError = "resp_local_length_error",
    /// ACK / NAK packets sent by the responder.
    RespAcksSent = "resp_acks_sent",
    /// Plain ACKs the responder never sent: a newer, cumulative one replaced them while
    /// they waited (the peer kept sending).
    RespAcksCoalesced = "resp_acks_coalesced",
    /// Dropped: an ACK for a PSN this QP never sent (ghost ACK).
    CompGhostAck = "comp_ghost_ack",
    /// Dropped: a response for PSNs already acknowledged (duplicate / stale).
    CompDuplicateResponse = "comp_duplicate_response",
    /// Dropped: a response with an unexpected opcode or PSN for the oldest outstanding WR.
    CompUnexpectedResponse = "comp_unexpected_response",
    /// An ACK or response implied that a READ / ATOMIC response was lost: retried.
    CompImpliedNak = "comp_implied_nak",
    /// NAK PSN Sequence Error received.
    CompSeqErrNakReceived = "comp_seq_err_nak_received",
    /// RNR NAK received.
    CompRnrNakReceived = "comp_rnr_nak_received",
    /// Other NAKs received (they end the QP's life with an error completion).
    CompErrorNakReceived = "comp_error_nak_received",
    /// The local ACK timer fired.
    CompLocalAckTimeout = "comp_local_ack_timeout",
    /// Go-back-N retransmissions started (timeouts, sequence NAKs, implied NAKs, RNR).
    ReqRetries = "req_retries",
    /// Request packets sent again.
    ReqRetransmittedPackets = "req_retransmitted_packets",
    /// The retry counter ran out (RETRY_EXC_ERR).
    ReqRetryExceeded = "req_retry_exceeded",
    /// The RNR retry counter ran out (RNR_RETRY_EXC_ERR).
    ReqRnrRetryExceeded = "req_rnr_retry_exceeded",
    /// A send WR failed a local check when executed (LOC_PROT_ERR / LOC_LEN_ERR).
    ReqLocalError = "req_local_error",
    /// A completion found its CQ full.
    CqOverflow = "cq_overflow",
    /// A QP entered the error state.
    QpErrors = "qp_errors",
    /// Work requests completed with WR_FLUSH_ERR.
    WrFlushed = "wr_flushed",
    /// Memory accesses that failed in the host's Memory implementation.
    MemoryFault = "memory_fault",
    /// Dropped: a UD datagram's Q_Key differs from the QP's.
    RxQkeyMismatch = "rx_qkey_mismatch",
    /// Dropped: a UC or UD message found no receive WQE (no RNR NAK on these services).
    RxNoRecvWqe = "rx_no_recv_wqe",
    /// A message needed a receive WQE and the QP's SRQ was empty.
    RxSrqEmpty = "rx_srq_empty",
    /// UC: a message in progress was given up (a gap, or it never ended).
    UcMessageDropped = "uc_message_dropped",
    /// UC: a packet was dropped while waiting for the next FIRST or ONLY.
    UcPacketDropped = "uc_packet_dropped",
    /// UC: a WRITE failed its rkey / PD / bounds / rights checks and was dropped.
    UcRemoteAccessDropped = "uc_remote_access_dropped",
    /// Dropped: multicast is UD datagrams to QPN 0xFFFFFF at a multicast destination address
    /// (on RoCEv2 the group's GID is the destination IP), and this packet had the QPN
    /// without the address, the address without the QPN, or another transport's opcode.
    RxMcastMismatch = "rx_mcast_mismatch",
    /// Dropped: a multicast datagram for a group no QP of this device is attached to.
    RxMcastNoGroup = "rx_mcast_no_group",
    /// A copy of a multicast datagram took a receive WQE of a QP attached to its group
    /// (counted per copy, against the QP and the device); copies that fail a QP's own
    /// checks are counted by reason instead (`rx_qkey_mismatch`, `rx_no_recv_wqe`, ...).
    RxMcastDelivered = "rx_mcast_delivered",
}

/// A set of counter values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counters {
    values: [u64; Counter::ALL.len()],
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            values: [0; Counter::ALL.len()],
        }
    }
}

impl Counters {
    /// The value of one counter.
    pub fn get(&self, c: Counter) -> u64 {
        self.values[c as usize]
    }

    /// Counters with the values given (the others 0): a snapshot taken elsewhere, such as
    /// a host daemon's engine, read back by name.
    pub fn from_values(values: impl IntoIterator<Item = (Counter, u64)>) -> Counters {
        let mut c = Counters::default();
        for (counter, v) in values {
            c.values[counter as usize] = v;
        }
        c
    }

    /// Every counter with its name, in display order.
    pub fn iter(&self) -> impl Iterator<Item = (Counter, u64)> + '_ {
        Counter::ALL.iter().map(move |&c| (c, self.get(c)))
    }

    pub(crate) fn add(&mut self, c: Counter, n: u64) {
        let v = &mut self.values[c as usize];
        *v = v.wrapping_add(n);
    }

    pub(crate) fn inc(&mut self, c: Counter) {
        self.add(c, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_unique_and_counting_works() {
        let mut names: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Counter::ALL.len());
        let mut c = Counters::default();
        c.inc(Counter::RxBadIcrc);
        c.add(Counter::RxBytes, 10);
        assert_eq!(c.get(Counter::RxBadIcrc), 1);
        assert_eq!(c.get(Counter::RxBytes), 10);
        assert_eq!(c.get(Counter::TxBytes), 0);
    }
}
