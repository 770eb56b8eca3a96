//! The seed's topologies on the two-namespace lab:
//! - `direct`:  client (A) --TCP--> server (B)
//! - `one-hop`: client (A) --UDS--> HAProxy A --TCP--> server (B)
//! - `two-hop`: client (A) --UDS--> HAProxy A --TCP--> HAProxy B --UDS--> server (B)
//! - `two-hop-same-node`: the seed's control experiment, the two-hop path with both sidecars
//!   (and so client and server) on node A: client --UDS--> HAProxy out --TCP (A's own
//!   address)--> HAProxy in --UDS--> server. An asymmetry between the sidecars that stays here
//!   belongs to the path; one that disappears belonged to the machines.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::codec::Proto;
use super::haproxy::Haproxy;
use super::netns::{Lab, NamedNetns};
use super::process::ChildGuard;
use super::workload::Endpoint;

/// Port of the first TCP listener on the server's node (the server, or the inbound HAProxy).
pub const SERVER_PORT: u16 = 9000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    Direct,
    OneHop,
    TwoHop,
    TwoHopSameNode,
}

impl Topology {
    pub const ALL: [Topology; 4] = [
        Topology::Direct,
        Topology::OneHop,
        Topology::TwoHop,
        Topology::TwoHopSameNode,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topology::Direct => "direct",
            Topology::OneHop => "one-hop",
            Topology::TwoHop => "two-hop",
            Topology::TwoHopSameNode => "two-hop-same-node",
        }
    }

    /// The lab node the server (and the inbound sidecar) runs on.
    pub fn server_node(self) -> &'static str {
        match self {
            Topology::TwoHopSameNode => "A",
            _ => "B",
        }
    }

    /// The namespace and address of [`Self::server_node`] in `lab`.
    fn server_side(self, lab: &Lab) -> (&NamedNetns, Ipv4Addr) {
        match self.server_node() {
            "A" => (&lab.a, lab.addrs.a),
            _ => (&lab.b, lab.addrs.b),
        }
    }

    fn two_hops(self) -> bool {
        matches!(self, Topology::TwoHop | Topology::TwoHopSameNode)
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

/// A topology up and running: server on its node, sidecars as the topology needs. The client is run
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
    /// Starts the server (`exe lab server ... server_extra`) on its node and the sidecars.
    pub fn start(
        lab: &Lab,
        topology: Topology,
        exe: &Path,
        proto: Proto,
        server_extra: &[OsString],
    ) -> anyhow::Result<Self> {
        let runtime_dir = RuntimeDir::create()?;
        let dir = runtime_dir.path();
        let (server_ns, server_ip) = topology.server_side(lab);
        let server_tcp = Endpoint::Tcp(SocketAddr::from((server_ip, SERVER_PORT)));
        let client_sock = Endpoint::Unix(dir.join("client.sock"));
        let server_listen = if topology.two_hops() {
            Endpoint::Unix(dir.join("server.sock"))
        } else {
            server_tcp.clone()
        };
        let server = start_server(server_ns, exe, proto, &server_listen, dir, server_extra)?;
        let mut proxies = Vec::new();
        if topology.two_hops() {
            let name = match topology {
                Topology::TwoHopSameNode => "sidecar-a-in",
                _ => "sidecar-b",
            };
            let inbound = Haproxy::start(name, server_ns, dir, &server_tcp, &server_listen)?;
            proxies.push(inbound);
        }
        if topology != Topology::Direct {
            // Named after its node; the control topology's two sidecars share node A.
            let name = match topology {
                Topology::TwoHopSameNode => "sidecar-a-out",
                _ => "sidecar-a",
            };
            let outbound = Haproxy::start(name, &lab.a, dir, &client_sock, &server_tcp)?;
            proxies.insert(0, outbound);
        }
        let client_target = match topology {
            Topology::Direct => server_tcp,
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
    netns: &NamedNetns,
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
    netns.command(&mut cmd);
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
