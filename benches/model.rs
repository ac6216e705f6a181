//! Model kernels: predict (mean and variance), one E-step iteration and one
//! M-step gradient, for m ∈ {50, 100, 200, 500}, d = 8, batches of 1000.
//!
//! Criterion measures; afterwards each result is turned into records per
//! second and GFLOP/s against the flop count the operation needs, printed as
//! a Markdown table and written to `target/bench-model.json`. Then, timed
//! one call at a time: the latency of scoring a single record (p50, p99;
//! what serving pays per record) and the GFLOP/s of a 512 × 512 GEMM, the
//! core's practical peak the table is read against; and the shares of that
//! peak predict and an E-step iteration reach at m = 100, each timed in turn
//! with the GEMM so that a machine whose speed drifts does not skew them.

use std::hint::black_box;
use std::time::Instant;
#[path = "support/criterion_results.rs"]
mod criterion_results;

use criterion_results::{mean_ns, write_report};

use criterion::{BenchmarkId, Criterion, Throughput};
use dualgp::model::dual::estep::e_step;
use dualgp::model::dual::objective::m_step_objective;
use dualgp::model::{Data, DualPosterior, EStepConfig, Family, Kernel, Likelihood, PointSites};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const D: usize = 8;
const BATCH: usize = 1000;
const SIZES: [usize; 4] = [50, 100, 200, 500];

/// Flops of one kernel evaluation in d dimensions (differences, squares, the Matérn profile).
fn kernel_flops(m: usize, n: usize) -> f64 {
    (m * n) as f64 * (3.0 * D as f64 + 10.0)
}

/// The work each operation needs, counted as multiply and add separately.
/// A triangular solve with n right-hand sides is m²n; a product A diag(w) Aᵀ is 2m²n.
fn flops(op: &str, m: usize, n: usize) -> f64 {
    let (m_, n_) = (m as f64, n as f64);
    match op {
        // K(Z,X), A = L⁻¹K_zx, L_D⁻¹A, aᵀm_v
        "predict" => kernel_flops(m, n) + 2.0 * m_ * m_ * n_ + 2.0 * m_ * n_,
        // predict, the site Gram product A diag(s2) Aᵀ, the Cholesky factor of I + P
        "e_step" => kernel_flops(m, n) + 4.0 * m_ * m_ * n_ + 2.0 * m_ * n_ + m_.powi(3) / 3.0,
        // predict, 2 m×m×n products for ∂/∂K_zx and ∂/∂K, kernel gradients, O(m³) terms
        "m_step_gradient" => 3.0 * kernel_flops(m, n) + 6.0 * m_ * m_ * n_ + 12.0 * m_.powi(3),
        _ => unreachable!(),
    }
}

fn problem(m: usize) -> (DualPosterior, Likelihood, Data) {
    let mut rng = ChaCha8Rng::seed_from_u64(m as u64);
    let x = DMatrix::<f64>::from_fn(BATCH, D, |_, _| rng.random_range(-2.0..2.0));
    let y = DVector::from_fn(BATCH, |i, _| x[(i, 0)].sin() + 0.1 * rng.random::<f64>());
    let data = Data::new(x, y).unwrap();
    let z = DMatrix::from_fn(m, D, |_, _| rng.random_range(-2.0..2.0));
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![1.5]);
    let lik = Likelihood::Gaussian { variance: 0.1 };
    let mut post = DualPosterior::new(kernel, z, 1).unwrap();
    let mut sites = PointSites::zeros(BATCH, 1);
    e_step(&mut post, &lik, &data, &mut sites, &EStepConfig { steps: 1, rho: 1.0 }).unwrap();
    (post, lik, data)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("model");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(20);
    for m in SIZES {
        let (post, lik, data) = problem(m);
        group.bench_with_input(BenchmarkId::new("predict", m), &m, |b, _| {
            b.iter(|| black_box(post.predict_f(black_box(data.x()))))
        });
        group.bench_with_input(BenchmarkId::new("e_step", m), &m, |b, _| {
            let config = EStepConfig { steps: 1, rho: 0.5 };
            b.iter_batched(
                || (post.clone(), PointSites::zeros(BATCH, 1)),
                |(mut p, mut sites)| e_step(&mut p, &lik, &data, &mut sites, &config).unwrap(),
                criterion::BatchSize::SmallInput,
            )
        });
        group.bench_with_input(BenchmarkId::new("m_step_gradient", m), &m, |b, _| {
            b.iter(|| black_box(m_step_objective(&post, &lik, &data, None).unwrap()))
        });
    }
    group.finish();
}

