//! The Poisson likelihood with a log link: expectations in closed form, the predictive density by quadrature.

use super::Predictive;
use crate::model::math::quadrature;
use crate::model::math::special::ln_gamma;

/// `[E, ∂E/∂μ, ∂E/∂v]` with `E = yμ − exp(μ + v/2) − log y!`.
pub(super) fn expectation(mean: f64, var: f64, y: f64) -> [f64; 3] {
    let rate = (mean + 0.5 * var).exp();
    [y * mean - rate - ln_gamma(y + 1.0), y - rate, -0.5 * rate]
}

pub(super) fn log_predictive(mean: f64, var: f64, y: f64) -> f64 {
    let log_fact = ln_gamma(y + 1.0);
    quadrature::log_expect_exp(mean, var, |f| y * f - f.exp() - log_fact)
}

/// Count moments by the laws of total expectation and variance.
pub(super) fn predict(mean: f64, var: f64) -> Predictive {
    let rate_mean = (mean + 0.5 * var).exp();
    let rate_var = var.exp_m1() * (2.0 * mean + var).exp();
    Predictive::Moments {
        mean: rate_mean,
        var: rate_mean + rate_var,
    }
}
