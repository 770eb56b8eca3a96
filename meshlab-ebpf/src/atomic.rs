//! BPF atomic instructions on map values. Rust's atomics are not available on
//! bpfel-unknown-none (the target declares no compare-and-swap), so these are the
//! instructions C's `__sync_*` builtins compile to (kernel 5.12+ for the fetching ones).
//!
//! # Safety (every function)
//! `ptr` must point to a valid, 8-byte aligned u64 in a map value.

/// `lock *(u64 *)(ptr) += value`.
#[inline(always)]
pub unsafe fn atomic_add(ptr: *mut u64, value: u64) {
    // SAFETY: guaranteed by the caller; the instruction touches only *ptr.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({ptr} + 0) += {value}",
            ptr = in(reg) ptr,
            value = in(reg) value,
            options(nostack),
        );
    }
}

/// `*ptr |= bits`, returning the value before.
#[inline(always)]
pub unsafe fn fetch_or(ptr: *mut u64, bits: u64) -> u64 {
    let mut value = bits;
    // SAFETY: guaranteed by the caller; the instruction touches only *ptr.
    unsafe {
        core::arch::asm!(
            "{value} = atomic_fetch_or((u64 *)({ptr} + 0), {value})",
            ptr = in(reg) ptr,
            value = inout(reg) value,
            options(nostack),
        );
    }
    value
}

/// Stores `new` at `ptr` if it holds `expected`; returns the value found (== `expected` when
/// the store happened).
#[inline(always)]
pub unsafe fn compare_exchange(ptr: *mut u64, expected: u64, new: u64) -> u64 {
    let mut found = expected;
    // SAFETY: guaranteed by the caller; the instruction touches only *ptr. The instruction
    // compares with r0 and returns the old value in r0.
    unsafe {
        core::arch::asm!(
            "r0 = cmpxchg_64({ptr} + 0, r0, {new})",
            ptr = in(reg) ptr,
            new = in(reg) new,
            inout("r0") found,
            options(nostack),
        );
    }
    found
}
