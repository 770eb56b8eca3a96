//! How the joiners name a message before its stages are looked up.

use super::event::Stamp;

/// A message located on a connection: `[start, end)` of its direction's stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MsgRef {
    pub cookie: u64,
    pub start: u64,
    pub end: u64,
}

/// A new send call seen by tcp_sendmsg (the first event of a call): the message of a
/// kernel-only turn, and the thread fallback of a probe without connection or offset.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendCall {
    pub stamp: Stamp,
    pub msg: MsgRef,
}
