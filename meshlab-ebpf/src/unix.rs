//! Unix stream sockets (the sidecar legs of the mesh topologies). They have no sock_ops, no
//! cookie and no sequence numbers: events carry the socket's and its peer's kernel addresses,
//! and userspace numbers the bytes from the syscall return values.

use meshlab_common::{AF_UNIX, EVENT_FLAG_UNIX, Hook};

use crate::emit::emit;
use crate::globals::{config, offset};
use crate::kread::read;

/// Whether `sk` is a unix socket that should be traced: `--unix` given, and in the traced
/// network namespace when `--netns` is.
#[inline(always)]
fn traced_unix(sk: u64) -> bool {
    if config!(trace_unix) == 0 {
        return false;
    }
    if read::<u16>(sk, offset!(sock_common_family)) != Some(AF_UNIX) {
        return false;
    }
    let wanted = config!(netns_cookie);
    if wanted == 0 {
        return true;
    }
    let net: u64 = read(sk, offset!(sock_common_net)).unwrap_or(0);
    read::<u64>(net, offset!(net_cookie)) == Some(wanted)
}

/// Emits `hook` for a unix socket: `skb` = socket address, `aux` = peer address, `value` =
/// the syscall's return (bytes) for send/recv returns.
#[inline(always)]
pub fn on_unix(hook: Hook, sk: u64, value: i32) -> Option<()> {
    // Failed or empty calls (EAGAIN, EOF) move no bytes.
    if !traced_unix(sk) || (hook != Hook::SkDataReady && value <= 0) {
        return None;
    }
    let peer: u64 = read(sk, offset!(unix_sock_peer)).unwrap_or(0);
    emit(hook, |ev| {
        ev.skb = sk;
        ev.aux = peer;
        ev.value = value;
        ev.flags |= EVENT_FLAG_UNIX;
        Some(())
    });
    Some(())
}
