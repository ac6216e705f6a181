//! Fantasy conditioning and Algorithm 2 against closed forms: the sparse
//! Gaussian posterior with points added (Titsias' optimal q(u)), the exact GP
//! where the inducing inputs cover every point, the mean fantasy's fixed mean,
//! and every gradient against central differences.

mod common;

use common::{se, uniform, NOISE, VARIANCE};
use dualgp_operators::model::fantasy::{
    fantasy_site, propose_batch, Acquisition, Conditioned, ExactGp, Fantasy, Search, Site, Surrogate,
};
use dualgp_operators::model::{DualPosterior, Likelihood, Link};
use nalgebra::{DMatrix, DVector};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn rows(x: &DMatrix<f64>) -> Vec<Vec<f64>> {
    x.row_iter().map(|r| r.iter().copied().collect()).collect()
}

/// The prior over `z` conditioned on `(x_i, y_i)` one observation at a time.
fn observed(z: &DMatrix<f64>, likelihood: &Likelihood, x: &DMatrix<f64>, y: &[f64]) -> Conditioned {
    let prior = DualPosterior::new(common::kernel(), z.clone(), likelihood.n_latent()).unwrap();
    let mut post = Conditioned::new(&prior, likelihood.clone()).unwrap();
    for (xi, &yi) in rows(x).iter().zip(y) {
        let at = post.point_marginals(xi);
        post.condition(xi, &Site::observed(likelihood, &at.mean, &at.var, yi))
            .unwrap();
    }
    post
}

/// Titsias' optimal sparse posterior for a Gaussian likelihood, predicted at
/// `x_star`: mean `k*ᵀ Σ K_uf y / σ²`, variance `k** − k*ᵀK⁻¹k* + k*ᵀΣk*`,
/// `Σ = (K + K_uf K_fu / σ²)⁻¹`.
fn titsias(z: &DMatrix<f64>, x: &DMatrix<f64>, y: &[f64], x_star: &DMatrix<f64>) -> (DVector<f64>, DVector<f64>) {
    let jitter = 1e-6 * VARIANCE;
    let k = se(z, z) + DMatrix::identity(z.nrows(), z.nrows()) * jitter;
    let kuf = se(z, x);
    let kus = se(z, x_star);
    let sigma = (&k + &kuf * kuf.transpose() / NOISE).try_inverse().unwrap();
    let mean = kus.transpose() * (&sigma * (&kuf * DVector::from_column_slice(y)) / NOISE);
    let k_inv = k.try_inverse().unwrap();
    let var = DVector::from_fn(x_star.nrows(), |i, _| {
        let ks = kus.column(i);
        VARIANCE - (ks.transpose() * &k_inv * ks)[0] + (ks.transpose() * &sigma * ks)[0]
    });
    (mean, var)
}

fn assert_close(got: &DVector<f64>, want: &DVector<f64>, tol: f64, what: &str) {
    let worst = (got - want).amax();
    assert!(worst <= tol, "{what}: off by {worst:e}\n got {got}\nwant {want}");
}

fn gaussian() -> Likelihood {
    Likelihood::Gaussian { variance: NOISE }
}

#[test]
fn gaussian_conditioning_is_the_sparse_posterior_with_the_points_added() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (x, z, fantasy, x_star) = (
        uniform(&mut rng, 25, 2, 2.0),
        uniform(&mut rng, 8, 2, 2.0),
        uniform(&mut rng, 4, 2, 2.0),
        uniform(&mut rng, 30, 2, 2.5),
    );
    let y: Vec<f64> = x.row_iter().map(|r| r[0].sin() + 0.3 * r[1]).collect();
    let y_fantasy = [0.4, -1.2, 2.0, 0.0];
    let mut post = observed(&z, &gaussian(), &x, &y);
    for (xi, &yi) in rows(&fantasy).iter().zip(&y_fantasy) {
        let at = post.point_marginals(xi);
        post.condition(xi, &Site::observed(&gaussian(), &at.mean, &at.var, yi))
            .unwrap();
    }
    let all_x = DMatrix::from_rows(&x.row_iter().chain(fantasy.row_iter()).collect::<Vec<_>>());
    let all_y: Vec<f64> = y.iter().chain(&y_fantasy).copied().collect();
    let (mean, var) = titsias(&z, &all_x, &all_y, &x_star);
    let got = post.marginals(&x_star);
    assert_close(&got.mean.column(0).into_owned(), &mean, 1e-7, "conditioned mean");
    assert_close(&got.var.column(0).into_owned(), &var, 1e-7, "conditioned variance");
    // The same sites added to the whitened totals, as a learner holds them.
    let totals = post.posterior().unwrap().predict_f(&x_star);
    assert_close(&totals.mean.column(0).into_owned(), &mean, 1e-7, "totals' mean");
    assert_close(&totals.var.column(0).into_owned(), &var, 1e-7, "totals' variance");
}

