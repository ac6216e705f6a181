//! The dual sparse Gaussian process of Chang et al. (ICML 2023) and the
//! timely-dataflow operators that learn it from streams.
//!
//! [`model`] holds the mathematics with no dataflow types; [`dataflow`] the
//! operators built on it.

#![warn(missing_docs)]

pub mod dataflow;
pub mod model;

/// The timely this crate is built on: an embedder who uses it (rather
/// than a `timely` dependency of their own) cannot end up with two versions.
pub use timely;
