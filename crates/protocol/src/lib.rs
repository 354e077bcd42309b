//! acme-proxy's protocol crate: RFC 8555 wire types, strict JWK parsing and
//! JWS verification, RFC 7638 thumbprints, identifier syntax and problem types.
//!
//! Architecture Invariant: no IO, no clock, no async runtime. Everything here
//! is a pure function of its input, so it is fast to test and to fuzz.

pub mod base64url;
pub mod eab;
pub mod jwk;
pub mod jws;
pub mod names;
pub mod problem;
pub mod types;

pub use eab::{Eab, EabError};
pub use jwk::{Algorithm, Jwk, JwkError};
pub use jws::{Jws, JwsError, KeyRef};
pub use problem::{Problem, ProblemType, Subproblem};
