//! The shell scripts a guest runs, and running `cargo test` with its binaries inside a guest.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use super::kernel::KernelLabel;

/// Host environment variables that reach the guest command: what cargo hands a test binary
/// (CARGO_*), Rust's own (RUST_*), the project's (MESHLAB_*), and PATH (same filesystem).
fn forwarded(name: &str) -> bool {
    name == "PATH"
        || name.starts_with("CARGO_")
        || name.starts_with("RUST_")
        || name.starts_with("MESHLAB_")
}

/// Single-quotes a word for sh.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The script a guest runs: forwarded environment, the working directory, then the command.
/// `guest_env` comes last so the runner's own variables win over forwarded host ones.
pub fn guest_script(command: &str, cwd: &Path, guest_env: &[(&str, String)]) -> String {
    let mut script = String::from("# Written by cargo xtask vm run.\n");
    let mut vars: Vec<(String, String)> = std::env::vars().filter(|(k, _)| forwarded(k)).collect();
    vars.sort();
    for (name, value) in vars {
        script += &format!("export {name}={}\n", quote(&value));
    }
    // Host tools first; busybox (from the initramfs) fills the gaps, e.g. ping.
    script += "export PATH=\"$PATH:/run/busybox\"\nexport HOME=/root\n";
    for (name, value) in guest_env {
        script += &format!("export {name}={}\n", quote(value));
    }
    script += &format!(
        "cd {} || {{ echo 'vm: no such directory in the guest: {}' >&2; exit 125; }}\n",
        quote(&cwd.to_string_lossy()),
        cwd.display()
    );
    script += command;
    script.push('\n');
    script
}

/// `exec 'arg0' 'arg1' ...`: an argv run without shell interpretation.
pub fn exec_argv(argv: &[String]) -> String {
    let words: Vec<String> = argv.iter().map(|a| quote(a)).collect();
    format!("exec {}", words.join(" "))
}

/// The runner script cargo calls with the test binary and its arguments.
pub fn runner_script() -> PathBuf {
    crate::workspace_root().join("xtask/vm-runner.sh")
}

/// `cargo test ARGS` with CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER set for that step only,
/// so each test binary runs inside a guest booted on `kernel`.
pub fn cargo_test_in_guest(kernel: KernelLabel, cargo_args: &[String]) -> Result<i32> {
    super::image::prepared(kernel)?;
    let xtask = crate::self_exe()?;
    let runner = runner_script();
    if !runner.is_file() {
        bail!("{} is missing", runner.display());
    }
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .arg("test")
        .args(cargo_args)
        .env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER", &runner)
        .env("MESHLAB_VM_KERNEL", kernel.as_str())
        // The runner calls this binary directly: a nested `cargo run` would wait on the build
        // lock the outer `cargo test` holds.
        .env("MESHLAB_XTASK", &xtask);
    let status = crate::cleanup::status_forwarding(&mut cargo, "cargo test (in guests)")?;
    Ok(status.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes_and_spaces() {
        assert_eq!(quote("it's a b"), r"'it'\''s a b'");
        assert_eq!(
            exec_argv(&["echo".into(), "$HOME".into()]),
            "exec 'echo' '$HOME'"
        );
    }

    #[test]
    fn script_changes_directory_before_the_command() {
        let env = [("MESHLAB_VM_GUEST", "a".to_owned())];
        let script = guest_script("uname -r", Path::new("/work/main"), &env);
        assert!(script.contains("export MESHLAB_VM_GUEST='a'\n"));
        let cd = script.find("cd '/work/main'").expect("cd line");
        let command = script.find("uname -r").expect("command line");
        assert!(cd < command);
        assert!(script.contains("export HOME=/root\n"));
    }
}
