//! `meshlab lab down`: remove what crashed labs left behind.
//!
//! A lab namespace is named `mlab-<owner pid>-<n>-<a|b>`. When the owner is dead, the
//! processes still inside the namespace (a proxy, a server) are killed and the namespace is
//! removed. Labs whose owner is alive are left alone, so several labs can coexist.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::netns::{LAB_PREFIX, NETNS_DIR, remove_named_netns};

/// Owner pid encoded in a lab namespace name, or `None` for names that are not ours.
pub fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(LAB_PREFIX)?;
    let mut parts = rest.split('-');
    let pid = parts.next()?.parse().ok()?;
    let _n: u32 = parts.next()?.parse().ok()?;
    let side = parts.next()?;
    (parts.next().is_none() && (side == "a" || side == "b")).then_some(pid)
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Lab namespaces whose owner process is gone.
pub fn stale_namespaces() -> std::io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut stale = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = owner_pid(&name)
            && !pid_alive(pid)
        {
            stale.push(entry.path());
        }
    }
    stale.sort();
    Ok(stale)
}

/// Pids whose network namespace is the one mounted at `ns_path` (same nsfs inode).
pub fn pids_in_netns(ns_path: &Path) -> std::io::Result<Vec<u32>> {
    let target = std::fs::metadata(ns_path)?;
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // Processes may exit while we look: skip what cannot be read.
        if let Ok(meta) = std::fs::metadata(entry.path().join("ns/net"))
            && meta.ino() == target.ino()
            && meta.dev() == target.dev()
        {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// Runtime directories (`$TMPDIR/mlab-<pid>-<n>`, sockets and proxy configs) of dead owners.
pub fn stale_runtime_dirs() -> std::io::Result<Vec<PathBuf>> {
    let mut stale = Vec::new();
    for entry in std::fs::read_dir(std::env::temp_dir())? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let owner = name
            .strip_prefix(LAB_PREFIX)
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, n)| n.parse::<u32>().is_ok())
            .and_then(|(pid, _)| pid.parse::<u32>().ok());
        if let Some(pid) = owner
            && entry.file_type()?.is_dir()
            && !pid_alive(pid)
        {
            stale.push(entry.path());
        }
    }
    Ok(stale)
}

/// Kills leftover processes and removes stale lab namespaces and runtime directories;
/// returns what was removed.
pub fn lab_down() -> anyhow::Result<Vec<PathBuf>> {
    let mut stale = stale_namespaces()?;
    for path in &stale {
        for pid in pids_in_netns(path).unwrap_or_default() {
            log::info!("killing pid {pid} left in {}", path.display());
            // SAFETY: kill(2) with a pid we just read; a vanished pid gives ESRCH, ignored.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        remove_named_netns(path)?;
        log::info!("removed {}", path.display());
    }
    for dir in stale_runtime_dirs()? {
        std::fs::remove_dir_all(&dir)?;
        log::info!("removed {}", dir.display());
        stale.push(dir);
    }
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_only_lab_names() {
        assert_eq!(owner_pid("mlab-1234-0-a"), Some(1234));
        assert_eq!(owner_pid("mlab-1234-17-b"), Some(1234));
        assert_eq!(owner_pid("mlab-1234-0-c"), None);
        assert_eq!(owner_pid("mlab-x-0-a"), None);
        assert_eq!(owner_pid("mlab-1-0-a-extra"), None);
        assert_eq!(owner_pid("other-1-0-a"), None);
    }
}
