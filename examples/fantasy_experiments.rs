//! The fantasy-batch experiments of docs/RESULTS.md (seed 000, Sec. 4.1 and
//! Algorithm 2), each learner with the command line's defaults:
//!
//! - batch Bayesian optimisation on Branin and Hartmann-6, and on Hartmann-6
//!   feasible only where ‖x − 0.5·1‖ ≤ 0.5 (a Bernoulli model learns the
//!   0/1 feasibility; expected improvement × probability of feasibility):
//!   24 random initial points, then 90 evaluations in batches of k = 3 or
//!   k = 1, by the dual model's fantasies, by an exact GP's fantasies (same
//!   hyperparameters, learned by the dual model), and by random search;
//! - active learning on bank: fold 0 the test set, the rest the pool; 20
//!   random labels, then 30 steps of 10, chosen by predictive entropy with
//!   fantasies or at random.
//!
//!     cargo run --release --example fantasy_experiments -- [bo|active|all] [--seeds N] [--out DIR]
//!
//! Writes `DIR/{bo,active}.json` (every seed's curve) and SVG plots of the
//! medians with their quartiles (default DIR: docs/figures/fantasy).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use clap::Parser;
use dualgp::connectors::{ColumnSpec, Table};
use dualgp::model::fantasy::{propose_batch, Acquisition, Conditioned, ExactGp, Fantasy, Search, Surrogate};
use dualgp::model::{Data, Likelihood, StreamingLearner};
use dualgp::pipelines::model_args::{Method, ModelArgs, Settings};
use dualgp::pipelines::protocol::{fold_split, prepare, Order};
use dualgp::pipelines::report::{quartile_curves, Curve, LogAxes};
use nalgebra::{DMatrix, DVector};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const INITIAL: usize = 24;
const EVALUATIONS: usize = 90;

/// A test function on the unit cube, to minimise.
struct Problem {
    name: &'static str,
    d: usize,
    f: fn(&[f64]) -> f64,
    feasible: Option<fn(&[f64]) -> bool>,
    /// The (feasible) minimum.
    optimum: f64,
}

/// Branin on [−5, 10] × [0, 15], mapped to the unit square; minimum 0.397887.
fn branin(u: &[f64]) -> f64 {
    use std::f64::consts::PI;
    let (x1, x2) = (15.0 * u[0] - 5.0, 15.0 * u[1]);
    let b = 5.1 / (4.0 * PI * PI);
    (x2 - b * x1 * x1 + 5.0 / PI * x1 - 6.0).powi(2) + 10.0 * (1.0 - 1.0 / (8.0 * PI)) * x1.cos() + 10.0
}

/// Hartmann-6 on the unit cube; minimum −3.32237.
fn hartmann6(x: &[f64]) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [1312.0, 1696.0, 5569.0, 124.0, 8283.0, 5886.0],
        [2329.0, 4135.0, 8307.0, 3736.0, 1004.0, 9991.0],
        [2348.0, 1451.0, 3522.0, 2883.0, 3047.0, 6650.0],
        [4047.0, 8828.0, 8732.0, 5743.0, 1091.0, 381.0],
    ];
    -(0..4)
        .map(|i| {
            let r: f64 = (0..6).map(|j| A[i][j] * (x[j] - 1e-4 * P[i][j]).powi(2)).sum();
            ALPHA[i] * (-r).exp()
        })
        .sum::<f64>()
}

fn in_ball(x: &[f64]) -> bool {
    x.iter().map(|v| (v - 0.5).powi(2)).sum::<f64>() <= 0.25
}

