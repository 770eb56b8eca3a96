//! The seed's topologies on the two-namespace lab:
//! - `direct`:  client (A) --TCP--> server (B)
//! - `one-hop`: client (A) --UDS--> HAProxy A --TCP--> server (B)
//! - `two-hop`: client (A) --UDS--> HAProxy A --TCP--> HAProxy B --UDS--> server (B)

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::codec::Proto;
use super::haproxy::Haproxy;
use super::netns::Lab;
use super::process::ChildGuard;
use super::workload::Endpoint;

/// Port of the first TCP listener in B (the server, or HAProxy B in `two-hop`).
pub const SERVER_PORT: u16 = 9000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    Direct,
    OneHop,
    TwoHop,
}

impl Topology {
    pub const ALL: [Topology; 3] = [Topology::Direct, Topology::OneHop, Topology::TwoHop];

    pub fn name(self) -> &'static str {
        match self {
            Topology::Direct => "direct",
            Topology::OneHop => "one-hop",
            Topology::TwoHop => "two-hop",
        }
    }
}

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// A short private directory for sockets, configs and ready files (unix socket paths must fit
/// in 108 bytes, so not under a possibly long output directory). Removed on drop.
pub struct RuntimeDir(PathBuf);

impl RuntimeDir {
    pub fn create() -> anyhow::Result<Self> {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("mlab-{}-{n}", std::process::id()));
        std::fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))?;
        Ok(Self(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A topology up and running: server in B, sidecars as the topology needs. The client is run
/// by the caller with [`TopologyRun::client_command`]. Everything stops on drop.
pub struct TopologyRun {
    pub topology: Topology,
    /// Where the client connects.
    pub client_target: Endpoint,
    /// Sidecars, client side first.
    pub proxies: Vec<Haproxy>,
    server: ChildGuard,
    // Last: removed after the processes using it are gone.
    pub runtime_dir: RuntimeDir,
}

impl TopologyRun {
    /// Starts the server (`exe lab server ... server_extra`) in B and the sidecars.
    pub fn start(
        lab: &Lab,
        topology: Topology,
        exe: &Path,
        proto: Proto,
        server_extra: &[OsString],
    ) -> anyhow::Result<Self> {
        let runtime_dir = RuntimeDir::create()?;
        let dir = runtime_dir.path();
        let b_tcp = Endpoint::Tcp(SocketAddr::from((lab.addrs.b, SERVER_PORT)));
        let client_sock = Endpoint::Unix(dir.join("client.sock"));
        let server_listen = match topology {
            Topology::Direct | Topology::OneHop => b_tcp.clone(),
            Topology::TwoHop => Endpoint::Unix(dir.join("server.sock")),
        };
        let server = start_server(lab, exe, proto, &server_listen, dir, server_extra)?;
        let mut proxies = Vec::new();
        if topology == Topology::TwoHop {
            proxies.push(Haproxy::start(
                "sidecar-b",
                &lab.b,
                dir,
                &b_tcp,
                &server_listen,
            )?);
        }
        if topology != Topology::Direct {
            proxies.insert(
                0,
                Haproxy::start("sidecar-a", &lab.a, dir, &client_sock, &b_tcp)?,
            );
        }
        let client_target = match topology {
            Topology::Direct => b_tcp,
            _ => client_sock,
        };
        Ok(Self {
            topology,
            client_target,
            proxies,
            server,
            runtime_dir,
        })
    }

    /// `exe lab client --connect|--unix TARGET --proto P`, to run in namespace A.
    pub fn client_command(&self, lab: &Lab, exe: &Path, proto: Proto) -> Command {
        let mut cmd = Command::new(exe);
        cmd.args(["lab", "client", "--proto", proto_name(proto)]);
        match &self.client_target {
            Endpoint::Tcp(a) => cmd.arg("--connect").arg(a.to_string()),
            Endpoint::Unix(p) => cmd.arg("--unix").arg(p),
        };
        lab.a.command(&mut cmd);
        super::process::die_with_parent(&mut cmd, libc::SIGTERM);
        cmd
    }

    /// Stops the server with SIGINT (it flushes its probes) and returns its exit status.
    pub fn stop_server(&mut self) -> anyhow::Result<ExitStatus> {
        self.server.stop()
    }

    pub fn server_pid(&self) -> Option<u32> {
        self.server.pid()
    }
}

pub fn proto_name(proto: Proto) -> &'static str {
    match proto {
        Proto::Ttheader => "ttheader",
        Proto::Framed => "framed",
    }
}

fn start_server(
    lab: &Lab,
    exe: &Path,
    proto: Proto,
    listen: &Endpoint,
    dir: &Path,
    extra: &[OsString],
) -> anyhow::Result<ChildGuard> {
    let ready = dir.join("server.ready");
    let mut cmd = Command::new(exe);
    cmd.args(["lab", "server", "--proto", proto_name(proto)]);
    match listen {
        Endpoint::Tcp(a) => cmd.arg("--listen").arg(a.to_string()),
        Endpoint::Unix(p) => cmd.arg("--unix").arg(p),
    };
    cmd.arg("--ready-file").arg(&ready).args(extra);
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    lab.b.command(&mut cmd);
    let mut server = ChildGuard::spawn("echo server", &mut cmd, libc::SIGINT)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        if !server.running() {
            bail!("the echo server exited before listening (see its log above)");
        }
        if Instant::now() > deadline {
            bail!("the echo server did not listen within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(server)
}
