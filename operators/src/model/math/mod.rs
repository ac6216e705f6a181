//! The numerical building blocks every learner shares: kernels, linear
//! algebra, quadrature, special functions, optimisers, and the pivoted
//! Cholesky that chooses inducing inputs.

pub mod coregional;
pub mod exp;
pub mod inducing;
pub mod kernel;
pub mod linalg;
pub mod optim;
pub mod quadrature;
pub mod special;