/// The criterion results as a table; the rows for the JSON report.
fn report() -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    println!("\n| operation | m | records/s | GFLOP needed | GFLOP/s |\n|---|---|---|---|---|");
    for op in ["predict", "e_step", "m_step_gradient"] {
        for m in SIZES {
            let Some(ns) = mean_ns("model", op, m) else { continue };
            let f = flops(op, m, BATCH);
            let records_per_s = BATCH as f64 / (ns * 1e-9);
            println!("| {op} | {m} | {records_per_s:.0} | {:.4} | {:.2} |", f * 1e-9, f / ns);
            rows.push(serde_json::json!({
                "operation": op, "m": m, "d": D, "batch": BATCH, "seconds": ns * 1e-9,
                "records_per_second": records_per_s, "flops": f, "gflops_per_second": f / ns,
            }));
        }
    }
    rows
}

/// Single-record scoring latencies in µs at `m`: p50, p99, max over 20 000 calls.
fn single_record_latency(m: usize) -> (f64, f64, f64) {
    let (post, _, data) = problem(m);
    let mut micros: Vec<f64> = (0..20_000)
        .map(|i| {
            let x = data.x().rows(i % BATCH, 1).into_owned();
            let start = Instant::now();
            black_box(post.predict_f(black_box(&x)));
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99), at(1.0))
}

/// The shortest of `runs` calls of `call`, each after `setup` (not timed), in seconds.
fn fastest<T>(runs: usize, mut setup: impl FnMut() -> T, mut call: impl FnMut(T)) -> f64 {
    (0..runs)
        .map(|_| {
            let input = setup();
            let start = Instant::now();
            call(input);
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// GFLOP/s of `C = A B` for 512 × 512 matrices, best of `runs`.
fn gemm_peak(runs: usize) -> f64 {
    let n = 512;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let a = DMatrix::<f64>::from_fn(n, n, |_, _| rng.random_range(-1.0..1.0));
    let b = DMatrix::<f64>::from_fn(n, n, |_, _| rng.random_range(-1.0..1.0));
    let mut c = DMatrix::<f64>::zeros(n, n);
    let seconds = fastest(
        runs,
        || (),
        |_| {
            c.gemm(1.0, &a, &b, 0.0);
            black_box(&c);
        },
    );
    2.0 * (n * n * n) as f64 / seconds * 1e-9
}

/// Rounds of the roofline's measurement: each times the GEMM, predict and an
/// E-step iteration in turn, best of a few calls each.
const ROOFLINE_ROUNDS: usize = 15;

/// The shares of the GEMM peak that predict and an E-step iteration reach
/// at `m`: per round each operation's GFLOP/s over that round's peak, then
/// the median over the rounds (so that drift between rounds cancels).
fn roofline_shares(m: usize) -> (f64, f64) {
    let (post, lik, data) = problem(m);
    let config = EStepConfig { steps: 1, rho: 0.5 };
    let (mut predict, mut e_step_shares) = (Vec::new(), Vec::new());
    for _ in 0..ROOFLINE_ROUNDS {
        let peak = gemm_peak(3);
        let seconds = fastest(
            5,
            || (),
            |_| {
                black_box(post.predict_f(black_box(data.x())));
            },
        );
        predict.push(flops("predict", m, BATCH) / seconds * 1e-9 / peak);
        let seconds = fastest(
            5,
            || (post.clone(), PointSites::zeros(BATCH, 1)),
            |(mut p, mut sites)| {
                e_step(&mut p, &lik, &data, &mut sites, &config).unwrap();
            },
        );
        e_step_shares.push(flops("e_step", m, BATCH) / seconds * 1e-9 / peak);
    }
    (median(predict), median(e_step_shares))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    let mut rows = report();
    // Only `cargo bench` passes --bench; the test harness's quick run skips the timing loops.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    println!("\n| one record at a time | m | p50 µs | p99 µs | max µs |\n|---|---|---|---|---|");
    for m in SIZES {
        let (p50, p99, max) = single_record_latency(m);
        println!("| predict | {m} | {p50:.1} | {p99:.1} | {max:.1} |");
        rows.push(serde_json::json!({
            "operation": "predict_one_record", "m": m, "d": D,
            "p50_us": p50, "p99_us": p99, "max_us": max,
        }));
    }
    let peak = gemm_peak(5);
    println!("\n512 × 512 GEMM (matrixmultiply, one thread): {peak:.1} GFLOP/s");
    rows.push(serde_json::json!({ "operation": "gemm_512", "gflops_per_second": peak }));
    let m = 100;
    let (predict, e_step_share) = roofline_shares(m);
    println!(
        "At m = {m}, the median over {ROOFLINE_ROUNDS} rounds of each operation's share of the \
         GEMM peak timed beside it: predict {:.0} %, an E-step iteration {:.0} %",
        predict * 100.0,
        e_step_share * 100.0
    );
    rows.push(serde_json::json!({
        "operation": "share_of_gemm_peak", "m": m, "rounds": ROOFLINE_ROUNDS,
        "predict": predict, "e_step": e_step_share,
    }));
    write_report("model", &rows);
}
