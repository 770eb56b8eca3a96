//! The floor of per-program cost: an empty BPF program (`r0 = 0; exit`) on a raw tracepoint,
//! measured with the same BPF statistics as the recorder's programs. What a recorder program
//! costs above this is its own work; the floor itself is the tracepoint dispatch plus the
//! statistics' clock reads, which no program can avoid.

use std::os::fd::OwnedFd;

use anyhow::Result;

use crate::bpfraw::{Asm, attach_raw_tp, load_raw_tp};

/// The name the empty program is loaded under (what bpftool lists).
pub const FLOOR_PROGRAM: &str = "empty_floor";

/// An attached empty program; detached and unloaded on drop (closing both descriptors).
pub struct EmptyProgram {
    _program: OwnedFd,
    _link: OwnedFd,
}

pub fn attach_empty(tracepoint: &str) -> Result<EmptyProgram> {
    let mut asm = Asm::default();
    asm.exit_zero();
    let program = load_raw_tp(FLOOR_PROGRAM, &asm)?;
    let link = attach_raw_tp(&program, tracepoint)?;
    Ok(EmptyProgram {
        _program: program,
        _link: link,
    })
}
