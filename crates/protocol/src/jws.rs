//! Flattened JWS (RFC 7515 §7.2.2) as RFC 8555 §6.2 restricts it.
//!
//! [`Jws::parse`] checks everything that does not need state: the
//! serialization, the protected header's members, `crit`, exactly one of
//! `jwk`/`kid`, and a supported `alg`. [`Jws::verify`] checks the signature
//! with the algorithm taken from the key. Nonces, `url` and account lookup
//! need the server's state and are checked by the front end.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value};

use crate::jwk::{Algorithm, Jwk, JwkError};
use crate::problem::ProblemType;

/// Why a JWS was refused, each with the problem type RFC 8555 §6.7 assigns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwsError {
    #[error(
        "the request body is not JSON; ACME requires the flattened JWS JSON serialization (RFC 8555 §6.2)"
    )]
    NotJson,
    #[error("the JWS must use the flattened JSON serialization (RFC 8555 §6.2), not {0}")]
    NotFlattened(&'static str),
    #[error("the JWS has no string member {0:?}")]
    MissingMember(&'static str),
    #[error("the JWS member {0:?} is not valid unpadded base64url")]
    BadBase64(&'static str),
    #[error("the JWS member {0:?} is not allowed in ACME requests (RFC 8555 §6.2)")]
    ForbiddenMember(&'static str),
    #[error("the protected header is not a JSON object")]
    HeaderNotObject,
    #[error("the protected header has no string member {0:?}")]
    MissingHeader(&'static str),
    #[error("the protected header must not contain \"crit\": no extensions are understood here")]
    Crit,
    #[error(
        "the protected header must contain exactly one of \"jwk\" and \"kid\" (RFC 8555 §6.2), it has both"
    )]
    BothJwkAndKid,
    #[error(
        "the protected header must contain exactly one of \"jwk\" and \"kid\" (RFC 8555 §6.2), it has neither"
    )]
    NeitherJwkNorKid,
    #[error("algorithm {0:?} is not supported; use one of ES256, ES384, RS256, EdDSA")]
    UnsupportedAlgorithm(String),
    #[error("the header says {header:?} but the key signs with {key}")]
    AlgorithmMismatch { header: String, key: &'static str },
    #[error("bad public key: {0}")]
    BadKey(#[from] JwkError),
    #[error("the JWS signature does not verify")]
    BadSignature,
    #[error("the payload is not a JSON object")]
    PayloadNotObject,
}

impl JwsError {
    /// The RFC 8555 §6.7 problem type for this failure.
    pub fn problem_type(&self) -> ProblemType {
        match self {
            Self::UnsupportedAlgorithm(_) | Self::AlgorithmMismatch { .. } => {
                ProblemType::BadSignatureAlgorithm
            }
            Self::BadKey(_) => ProblemType::BadPublicKey,
            _ => ProblemType::Malformed,
        }
    }
}

/// How the request names its signing key (RFC 8555 §6.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRef {
    /// `jwk`: newAccount, revokeCert by certificate key, keyChange's inner JWS.
    Jwk(Jwk),
    /// `kid`: the account URL.
    Kid(String),
}

/// The protected header's members that ACME uses.
#[derive(Clone, Debug)]
pub struct Protected {
    pub alg: Algorithm,
    /// The header's `alg` string exactly as sent.
    pub alg_name: String,
    pub nonce: Option<String>,
    pub url: String,
    pub key: KeyRef,
}

/// A parsed, not yet verified, flattened JWS.
#[derive(Clone, Debug)]
pub struct Jws {
    pub protected: Protected,
    /// The decoded payload; empty for POST-as-GET (RFC 8555 §6.3).
    pub payload: Vec<u8>,
    signing_input: Vec<u8>,
    signature: Vec<u8>,
}

impl Jws {
    /// Parses a request body (see the module documentation).
    pub fn parse(body: &[u8]) -> Result<Self, JwsError> {
        let value: Value = serde_json::from_slice(body).map_err(|_| JwsError::NotJson)?;
        let obj = match value {
            Value::Object(obj) => obj,
            Value::String(_) => return Err(JwsError::NotFlattened("the compact serialization")),
            _ => return Err(JwsError::NotJson),
        };
        Self::from_object(&obj)
    }

    /// Parses a JWS given as a JSON value, e.g. keyChange's inner JWS.
    pub fn from_value(value: &Value) -> Result<Self, JwsError> {
        match value {
            Value::Object(obj) => Self::from_object(obj),
            _ => Err(JwsError::NotFlattened("a non-object")),
        }
    }

    fn from_object(obj: &Map<String, Value>) -> Result<Self, JwsError> {
        if obj.contains_key("signatures") {
            return Err(JwsError::NotFlattened("the general serialization"));
        }
        if obj.contains_key("header") {
            // RFC 8555 §6.2: "The JWS Unprotected Header MUST NOT be used".
            return Err(JwsError::ForbiddenMember("header"));
        }
        for member in obj.keys() {
            if !matches!(member.as_str(), "protected" | "payload" | "signature") {
                return Err(JwsError::ForbiddenMember("unknown member"));
            }
        }
        let protected_b64 = str_member(obj, "protected")?;
        let payload_b64 = str_member(obj, "payload")?;
        let signature_b64 = str_member(obj, "signature")?;

        let header_bytes = decode(protected_b64, "protected")?;
        let payload = decode(payload_b64, "payload")?;
        let signature = decode(signature_b64, "signature")?;

        let header: Value =
            serde_json::from_slice(&header_bytes).map_err(|_| JwsError::HeaderNotObject)?;
        let header = header.as_object().ok_or(JwsError::HeaderNotObject)?;

        if header.contains_key("crit") {
            return Err(JwsError::Crit);
        }
        let alg_name = header
            .get("alg")
            .and_then(Value::as_str)
            .ok_or(JwsError::MissingHeader("alg"))?
            .to_owned();
        let alg = Algorithm::from_name(&alg_name)
            .ok_or_else(|| JwsError::UnsupportedAlgorithm(alg_name.clone()))?;
        let key = match (header.get("jwk"), header.get("kid")) {
            (Some(_), Some(_)) => return Err(JwsError::BothJwkAndKid),
            (None, None) => return Err(JwsError::NeitherJwkNorKid),
            (Some(jwk), None) => KeyRef::Jwk(Jwk::from_value(jwk)?),
            (None, Some(kid)) => KeyRef::Kid(
                kid.as_str()
                    .ok_or(JwsError::MissingHeader("kid"))?
                    .to_owned(),
            ),
        };
        let nonce = match header.get("nonce") {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .ok_or(JwsError::MissingHeader("nonce"))?
                    .to_owned(),
            ),
        };
        let url = header
            .get("url")
            .and_then(Value::as_str)
            .ok_or(JwsError::MissingHeader("url"))?
            .to_owned();

        let mut signing_input = Vec::with_capacity(protected_b64.len() + 1 + payload_b64.len());
        signing_input.extend_from_slice(protected_b64.as_bytes());
        signing_input.push(b'.');
        signing_input.extend_from_slice(payload_b64.as_bytes());

        Ok(Self {
            protected: Protected {
                alg,
                alg_name,
                nonce,
                url,
                key,
            },
            payload,
            signing_input,
            signature,
        })
    }

    /// Verifies the signature with `key`, whose own algorithm must be the
    /// one the header names (RFC 8555 §6.2: the algorithm is never chosen by
    /// the header alone).
    pub fn verify(&self, key: &Jwk) -> Result<(), JwsError> {
        if key.algorithm() != self.protected.alg {
            return Err(JwsError::AlgorithmMismatch {
                header: self.protected.alg_name.clone(),
                key: key.algorithm().name(),
            });
        }
        if key.verify(&self.signing_input, &self.signature) {
            Ok(())
        } else {
            Err(JwsError::BadSignature)
        }
    }

    /// True for POST-as-GET (RFC 8555 §6.3): the payload is the empty string.
    pub fn is_post_as_get(&self) -> bool {
        self.payload.is_empty()
    }

    /// The payload as a JSON value; for requests that need an object.
    pub fn payload_json(&self) -> Result<Value, JwsError> {
        let v: Value =
            serde_json::from_slice(&self.payload).map_err(|_| JwsError::PayloadNotObject)?;
        if v.is_object() {
            Ok(v)
        } else {
            Err(JwsError::PayloadNotObject)
        }
    }
}

