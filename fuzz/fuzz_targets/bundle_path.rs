//! libFuzzer entry point; the checks live in `exk8s_fuzz::bundle_path`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| exk8s_fuzz::bundle_path(data));
