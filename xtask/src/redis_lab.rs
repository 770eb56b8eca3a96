//! redis-server and redis-benchmark (Debian's) in two network namespaces joined by a veth pair:
//! the bench's real-world workload, crossing a device like traffic between two nodes would.
//!
//! Namespace, device and address names carry the bench's pid, so parallel runs do not clash;
//! everything is removed on drop, also when the bench fails half-way or xtask is killed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::procs::{Netns, Proc, Side, pinned};

pub const REDIS_PORT: u16 = 6379;

/// Two namespaces, a veth pair between them, and redis-server in the server namespace.
pub struct RedisLab {
    server_ns: String,
    client_ns: String,
    pub server_addr: String,
    /// Declared first: dropped (stopped) before the namespaces it runs in.
    server: Option<Proc>,
    /// Deleting them removes the veth pair with them.
    _namespaces: Vec<Netns>,
}

fn ip(args: &[&str]) -> Result<()> {
    let status = Command::new("ip")
        .args(args)
        .status()
        .context("running ip (iproute2)")?;
    if !status.success() {
        bail!("`ip {}` failed: {status}", args.join(" "));
    }
    Ok(())
}

impl RedisLab {
    pub fn start() -> Result<RedisLab> {
        let id = std::process::id();
        // 10.203.0.0/16 is used by nothing else in the repository (the lab uses 10.201/16).
        let net = format!("10.203.{}", id % 250 + 1);
        let mut lab = RedisLab {
            server_ns: format!("mlbench{id}s"),
            client_ns: format!("mlbench{id}c"),
            server_addr: format!("{net}.1"),
            server: None,
            _namespaces: Vec::new(),
        };
        lab.wire(&net, id)?;
        let server = pinned(&mut lab.in_server_ns("redis-server"), Side::Server)
            .args([
                "--bind",
                &lab.server_addr,
                "--port",
                &REDIS_PORT.to_string(),
            ])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting redis-server (cargo xtask setup installs it)")?;
        lab.server = Some(Proc::new(server, "redis-server"));
        lab.wait_ready()?;
        Ok(lab)
    }

    fn wire(&mut self, net: &str, id: u32) -> Result<()> {
        for ns in [&self.server_ns, &self.client_ns] {
            self._namespaces.push(Netns::add(ns)?);
        }
        let (a, b) = (format!("mlb{id}a"), format!("mlb{id}b"));
        // Made inside the namespaces: no end of the pair is ever left in the root namespace.
        let (server, client) = (&self.server_ns, &self.client_ns);
        ip(&[
            "-n", server, "link", "add", &a, "type", "veth", "peer", "name", &b, "netns", client,
        ])?;
        for (dev, ns, addr) in [(&a, &self.server_ns, "1"), (&b, &self.client_ns, "2")] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{net}.{addr}/24"),
                "dev",
                dev,
            ])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    fn in_server_ns(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.server_ns, program]);
        c
    }

    fn in_client_ns(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.client_ns, program]);
        c
    }

    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self
                .in_client_ns("redis-cli")
                .args([
                    "-h",
                    &self.server_addr,
                    "-p",
                    &REDIS_PORT.to_string(),
                    "ping",
                ])
                .stderr(Stdio::null())
                .output()
                .context("running redis-cli (cargo xtask setup installs redis-tools)")?;
            if String::from_utf8_lossy(&out.stdout).contains("PONG") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server on {} did not answer within 20 s",
                    self.server_addr
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One redis-benchmark PING run: (requests per second, p50 latency in microseconds).
    pub fn ping(&self, clients: usize, requests: u64) -> Result<(f64, f64)> {
        let out = pinned(&mut self.in_client_ns("redis-benchmark"), Side::Client)
            .args(["-h", &self.server_addr, "-p", &REDIS_PORT.to_string()])
            .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
            .args(["-t", "ping", "--csv"])
            .stderr(Stdio::null())
            .output()
            .context("running redis-benchmark (cargo xtask setup installs redis-tools)")?;
        if !out.status.success() {
            bail!("redis-benchmark failed: {}", out.status);
        }
        parse_ping_csv(&String::from_utf8_lossy(&out.stdout))
    }

    /// p50 (us) of `clients` connections sending PINGs back to back for `seconds` after a
    /// 200 ms warm-up, timed by `meshlab lab client --redis-ping` (3 significant digits: ~64 ns
    /// steps at 60 us, where redis-benchmark's p50 moves in 8 us steps), pinned and
    /// namespaced like redis-benchmark.
    pub fn ping_p50_us(&self, exe: &Path, clients: usize, seconds: f64) -> Result<f64> {
        let connect = format!("{}:{REDIS_PORT}", self.server_addr);
        let out = pinned(&mut self.in_client_ns(&exe.to_string_lossy()), Side::Client)
            .args([
                "lab",
                "client",
                "--connect",
                &connect,
                "--redis-ping",
                "--json",
            ])
            .args(["--concurrency", &clients.to_string()])
            .args(["--warmup", "200ms", "--duration", &format!("{seconds}s")])
            .output()
            .context("running meshlab lab client --redis-ping")?;
        if !out.status.success() {
            bail!(
                "meshlab lab client --redis-ping failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let summary: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("lab client --json output")?;
        summary["p50_us"]
            .as_f64()
            .context("lab client --json output lacks p50_us")
    }
}

/// The PING_MBULK row of `redis-benchmark --csv`: rps and p50 (ms, converted to us).
fn parse_ping_csv(csv: &str) -> Result<(f64, f64)> {
    let header: Vec<&str> = csv
        .lines()
        .next()
        .context("redis-benchmark printed nothing")?
        .split(',')
        .map(|f| f.trim_matches('"'))
        .collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .with_context(|| format!("redis-benchmark CSV lacks column {name}: {header:?}"))
    };
    let (rps_col, p50_col) = (column("rps")?, column("p50_latency_ms")?);
    let row: Vec<&str> = csv
        .lines()
        .find(|l| l.starts_with("\"PING_MBULK\""))
        .context("redis-benchmark CSV lacks the PING_MBULK row")?
        .split(',')
        .map(|f| f.trim_matches('"'))
        .collect();
    let number = |col: usize| -> Result<f64> {
        row.get(col)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("redis-benchmark CSV: bad number in column {col}: {row:?}"))
    };
    Ok((number(rps_col)?, number(p50_col)? * 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_csv_row_is_read_by_column_name() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\"\n\
                   \"PING_INLINE\",\"1000.00\",\"0.1\",\"0.05\",\"0.095\"\n\
                   \"PING_MBULK\",\"2000.00\",\"0.1\",\"0.05\",\"0.047\"\n";
        let (rps, p50_us) = parse_ping_csv(csv).unwrap();
        assert_eq!(rps, 2000.0);
        assert!((p50_us - 47.0).abs() < 1e-9);
        assert!(parse_ping_csv("\"test\",\"rps\"\n").is_err());
    }
}