/// Hartmann-6's minimum inside the ball (its global minimum lies outside):
/// the best of 10⁶ points drawn in the ball, refined by projected gradient
/// descent with central differences.
fn constrained_hartmann_minimum() -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let project = |x: &mut [f64]| {
        let r = x.iter().map(|v| (v - 0.5).powi(2)).sum::<f64>().sqrt();
        if r > 0.5 {
            x.iter_mut().for_each(|v| *v = 0.5 + (*v - 0.5) * 0.5 / r);
        }
    };
    let mut draws: Vec<(f64, Vec<f64>)> = (0..1_000_000)
        .map(|_| {
            let mut x: Vec<f64> = (0..6).map(|_| rng.random::<f64>() - 0.5).collect();
            let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
            let radius = 0.5 * rng.random::<f64>().powf(1.0 / 6.0);
            x.iter_mut().for_each(|v| *v = 0.5 + *v / norm * radius);
            (hartmann6(&x), x)
        })
        .collect();
    draws.sort_by(|a, b| a.0.total_cmp(&b.0));
    draws
        .into_iter()
        .take(20)
        .map(|(mut value, mut x)| {
            let mut step = 0.01;
            while step > 1e-10 {
                let grad: Vec<f64> = (0..6)
                    .map(|j| {
                        let (mut up, mut down) = (x.clone(), x.clone());
                        up[j] += 1e-7;
                        down[j] -= 1e-7;
                        (hartmann6(&up) - hartmann6(&down)) / 2e-7
                    })
                    .collect();
                let norm = grad.iter().map(|g| g * g).sum::<f64>().sqrt().max(1e-300);
                let mut trial: Vec<f64> = x.iter().zip(&grad).map(|(v, g)| v - step * g / norm).collect();
                project(&mut trial);
                let tried = hartmann6(&trial);
                if tried < value {
                    (x, value, step) = (trial, tried, step * 1.5);
                } else {
                    step *= 0.5;
                }
            }
            value
        })
        .fold(f64::INFINITY, f64::min)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Chooser {
    /// Fantasies in the dual model over its own inducing inputs (Algorithm 2).
    Dual,
    /// The same, each fantasy's input joining the inducing inputs first.
    DualGrowing,
    Exact,
    Random,
}

impl Chooser {
    fn name(self) -> &'static str {
        match self {
            Chooser::Dual => "dual fantasies, Z fixed",
            Chooser::DualGrowing => "dual fantasies, Z grown",
            Chooser::Exact => "exact-GP fantasies",
            Chooser::Random => "random search",
        }
    }
}

fn learner(settings: &Settings, d: usize, likelihood: Likelihood) -> Result<Box<dyn StreamingLearner>> {
    settings.streaming_learner(
        Method::DualMemory,
        settings.kernel(d),
        settings.likelihood(likelihood),
        None,
        1,
    )
}

fn rows(x: &DMatrix<f64>) -> Vec<Vec<f64>> {
    x.row_iter().map(|r| r.iter().copied().collect()).collect()
}

/// Points as the rows of a matrix.
fn matrix(x: &[Vec<f64>]) -> DMatrix<f64> {
    DMatrix::from_fn(x.len(), x.first().map_or(0, Vec::len), |i, j| x[i][j])
}

fn data(x: &[Vec<f64>], y: &[f64]) -> Result<Data> {
    Ok(Data::new(matrix(x), DVector::from_column_slice(y))?)
}

