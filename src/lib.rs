//! **dualgp**: memory-based dual sparse Gaussian processes for sequential
//! learning (Chang et al., ICML 2023), as timely-dataflow operators.
//!
//! This facade re-exports the workspace's crates:
//! - [`operators`]: the GP model ([`operators::model`]) and its dataflow operators;
//! - [`connectors`]: Parquet and Kafka sources and sinks, as Arrow;
//! - [`pipelines`]: evaluation protocols and the `dualgp` command's building blocks.
//!
//! The learner as a timely operator: records in, each scored with the
//! newest model and then learned from, an epoch at a time (the complete
//! program, on several workers, is `operators/examples/embed.rs`):
//!
//! ```
//! use dualgp::model::{Family, Kernel, Likelihood, SequentialConfig, SequentialLearner};
//! use dualgp::operators::dataflow::{LearnGp, Record};
//! use dualgp::timely::dataflow::operators::{Inspect, ToStream};
//!
//! let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.5]);
//! let likelihood = Likelihood::Gaussian { variance: 0.1 };
//! let learner = SequentialLearner::new(kernel, likelihood, SequentialConfig::default()).unwrap();
//! dualgp::timely::example(move |scope| {
//!     let records = (0..300).map(|i| Record::new(i, vec![i as f64 / 50.0], Some((i as f64 / 50.0).sin())));
//!     let gp = records.to_stream(scope).container::<Vec<_>>().learn_gp(learner, 1);
//!     gp.predictions.inspect(|p| assert!(p.log_density.is_some()));
//!     gp.updates.inspect(|u| assert_eq!(u.learner.n_seen, 300));
//! });
//! ```

pub use dualgp_connectors as connectors;
pub use dualgp_operators as operators;
pub use dualgp_operators::model;
/// The timely the operators are built on.
pub use dualgp_operators::timely;
pub use dualgp_pipelines as pipelines;
