//! Pipelines (being written).
