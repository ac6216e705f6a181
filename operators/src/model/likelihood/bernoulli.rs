//! The Bernoulli likelihood (probit or logit link) by Gauss–Hermite quadrature.

use super::Link;
use crate::model::math::quadrature;
use crate::model::math::special::{log_ndtr, log_ndtr_and_mills, log_sigmoid_parts, ndtr, sigmoid, softplus};

/// `±1` for labels `1` / `0`.
fn sign(y: f64) -> f64 {
    if y > 0.5 {
        1.0
    } else {
        -1.0
    }
}

/// `[log p, ∂_f log p, ∂²_f log p]` for `p(y|f) = link(s f)`.
fn log_lik3(link: Link, s: f64, f: f64) -> [f64; 3] {
    let sf = s * f;
    match link {
        Link::Probit => {
            let (log_cdf, mills) = log_ndtr_and_mills(sf);
            [log_cdf, s * mills, -mills * (sf + mills)]
        }
        Link::Logit => {
            let (log_p, p_wrong, curvature) = log_sigmoid_parts(sf);
            [log_p, s * p_wrong, -curvature]
        }
    }
}

fn log_lik(link: Link, s: f64, f: f64) -> f64 {
    match link {
        Link::Probit => log_ndtr_and_mills(s * f).0,
        Link::Logit => -softplus(-s * f),
    }
}

pub(super) fn expectation(link: Link, mean: f64, var: f64, y: f64) -> [f64; 3] {
    let s = sign(y);
    let [value, d_mean, d_var] = quadrature::expect_and_grads(mean, var, |f| log_lik3(link, s, f));
    // Log-concave, so ∂E/∂v ≤ 0; far in the saturated tail rounding in
    // ∂_f log p ≈ ±1 can leave a ~1e−14 positive residue.
    [value, d_mean, d_var.min(0.0)]
}

pub(super) fn log_predictive(link: Link, mean: f64, var: f64, y: f64) -> f64 {
    let s = sign(y);
    match link {
        Link::Probit => log_ndtr(s * mean / (1.0 + var).sqrt()),
        Link::Logit => quadrature::log_expect_exp(mean, var, |f| log_lik(link, s, f)),
    }
}

/// Predictive `p(y = 1)`.
pub(super) fn prob_one(link: Link, mean: f64, var: f64) -> f64 {
    match link {
        Link::Probit => ndtr(mean / (1.0 + var).sqrt()),
        Link::Logit => quadrature::expect(mean, var, sigmoid),
    }
}

/// `[p(y = 1), ∂p/∂μ, ∂p/∂v]`.
pub(super) fn prob_one_and_grads(link: Link, mean: f64, var: f64) -> [f64; 3] {
    match link {
        Link::Probit => {
            let scale = (1.0 + var).sqrt();
            let t = mean / scale;
            let density = (-0.5 * t * t).exp() / (2.0 * std::f64::consts::PI).sqrt();
            [ndtr(t), density / scale, -0.5 * density * t / (1.0 + var)]
        }
        Link::Logit => quadrature::expect_and_grads(mean, var, |f| {
            let p = sigmoid(f);
            [p, p * (1.0 - p), p * (1.0 - p) * (1.0 - 2.0 * p)]
        }),
    }
}

#[cfg(test)]
pub(super) fn quadrature_log_predictive(link: Link, mean: f64, var: f64, y: f64, nodes: usize) -> f64 {
    let s = sign(y);
    quadrature::rule(nodes).log_expect_exp(mean, var, |f| log_lik(link, s, f))
}
