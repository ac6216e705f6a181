//! The per-point stage of a multi-output model (D = 3 outputs: Gaussian,
//! Bernoulli, Poisson; Q = 2 latents; m = 50 inducing inputs spread over the
//! outputs; d = 4; batches of 1000): one E-step iteration and one M-step
//! gradient, beside the single-output Gaussian model at the same m, so that
//! the cost per record can be read as a multiple of it. A record's site is
//! one site over all m inducing values (m² work, as for one output); the
//! coregional kernel evaluates Q latent kernels for each entry of K(Z, X).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput};
use dualgp::model::data::with_output_column;
use dualgp::model::dual::estep::e_step;
use dualgp::model::dual::objective::m_step_objective;
use dualgp::model::{Data, DualPosterior, EStepConfig, Family, Kernel, Likelihood, Link, MultiOutput, PointSites};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const D_IN: usize = 4;
const BATCH: usize = 1000;
const M: usize = 50;

fn problem(lik: &Likelihood) -> (DualPosterior, Data) {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let x = DMatrix::<f64>::from_fn(BATCH, D_IN, |_, _| rng.random_range(-2.0..2.0));
    let outputs: Vec<usize> = (0..BATCH).map(|i| i % lik.n_outputs()).collect();
    let y = DVector::from_fn(BATCH, |i, _| match outputs[i] {
        0 => x[(i, 0)].sin() + 0.1 * rng.random::<f64>(),
        1 => f64::from(x[(i, 1)] > 0.0),
        _ => (x[(i, 2)].abs() * 2.0).floor(),
    });
    let data = Data::for_model(lik, x, y, outputs).unwrap();
    let mut z = DMatrix::from_fn(M, D_IN, |_, _| rng.random_range(-2.0..2.0));
    let mut kernel = Kernel::stationary(Family::Matern52, 1.0, vec![1.5]);
    if let Likelihood::MultiOutput(multi) = lik {
        kernel = Kernel::coregional(kernel, multi.latents, multi.n_outputs());
        z = with_output_column(&z, |i| i % multi.n_outputs());
    }
    let mut post = DualPosterior::new(kernel, z, lik.n_latent()).unwrap();
    let mut sites = PointSites::zeros(BATCH, lik.n_latent());
    e_step(&mut post, lik, &data, &mut sites, &EStepConfig { steps: 2, rho: 0.5 }).unwrap();
    (post, data)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("multi_output");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(20);
    let gaussian = Likelihood::Gaussian { variance: 0.1 };
    let outputs = vec![
        gaussian.clone(),
        Likelihood::Bernoulli { link: Link::Probit },
        Likelihood::Poisson,
    ];
    let models = [
        ("single_gaussian", gaussian.clone()),
        (
            "d3_q2",
            Likelihood::MultiOutput(Box::new(MultiOutput::new(outputs, 2).unwrap())),
        ),
        // The same model with Gaussian outputs: the coregional kernel's cost
        // apart from the quadrature Bernoulli and Poisson outputs need.
        (
            "d3_q2_gaussian",
            Likelihood::MultiOutput(Box::new(MultiOutput::new(vec![gaussian; 3], 2).unwrap())),
        ),
    ];
    for (name, lik) in models {
        let (post, data) = problem(&lik);
        let n_latent = lik.n_latent();
        group.bench_with_input(BenchmarkId::new("e_step", name), &name, |b, _| {
            let config = EStepConfig { steps: 1, rho: 0.5 };
            b.iter_batched(
                || (post.clone(), PointSites::zeros(BATCH, n_latent)),
                |(mut p, mut sites)| e_step(&mut p, &lik, &data, &mut sites, &config).unwrap(),
                criterion::BatchSize::SmallInput,
            )
        });
        group.bench_with_input(BenchmarkId::new("m_step_gradient", name), &name, |b, _| {
            b.iter(|| black_box(m_step_objective(&post, &lik, &data, None).unwrap()))
        });
    }
    group.finish();
}

criterion::criterion_group!(benches, bench);
criterion::criterion_main!(benches);
