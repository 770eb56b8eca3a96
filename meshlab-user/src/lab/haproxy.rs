//! HAProxy (Debian's package) as the sidecar: TCP mode, unix-socket and TCP binds/servers,
//! run in the foreground inside a lab namespace, stopped on drop. Its stats socket gives the
//! proxy's own connection and byte counters, which tests use as proof traffic went through.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::netns::NamedNetns;
use super::process::ChildGuard;
use super::workload::Endpoint;

/// One side of a proxy: where it listens or where it forwards.
fn haproxy_addr(ep: &Endpoint) -> String {
    match ep {
        Endpoint::Tcp(a) => a.to_string(),
        Endpoint::Unix(p) => format!("unix@{}", p.display()),
    }
}

/// The whole configuration: one TCP-mode frontend forwarding to one server.
pub fn config(listen: &Endpoint, upstream: &Endpoint, stats_socket: &Path) -> String {
    format!(
        "# Written by meshlab lab: a sidecar in TCP mode.
global
    stats socket {stats} mode 600 level admin
    # One thread: a sidecar with one worker, like the seed's Envoy runs per pod.
    nbthread 1
    maxconn 4096

defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h

frontend sidecar_in
    bind {listen}
    default_backend sidecar_out

backend sidecar_out
    server upstream {upstream}
",
        stats = stats_socket.display(),
        listen = haproxy_addr(listen),
        upstream = haproxy_addr(upstream),
    )
}

/// A running HAProxy; killed (and reaped) on drop.
pub struct Haproxy {
    pub name: String,
    pub stats_socket: PathBuf,
    pub config_path: PathBuf,
    _child: ChildGuard,
}

impl Haproxy {
    /// Writes `<dir>/<name>.cfg` and starts `haproxy -db -f CFG` inside `netns`.
    pub fn start(
        name: &str,
        netns: &NamedNetns,
        dir: &Path,
        listen: &Endpoint,
        upstream: &Endpoint,
    ) -> anyhow::Result<Self> {
        let program = super::find_program("haproxy")
            .context("haproxy is not installed (Debian: apt-get install -y haproxy)")?;
        let stats_socket = dir.join(format!("{name}.stats"));
        let config_path = dir.join(format!("{name}.cfg"));
        let text = config(listen, upstream, &stats_socket);
        crate::output::write_output(&config_path, text.as_bytes())?;
        let mut cmd = Command::new(program);
        cmd.arg("-db").arg("-f").arg(&config_path);
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        netns.command(&mut cmd);
        let child = ChildGuard::spawn(name, &mut cmd, libc::SIGTERM)?;
        let proxy = Self {
            name: name.to_owned(),
            stats_socket,
            config_path,
            _child: child,
        };
        proxy.wait_ready(Duration::from_secs(10))?;
        Ok(proxy)
    }

    /// Ready once the stats socket answers (it is bound together with the listeners).
    fn wait_ready(&self, patience: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + patience;
        loop {
            if self.command("show info").is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{}: HAProxy did not start within {patience:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One command on the stats socket; returns the answer.
    pub fn command(&self, line: &str) -> std::io::Result<String> {
        let mut s = UnixStream::connect(&self.stats_socket)?;
        s.write_all(format!("{line}\n").as_bytes())?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    /// `show stat`: the proxy's own counters per frontend/backend/server.
    pub fn stats(&self) -> anyhow::Result<Vec<ProxyStat>> {
        parse_show_stat(&self.command("show stat")?)
    }
}

/// One row of `show stat`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyStat {
    pub proxy: String,
    /// `FRONTEND`, `BACKEND` or the server's name.
    pub service: String,
    /// Cumulative connections (sessions).
    pub total_sessions: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Parses HAProxy's CSV (`# pxname,svname,...` header) by column name.
pub fn parse_show_stat(csv: &str) -> anyhow::Result<Vec<ProxyStat>> {
    let mut lines = csv.lines();
    let header = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .context("show stat: no `# pxname,...` header")?;
    let cols: Vec<&str> = header.split(',').collect();
    let col = |name: &str| {
        cols.iter()
            .position(|c| *c == name)
            .with_context(|| format!("show stat: no column `{name}`"))
    };
    let (px, sv, stot, bin, bout) = (
        col("pxname")?,
        col("svname")?,
        col("stot")?,
        col("bin")?,
        col("bout")?,
    );
    let mut rows = Vec::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0);
        rows.push(ProxyStat {
            proxy: f.get(px).copied().unwrap_or_default().to_owned(),
            service: f.get(sv).copied().unwrap_or_default().to_owned(),
            total_sessions: num(stot),
            bytes_in: num(bin),
            bytes_out: num(bout),
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_stat_is_parsed_by_column_name() {
        let csv = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,\n\
                   sidecar_in,FRONTEND,,,0,1,4096,3,1200,900,\n\
                   sidecar_out,upstream,0,0,0,1,,3,1200,900,\n";
        let rows = parse_show_stat(csv).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].service, "FRONTEND");
        assert_eq!(
            (rows[1].total_sessions, rows[1].bytes_in, rows[1].bytes_out),
            (3, 1200, 900)
        );
    }

    #[test]
    fn config_uses_unix_and_tcp_addresses() {
        let cfg = config(
            &Endpoint::Unix("/tmp/x/client.sock".into()),
            &Endpoint::Tcp("10.201.1.2:9000".parse().unwrap()),
            Path::new("/tmp/x/a.stats"),
        );
        assert!(cfg.contains("bind unix@/tmp/x/client.sock"));
        assert!(cfg.contains("server upstream 10.201.1.2:9000"));
        assert!(cfg.contains("mode tcp"));
    }
}
