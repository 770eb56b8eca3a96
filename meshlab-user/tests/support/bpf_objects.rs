//! The BPF programs, maps and links a process holds (from /proc/PID/fdinfo), and a check that
//! none of them still exists in the kernel (by id, through the bpf syscall): precise even
//! while other recorders with the same program names run on the machine.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// BPF object ids, by kind.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BpfObjects {
    pub progs: BTreeSet<u32>,
    pub maps: BTreeSet<u32>,
    pub links: BTreeSet<u32>,
}

// Commands of bpf(2), from include/uapi/linux/bpf.h.
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;

impl BpfObjects {
    /// What `pid` holds right now (empty once it has exited).
    pub fn held_by(pid: u32) -> BpfObjects {
        let mut held = BpfObjects::default();
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
            return held;
        };
        for entry in entries.flatten() {
            let Ok(info) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            for line in info.lines() {
                let Some((key, value)) = line.split_once(':') else {
                    continue;
                };
                let Ok(id) = value.trim().parse::<u32>() else {
                    continue;
                };
                match key {
                    "prog_id" => held.progs.insert(id),
                    "map_id" => held.maps.insert(id),
                    "link_id" => held.links.insert(id),
                    _ => false,
                };
            }
        }
        held
    }

    pub fn merge(&mut self, other: &BpfObjects) {
        self.progs.extend(&other.progs);
        self.maps.extend(&other.maps);
        self.links.extend(&other.links);
    }

    pub fn is_empty(&self) -> bool {
        self.progs.is_empty() && self.maps.is_empty() && self.links.is_empty()
    }

    /// The ones the kernel still knows.
    pub fn still_alive(&self) -> BpfObjects {
        let alive = |cmd, ids: &BTreeSet<u32>| -> BTreeSet<u32> {
            ids.iter().copied().filter(|id| exists(cmd, *id)).collect()
        };
        BpfObjects {
            progs: alive(BPF_PROG_GET_FD_BY_ID, &self.progs),
            maps: alive(BPF_MAP_GET_FD_BY_ID, &self.maps),
            links: alive(BPF_LINK_GET_FD_BY_ID, &self.links),
        }
    }

    /// Asserts that every object is gone within 30 s (the kernel frees some of them after an
    /// RCU grace period or from a work queue; on a loaded 2-CPU machine both can take
    /// seconds, and a leaked object would stay forever, so a long wait only delays a failure).
    pub fn assert_released(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let alive = self.still_alive();
            if alive.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: BPF objects left behind: {alive:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether the object `id` exists: GET_FD_BY_ID succeeds (the fd is closed again at once).
fn exists(cmd: libc::c_long, id: u32) -> bool {
    // bpf_attr for the GET_FD_BY_ID commands: id, next_id, open_flags (all u32).
    let attr: [u32; 3] = [id, 0, 0];
    // SAFETY: attr is a valid, fully initialised bpf_attr prefix of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd >= 0 {
        // SAFETY: fd was just returned to us and is closed once.
        unsafe { libc::close(fd as i32) };
        return true;
    }
    let err = std::io::Error::last_os_error().raw_os_error();
    assert_eq!(
        err,
        Some(libc::ENOENT),
        "bpf GET_FD_BY_ID({id}) failed unexpectedly"
    );
    false
}
