//! `cargo xtask fuzz`: every parser's fuzz target (meshlab-user/fuzz, cargo-fuzz on nightly)
//! for a bounded time each. Inputs that crash are left by libFuzzer under
//! meshlab-user/fuzz/artifacts/TARGET/; once fixed they are kept as regression fixtures in
//! meshlab-user/fuzz/regressions/TARGET/, which every run replays first.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::{run_cmd, workspace_root};

/// Target name and the directory of seed inputs it starts from (read-only to libFuzzer).
pub const TARGETS: &[(&str, &str)] = &[
    (
        "kernel_recording",
        "meshlab-user/tests/fixtures/merge/plain",
    ),
    ("probe_ndjson", "meshlab-user/tests/fixtures/merge/plain"),
    ("merged_ndjson", "meshlab-user/tests/fixtures/merge/golden"),
    // Seeds are record bytes appended after a valid header, meta and startup record.
    ("capture", "meshlab-user/tests/fixtures/capture-seeds"),
];

/// The nightly toolchain cargo-fuzz builds with (libFuzzer's coverage flags are unstable).
pub const NIGHTLY: &str = "nightly";

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds per target (default 600; with --quick 20).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// The bounded run `cargo xtask test` does.
    #[arg(long)]
    pub quick: bool,
    /// Only these targets (default: all).
    pub targets: Vec<String>,
}

fn fuzz_dir() -> PathBuf {
    workspace_root().join("meshlab-user/fuzz")
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    let seconds = args.seconds.unwrap_or(if args.quick { 20 } else { 600 });
    for (target, seeds) in TARGETS {
        if !args.targets.is_empty() && !args.targets.iter().any(|t| t == target) {
            continue;
        }
        replay_regressions(target)?;
        run_target(target, &workspace_root().join(seeds), seconds)?;
    }
    Ok(())
}

fn cargo_fuzz() -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", NIGHTLY, "cargo", "fuzz"]);
    cmd.current_dir(fuzz_dir());
    cmd
}

/// `--sanitizer none`: the parsers are safe Rust, so the finds are panics, hangs and memory
/// blow-ups, which libFuzzer catches without ASan (and the build is several times faster).
fn run_base(target: &str) -> Command {
    let mut cmd = cargo_fuzz();
    cmd.args(["run", "--sanitizer", "none", target]);
    cmd
}

fn replay_regressions(target: &str) -> Result<()> {
    let dir = fuzz_dir().join("regressions").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    if files.is_empty() {
        return Ok(());
    }
    files.sort();
    eprintln!(
        "xtask fuzz: {target}: replaying {} regression inputs",
        files.len()
    );
    run_cmd_here(run_base(target).args(&files).args(["--", "-runs=1"]))
}

fn run_target(target: &str, seeds: &Path, seconds: u64) -> Result<()> {
    let corpus = fuzz_dir().join("corpus").join(target);
    std::fs::create_dir_all(&corpus)?;
    eprintln!(
        "xtask fuzz: {target}: {seconds} s from seeds in {}",
        seeds.display()
    );
    let result = run_cmd_here(
        run_base(target)
            .arg(&corpus)
            .arg(seeds)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            // A merged or recorded file is a few kilobytes per request: enough to reach
            // every record type, small enough to keep executions fast.
            .args(["-max_len=16384", "-timeout=10", "-rss_limit_mb=1024"]),
    );
    if result.is_err() {
        bail!(
            "fuzz target {target} found an input that fails: see meshlab-user/fuzz/artifacts/{target}/; \
             fix it and keep the input in meshlab-user/fuzz/regressions/{target}/"
        );
    }
    Ok(())
}

/// Like run_cmd, but in the command's own directory (the fuzz crate).
fn run_cmd_here(cmd: &mut Command) -> Result<()> {
    let dir = cmd
        .get_current_dir()
        .map(Path::to_owned)
        .unwrap_or_else(fuzz_dir);
    eprintln!("xtask: (in {})", dir.display());
    let status = crate::cleanup::status_forwarding(cmd, "cargo fuzz")?;
    if !status.success() {
        bail!("fuzzing failed: {status}");
    }
    Ok(())
}

/// Whether `rustup run nightly cargo fuzz` works; used by setup.
pub fn cargo_fuzz_ok() -> bool {
    cargo_fuzz()
        .current_dir(workspace_root())
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn nightly_present() -> bool {
    Command::new("rustup")
        .args(["run", NIGHTLY, "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs what fuzzing needs and is missing: the nightly toolchain and cargo-fuzz.
pub fn setup() -> Result<()> {
    if nightly_present() {
        eprintln!("xtask setup: rust {NIGHTLY} present (for cargo-fuzz)");
    } else {
        eprintln!("xtask setup: installing rust {NIGHTLY} (cargo-fuzz needs it)");
        run_cmd(Command::new("rustup").args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
        ]))?;
    }
    if cargo_fuzz_ok() {
        eprintln!("xtask setup: cargo-fuzz present");
    } else {
        eprintln!("xtask setup: installing cargo-fuzz {CARGO_FUZZ_VERSION} (~1 min)");
        run_cmd(
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())).args([
                "install",
                "--locked",
                &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
            ]),
        )?;
    }
    Ok(())
}

pub const CARGO_FUZZ_VERSION: &str = "0.13.2";
