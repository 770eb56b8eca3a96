//! Userland probes of the lab workload: off unless `--trace FILE` is given (then the workload
//! writes schema `probe` records for one request in `--trace-sample 1/N`).
//!
//! Timestamps are CLOCK_REALTIME, as Go's time.Now() in the seed's Kitex probes, so `merge`
//! exercises its clock conversion. Records are buffered and flushed on exit.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;

use crate::ndjson::RecordWriter;
use crate::output::{Policy, create_output};
use crate::schema::{ClockId, ConnRef, Direction, ProbeEvent, Record};

/// The probe-point catalog: name, layer (always the process: these are userland points) and
/// kind of the time that *ends* at the point. Documented in docs/probe-catalog.md.
pub const CATALOG: &[(&str, &str, &str)] = &[
    ("client.encode_begin", "process", "compute"),
    ("client.encode_end", "process", "compute"),
    ("client.write_begin", "process", "compute"),
    ("client.write_end", "process", "compute"),
    ("client.read_ready", "process", "wait"),
    ("client.read_end", "process", "compute"),
    ("client.decode_end", "process", "compute"),
    ("server.read_ready", "process", "wait"),
    ("server.read_end", "process", "compute"),
    ("server.decode_end", "process", "compute"),
    ("server.handler_begin", "process", "compute"),
    ("server.handler_end", "process", "compute"),
    ("server.encode_end", "process", "compute"),
    ("server.write_begin", "process", "compute"),
    ("server.write_end", "process", "compute"),
];

/// `--trace-sample 1/N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleRate(pub u32);

impl std::str::FromStr for SampleRate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        crate::units::parse_sample_rate(s).map(Self)
    }
}

impl SampleRate {
    /// Both sides decide from the request's sequence id, so they agree without talking.
    pub fn sampled(self, seq_id: i32) -> bool {
        seq_id.unsigned_abs().is_multiple_of(self.0)
    }
}

/// Where the probe records go and how each is labelled.
pub struct ProbeSink {
    writer: Mutex<RecordWriter<File>>,
    path: PathBuf,
    node: Option<String>,
    process: String,
    pid: u32,
    pub rate: SampleRate,
}

/// A probe point reached, waiting for the request's sampling decision and trace id.
#[derive(Clone, Debug)]
pub struct Hit {
    pub point: &'static str,
    pub ts_ns: u64,
    /// Direction, stream offset and length of the message, for points that name the bytes.
    pub bytes: Option<(Direction, u64, u64)>,
}

impl ProbeSink {
    pub fn create(
        path: &Path,
        rate: SampleRate,
        node: Option<String>,
        process: &str,
    ) -> anyhow::Result<Self> {
        let file = create_output(path, Policy::Stream)?.commit()?;
        Ok(Self {
            writer: Mutex::new(RecordWriter::new(file)),
            path: path.to_owned(),
            node,
            process: process.to_owned(),
            pid: std::process::id(),
            rate,
        })
    }

    /// Writes one request's hits; `conn` names the connection for the points that carry bytes.
    pub fn emit(&self, trace_id: &str, conn: &ConnRef, hits: &[Hit]) -> anyhow::Result<()> {
        let tid = current_tid();
        let mut writer = self.writer.lock().expect("probe writer poisoned");
        for hit in hits {
            let (dir, offset, len) = match hit.bytes {
                Some((d, o, l)) => (Some(d), Some(o), Some(l)),
                None => (None, None, None),
            };
            let event = ProbeEvent {
                node: self.node.clone(),
                process: self.process.clone(),
                pid: self.pid,
                tid,
                ts_ns: hit.ts_ns,
                clock: ClockId::Realtime,
                trace_id: trace_id.to_owned(),
                point: hit.point.to_owned(),
                conn: hit.bytes.map(|_| conn.clone()),
                dir,
                offset,
                len,
            };
            writer
                .write(&Record::Probe(event))
                .with_context(|| format!("write {}", self.path.display()))?;
        }
        Ok(())
    }

    pub fn flush(&self) -> anyhow::Result<()> {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        writer
            .flush()
            .with_context(|| format!("flush {}", self.path.display()))
    }
}

/// CLOCK_REALTIME in nanoseconds.
pub fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Per-request collector: does nothing (not even read the clock) when the request is not
/// sampled, so the unsampled path costs a branch per point.
pub struct RequestProbes {
    pub hits: Vec<Hit>,
    pub active: bool,
}

impl RequestProbes {
    pub fn new(active: bool) -> Self {
        Self {
            hits: Vec::with_capacity(if active { 8 } else { 0 }),
            active,
        }
    }

    pub fn hit(&mut self, point: &'static str) {
        if self.active {
            self.hits.push(Hit {
                point,
                ts_ns: realtime_ns(),
                bytes: None,
            });
        }
    }

    pub fn hit_bytes(&mut self, point: &'static str, dir: Direction, offset: u64, len: u64) {
        if self.active {
            self.hits.push(Hit {
                point,
                ts_ns: realtime_ns(),
                bytes: Some((dir, offset, len)),
            });
        }
    }

    /// A hit taken before the sampling decision was known (server read points).
    pub fn push(&mut self, hit: Hit) {
        if self.active {
            self.hits.push(hit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_rate_parses_one_over_n() {
        assert_eq!("1/100".parse(), Ok(SampleRate(100)));
        assert_eq!("1/1".parse(), Ok(SampleRate(1)));
        assert!("1/0".parse::<SampleRate>().is_err());
        assert!("2/3".parse::<SampleRate>().is_err());
        assert!("10".parse::<SampleRate>().is_err());
    }

    #[test]
    fn sampling_is_one_in_n_by_sequence_id() {
        let rate = SampleRate(4);
        let sampled = (0..400).filter(|&s| rate.sampled(s)).count();
        assert_eq!(sampled, 100);
    }

    #[test]
    fn catalog_names_are_unique_and_role_prefixed() {
        let mut names: Vec<_> = CATALOG.iter().map(|c| c.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CATALOG.len());
        assert!(
            CATALOG
                .iter()
                .all(|c| c.0.starts_with("client.") || c.0.starts_with("server."))
        );
    }
}
