//! Learners to compare against, built from the same parts: Bui et al.'s
//! streaming sparse GP, Kapoor et al.'s VAR-GP and the offline trainer that
//! sees all data at once.

pub mod offline;
pub mod osgpr;
pub mod var_gp;