fn str_member<'a>(obj: &'a Map<String, Value>, name: &'static str) -> Result<&'a str, JwsError> {
    obj.get(name)
        .and_then(Value::as_str)
        .ok_or(JwsError::MissingMember(name))
}

fn decode(s: &str, name: &'static str) -> Result<Vec<u8>, JwsError> {
    URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| JwsError::BadBase64(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    use serde_json::json;

    fn p256() -> (EcdsaKeyPair, Jwk) {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let jwk =
            Jwk::from_ec_point(crate::jwk::EcCurve::P256, pair.public_key().as_ref()).unwrap();
        (pair, jwk)
    }

    fn sign(pair: &EcdsaKeyPair, header: Value, payload: &[u8]) -> Vec<u8> {
        let p = URL_SAFE_NO_PAD.encode(header.to_string());
        let b = URL_SAFE_NO_PAD.encode(payload);
        let rng = ring::rand::SystemRandom::new();
        let sig = pair.sign(&rng, format!("{p}.{b}").as_bytes()).unwrap();
        json!({"protected": p, "payload": b, "signature": URL_SAFE_NO_PAD.encode(sig)})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn a_well_formed_jws_parses_and_verifies() {
        let (pair, jwk) = p256();
        let body = sign(
            &pair,
            json!({"alg": "ES256", "jwk": jwk.to_value(), "nonce": "abc", "url": "https://x/"}),
            b"{}",
        );
        let jws = Jws::parse(&body).unwrap();
        assert_eq!(jws.protected.url, "https://x/");
        jws.verify(&jwk).unwrap();
    }

    #[test]
    fn a_header_alg_that_differs_from_the_key_is_refused_even_if_supported() {
        let (pair, jwk) = p256();
        let body = sign(
            &pair,
            json!({"alg": "RS256", "jwk": jwk.to_value(), "nonce": "abc", "url": "u"}),
            b"{}",
        );
        let jws = Jws::parse(&body).unwrap();
        let err = jws.verify(&jwk).unwrap_err();
        assert_eq!(err.problem_type(), ProblemType::BadSignatureAlgorithm);
    }

    #[test]
    fn structural_faults_are_malformed() {
        let (pair, jwk) = p256();
        let cases: Vec<(Vec<u8>, JwsError)> = vec![
            (b"a.b.c".to_vec(), JwsError::NotJson),
            (
                b"\"a.b.c\"".to_vec(),
                JwsError::NotFlattened("the compact serialization"),
            ),
            (
                sign(
                    &pair,
                    json!({"alg": "ES256", "jwk": jwk.to_value(), "kid": "k", "url": "u"}),
                    b"",
                ),
                JwsError::BothJwkAndKid,
            ),
            (
                sign(&pair, json!({"alg": "ES256", "url": "u"}), b""),
                JwsError::NeitherJwkNorKid,
            ),
            (
                sign(
                    &pair,
                    json!({"alg": "ES256", "kid": "k", "url": "u", "crit": ["b64"]}),
                    b"",
                ),
                JwsError::Crit,
            ),
            (
                sign(&pair, json!({"alg": "none", "kid": "k", "url": "u"}), b""),
                JwsError::UnsupportedAlgorithm("none".into()),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(Jws::parse(&body).unwrap_err(), want);
        }
    }
}
