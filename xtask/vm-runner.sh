#!/bin/sh
# Cargo runner that executes a test binary inside a qemu guest booted on a stock Debian kernel.
# Set it for one step only, e.g. through `cargo xtask vm test --kernel 6.12 -- -p meshlab-user`,
# or by hand:
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/xtask/vm-runner.sh cargo test ...
# MESHLAB_VM_KERNEL picks the kernel (6.1 or 6.12, default 6.12), MESHLAB_VM_TIMEOUT the limit in
# seconds (default 300). The test binary's exit status, stdout and stderr come back unchanged.
set -eu
kernel="${MESHLAB_VM_KERNEL:-6.12}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
# The xtask binary is called directly: `cargo run` here would wait on the build lock held by the
# `cargo test` that invoked this runner.
xtask="${MESHLAB_XTASK:-${CARGO_TARGET_DIR:-$repo/target}/debug/xtask}"
if [ ! -x "$xtask" ]; then
    echo "vm-runner: $xtask not found: run 'cargo build -p xtask' first" >&2
    exit 2
fi
exec "$xtask" vm run --kernel "$kernel" --timeout "${MESHLAB_VM_TIMEOUT:-300}" -- "$@"
