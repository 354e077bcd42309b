//! A JWK of any key type: parsed, thumbprinted (RFC 7638), written back,
//! and asked to verify a signature.
#![no_main]

use acme_proxy_protocol::jwk::Jwk;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(key) = Jwk::from_value(&value) else {
        return;
    };
    let _ = key.thumbprint();
    let written = key.to_value();
    // What is written back parses to the same key.
    let again = Jwk::from_value(&written).expect("a written JWK parses");
    assert_eq!(again.thumbprint(), key.thumbprint());
    let _ = key.verify(data, data);
});
