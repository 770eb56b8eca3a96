//! Developer tasks. The README's two commands are `cargo xtask demo` and `cargo xtask test`;
//! both install what is missing first (`setup`), so a fresh machine needs nothing else.

mod bench;
mod bench_attach;
mod bench_helpers;
mod bench_kernel;
mod bench_merge;
mod bench_probes;
mod bench_rate;
mod bench_recorder;
mod bpffloor;
mod bpfraw;
mod bpfstats;
mod cleanup;
mod fuzz;
mod ladder;
mod ladder_doc;
mod ladder_plan;
mod ladder_stats;
mod machine_cpu;
mod procs;
mod redis_lab;
mod setup;
mod truth;
mod truth_breakdown;
mod truth_cause;
mod truth_lab;
mod truth_reference;
mod truth_retransmit;
mod truth_stats;
mod truth_vm;
mod truth_vm_script;
mod vm;
mod vm_irq_counts;
mod vm_scenarios;
mod vm_two_machines;
mod vm_two_nics;
mod vm_two_queues;
mod vm_wire_rounds;
mod wire_loss;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "meshlab developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the toolchain and packages meshlab needs (idempotent; says what it installs).
    Setup,
    /// Set up, build, and run every check and test (rustfmt, clippy, unit, privileged, the
    /// quick truth and bench runs, fuzz, VM).
    Test(TestArgs),
    /// Set up, build, and run the lab demo (`meshlab demo`) with the given arguments.
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Boot stock Debian kernels under qemu and run commands in them.
    Vm(vm::VmArgs),
    /// The privileged record tests and the two-guest NIC IRQ scenario on stock Debian kernels.
    VmScenarios {
        #[arg(long)]
        ci: bool,
        /// Only the two-guest NIC IRQ scenario.
        #[arg(long)]
        nic_only: bool,
    },
    /// Fuzz every parser (cargo-fuzz on nightly), 10 minutes per target by default.
    Fuzz(fuzz::FuzzArgs),
    /// Benchmarks on the real kernel. Without a sub-task: the cost ladder, written to
    /// docs/benchmarks.md and docs/benchmarks.json.
    Bench {
        #[command(subcommand)]
        task: Option<bench::BenchTask>,
        /// Smoke test of the cost ladder (CI, no thresholds): one short round, results under
        /// target/bench-quick/ instead of docs/.
        #[arg(long)]
        quick: bool,
        #[command(flatten)]
        partial: ladder_plan::PartialArgs,
    },
    /// Inject known causes into a two-namespace lab; print where the attribution puts them.
    Truth(truth::TruthArgs),
    /// Run inside a guest by `truth --vm` (irq-rt-busy-cpu): spin SPIN_US on the CPU, sleep
    /// SLEEP_US, until killed; the guest's script sets its CPU and real-time priority.
    #[command(hide = true)]
    GuestHog {
        #[arg(long)]
        spin_us: u64,
        #[arg(long)]
        sleep_us: u64,
    },
}

#[derive(clap::Args)]
struct TestArgs {
    /// CI mode: a privileged or VM test that would skip fails instead.
    #[arg(long)]
    ci: bool,
    /// Skip the qemu guest tests (they need ~1 GB of kernel packages on first run).
    #[arg(long)]
    no_vm: bool,
    /// Extra arguments for `cargo test` (e.g. a test name filter).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    cargo_args: Vec<String>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // The guest's hog starts nothing to clean up, and a signal thread would share its
    // real-time priority on the CPU it hogs: `kill` ends it at once.
    if let Task::GuestHog { spin_us, sleep_us } = cli.command {
        truth_vm_script::guest_hog(spin_us, sleep_us);
    }
    // Before anything is started: a signal would otherwise kill xtask without clean-up.
    cleanup::install()?;
    match cli.command {
        Task::Setup => setup::run(),
        Task::Test(args) => test(args),
        Task::Demo { args } => demo(&args),
        Task::Vm(args) => vm::run(args),
        Task::VmScenarios { ci, nic_only } => vm_scenarios::run(ci, nic_only),
        Task::Fuzz(args) => {
            setup::run()?;
            fuzz::run(&args)
        }
        Task::Bench {
            task,
            quick,
            partial,
        } => {
            setup::run()?;
            match task {
                Some(task) => bench::run(task),
                None => bench::ladder(quick, &partial),
            }
        }
        Task::GuestHog { .. } => unreachable!("run before the clean-up handler"),
        Task::Truth(args) => {
            setup::run()?;
            if args.vm {
                truth_vm::run_args(args)
            } else {
                truth::run(args)
            }
        }
    }
}

/// The workspace's target directory (respects CARGO_TARGET_DIR like cargo does).
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    workspace_root().join("target")
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

/// This xtask binary, to run again or to hand to a guest runner. `cargo test --all-targets`
/// rebuilds target/debug/xtask while this process runs (xtask's integration tests build the
/// binary with their dev-dependencies' features), so the running binary's path reads
/// "PATH (deleted)": the rebuilt file at PATH is the same xtask source and is what is run then.
pub fn self_exe() -> Result<PathBuf> {
    live_exe(std::env::current_exe().context("locating the xtask binary")?)
}

/// `exe` as /proc/self/exe names it, or the file now at its path if it was replaced.
fn live_exe(exe: PathBuf) -> Result<PathBuf> {
    let Some(live) = exe.to_str().and_then(|p| p.strip_suffix(" (deleted)")) else {
        return Ok(exe);
    };
    let live = PathBuf::from(live);
    anyhow::ensure!(
        live.is_file(),
        "the xtask binary {} was removed while it ran",
        live.display()
    );
    Ok(live)
}

