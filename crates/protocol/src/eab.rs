//! External Account Binding (RFC 8555 §7.3.4): the JWS a newAccount payload
//! carries in `externalAccountBinding`, MACed with a key the CA handed out
//! beforehand, whose payload is the account key being registered.
//!
//! This module parses the binding and checks the MAC; which credentials
//! exist, and what a profile requires, is the server's business.

use serde_json::{Map, Value};

use crate::jwk::Jwk;

/// Why a binding was refused, before any credential was looked up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EabError {
    #[error("externalAccountBinding must be a flattened JWS object")]
    NotFlattened,
    #[error("externalAccountBinding: member {0:?} is missing or not a string")]
    MissingMember(&'static str),
    #[error("externalAccountBinding: {0} is not base64url")]
    NotBase64(&'static str),
    #[error("externalAccountBinding: the protected header is not a JSON object")]
    HeaderNotObject,
    #[error("externalAccountBinding: header {0:?} is missing or not a string")]
    MissingHeader(&'static str),
    #[error(
        "externalAccountBinding: alg {0:?} is not accepted; sign the binding with HS256 and the key the CA gave you"
    )]
    UnsupportedAlgorithm(String),
    #[error(
        "externalAccountBinding: the protected header must not carry a nonce (RFC 8555 §7.3.4)"
    )]
    Nonce,
    #[error("externalAccountBinding: the payload is not a valid public JWK ({0})")]
    BadKey(String),
}

/// A parsed, not yet verified, binding.
#[derive(Clone, Debug)]
pub struct Eab {
    /// The key identifier the CA handed out.
    pub kid: String,
    /// The header's `url`; RFC 8555 §7.3.4 wants the newAccount URL.
    pub url: String,
    /// The payload: the account key being bound.
    pub key: Jwk,
    signing_input: Vec<u8>,
    mac: Vec<u8>,
}

impl Eab {
    /// Parses `externalAccountBinding`: a flattened JWS whose protected
    /// header has `alg` HS256, `kid` and `url` and no `nonce`, and whose
    /// payload is a public JWK.
    pub fn parse(value: &Value) -> Result<Self, EabError> {
        let obj = value.as_object().ok_or(EabError::NotFlattened)?;
        if obj.contains_key("signatures") || obj.contains_key("header") {
            return Err(EabError::NotFlattened);
        }
        let protected_b64 = member(obj, "protected")?;
        let payload_b64 = member(obj, "payload")?;
        let mac = decode(member(obj, "signature")?, "signature")?;
        let header: Value = serde_json::from_slice(&decode(protected_b64, "protected")?)
            .map_err(|_| EabError::HeaderNotObject)?;
        let header = header.as_object().ok_or(EabError::HeaderNotObject)?;
        let text = |name: &'static str| {
            header
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or(EabError::MissingHeader(name))
        };
        let alg = text("alg")?;
        if alg != "HS256" {
            return Err(EabError::UnsupportedAlgorithm(alg));
        }
        if header.contains_key("nonce") {
            return Err(EabError::Nonce);
        }
        let kid = text("kid")?;
        let url = text("url")?;
        let payload: Value = serde_json::from_slice(&decode(payload_b64, "payload")?)
            .map_err(|e| EabError::BadKey(e.to_string()))?;
        let key = Jwk::from_value(&payload).map_err(|e| EabError::BadKey(e.to_string()))?;
        Ok(Self {
            kid,
            url,
            key,
            signing_input: format!("{protected_b64}.{payload_b64}").into_bytes(),
            mac,
        })
    }

    /// True when the MAC is HMAC-SHA256 of the signing input under `key`,
    /// compared in constant time (ring's `hmac::verify`).
    pub fn verify(&self, key: &[u8]) -> bool {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
        ring::hmac::verify(&key, &self.signing_input, &self.mac).is_ok()
    }
}

fn member<'a>(obj: &'a Map<String, Value>, name: &'static str) -> Result<&'a str, EabError> {
    obj.get(name)
        .and_then(Value::as_str)
        .ok_or(EabError::MissingMember(name))
}

