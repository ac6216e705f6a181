//! VAR-GP's posterior over the hyperparameters (seed 004): the gradients of
//! the data term with every whitened `q(v)` held and of the θ step's Monte
//! Carlo objective against central finite differences, the log-normal KL
//! against Monte Carlo, the mixture predictive against its definition, and
//! the learner: a posterior pinned at the starting `θ` is the learner with
//! `θ` held, an empty task changes nothing, and on a stream whose starting
//! lengthscale is wrong `q(θ)` moves towards the data and predicts better.

mod common;

use dualgp_operators::model::baselines::var_gp::{
    held_whitened_data_term, standard_draws, under, ThetaConfig, ThetaPosterior, ThetaStep,
};
use dualgp_operators::model::{
    evaluate, evaluate_mixture, predict_mixture, Data, DualPosterior, EStepConfig, Family, Kernel, Likelihood, Link,
    Pivot, Predictive, StreamingLearner, VarGpConfig, VarGpLearner, VarGpTheta, VarGpVariant,
};
use nalgebra::{DMatrix, DVector};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use common::{assert_matches_finite_differences, task_inputs, uniform};

fn matern(lengthscales: Vec<f64>) -> Kernel {
    Kernel::stationary(Family::Matern52, 1.3, lengthscales)
}

fn config(theta: VarGpTheta) -> VarGpConfig {
    VarGpConfig {
        inducing: 8,
        pivot: Pivot::Variance,
        e_step: EStepConfig { steps: 200, rho: 1.0 },
        tolerance: 1e-10,
        theta,
        variant: VarGpVariant::Ar,
    }
}

/// Points with `x0` in `[lo, hi]` and `x1` in `[−1, 1]`; `f = sin(3 x0) + 0.5 x1`.
fn task(rng: &mut ChaCha8Rng, n: usize, lo: f64, hi: f64, classes: bool) -> Data {
    let x = task_inputs(rng, n, lo, hi);
    let y = DVector::from_fn(n, |i, _| {
        let f = (3.0 * x[(i, 0)]).sin() + 0.5 * x[(i, 1)];
        let noise: f64 = StandardNormal.sample(rng);
        if classes {
            f64::from(f + 0.3 * noise > 0.0)
        } else {
            f + 0.2 * noise
        }
    });
    Data::new(x, y).unwrap()
}

/// A learner with `θ` held after two tasks, and the second task's data.
fn two_tasks(likelihood: Likelihood) -> (VarGpLearner, Data) {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let classes = !matches!(likelihood, Likelihood::Gaussian { .. });
    let mut l = VarGpLearner::new(matern(vec![0.8, 1.7]), likelihood, config(VarGpTheta::Fixed)).unwrap();
    l.learn_batch(&task(&mut rng, 50, -2.0, 0.0, classes)).unwrap();
    let second = task(&mut rng, 50, 0.0, 2.0, classes);
    l.learn_batch(&second).unwrap();
    (l, second)
}

/// One block: `S` dense.
fn dense(post: &DualPosterior) -> Vec<std::ops::Range<usize>> {
    std::iter::once(0..post.m()).collect()
}

fn data_term(post: &DualPosterior, likelihood: &Likelihood, data: &Data, theta: &DVector<f64>) -> f64 {
    let (post, likelihood) = under(post, likelihood, theta).unwrap();
    held_whitened_data_term(&post, &dense(&post), &likelihood, data)
        .unwrap()
        .0
}

#[test]
fn the_held_whitened_data_terms_gradient_matches_finite_differences() {
    for likelihood in [
        Likelihood::Gaussian { variance: 0.07 },
        Likelihood::Bernoulli { link: Link::Probit },
    ] {
        let (l, second) = two_tasks(likelihood);
        let post = l.fitted().unwrap();
        let theta = ThetaPosterior::around(post, l.likelihood(), 1.0).mean;
        // Away from the point the blocks were learned at, where nothing cancels.
        let at = theta.map(|t| t + 0.3);
        let (post_at, lik_at) = under(post, l.likelihood(), &at).unwrap();
        let (value, grad) = held_whitened_data_term(&post_at, &dense(&post_at), &lik_at, &second).unwrap();
        assert!(value.is_finite());
        assert_eq!(grad.len(), at.len());
        assert_matches_finite_differences(&grad, &at, |t| data_term(post, l.likelihood(), &second, t));
        // The tasks' blocks give the same, multiplying block by block.
        let (block_value, block_grad) = held_whitened_data_term(&post_at, &l.task_blocks(), &lik_at, &second).unwrap();
        assert!((block_value - value).abs() < 1e-9 * value.abs().max(1.0));
        assert!((&block_grad - &grad).abs().max() < 1e-9 * grad.abs().max().max(1.0));
    }
}

