//! Running the built `dualgp` binary, shared by the command tests.
#![allow(dead_code)]

use std::process::{Command, Output};

pub fn dualgp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dualgp"))
        .args(args)
        .output()
        .expect("the dualgp binary runs")
}

/// Fails with exit code ≠ 0 and a single stderr line containing `needle`.
pub fn assert_fails_with(args: &[&str], needle: &str) {
    let out = dualgp(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "{args:?}: expected one line, got:\n{stderr}"
    );
    assert!(
        stderr.contains(needle),
        "{args:?}: {stderr:?} does not mention {needle:?}"
    );
}
