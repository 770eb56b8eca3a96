//! `record -v`: the kernel programs' rare diagnostics (meshlab-ebpf/src/diag.rs: a failed
//! read on a traced socket, a refused map update, an impossible state) as log lines on
//! stderr, each named by the program that logged it.
//!
//! Without `-v` the level global is 0, the verifier removes every log call, the log ring is
//! shrunk to one page and nothing reads it.

use std::collections::HashMap;

use aya::Ebpf;
use aya_log::{EbpfLogger, Level};
use log::{Log, Metadata, Record};

use super::plan::{HOOKS, TierSpec};

/// Target of the forwarded lines (`RUST_LOG=kernel=...` filters them).
pub const LOG_TARGET: &str = "kernel";

/// The value of the programs' AYA_LOG_LEVEL global: everything they log with `verbose`,
/// otherwise 0, below every level (aya-log's Error is 1).
pub fn level(verbose: bool) -> u8 {
    if verbose { Level::Trace.into() } else { 0 }
}

/// Passes the programs' records on to the process's logger (stderr), with the name of the
/// program attached for the probe point the record names.
pub struct Forward {
    /// Attach-plan name of a probe point -> the program attached for it.
    programs: HashMap<&'static str, &'static str>,
}

impl Forward {
    pub fn new(attached: &[&'static TierSpec]) -> Self {
        let programs = HOOKS
            .iter()
            .filter_map(|hook| {
                let spec = hook
                    .tiers
                    .iter()
                    .find(|t| attached.iter().any(|a| a.program == t.program))?;
                Some((hook.name, spec.program))
            })
            .collect();
        Self { programs }
    }

    /// The program named in a record: the attached one, else the probe point as the kernel
    /// wrote it (a diagnostic of a program that was not attached cannot happen, but must not
    /// be dropped if it does).
    pub fn program<'a>(&self, target: &'a str) -> &'a str {
        self.programs.get(target).copied().unwrap_or(target)
    }
}

impl Log for Forward {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &Record<'_>) {
        log::log!(
            target: LOG_TARGET,
            record.level(),
            "{}: {} ({}:{})",
            self.program(record.target()),
            record.args(),
            record.file().unwrap_or("?"),
            record.line().unwrap_or(0)
        );
    }

    fn flush(&self) {}
}

/// Reads the programs' log ring; takes it out of `ebpf` (the ring's fd lives as long as this).
pub struct KernelLog {
    logger: EbpfLogger<Forward>,
}

impl KernelLog {
    pub fn start(ebpf: &mut Ebpf, attached: &[&'static TierSpec]) -> anyhow::Result<Self> {
        let logger = EbpfLogger::init_with_logger(ebpf, Forward::new(attached))
            .map_err(|e| anyhow::anyhow!("reading the kernel programs' log ring: {e}"))?;
        Ok(Self { logger })
    }

    /// Prints every record the programs have written so far.
    pub fn flush(&mut self) {
        self.logger.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_verbose_every_kernel_log_level_is_off() {
        assert_eq!(level(false), 0);
        // aya-log-ebpf logs a record when `level as u8 <= AYA_LOG_LEVEL`.
        for l in [
            Level::Error,
            Level::Warn,
            Level::Info,
            Level::Debug,
            Level::Trace,
        ] {
            assert!(u8::from(l) > level(false), "{l:?} would be on without -v");
            assert!(u8::from(l) <= level(true), "{l:?} would be off with -v");
        }
    }

    #[test]
    fn a_record_is_named_by_the_attached_tier_of_its_probe_point() {
        let hook = HOOKS.iter().find(|h| h.name == "sk_data_ready").unwrap();
        let raw = &hook.tiers[1];
        let forward = Forward::new(&[raw]);
        assert_eq!(forward.program("sk_data_ready"), raw.program);
        assert_eq!(forward.program("sk_data_ready"), "sk_data_ready_raw");
        assert_eq!(forward.program("no_such_probe"), "no_such_probe");
    }
}
