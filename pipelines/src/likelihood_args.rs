//! The likelihood flags every command that learns from a stream shares
//! (`eval`, `replay`, `serve`, and a pipeline file's top-level keys).

use anyhow::{anyhow, Result};
use clap::Args;
use dualgp_operators::model::Likelihood;

/// `--likelihood` and `--latents`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct LikelihoodArgs {
    /// gaussian | bernoulli[:logit] | poisson | student-t | softmax:C, or a
    /// comma-separated list, one per output (`--likelihood
    /// gaussian,bernoulli`; each record then names its output)
    #[arg(long = "likelihood", value_name = "LIKELIHOOD")]
    pub spec: String,
    /// Shared latent GPs of a multi-output model (default: one per output)
    #[arg(long)]
    pub latents: Option<usize>,
}

impl LikelihoodArgs {
    /// One output's likelihood, `spec` as `--likelihood` takes it.
    pub fn new(spec: &str) -> Self {
        LikelihoodArgs {
            spec: spec.into(),
            latents: None,
        }
    }

    /// The likelihood these flags name.
    pub fn parse(&self) -> Result<Likelihood> {
        Likelihood::parse_outputs(&self.spec, self.latents).map_err(|e| anyhow!("--likelihood: {e}"))
    }
}
