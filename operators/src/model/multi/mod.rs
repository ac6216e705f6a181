//! Multi-output (continual multi-task) GPs: `D` outputs, each with its own
//! likelihood, as linear combinations of `Q` latent GPs (the linear model of
//! coregionalisation, seed 002): `f_d(x) = Σ_q a_{q,d} u_q(x)`.
//!
//! The model runs in the dual-parameter learner unchanged: the latents are the
//! posterior's `Q` latent functions (as softmax's classes are), and
//! [`MultiOutput`] is the observation model on that latent layer, so every
//! per-point site, E-step, M-step, memory and BLS computation is the
//! single-output one. See [`MultiOutput`] for the approximation it makes.

mod observation;

pub use observation::MultiOutput;