/// Simple regret after each evaluation from the 24th on: the best feasible
/// value so far minus the optimum (before any feasible point, that of 0,
/// Hartmann-6's level away from its wells).
fn optimise(
    problem: &Problem,
    chooser: Chooser,
    k: usize,
    seed: u64,
    settings: &Settings,
    feasibility_lengthscale: Option<f64>,
) -> Result<Vec<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // The models see standardised inputs, as `suggest` and the streams give
    // them: a uniform coordinate has sd 1/√12.
    let unit = |x: &[f64]| -> Vec<f64> { x.iter().map(|v| 0.5 + v / 12f64.sqrt()).collect() };
    let value = |x: &[f64]| (problem.f)(&unit(x));
    let feasible = |x: &[f64]| problem.feasible.is_none_or(|f| f(&unit(x)));
    let draw = |rng: &mut ChaCha8Rng| -> Vec<f64> {
        (0..problem.d)
            .map(|_| (rng.random::<f64>() - 0.5) * 12f64.sqrt())
            .collect()
    };
    let mut x: Vec<Vec<f64>> = (0..INITIAL).map(|_| draw(&mut rng)).collect();
    let mut y: Vec<f64> = x.iter().map(|x| value(x)).collect();
    let mut ok: Vec<f64> = x.iter().map(|x| f64::from(u8::from(feasible(x)))).collect();
    // The first design's scaling, fixed as a stream's is.
    let mean = y.iter().sum::<f64>() / y.len() as f64;
    let sd = (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / y.len() as f64)
        .sqrt()
        .max(1e-12);
    let scaled = |v: f64| (v - mean) / sd;
    let mut regression = learner(settings, problem.d, Likelihood::Gaussian { variance: 1.0 })?;
    // The classifier keeps its starting hyperparameters: learned from 24
    // points of which about 2 are feasible, ML-II makes it a constant
    // (lengthscale 2·10⁵ at the first update, measured), blind to the ball.
    let mut fixed = settings.clone();
    fixed.sequential.m_steps = 0;
    fixed.lengthscale = feasibility_lengthscale.or(settings.lengthscale);
    let mut classifier = learner(&fixed, problem.d, Likelihood::parse("bernoulli")?)?;
    let learn = |model: &mut Box<dyn StreamingLearner>, x: &[Vec<f64>], t: &[f64]| -> Result<()> {
        model.learn_batch(&data(x, t)?)?;
        Ok(())
    };
    if chooser != Chooser::Random {
        learn(&mut regression, &x, &y.iter().map(|&v| scaled(v)).collect::<Vec<_>>())
            .context("the regression model")?;
        if problem.feasible.is_some() {
            learn(&mut classifier, &x, &ok).context("the feasibility classifier")?;
        }
    }
    let half = 3f64.sqrt();
    let search = Search::in_box(vec![(-half, half); problem.d]);
    while x.len() < INITIAL + EVALUATIONS {
        let k = k.min(INITIAL + EVALUATIONS - x.len());
        let chosen: Vec<Vec<f64>> = if chooser == Chooser::Random {
            (0..k).map(|_| draw(&mut rng)).collect()
        } else {
            let post = regression.fitted()?;
            let mut models: Vec<Box<dyn Surrogate>> = vec![match chooser {
                Chooser::Exact => {
                    let Likelihood::Gaussian { variance } = *regression.likelihood() else {
                        bail!("the regression model is Gaussian")
                    };
                    let targets = DVector::from_iterator(y.len(), y.iter().map(|&v| scaled(v)));
                    Box::new(ExactGp::new(post.kernel.clone(), variance, matrix(&x), targets)?)
                }
                Chooser::DualGrowing => Box::new(Conditioned::growing(post, regression.likelihood().clone())?),
                _ => Box::new(Conditioned::new(post, regression.likelihood().clone())?),
            }];
            let best = y
                .iter()
                .zip(&ok)
                .filter(|(_, &ok)| ok > 0.5)
                .map(|(&v, _)| scaled(v))
                .fold(f64::INFINITY, f64::min);
            let ei = Acquisition::ExpectedImprovement {
                model: 0,
                incumbent: best,
                maximize: false,
            };
            let acquisition = if problem.feasible.is_some() {
                // No exact GP classifies: the exact arm grows Z, the closest to exact.
                let (post, likelihood) = (classifier.fitted()?, classifier.likelihood().clone());
                models.push(Box::new(match chooser {
                    Chooser::Dual => Conditioned::new(post, likelihood)?,
                    _ => Conditioned::growing(post, likelihood)?,
                }));
                let feasibility = Acquisition::Feasibility { model: 1 };
                if best.is_finite() {
                    Acquisition::Product(vec![ei, feasibility])
                } else {
                    feasibility
                }
            } else {
                ei
            };
            let batch = propose_batch(&mut models, &acquisition, k, &search, Fantasy::Mean, &mut rng)?;
            batch.into_iter().map(|p| p.x).collect()
        };
        let new_y: Vec<f64> = chosen.iter().map(|x| value(x)).collect();
        let new_ok: Vec<f64> = chosen.iter().map(|x| f64::from(u8::from(feasible(x)))).collect();
        if chooser != Chooser::Random {
            learn(
                &mut regression,
                &chosen,
                &new_y.iter().map(|&v| scaled(v)).collect::<Vec<_>>(),
            )
            .context("the regression model")?;
            if problem.feasible.is_some() {
                learn(&mut classifier, &chosen, &new_ok).context("the feasibility classifier")?;
            }
        }
        x.extend(chosen);
        y.extend(new_y);
        ok.extend(new_ok);
    }
    let mut best = f64::INFINITY;
    let mut regret = Vec::new();
    for (i, (&v, &ok)) in y.iter().zip(&ok).enumerate() {
        if ok > 0.5 {
            best = best.min(v);
        }
        if i + 1 >= INITIAL {
            regret.push(if best.is_finite() { best } else { 0.0 } - problem.optimum);
        }
    }
    Ok(regret)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Labeller {
    Entropy,
    Random,
}

