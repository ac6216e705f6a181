//! The README's library snippet is the doctest of `dataflow/mod.rs`, which
//! `cargo test --doc` runs: the two must not drift apart.

use std::path::Path;

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The README's Rust block that follows the sentence naming the doctest.
fn readme_snippet() -> String {
    let readme = read("../README.md");
    let after = readme
        .split_once("This is the doctest of")
        .expect("the README says which doctest its snippet is")
        .1;
    let block = after.split_once("```rust\n").expect("a rust block follows").1;
    block.split_once("```").expect("the block ends").0.to_string()
}

/// The first code block of `dataflow/mod.rs`'s module docs, without `//! `.
fn doctest() -> String {
    let lines: Vec<String> = read("src/dataflow/mod.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l).to_string())
        .collect();
    let start = lines.iter().position(|l| l == "```").expect("a doctest") + 1;
    let end = start + lines[start..].iter().position(|l| l == "```").expect("its end");
    lines[start..end].iter().map(|l| format!("{l}\n")).collect()
}

#[test]
fn the_readme_snippet_is_the_doctest_that_runs() {
    assert_eq!(readme_snippet(), doctest());
}
