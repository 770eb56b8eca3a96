//! Hop chains: a probed process's message on a unix stream socket, followed through the
//! proxies of its node to the TCP leg that crosses to the next node (docs/segments.md, "Hops
//! and legs").
//!
//! A request is a path process -> leg -> process -> leg ...; on one node its part is one chain
//! of points on that node's clock. Going out (`forward`), a probed writer's unix message is
//! queued on the peer socket (`uds_data_ready`), read by the peer's owner (`uds_recv_return`),
//! and, by the relay rule, written again on that reader's next socket: a unix socket (one more
//! proxy) or the TCP connection of the cross-node leg. Coming in (`backward`), a probed
//! reader's unix message was written by its peer's owner, which had read it just before on its
//! previous socket: unix (one more proxy) or TCP (the cross-node leg).
//!
//! The relay rule (proxies without probes): the thread that read the message's bytes on one
//! socket and then wrote the same number of bytes on another, with no other I/O of that thread
//! in between. Anything else is ambiguous (several requests per read, buffering that splits or
//! joins messages, a thread serving other connections in between) and is not guessed: the hop
//! is listed as unresolved and the request is incomplete.

use crate::schema::Direction;

use super::chain::{Point, RX_KERNEL, Stages, TX_KERNEL};
use super::index::NodeIndex;
use super::legs::{Io, Legs, Sock};
use super::message::MsgRef;
use super::segments::PointId;

/// At most this many proxies are followed on one node (a loop guard).
const MAX_RELAYS: u8 = 8;

/// One node's hops of one message direction.
#[derive(Debug, Default)]
pub(crate) struct HopChain {
    /// Points in path order; `owner = k` marks the k-th proxy from the probed process.
    pub points: Vec<Point>,
    /// Where the chain meets the TCP leg to the next node, when found.
    pub tcp: Option<MsgRef>,
    /// Flags of the TCP stage lookups (retransmission, stale RX context).
    pub stages: Stages,
    /// Proxies crossed.
    pub relays: u8,
    /// Hops that could not be followed, e.g. `relay 1 ambiguous: ...`.
    pub unresolved: Vec<String>,
}

impl HopChain {
    /// The chain's points as the message's stages, with the TCP lookups' flags.
    pub fn stages(&self) -> Stages {
        Stages {
            points: self.points.clone(),
            retransmitted: self.stages.retransmitted,
            stale_context: self.stages.stale_context,
            reader: self.stages.reader.clone(),
            // The unix call is the probed process's, the TCP one a proxy's: no one thread.
            thread: None,
        }
    }
}

fn absent(ids: &[PointId], owner: u8) -> Vec<Point> {
    Stages::absent(ids)
        .points
        .into_iter()
        .map(|p| p.owned_by(owner))
        .collect()
}

/// Follows a message a probed process wrote on a unix socket (`sent`: its call carrying the
/// message's last byte; `msg`: the message's byte range; `lo_ns`: when the write began) up to
/// the TCP send of the proxy that puts it on the cross-node leg.
pub fn forward(legs: &Legs, index: &NodeIndex, sent: Io, msg: (u64, u64), lo_ns: u64) -> HopChain {
    let mut chain = HopChain::default();
    let (mut io, mut msg, mut lo) = (sent, msg, lo_ns);
    while chain.relays < MAX_RELAYS {
        let Sock::Unix(ends) = io.sock else { break };
        let ready = legs.ready_between(ends.peer, lo, io.stamp.ns());
        chain.points.push(Point::seen(PointId::UdsDataReady, ready));
        chain.relays += 1;
        let owner = chain.relays;
        let Some(read) = legs.covering(ends.peer, Direction::Rx, msg.1) else {
            chain
                .points
                .extend(absent(&[PointId::UdsRecvReturn], owner));
            chain.points.extend(absent(&TX_KERNEL, owner));
            return chain;
        };
        let recv = Point::seen(PointId::UdsRecvReturn, Some(read.stamp));
        chain.points.push(recv.owned_by(owner));
        let next = match relay_next(legs, &read, msg) {
            Ok(next) => next,
            Err(why) => {
                chain
                    .unresolved
                    .push(format!("relay {owner} ambiguous: {why}"));
                chain.points.extend(absent(&TX_KERNEL, owner));
                return chain;
            }
        };
        if let Some(tcp) = next.tcp() {
            let stages = index.tx_stages(tcp.cookie, tcp.start, tcp.end);
            chain
                .points
                .extend(stages.points.iter().map(|p| p.owned_by(owner)));
            chain.stages = stages;
            chain.tcp = Some(tcp);
            return chain;
        }
        (io, msg, lo) = (next, (next.start, next.end), read.stamp.ns());
    }
    chain
}

