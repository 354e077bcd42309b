//! acme-proxy: an ACME (RFC 8555) server for internal PKI.
//!
//! See ARCHITECTURE.md for the map. Layers, each using only those below:
//! `server` (assembly) → `api` (front end) → `authority` (state machine) →
//! `signer` → store (crate) → protocol (crate); `validators`, `config`,
//! `clock`, `ids`, `bounded`, `events` are leaves. `admin` (the operators'
//! operations and the CLI over them) is a front end like `api`.

pub mod admin;
pub mod api;
pub mod authority;
pub mod bounded;
pub mod clock;
pub mod config;
pub mod egress;
pub mod error;
pub mod events;
pub mod generation;
pub mod ids;
pub mod jobs;
pub mod listener;
pub mod lock;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod operator_program;
pub mod private;
pub mod server;
pub mod signer;
pub mod tls;
pub mod validators;