/// Test accuracy and NLPD after 20, 30, …, 320 labels of bank's pool.
fn learn_actively(
    pool: &Data,
    test: &Data,
    labeller: Labeller,
    seed: u64,
    settings: &Settings,
) -> Result<Vec<(f64, f64)>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut unlabelled: Vec<usize> = (0..pool.n()).collect();
    unlabelled.shuffle(&mut rng);
    let mut chosen: Vec<usize> = unlabelled.split_off(unlabelled.len() - 20);
    let mut model = learner(settings, pool.d(), Likelihood::parse("bernoulli")?)?;
    let mut curve = Vec::new();
    for step in 0..=30 {
        model.learn_batch(&data(
            &rows(&pool.x().select_rows(&chosen)),
            pool.y().select_rows(&chosen).as_slice(),
        )?)?;
        let metrics = model.evaluate(test)?;
        curve.push((metrics.accuracy.unwrap_or(f64::NAN), metrics.nlpd));
        if step == 30 {
            break;
        }
        chosen = match labeller {
            Labeller::Random => unlabelled.split_off(unlabelled.len() - 10),
            Labeller::Entropy => {
                let candidates = pool.x().select_rows(&unlabelled);
                let mut models: Vec<Box<dyn Surrogate>> = vec![Box::new(Conditioned::growing(
                    model.fitted()?,
                    model.likelihood().clone(),
                )?)];
                let batch = propose_batch(
                    &mut models,
                    &Acquisition::Entropy { model: 0 },
                    10,
                    &Search::Pool(candidates),
                    Fantasy::Mean,
                    &mut rng,
                )?;
                let mut rows: Vec<usize> = batch.iter().filter_map(|p| p.row).collect();
                let picked: Vec<usize> = rows.iter().map(|&r| unlabelled[r]).collect();
                rows.sort_unstable_by(|a, b| b.cmp(a));
                for r in rows {
                    unlabelled.swap_remove(r);
                }
                picked
            }
        };
    }
    Ok(curve)
}

/// Runs `jobs` on two threads, in any order; results in job order.
fn run_all<J: Sync + std::fmt::Debug, T: Send>(jobs: &[J], run: impl Fn(&J) -> Result<T> + Sync) -> Result<Vec<T>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<T>>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let result = run(job).with_context(|| format!("job {job:?}"));
                results.lock().expect("no thread panics while holding it")[i] = Some(result);
            });
        }
    });
    results
        .into_inner()
        .expect("no thread panicked")
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

