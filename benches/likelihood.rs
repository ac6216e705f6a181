//! One call of each likelihood's expectation `E_q[log p]` with its
//! derivatives (the E-step's per-point, per-latent work beside the O(m²)
//! algebra), in nanoseconds per call; run with `cargo bench --bench likelihood`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput};
use dualgp::model::likelihood::Expectation;
use dualgp::model::Likelihood;

const CALLS: usize = 1000;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("likelihood_expectation");
    group.throughput(Throughput::Elements(CALLS as u64));
    for name in [
        "gaussian",
        "poisson",
        "bernoulli",
        "bernoulli:logit",
        "student-t",
        "softmax:3",
    ] {
        let likelihood = Likelihood::parse(name).unwrap();
        let n = likelihood.n_latent();
        let (mean, var) = (vec![0.3; n], vec![0.7; n]);
        let mut out = Expectation::default();
        group.bench_with_input(BenchmarkId::from_parameter(name), &likelihood, |b, lik| {
            b.iter(|| {
                for i in 0..CALLS {
                    lik.expectation(&mean, &var, (i % 2) as f64, &mut out);
                    black_box(out.value);
                }
            })
        });
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
