//! The integration suite of the acme-proxy crate: one test binary (one link
//! on a 2-core machine), one module per subject.

mod client;
mod flow;
mod harness;
