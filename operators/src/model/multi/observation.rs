//! The observation model of a multi-output GP: one likelihood per output.

use serde::{Deserialize, Serialize};

use crate::model::error::{ModelError, Result};
use crate::model::likelihood::{Expectation, Likelihood, Predictive};

/// `D` outputs with one likelihood each, over one latent function of the
/// inputs and the output index: `g(x, d) = f_d(x)`, whose prior is the
/// coregional kernel `Σ_q a_{q,d} a_{q,d'} k_q(x, x')` (see
/// [`Coregional`](crate::model::math::coregional::Coregional)). A record
/// that observes output `d` sets one site on `f_d(x)`, as a single-output
/// record does on `f(x)`: its likelihood is output `d`'s, and an output a
/// record does not observe contributes nothing (asynchronous channels).
///
/// The sites are joint over the latents, not mean-field: a Gaussian output's
/// site is exact and stays exact as the other latents move, and `q(u)` is
/// the batch multi-output SGPR's under fixed hyperparameters and inducing
/// inputs (tested). Per record this costs one `m × m` site over all the
/// inducing values, whichever outputs and latents they belong to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MultiOutput {
    /// One single-latent likelihood per output, in output order.
    pub outputs: Vec<Likelihood>,
    /// `Q`, the latent GPs the coregional kernel mixes.
    pub latents: usize,
}

impl MultiOutput {
    /// `outputs` over `latents` latent GPs.
    pub fn new(outputs: Vec<Likelihood>, latents: usize) -> Result<Self> {
        if outputs.is_empty() || latents == 0 {
            return Err(ModelError::Config(
                "a multi-output model needs at least one output and one latent".into(),
            ));
        }
        if let Some(bad) = outputs.iter().find(|l| l.n_latent() != 1 || l.n_outputs() != 1) {
            return Err(ModelError::Config(format!(
                "an output's likelihood must have one latent: {} has {}",
                bad.name(),
                bad.n_latent()
            )));
        }
        Ok(MultiOutput { outputs, latents })
    }

    /// `D`.
    pub fn n_outputs(&self) -> usize {
        self.outputs.len()
    }

    /// Gaussian outputs: every site is exact in one step.
    pub fn is_conjugate(&self) -> bool {
        self.outputs.iter().all(Likelihood::is_conjugate)
    }

    /// The outputs' parameters, output after output.
    pub fn n_params(&self) -> usize {
        self.outputs.iter().map(Likelihood::n_params).sum()
    }

    /// The outputs' optimiser coordinates, output after output.
    pub fn log_params(&self) -> Vec<f64> {
        self.outputs.iter().flat_map(Likelihood::log_params).collect()
    }

    /// Sets the outputs' parameters from [`log_params`](Self::log_params)' coordinates.
    pub fn set_log_params(&mut self, p: &[f64]) {
        let mut at = 0;
        for lik in &mut self.outputs {
            let n = lik.n_params();
            lik.set_log_params(&p[at..at + n]);
            at += n;
        }
    }

    /// Names and natural-scale values, in [`log_params`](Self::log_params) order.
    pub fn named_params(&self) -> Vec<(String, f64)> {
        self.outputs
            .iter()
            .enumerate()
            .flat_map(|(d, lik)| {
                lik.named_params()
                    .into_iter()
                    .map(move |(name, v)| (format!("output{d}.{name}"), v))
            })
            .collect()
    }

    /// `"gaussian,bernoulli"`: what `--likelihood` takes.
    pub fn name(&self) -> String {
        self.outputs.iter().map(Likelihood::name).collect::<Vec<_>>().join(",")
    }

    /// The first parameter of output `d` in [`log_params`](Self::log_params).
    fn param_offset(&self, d: usize) -> usize {
        self.outputs[..d].iter().map(Likelihood::n_params).sum()
    }

    /// `E_q[log p_d(y | f_d)]` and its derivatives, its parameters' placed
    /// among all outputs'. The caller has checked `d < D`.
    pub fn expectation(&self, d: usize, mean: &[f64], var: &[f64], y: f64, out: &mut Expectation) {
        let lik = &self.outputs[d];
        lik.expectation(mean, var, y, out);
        let n_own = lik.n_params();
        let mut own = [0.0; 2];
        own[..n_own].copy_from_slice(&out.d_params[..n_own]);
        out.d_params.clear();
        out.d_params.resize(self.n_params(), 0.0);
        let offset = self.param_offset(d);
        out.d_params[offset..offset + n_own].copy_from_slice(&own[..n_own]);
    }

    /// `log p(y)` of output `d` under the latents' marginals.
    pub fn log_predictive(&self, d: usize, mean: &[f64], var: &[f64], y: f64) -> f64 {
        self.outputs[d].log_predictive(mean, var, y)
    }

    /// Output `d`'s predictive distribution under the latents' marginals.
    pub fn predict(&self, d: usize, mean: &[f64], var: &[f64]) -> Predictive {
        self.outputs[d].predict(mean, var)
    }

    /// Whether `d` is one of the outputs and `y` in its likelihood's support.
    pub fn check_label(&self, row: usize, d: usize, y: f64) -> Result<()> {
        match self.outputs.get(d) {
            Some(lik) => lik.check_label(row, y),
            None => Err(ModelError::InvalidOutput {
                row,
                output: d,
                outputs: self.n_outputs(),
            }),
        }
    }
}
