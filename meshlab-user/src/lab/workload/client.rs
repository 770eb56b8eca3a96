//! `meshlab lab client`: ping-pong load generator (kitex-benchmark's client shape).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;

use super::latency::{LatencySummary, new_histogram, quantiles};
use super::{Conn, Endpoint, endpoint, framed_trace_id, poll_readable, read_frame};
use crate::lab::codec::thrift::{MessageKind, ThriftMessage};
use crate::lab::codec::{self, Envelope, Proto};
use crate::lab::probes::{ProbeSink, RequestProbes, SampleRate};
use crate::schema::{ConnRef, Direction};
// Re-exported for the demo's flags, which parse durations like the workload's.
pub use crate::units::parse_duration;

#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// Server (or sidecar) TCP address.
    #[arg(long, conflicts_with = "unix")]
    pub connect: Option<SocketAddr>,
    /// Server (or sidecar) unix socket path.
    #[arg(long)]
    pub unix: Option<PathBuf>,
    /// Payload bytes echoed per request.
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Connections, one thread each, one request in flight per connection.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Total request rate limit (0 = as fast as responses come back).
    #[arg(long, default_value_t = 0)]
    pub qps: u64,
    /// Time before measuring starts (requests are sent, not recorded); a number with a unit:
    /// ns, us, ms, s, m or h.
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Measured time after warm-up (DURATION, as --warmup).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Duration,
    /// Framing; off means upstream behaviour (the seed's rule): Framed unless `--proto ttheader`.
    #[arg(long, value_enum, default_value_t = Proto::Framed)]
    pub proto: Proto,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Send redis PINGs (`*1\r\n$4\r\nPING\r\n`, each answered `+PONG\r\n`) instead of echo
    /// requests: a redis-server's latency to the histogram's 3 significant digits (~64 ns at
    /// 60 us; redis-benchmark's own histogram has 8 us buckets there). No payload, framing or
    /// probes.
    #[arg(
        long,
        conflicts_with_all = ["proto", "payload", "trace", "trace_sample", "node", "process"]
    )]
    pub redis_ping: bool,
    #[command(flatten)]
    pub trace: TraceArgs,
}

/// Probe flags shared by client and server. No `--trace`, no probes.
#[derive(Debug, Clone, clap::Args)]
pub struct TraceArgs {
    /// Write userland probe NDJSON to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Trace one request in N.
    #[arg(long, default_value = "1/1")]
    pub trace_sample: SampleRate,
    /// Node name written into probe records (the machine, e.g. A).
    #[arg(long)]
    pub node: Option<String>,
    /// Process role written into probe records.
    #[arg(long)]
    pub process: Option<String>,
}

impl TraceArgs {
    pub fn open(&self, default_role: &str) -> anyhow::Result<Option<Arc<ProbeSink>>> {
        let Some(path) = &self.trace else {
            return Ok(None);
        };
        let role = self.process.as_deref().unwrap_or(default_role);
        let sink = ProbeSink::create(path, self.trace_sample, self.node.clone(), role)?;
        Ok(Some(Arc::new(sink)))
    }
}

struct ConnResult {
    hist: Histogram<u64>,
    sent: u64,
}

