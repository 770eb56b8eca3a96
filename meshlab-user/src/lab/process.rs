//! Child processes the lab starts: stopped with a chosen signal and reaped on drop, killed if
//! they do not stop in time, so nothing outlives a failed or panicking run.

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
    pub fn spawn(name: &str, cmd: &mut Command, stop_signal: libc::c_int) -> anyhow::Result<Self> {
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

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.child.is_some()
            && let Err(e) = self.stop()
        {
            log::warn!("stopping {}: {e:#}", self.name);
        }
    }
}
