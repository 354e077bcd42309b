//! acme-proxy: an ACME (RFC 8555) server for internal PKI.
//!
//! See ARCHITECTURE.md for the map. Layers, each using only those below:
//! `server` (assembly) → `api` (front end) → `authority` (state machine) →
//! `signer` → store (crate) → protocol (crate); `validation`, `config`,
//! `clock`, `ids`, `bounded`, `events` are leaves.

pub mod api;
pub mod authority;
pub mod bounded;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod events;
pub mod hardened;
pub mod ids;
pub mod jobs;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod ops;
pub mod private;
pub mod server;
pub mod signer;
pub mod tls;
pub mod validation;