pub fn run(args: ClientArgs) -> anyhow::Result<()> {
    let ep = endpoint(args.connect, args.unix.clone())?;
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let probes = args.trace.open("client")?;
    let workers = spawn_connections(&args, &ep, &probes);
    let mut hist = new_histogram();
    let mut sent = 0;
    let mut first_error = None;
    for w in workers {
        match w.join().expect("client thread panicked") {
            Ok(r) => {
                hist.add(&r.hist).expect("same histogram bounds");
                sent += r.sent;
            }
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Some(p) = &probes {
        p.flush()?;
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let summary = summarize(&args, &ep, &hist, sent);
    eprintln!("{}", summary.line());
    if args.json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &summary)?;
        out.write_all(b"\n")?;
    }
    if summary.requests == 0 {
        bail!("no request completed after warm-up");
    }
    Ok(())
}

/// One thread per connection, all sharing one measurement window.
fn spawn_connections(
    args: &ClientArgs,
    ep: &Endpoint,
    probes: &Option<Arc<ProbeSink>>,
) -> Vec<std::thread::JoinHandle<anyhow::Result<ConnResult>>> {
    // The clock starts once every connection is up (connecting may wait for a proxy).
    let window = Arc::new(Window {
        all_connected: Barrier::new(args.concurrency),
        start: OnceLock::new(),
        warmup: args.warmup,
        duration: args.duration,
    });
    // Each connection gets an equal share of the rate limit.
    let interval =
        (args.qps > 0).then(|| Duration::from_secs_f64(args.concurrency as f64 / args.qps as f64));
    (0..args.concurrency)
        .map(|index| {
            let job = Job {
                ep: ep.clone(),
                redis_ping: args.redis_ping,
                proto: args.proto,
                payload: args.payload,
                index,
                window: window.clone(),
                interval,
                probes: probes.clone(),
                pid: std::process::id(),
            };
            std::thread::spawn(move || job.run())
        })
        .collect()
}

fn summarize(args: &ClientArgs, ep: &Endpoint, hist: &Histogram<u64>, sent: u64) -> LatencySummary {
    let duration_s = args.duration.as_secs_f64();
    let q = quantiles(hist);
    let (proto, payload) = if args.redis_ping {
        ("redis-ping".to_owned(), 0)
    } else {
        (format!("{:?}", args.proto).to_lowercase(), args.payload)
    };
    LatencySummary {
        proto,
        endpoint: ep.to_string(),
        payload,
        concurrency: args.concurrency,
        requests: hist.len(),
        requests_total: sent,
        duration_s,
        qps: hist.len() as f64 / duration_s.max(1e-9),
        p50_us: q.p50_us,
        p90_us: q.p90_us,
        p99_us: q.p99_us,
        p999_us: q.p999_us,
        max_us: q.max_us,
        mean_us: q.mean_us,
    }
}

/// The measurement window shared by all connections.
struct Window {
    all_connected: Barrier,
    start: OnceLock<Instant>,
    warmup: Duration,
    duration: Duration,
}

struct Job {
    ep: Endpoint,
    redis_ping: bool,
    proto: Proto,
    payload: usize,
    index: usize,
    window: Arc<Window>,
    interval: Option<Duration>,
    probes: Option<Arc<ProbeSink>>,
    /// This process's id, part of ttheader trace ids.
    pid: u32,
}

/// One connection's open stream: the socket, its identity in probe records, the bytes sent
/// and received so far (probe records carry stream offsets) and reusable buffers.
struct Stream {
    conn: Conn,
    conn_ref: ConnRef,
    tx_offset: u64,
    rx_offset: u64,
    out: Vec<u8>,
    inbuf: Vec<u8>,
}

impl Job {
    fn run(self) -> anyhow::Result<ConnResult> {
        let connected = Conn::connect_patiently(&self.ep, Duration::from_secs(5))
            .with_context(|| format!("connect to {}", self.ep));
        // Wait even when connecting failed, so the other connections are not stuck here.
        self.window.all_connected.wait();
        let conn = connected?;
        let start = *self.window.start.get_or_init(Instant::now);
        let measure_from = start + self.window.warmup;
        let end = measure_from + self.window.duration;
        let unix_path = match &self.ep {
            Endpoint::Unix(p) => Some(p.clone()),
            Endpoint::Tcp(_) => None,
        };
        let mut stream = Stream {
            conn_ref: conn.conn_ref(unix_path.as_ref()),
            conn,
            tx_offset: 0,
            rx_offset: 0,
            out: Vec::with_capacity(self.payload + 128),
            inbuf: Vec::with_capacity(self.payload + 128),
        };
        let body = vec![b'x'; self.payload];
        let mut hist = new_histogram();
        let mut next_send = Instant::now();
        let mut seq_id: i32 = 0;
        while Instant::now() < end {
            if let Some(interval) = self.interval {
                if let Some(wait) = next_send.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                next_send += interval;
            }
            let (t0, elapsed) = if self.redis_ping {
                redis_ping(&mut stream)?
            } else {
                self.round_trip(&mut stream, seq_id, &body)?
            };
            if t0 >= measure_from {
                hist.saturating_record(elapsed.as_nanos() as u64);
            }
            seq_id = seq_id.wrapping_add(1);
        }
        Ok(ConnResult {
            hist,
            sent: seq_id as u64,
        })
    }

    /// Sends request `seq_id`, reads its reply and checks it echoes the request; the probes of
    /// a sampled request are written once the reply is checked. Returns when the request
    /// started and its latency (up to the decoded reply, before checking and probe output).
    fn round_trip(
        &self,
        stream: &mut Stream,
        seq_id: i32,
        body: &[u8],
    ) -> anyhow::Result<(Instant, Duration)> {
        let sampled = self.probes.as_ref().is_some_and(|p| p.rate.sampled(seq_id));
        let mut probes = RequestProbes::new(sampled);
        let t0 = Instant::now();
        probes.hit("client.encode_begin");
        let trace_id = sampled.then(|| match self.proto {
            Proto::Ttheader => format!("{:x}-{}-{seq_id}", self.pid, self.index),
            Proto::Framed => framed_trace_id(&stream.conn_ref, false, seq_id),
        });
        let envelope = Envelope {
            trace_id: trace_id.clone().filter(|_| self.proto == Proto::Ttheader),
            message: ThriftMessage {
                name: "echo".into(),
                kind: MessageKind::Call,
                seq_id,
                body: body.to_vec(),
            },
        };
        stream.out.clear();
        let len = codec::encode(self.proto, &envelope, &mut stream.out) as u64;
        probes.hit("client.encode_end");
        probes.hit_bytes("client.write_begin", Direction::Tx, stream.tx_offset, len);
        stream.conn.write_all(&stream.out).context("send request")?;
        probes.hit("client.write_end");
        stream.tx_offset += len;
        poll_readable(std::os::fd::AsRawFd::as_raw_fd(&stream.conn), -1)?;
        probes.hit("client.read_ready");
        let frame_len = read_frame(&mut stream.conn, self.proto, &mut stream.inbuf)?;
        let frame_bytes = frame_len as u64;
        probes.hit_bytes(
            "client.read_end",
            Direction::Rx,
            stream.rx_offset,
            frame_bytes,
        );
        stream.rx_offset += frame_bytes;
        let (reply, _) = codec::decode(self.proto, &stream.inbuf[..frame_len])?
            .context("a whole frame was read")?;
        stream.inbuf.drain(..frame_len);
        probes.hit("client.decode_end");
        let elapsed = t0.elapsed();
        if reply.message.seq_id != seq_id || reply.message.body != body {
            bail!(
                "reply {} does not echo request {seq_id}",
                reply.message.seq_id
            );
        }
        if let (Some(sink), Some(id)) = (&self.probes, &trace_id) {
            sink.emit(id, &stream.conn_ref, &probes.hits)?;
        }
        Ok((t0, elapsed))
    }
}

/// A PING in RESP's multi-bulk form (redis-benchmark's `PING_MBULK`) and its reply.
const REDIS_PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
const REDIS_PONG: &[u8] = b"+PONG\r\n";

/// One PING: when it started and how long until the whole `+PONG` was read.
fn redis_ping(stream: &mut Stream) -> anyhow::Result<(Instant, Duration)> {
    let t0 = Instant::now();
    stream.conn.write_all(REDIS_PING).context("send PING")?;
    let mut reply = [0u8; REDIS_PONG.len()];
    std::io::Read::read_exact(&mut stream.conn, &mut reply).context("read the PING's reply")?;
    let elapsed = t0.elapsed();
    if reply != REDIS_PONG {
        bail!(
            "the server answered {:?} to PING, not +PONG",
            String::from_utf8_lossy(&reply)
        );
    }
    Ok((t0, elapsed))
}
