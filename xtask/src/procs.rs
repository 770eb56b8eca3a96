//! Processes and scratch directories the benchmarks start, cleaned up when dropped (also when
//! a benchmark fails half-way).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// A child process killed (SIGINT, then reaped) on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let _ = self.0.wait();
    }
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

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

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
    Ok(TempDir(dir))
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
