//! The integration suite of the acme-proxy crate: one test binary (one link
//! on a 2-core machine), one module per subject.

// Tests and their helpers fail by panicking; that is how a test reports.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod admin;
mod ari;
mod audit;
mod browser;
mod challenges;
mod cli_safety;
mod client;
mod clients;
mod concurrency;
mod connections;
mod console;
mod console_api;
#[cfg(feature = "failpoints")]
mod crash;
mod custom;
mod db;
mod dns_api;
mod dns_zone;
mod eab;
mod egress;
mod fairness;
mod finalize;
mod flow;
mod harness;
#[cfg(feature = "pkcs11")]
mod hsm;
mod ipam;
mod jobs;
mod jws_table;
mod lock;
mod metrics;
mod notify;
mod operations;
mod package;
mod policy;
mod postgres;
mod profiles;
mod proxy;
mod rate_limits;
mod raw;
mod recheck;
mod recovery;
mod relay;
mod reload;
mod replicas;
mod resources;
mod shared_database;
mod signer_trait;
mod startup;
mod storage_faults;
mod tls;
mod upstream;
mod zero_config;
