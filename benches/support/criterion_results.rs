//! Reading criterion's results back, for the benches that turn them into
//! tables and JSON (included with `#[path]`: each bench is its own crate).

use std::path::{Path, PathBuf};

/// Where criterion writes its results.
pub fn criterion_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("../criterion")
}

/// Mean time in nanoseconds criterion recorded for `group/op/parameter`.
pub fn mean_ns(group: &str, op: &str, parameter: usize) -> Option<f64> {
    let path = criterion_dir()
        .join(group)
        .join(op)
        .join(parameter.to_string())
        .join("new/estimates.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

/// Writes `rows` as `target/bench-NAME.json` and says where.
pub fn write_report(name: &str, rows: &[serde_json::Value]) {
    let out = criterion_dir().join(format!("../bench-{name}.json"));
    std::fs::write(&out, serde_json::to_string_pretty(rows).expect("JSON values serialise"))
        .expect("target/ is writable");
    println!("\nwritten to {}", out.display());
}
