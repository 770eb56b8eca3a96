//! Output safety under root (crate::output, docs/security.md): a planted symlink is refused
//! with its target untouched, a foreign-owned file is refused, a symlinked parent planted in a
//! shared directory is not followed, and outputs are handed to the invoking user (SUDO_UID)
//! through the open descriptor. Exercised through the real commands (`record`, `merge`).

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt, lchown, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use support::privileged_or_skip;

/// The conventional `nobody`: a uid that is neither root nor the test runner.
const OTHER_UID: u32 = 65534;

fn dir_with_mode(mode: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// A root-only file standing for /etc/shadow.
fn secret(dir: &Path) -> PathBuf {
    let path = dir.join("secret");
    std::fs::write(&path, "root only\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn merge_plain_to(out: &Path, invoker: Option<u32>) -> std::process::Output {
    let inputs = [
        "A.kernel.ndjson",
        "A.probe.ndjson",
        "B.kernel.ndjson",
        "B.probe.ndjson",
    ]
    .map(|f| Path::new("tests/fixtures/merge/plain").join(f));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meshlab"));
    cmd.arg("merge").args(inputs).arg("-o").arg(out);
    run_as(&mut cmd, invoker)
}

fn record_to(out: &Path, invoker: Option<u32>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meshlab"));
    cmd.args(["record", "--duration", "300ms", "--port", "1", "-o"])
        .arg(out);
    run_as(&mut cmd, invoker)
}

/// Runs `cmd` as if through `sudo` by the user `invoker`.
fn run_as(cmd: &mut Command, invoker: Option<u32>) -> std::process::Output {
    cmd.env_remove("SUDO_UID").env_remove("SUDO_GID");
    if let Some(uid) = invoker {
        cmd.env("SUDO_UID", uid.to_string())
            .env("SUDO_GID", uid.to_string());
    }
    cmd.output().expect("run meshlab")
}

fn assert_refused(out: &std::process::Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "not refused; stderr: {stderr}");
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in: {stderr}"
    );
}

fn assert_untouched(secret: &Path) {
    assert_eq!(std::fs::read_to_string(secret).unwrap(), "root only\n");
    let meta = std::fs::metadata(secret).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600));
}

#[test]
fn a_planted_symlink_is_refused_and_its_target_untouched() {
    if !privileged_or_skip("a_planted_symlink_is_refused_and_its_target_untouched") {
        return;
    }
    let private = dir_with_mode(0o700);
    let target = secret(private.path());
    let shared = dir_with_mode(0o1777);
    let planted = shared.path().join("x.ndjson");
    symlink(&target, &planted).unwrap();
    lchown(&planted, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    let recorded = record_to(&planted, Some(OTHER_UID));
    assert_refused(&recorded, "symbolic link");
    // `record` checks its output before it loads anything: the refusal is all it prints (a
    // load and attach would log first, e.g. the self-cost warning when BPF statistics are off).
    let stderr = String::from_utf8_lossy(&recorded.stderr);
    assert_eq!(stderr.lines().count(), 1, "more than the refusal: {stderr}");
    assert_refused(&merge_plain_to(&planted, Some(OTHER_UID)), "symbolic link");
    assert_untouched(&target);
}

#[test]
fn a_foreign_owned_output_file_is_refused() {
    if !privileged_or_skip("a_foreign_owned_output_file_is_refused") {
        return;
    }
    let dir = dir_with_mode(0o755);
    let theirs = dir.path().join("theirs.ndjson");
    std::fs::write(&theirs, "their data\n").unwrap();
    std::os::unix::fs::chown(&theirs, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    let expected = format!("belongs to uid {OTHER_UID}");
    assert_refused(&record_to(&theirs, None), &expected);
    assert_refused(&merge_plain_to(&theirs, None), &expected);
    assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "their data\n");
}

#[test]
fn a_symlinked_parent_planted_in_a_shared_directory_is_not_followed() {
    if !privileged_or_skip("a_symlinked_parent_planted_in_a_shared_directory_is_not_followed") {
        return;
    }
    let private = dir_with_mode(0o700);
    let shared = dir_with_mode(0o1777);
    let planted = shared.path().join("results");
    symlink(private.path(), &planted).unwrap();
    lchown(&planted, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    // Run by root itself: the link's owner is a stranger, not the invoking user.
    let out = merge_plain_to(&planted.join("merged.ndjson"), None);
    assert_refused(&out, "refusing to follow");
    assert_eq!(std::fs::read_dir(private.path()).unwrap().count(), 0);
}

#[test]
fn outputs_are_handed_to_the_invoking_user() {
    if !privileged_or_skip("outputs_are_handed_to_the_invoking_user") {
        return;
    }
    let shared = dir_with_mode(0o1777);
    for (name, out) in [
        ("rec.ndjson", record_to as fn(&Path, Option<u32>) -> _),
        ("merged.ndjson", merge_plain_to),
    ] {
        let path = shared.path().join(name);
        let result = out(&path, Some(OTHER_UID));
        assert!(
            result.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&result.stderr)
        );
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (OTHER_UID, OTHER_UID), "{name}");
    }
}
