#![no_main]
//! `cargo +nightly fuzz run checkpoint`: the body is [`dualgp_fuzz::checkpoint`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| dualgp_fuzz::checkpoint(data));
