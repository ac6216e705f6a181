//! What the model refuses, and the result type that carries it.

use thiserror::Error;

/// Everything the model can refuse. Bad records name their row so a caller
/// can route them to a dead-letter output.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ModelError {
    /// A record's input or label is NaN or infinite.
    #[error("row {row}: {what} is not finite")]
    NonFinite {
        /// The record's row.
        row: usize,
        /// Which value (an input column or the label).
        what: String,
    },
    /// Something has the wrong number of columns (or rows).
    #[error("{what}: expected {expected} columns, got {got}")]
    Dimension {
        /// What was given.
        what: String,
        /// The size the model needs.
        expected: usize,
        /// The size given.
        got: usize,
    },
    /// A label the likelihood cannot observe (a class out of range, a negative count).
    #[error("row {row}: label {label} {reason}")]
    InvalidLabel {
        /// The record's row.
        row: usize,
        /// The label.
        label: f64,
        /// Why the likelihood refuses it.
        reason: String,
    },
    /// A record observes an output the model does not have.
    #[error("row {row}: output {output} is outside 0..{outputs} (the model has {outputs} outputs, one per --likelihood entry)")]
    InvalidOutput {
        /// The record's row.
        row: usize,
        /// The output it names.
        output: usize,
        /// How many outputs the model has.
        outputs: usize,
    },
    /// A matrix stayed numerically singular at the largest jitter tried.
    #[error("Cholesky factorisation failed even with jitter {jitter:e}: {what}")]
    Cholesky {
        /// Which matrix.
        what: String,
        /// The last jitter tried.
        jitter: f64,
    },
    /// Settings that cannot work together, in a sentence.
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// A result whose error is a [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;

/// Refuses a sparse learner without inducing inputs (the dual learner's and
/// OSGPR's one message for it).
pub(crate) fn check_inducing(inducing: usize) -> Result<()> {
    if inducing == 0 {
        return Err(ModelError::Config(
            "the number of inducing inputs must be at least 1".into(),
        ));
    }
    Ok(())
}
