#![no_main]
//! `cargo +nightly fuzz run json_record`: the body is [`dualgp_fuzz::json_record`], run
//! so that only a panic that escapes the decoder is a crash (see
//! [`dualgp_fuzz::crash_on_escaped_panic`]).

libfuzzer_sys::fuzz_target!(|data: &[u8]| dualgp_fuzz::crash_on_escaped_panic(|| dualgp_fuzz::json_record(data)));