/// A kernel changed with the whitened sites held predicts as one set and
/// refreshed in full, which factorises every `D = I + P` again.
#[test]
fn a_kernel_changed_with_the_whitened_sites_held_is_a_full_refresh() {
    let (l, second) = two_tasks(Likelihood::Bernoulli { link: Link::Probit });
    let post = l.fitted().unwrap();
    let theta = ThetaPosterior::around(post, l.likelihood(), 1.0).mean.map(|t| t - 0.4);
    let (changed, _) = under(post, l.likelihood(), &theta).unwrap();
    let mut refreshed = post.clone();
    let scale = refreshed.kernel.prior_variance();
    refreshed.kernel.set_log_params(theta.as_slice());
    refreshed.follow_kernel_scale(scale);
    refreshed.refresh().unwrap();
    assert_ne!(changed.kernel, post.kernel);
    assert_eq!(changed.kernel, refreshed.kernel);
    let (a, b) = (changed.predict_f(second.x()), refreshed.predict_f(second.x()));
    assert!((&a.mean - &b.mean).abs().max() < 1e-12 && (&a.var - &b.var).abs().max() < 1e-12);
    assert_eq!(changed.q_u(0), refreshed.q_u(0));
}

#[test]
fn the_theta_steps_objective_gradient_matches_finite_differences() {
    let (l, second) = two_tasks(Likelihood::Gaussian { variance: 0.07 });
    let post = l.fitted().unwrap();
    let prior = ThetaPosterior::around(post, l.likelihood(), 0.8);
    let eps = standard_draws(prior.mean.len(), 4, 3);
    let blocks = l.task_blocks();
    let step = ThetaStep {
        post,
        blocks: &blocks,
        likelihood: l.likelihood(),
        data: &second,
        prior: &prior,
        eps: &eps,
        beta: 2.5,
    };
    let q = ThetaPosterior {
        mean: prior.mean.map(|m| m - 0.2),
        sd: DVector::from_fn(prior.mean.len(), |j, _| 0.1 + 0.05 * j as f64),
    };
    let (_, grad) = step.objective(&q).unwrap();
    let value_at = |x: &DVector<f64>| step.objective(&ThetaPosterior::unstacked(x)).unwrap().0;
    assert_matches_finite_differences(&grad, &q.stacked(), value_at);
}

#[test]
fn the_log_normal_kl_matches_monte_carlo() {
    let q = ThetaPosterior {
        mean: DVector::from_vec(vec![0.3, -1.0, 2.0]),
        sd: DVector::from_vec(vec![0.5, 0.2, 1.1]),
    };
    let prior = ThetaPosterior {
        mean: DVector::from_vec(vec![0.0, -0.5, 1.0]),
        sd: DVector::from_vec(vec![1.0, 0.4, 0.9]),
    };
    let log_density = |p: &ThetaPosterior, x: &DVector<f64>| -> f64 {
        (0..x.len())
            .map(|j| {
                let z = (x[j] - p.mean[j]) / p.sd[j];
                -0.5 * z * z - p.sd[j].ln() - 0.5 * (2.0 * std::f64::consts::PI).ln()
            })
            .sum()
    };
    let draws = 200_000;
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (mut sum, mut sum_sq) = (0.0, 0.0);
    for _ in 0..draws {
        let eps = DVector::from_fn(3, |_, _| StandardNormal.sample(&mut rng));
        let x = q.draw(&eps);
        let r = log_density(&q, &x) - log_density(&prior, &x);
        sum += r;
        sum_sq += r * r;
    }
    let mean = sum / draws as f64;
    let se = ((sum_sq / draws as f64 - mean * mean) / draws as f64).sqrt();
    assert!(
        (q.kl(&prior) - mean).abs() < 4.0 * se,
        "{} vs {mean} ± {se}",
        q.kl(&prior)
    );
    assert!(q.kl(&q).abs() < 1e-15);
}

