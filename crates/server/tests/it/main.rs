//! The integration suite of the acme-proxy crate: one test binary (one link
//! on a 2-core machine), one module per subject.

mod client;
mod clients;
mod concurrency;
mod flow;
mod harness;
mod jws_table;
mod raw;
mod zero_config;
