//! The capabilities `meshlab record` needs, checked up front by name, and dropped once every
//! program is attached (docs/security.md has the table and the test that holds it).
//!
//! After attaching, the recorder only reads maps and the ring buffer through descriptors it
//! already holds, writes to an output it already opened, detaches by closing links, and (with
//! `--attach on-demand`) creates BPF links of programs it already loaded: none of that needs a
//! capability, so all of them are given up (effective, permitted, inheritable, ambient) and
//! no_new_privs is set.

use std::io;

/// One capability, with the calls of `record` that need it.
#[derive(Debug, Clone, Copy)]
pub struct Capability {
    pub bit: u32,
    pub name: &'static str,
    pub needed_for: &'static str,
}

/// What `record` needs (include/uapi/linux/capability.h numbers).
pub const RECORD_NEEDS: &[Capability] = &[
    Capability {
        bit: 39,
        name: "CAP_BPF",
        needed_for: "bpf(): creating the maps and ring buffer, loading the programs, BTF",
    },
    Capability {
        bit: 38,
        name: "CAP_PERFMON",
        needed_for: "tracing programs (fentry, tp_btf, raw_tp, kprobe, tracepoint) reading kernel memory; perf_event_open for kprobes and tracepoints",
    },
    Capability {
        bit: 12,
        name: "CAP_NET_ADMIN",
        needed_for: "attaching the sock_ops program to a cgroup",
    },
];

/// What `record --netns` needs on top.
pub(crate) const NETNS_NEEDS: &[Capability] = &[Capability {
    bit: 21,
    name: "CAP_SYS_ADMIN",
    needed_for: "setns() into --netns to read its cookie and device names",
}];

/// The effective capability set of this process (CapEff in /proc/self/status).
pub(crate) fn effective() -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or_else(|| io::Error::other("no CapEff line in /proc/self/status"))?;
    u64::from_str_radix(hex.trim(), 16).map_err(io::Error::other)
}

/// Fails, naming each missing capability and what it is for, unless all of `needed` are in
/// the effective set (root has them all; `setcap` or systemd's AmbientCapabilities can grant
/// exactly these).
pub(crate) fn require(what: &str, needed: &[Capability]) -> anyhow::Result<()> {
    let have = effective()?;
    let missing: Vec<String> = needed
        .iter()
        .filter(|c| have & (1u64 << c.bit) == 0)
        .map(|c| format!("{} ({})", c.name, c.needed_for))
        .collect();
    if !missing.is_empty() {
        anyhow::bail!(
            "{what} needs these capabilities, which this process lacks: {}; run it with sudo or grant them (docs/security.md)",
            missing.join("; ")
        );
    }
    Ok(())
}

/// CAP_NET_ADMIN as a mask for [`drop_all_but`].
pub(crate) const NET_ADMIN_BIT: u64 = 1 << 12;

/// Gives up every capability for good, and any way back through exec, except those in `keep`
/// (a mask of capability bits; 0 in every recording but `--hw-timestamps`), which stay
/// effective and permitted (never inheritable or ambient: nothing is exec'd).
pub(crate) fn drop_all_but(keep: u64) -> io::Result<()> {
    // SAFETY: plain prctl calls without pointers.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // EINVAL: a kernel without ambient capabilities has none to clear.
        let rc = libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(io::Error::last_os_error());
        }
    }
    // struct __user_cap_header_struct / __user_cap_data_struct[2], version 3 (64-bit sets).
    let header: [u32; 2] = [0x2008_0522, 0];
    // Two __user_cap_data_struct {effective, permitted, inheritable}: bits 0-31, then 32-63.
    let (low, high) = (keep as u32, (keep >> 32) as u32);
    let data = [low, low, 0, high, high, 0];
    // SAFETY: header and data have the layout capset(2) expects for version 3.
    let rc = unsafe { libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_capability_is_named_with_its_use() {
        let impossible = Capability {
            bit: 63,
            name: "CAP_NOT_A_CAPABILITY",
            needed_for: "the test",
        };
        let err = require("meshlab record", &[impossible])
            .unwrap_err()
            .to_string();
        assert!(err.contains("CAP_NOT_A_CAPABILITY (the test)"), "{err}");
    }
}
