#![no_main]
//! `cargo +nightly fuzz run cli_flags`: the body is [`dualgp_fuzz::cli_flags`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| dualgp_fuzz::cli_flags(data));