/// The exact GP written out: `k*ᵀ(K + σ²I)⁻¹y`, `k** − k*ᵀ(K + σ²I)⁻¹k*`.
fn exact_gp(x: &DMatrix<f64>, y: &[f64], x_star: &DMatrix<f64>) -> (DVector<f64>, DVector<f64>) {
    let k_inv = (se(x, x) + DMatrix::identity(x.nrows(), x.nrows()) * NOISE)
        .try_inverse()
        .unwrap();
    let ks = se(x, x_star);
    let mean = ks.transpose() * &k_inv * DVector::from_column_slice(y);
    let var = DVector::from_fn(x_star.nrows(), |i, _| {
        VARIANCE - (ks.column(i).transpose() * &k_inv * ks.column(i))[0]
    });
    (mean, var)
}

#[test]
fn where_the_inducing_inputs_cover_or_grow_to_every_point_conditioning_is_exact_gp_regression() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (x, fantasy, x_star) = (
        uniform(&mut rng, 12, 2, 2.0),
        uniform(&mut rng, 3, 2, 2.0),
        uniform(&mut rng, 20, 2, 2.5),
    );
    let y: Vec<f64> = x.row_iter().map(|r| (2.0 * r[0]).cos() - r[1]).collect();
    let y_fantasy = [0.5, -0.3, 1.1];
    let all_x = DMatrix::from_rows(&x.row_iter().chain(fantasy.row_iter()).collect::<Vec<_>>());
    // Z covers the data and the fantasies; or only the data, and the
    // fantasies' inputs join it as they come.
    let mut covering = observed(&all_x, &gaussian(), &x, &y);
    let prior = DualPosterior::new(common::kernel(), x.clone(), 1).unwrap();
    let mut growing = Conditioned::growing(&prior, gaussian()).unwrap();
    for (xi, &yi) in rows(&x).iter().zip(&y) {
        let at = growing.point_marginals(xi);
        let site = Site::observed(&gaussian(), &at.mean, &at.var, yi);
        growing.condition(xi, &site).unwrap();
    }
    let mut fixed = Conditioned::new(&growing.posterior().unwrap(), gaussian()).unwrap();
    let mut exact = ExactGp::new(common::kernel(), NOISE, x.clone(), DVector::from_vec(y.clone())).unwrap();
    for (xi, &yi) in rows(&fantasy).iter().zip(&y_fantasy) {
        for model in [
            &mut covering as &mut dyn Surrogate,
            &mut growing,
            &mut fixed,
            &mut exact,
        ] {
            let at = model.point_marginals(xi);
            let site = Site::observed(&gaussian(), &at.mean, &at.var, yi);
            model.condition(xi, &site).unwrap();
        }
    }
    let all_y: Vec<f64> = y.iter().chain(&y_fantasy).copied().collect();
    let (mean, var) = exact_gp(&all_x, &all_y, &x_star);
    let mut checked: Vec<(&str, _)> = [
        ("covering", &covering as &dyn Surrogate),
        ("growing", &growing),
        ("exact", &exact),
    ]
    .into_iter()
    .map(|(what, model)| (what, model.marginals(&x_star)))
    .collect();
    checked.push(("growing's totals", growing.posterior().unwrap().predict_f(&x_star)));
    for (what, got) in checked {
        assert_close(&got.mean.column(0).into_owned(), &mean, 1e-5, &format!("{what} mean"));
        assert_close(&got.var.column(0).into_owned(), &var, 1e-5, &format!("{what} variance"));
    }
    // With Z held at the data, a fantasy sees only its projection on Z.
    let held = fixed.marginals(&x_star).var.column(0).into_owned();
    assert!((held - &var).amax() > 1e-3, "Z held at the data conditioned exactly");
}

