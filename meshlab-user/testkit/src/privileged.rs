//! Tests that need root (namespaces, eBPF, mounts) or a tool (chromium, haproxy) skip loudly
//! when they cannot run, except where skipping is forbidden: `cargo xtask test --ci` sets
//! [`REQUIRE_PRIVILEGED_ENV`]`=1`, and then a skip is a failure.

/// The one environment variable that turns a skipped privileged test into a failure.
pub const REQUIRE_PRIVILEGED_ENV: &str = "MESHLAB_REQUIRE_PRIVILEGED";

/// Whether skipping is forbidden ([`REQUIRE_PRIVILEGED_ENV`] is `1`).
pub fn skipping_forbidden() -> bool {
    std::env::var(REQUIRE_PRIVILEGED_ENV).is_ok_and(|v| v == "1")
}

/// For tests that need root: true when they can run; otherwise a loud SKIP line and false,
/// or a panic when skipping is forbidden.
pub fn privileged_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip(test, "needs root (network namespaces, eBPF)")
}

/// For tests that need an external program: true when `program` is on PATH.
pub fn can_run_with(test: &str, program: &str) -> bool {
    if meshlab_user::lab::find_program(program).is_some() {
        return true;
    }
    skip(test, &format!("`{program}` is not installed"))
}

/// Records that `test` cannot run because of `why`: false, or a panic when skipping is
/// forbidden.
pub fn skip(test: &str, why: &str) -> bool {
    assert!(
        !skipping_forbidden(),
        "{test}: {why}, and {REQUIRE_PRIVILEGED_ENV}=1 forbids skipping"
    );
    eprintln!("SKIP {test}: {why} (set {REQUIRE_PRIVILEGED_ENV}=1 to make this a failure)");
    false
}
