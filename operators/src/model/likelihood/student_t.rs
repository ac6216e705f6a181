//! The Student-t likelihood by Gauss–Hermite quadrature.

use std::f64::consts::PI;

use crate::model::math::quadrature;

/// Student-t with the per-call constants hoisted out of the quadrature loop.
pub(super) struct StudentT {
    df: f64,
    /// `ν s²`.
    nu_s2: f64,
    /// The normalising constant `lgamma((ν+1)/2) − lgamma(ν/2) − ½ log(νπ s²)`.
    log_norm: f64,
    /// `∂ log_norm / ∂ log ν`.
    d_log_norm_d_log_df: f64,
}

impl StudentT {
    pub(super) fn new(df: f64, scale: f64) -> Self {
        use crate::model::math::special::{digamma, ln_gamma};
        let half = 0.5 * df;
        let half_plus = 0.5 * (df + 1.0);
        Self {
            df,
            nu_s2: df * scale * scale,
            log_norm: ln_gamma(half_plus) - ln_gamma(half) - 0.5 * (df * PI).ln() - scale.ln(),
            d_log_norm_d_log_df: half * (digamma(half_plus) - digamma(half)) - 0.5,
        }
    }

    /// `−(ν+1)/2 · log(1 + u)` with `u = r²/(ν s²)`, `r = y − f`: the
    /// non-constant part of `log p` and, in order, its first and second
    /// `f`-derivatives and its derivatives in `log ν` and `log s`.
    fn kernel5(&self, y: f64, f: f64) -> [f64; 5] {
        let r = y - f;
        let r2 = r * r;
        let den = self.nu_s2 + r2;
        let log1p_u = (r2 / self.nu_s2).ln_1p();
        let frac = r2 / den; // u / (1 + u)
        let nu1 = self.df + 1.0;
        [
            -0.5 * nu1 * log1p_u,
            nu1 * r / den,
            nu1 * (r2 - self.nu_s2) / (den * den),
            -0.5 * self.df * log1p_u + 0.5 * nu1 * frac,
            nu1 * frac,
        ]
    }

    /// `([E, ∂E/∂μ, ∂E/∂v], [∂E/∂ log ν, ∂E/∂ log s])`.
    pub(super) fn expectation(&self, mean: f64, var: f64, y: f64) -> ([f64; 3], [f64; 2]) {
        let ([k, d_mean, d_var], [d_df, d_scale]) =
            quadrature::rule(quadrature::DEFAULT_NODES).expect_and_grads(mean, var, |f| {
                let [k0, k1, k2, k_df, k_scale] = self.kernel5(y, f);
                ([k0, k1, k2], [k_df, k_scale])
            });
        (
            [self.log_norm + k, d_mean, d_var],
            [self.d_log_norm_d_log_df + d_df, d_scale - 1.0],
        )
    }

    pub(super) fn log_predictive(&self, mean: f64, var: f64, y: f64) -> f64 {
        self.log_norm + quadrature::log_expect_exp(mean, var, |f| self.kernel5(y, f)[0])
    }
}
