//! Random identifiers, tokens, nonces and serial numbers.
//!
//! All randomness comes from the operating system through `ring`, the one
//! crypto provider of the tree.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};

fn random<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    // The OS random source does not fail on supported platforms; if it ever
    // did, an all-zero value would collide on the store's UNIQUE keys and be
    // refused rather than silently reused.
    let _ = SystemRandom::new().fill(&mut buf);
    buf
}

/// An object id for URLs: 128 random bits, base64url (22 characters), never
/// starting with `-` because operators pass account and order ids to the
/// command line.
pub fn object_id() -> String {
    URL_SAFE_NO_PAD.encode(no_leading_dash::<16>())
}

/// A challenge token: 128 random bits as RFC 8555 §8.3 requires (at least).
pub fn token() -> String {
    URL_SAFE_NO_PAD.encode(random::<16>())
}

/// A nonce (RFC 8555 §6.5): 128 random bits, base64url.
pub fn nonce() -> String {
    URL_SAFE_NO_PAD.encode(random::<16>())
}

/// A certificate serial number: 16 random octets with the top bit cleared
/// (so the DER INTEGER is positive without padding): 127 bits of entropy,
/// more than the 64 the CA/Browser Forum asks for.
pub fn serial() -> [u8; 16] {
    let mut s = random::<16>();
    s[0] &= 0x7f;
    if s[0] == 0 {
        // Keep the encoding 16 octets long so serials sort and print evenly.
        s[0] = 0x01;
    }
    s
}

/// Random octets whose base64url text does not start with `-`: command
/// lines take such a value for an option (`certbot --eab-hmac-key -Ab…`
/// stops with a usage error), and EAB values are pasted into command lines.
/// Drawing again costs 1/64 of the space (under 0.03 bits).
fn no_leading_dash<const N: usize>() -> [u8; N] {
    loop {
        let raw = random::<N>();
        // The first character encodes the top six bits; `-` is value 62.
        if N == 0 || raw[0] >> 2 != 62 {
            return raw;
        }
    }
}

/// An External Account Binding key id: 96 random bits, base64url (16
/// characters), short enough to paste.
pub fn eab_kid() -> String {
    URL_SAFE_NO_PAD.encode(no_leading_dash::<12>())
}

/// An External Account Binding HMAC key: 256 bits (HS256's block-size
/// recommendation, RFC 7518 §3.2, asks for at least the hash size).
pub fn eab_hmac_key() -> [u8; 32] {
    no_leading_dash::<32>()
}

/// A request id for logs and the `X-Request-Id` header: 48 random bits, hex.
pub fn request_id() -> String {
    hex::encode(random::<6>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_object_id_eab_key_id_or_key_starts_with_a_dash() {
        // Without the redraw, one in 64 would: 4,000 of each all but
        // certainly include some.
        for _ in 0..4000 {
            let id = object_id();
            let kid = eab_kid();
            let key = URL_SAFE_NO_PAD.encode(eab_hmac_key());
            assert!(!id.starts_with('-'), "{id}");
            assert!(!kid.starts_with('-'), "{kid}");
            assert!(!key.starts_with('-'), "{key}");
        }
    }
}
