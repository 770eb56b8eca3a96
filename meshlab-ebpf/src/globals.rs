//! Read-only globals set by the loader before the programs are loaded.

use meshlab_common::{Config, KernelOffsets};

// SAFETY (both statics): plain-old-data; the loader rewrites their bytes in .rodata before load
// and the kernel freezes the map, so every read sees the loader's values.
#[unsafe(no_mangle)]
static CONFIG: Config = unsafe { core::mem::zeroed() };

#[unsafe(no_mangle)]
static OFFSETS: KernelOffsets = unsafe { core::mem::zeroed() };

/// Reads one field of [`CONFIG`]. Volatile so LLVM cannot fold the all-zero initialiser.
macro_rules! config {
    ($field:ident) => {
        // SAFETY: reading a field of an initialised static.
        unsafe { core::ptr::read_volatile(&$crate::globals::config_ref().$field) }
    };
}

/// Reads one kernel offset (bytes) as `usize`.
macro_rules! offset {
    ($field:ident) => {
        // SAFETY: reading a field of an initialised static.
        (unsafe { core::ptr::read_volatile(&$crate::globals::offsets_ref().$field) }) as usize
    };
}

pub(crate) use {config, offset};

pub fn config_ref() -> &'static Config {
    &CONFIG
}

pub fn offsets_ref() -> &'static KernelOffsets {
    &OFFSETS
}
