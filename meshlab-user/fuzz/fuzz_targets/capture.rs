#![no_main]
//! `meshlab merge` on a fuzzed binary capture: a valid file header, meta and startup record,
//! then fuzzed record bytes (events, clocks, drops, summary; see src/lib.rs).

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshlab_fuzz::merge_capture(data));
