//! Identifier values as clients send them: DNS names (IDNA, wildcards,
//! lengths), the globs operators write against them, and ARI certificate
//! ids (RFC 9773 §4.1).
#![no_main]

use acme_proxy_protocol::names::{check_dns_name, glob_matches};
use acme_proxy_protocol::types::CertId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(name) = check_dns_name(text) {
        let _ = name.is_wildcard();
        let base = name.base().to_owned();
        // A checked name is its own canonical form.
        let again = check_dns_name(name.as_str()).expect("a checked name checks again");
        assert_eq!(again.as_str(), name.as_str());
        assert!(base.len() <= name.as_str().len());
    }
    if let Some((pattern, name)) = text.split_once('\n') {
        let _ = glob_matches(pattern, name);
    }
    if let Some(id) = CertId::parse(text) {
        assert_eq!(CertId::parse(&id.to_string()), Some(id));
    }
});
