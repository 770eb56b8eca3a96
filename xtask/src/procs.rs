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
