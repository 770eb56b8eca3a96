//! The floor of per-program cost: an empty BPF program (`r0 = 0; exit`) on a raw tracepoint,
//! measured with the same BPF statistics as the recorder's programs. What a recorder program
//! costs above this is its own work; the floor itself is the tracepoint dispatch plus the
//! statistics' clock reads, which no program can avoid.
//!
//! Loaded with two bpf(2) calls so xtask needs no eBPF library.

use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{Result, bail};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// The name the empty program is loaded under (what bpftool lists).
pub const FLOOR_PROGRAM: &str = "empty_floor";

/// `union bpf_attr` for BPF_PROG_LOAD, up to prog_name; the tail is zero (the kernel requires
/// unknown trailing bytes to be zero).
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    tail: [u8; 64],
}

/// `union bpf_attr` for BPF_RAW_TRACEPOINT_OPEN.
#[repr(C)]
struct RawTracepointOpenAttr {
    name: u64,
    prog_fd: u32,
    pad: u32,
    cookie: u64,
}

/// An attached empty program; detached and unloaded on drop (closing both descriptors).
pub struct EmptyProgram {
    _program: OwnedFd,
    _link: OwnedFd,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> Result<OwnedFd> {
    // SAFETY: `attr` is a properly laid out bpf_attr prefix of the given size; every pointer
    // in it refers to memory that outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size_of::<T>()) };
    if fd < 0 {
        bail!("bpf({cmd}) failed: {}", std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

pub fn attach_empty(tracepoint: &str) -> Result<EmptyProgram> {
    // mov64 r0, 0; exit
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = c"GPL";
    let mut name = [0u8; 16];
    name[..FLOOR_PROGRAM.len()].copy_from_slice(FLOOR_PROGRAM.as_bytes());
    let mut load = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_RAW_TRACEPOINT,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
        tail: [0; 64],
    };
    let program = bpf(BPF_PROG_LOAD, &mut load)?;
    let tp = std::ffi::CString::new(tracepoint)?;
    let mut open = RawTracepointOpenAttr {
        name: tp.as_ptr() as u64,
        prog_fd: std::os::fd::AsRawFd::as_raw_fd(&program) as u32,
        pad: 0,
        cookie: 0,
    };
    let link = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut open)?;
    Ok(EmptyProgram {
        _program: program,
        _link: link,
    })
}
