//! libFuzzer entry point; the checks live in `exk8s_fuzz::create_cluster_body`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| exk8s_fuzz::create_cluster_body(data));
