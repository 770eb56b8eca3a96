//! Hook identifiers: which probe point produced an event, and what kind of event it is.
//!
//! This is the one definition of a hook for the kernel programs, the decoder (`record`) and
//! the merge: the wire name (`name()`, also the serde name), the data direction and whether
//! the event names a byte range or a stream pointer.

/// Direction of data relative to the node the event was recorded on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "user",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Direction {
    Tx,
    Rx,
}

impl Direction {
    /// The wire (serde) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Tx => "tx",
            Direction::Rx => "rx",
        }
    }
}

/// How a stream event's `offset` relates to the bytes it is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BytePosition {
    /// `[offset, offset + len)`: the bytes of one skb or one send call.
    Range,
    /// `offset` is a stream pointer (the end of the data queued, read or written so far);
    /// the event carries no length.
    Pointer,
}

/// Every probe point meshlab records. The discriminant is the `u16` written into
/// [`crate::Event::hook`] and the index of the per-hook counters (`HITS`, `DROPS`).
/// Userspace (de)serializes it by [`Hook::name`]; an unknown name is an error.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "user",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Hook {
    /// sock_ops ACTIVE/PASSIVE_ESTABLISHED: cookie, 4-tuple, sequence bases.
    SockEstablished = 0,
    /// sock_ops STATE_CB to TCP_CLOSE: the connection left the traced set.
    SockClosed = 1,
    /// TCP send path entry (tcp_sendmsg / tcp_sendmsg_locked): write_seq and bytes left.
    TcpSendmsg = 2,
    /// sock_sendmsg return (sock:sock_send_length): bytes accepted, write_seq after.
    SendReturn = 3,
    /// net:net_dev_queue: skb handed to the device layer (qdisc enqueue follows).
    NetDevQueue = 4,
    /// net:net_dev_start_xmit: qdisc released the skb to the driver.
    NetDevStartXmit = 5,
    /// net:net_dev_xmit: the driver's ndo_start_xmit returned.
    NetDevXmit = 6,
    /// net:netif_receive_skb: the stack took the skb from the driver/backlog.
    NetifReceiveSkb = 7,
    /// tcp:tcp_probe: TCP processes an incoming segment on an established socket.
    TcpProbe = 8,
    /// sock:sk_data_ready: data queued on the socket, readers get woken.
    SkDataReady = 9,
    /// skb:skb_copy_datagram_iovec: recvmsg copies a queued skb to user memory.
    SkbCopyDatagram = 10,
    /// sock:sock_recv_length: sock_recvmsg returns to the caller.
    RecvReturn = 11,
    /// sched:sched_waking of a thread that owns a traced socket (the waker's side of a
    /// wake-up; the wire name keeps `sched_wakeup`, the stage it stands for).
    SchedWakeup = 12,
    /// sched:sched_switch onto (value 1) or off (value 0) a tracked thread.
    SchedSwitch = 13,
    /// irq:irq_handler_entry of a NIC IRQ (raw stream only).
    IrqEntry = 14,
    /// irq:irq_handler_exit of a NIC IRQ (raw stream only).
    IrqExit = 15,
    /// irq:softirq_raise NET_RX/NET_TX (raw stream only).
    SoftirqRaise = 16,
    /// irq:softirq_entry NET_RX/NET_TX (raw stream only).
    SoftirqEntry = 17,
    /// irq:softirq_exit NET_RX/NET_TX (raw stream only).
    SoftirqExit = 18,
    /// napi:napi_poll (raw stream only).
    NapiPoll = 19,
    /// skb:consume_skb of a TX skb a NIC driver freed: the device finished sending it (TX
    /// completion). Only for devices with NIC IRQs (veth/loopback hand skbs to the receiver).
    TxComplete = 20,
    /// sock_ops BPF_SOCK_OPS_TSTAMP_SCHED_CB: the skb carrying the send's last byte entered
    /// the qdisc (`__dev_queue_xmit`). Like the other TX timestamp hooks: `seq` is the skb's
    /// tskey (the send's last byte), `len` 1.
    TxTstampSched = 21,
    /// sock_ops BPF_SOCK_OPS_TSTAMP_SND_SW_CB: the driver's software TX timestamp
    /// (`skb_tx_timestamp` in ndo_start_xmit, or loopback/veth's transmit).
    TxTstampSw = 22,
    /// sock_ops BPF_SOCK_OPS_TSTAMP_SND_HW_CB: the NIC reported its hardware TX timestamp;
    /// `aux` holds that NIC-clock time (`skb_hwtstamp`), `ts_ns` when the kernel got it.
    TxTstampHw = 23,
    /// sock_ops BPF_SOCK_OPS_TSTAMP_ACK_CB: the peer acknowledged the send's last byte.
    TxTstampAck = 24,
}

/// Number of hooks: the size of the per-hook counter arrays.
pub const HOOK_COUNT: u32 = 25;

impl Hook {
    /// All hooks in discriminant order.
    pub const ALL: [Hook; HOOK_COUNT as usize] = [
        Hook::SockEstablished,
        Hook::SockClosed,
        Hook::TcpSendmsg,
        Hook::SendReturn,
        Hook::NetDevQueue,
        Hook::NetDevStartXmit,
        Hook::NetDevXmit,
        Hook::NetifReceiveSkb,
        Hook::TcpProbe,
        Hook::SkDataReady,
        Hook::SkbCopyDatagram,
        Hook::RecvReturn,
        Hook::SchedWakeup,
        Hook::SchedSwitch,
        Hook::IrqEntry,
        Hook::IrqExit,
        Hook::SoftirqRaise,
        Hook::SoftirqEntry,
        Hook::SoftirqExit,
        Hook::NapiPoll,
        Hook::TxComplete,
        Hook::TxTstampSched,
        Hook::TxTstampSw,
        Hook::TxTstampHw,
        Hook::TxTstampAck,
    ];

