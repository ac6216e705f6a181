//! The Gaussian likelihood: every expectation in closed form.

use std::f64::consts::PI;

/// `[E, ∂E/∂μ, ∂E/∂v, ∂E/∂ log σ²]`, all closed form.
pub(super) fn expectation(noise: f64, mean: f64, var: f64, y: f64) -> [f64; 4] {
    let sq = (y - mean).powi(2) + var;
    [
        -0.5 * (2.0 * PI * noise).ln() - sq / (2.0 * noise),
        (y - mean) / noise,
        -0.5 / noise,
        -0.5 + sq / (2.0 * noise),
    ]
}

/// `log N(y; mean, var)`.
pub(super) fn log_density(y: f64, mean: f64, var: f64) -> f64 {
    -0.5 * (2.0 * PI * var).ln() - (y - mean).powi(2) / (2.0 * var)
}
