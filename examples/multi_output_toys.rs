//! Writes the multi-output streams of `scripts/multi_output.sh` into a
//! directory: the heterogeneous stream (train and test), and its
//! output 1 alone (what a single-output learner of that channel sees).
//!
//!     cargo run --release --example multi_output_toys -- DIR [N_TRAIN] [SEED]

use std::path::PathBuf;

use dualgp_pipelines::toys::{heterogeneous, only_output, write};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "multi-output-toys".into()));
    let n: usize = args.next().map_or(Ok(2000), |s| s.parse())?;
    let seed: u64 = args.next().map_or(Ok(0), |s| s.parse())?;
    std::fs::create_dir_all(&dir)?;
    let train = heterogeneous(n, seed);
    let test = heterogeneous(n / 2, seed + 1000);
    write(&dir.join("heterogeneous_train.parquet"), &train)?;
    write(&dir.join("heterogeneous_test.parquet"), &test)?;
    write(
        &dir.join("heterogeneous_train_output1.parquet"),
        &only_output(&train, 1),
    )?;
    write(&dir.join("heterogeneous_test_output1.parquet"), &only_output(&test, 1))?;
    println!("wrote {} train and {} test rows to {}", n, n / 2, dir.display());
    Ok(())
}
