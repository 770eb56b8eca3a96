//! The kernel side seen from userspace: capability probe, BTF offsets, loader, recorder.

pub(crate) mod btf_offsets;
pub(crate) mod clock;
pub(crate) mod diag;
pub mod doctor;
pub(crate) mod kfunc;
pub(crate) mod loader;
pub mod nic;
pub(crate) mod ondemand;
pub mod output;
pub mod plan;
pub mod privilege;
pub mod record;
pub(crate) mod ring;
pub(crate) mod selfcost;
pub(crate) mod session;
pub(crate) mod setup;
pub mod sysinfo;