/// Follows a message a probed process read on a unix socket (`read`: its call carrying the
/// message's last byte) back to the TCP receive of the proxy that took it off the cross-node
/// leg. The points end with `uds_data_ready` of the probed reader's socket.
pub fn backward(legs: &Legs, index: &NodeIndex, read: Io, msg: (u64, u64)) -> HopChain {
    let mut chain = HopChain::default();
    // Collected from the reader outwards, reversed at the end.
    let mut rev: Vec<Vec<Point>> = Vec::new();
    let (mut cur, mut msg) = (read, msg);
    while chain.relays < MAX_RELAYS {
        let Sock::Unix(ends) = cur.sock else { break };
        chain.relays += 1;
        let owner = chain.relays;
        let Some(sent) = legs.covering(ends.peer, Direction::Tx, msg.1) else {
            rev.push(absent(&[PointId::UdsDataReady], owner));
            rev.push(absent(&RX_KERNEL, owner));
            break;
        };
        let prev = relay_prev(legs, &sent, msg);
        let lo = prev.as_ref().map_or(0, |p| p.stamp.ns());
        let ready = legs.ready_between(ends.sock, lo, sent.stamp.ns());
        rev.push(vec![Point::seen(PointId::UdsDataReady, ready)]);
        let prev = match prev {
            Ok(prev) => prev,
            Err(why) => {
                chain
                    .unresolved
                    .push(format!("relay {owner} ambiguous: {why}"));
                rev.push(absent(&RX_KERNEL, owner));
                break;
            }
        };
        if let Some(tcp) = prev.tcp() {
            let stages = index.rx_stages(tcp.cookie, tcp.end);
            rev.push(stages.points.iter().map(|p| p.owned_by(owner)).collect());
            chain.stages = stages;
            chain.tcp = Some(tcp);
            break;
        }
        let recv = Point::seen(PointId::UdsRecvReturn, Some(prev.stamp));
        rev.push(vec![recv.owned_by(owner)]);
        (cur, msg) = (prev, (prev.start, prev.end));
    }
    chain.points = rev.into_iter().rev().flatten().collect();
    chain
}

/// The relay rule, going out: the reader's next call must be a write of the whole message on
/// another socket, with nothing else read in between.
fn relay_next(legs: &Legs, read: &Io, msg: (u64, u64)) -> Result<Io, String> {
    if (read.start, read.end) != msg {
        return Err(format!(
            "the read returned bytes [{}, {}) of a message [{}, {})",
            read.start, read.end, msg.0, msg.1
        ));
    }
    let next = legs
        .after(read)
        .next()
        .ok_or("no write by the reading thread followed")?;
    check_pair(next, Direction::Tx, read, msg.1 - msg.0)?;
    Ok(*next)
}

/// The relay rule, coming in: the writer's previous call must be a read of the whole message
/// on another socket, with nothing else written in between.
fn relay_prev(legs: &Legs, sent: &Io, msg: (u64, u64)) -> Result<Io, String> {
    if (sent.start, sent.end) != msg {
        return Err(format!(
            "the write carried bytes [{}, {}) of a message [{}, {})",
            sent.start, sent.end, msg.0, msg.1
        ));
    }
    let prev = legs
        .before(sent)
        .next()
        .ok_or("no read by the writing thread preceded")?;
    check_pair(prev, Direction::Rx, sent, msg.1 - msg.0)?;
    Ok(*prev)
}

