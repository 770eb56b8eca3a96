//! The lab: two network namespaces ("machines" A and B) joined by a veth pair, an echo RPC
//! workload with userland probes, HAProxy sidecar topologies, and `meshlab demo`.
//! See docs/lab.md.

pub mod cli;
pub mod codec;
pub mod demo;
mod demo_summary;
pub mod haproxy;
pub mod leftovers;
pub mod netns;
pub mod probes;
pub mod process;
pub mod topology;
pub mod workload;

/// Env var that turns "skip: not root / tool missing" into a test failure (CI on a prepared host).
pub const REQUIRE_PRIVILEGED_ENV: &str = "MESHLAB_REQUIRE_PRIVILEGED";

fn privileged_required() -> bool {
    std::env::var(REQUIRE_PRIVILEGED_ENV).is_ok_and(|v| v == "1")
}

/// For tests that need root (namespaces, mounts): true when they can run. Otherwise prints a
/// loud SKIP line and returns false, or panics when MESHLAB_REQUIRE_PRIVILEGED=1.
pub fn can_run_privileged(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip_or_fail(test, "needs root (network namespaces)")
}

/// For tests that need an external program: true when `program` is on PATH.
pub fn can_run_with(test: &str, program: &str) -> bool {
    if find_program(program).is_some() {
        return true;
    }
    skip_or_fail(test, &format!("`{program}` is not installed"))
}

fn skip_or_fail(test: &str, why: &str) -> bool {
    assert!(
        !privileged_required(),
        "{test}: {why}, and {REQUIRE_PRIVILEGED_ENV}=1 forbids skipping"
    );
    eprintln!("SKIP {test}: {why} (set {REQUIRE_PRIVILEGED_ENV}=1 to make this a failure)");
    false
}

/// First `program` on PATH.
pub fn find_program(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}
