//! Writes the multi-output streams of `scripts/multi_output.sh` and
//! `scripts/seed_002.sh` into a directory: the heterogeneous stream
//! (train and test), its output 1 alone (what a single-output learner of
//! that channel sees) and `heterogeneous_oracle.json`, the test NLPD of
//! output 1 under its true latent; seed 002's streaming toy (Table 1), its synchronous
//! two-channel toy (Table 5) and that toy's channels taking turns (Fig. 8),
//! test rows marked with their region of x (`task`), one test file per
//! output; and `scales.json`, the training targets' standard deviations
//! eval standardises with (a standardised NLPD plus ln sd is the data's).
//!
//!     cargo run --release --example multi_output_toys -- DIR [N_TRAIN] [SEED] [N_TEST]
//!
//! N_TRAIN and N_TEST (default N_TRAIN / 2) size the heterogeneous stream
//! only; the seed's toys have the seed's N = 2000 inputs, 70 % for training.

use std::path::{Path, PathBuf};

use dualgp_pipelines::toys::{
    alternating_channels, heterogeneous, heterogeneous_oracle_nlpd, of_output, only_output, streaming_toy,
    target_scale, two_channels, write, Rows,
};

/// Seed 002's toys: 2000 inputs, 30 % of them test rows.
const SEED_TRAIN_SHARE: f64 = 0.7;
const SEED_INPUTS: usize = 2000;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "multi-output-toys".into()));
    let n: usize = args.next().map_or(Ok(2000), |s| s.parse())?;
    let seed: u64 = args.next().map_or(Ok(0), |s| s.parse())?;
    let n_test: usize = args.next().map_or(Ok(n / 2), |s| s.parse())?;
    std::fs::create_dir_all(&dir)?;
    let train = heterogeneous(n, seed);
    let test = heterogeneous(n_test, seed + 1000);
    let oracle = serde_json::json!({ "output1_test_nlpd": heterogeneous_oracle_nlpd(&test) });
    std::fs::write(dir.join("heterogeneous_oracle.json"), oracle.to_string())?;
    write(&dir.join("heterogeneous_train.parquet"), &train)?;
    write(&dir.join("heterogeneous_test.parquet"), &test)?;
    write(
        &dir.join("heterogeneous_train_output1.parquet"),
        &only_output(&train, 1),
    )?;
    write(&dir.join("heterogeneous_test_output1.parquet"), &only_output(&test, 1))?;

    let per_region = |regions: usize, share: f64| (SEED_INPUTS as f64 * share / regions as f64).round() as usize;
    let (train, test) = (
        streaming_toy(10, per_region(10, SEED_TRAIN_SHARE), seed),
        streaming_toy(10, per_region(10, 1.0 - SEED_TRAIN_SHARE), seed + 1000),
    );
    write(&dir.join("seed_streaming_train.parquet"), &train)?;
    write(&dir.join("seed_streaming_test.parquet"), &test)?;
    let streaming_sd = target_scale(&train, 0).1;

    let (train, test) = (
        two_channels(5, per_region(5, SEED_TRAIN_SHARE), seed),
        two_channels(5, per_region(5, 1.0 - SEED_TRAIN_SHARE), seed + 1000),
    );
    let alternating = alternating_channels(&train);
    write(&dir.join("two_channel_train.parquet"), &train)?;
    write(&dir.join("alternating_train.parquet"), &alternating)?;
    write_by_output(&dir, "two_channel_test", &test)?;
    let sds = |rows: &Rows| [target_scale(rows, 0).1, target_scale(rows, 1).1];
    let scales = serde_json::json!({
        "seed_streaming": streaming_sd,
        "two_channel": sds(&train),
        "alternating": sds(&alternating),
    });
    std::fs::write(dir.join("scales.json"), scales.to_string())?;
    println!("wrote the multi-output toys to {}", dir.display());
    Ok(())
}

/// One test file per output (`{stem}_output{d}.parquet`), keeping the output index.
fn write_by_output(dir: &Path, stem: &str, rows: &Rows) -> anyhow::Result<()> {
    for d in 0..2 {
        write(&dir.join(format!("{stem}_output{d}.parquet")), &of_output(rows, d))?;
    }
    Ok(())
}
