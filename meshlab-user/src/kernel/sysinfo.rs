//! Facts about the running system that the loader and `doctor` need: kernel release, mounts
//! (cgroup2, tracefs, bpffs) and lockdown. Network devices are in kernel/nic/.

use std::fs;
use std::path::{Path, PathBuf};

/// `uname -r`.
pub(crate) fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// The lockdown mode in brackets in /sys/kernel/security/lockdown (`none`, `integrity`, ...).
pub(crate) fn lockdown_mode() -> Option<String> {
    let text = fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    let start = text.find('[')? + 1;
    let end = text[start..].find(']')? + start;
    Some(text[start..end].to_owned())
}

/// One mount from /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    pub fs_type: String,
}

/// Parses /proc/self/mountinfo text: field 5 is the mount point, the field after " - " the type.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let fs_type = right.split(' ').next()?;
            Some(Mount {
                mount_point: PathBuf::from(unescape_mount_path(mount_point)),
                fs_type: fs_type.to_owned(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape_mount_path(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let code =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn mounts() -> Vec<Mount> {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// The first mount of `fs_type` (e.g. `cgroup2`, `tracefs`, `bpf`).
pub fn find_mount(mounts: &[Mount], fs_type: &str) -> Option<PathBuf> {
    mounts
        .iter()
        .find(|m| m.fs_type == fs_type)
        .map(|m| m.mount_point.clone())
}

/// Mounts tracefs at /sys/kernel/tracing if no tracefs is mounted (needed for classic
/// tracepoints and kprobes, which aya resolves through tracefs). Returns where it is.
pub(crate) fn ensure_tracefs() -> Result<PathBuf, String> {
    if let Some(p) = find_mount(&mounts(), "tracefs") {
        return Ok(p);
    }
    let target = Path::new("/sys/kernel/tracing");
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    // SAFETY: valid NUL-terminated strings; mount(2) has no memory-safety preconditions.
    let rc = unsafe {
        libc::mount(
            c("nodev").as_ptr(),
            c("/sys/kernel/tracing").as_ptr(),
            c("tracefs").as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(target.to_owned())
    } else {
        Err(format!(
            "mount -t tracefs nodev /sys/kernel/tracing failed: {}",
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_finds_cgroup2_under_unified() {
        let text = "\
24 29 0:22 / /sys rw,nosuid - sysfs sysfs rw
30 24 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
40 24 0:35 / /sys/kernel/my\\040dir rw - tracefs nodev rw";
        let mounts = parse_mountinfo(text);
        assert_eq!(
            find_mount(&mounts, "cgroup2").unwrap(),
            PathBuf::from("/sys/fs/cgroup/unified")
        );
        assert_eq!(
            find_mount(&mounts, "tracefs").unwrap(),
            PathBuf::from("/sys/kernel/my dir")
        );
        assert_eq!(find_mount(&mounts, "bpf"), None);
    }
}
