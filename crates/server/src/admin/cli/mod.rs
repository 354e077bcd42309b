//! The admin CLI: one module per command noun, each thin formatting over
//! [`crate::admin::ops`], and what they share in [`common`].

pub mod account;
pub mod admin;
pub mod audit;
pub mod cert;
pub mod common;
pub mod db;
pub mod dns;
pub mod eab;
pub mod job;
pub mod nonce;
pub mod order;
pub mod policy;
pub mod ratelimit;
pub mod status;
pub mod upstream;