#[test]
fn standard_draws_come_in_antithetic_pairs_and_repeat_from_their_seed() {
    let draws = standard_draws(5, 5, 7);
    assert_eq!(draws.len(), 5);
    assert_eq!(draws[1], -&draws[0]);
    assert_eq!(draws[3], -&draws[2]);
    assert_ne!(draws[2], draws[0]);
    assert_eq!(standard_draws(5, 5, 7), draws);
}

#[test]
fn the_mixture_predictive_averages_densities_and_matches_moments() {
    let (l, second) = two_tasks(Likelihood::Gaussian { variance: 0.07 });
    let post = l.fitted().unwrap();
    let q = ThetaPosterior {
        sd: DVector::from_element(4, 0.3),
        ..ThetaPosterior::around(post, l.likelihood(), 1.0)
    };
    let draws = q.draws_of(post, l.likelihood(), &standard_draws(4, 3, 1)).unwrap();
    let mixture = evaluate_mixture(&draws, &second).unwrap();
    let predictive = predict_mixture(&draws, second.x());
    let (mut nlpd, mut sq) = (0.0, 0.0);
    for (i, got) in predictive.iter().enumerate() {
        let x = second.x().rows(i, 1).into_owned();
        let parts: Vec<(f64, f64)> = draws
            .iter()
            .map(|(post, lik)| {
                let f = post.predict_f(&x);
                let noise = match lik {
                    Likelihood::Gaussian { variance } => *variance,
                    _ => unreachable!(),
                };
                (f.mean[(0, 0)], f.var[(0, 0)] + noise)
            })
            .collect();
        let y = second.y()[i];
        let density: f64 = parts
            .iter()
            .map(|(m, v)| (-(y - m).powi(2) / (2.0 * v)).exp() / (2.0 * std::f64::consts::PI * v).sqrt())
            .sum::<f64>()
            / 3.0;
        nlpd -= density.ln();
        let mean = parts.iter().map(|p| p.0).sum::<f64>() / 3.0;
        let var = parts.iter().map(|(m, v)| v + m * m).sum::<f64>() / 3.0 - mean * mean;
        let Predictive::Moments {
            mean: got_mean,
            var: got_var,
        } = *got
        else {
            panic!("a Gaussian mixture has moments")
        };
        assert!((got_mean - mean).abs() < 1e-10 && (got_var - var).abs() < 1e-10);
        sq += (mean - y).powi(2);
    }
    let n = second.n() as f64;
    assert!(
        (mixture.nlpd - nlpd / n).abs() < 1e-10,
        "{} vs {}",
        mixture.nlpd,
        nlpd / n
    );
    assert!((mixture.rmse.unwrap() - (sq / n).sqrt()).abs() < 1e-10);
    // One draw is the posterior itself, bit for bit.
    let one = [(post.clone(), l.likelihood().clone())];
    assert_eq!(
        evaluate_mixture(&one, &second).unwrap(),
        evaluate(post, l.likelihood(), &second).unwrap()
    );
}

fn posterior_config(prior_sd: f64, beta: f64) -> VarGpConfig {
    config(VarGpTheta::Posterior(ThetaConfig {
        prior_sd,
        beta,
        samples: 4,
        rounds: 2,
        m_steps: 30,
        seed: 0,
    }))
}

#[test]
fn a_posterior_pinned_at_the_starting_theta_is_the_learner_with_theta_held() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let tasks = [task(&mut rng, 40, -2.0, 0.0, true), task(&mut rng, 40, 0.0, 2.0, true)];
    let probit = Likelihood::Bernoulli { link: Link::Probit };
    let kernel = matern(vec![0.8, 1.7]);
    let mut held = VarGpLearner::new(kernel.clone(), probit.clone(), config(VarGpTheta::Fixed)).unwrap();
    let mut pinned = VarGpLearner::new(kernel, probit, posterior_config(1e-9, 1.0)).unwrap();
    for t in &tasks {
        held.learn_batch(t).unwrap();
        pinned.learn_batch(t).unwrap();
    }
    let x = uniform(&mut rng, 30, 2, 2.0);
    for (a, b) in held.predict(&x).unwrap().iter().zip(pinned.predict(&x).unwrap()) {
        let (Predictive::Classes(a), Predictive::Classes(b)) = (a, b) else {
            panic!("Bernoulli predicts classes")
        };
        assert!((a[1] - b[1]).abs() < 1e-6, "{a:?} vs {b:?}");
    }
}