/// A model with some data: Gaussian regression, or classes labelled by sign.
fn trained(likelihood: &Likelihood, seed: u64) -> Conditioned {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (x, z) = (uniform(&mut rng, 30, 2, 2.0), uniform(&mut rng, 10, 2, 2.0));
    let y: Vec<f64> = x
        .row_iter()
        .map(|r| match likelihood {
            Likelihood::Gaussian { .. } => r[0].sin() + 0.5 * r[1],
            Likelihood::Poisson => (1.0 + r[0]).exp().round(),
            Likelihood::Softmax { classes, .. } => ((r[0] + 2.0) / 4.0 * *classes as f64)
                .floor()
                .min(*classes as f64 - 1.0),
            _ => f64::from(r[0] + r[1] > 0.0),
        })
        .collect();
    // Site::observed is one E-step per point: a posterior, if not the optimal one.
    observed(&z, likelihood, &x, &y)
}

fn likelihoods() -> Vec<Likelihood> {
    vec![
        gaussian(),
        Likelihood::Bernoulli { link: Link::Logit },
        Likelihood::Bernoulli { link: Link::Probit },
        Likelihood::Poisson,
        Likelihood::StudentT { df: 4.0, scale: 0.3 },
        Likelihood::parse("softmax:3").unwrap(),
    ]
}

#[test]
fn a_mean_fantasy_keeps_the_mean_and_shrinks_the_variance() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let x_star = uniform(&mut rng, 40, 2, 2.5);
    let at = [0.3, -0.4];
    for likelihood in likelihoods() {
        let mut post = trained(&likelihood, 4);
        let before = post.marginals(&x_star);
        let m = post.point_marginals(&at);
        let (site, _) = fantasy_site(&likelihood, &m.mean, &m.var, Fantasy::Mean, &mut rng);
        post.condition(&at, &site).unwrap();
        let after = post.marginals(&x_star);
        let name = likelihood.name();
        // The mean stays where the E-step's α̂ vanishes at the fantasy: a
        // Gaussian, Student-t (symmetric) and Poisson at their means, a
        // logit link at its predictive probability. Probit and softmax move
        // it a little; their variance still shrinks.
        if !matches!(
            likelihood,
            Likelihood::Bernoulli { link: Link::Probit } | Likelihood::Softmax { .. }
        ) {
            let moved = (&after.mean - &before.mean).amax();
            assert!(moved < 1e-8, "{name}: the mean fantasy moved the mean by {moved:e}");
        }
        let grew = (&after.var - &before.var).max();
        assert!(grew <= 1e-12, "{name}: a variance grew by {grew:e}");
        let here = post.point_marginals(&at);
        for c in 0..m.var.len() {
            assert!(
                here.var[c] < 0.99 * m.var[c],
                "{name}: the variance at the fantasy stayed {} → {}",
                m.var[c],
                here.var[c]
            );
        }
    }
}

/// Central difference of a scalar function of a point.
fn finite_difference(f: impl Fn(&[f64]) -> f64, x: &[f64]) -> DVector<f64> {
    DVector::from_fn(x.len(), |j, _| {
        let h = 1e-5;
        let (mut up, mut down) = (x.to_vec(), x.to_vec());
        up[j] += h;
        down[j] -= h;
        (f(&up) - f(&down)) / (2.0 * h)
    })
}

fn assert_gradient(got: &DVector<f64>, want: &DVector<f64>, what: &str) {
    let tol = 1e-5 * (1.0 + want.amax());
    assert!(
        (got - want).amax() <= tol,
        "{what}: gradient {got} against differences {want}"
    );
}