/// Median and quartiles of each column of `runs` (one row a seed).
fn quartiles(name: String, x: Vec<f64>, runs: &[Vec<f64>]) -> Curve {
    let at = |q: f64| -> Vec<f64> {
        (0..x.len())
            .map(|i| {
                let mut column: Vec<f64> = runs.iter().map(|r| r[i]).collect();
                column.sort_by(f64::total_cmp);
                let pos = q * (column.len() - 1) as f64;
                let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
                column[lo] + (pos - lo as f64) * (column[hi] - column[lo])
            })
            .collect()
    };
    Curve {
        name,
        median: at(0.5),
        lower: at(0.25),
        upper: at(0.75),
        x,
    }
}

fn bayesian_optimisation(
    seeds: u64,
    only: Option<&str>,
    out: &Path,
    settings: &Settings,
    feasibility_lengthscale: Option<f64>,
) -> Result<()> {
    let constrained = Problem {
        name: "hartmann6-constrained",
        d: 6,
        f: hartmann6,
        feasible: Some(in_ball),
        optimum: constrained_hartmann_minimum(),
    };
    println!("Hartmann-6 minimum inside the ball: {:.5}", constrained.optimum);
    let problems = [
        Problem {
            name: "branin",
            d: 2,
            f: branin,
            feasible: None,
            optimum: 0.397887,
        },
        Problem {
            name: "hartmann6",
            d: 6,
            f: hartmann6,
            feasible: None,
            optimum: -3.32237,
        },
        constrained,
    ];
    let arms = [
        (Chooser::Dual, 3),
        (Chooser::DualGrowing, 3),
        (Chooser::Dual, 1),
        (Chooser::Exact, 3),
        (Chooser::Exact, 1),
        (Chooser::Random, 1),
    ];
    let mut report = serde_json::Map::new();
    for problem in problems.iter().filter(|p| only.is_none_or(|name| name == p.name)) {
        let jobs: Vec<(Chooser, usize, u64)> = arms
            .iter()
            .flat_map(|&(c, k)| (0..seeds).map(move |s| (c, k, s)))
            .collect();
        let started = std::time::Instant::now();
        let curves = run_all(&jobs, |&(chooser, k, seed)| {
            optimise(problem, chooser, k, seed, settings, feasibility_lengthscale)
        })?;
        println!("{}: {:.0} s", problem.name, started.elapsed().as_secs_f64());
        let evaluations: Vec<f64> = (INITIAL..=INITIAL + EVALUATIONS).map(|n| n as f64).collect();
        let mut plotted = Vec::new();
        let mut arms_json = serde_json::Map::new();
        for (a, &(chooser, k)) in arms.iter().enumerate() {
            let runs: Vec<Vec<f64>> = curves[a * seeds as usize..(a + 1) * seeds as usize].to_vec();
            let name = if chooser == Chooser::Random {
                chooser.name().to_string()
            } else {
                format!("{}, k = {k}", chooser.name())
            };
            let curve = quartiles(name.clone(), evaluations.clone(), &runs);
            let at = |after: usize| {
                let i = after;
                format!(
                    "{:.2e} ({:.2e} – {:.2e})",
                    curve.median[i], curve.lower[i], curve.upper[i]
                )
            };
            println!(
                "  {name:<34} simple regret, median (quartiles), after 30 evaluations {}, after {EVALUATIONS} {}",
                at(30),
                at(EVALUATIONS)
            );
            arms_json.insert(name, serde_json::json!(runs));
            plotted.push(curve);
        }
        report.insert(
            problem.name.to_string(),
            serde_json::json!({"optimum": problem.optimum, "regret_by_seed": arms_json}),
        );
        let title = format!(
            "{}: simple regret, median and quartiles over {seeds} seeds",
            problem.name
        );
        quartile_curves(
            &out.join(format!("bo-{}.svg", problem.name)),
            &title,
            "evaluations",
            "simple regret",
            LogAxes { x: false, y: true },
            &plotted,
        )?;
    }
    std::fs::write(out.join("bo.json"), serde_json::to_string_pretty(&report)?)?;
    Ok(())
}

