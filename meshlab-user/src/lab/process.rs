//! Child processes the lab starts: stopped with a chosen signal and reaped on drop, killed if
//! they do not stop in time, so nothing outlives a failed or panicking run.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long a child gets to exit after its stop signal before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    stop_signal: libc::c_int,
}

impl ChildGuard {
    /// Spawns `cmd`; the child also gets `stop_signal` if this process dies without stopping
    /// it (see [`die_with_parent`]).
    pub fn spawn(name: &str, cmd: &mut Command, stop_signal: libc::c_int) -> anyhow::Result<Self> {
        die_with_parent(cmd, stop_signal);
        let child = cmd
            .spawn()
            .with_context(|| format!("start {name}: {cmd:?}"))?;
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            stop_signal,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the child has not exited.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends the stop signal and waits (SIGKILL after the grace period).
    pub fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        let mut child = self.child.take().context("already stopped")?;
        if let Ok(Some(status)) = child.try_wait() {
            return Ok(status);
        }
        // SAFETY: kill(2) on our own, not yet reaped child: the pid cannot have been reused.
        unsafe { libc::kill(child.id() as libc::pid_t, self.stop_signal) };
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                log::warn!("{} did not stop in {STOP_GRACE:?}: killing it", self.name);
                child.kill()?;
                return Ok(child.wait()?);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the child to exit on its own.
    pub fn wait(&mut self) -> anyhow::Result<ExitStatus> {
        let mut child = self.child.take().context("already stopped")?;
        Ok(child.wait()?)
    }
}

/// Makes the child receive `signal` when this process dies (PR_SET_PDEATHSIG), so a killed
/// demo or test does not leave recorders, proxies or clients running.
pub fn die_with_parent(cmd: &mut Command, signal: libc::c_int) {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the hook runs between fork and exec and calls only prctl(2), getppid(2) and
    // _exit(2), which are async-signal-safe; `parent` is a plain integer copied into it.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect: then no signal will come.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.child.is_some()
            && let Err(e) = self.stop()
        {
            log::warn!("stopping {}: {e:#}", self.name);
        }
    }
}
