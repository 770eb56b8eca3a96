#![no_main]
//! `meshlab report` on a fuzzed merged file (see src/lib.rs for what is checked).

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshlab_fuzz::report_on(data));
