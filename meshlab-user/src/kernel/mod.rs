//! The kernel side seen from userspace: capability probe, BTF offsets, loader, recorder.

pub mod btf_offsets;
pub mod clock;
pub mod doctor;
pub mod loader;
pub mod nic;
pub mod output;
pub mod plan;
pub mod privilege;
pub mod record;
pub mod session;
pub mod setup;
pub mod sysinfo;
