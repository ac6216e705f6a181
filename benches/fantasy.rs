//! Fantasy conditioning (seed 000, Algorithm 2): one fantasy point added to a
//! posterior for m ∈ {50, 100, 200}, over its own `Z` or with `Z` grown by
//! the point (which copies `L` and `S` one size up), and a batch of 3 proposed by expected
//! improvement over the unit box at m = 100, d = 6 (Z grown, as `suggest` does; 2048 Sobol candidates,
//! the best 4 refined by 40 gradient steps, each point fantasised).
//!
//! Criterion measures; the means are printed as a Markdown table with GFLOP/s
//! against the `5m² + m(3d + 10)` flops one conditioning needs, and written
//! to `target/bench-fantasy.json`.

use std::hint::black_box;
#[path = "support/criterion_results.rs"]
mod criterion_results;

use criterion_results::{mean_ns, write_report};

use criterion::{BenchmarkId, Criterion};
use dualgp::model::dual::estep::e_step;
use dualgp::model::fantasy::{propose_batch, Acquisition, Conditioned, Fantasy, Search, Site, Surrogate};
use dualgp::model::{Data, DualPosterior, EStepConfig, Family, Kernel, Likelihood, PointSites};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const D: usize = 6;
const SIZES: [usize; 3] = [50, 100, 200];

/// A Gaussian posterior over `m` inducing inputs after 500 points of a smooth function in the unit cube.
fn posterior(m: usize) -> (DualPosterior, ChaCha8Rng) {
    let mut rng = ChaCha8Rng::seed_from_u64(m as u64);
    let x = DMatrix::<f64>::from_fn(500, D, |_, _| rng.random());
    let y = DVector::from_fn(500, |i, _| (3.0 * x[(i, 0)]).sin() + x[(i, 1)] * x[(i, 2)]);
    let data = Data::new(x, y).unwrap();
    let z = DMatrix::from_fn(m, D, |_, _| rng.random());
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.4; D]);
    let likelihood = gaussian();
    let mut post = DualPosterior::new(kernel, z, 1).unwrap();
    let mut sites = PointSites::zeros(500, 1);
    e_step(
        &mut post,
        &likelihood,
        &data,
        &mut sites,
        &EStepConfig { steps: 1, rho: 1.0 },
    )
    .unwrap();
    (post, rng)
}

fn gaussian() -> Likelihood {
    Likelihood::Gaussian { variance: 0.01 }
}

fn conditioning_flops(m: usize) -> f64 {
    let m = m as f64;
    5.0 * m * m + m * (3.0 * D as f64 + 10.0)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("fantasy");
    for m in SIZES {
        let (post, mut rng) = posterior(m);
        let x: Vec<f64> = (0..D).map(|_| rng.random()).collect();
        let site = Site {
            lambda1: vec![0.3 / 0.01],
            beta: vec![1.0 / 0.01],
        };
        let fixed = Conditioned::new(&post, gaussian()).unwrap();
        let growing = Conditioned::growing(&post, gaussian()).unwrap();
        for (op, model) in [
            ("condition_one_point", fixed),
            ("condition_one_point_growing_z", growing),
        ] {
            group.bench_with_input(BenchmarkId::new(op, m), &m, |b, _| {
                b.iter_batched(
                    || model.clone(),
                    |mut model| model.condition(black_box(&x), black_box(&site)).unwrap(),
                    criterion::BatchSize::LargeInput,
                )
            });
        }
    }
    group.sample_size(10);
    let model = Conditioned::growing(&posterior(100).0, gaussian()).unwrap();
    let acquisition = Acquisition::ExpectedImprovement {
        model: 0,
        incumbent: -0.5,
        maximize: false,
    };
    let search = Search::in_box(vec![(0.0, 1.0); D]);
    group.bench_function(BenchmarkId::new("propose_batch_of_3", 100), |b| {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        b.iter(|| {
            let mut models: Vec<Box<dyn Surrogate>> = vec![Box::new(model.clone())];
            propose_batch(&mut models, &acquisition, 3, &search, Fantasy::Mean, &mut rng).unwrap()
        })
    });
    group.finish();
}

fn report() {
    let mut rows = Vec::new();
    println!("\n| operation | m | d | mean | GFLOP/s |\n|---|---|---|---|---|");
    for (op, name) in [
        ("condition_one_point", "condition one point"),
        ("condition_one_point_growing_z", "condition one point, Z grown"),
    ] {
        for m in SIZES {
            let Some(ns) = mean_ns("fantasy", op, m) else {
                continue;
            };
            let gflops = conditioning_flops(m) / ns;
            println!("| {name} | {m} | {D} | {:.2} µs | {gflops:.2} |", ns * 1e-3);
            rows.push(serde_json::json!({
                "operation": op, "m": m, "d": D, "seconds": ns * 1e-9,
                "flops": conditioning_flops(m), "gflops_per_second": gflops,
            }));
        }
    }
    if let Some(ns) = mean_ns("fantasy", "propose_batch_of_3", 100) {
        println!("| propose a batch of 3 (EI) | 100 | {D} | {:.1} ms | |", ns * 1e-6);
        rows.push(serde_json::json!({"operation": "propose_batch_of_3", "m": 100, "d": D, "seconds": ns * 1e-9}));
    }
    write_report("fantasy", &rows);
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    report();
}
