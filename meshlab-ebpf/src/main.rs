//! meshlab's kernel programs.
//!
//! Entry points are thin wrappers (one per attach tier) over `try_*` functions; one module per
//! hook family, as in kunai's probes/<area>.rs. Every kernel struct read goes through offsets
//! the loader resolved from vmlinux BTF (see [`globals`]), never through compiled-in layouts.
#![no_std]
#![no_main]
// Inline BPF assembly for the atomic instructions (atomic.rs); enabled by RUSTC_BOOTSTRAP in build.rs.
#![feature(asm_experimental_arch)]

mod atomic;
mod diag;
mod emit;
mod globals;
mod irq;
mod kread;
mod maps;
mod prefilter;
mod rx;
mod sched;
mod sockops;
mod tstamp;
mod turn;
mod tx;
mod unix;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never entered at run time.
    loop {}
}

/// The kernel checks a program's license to decide which helpers it may call.
#[unsafe(no_mangle)]
#[unsafe(link_section = "license")]
pub static LICENSE: [u8; 4] = *b"GPL\0";
