//! The observation model of a multi-output GP on its `Q` latents.

use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

use crate::model::error::{ModelError, Result};
use crate::model::likelihood::{Expectation, Likelihood, Predictive};

/// `D` outputs with one likelihood each, observed through
/// `f_d = Σ_q a_{q,d} u_q` (rank-one coregionalisation `B_q = a_q a_qᵀ`).
///
/// Approximation (the seed's, Moreno-Muñoz et al. Eq. 6): the posterior over
/// the latents is mean-field, `q(u) = Π_q q(u_q)`, each `q(u_q)` held by its
/// own dual sites as the posterior holds any latent. Under it
/// `q(f_d(x)) = N(Σ_q a_{q,d} μ_q, Σ_q a_{q,d}² v_q)` exactly, so a record that
/// observes output `d` sets a site on every latent by the chain rule:
/// `α̂_q = a_{q,d} ∂E/∂μ_f`, `β̂_q = a_{q,d}² β̂_f`, the natural-gradient fixed
/// point of the mean-field bound. A latent with `a_{q,d} = 0` gets a zero
/// site from that record; an output a record does not observe contributes
/// nothing (asynchronous channels). Per record this costs `Q` sites, so the
/// per-point stage stays `O(Q m²)`; a joint `q(u)` over all `Q m` inducing
/// values would cost `O(Q² m²)` per record. For Gaussian outputs the
/// mean-field posterior mean equals the exact multi-output SGPR's; its
/// covariance is the inverse of the exact precision's diagonal blocks (tested).
///
/// The latents share the posterior's kernel and inducing inputs (as softmax
/// classes do): per-latent kernels are not implemented.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MultiOutput {
    /// One single-latent likelihood per output, in output order.
    pub outputs: Vec<Likelihood>,
    /// `Q × D`: column `d` holds output `d`'s loadings `a_{·,d}`.
    pub mixing: DMatrix<f64>,
}

/// The off-diagonal loading of [`MultiOutput::new`]'s starting mixing matrix.
pub const CROSS_LOADING: f64 = 0.1;

impl MultiOutput {
    /// `outputs` over `latents` latents, mixing started at `a_{q,d} = 1` for
    /// `q = d mod Q` and ±[`CROSS_LOADING`] elsewhere: every output starts
    /// on a latent of its own, and no loading starts at zero (a latent loaded
    /// by no output would get no sites, hence no gradient to leave zero by).
    pub fn new(outputs: Vec<Likelihood>, latents: usize) -> Result<Self> {
        let d = outputs.len();
        let mixing = DMatrix::from_fn(latents, d, |q, o| {
            if q == o % latents.max(1) {
                1.0
            } else if (q + o) % 2 == 0 {
                CROSS_LOADING
            } else {
                -CROSS_LOADING
            }
        });
        MultiOutput::with_mixing(outputs, mixing)
    }

    /// `outputs` with a given `Q × D` mixing matrix.
    pub fn with_mixing(outputs: Vec<Likelihood>, mixing: DMatrix<f64>) -> Result<Self> {
        if outputs.is_empty() || mixing.nrows() == 0 {
            return Err(ModelError::Config(
                "a multi-output model needs at least one output and one latent".into(),
            ));
        }
        if mixing.ncols() != outputs.len() {
            return Err(ModelError::Dimension {
                what: "mixing matrix (one column per output)".into(),
                expected: outputs.len(),
                got: mixing.ncols(),
            });
        }
        if let Some(bad) = outputs.iter().find(|l| l.n_latent() != 1 || l.n_outputs() != 1) {
            return Err(ModelError::Config(format!(
                "an output's likelihood must have one latent: {} has {}",
                bad.name(),
                bad.n_latent()
            )));
        }
        if mixing.iter().any(|a| !a.is_finite()) {
            return Err(ModelError::Config("the mixing matrix must be finite".into()));
        }
        Ok(MultiOutput { outputs, mixing })
    }

    /// `Q`.
    pub fn n_latent(&self) -> usize {
        self.mixing.nrows()
    }

    /// `D`.
    pub fn n_outputs(&self) -> usize {
        self.outputs.len()
    }

    /// One latent under Gaussian outputs: the sites are exact in one step.
    /// With more latents a simultaneous update of all of them overshoots
    /// (two latents that load one output alike each take the whole
    /// residual), so those E-steps are damped and checked.
    pub fn is_conjugate(&self) -> bool {
        self.n_latent() == 1 && self.outputs.iter().all(Likelihood::is_conjugate)
    }

