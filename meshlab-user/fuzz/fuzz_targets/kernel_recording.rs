#![no_main]
//! `meshlab merge` on a fuzzed kernel recording (see src/lib.rs for what is checked).

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshlab_fuzz::merge_with(0, data));
