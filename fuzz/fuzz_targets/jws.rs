//! A request body as the server reads it before anything is
//! authenticated: the flattened JWS, its protected header, its key (a
//! `jwk` is parsed and the signature checked against it), the payload as
//! JSON, and keyChange's inner JWS.
#![no_main]

use acme_proxy_protocol::jws::{Jws, KeyRef};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let Ok(jws) = Jws::parse(body) else {
        return;
    };
    let _ = jws.is_post_as_get();
    if let KeyRef::Jwk(key) = &jws.protected.key {
        let _ = jws.verify(key);
        let _ = key.thumbprint_b64();
    }
    if let Ok(payload) = jws.payload_json() {
        // keyChange carries a JWS as its payload (RFC 8555 §7.3.5).
        if let Ok(inner) = Jws::from_value(&payload)
            && let KeyRef::Jwk(key) = &inner.protected.key
        {
            let _ = inner.verify(key);
        }
    }
});
