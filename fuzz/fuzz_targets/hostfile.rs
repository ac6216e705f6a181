#![no_main]
//! `cargo +nightly fuzz run hostfile`: the body is [`dualgp_fuzz::hostfile`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| dualgp_fuzz::hostfile(data));