fn active_learning(seeds: u64, out: &Path, settings: &Settings) -> Result<()> {
    let table = Table::read("../shared/data/bank.parquet", &ColumnSpec::default())?;
    let prepared = prepare(&fold_split(&table, 0)?, &Order::Id, 1, false)?;
    let pool = Data::new(prepared.x_train.clone(), prepared.y_train.clone())?;
    let test = Data::new(prepared.x_test.clone(), prepared.y_test.clone())?;
    let labellers = [
        (Labeller::Entropy, "predictive entropy with fantasies"),
        (Labeller::Random, "random"),
    ];
    let jobs: Vec<(Labeller, u64)> = labellers
        .iter()
        .flat_map(|&(l, _)| (0..seeds).map(move |s| (l, s)))
        .collect();
    let started = std::time::Instant::now();
    let curves = run_all(&jobs, |&(labeller, seed)| {
        learn_actively(&pool, &test, labeller, seed, settings)
    })?;
    println!("bank active learning: {:.0} s", started.elapsed().as_secs_f64());
    let labels: Vec<f64> = (0..=30).map(|s| (20 + 10 * s) as f64).collect();
    let mut report = serde_json::Map::new();
    let (mut accuracy, mut nlpd) = (Vec::new(), Vec::new());
    for (a, &(_, name)) in labellers.iter().enumerate() {
        let runs = &curves[a * seeds as usize..(a + 1) * seeds as usize];
        let acc: Vec<Vec<f64>> = runs.iter().map(|r| r.iter().map(|p| p.0).collect()).collect();
        let nl: Vec<Vec<f64>> = runs.iter().map(|r| r.iter().map(|p| p.1).collect()).collect();
        accuracy.push(quartiles(name.into(), labels.clone(), &acc));
        nlpd.push(quartiles(name.into(), labels.clone(), &nl));
        for (n, i) in [(50, 3), (120, 10), (220, 20), (320, 30)] {
            println!(
                "  {name:<36} {n:>3} labels: accuracy median {:.4}, NLPD median {:.4}",
                accuracy[a].median[i], nlpd[a].median[i]
            );
        }
        report.insert(
            name.to_string(),
            serde_json::json!({"accuracy_by_seed": acc, "nlpd_by_seed": nl}),
        );
    }
    let title = |what: &str| format!("bank, fold 0 held out: test {what}, median and quartiles over {seeds} seeds");
    quartile_curves(
        &out.join("active-bank-accuracy.svg"),
        &title("accuracy"),
        "labels",
        "accuracy",
        LogAxes::default(),
        &accuracy,
    )?;
    quartile_curves(
        &out.join("active-bank-nlpd.svg"),
        &title("NLPD"),
        "labels",
        "NLPD",
        LogAxes::default(),
        &nlpd,
    )?;
    std::fs::write(out.join("active.json"), serde_json::to_string_pretty(&report)?)?;
    Ok(())
}

/// What to run, and the learners' model flags (`dualgp eval --help` lists them).
#[derive(Parser)]
struct Args {
    /// bo, active or all.
    #[arg(default_value = "all")]
    which: String,
    /// Seeds of the optimisation runs (active learning takes at most 10).
    #[arg(long, default_value_t = 20)]
    seeds: u64,
    #[arg(long, default_value = "docs/figures/fantasy")]
    out: PathBuf,
    /// Only this optimisation problem (branin, hartmann6, hartmann6-constrained).
    #[arg(long)]
    problem: Option<String>,
    /// The feasibility classifier's lengthscale (default: the model flags' starting one).
    #[arg(long)]
    feasibility_lengthscale: Option<f64>,
    #[command(flatten)]
    model: ModelArgs,
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out)?;
    let settings = args.model.settings()?;
    if matches!(args.which.as_str(), "bo" | "all") {
        bayesian_optimisation(
            args.seeds,
            args.problem.as_deref(),
            &args.out,
            &settings,
            args.feasibility_lengthscale,
        )?;
    }
    if matches!(args.which.as_str(), "active" | "all") {
        active_learning(args.seeds.min(10), &args.out, &settings)?;
    }
    Ok(())
}
