//! The wire between the two guests: a host-side relay between the two qemu datagram sockets
//! that forwards every frame to the other guest after a configured one-way delay.
//!
//! Guest X's qemu sends to `wire-X.sock` (instead of the peer's `link-Y.sock`); one thread per
//! direction receives there, stamps the frame with CLOCK_MONOTONIC (`Instant`), queues it in a
//! FIFO with its deadline (arrival + the delay in force, never before the frame ahead of it, so
//! the order is kept) and sends it to `link-Y.sock` at the deadline: it sleeps in `ppoll` until
//! [`SPIN_NS`] before it, then spins. Nothing of the payload is read but its length.
//!
//! The delay changes at run time through the directory both guests share: a guest creates
//! `wire.set.N.DELAY_US` (N = 1, 2, ...), the relay switches to that delay for the frames that
//! arrive from then on and answers with `wire.ack.N`. Every forwarded frame's realized delay
//! (sent minus received, on the host's clock: the truth the guests cannot see) is kept per
//! switch ("epoch") and direction and written as a summary to the log on drop. Dropping the
//! wire stops and joins its threads and removes its sockets, on every exit path of the run.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::spec::GUEST_NAMES;

/// The last stretch before a deadline is spun, not slept: a wake-up from sleep is late by tens
/// of microseconds on a loaded host.
const SPIN_NS: u64 = 50_000;
/// Largest frame qemu sends (virtio-net with offloads off: a few KiB; 64 KiB is any datagram).
const MAX_FRAME: usize = 65_536;
/// How often an idle thread looks at the stop flag and the control thread at the shared dir.
const IDLE_POLL: Duration = Duration::from_millis(50);
const CONTROL_POLL: Duration = Duration::from_millis(2);

/// The socket guest `index` sends to when the wire is in place.
pub fn wire_socket(run_dir: &Path, index: usize) -> PathBuf {
    run_dir.join(format!("wire-{}.sock", GUEST_NAMES[index]))
}

/// The socket guest `index` receives on (bound by its qemu).
pub fn link_socket(run_dir: &Path, index: usize) -> PathBuf {
    run_dir.join(format!("link-{}.sock", GUEST_NAMES[index]))
}

/// One forwarded frame: the epoch its delay came from, its direction (0 = A -> B) and how long
/// it really stayed in the relay.
#[derive(Debug, Clone, Copy)]
struct Sample {
    epoch: u64,
    direction: u8,
    realized_ns: u64,
}

/// State the threads share.
struct Shared {
    stop: AtomicBool,
    delay_ns: AtomicU64,
    epoch: AtomicU64,
    /// The configured one-way delay of each epoch, in microseconds (index = epoch).
    delays_us: Mutex<Vec<u64>>,
    samples: Mutex<Vec<Sample>>,
}

pub struct Wire {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    sockets: Vec<PathBuf>,
    log: Option<PathBuf>,
}

impl Wire {
    /// Binds both wire sockets in `run_dir` and starts the relay with `delay_us` one way;
    /// `control_dir` is where the guests ask for another delay; `log` gets the summary.
    pub fn start(
        run_dir: &Path,
        control_dir: &Path,
        delay_us: u64,
        log: Option<PathBuf>,
    ) -> Result<Wire> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            delay_ns: AtomicU64::new(delay_us * 1000),
            epoch: AtomicU64::new(0),
            delays_us: Mutex::new(vec![delay_us]),
            samples: Mutex::new(Vec::new()),
        });
        let mut wire = Wire {
            shared,
            threads: Vec::new(),
            sockets: Vec::new(),
            log,
        };
        for (index, name) in GUEST_NAMES.iter().enumerate() {
            let path = wire_socket(run_dir, index);
            let socket =
                UnixDatagram::bind(&path).with_context(|| format!("binding {}", path.display()))?;
            wire.sockets.push(path);
            socket.set_nonblocking(true)?;
            let to = link_socket(run_dir, 1 - index);
            let shared = Arc::clone(&wire.shared);
            wire.threads.push(
                std::thread::Builder::new()
                    .name(format!("wire-{name}"))
                    .spawn(move || forward(&socket, &to, index as u8, &shared))?,
            );
        }
        let shared = Arc::clone(&wire.shared);
        let dir = control_dir.to_path_buf();
        wire.threads.push(
            std::thread::Builder::new()
                .name("wire-control".into())
                .spawn(move || control(&dir, &shared))?,
        );
        Ok(wire)
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        for path in &self.sockets {
            let _ = std::fs::remove_file(path);
        }
        if let Some(log) = &self.log
            && let Err(error) = write_summary(log, &self.shared)
        {
            eprintln!("vm: wire: writing {}: {error:#}", log.display());
        }
    }
}

/// A frame waiting for its deadline.
struct Queued {
    received: Instant,
    deadline: Instant,
    epoch: u64,
    frame: Vec<u8>,
}

