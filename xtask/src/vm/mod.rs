//! `cargo xtask vm ...`: run meshlab on stock Debian 6.1 and 6.12 kernels inside qemu guests.
//!
//! The host's `/` is shared read-only into each guest (9p + tmpfs overlay), so host-built binaries
//! run unmodified; with two guests, a private `-netdev dgram` link joins two virtio-net NICs, which
//! gives real NIC IRQs and real clock skew between two "machines". See docs/vm.md.

mod apt;
mod check;
mod cpio;
mod guest;
mod image;
mod kernel;
mod qemu;
mod relay;
mod script;
mod spec;
mod tap_link;
#[cfg(test)]
mod tests;
mod vmlinux;
mod wire;

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};

pub use guest::GUEST_STOPPED_EXIT;
pub use kernel::KernelLabel;

#[derive(Debug, Args)]
pub struct VmArgs {
    #[command(subcommand)]
    pub command: VmCommand,
}

#[derive(Debug, Subcommand)]
pub enum VmCommand {
    /// Install qemu, busybox and the Debian kernels with apt-get, then build the boot files
    /// (uncompressed vmlinux + initramfs) under target/vm/<kernel>/ (cached).
    Prepare {
        /// Kernels to prepare (default: all).
        #[arg(long = "kernel", value_enum)]
        kernels: Vec<KernelLabel>,
    },
    /// Boot one or two guests, run a command as root in each, and exit with its status.
    Run(RunArgs),
    /// Boot each kernel and prove the runner works: release, BTF, ping over the private link,
    /// clock skew between the two guests; prints boot+run time and memory per kernel.
    Check {
        /// Kernels to check (default: all).
        #[arg(long = "kernel", value_enum)]
        kernels: Vec<KernelLabel>,
    },
    /// Run `cargo test ARGS...` with every test binary executed inside a guest (cargo runner).
    Test {
        #[arg(long, value_enum)]
        kernel: KernelLabel,
        /// Arguments passed to `cargo test`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cargo_args: Vec<String>,
    },
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[arg(long, value_enum)]
    pub kernel: KernelLabel,
    /// 1 guest (no NIC) or 2 guests (A and B joined by a private link). `--b` implies 2.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub guests: Option<u8>,
    /// Shell command for guest A (instead of `-- CMD...`).
    #[arg(long = "a", value_name = "SHELL")]
    pub cmd_a: Option<String>,
    /// Shell command for guest B (two guests).
    #[arg(long = "b", value_name = "SHELL")]
    pub cmd_b: Option<String>,
    /// Kill the guests after this many seconds (boot included).
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    pub memory: u32,
    /// Guest virtual CPUs.
    #[arg(long, default_value_t = 1)]
    pub cpus: u8,
    /// Host directory mounted read-write at the same path in every guest (everything else is
    /// read-only with a throw-away overlay). Repeatable.
    #[arg(long = "rw", value_name = "DIR")]
    pub rw_dirs: Vec<PathBuf>,
    /// Two guests: join them through a host relay that delays every frame by this many
    /// microseconds one way; a guest changes it by creating `$MESHLAB_VM_SHARED/wire.set.N.US`
    /// (N = 1, 2, ...) and waiting for `wire.ack.N` (docs/vm.md).
    #[arg(long, value_name = "US")]
    pub wire_delay_us: Option<u64>,
    /// With --wire-delay-us: write each delay's realized per-frame delays (host clock) here.
    #[arg(long, value_name = "FILE", requires = "wire_delay_us")]
    pub wire_log: Option<PathBuf>,
    /// Two guests: give each guest's NIC this many queue pairs (virtio-net `mq=on` over a
    /// multi-queue tap; a guest uses one per vCPU until `ethtool -L eth0 combined N`). The
    /// taps sit on a bridge in a network namespace of their own, gone with the run. Needs root
    /// (docs/vm.md).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8),
          conflicts_with = "wire_delay_us")]
    pub queues: u8,
    /// Two guests: NICs per guest, each on a link of its own. 2 adds eth1 (10.214.0.1 and
    /// 10.214.0.2/24), on a datagram link straight between the two qemu (docs/vm.md).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2),
          conflicts_with = "wire_delay_us")]
    pub nics: u8,
    /// An extra kernel command-line parameter of every guest (e.g. `threadirqs`). Repeatable.
    #[arg(long = "kernel-arg", value_name = "PARAM")]
    pub kernel_args: Vec<String>,
    /// Working directory of the command (default: the current directory).
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// Command and arguments for the single guest, run without a shell.
    #[arg(last = true)]
    pub argv: Vec<String>,
}

pub fn run(args: VmArgs) -> Result<()> {
    match args.command {
        VmCommand::Prepare { kernels } => {
            for label in all_if_empty(kernels) {
                image::prepare(label)?;
            }
            Ok(())
        }
        VmCommand::Run(run_args) => {
            let code = match guest::run_cli(&run_args) {
                Err(err) if err.is::<guest::GuestStopped>() => {
                    eprintln!("Error: {err}");
                    guest::GUEST_STOPPED_EXIT
                }
                other => other?,
            };
            // Every guest is dead and the run directory removed here: exit with the guest's
            // status so callers (cargo's runner protocol, CI) see the command's own result.
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        VmCommand::Check { kernels } => check::run(&all_if_empty(kernels)),
        VmCommand::Test { kernel, cargo_args } => {
            let code = script::cargo_test_in_guest(kernel, &cargo_args)?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
    }
}

/// Whether a missing qemu/kernel should fail a test instead of skipping it (CI sets this).
pub fn vm_required() -> bool {
    std::env::var("MESHLAB_REQUIRE_VM").is_ok_and(|v| v == "1")
}

fn all_if_empty(kernels: Vec<KernelLabel>) -> Vec<KernelLabel> {
    if kernels.is_empty() {
        KernelLabel::ALL.to_vec()
    } else {
        kernels
    }
}

fn ensure_root(what: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("{what} needs root (apt-get installs packages)");
    }
    Ok(())
}
