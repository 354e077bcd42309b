//! What operators do beside the ACME API: the operation layer ([`ops`]),
//! plain functions over the store and the authority, and the admin CLI
//! ([`cli`]) that parses arguments for it and formats its results.

pub mod cli;
pub mod dashboard;
pub mod explain;
pub mod operators;
pub mod ops;
pub mod status;
