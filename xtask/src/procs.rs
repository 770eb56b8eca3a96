//! Processes, network namespaces and scratch directories the benchmarks start, cleaned up when
//! dropped (also when a benchmark fails half-way) and when xtask is killed (crate::cleanup).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cleanup::{self, Registered, register};

/// A child process stopped (SIGINT, then reaped) on drop unless it has exited already (and
/// SIGKILLed if xtask is killed).
pub struct Proc(pub Child, #[allow(dead_code)] Registered);

impl Proc {
    /// `what` names the child in the line xtask prints when it is killed.
    pub fn new(child: Child, what: &str) -> Proc {
        let cleanup = cleanup::kill_child(&child, what);
        Proc(child, cleanup)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Err: reaped by its owner already (wait4 for its rusage), so not ours to signal.
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: signalling our own child, not yet reaped.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
            let _ = self.0.wait();
        }
    }
}

/// A network namespace (`ip netns add`), deleted on drop or when xtask is killed; the devices
/// inside go with it.
pub struct Netns {
    pub name: String,
    _cleanup: Registered,
}

impl Netns {
    pub fn add(name: &str) -> Result<Netns> {
        ip_netns("add", name)?;
        let cleanup = {
            let name = name.to_owned();
            register(format!("netns {name}"), move |_| {
                let _ = ip_netns("del", &name);
            })
        };
        Ok(Netns {
            name: name.to_owned(),
            _cleanup: cleanup,
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip_netns("del", &self.name) {
            eprintln!("xtask: removing namespace {}: {e:#}", self.name);
        }
    }
}

fn ip_netns(verb: &str, name: &str) -> Result<()> {
    run_quiet(Command::new("ip").args(["netns", verb, name]))?;
    Ok(())
}

/// Runs a command quietly; its stdout, or an error with its stderr.
pub fn run_quiet(cmd: &mut Command) -> Result<Vec<u8>> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// Waits (up to 30 s) for a ready file a child writes once it is serving.
pub fn wait_for(path: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if Instant::now() > deadline {
            bail!("{} did not appear within 30 s", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A scratch directory removed on drop (or when xtask is killed).
pub struct TempDir(PathBuf, #[allow(dead_code)] Registered);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn tempdir() -> Result<TempDir> {
    let dir = std::env::temp_dir().join(format!("meshlab-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(TempDir(dir.clone(), remove_dir_when_killed(dir)))
}

/// Registers the removal of `dir` for when xtask is killed.
pub fn remove_dir_when_killed(dir: PathBuf) -> Registered {
    register(format!("directory {}", dir.display()), move |_| {
        let _ = std::fs::remove_dir_all(&dir);
    })
}

/// Which side of a benchmark a process is on. Servers run on CPU 1 and clients (the load
/// generators) on CPU 0, so every rung gets the same placement instead of whatever the
/// scheduler picked that round; the recorder is not pinned (it runs where a user's would).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    /// The CPU of this side; `None` on a one-CPU machine (nothing to separate).
    pub fn cpu(self) -> Option<usize> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cpus >= 2).then_some(match self {
            Side::Client => 0,
            Side::Server => 1,
        })
    }
}

/// Pins the process `cmd` starts (and everything it execs, `ip netns exec` included) to the
/// CPU of `side`.
pub fn pinned(cmd: &mut std::process::Command, side: Side) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    let Some(cpu) = side.cpu() else {
        return cmd;
    };
    // SAFETY: between fork and exec only async-signal-safe calls: sched_setaffinity on a
    // stack-allocated, zero-initialised cpu_set_t.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}
