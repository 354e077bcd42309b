//! What the relay reads from an upstream CA before trusting any of it:
//! the directory, orders, authorizations with their challenges, renewal
//! information and problem documents (RFC 8555 §7.1, §6.7; RFC 9773).
#![no_main]

use acme_proxy_protocol::problem::{Problem, ProblemType};
use acme_proxy_protocol::types::{Authorization, Directory, Order, RenewalInfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<Directory>(data);
    let _ = serde_json::from_slice::<Order>(data);
    let _ = serde_json::from_slice::<Authorization>(data);
    let _ = serde_json::from_slice::<RenewalInfo>(data);
    if let Ok(problem) = serde_json::from_slice::<Problem>(data) {
        let _ = ProblemType::from_urn(&problem.kind);
    }
});
