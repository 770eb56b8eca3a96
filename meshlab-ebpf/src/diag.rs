//! Rare diagnostics through aya-log: a kernel read that failed on a traced socket, a map
//! update the kernel refused, a state that should not exist. Never per event: each marks data
//! that is lost or a bug, and is printed by `meshlab record -v` (kernel/diag.rs).
//!
//! Off unless `-v`: the loader sets aya-log-ebpf's `AYA_LOG_LEVEL` global (a frozen read-only
//! global, like CONFIG) to 0, so the verifier sees every level test as false and drops the
//! logging code before the program ever runs: the programs cost what they cost without it
//! (docs/benchmarks-kernel.md shows the BPF statistics).
//!
//! The target is the probe point's attach-plan name (kernel/plan.rs `HOOKS`): userspace knows
//! which of its tiers' programs is attached and prints that program's name.

/// Data of a traced connection was lost: a read or map update failed.
macro_rules! diag_warn {
    ($probe:literal, $($arg:tt)+) => {
        aya_log_ebpf::warn!(&(), target: $probe, $($arg)+)
    };
}

/// A state the programs' logic rules out: a bug.
macro_rules! diag_error {
    ($probe:literal, $($arg:tt)+) => {
        aya_log_ebpf::error!(&(), target: $probe, $($arg)+)
    };
}

pub(crate) use {diag_error, diag_warn};
