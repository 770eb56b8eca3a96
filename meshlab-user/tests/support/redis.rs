//! Debian's redis-server in the lab's namespace B, for the tests that trace an unmodified
//! request/response server (kernel-only merge, socket TX timestamps).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use meshlab_testkit::privileged::can_run_with;
use meshlab_user::lab::netns::{Lab, NamedNetns};

use super::privileged_or_skip;

pub const PORT: &str = "6379";

/// Whether `test` can run: privileged, with Debian's redis-server, redis-benchmark and
/// redis-cli (each skip says why, loudly; CI turns it into a failure).
pub fn can_run(test: &str) -> bool {
    privileged_or_skip(test)
        && ["redis-server", "redis-benchmark", "redis-cli"]
            .iter()
            .all(|tool| can_run_with(test, tool))
}

/// redis-server in a namespace, killed and reaped on drop (also when an assertion fails).
pub struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn in_netns(ns: &NamedNetns, program: &str) -> Command {
    let mut cmd = Command::new(program);
    ns.command(&mut cmd);
    cmd
}

/// Starts redis-server on B's address and waits until redis-cli from A gets its PONG.
pub fn start_redis(lab: &Lab) -> Server {
    let server = in_netns(&lab.b, "redis-server")
        .args(["--bind", &lab.addrs.b.to_string(), "--port", PORT])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start redis-server");
    let server = Server(server);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pong = in_netns(&lab.a, "redis-cli")
            .args(["-h", &lab.addrs.b.to_string(), "-p", PORT, "ping"])
            .stderr(Stdio::null())
            .output()
            .expect("run redis-cli");
        if String::from_utf8_lossy(&pong.stdout).contains("PONG") {
            return server;
        }
        assert!(Instant::now() < deadline, "redis-server did not answer");
        std::thread::sleep(Duration::from_millis(50));
    }
}
