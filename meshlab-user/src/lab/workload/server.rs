//! `meshlab lab server`: echoes every request (kitex-echo's server shape), one thread per
//! connection, until SIGINT/SIGTERM.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use super::client::TraceArgs;
use super::{
    Conn, Endpoint, FrameReadError, endpoint, framed_trace_id, install_shutdown_handler,
    poll_readable, read_frame, shutting_down,
};
use crate::lab::codec::thrift::MessageKind;
use crate::lab::codec::{self, Envelope, Proto};
use crate::lab::probes::{Hit, ProbeSink, RequestProbes, realtime_ns};
use crate::schema::Direction;

/// How often blocked threads look at the shutdown flag.
const POLL_TICK_MS: i32 = 100;

#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// TCP address to listen on (port 0 picks one; see --ready-file).
    #[arg(long, conflicts_with = "unix")]
    pub listen: Option<SocketAddr>,
    /// Unix socket path to listen on (removed on exit).
    #[arg(long)]
    pub unix: Option<PathBuf>,
    /// Framing; off means upstream behaviour (the seed's rule): Framed unless `--proto ttheader`.
    #[arg(long, value_enum, default_value_t = Proto::Framed)]
    pub proto: Proto,
    /// Written once listening: the bound address (`tcp:IP:PORT` or `unix:PATH`).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Busy-spin this long in the handler of every request (DURATION: a number with a unit,
    /// e.g. 200us): a known slow handler for `cargo xtask truth` (the time belongs to the
    /// server process).
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = crate::units::parse_duration)]
    pub handler_spin: std::time::Duration,
    /// Burn this much of the handler thread's own CPU time in every request (DURATION, as
    /// --handler-spin; CLOCK_THREAD_CPUTIME_ID): work that needs the CPU, so time the thread
    /// spends preempted adds to it (the CPU-hog cause of `cargo xtask truth`).
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = crate::units::parse_duration)]
    pub handler_cpu: std::time::Duration,
    /// SO_RCVBUF of every accepted TCP connection (0 = the kernel's default): a known small
    /// receive buffer for `cargo xtask truth`.
    #[arg(long, default_value_t = 0)]
    pub rcvbuf: u32,
    /// Wait for the next request by polling without sleeping (`poll(2)` with a zero timeout
    /// in a loop) instead of blocking in `poll(2)`: the connection thread never sleeps between
    /// requests, so a request that arrives while it is preempted waits in its socket with its
    /// reader runnable (`rx_runqueue_wait`; the busy-poll CPU-hog cause of `cargo xtask
    /// truth`). Burns its CPU while idle.
    #[arg(long)]
    pub busy_poll: bool,
    #[command(flatten)]
    pub trace: TraceArgs,
}

/// What the server does to each connection and request besides echoing.
#[derive(Clone, Copy, Debug)]
struct ServeOptions {
    proto: Proto,
    handler_spin: std::time::Duration,
    handler_cpu: std::time::Duration,
    rcvbuf: u32,
    busy_poll: bool,
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    install_shutdown_handler();
    let ep = endpoint(args.listen, args.unix.clone())?;
    let probes = args.trace.open("server")?;
    let (listener, bound) = match &ep {
        Endpoint::Tcp(a) => {
            let l = TcpListener::bind(a).with_context(|| format!("listen on {a}"))?;
            let bound = Endpoint::Tcp(l.local_addr()?);
            (Listener::Tcp(l), bound)
        }
        Endpoint::Unix(p) => {
            let l = UnixListener::bind(p).with_context(|| format!("listen on {}", p.display()))?;
            (Listener::Unix(l, p.clone()), ep.clone())
        }
    };
    if let Some(path) = &args.ready_file {
        // Written then renamed into place: whoever waits for the file never sees it empty.
        crate::output::write_output(path, bound.to_string().as_bytes())?;
    }
    log::info!("echo server ({:?}) listening on {bound}", args.proto);
    let fd = match &listener {
        Listener::Tcp(l) => l.as_raw_fd(),
        Listener::Unix(l, _) => l.as_raw_fd(),
    };
    let options = ServeOptions {
        proto: args.proto,
        handler_spin: args.handler_spin,
        handler_cpu: args.handler_cpu,
        rcvbuf: args.rcvbuf,
        busy_poll: args.busy_poll,
    };
    let result = accept_loop(&listener, fd, options, &probes);
    if let Listener::Unix(_, path) = &listener {
        let _ = std::fs::remove_file(path);
    }
    if let Some(p) = &probes {
        p.flush()?;
    }
    result
}

