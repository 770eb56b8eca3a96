//! One node's unix stream legs and every traced thread's socket I/O, for the hop chains of
//! [`super::hops`]: which socket a probed process wrote a message on, who read it on the peer
//! socket, and what that reader (a proxy) wrote next or read before.
//!
//! Unix sockets have no sequence numbers: the recorder counts bytes per socket, so a send of
//! `[start, end)` on socket X is the receive of `[start, end)` on X's peer
//! (docs/probe-points.md). `sk_data_ready` of a unix socket carries no offset; it is placed by
//! time (the latest one on the reading socket before the sender's send returned).
//!
//! Memory is bounded like the TCP index: everything older than the retention is evicted.

use std::collections::{BTreeMap, VecDeque};

use super::HashMap;

use crate::schema::Direction;

use super::event::{KEvent, Stamp, UnixEnds};
use super::message::MsgRef;
use crate::schema::Hook;

/// A socket a thread read or wrote: a TCP connection (cookie) or a unix socket and its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sock {
    Tcp(u64),
    Unix(UnixEnds),
}

/// One send or recv call of a thread: `[start, end)` of its direction's stream on `sock`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Io {
    pub sock: Sock,
    pub dir: Direction,
    pub start: u64,
    pub end: u64,
    pub stamp: Stamp,
    pub tid: u32,
}

impl Io {
    /// A TCP call of thread `tid`: a new send call's or a recv return's message.
    pub fn tcp_call(msg: MsgRef, dir: Direction, stamp: Stamp, tid: u32) -> Io {
        Io {
            sock: Sock::Tcp(msg.cookie),
            dir,
            start: msg.start,
            end: msg.end,
            stamp,
            tid,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.end - self.start
    }

    /// The TCP message of this call, if it was on a TCP connection.
    pub fn tcp(&self) -> Option<MsgRef> {
        match self.sock {
            Sock::Tcp(cookie) => Some(MsgRef {
                cookie,
                start: self.start,
                end: self.end,
            }),
            Sock::Unix(_) => None,
        }
    }
}

#[derive(Default)]
pub(crate) struct Legs {
    /// Unix calls per socket and direction, by start offset.
    unix: HashMap<(u64, Direction), BTreeMap<u64, Io>>,
    /// `sk_data_ready` per unix socket, in time order.
    ready: HashMap<u64, VecDeque<Stamp>>,
    /// Every traced send/recv call per thread (TCP and unix), in time order.
    threads: HashMap<u32, VecDeque<Io>>,
}

impl Legs {
    /// Takes a unix stream event (send_return, recv_return, sk_data_ready with `unix` set).
    pub fn insert_unix(&mut self, ev: &KEvent, ends: UnixEnds) {
        if ev.hook == Hook::SkDataReady {
            self.ready.entry(ends.sock).or_default().push_back(ev.stamp);
            return;
        }
        let dir = match ev.hook {
            Hook::SendReturn => Direction::Tx,
            Hook::RecvReturn => Direction::Rx,
            _ => return,
        };
        let Some(start) = ev.offset.filter(|_| ev.len > 0) else {
            return;
        };
        let io = Io {
            sock: Sock::Unix(ends),
            dir,
            start,
            end: start + u64::from(ev.len),
            stamp: ev.stamp,
            tid: ev.tid,
        };
        self.unix
            .entry((ends.sock, dir))
            .or_default()
            .insert(start, io);
        self.thread_io(io);
    }

    /// Records a TCP call of a thread (a new tcp_sendmsg call, or a recv return).
    pub fn thread_io(&mut self, io: Io) {
        self.threads.entry(io.tid).or_default().push_back(io);
    }

    pub fn evict_before(&mut self, cutoff_ns: u64) {
        self.unix.retain(|_, calls| {
            calls.retain(|_, io| io.stamp.ns() >= cutoff_ns);
            !calls.is_empty()
        });
        for q in self.ready.values_mut() {
            while q.front().is_some_and(|s| s.ns() < cutoff_ns) {
                q.pop_front();
            }
        }
        self.ready.retain(|_, q| !q.is_empty());
        for q in self.threads.values_mut() {
            while q.front().is_some_and(|io| io.stamp.ns() < cutoff_ns) {
                q.pop_front();
            }
        }
        self.threads.retain(|_, q| !q.is_empty());
    }

    /// The unix call of thread `tid` in `dir` that carries byte `end - 1` of a message starting
    /// at `start` on any of its sockets (a probed process names its message by offsets only).
    pub fn call_of(&self, tid: u32, dir: Direction, start: u64, end: u64) -> Option<Io> {
        let last = end.checked_sub(1)?.max(start);
        self.threads.get(&tid)?.iter().copied().find(|io| {
            io.dir == dir && matches!(io.sock, Sock::Unix(_)) && io.start <= last && io.end > last
        })
    }

    /// On unix socket `sock`, the call in `dir` covering byte `end - 1`.
    pub fn covering(&self, sock: u64, dir: Direction, end: u64) -> Option<Io> {
        let last = end.checked_sub(1)?;
        let (_, io) = self.unix.get(&(sock, dir))?.range(..=last).next_back()?;
        (io.end > last).then_some(*io)
    }

    /// The latest `sk_data_ready` of unix socket `sock` in `[lo, hi]`.
    pub fn ready_between(&self, sock: u64, lo: u64, hi: u64) -> Option<Stamp> {
        self.ready
            .get(&sock)?
            .iter()
            .rev()
            .find(|s| s.ns() <= hi && s.ns() >= lo)
            .copied()
    }

    /// The calls of thread `tid` after `io` (exclusive), in time order.
    pub fn after(&self, io: &Io) -> impl Iterator<Item = &Io> {
        let ns = io.stamp.ns();
        self.threads
            .get(&io.tid)
            .into_iter()
            .flatten()
            .filter(move |c| c.stamp.ns() > ns)
    }

    /// The calls of thread `tid` before `io` (exclusive), latest first.
    pub fn before(&self, io: &Io) -> impl Iterator<Item = &Io> {
        let ns = io.stamp.ns();
        self.threads
            .get(&io.tid)
            .into_iter()
            .flat_map(|q| q.iter().rev())
            .filter(move |c| c.stamp.ns() < ns)
    }
}
