//! The kernel side seen from userspace: capability probe, BTF offsets, loader, recorder.

pub mod doctor;
pub mod record;