fn accept_loop(
    listener: &Listener,
    fd: i32,
    options: ServeOptions,
    probes: &Option<Arc<ProbeSink>>,
) -> anyhow::Result<()> {
    while !shutting_down() {
        if !poll_readable(fd, POLL_TICK_MS)? {
            continue;
        }
        let (conn, unix_path) = match listener {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                if options.rcvbuf > 0 {
                    set_rcvbuf(&s, options.rcvbuf)?;
                }
                (Conn::Tcp(s), None)
            }
            Listener::Unix(l, p) => (Conn::Unix(l.accept()?.0), Some(p.clone())),
        };
        let probes = probes.clone();
        std::thread::spawn(move || {
            if let Err(e) = serve(conn, unix_path, options, probes) {
                log::warn!("connection ended: {e:#}");
            }
        });
    }
    log::info!("echo server: shutting down");
    Ok(())
}

fn serve(
    mut conn: Conn,
    unix_path: Option<PathBuf>,
    options: ServeOptions,
    probes: Option<Arc<ProbeSink>>,
) -> anyhow::Result<()> {
    let proto = options.proto;
    let conn_ref = conn.conn_ref(unix_path.as_ref());
    let tracing = probes.is_some();
    let (mut tx_offset, mut rx_offset) = (0u64, 0u64);
    let mut inbuf = Vec::with_capacity(1024);
    let mut out = Vec::with_capacity(1024);
    loop {
        // Leftover bytes of a pipelined request are already here: no readiness to wait for.
        if inbuf.is_empty() && !wait_readable(conn.as_raw_fd(), options.busy_poll)? {
            return Ok(());
        }
        // The sampling decision needs the decoded request: take these two timestamps when
        // tracing at all, keep them only if the request turns out sampled.
        let ready_ts = tracing.then(realtime_ns);
        let frame_len = match read_frame(&mut conn, proto, &mut inbuf) {
            Ok(n) => n,
            Err(FrameReadError::Closed) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let read_end_ts = tracing.then(realtime_ns);
        let (request, _) =
            codec::decode(proto, &inbuf[..frame_len])?.context("whole frame read")?;
        inbuf.drain(..frame_len);
        let seq_id = request.message.seq_id;
        let trace_id = match (&probes, proto) {
            (None, _) => None,
            (Some(_), Proto::Ttheader) => request.trace_id.clone(),
            (Some(p), Proto::Framed) => p
                .rate
                .sampled(seq_id)
                .then(|| framed_trace_id(&conn_ref, true, seq_id)),
        };
        let mut hits = RequestProbes::new(trace_id.is_some());
        if let (Some(ready), Some(read_end)) = (ready_ts, read_end_ts) {
            hits.push(Hit {
                point: "server.read_ready",
                ts_ns: ready,
                bytes: None,
            });
            let bytes = Some((Direction::Rx, rx_offset, frame_len as u64));
            hits.push(Hit {
                point: "server.read_end",
                ts_ns: read_end,
                bytes,
            });
        }
        rx_offset += frame_len as u64;
        hits.hit("server.decode_end");
        hits.hit("server.handler_begin");
        spin_for(options.handler_spin);
        burn_cpu(options.handler_cpu)?;
        let mut reply = request.message;
        reply.kind = MessageKind::Reply;
        hits.hit("server.handler_end");
        out.clear();
        let env = Envelope {
            trace_id: trace_id.clone(),
            message: reply,
        };
        let len = codec::encode(proto, &env, &mut out) as u64;
        hits.hit("server.encode_end");
        hits.hit_bytes("server.write_begin", Direction::Tx, tx_offset, len);
        conn.write_all(&out).context("send reply")?;
        hits.hit("server.write_end");
        tx_offset += len;
        if let (Some(sink), Some(id)) = (&probes, &trace_id) {
            sink.emit(id, &conn_ref, &hits.hits)?;
        }
    }
}

/// Waits until `fd` is readable; false when the server is shutting down first. Blocks in
/// `poll(2)` (a tick at a time, to see the shutdown flag), or with `busy` polls with a zero
/// timeout in a loop: the thread stays runnable, on its CPU or preempted, and never sleeps.
fn wait_readable(fd: std::os::fd::RawFd, busy: bool) -> std::io::Result<bool> {
    let timeout_ms = if busy { 0 } else { POLL_TICK_MS };
    loop {
        if poll_readable(fd, timeout_ms)? {
            return Ok(true);
        }
        if shutting_down() {
            return Ok(false);
        }
    }
}

/// Busy-waits (on CPU, no sleep: a slow handler, not a blocked one).
fn spin_for(duration: std::time::Duration) {
    if duration.is_zero() {
        return;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < duration {
        std::hint::spin_loop();
    }
}

/// Busy-works until the calling thread has used `duration` of CPU time: unlike `spin_for`,
/// time off the CPU (preempted) does not count, so it lengthens the request.
fn burn_cpu(duration: std::time::Duration) -> anyhow::Result<()> {
    if duration.is_zero() {
        return Ok(());
    }
    let start = thread_cpu_ns()?;
    let budget = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    while thread_cpu_ns()?.saturating_sub(start) < budget {
        std::hint::spin_loop();
    }
    Ok(())
}

fn thread_cpu_ns() -> anyhow::Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Err(std::io::Error::last_os_error())
            .context("clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

fn set_rcvbuf(stream: &std::net::TcpStream, bytes: u32) -> anyhow::Result<()> {
    let value = bytes as libc::c_int;
    // SAFETY: a valid socket fd and a c_int option value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("setsockopt SO_RCVBUF");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    /// The calling thread's voluntary context switches so far (it slept that many times).
    fn voluntary_switches() -> i64 {
        // SAFETY: a zeroed rusage is a valid value; getrusage writes one to a valid pointer.
        let (rc, usage) = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            (libc::getrusage(libc::RUSAGE_THREAD, &mut usage), usage)
        };
        assert_eq!(rc, 0, "getrusage(RUSAGE_THREAD)");
        usage.ru_nvcsw
    }

    /// Waits on one end of a pair while a thread writes to the other after `delay`; the
    /// waiting thread's voluntary context switches while it waited.
    fn wait_for_a_late_write(busy: bool, delay: Duration) -> i64 {
        let (reader, mut writer) = UnixStream::pair().unwrap();
        let write = std::thread::spawn(move || {
            std::thread::sleep(delay);
            writer.write_all(b"x").unwrap();
            writer
        });
        let before = voluntary_switches();
        assert!(wait_readable(reader.as_raw_fd(), busy).unwrap());
        let slept = voluntary_switches() - before;
        drop(write.join().unwrap());
        slept
    }

    #[test]
    fn busy_polling_waits_for_data_without_sleeping() {
        // The blocking wait sleeps in poll(2) until the write wakes it.
        assert!(wait_for_a_late_write(false, Duration::from_millis(30)) >= 1);
        // The busy wait stays runnable: it may be preempted (involuntary), never put to sleep.
        assert_eq!(wait_for_a_late_write(true, Duration::from_millis(30)), 0);
    }
}
