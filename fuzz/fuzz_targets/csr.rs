//! A finalize request's CSR as the server checks it (RFC 8555 §7.4),
//! byte by byte: DER parsing, the self-signature, the subject, the
//! extension request, the names against the order's and the key. The seeds
//! are real CSRs for the names below; `csr_built` gets past the signature.
#![no_main]

use acme_proxy::authority::csr::{check_csr, csr_key};
use acme_proxy::config::ExtendedKeyUsage;
use acme_proxy_protocol::types::Identifier;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|der: &[u8]| {
    let identifiers = [
        Identifier::dns("example.com"),
        Identifier::dns("www.example.com"),
        Identifier::ip("192.0.2.1"),
    ];
    let requestable = [ExtendedKeyUsage::ServerAuth, ExtendedKeyUsage::ClientAuth];
    if let Ok(checked) = check_csr(der, &identifiers, "not-the-key", &requestable) {
        // What finalize stored, the relay reads back: the same key.
        let (spki, thumbprint) = csr_key(der).expect("a checked CSR's key reads back");
        assert_eq!(spki, checked.spki_der);
        assert_eq!(thumbprint, checked.key_thumbprint);
    }
});
