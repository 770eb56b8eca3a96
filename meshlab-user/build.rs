//! Builds the eBPF object (meshlab-ebpf) for bpfel-unknown-none so that a plain `cargo build`
//! produces a `meshlab` binary with its kernel programs embedded.
//!
//! Why not aya-build: with the toolchains available here (rustup stable without rust-src, Debian
//! rustc-web with a prebuilt BPF core) it only works after a manual `rustup toolchain link`.
//! Instead we drive Debian's cargo directly, as docs/toolchain.md records.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Install commands printed when a tool is missing; `cargo xtask setup` runs exactly these.
const INSTALL_HINT: &str = "\
install the eBPF toolchain (cargo xtask setup does this for you):
    apt-get update
    apt-get install -y --no-install-recommends rustc-web cargo-web libstd-rust-web-dev-bpf llvm-22-dev
    LLVM_PREFIX=/usr/lib/llvm-22 cargo install --locked bpf-linker@0.13.0 --no-default-features --features llvm-22";

const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const BPF_CORE_DIR: &str = "/usr/lib/rustlib/bpfel-unknown-none";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest_dir
        .parent()
        .expect("meshlab-user sits in the workspace")
        .to_owned();
    let ebpf_dir = workspace.join("meshlab-ebpf");
    let common_dir = workspace.join("meshlab-common");
    for dir in [&ebpf_dir, &common_dir] {
        println!("cargo:rerun-if-changed={}", dir.join("src").display());
        println!(
            "cargo:rerun-if-changed={}",
            dir.join("Cargo.toml").display()
        );
    }
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("Cargo.lock").display()
    );

    check_tools();

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let target_dir = out_dir.join("ebpf-target");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("set by cargo");

    let mut cmd = Command::new(DEBIAN_CARGO);
    // The nested cargo must not inherit the outer build's configuration: CARGO_*, RUSTC*,
    // RUSTFLAGS, TARGET and PROFILE would point it at the host toolchain and target.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO")
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTFLAGS")
            || key == "TARGET"
            || key == "PROFILE"
            || key == "RUSTDOC"
            || key == "HOST"
            || key == "OPT_LEVEL"
            || key == "DEBUG"
            || key == "OUT_DIR"
            || key == "NUM_JOBS"
        {
            cmd.env_remove(key.as_ref());
        }
    }
    cmd.current_dir(&workspace)
        .env("RUSTC", DEBIAN_RUSTC)
        // Unstable features (asm_experimental_arch) for the aya-ebpf crates and our eBPF binary
        // (crate name `meshlab`, the bin target of meshlab-ebpf) only.
        .env(
            "RUSTC_BOOTSTRAP",
            "aya_ebpf,aya_ebpf_bindings,aya_ebpf_cty,meshlab",
        )
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf"),
        )
        .args([
            "build",
            "--package",
            "meshlab-ebpf",
            "--release",
            "--target",
            "bpfel-unknown-none",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .stdin(Stdio::null())
        // cargo shows a build script's stdout only as cargo: directives; send it to stderr.
        .stdout(Stdio::from(std::io::stderr()));
    if let Some(path) = path_with_cargo_bin() {
        cmd.env("PATH", path);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {DEBIAN_CARGO}: {e}\n{INSTALL_HINT}"));
    if !status.success() {
        panic!("building the eBPF programs (meshlab-ebpf) failed: {status}\n(output above)");
    }
    let object = target_dir.join("bpfel-unknown-none/release/meshlab");
    let embedded = out_dir.join("meshlab-ebpf.o");
    std::fs::copy(&object, &embedded)
        .unwrap_or_else(|e| panic!("eBPF object {} missing after build: {e}", object.display()));
}

fn check_tools() {
    let mut missing = Vec::new();
    for (path, what) in [
        (DEBIAN_RUSTC, "Debian rustc-web (/usr/bin/rustc)"),
        (DEBIAN_CARGO, "Debian cargo-web (/usr/bin/cargo)"),
        (BPF_CORE_DIR, "prebuilt BPF core (libstd-rust-web-dev-bpf)"),
    ] {
        if !Path::new(path).exists() {
            missing.push(what.to_owned());
        }
    }
    let linker_found = env::var_os("PATH")
        .map(|p| env::split_paths(&p).any(|d| d.join("bpf-linker").is_file()))
        .unwrap_or(false)
        || env::var_os("HOME")
            .is_some_and(|h| Path::new(&h).join(".cargo/bin/bpf-linker").is_file());
    if !linker_found {
        missing.push("bpf-linker".to_owned());
    }
    if !missing.is_empty() {
        panic!(
            "missing for the eBPF build: {}\n{INSTALL_HINT}",
            missing.join(", ")
        );
    }
}

/// PATH with ~/.cargo/bin appended: rustc finds `bpf-linker` through PATH, and sudo or a
/// minimal CI environment may not have cargo's bin directory on it.
fn path_with_cargo_bin() -> Option<std::ffi::OsString> {
    let home = env::var_os("HOME")?;
    let cargo_bin = Path::new(&home).join(".cargo/bin");
    let mut dirs: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    if !dirs.contains(&cargo_bin) {
        dirs.push(cargo_bin);
    }
    env::join_paths(dirs).ok()
}
