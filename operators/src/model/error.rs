use thiserror::Error;

/// Everything the model can refuse. Bad records name their row so a caller
/// can route them to a dead-letter output.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ModelError {
    #[error("row {row}: {what} is not finite")]
    NonFinite { row: usize, what: String },
    #[error("{what}: expected {expected} columns, got {got}")]
    Dimension { what: String, expected: usize, got: usize },
    #[error("row {row}: label {label} {reason}")]
    InvalidLabel { row: usize, label: f64, reason: String },
    /// A record observes an output the model does not have.
    #[error("row {row}: output {output} is outside 0..{outputs} (the model has {outputs} outputs, one per --likelihood entry)")]
    InvalidOutput { row: usize, output: usize, outputs: usize },
    #[error("Cholesky factorisation failed even with jitter {jitter:e}: {what}")]
    Cholesky { what: String, jitter: f64 },
    #[error("invalid configuration: {0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;