#[test]
fn marginal_gradients_match_finite_differences() {
    let x = [0.7, -0.2];
    let mut models: Vec<(String, Box<dyn Surrogate>)> = likelihoods()
        .into_iter()
        .map(|lik| (lik.name(), Box::new(trained(&lik, 5)) as Box<dyn Surrogate>))
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let data = uniform(&mut rng, 10, 2, 2.0);
    let y = DVector::from_fn(10, |i, _| data[(i, 0)].cos());
    models.push((
        "exact".into(),
        Box::new(ExactGp::new(common::kernel(), NOISE, data, y).unwrap()),
    ));
    for (name, model) in &models {
        let at = model.point_marginals(&x);
        for c in 0..at.mean.len() {
            let mean = finite_difference(|p| model.point_marginals(p).mean[c], &x);
            let var = finite_difference(|p| model.point_marginals(p).var[c], &x);
            assert_gradient(&at.d_mean[c], &mean, &format!("{name} ∂μ/∂x"));
            assert_gradient(&at.d_var[c], &var, &format!("{name} ∂v/∂x"));
        }
    }
}

#[test]
fn acquisition_gradients_match_finite_differences() {
    let regression = trained(&gaussian(), 7);
    let classes = trained(&Likelihood::parse("softmax:3").unwrap(), 8);
    let feasible = trained(&Likelihood::Bernoulli { link: Link::Probit }, 9);
    let models: Vec<&dyn Surrogate> = vec![&regression, &feasible, &classes];
    let likelihoods: Vec<&Likelihood> = models.iter().map(|m| m.likelihood()).collect();
    let ei = Acquisition::ExpectedImprovement {
        model: 0,
        incumbent: -0.2,
        maximize: false,
    };
    let acquisitions = [
        ei.clone(),
        Acquisition::ExpectedImprovement {
            model: 0,
            incumbent: 0.4,
            maximize: true,
        },
        Acquisition::UpperConfidenceBound {
            model: 0,
            kappa: 2.0,
            maximize: false,
        },
        Acquisition::Entropy { model: 0 },
        Acquisition::Entropy { model: 1 },
        Acquisition::Entropy { model: 2 },
        Acquisition::Feasibility { model: 1 },
        Acquisition::Product(vec![ei, Acquisition::Feasibility { model: 1 }]),
    ];
    for acquisition in &acquisitions {
        acquisition.validate(&likelihoods).unwrap();
        for x in [[0.7, -0.2], [-1.1, 0.9], [0.1, 1.6]] {
            let value_at = |p: &[f64]| {
                let points: Vec<_> = models.iter().map(|m| m.point_marginals(p)).collect();
                acquisition.value_and_grad(&likelihoods, &points)
            };
            let (value, grad) = value_at(&x);
            assert!(value.is_finite(), "{acquisition:?} at {x:?}: {value}");
            let want = finite_difference(|p| value_at(p).0, &x);
            let tol = 1e-4 * (1.0 + want.amax());
            assert!(
                (&grad - &want).amax() <= tol,
                "{acquisition:?} at {x:?}: gradient {grad} against {want}"
            );
            // The batch form agrees with the point form.
            let row = DMatrix::from_row_slice(1, 2, &x);
            let marginals: Vec<_> = models.iter().map(|m| m.marginals(&row)).collect();
            let batch = acquisition.values(&likelihoods, &marginals)[0];
            assert!(
                (batch - value).abs() <= 1e-9 * (1.0 + value.abs()),
                "{acquisition:?}: {batch} against {value}"
            );
        }
    }
}

fn boxed(models: &[&Conditioned]) -> Vec<Box<dyn Surrogate>> {
    models
        .iter()
        .map(|m| Box::new((*m).clone()) as Box<dyn Surrogate>)
        .collect()
}

