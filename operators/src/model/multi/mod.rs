//! Multi-output (continual multi-task) GPs: `D` outputs, each with its own
//! likelihood, as linear combinations of `Q` latent GPs (the linear model of
//! coregionalisation, seed 002): `f_d(x) = Σ_q a_{q,d} u_q(x)`.
//!
//! The model runs in the dual-parameter learner unchanged: it is one latent
//! function of the inputs and the output index, whose prior is the
//! coregional kernel ([`Coregional`](crate::model::math::coregional::Coregional)),
//! and [`MultiOutput`] gives each record its own output's likelihood. Every
//! per-point site, E-step, M-step, memory and BLS computation is the
//! single-output one.

mod observation;

pub use observation::MultiOutput;
