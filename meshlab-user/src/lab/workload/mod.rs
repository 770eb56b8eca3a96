//! The echo RPC workload, in the shape of kitex-benchmark's kitex-echo: a server echoing the
//! payload and a ping-pong load generator (one blocking connection per thread).

pub mod client;
pub mod latency;
pub mod server;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::schema::ConnRef;

use super::codec::{self, CodecError, Proto};

/// SO_COOKIE from <asm-generic/socket.h>: the kernel's 64-bit id of a socket, the same value
/// the eBPF programs see.
const SO_COOKIE: libc::c_int = 57;

/// Where a server listens or a client connects.
#[derive(Clone, Debug)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// `--listen ADDR | --unix PATH` (server) or `--connect ADDR | --unix PATH` (client).
pub fn endpoint(tcp: Option<SocketAddr>, unix: Option<PathBuf>) -> anyhow::Result<Endpoint> {
    match (tcp, unix) {
        (Some(a), None) => Ok(Endpoint::Tcp(a)),
        (None, Some(p)) => Ok(Endpoint::Unix(p)),
        _ => anyhow::bail!("give exactly one of a TCP address or --unix PATH"),
    }
}

/// A connected stream of either family.
pub enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    pub fn connect(ep: &Endpoint) -> io::Result<Self> {
        match ep {
            Endpoint::Tcp(a) => {
                let s = TcpStream::connect(a)?;
                // Ping-pong RPC: do not let Nagle hold the request back.
                s.set_nodelay(true)?;
                Ok(Conn::Tcp(s))
            }
            Endpoint::Unix(p) => Ok(Conn::Unix(UnixStream::connect(p)?)),
        }
    }

    /// Connects, retrying for up to `patience` while the peer is not listening yet (a proxy
    /// started a moment ago).
    pub fn connect_patiently(ep: &Endpoint, patience: Duration) -> io::Result<Self> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            match Self::connect(ep) {
                Ok(c) => return Ok(c),
                Err(e)
                    if std::time::Instant::now() < deadline
                        && matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                        ) =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// How probe records name this connection: socket cookie plus 4-tuple or socket path.
    pub fn conn_ref(&self, unix_path: Option<&PathBuf>) -> ConnRef {
        let mut r = ConnRef {
            cookie: socket_cookie(self.as_raw_fd()),
            ..ConnRef::default()
        };
        match self {
            Conn::Tcp(s) => {
                if let (Ok(l), Ok(p)) = (s.local_addr(), s.peer_addr()) {
                    r.laddr = Some(l.ip().to_string());
                    r.lport = Some(l.port());
                    r.raddr = Some(p.ip().to_string());
                    r.rport = Some(p.port());
                }
            }
            Conn::Unix(_) => r.unix_path = unix_path.map(|p| p.display().to_string()),
        }
        r
    }
}

impl AsRawFd for Conn {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Conn::Tcp(s) => s.as_raw_fd(),
            Conn::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// getsockopt(SOL_SOCKET, SO_COOKIE); `None` on kernels without it.
pub fn socket_cookie(fd: RawFd) -> Option<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: valid out pointer and length for a u64 option value.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cookie)
}

/// Waits until `fd` is readable (or `timeout_ms` passes: `Ok(false)`). A real readiness event,
/// so `read_ready` probes mark when the kernel had data, not when read() returned.
pub fn poll_readable(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc >= 0 {
            return Ok(rc > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FrameReadError {
    #[error("connection closed by the peer")]
    Closed,
    #[error("connection closed in the middle of a frame ({0} bytes buffered)")]
    Truncated(usize),
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Reads until `buf` holds at least one whole frame; returns its length. Bytes after it stay
/// in `buf` for the next call.
pub fn read_frame(
    conn: &mut Conn,
    proto: Proto,
    buf: &mut Vec<u8>,
) -> Result<usize, FrameReadError> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(len) = codec::frame_len(proto, buf)?
            && buf.len() >= len
        {
            return Ok(len);
        }
        let n = match conn.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(if buf.is_empty() {
                FrameReadError::Closed
            } else {
                FrameReadError::Truncated(buf.len())
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Set by SIGINT/SIGTERM: long-running lab processes finish cleanly (flush probes, remove
/// their unix socket) instead of dying mid-write.
pub static SHUTDOWN: AtomicBool = AtomicBool::new(false);

extern "C" fn on_shutdown_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SHUTDOWN.store(true, Ordering::SeqCst);
}

pub fn install_shutdown_handler() {
    let handler = on_shutdown_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

pub fn shutting_down() -> bool {
    SHUTDOWN.load(Ordering::SeqCst)
}

/// The trace id both sides derive for Framed (which carries no metadata): client address and
/// port, server address and port, request sequence id. Only agrees when client and server
/// share one TCP connection (topology `direct`). On a unix socket (behind a sidecar) the two
/// ends cannot agree on anything, so each side's id is unique on its own (the socket's
/// SO_COOKIE) and merge pairs the halves by the TCP leg the relay rule finds instead.
pub fn framed_trace_id(client: &ConnRef, server_side: bool, seq_id: i32) -> String {
    if client.unix_path.is_some() {
        let side = if server_side { "s" } else { "c" };
        return format!("f-{side}-{}-{seq_id}", client.cookie.unwrap_or(0));
    }
    let (c, s) = if server_side {
        ((&client.raddr, client.rport), (&client.laddr, client.lport))
    } else {
        ((&client.laddr, client.lport), (&client.raddr, client.rport))
    };
    let show = |(a, p): (&Option<String>, Option<u16>)| {
        format!("{}:{}", a.as_deref().unwrap_or("unix"), p.unwrap_or(0))
    };
    format!("f-{}-{}-{seq_id}", show(c), show(s))
}
