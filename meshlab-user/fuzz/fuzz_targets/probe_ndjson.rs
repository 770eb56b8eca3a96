#![no_main]
//! `meshlab merge` on a fuzzed probe ndjson (see src/lib.rs for what is checked).

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshlab_fuzz::merge_with(1, data));