/// Runs a command in the workspace root, echoing it; fails with its status. A signal to xtask
/// meanwhile is passed on to it (often xtask again, or sudo: it cleans up after itself).
pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let (what, status) = run_cmd_status(cmd)?;
    if !status.success() {
        bail!("`{what}` failed: {status}");
    }
    Ok(())
}

/// [`run_cmd`] that leaves the exit status to the caller; the command line as shown with it.
pub fn run_cmd_status(cmd: &mut Command) -> Result<(String, std::process::ExitStatus)> {
    let what = render(cmd);
    eprintln!("xtask: $ {what}");
    let status = cleanup::status_forwarding(cmd.current_dir(workspace_root()), &what)?;
    Ok((what, status))
}

/// Every line of an NDJSON file (a recording, a merge), parsed; an error names the line.
pub fn read_ndjson(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    (text.lines().enumerate())
        .map(|(index, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not JSON", path.display(), index + 1))
        })
        .collect()
}

fn render(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn test(args: TestArgs) -> Result<()> {
    setup::run()?;
    if !args.no_vm {
        // Before `cargo test`: xtask's own VM tests boot guests and need qemu and the kernels.
        run_cmd(Command::new(self_exe()?).args(["vm", "prepare"]))?;
    }
    run_cmd(cargo().args(["fmt", "--all", "--check"]))?;
    run_cmd(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    let mut test = cargo();
    test.args(["test", "--all-targets"]);
    if args.ci {
        // Turns every "skip: not root / tool missing" into a failure: CI must run them all.
        test.env("MESHLAB_REQUIRE_PRIVILEGED", "1");
        if !args.no_vm {
            test.env("MESHLAB_REQUIRE_VM", "1");
        }
    }
    if !setup::is_root() {
        // Privileged tests load eBPF and create namespaces: run the test binaries through sudo.
        test.args([
            "--config",
            "target.x86_64-unknown-linux-gnu.runner='sudo -E'",
        ]);
    }
    test.args(&args.cargo_args);
    run_cmd(&mut test)?;
    truth_quick(args.ci, TruthPlace::Host)?;
    // The cost ladder's smoke test: every bench code path once, no thresholds (~1 min).
    run_cmd(setup::as_root(&self_exe()?.to_string_lossy()).args(["bench", "--quick"]))?;
    // Seconds: the merge benchmark's smoke run (capture and NDJSON inputs) on the debug build.
    run_cmd(Command::new(self_exe()?).args(["bench", "merge", "--quick"]))?;
    // Every parser's fuzz target for a few seconds, after replaying the kept regressions.
    fuzz::run(&fuzz::FuzzArgs {
        seconds: None,
        quick: true,
        targets: Vec::new(),
    })?;
    if !args.no_vm {
        vm_tests(args.ci)?;
        truth_quick(args.ci, TruthPlace::Guests)?;
    }
    Ok(())
}

/// Where `cargo xtask test` runs the attribution-truth table's quick, threshold-free mode.
#[derive(Clone, Copy)]
enum TruthPlace {
    /// The host's causes in two network namespaces (~1 min).
    Host,
    /// The guests' causes (netem, the wire relay, NIC IRQs on busy CPUs): three boots of two
    /// TCG guests (~3 min), after the VM tests, which have failed already (in CI) or said
    /// loudly why guests cannot boot here.
    Guests,
}

/// `cargo xtask truth [--vm] --quick --debug`. It needs root; outside CI a non-root run skips
/// it, in CI that is a failure.
fn truth_quick(ci: bool, place: TruthPlace) -> Result<()> {
    let mut truth = vec!["truth"];
    if let TruthPlace::Guests = place {
        truth.push("--vm");
    }
    truth.push("--quick");
    let what = format!("cargo xtask {}", truth.join(" "));
    if !setup::is_root() {
        if ci {
            bail!("{what} needs root and --ci forbids skipping it");
        }
        eprintln!("SKIP {what}: not root");
        return Ok(());
    }
    // The debug build `cargo test` has just made: a release build of meshlab and its eBPF
    // object costs CI minutes, and the quick table has no thresholds to hold a build to.
    truth.push("--debug");
    run_cmd(Command::new(self_exe()?).args(truth))
}

/// The stock Debian kernels under qemu (prepared before `cargo test`): see vm_scenarios.rs.
fn vm_tests(ci: bool) -> Result<()> {
    vm_scenarios::run(ci, false)
}

fn demo(args: &[String]) -> Result<()> {
    setup::run()?;
    run_cmd(cargo().args(["build", "--release", "--bin", "meshlab"]))?;
    let exe = target_dir().join("release/meshlab");
    let mut cmd = if setup::is_root() {
        Command::new(&exe)
    } else {
        let mut c = Command::new("sudo");
        c.arg(&exe);
        c
    };
    cmd.arg("demo").args(args);
    run_cmd(&mut cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_binary_is_run_from_its_path_and_a_removed_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("xtask-self-exe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("xtask");
        std::fs::write(&bin, b"rebuilt").unwrap();
        let deleted = PathBuf::from(format!("{} (deleted)", bin.display()));
        assert_eq!(live_exe(deleted.clone()).unwrap(), bin);
        assert_eq!(live_exe(bin.clone()).unwrap(), bin);
        std::fs::remove_file(&bin).unwrap();
        let err = live_exe(deleted).unwrap_err().to_string();
        assert!(err.contains("was removed while it ran"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
