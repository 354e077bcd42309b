//! Flattened JWS (RFC 7515 §7.2.2) as RFC 8555 §6.2 restricts it.
//!
//! [`Jws::parse`] checks everything that does not need state: the
//! serialization, the protected header's members, `crit`, exactly one of
//! `jwk`/`kid`, and a supported `alg`. [`Jws::verify`] checks the signature
//! with the algorithm taken from the key. Nonces, `url` and account lookup
//! need the server's state and are checked by the front end.

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
    #[error(
        "the header's alg is {header:?} but the key is not one for it: it signs with {key} (RFC 8555 §6.2)"
    )]
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
            Self::UnsupportedAlgorithm(_) => ProblemType::BadSignatureAlgorithm,
            // An improperly encoded member is a fault of the request's
            // encoding (RFC 8555 §6.1), like one in the JWS's own parts,
            // not a key we decline.
            Self::BadKey(JwkError::BadBase64(_)) => ProblemType::Malformed,
            // RFC 8555 §6.2: "If the server supports the signature algorithm
            // "alg" but either does not support or chooses to reject the
            // public key", it is badPublicKey — e.g. "alg" is "ES256" but
            // the key is not a P-256 key. badSignatureAlgorithm is only for
            // an "alg" we do not support at all.
            Self::BadKey(_) | Self::AlgorithmMismatch { .. } => ProblemType::BadPublicKey,
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
    crate::base64url::decode(s).map_err(|_| JwsError::BadBase64(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
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

    fn p384_jwk() -> Jwk {
        let rng = ring::rand::SystemRandom::new();
        let alg = &ring::signature::ECDSA_P384_SHA384_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        Jwk::from_ec_point(crate::jwk::EcCurve::P384, pair.public_key().as_ref()).unwrap()
    }

    #[test]
    fn a_supported_alg_with_a_key_of_another_kind_or_curve_is_a_bad_public_key() {
        // RFC 8555 §6.2: the algorithm is supported, the key is not one for
        // it. The header's key is what verify is given, whatever it is.
        let (pair, p256) = p256();
        let p384 = p384_jwk();
        for (alg, key) in [("ES256", &p384), ("ES384", &p256), ("RS256", &p256)] {
            let body = sign(
                &pair,
                json!({"alg": alg, "jwk": key.to_value(), "nonce": "abc", "url": "u"}),
                b"{}",
            );
            let jws = Jws::parse(&body).unwrap();
            let err = jws.verify(key).unwrap_err();
            assert!(
                matches!(err, JwsError::AlgorithmMismatch { .. }),
                "{alg}: {err:?}"
            );
            assert_eq!(err.problem_type(), ProblemType::BadPublicKey, "{alg}");
        }
    }

    #[test]
    fn an_unsupported_alg_stays_a_bad_signature_algorithm() {
        let (pair, jwk) = p256();
        for alg in ["HS256", "none", "PS256", "ES512"] {
            let body = sign(
                &pair,
                json!({"alg": alg, "jwk": jwk.to_value(), "nonce": "abc", "url": "u"}),
                b"{}",
            );
            let err = Jws::parse(&body).unwrap_err();
            assert_eq!(err, JwsError::UnsupportedAlgorithm(alg.into()));
            assert_eq!(err.problem_type(), ProblemType::BadSignatureAlgorithm);
        }
    }

    #[test]
    fn a_protected_header_payload_or_signature_with_trailing_padding_is_malformed() {
        // RFC 8555 §6.1: values with trailing '=' MUST be rejected.
        let (pair, jwk) = p256();
        // A header and payload whose encodings are not a multiple of four
        // characters, so that padding them is what a standard encoder does.
        let mut header = json!({"alg": "ES256", "jwk": jwk.to_value(), "nonce": "abc", "url": "u"});
        while URL_SAFE_NO_PAD
            .encode(header.to_string())
            .len()
            .is_multiple_of(4)
        {
            header["url"] = json!(format!("{}u", header["url"].as_str().unwrap()));
        }
        let good: Value = serde_json::from_slice(&sign(&pair, header, b"{}")).unwrap();
        assert!(Jws::parse(good.to_string().as_bytes()).is_ok());
        for (member, name) in [
            ("protected", "protected"),
            ("payload", "payload"),
            ("signature", "signature"),
        ] {
            for pad in ["=", "=="] {
                let mut padded = good.clone();
                padded[member] = json!(format!("{}{pad}", good[member].as_str().unwrap()));
                let err = Jws::parse(padded.to_string().as_bytes()).unwrap_err();
                assert_eq!(err, JwsError::BadBase64(name), "{member}{pad}");
                assert_eq!(err.problem_type(), ProblemType::Malformed);
            }
        }
        // Nor in the jwk's members.
        let mut jwk_value = jwk.to_value();
        jwk_value["x"] = json!(format!("{}=", jwk_value["x"].as_str().unwrap()));
        let body = sign(
            &pair,
            json!({"alg": "ES256", "jwk": jwk_value, "nonce": "abc", "url": "u"}),
            b"{}",
        );
        let err = Jws::parse(&body).unwrap_err();
        assert_eq!(err, JwsError::BadKey(JwkError::BadBase64("x")));
        assert_eq!(err.problem_type(), ProblemType::Malformed);
        // The standard alphabet's '+' and '/' are not base64url either.
        let mut standard = good.clone();
        standard["signature"] = json!(format!("+{}", &good["signature"].as_str().unwrap()[1..]));
        assert_eq!(
            Jws::parse(standard.to_string().as_bytes()).unwrap_err(),
            JwsError::BadBase64("signature")
        );
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