fn decode(s: &str, name: &'static str) -> Result<Vec<u8>, EabError> {
    crate::base64url::decode(s).map_err(|_| EabError::NotBase64(name))
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use serde_json::json;

    use super::*;

    fn b64(b: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(b)
    }

    fn jwk() -> Value {
        // A P-256 point (the generator), enough for a well-formed key.
        json!({
            "kty": "EC", "crv": "P-256",
            "x": "axfR8uEsQkf4vOblY6RA8ncDfYEt6zOg9KE5RdiYwpY",
            "y": "T-NC4v4af5uO5-tKfA-eFivOM1drMV7Oy7ZAaDe_UfU"
        })
    }

    fn binding(header: Value, payload: &Value, key: &[u8]) -> Value {
        let p = b64(header.to_string().as_bytes());
        let b = b64(payload.to_string().as_bytes());
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
        let tag = ring::hmac::sign(&k, format!("{p}.{b}").as_bytes());
        json!({"protected": p, "payload": b, "signature": b64(tag.as_ref())})
    }

    fn header() -> Value {
        json!({"alg": "HS256", "kid": "kid-1", "url": "https://ca.test/new-account"})
    }

    #[test]
    fn a_binding_macd_with_the_right_key_verifies_and_names_kid_url_and_key() {
        let v = binding(header(), &jwk(), b"0123456789abcdef0123456789abcdef");
        let eab = Eab::parse(&v).unwrap();
        assert_eq!(eab.kid, "kid-1");
        assert_eq!(eab.url, "https://ca.test/new-account");
        assert_eq!(eab.key, Jwk::from_value(&jwk()).unwrap());
        assert!(eab.verify(b"0123456789abcdef0123456789abcdef"));
        assert!(!eab.verify(b"0123456789abcdef0123456789abcdeX"));
    }

    #[test]
    fn a_binding_whose_header_was_changed_after_signing_does_not_verify() {
        let v = binding(header(), &jwk(), b"k");
        let mut h = header();
        h["url"] = json!("https://ca.test/other");
        let mut forged = v.clone();
        forged["protected"] = json!(b64(h.to_string().as_bytes()));
        assert!(Eab::parse(&v).unwrap().verify(b"k"));
        assert!(!Eab::parse(&forged).unwrap().verify(b"k"));
    }

    #[test]
    fn a_binding_member_with_trailing_padding_is_refused_even_if_its_mac_is_right() {
        // RFC 8555 §6.1: values with trailing '=' MUST be rejected. The
        // MAC is over the members as sent, so a padded member is MACed too.
        let key = b"k";
        let good = binding(header(), &jwk(), key);
        assert!(Eab::parse(&good).unwrap().verify(key));
        for member in ["protected", "payload", "signature"] {
            let mut padded = good.clone();
            padded[member] = json!(format!("{}=", good[member].as_str().unwrap()));
            if member != "signature" {
                let (p, b) = (
                    padded["protected"].as_str().unwrap(),
                    padded["payload"].as_str().unwrap(),
                );
                let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
                let tag = ring::hmac::sign(&k, format!("{p}.{b}").as_bytes());
                padded["signature"] = json!(b64(tag.as_ref()));
            }
            assert_eq!(
                Eab::parse(&padded).unwrap_err(),
                EabError::NotBase64(member),
                "{member}"
            );
        }
    }

    #[test]
    fn other_algorithms_a_nonce_and_missing_members_are_refused() {
        let mut h = header();
        h["alg"] = json!("ES256");
        assert!(matches!(
            Eab::parse(&binding(h, &jwk(), b"k")),
            Err(EabError::UnsupportedAlgorithm(_))
        ));
        let mut h = header();
        h["nonce"] = json!("n");
        assert_eq!(
            Eab::parse(&binding(h, &jwk(), b"k")).unwrap_err(),
            EabError::Nonce
        );
        let mut h = header();
        h.as_object_mut().unwrap().remove("kid");
        assert_eq!(
            Eab::parse(&binding(h, &jwk(), b"k")).unwrap_err(),
            EabError::MissingHeader("kid")
        );
        assert_eq!(
            Eab::parse(&json!("compact.jws.string")).unwrap_err(),
            EabError::NotFlattened
        );
        assert!(matches!(
            Eab::parse(&binding(
                header(),
                &json!({"kty": "oct", "k": "AAAA"}),
                b"k"
            )),
            Err(EabError::BadKey(_))
        ));
    }
}