#[test]
fn a_batch_has_distinct_points_and_the_same_seed_gives_the_same_batch() {
    let regression = trained(&gaussian(), 10);
    let feasible = trained(&Likelihood::Bernoulli { link: Link::Logit }, 11);
    let bounds = vec![(-2.0, 2.0), (-1.0, 3.0)];
    let cases = [
        Acquisition::ExpectedImprovement {
            model: 0,
            incumbent: -1.0,
            maximize: false,
        },
        Acquisition::UpperConfidenceBound {
            model: 0,
            kappa: 2.0,
            maximize: true,
        },
        Acquisition::Entropy { model: 1 },
        Acquisition::Product(vec![
            Acquisition::ExpectedImprovement {
                model: 0,
                incumbent: -1.0,
                maximize: false,
            },
            Acquisition::Feasibility { model: 1 },
        ]),
    ];
    for acquisition in &cases {
        for fantasy in [Fantasy::Mean, Fantasy::Sample] {
            let run = |seed: u64| {
                let mut models = boxed(&[&regression, &feasible]);
                let search = Search::in_box(bounds.clone());
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                propose_batch(&mut models, acquisition, 5, &search, fantasy, &mut rng).unwrap()
            };
            let batch = run(1);
            assert_eq!(
                batch,
                run(1),
                "{acquisition:?} {fantasy:?}: the same seed gave another batch"
            );
            assert_ne!(
                batch,
                run(2),
                "{acquisition:?} {fantasy:?}: another seed gave the same batch"
            );
            for (i, p) in batch.iter().enumerate() {
                assert!(
                    p.x.iter().zip(&bounds).all(|(v, (lo, hi))| lo <= v && v <= hi),
                    "{p:?} left the box"
                );
                for q in &batch[..i] {
                    assert_ne!(p.x, q.x, "{acquisition:?} {fantasy:?}: a point twice in one batch");
                }
            }
        }
    }
    let pool = uniform(&mut ChaCha8Rng::seed_from_u64(12), 50, 2, 2.0);
    let mut models = boxed(&[&regression, &feasible]);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let batch = propose_batch(
        &mut models,
        &Acquisition::Entropy { model: 1 },
        10,
        &Search::Pool(pool.clone()),
        Fantasy::Mean,
        &mut rng,
    )
    .unwrap();
    let mut taken: Vec<usize> = batch.iter().map(|p| p.row.unwrap()).collect();
    for p in &batch {
        assert_eq!(p.x, pool.row(p.row.unwrap()).iter().copied().collect::<Vec<_>>());
    }
    taken.sort_unstable();
    taken.dedup();
    assert_eq!(taken.len(), 10, "a pool row twice in one batch");
}

#[test]
fn a_batch_is_refused_with_a_reason() {
    let regression = trained(&gaussian(), 13);
    let classes = trained(&Likelihood::Bernoulli { link: Link::Logit }, 14);
    let ei = Acquisition::ExpectedImprovement {
        model: 0,
        incumbent: 0.0,
        maximize: false,
    };
    let unit = Search::in_box(vec![(0.0, 1.0); 2]);
    let nan_box = Search::in_box(vec![(0.0, f64::NAN), (0.0, 1.0)]);
    let cases: Vec<(Search, usize, Acquisition, &Conditioned, &str)> = vec![
        (
            Search::in_box(vec![(1.0, 0.0), (0.0, 1.0)]),
            2,
            ei.clone(),
            &regression,
            "lower < upper",
        ),
        (
            Search::in_box(vec![(0.0, 1.0)]),
            2,
            ei.clone(),
            &regression,
            "1 bounds for 2 inputs",
        ),
        (nan_box, 2, ei.clone(), &regression, "finite"),
        (unit.clone(), 0, ei.clone(), &regression, "k ≥ 1"),
        (unit.clone(), 1, ei.clone(), &classes, "needs a model of real-valued"),
        (
            unit.clone(),
            1,
            Acquisition::Feasibility { model: 0 },
            &regression,
            "Bernoulli",
        ),
        (
            unit.clone(),
            1,
            Acquisition::Entropy { model: 3 },
            &regression,
            "model 3",
        ),
        (
            Search::Pool(DMatrix::from_element(2, 2, f64::INFINITY)),
            1,
            ei,
            &regression,
            "not finite",
        ),
    ];
    for (search, k, acquisition, model, says) in cases {
        let mut models = boxed(&[model]);
        let err = propose_batch(
            &mut models,
            &acquisition,
            k,
            &search,
            Fantasy::Mean,
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(says), "{err:?} does not say {says:?}");
    }
}
