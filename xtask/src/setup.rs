//! Idempotent set-up: Debian packages and bpf-linker, installed only when missing, through
//! sudo when not root. The exact toolchain route is docs/toolchain.md's.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};

use crate::run_cmd;

/// Debian packages and why each is needed.
const PACKAGES: &[(&str, &str)] = &[
    (
        "rustc-web",
        "rustc that builds the eBPF programs (/usr/bin/rustc)",
    ),
    ("cargo-web", "cargo for the eBPF build (/usr/bin/cargo)"),
    (
        "libstd-rust-web-dev-bpf",
        "prebuilt core for bpfel-unknown-none",
    ),
    ("llvm-22-dev", "LLVM that bpf-linker links against"),
    (
        "haproxy",
        "the lab's sidecar proxy (one-hop and two-hop topologies)",
    ),
    ("chromium", "renders the HTML report in a test"),
    (
        "bpftrace",
        "the independent reference of `cargo xtask truth` (xtask/truth/reference.bt)",
    ),
    ("iproute2", "`ip netns` listing in lab clean-up checks"),
    (
        "redis-server",
        "the bench's real-world server (cargo xtask bench)",
    ),
    (
        "redis-tools",
        "redis-benchmark and redis-cli (cargo xtask bench)",
    ),
    (
        "bpftool",
        "per-program BPF run-time statistics (cargo xtask bench)",
    ),
    (
        "ethtool",
        "`ethtool -L` in the guests of the two-queue VM scenario (they run the host's /)",
    ),
];

const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `cmd` as root: directly, or through sudo.
pub fn as_root(program: &str) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut c = Command::new("sudo");
        c.arg(program);
        c
    }
}

fn package_installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn cargo_bin_dir() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo")
        });
    home.join("bin")
}

fn bpf_linker_ok() -> bool {
    Command::new(cargo_bin_dir().join("bpf-linker"))
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
        .unwrap_or(false)
}

pub fn run() -> Result<()> {
    let missing: Vec<&(&str, &str)> = PACKAGES
        .iter()
        .filter(|(name, _)| !package_installed(name))
        .collect();
    if missing.is_empty() {
        eprintln!("xtask setup: Debian packages present");
    } else {
        for (name, why) in &missing {
            eprintln!("xtask setup: installing {name}: {why}");
        }
        run_cmd(
            as_root("apt-get")
                .arg("update")
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        run_cmd(
            as_root("apt-get")
                .args(["install", "-y", "--no-install-recommends"])
                .args(missing.iter().map(|(name, _)| *name))
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    if bpf_linker_ok() {
        eprintln!("xtask setup: bpf-linker {BPF_LINKER_VERSION} present");
    } else {
        eprintln!(
            "xtask setup: installing bpf-linker {BPF_LINKER_VERSION} (links the eBPF object; ~1 min)"
        );
        // bpf-linker reads LLVM_PREFIX; without it it finds an older LLVM and fails.
        run_cmd(
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .args([
                    "install",
                    "--locked",
                    &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                ])
                .args(["--no-default-features", "--features", "llvm-22"])
                .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
        )
        .context("installing bpf-linker")?;
    }
    crate::fuzz::setup()
}
