//! The dual sparse Gaussian process of Chang et al. (ICML 2023) and the
//! timely-dataflow operators that learn it from streams.
//!
//! [`model`] holds the mathematics with no dataflow types; [`dataflow`] the
//! operators built on it.

#![warn(missing_docs)]

pub mod dataflow;
pub mod model;