/// One direction: receive into the FIFO, send what is due, sleep or spin until the next deadline.
fn forward(socket: &UnixDatagram, to: &Path, direction: u8, shared: &Shared) {
    realtime_priority();
    let mut fifo: std::collections::VecDeque<Queued> = std::collections::VecDeque::new();
    let mut buf = vec![0u8; MAX_FRAME];
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while fifo.front().is_some_and(|q| q.deadline <= now) {
            let queued = fifo.pop_front().expect("front checked");
            // A guest not (yet or any more) listening drops the frame, as a cable would.
            let _ = socket.send_to(&queued.frame, to);
            let realized_ns = queued.received.elapsed().as_nanos() as u64;
            (shared.samples.lock().expect("samples")).push(Sample {
                epoch: queued.epoch,
                direction,
                realized_ns,
            });
        }
        let wait = match fifo.front() {
            Some(q) => q
                .deadline
                .saturating_duration_since(Instant::now())
                .saturating_sub(Duration::from_nanos(SPIN_NS)),
            None => IDLE_POLL,
        };
        if !wait.is_zero() {
            wait_readable(socket, wait);
        }
        while let Ok(len) = socket.recv(&mut buf) {
            let received = Instant::now();
            let delay = Duration::from_nanos(shared.delay_ns.load(Ordering::SeqCst));
            let after = fifo.back().map_or(received, |q| q.deadline);
            fifo.push_back(Queued {
                received,
                deadline: (received + delay).max(after),
                epoch: shared.epoch.load(Ordering::SeqCst),
                frame: buf[..len].to_vec(),
            });
        }
    }
}

/// SCHED_FIFO for the calling thread when allowed (root): on a host loaded with two TCG guests
/// a normal thread wakes from its sleep, or is preempted in its spin, tens of microseconds to
/// milliseconds late. The thread sleeps between frames and spins at most [`SPIN_NS`] per
/// frame, and the kernel's RT throttling still leaves others their share. Without the
/// privilege the wire works the same, less precisely (the realized delays in the log say so).
fn realtime_priority() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: a valid sched_param for the calling thread (pid 0).
    let result = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if result != 0 {
        eprintln!(
            "vm: wire: no SCHED_FIFO ({}): delays less precise",
            std::io::Error::last_os_error()
        );
    }
}

/// Sleeps until `socket` has a datagram or `timeout` passed (nanosecond timeout: `ppoll`).
fn wait_readable(socket: &UnixDatagram, timeout: Duration) {
    let mut fd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    unsafe {
        libc::ppoll(&mut fd, 1, &ts, std::ptr::null());
    }
}

/// Watches `dir` for `wire.set.N.DELAY_US` with the next N and switches to it.
fn control(dir: &Path, shared: &Shared) {
    while !shared.stop.load(Ordering::Relaxed) {
        let next = shared.epoch.load(Ordering::SeqCst) + 1;
        let prefix = format!("wire.set.{next}.");
        let found = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .find_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix(&prefix)?.parse::<u64>().ok()
            });
        if let Some(delay_us) = found {
            shared.delays_us.lock().expect("delays").push(delay_us);
            shared.delay_ns.store(delay_us * 1000, Ordering::SeqCst);
            shared.epoch.store(next, Ordering::SeqCst);
            let ack = dir.join(format!("wire.ack.{next}"));
            if let Err(error) = std::fs::write(&ack, format!("{delay_us}\n")) {
                eprintln!("vm: wire: writing {}: {error}", ack.display());
            }
        }
        std::thread::sleep(CONTROL_POLL);
    }
}

/// `EPOCH DELAY_US DIRECTION FRAMES MEDIAN_NS P90_NS MAX_NS` per epoch and direction
/// (`a>b`, `b>a`): what the frames really spent in the relay.
fn write_summary(path: &Path, shared: &Shared) -> Result<()> {
    let delays = shared.delays_us.lock().expect("delays").clone();
    let samples = shared.samples.lock().expect("samples");
    let mut out = String::from("# epoch delay_us direction frames median_ns p90_ns max_ns\n");
    for (epoch, delay_us) in delays.iter().enumerate() {
        for direction in 0..2u8 {
            let mut realized: Vec<u64> = (samples.iter())
                .filter(|s| s.epoch == epoch as u64 && s.direction == direction)
                .map(|s| s.realized_ns)
                .collect();
            if realized.is_empty() {
                continue;
            }
            realized.sort_unstable();
            let at = |q: usize| realized[(realized.len() - 1) * q / 100];
            let name = if direction == 0 { "a>b" } else { "b>a" };
            out += &format!(
                "{epoch} {delay_us} {name} {} {} {} {}\n",
                realized.len(),
                at(50),
                at(90),
                at(100)
            );
        }
    }
    let mut file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    file.write_all(out.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two stand-ins for the qemu sockets: frames cross in order, no earlier than the delay,
    /// the delay switches on request, and drop removes the sockets and writes the log.
    #[test]
    fn frames_cross_in_order_after_the_delay_and_the_wire_cleans_up() {
        let dir = std::env::temp_dir().join(format!("meshlab-wire-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let a = UnixDatagram::bind(link_socket(&dir, 0)).expect("a");
        let b = UnixDatagram::bind(link_socket(&dir, 1)).expect("b");
        b.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let log = dir.join("wire.log");
        let wire = Wire::start(&dir, &dir, 2_000, Some(log.clone())).expect("start");
        let mut buf = [0u8; 16];
        for delay_us in [2_000u64, 500] {
            let sent = Instant::now();
            for i in 0..3u8 {
                a.send_to(&[i; 5], wire_socket(&dir, 0)).expect("send");
            }
            for i in 0..3u8 {
                let len = b.recv(&mut buf).expect("frame");
                assert_eq!(&buf[..len], &[i; 5], "order and payload kept");
            }
            assert!(sent.elapsed() >= Duration::from_micros(delay_us));
            std::fs::write(dir.join("wire.set.1.500"), "").expect("set");
            let ack = dir.join("wire.ack.1");
            while !ack.exists() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        drop(wire);
        assert!(!wire_socket(&dir, 0).exists() && !wire_socket(&dir, 1).exists());
        let text = std::fs::read_to_string(&log).expect("log");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            text.contains("\n0 2000 a>b 3 ") && text.contains("\n1 500 a>b 3 "),
            "{text}"
        );
    }
}
