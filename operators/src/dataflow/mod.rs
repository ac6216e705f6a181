//! Timely-dataflow operators built on [`crate::model`].

pub mod record;

pub use record::{Prediction, Record};