    /// Decodes the wire value; `None` for values this build does not know.
    pub fn from_u16(v: u16) -> Option<Hook> {
        Hook::ALL.get(usize::from(v)).copied()
    }

    /// The stable name used in NDJSON and docs.
    pub fn name(self) -> &'static str {
        match self {
            Hook::SockEstablished => "sock_established",
            Hook::SockClosed => "sock_closed",
            Hook::TcpSendmsg => "tcp_sendmsg",
            Hook::SendReturn => "send_return",
            Hook::NetDevQueue => "net_dev_queue",
            Hook::NetDevStartXmit => "net_dev_start_xmit",
            Hook::NetDevXmit => "net_dev_xmit",
            Hook::NetifReceiveSkb => "netif_receive_skb",
            Hook::TcpProbe => "tcp_probe",
            Hook::SkDataReady => "sk_data_ready",
            Hook::SkbCopyDatagram => "skb_copy_datagram",
            Hook::RecvReturn => "recv_return",
            Hook::SchedWakeup => "sched_wakeup",
            Hook::SchedSwitch => "sched_switch",
            Hook::IrqEntry => "irq_entry",
            Hook::IrqExit => "irq_exit",
            Hook::SoftirqRaise => "softirq_raise",
            Hook::SoftirqEntry => "softirq_entry",
            Hook::SoftirqExit => "softirq_exit",
            Hook::NapiPoll => "napi_poll",
            Hook::TxComplete => "tx_complete",
            Hook::TxTstampSched => "tx_tstamp_sched",
            Hook::TxTstampSw => "tx_tstamp_sw",
            Hook::TxTstampHw => "tx_tstamp_hw",
            Hook::TxTstampAck => "tx_tstamp_ack",
        }
    }

    /// Inverse of [`Hook::name`].
    pub fn from_name(name: &str) -> Option<Hook> {
        Hook::ALL.iter().copied().find(|h| h.name() == name)
    }

    /// Direction of the data a stream event is about; `None` for hooks that are not about
    /// stream bytes (connection state, scheduler, IRQ context).
    pub fn direction(self) -> Option<Direction> {
        match self {
            Hook::TcpSendmsg
            | Hook::SendReturn
            | Hook::NetDevQueue
            | Hook::NetDevStartXmit
            | Hook::NetDevXmit
            | Hook::TxComplete
            | Hook::TxTstampSched
            | Hook::TxTstampSw
            | Hook::TxTstampHw
            | Hook::TxTstampAck => Some(Direction::Tx),
            Hook::NetifReceiveSkb
            | Hook::TcpProbe
            | Hook::SkDataReady
            | Hook::SkbCopyDatagram
            | Hook::RecvReturn => Some(Direction::Rx),
            Hook::SockEstablished
            | Hook::SockClosed
            | Hook::SchedWakeup
            | Hook::SchedSwitch
            | Hook::IrqEntry
            | Hook::IrqExit
            | Hook::SoftirqRaise
            | Hook::SoftirqEntry
            | Hook::SoftirqExit
            | Hook::NapiPoll => None,
        }
    }

    /// Whether a stream event's offset is a range start or a stream pointer; `None` for
    /// hooks without a stream position (exactly those without a [`Hook::direction`]).
    pub fn byte_position(self) -> Option<BytePosition> {
        self.direction()?;
        Some(match self {
            Hook::SkDataReady | Hook::SendReturn | Hook::RecvReturn => BytePosition::Pointer,
            _ => BytePosition::Range,
        })
    }

    /// The offset is a stream pointer (see [`BytePosition::Pointer`]).
    pub fn is_pointer(self) -> bool {
        self.byte_position() == Some(BytePosition::Pointer)
    }

    /// Events about one skb on the wire path: a range that ends at or below one already seen
    /// by the same hook is a retransmission.
    pub fn is_skb_stage(self) -> bool {
        matches!(
            self,
            Hook::NetDevQueue
                | Hook::NetDevStartXmit
                | Hook::NetDevXmit
                | Hook::TxComplete
                | Hook::TxTstampSched
                | Hook::TxTstampSw
                | Hook::TxTstampHw
                | Hook::NetifReceiveSkb
                | Hook::TcpProbe
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discriminants_match_table_order_and_names_round_trip() {
        for (i, hook) in Hook::ALL.iter().enumerate() {
            assert_eq!(*hook as usize, i, "{hook:?} is out of order in Hook::ALL");
            assert_eq!(Hook::from_u16(i as u16), Some(*hook));
            assert_eq!(Hook::from_name(hook.name()), Some(*hook));
        }
        assert_eq!(Hook::from_u16(HOOK_COUNT as u16), None);
    }

    #[test]
    fn only_stream_hooks_have_a_byte_position_and_skb_stages_are_ranges() {
        for hook in Hook::ALL {
            assert_eq!(
                hook.direction().is_some(),
                hook.byte_position().is_some(),
                "{hook:?}"
            );
            if hook.is_skb_stage() {
                assert_eq!(hook.byte_position(), Some(BytePosition::Range), "{hook:?}");
            }
        }
    }

    #[cfg(feature = "user")]
    #[test]
    fn serde_names_are_the_wire_names() {
        for hook in Hook::ALL {
            let json = format!("\"{}\"", hook.name());
            assert_eq!(serde_json::to_string(&hook).unwrap(), json);
            assert_eq!(serde_json::from_str::<Hook>(&json).unwrap(), hook);
        }
        let err = serde_json::from_str::<Hook>("\"no_such_hook\"").unwrap_err();
        assert!(err.to_string().contains("unknown variant"), "{err}");
    }
}