fn check_pair(other: &Io, want: Direction, this: &Io, len: u64) -> Result<(), String> {
    let verb = |d: Direction| if d == Direction::Tx { "wrote" } else { "read" };
    if other.dir != want {
        return Err(format!(
            "the thread {} again before it {} (several messages in flight)",
            verb(this.dir),
            verb(want)
        ));
    }
    if other.sock == this.sock {
        return Err("the thread read and wrote the same socket".into());
    }
    if other.bytes() != len {
        return Err(format!(
            "the thread {} {} bytes for a message of {len} (buffering splits or joins messages)",
            verb(want),
            other.bytes()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::segments::{PointId::*, find};
    use super::*;

    #[test]
    fn every_consecutive_pair_of_the_hop_chains_has_a_definition() {
        let chains: [&[PointId]; 4] = [
            // Client node, request out: client -> unix leg -> sidecar-out -> TCP.
            &[ClientWriteBegin, UdsDataReady, UdsRecvReturn, TcpSendmsg],
            // Client node, response in: TCP -> sidecar-out -> unix leg -> client.
            &[
                RecvReturn,
                UdsDataReady,
                ClientReadReady,
                UdsRecvReturn,
                ClientReadEnd,
            ],
            // Server node (two-hop), request in and response out.
            &[
                RecvReturn,
                UdsDataReady,
                ServerReadReady,
                UdsRecvReturn,
                ServerReadEnd,
            ],
            // Two proxies on one node: unix -> proxy -> unix.
            &[
                ServerWriteBegin,
                UdsDataReady,
                UdsRecvReturn,
                UdsDataReady,
                UdsRecvReturn,
            ],
        ];
        for chain in chains {
            for pair in chain.windows(2) {
                assert!(find(pair[0], pair[1]).is_some(), "{pair:?}");
            }
        }
        assert_eq!(
            find(UdsRecvReturn, TcpSendmsg).unwrap().name,
            "proxy_uds_to_tcp"
        );
        assert_eq!(
            find(RecvReturn, UdsDataReady).unwrap().name,
            "proxy_tcp_to_uds"
        );
    }

    fn io(sock: Sock, dir: Direction, (start, end): (u64, u64), ns: u64) -> Io {
        use super::super::event::{Origin, Stamp};
        use super::super::time::{NodeId, NodeTime};
        let stamp = Stamp {
            time: NodeTime::new(NodeId(0), ns),
            error_ns: 0,
            sample: u32::MAX,
            origin: Origin { file: 0, line: 0 },
            place: Default::default(),
        };
        Io {
            sock,
            dir,
            start,
            end,
            stamp,
            tid: 7,
        }
    }

    #[test]
    fn the_relay_rule_links_a_one_to_one_relay_and_refuses_to_guess_otherwise() {
        use super::super::event::UnixEnds;
        let unix = Sock::Unix(UnixEnds { sock: 1, peer: 2 });
        let tcp = Sock::Tcp(9);
        let read = io(unix, Direction::Rx, (0, 100), 10);
        let mut legs = Legs::default();
        legs.thread_io(read);
        legs.thread_io(io(tcp, Direction::Tx, (500, 600), 20));
        let next = relay_next(&legs, &read, (0, 100)).unwrap();
        assert_eq!((next.sock, next.start), (tcp, 500));
        // One read returning two requests: which bytes went where cannot be told.
        let err = relay_next(&legs, &read, (0, 60)).unwrap_err();
        assert!(err.contains("the read returned bytes [0, 100)"), "{err}");
        // A second read before the write (several messages in flight).
        let mut busy = Legs::default();
        busy.thread_io(read);
        busy.thread_io(io(unix, Direction::Rx, (100, 200), 15));
        busy.thread_io(io(tcp, Direction::Tx, (500, 700), 20));
        let err = relay_next(&busy, &read, (0, 100)).unwrap_err();
        assert!(err.contains("several messages in flight"), "{err}");
        // A write of another size (buffering joins or splits messages).
        let mut joined = Legs::default();
        joined.thread_io(read);
        joined.thread_io(io(tcp, Direction::Tx, (500, 650), 20));
        let err = relay_next(&joined, &read, (0, 100)).unwrap_err();
        assert!(
            err.contains("wrote 150 bytes for a message of 100"),
            "{err}"
        );
    }
}