/// A Gaussian learner that learns `q(θ)`, the prior sd 1 and β = 1.
fn learning_q_theta() -> VarGpLearner {
    VarGpLearner::new(
        matern(vec![0.8, 1.7]),
        Likelihood::Gaussian { variance: 0.1 },
        posterior_config(1.0, 1.0),
    )
    .unwrap()
}

#[test]
fn an_empty_task_leaves_the_posterior_and_q_theta_unchanged() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut l = learning_q_theta();
    l.learn_batch(&task(&mut rng, 40, -2.0, 2.0, false)).unwrap();
    let x = uniform(&mut rng, 20, 2, 2.0);
    let before = (l.predict(&x).unwrap(), l.hyperparameters());
    l.learn_batch(&Data::new(DMatrix::zeros(0, 2), DVector::zeros(0)).unwrap())
        .unwrap();
    assert_eq!((l.predict(&x).unwrap(), l.hyperparameters()), before);
}

#[test]
fn a_learner_with_q_theta_survives_its_checkpoint() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut l = learning_q_theta();
    l.learn_batch(&task(&mut rng, 40, -2.0, 0.0, false)).unwrap();
    l.learn_batch(&task(&mut rng, 40, 0.0, 2.0, false)).unwrap();
    let mut restored: VarGpLearner = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
    restored.ensure_factors().unwrap();
    let x = uniform(&mut rng, 20, 2, 2.0);
    assert_eq!(restored.predict(&x).unwrap(), l.predict(&x).unwrap());
    // And it goes on learning as the original does.
    let third = task(&mut rng, 40, 1.0, 2.0, false);
    l.learn_batch(&third).unwrap();
    restored.learn_batch(&third).unwrap();
    assert_eq!(restored.predict(&x).unwrap(), l.predict(&x).unwrap());
}

#[test]
fn q_theta_moves_towards_the_data_and_predicts_better_than_the_held_start() {
    // The starting lengthscales (5) are far too long for sin(3 x0).
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let tasks: Vec<Data> = (0..3)
        .map(|t| {
            task(
                &mut rng,
                60,
                -2.0 + t as f64 * 4.0 / 3.0,
                -2.0 + (t + 1) as f64 * 4.0 / 3.0,
                false,
            )
        })
        .collect();
    let test = task(&mut rng, 200, -2.0, 2.0, false);
    let gaussian = Likelihood::Gaussian { variance: 0.5 };
    let start = matern(vec![5.0, 5.0]);
    let mut held = VarGpLearner::new(start.clone(), gaussian.clone(), config(VarGpTheta::Fixed)).unwrap();
    let mut learned = VarGpLearner::new(start, gaussian, posterior_config(1.0, 1.0)).unwrap();
    for t in &tasks {
        held.learn_batch(t).unwrap();
        learned.learn_batch(t).unwrap();
    }
    let lengthscale = |l: &VarGpLearner| {
        l.hyperparameters()
            .into_iter()
            .find(|(name, _)| name.contains("lengthscale"))
            .unwrap()
            .1
    };
    assert!(
        lengthscale(&learned) < 2.5,
        "x0's lengthscale stayed at {}",
        lengthscale(&learned)
    );
    let (nlpd_held, nlpd_learned) = (
        held.evaluate(&test).unwrap().nlpd,
        learned.evaluate(&test).unwrap().nlpd,
    );
    assert!(
        nlpd_learned < nlpd_held - 0.1,
        "learned {nlpd_learned} held {nlpd_held}"
    );
}

#[test]
fn the_posterior_over_theta_is_refused_for_the_ablations_and_bad_settings() {
    let refused =
        |config: VarGpConfig| VarGpLearner::new(matern(vec![1.0]), Likelihood::Gaussian { variance: 0.1 }, config);
    for variant in [VarGpVariant::Global, VarGpVariant::Retrain] {
        let err = refused(VarGpConfig {
            variant,
            ..posterior_config(1.0, 1.0)
        })
        .unwrap_err();
        assert!(err.to_string().contains("auto-regressive"), "{err}");
    }
    for (sd, beta) in [(0.0, 1.0), (f64::NAN, 1.0), (1.0, -1.0), (1.0, f64::INFINITY)] {
        assert!(refused(posterior_config(sd, beta)).is_err(), "sd {sd} beta {beta}");
    }
}
