//! dualgp's fuzz targets (`cargo +nightly fuzz run TARGET`, docs/TESTING.md).
//! Their bodies are in `bodies.rs`, which the stable corpus replay test
//! compiles too; this file adds only what libFuzzer needs.

mod bodies;

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use bodies::*;

thread_local! {
    /// Where and why the last panic on this thread was raised.
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `body`, aborting (a crash, for libFuzzer) only if a panic escapes it.
///
/// libFuzzer's panic hook aborts at every panic, also at one the code under
/// test catches on purpose: the Kafka decoder turns arrow-ipc's panics on
/// damaged streams into dead letters. So the hook here only notes the panic,
/// and the abort waits until it has come out of `body`.
pub fn crash_on_escaped_panic(body: impl FnOnce()) {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            LAST_PANIC.with(|last| *last.borrow_mut() = info.to_string());
        }))
    });
    if catch_unwind(AssertUnwindSafe(body)).is_err() {
        LAST_PANIC.with(|last| eprintln!("a panic escaped the code under test: {}", last.borrow()));
        std::process::abort();
    }
}