    /// The outputs' parameters, then the `Q·D` loadings (column-major).
    pub fn n_params(&self) -> usize {
        self.outputs.iter().map(Likelihood::n_params).sum::<usize>() + self.mixing.len()
    }

    /// The optimiser's coordinates: each output's log-parameters, then the
    /// loadings themselves (they take either sign).
    pub fn log_params(&self) -> Vec<f64> {
        let mut p: Vec<f64> = self.outputs.iter().flat_map(Likelihood::log_params).collect();
        p.extend(self.mixing.iter());
        p
    }

    pub fn set_log_params(&mut self, p: &[f64]) {
        let mut at = 0;
        for lik in &mut self.outputs {
            let n = lik.n_params();
            lik.set_log_params(&p[at..at + n]);
            at += n;
        }
        self.mixing.as_mut_slice().copy_from_slice(&p[at..]);
    }

    /// Names and natural-scale values, in [`log_params`](Self::log_params) order.
    pub fn named_params(&self) -> Vec<(String, f64)> {
        let mut named: Vec<(String, f64)> = self
            .outputs
            .iter()
            .enumerate()
            .flat_map(|(d, lik)| {
                lik.named_params()
                    .into_iter()
                    .map(move |(name, v)| (format!("output{d}.{name}"), v))
            })
            .collect();
        for d in 0..self.n_outputs() {
            for q in 0..self.n_latent() {
                named.push((format!("mixing.latent{q}.output{d}"), self.mixing[(q, d)]));
            }
        }
        named
    }

    /// `"gaussian,bernoulli"`: what `--likelihood` takes.
    pub fn name(&self) -> String {
        self.outputs.iter().map(Likelihood::name).collect::<Vec<_>>().join(",")
    }

    /// Output `d`'s marginal `(μ_f, v_f)` from the latents' marginals.
    pub fn combine(&self, d: usize, mean: &[f64], var: &[f64]) -> (f64, f64) {
        let a = self.mixing.column(d);
        let mu = a.iter().zip(mean).map(|(a, m)| a * m).sum();
        let v = a.iter().zip(var).map(|(a, v)| a * a * v).sum();
        (mu, v)
    }

    /// The first parameter of output `d` in [`log_params`](Self::log_params).
    fn param_offset(&self, d: usize) -> usize {
        self.outputs[..d].iter().map(Likelihood::n_params).sum()
    }

    /// `E_q[log p_d(y | f_d)]` and its derivatives in each latent's `(μ_q, v_q)`
    /// (the chain rule through `f_d = aᵀu`), in output `d`'s parameters and
    /// in the loadings. The caller has checked `d < D`.
    pub fn expectation(&self, d: usize, mean: &[f64], var: &[f64], y: f64, out: &mut Expectation) {
        let (mu, v) = self.combine(d, mean, var);
        let lik = &self.outputs[d];
        lik.expectation(&[mu], &[v], y, out);
        let (g_mean, g_var, beta) = (out.d_mean[0], out.d_var[0], out.beta[0]);
        let n_own = lik.n_params();
        let mut own = [0.0; 2];
        own[..n_own].copy_from_slice(&out.d_params[..n_own]);

        let q_count = self.n_latent();
        out.d_mean.resize(q_count, 0.0);
        out.d_var.resize(q_count, 0.0);
        out.beta.resize(q_count, 0.0);
        out.d_params.clear();
        out.d_params.resize(self.n_params(), 0.0);
        let offset = self.param_offset(d);
        out.d_params[offset..offset + n_own].copy_from_slice(&own[..n_own]);
        let mixing_at = self.n_params() - self.mixing.len() + d * q_count;
        for q in 0..q_count {
            let a = self.mixing[(q, d)];
            out.d_mean[q] = a * g_mean;
            out.d_var[q] = a * a * g_var;
            out.beta[q] = a * a * beta;
            out.d_params[mixing_at + q] = g_mean * mean[q] + 2.0 * a * g_var * var[q];
        }
    }

    pub fn log_predictive(&self, d: usize, mean: &[f64], var: &[f64], y: f64) -> f64 {
        let (mu, v) = self.combine(d, mean, var);
        self.outputs[d].log_predictive(&[mu], &[v], y)
    }

    pub fn predict(&self, d: usize, mean: &[f64], var: &[f64]) -> Predictive {
        let (mu, v) = self.combine(d, mean, var);
        self.outputs[d].predict(&[mu], &[v])
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
