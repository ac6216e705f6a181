//! The offline trainer's optimisers reach the same fit: Adam on minibatches
//! against L-BFGS on the full batch, and both against the collapsed optimum.

use dualgp_operators::model::{
    evaluate, fit_offline, Data, EStepConfig, Family, InducingUpdate, Kernel, Likelihood, Link, OfflineConfig,
    Optimizer,
};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn sine_data(n: usize, rng: &mut ChaCha8Rng) -> Data {
    let x = DMatrix::<f64>::from_fn(n, 1, |_, _| rng.random_range(-4.0..4.0));
    let y = DVector::from_fn(n, |i, _| {
        (2.0 * x[(i, 0)]).sin() + 0.2 * (rng.random::<f64>() - 0.5) * 3.46
    });
    Data::new(x, y).unwrap()
}

#[test]
fn adam_on_minibatches_and_lbfgs_on_the_full_batch_agree() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (train, test) = (sine_data(600, &mut rng), sine_data(400, &mut rng));
    let kernel = Kernel::stationary(Family::SquaredExponential, 1.0, vec![1.0]);
    let lik = Likelihood::Gaussian { variance: 0.5 };

    let lbfgs = fit_offline(kernel.clone(), lik.clone(), &train, 20, &OfflineConfig::default()).unwrap();
    let adam_config = OfflineConfig {
        rounds: 150,
        e_step: EStepConfig { steps: 1, rho: 1.0 },
        m_steps: 5,
        optimizer: Optimizer::Adam { lr: 0.05 },
        minibatch: Some(200),
        inducing: InducingUpdate::Fixed,
        pivot: Default::default(),
        seed: 1,
        threads: 1,
    };
    let adam = fit_offline(kernel, lik, &train, 20, &adam_config).unwrap();

    let noise = |m: &Likelihood| match m {
        Likelihood::Gaussian { variance } => *variance,
        _ => unreachable!(),
    };
    // The generating noise variance is 0.2² = 0.04.
    for model in [&lbfgs, &adam] {
        let v = noise(&model.likelihood);
        assert!((v - 0.04).abs() < 0.01, "noise variance {v}");
    }
    let (a, b) = (
        evaluate(&lbfgs.posterior, &lbfgs.likelihood, &test).unwrap(),
        evaluate(&adam.posterior, &adam.likelihood, &test).unwrap(),
    );
    assert!((a.nlpd - b.nlpd).abs() < 0.05, "L-BFGS {a:?} vs Adam {b:?}");
    assert!(a.rmse.unwrap() < 0.25 && b.rmse.unwrap() < 0.25, "{a:?} {b:?}");
    // The L-BFGS objective never decreases from round to round by more than rounding.
    for pair in lbfgs.objective.windows(2) {
        assert!(pair[1] >= pair[0] - 1e-6 * pair[0].abs(), "{:?}", lbfgs.objective);
    }
}

/// The points are summed in fixed blocks whatever the number of threads, so
/// a non-conjugate fit, `Z` learned, takes the same line-search branches and
/// ends on the same bits.
#[test]
fn the_fit_is_the_same_on_any_number_of_threads() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let x = DMatrix::<f64>::from_fn(300, 2, |_, _| rng.random_range(-2.0..2.0));
    let y = DVector::from_fn(300, |i, _| {
        f64::from(x[(i, 0)] * x[(i, 1)] + 0.3 * rng.random::<f64>() > 0.0)
    });
    let data = Data::new(x, y).unwrap();
    let kernel = Kernel::stationary(Family::SquaredExponential, 1.0, vec![1.0, 1.0]);
    let lik = Likelihood::Bernoulli { link: Link::Probit };
    let fit = |threads| {
        let config = OfflineConfig {
            m_steps: 8,
            rounds: 2,
            threads,
            ..OfflineConfig::default()
        };
        fit_offline(kernel.clone(), lik.clone(), &data, 15, &config).unwrap()
    };
    let one = fit(1);
    for threads in [2, 3] {
        let other = fit(threads);
        assert_eq!(one.objective, other.objective, "{threads} threads");
        assert_eq!(one.posterior.z, other.posterior.z, "{threads} threads");
        assert_eq!(one.posterior.whitened, other.posterior.whitened, "{threads} threads");
    }
}
