//! JSON Web Keys (RFC 7517/7518) parsed strictly, RFC 7638 thumbprints, and
//! signature verification with the algorithm taken from the key.
//!
//! Parse, don't validate: a [`Jwk`] value always holds a key we are willing to
//! verify with — EC coordinates of exactly the curve's length, RSA moduli of
//! 2048 to 8192 bits without leading zero octets, Ed25519 keys of 32 octets —
//! and never private key material.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, UnparsedPublicKey};
use serde_json::{Map, Value};

/// Why a JWK was refused. Every variant is a `badPublicKey` (RFC 8555 §6.7)
/// except where the caller decides otherwise (a JWS header's key with a
/// badly encoded member is `malformed`, see `JwsError::problem_type`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwkError {
    #[error("the JWK is not a JSON object")]
    NotAnObject,
    #[error("the JWK has no string member {0:?}")]
    MissingMember(&'static str),
    #[error("the JWK member {0:?} is not valid unpadded base64url")]
    BadBase64(&'static str),
    #[error("key type {0:?} is not supported (EC, RSA and OKP are)")]
    UnsupportedKeyType(String),
    #[error("curve {0:?} is not supported (P-256, P-384 and Ed25519 are)")]
    UnsupportedCurve(String),
    #[error("the {member:?} coordinate is {got} octets long; {curve} needs exactly {want}")]
    BadCoordinateLength {
        member: &'static str,
        curve: &'static str,
        got: usize,
        want: usize,
    },
    #[error("the RSA modulus is {0} bits; between 2048 and 8192 bits are accepted")]
    BadRsaModulusSize(usize),
    #[error("the RSA {0:?} has a leading zero octet, which RFC 7518 §6.3.1 forbids")]
    LeadingZero(&'static str),
    #[error("the RSA public exponent is not acceptable")]
    BadRsaExponent,
    #[error("the JWK carries private key material ({0:?}); send only the public key")]
    PrivateKeyMaterial(&'static str),
}

/// The JWS algorithms we verify (RFC 7518 §3.1, RFC 8037 §3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Es256,
    Es384,
    Rs256,
    EdDsa,
}

impl Algorithm {
    /// The names accepted in the `alg` header, advertised in
    /// `badSignatureAlgorithm` problems (RFC 8555 §6.2).
    pub const SUPPORTED: [&'static str; 4] = ["ES256", "ES384", "RS256", "EdDSA"];

    pub fn name(self) -> &'static str {
        match self {
            Self::Es256 => "ES256",
            Self::Es384 => "ES384",
            Self::Rs256 => "RS256",
            Self::EdDsa => "EdDSA",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "ES256" => Self::Es256,
            "ES384" => Self::Es384,
            "RS256" => Self::Rs256,
            "EdDSA" => Self::EdDsa,
            _ => return None,
        })
    }
}

/// Elliptic curves for ECDSA keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EcCurve {
    P256,
    P384,
}

impl EcCurve {
    fn name(self) -> &'static str {
        match self {
            Self::P256 => "P-256",
            Self::P384 => "P-384",
        }
    }

    /// Octets per coordinate (RFC 7518 §6.2.1.2: "the full coordinate size").
    pub fn coordinate_len(self) -> usize {
        match self {
            Self::P256 => 32,
            Self::P384 => 48,
        }
    }
}

/// A public key a client may sign with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Jwk {
    /// Invariant: `x` and `y` are exactly `curve.coordinate_len()` octets.
    Ec {
        curve: EcCurve,
        x: Vec<u8>,
        y: Vec<u8>,
    },
    /// Invariant: `n` is 2048..=8192 bits without a leading zero octet, `e`
    /// has no leading zero octet and is odd and at least 3.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// Invariant: `x` is 32 octets.
    Ed25519 { x: Vec<u8> },
}

const PRIVATE_MEMBERS: [&str; 8] = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"];

impl Jwk {
    /// Parses a JWK object strictly (see the module documentation).
    pub fn from_value(value: &Value) -> Result<Self, JwkError> {
        let obj = value.as_object().ok_or(JwkError::NotAnObject)?;
        for member in PRIVATE_MEMBERS {
            if obj.contains_key(member) {
                return Err(JwkError::PrivateKeyMaterial(member));
            }
        }
        let kty = str_member(obj, "kty")?;
        match kty {
            "EC" => {
                let crv = str_member(obj, "crv")?;
                let curve = match crv {
                    "P-256" => EcCurve::P256,
                    "P-384" => EcCurve::P384,
                    other => return Err(JwkError::UnsupportedCurve(other.to_owned())),
                };
                let x = b64_member(obj, "x")?;
                let y = b64_member(obj, "y")?;
                for (member, coord) in [("x", &x), ("y", &y)] {
                    if coord.len() != curve.coordinate_len() {
                        return Err(JwkError::BadCoordinateLength {
                            member,
                            curve: curve.name(),
                            got: coord.len(),
                            want: curve.coordinate_len(),
                        });
                    }
                }
                Ok(Self::Ec { curve, x, y })
            }
            "RSA" => Self::rsa(b64_member(obj, "n")?, b64_member(obj, "e")?),
            "OKP" => {
                let crv = str_member(obj, "crv")?;
                if crv != "Ed25519" {
                    return Err(JwkError::UnsupportedCurve(crv.to_owned()));
                }
                let x = b64_member(obj, "x")?;
                if x.len() != 32 {
                    return Err(JwkError::BadCoordinateLength {
                        member: "x",
                        curve: "Ed25519",
                        got: x.len(),
                        want: 32,
                    });
                }
                Ok(Self::Ed25519 { x })
            }
            other => Err(JwkError::UnsupportedKeyType(other.to_owned())),
        }
    }

    /// Builds an RSA key from its big-endian modulus and exponent, with the
    /// same checks as [`Jwk::from_value`].
    pub fn rsa(n: Vec<u8>, e: Vec<u8>) -> Result<Self, JwkError> {
        if n.first() == Some(&0) {
            return Err(JwkError::LeadingZero("n"));
        }
        if e.first() == Some(&0) {
            return Err(JwkError::LeadingZero("e"));
        }
        let bits = bit_len(&n);
        if !(2048..=8192).contains(&bits) {
            return Err(JwkError::BadRsaModulusSize(bits));
        }
        // ring accepts exponents 3..2^33; anything else (or even) is refused
        // here so that the key is rejected at parse time, not at verify time.
        let odd = e.last().is_some_and(|b| b & 1 == 1);
        if e.is_empty() || e.len() > 4 || !odd || (e.len() == 1 && e[0] < 3) {
            return Err(JwkError::BadRsaExponent);
        }
        Ok(Self::Rsa { n, e })
    }

    /// Builds an EC key from an uncompressed SEC1 point (`04 || x || y`).
    pub fn from_ec_point(curve: EcCurve, point: &[u8]) -> Option<Self> {
        let len = curve.coordinate_len();
        if point.len() != 1 + 2 * len || point[0] != 4 {
            return None;
        }
        Some(Self::Ec {
            curve,
            x: point[1..=len].to_vec(),
            y: point[len + 1..].to_vec(),
        })
    }

    /// The JWS algorithm this key signs with. The `alg` header must name
    /// exactly this (RFC 8555 §6.2; we never let the header choose).
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Self::Ec {
                curve: EcCurve::P256,
                ..
            } => Algorithm::Es256,
            Self::Ec {
                curve: EcCurve::P384,
                ..
            } => Algorithm::Es384,
            Self::Rsa { .. } => Algorithm::Rs256,
            Self::Ed25519 { .. } => Algorithm::EdDsa,
        }
    }

    /// The canonical public JWK as JSON, members in RFC 7638 order.
    pub fn to_value(&self) -> Value {
        let b64 = |b: &[u8]| Value::String(URL_SAFE_NO_PAD.encode(b));
        let mut m = Map::new();
        match self {
            Self::Ec { curve, x, y } => {
                m.insert("crv".into(), Value::String(curve.name().into()));
                m.insert("kty".into(), Value::String("EC".into()));
                m.insert("x".into(), b64(x));
                m.insert("y".into(), b64(y));
            }
            Self::Rsa { n, e } => {
                m.insert("e".into(), b64(e));
                m.insert("kty".into(), Value::String("RSA".into()));
                m.insert("n".into(), b64(n));
            }
            Self::Ed25519 { x } => {
                m.insert("crv".into(), Value::String("Ed25519".into()));
                m.insert("kty".into(), Value::String("OKP".into()));
                m.insert("x".into(), b64(x));
            }
        }
        Value::Object(m)
    }

    /// The RFC 7638 thumbprint input: the required members only, in
    /// lexicographic order, without whitespace.
    fn thumbprint_input(&self) -> String {
        // serde_json's Map is ordered by key (no `preserve_order` feature in
        // this tree), and `to_value` inserts only the required members, so
        // serialising it yields exactly RFC 7638 §3.2's form.
        self.to_value().to_string()
    }

    /// SHA-256 RFC 7638 thumbprint.
    pub fn thumbprint(&self) -> [u8; 32] {
        let digest =
            ring::digest::digest(&ring::digest::SHA256, self.thumbprint_input().as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_ref());
        out
    }

    /// The thumbprint in base64url, as used in key authorizations (RFC 8555 §8.1).
    pub fn thumbprint_b64(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.thumbprint())
    }

    /// Verifies `signature` over `message` with this key's own algorithm.
    pub fn verify(&self, message: &[u8], sig: &[u8]) -> bool {
        match self {
            Self::Ec { curve, x, y } => {
                let mut point = Vec::with_capacity(1 + x.len() + y.len());
                point.push(4);
                point.extend_from_slice(x);
                point.extend_from_slice(y);
                let alg: &dyn signature::VerificationAlgorithm = match curve {
                    EcCurve::P256 => &signature::ECDSA_P256_SHA256_FIXED,
                    EcCurve::P384 => &signature::ECDSA_P384_SHA384_FIXED,
                };
                UnparsedPublicKey::new(alg, &point)
                    .verify(message, sig)
                    .is_ok()
            }
            Self::Rsa { n, e } => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
                .is_ok(),
            Self::Ed25519 { x } => UnparsedPublicKey::new(&signature::ED25519, x)
                .verify(message, sig)
                .is_ok(),
        }
    }
}

fn bit_len(n: &[u8]) -> usize {
    match n.first() {
        None => 0,
        Some(first) => (n.len() - 1) * 8 + (8 - first.leading_zeros() as usize),
    }
}

fn str_member<'a>(obj: &'a Map<String, Value>, name: &'static str) -> Result<&'a str, JwkError> {
    obj.get(name)
        .and_then(Value::as_str)
        .ok_or(JwkError::MissingMember(name))
}

fn b64_member(obj: &Map<String, Value>, name: &'static str) -> Result<Vec<u8>, JwkError> {
    let s = str_member(obj, name)?;
    crate::base64url::decode(s).map_err(|_| JwkError::BadBase64(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_rfc_7638_example_thumbprint_is_reproduced() {
        // RFC 7638 §3.1.
        let jwk = json!({
            "kty": "RSA",
            "n": "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw",
            "e": "AQAB",
            "alg": "RS256",
            "kid": "2011-04-29"
        });
        let key = Jwk::from_value(&jwk).unwrap();
        assert_eq!(
            key.thumbprint_b64(),
            "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"
        );
        assert_eq!(key.algorithm(), Algorithm::Rs256);
    }

    #[test]
    fn an_ec_coordinate_one_octet_short_is_refused() {
        let short = URL_SAFE_NO_PAD.encode([7u8; 31]);
        let full = URL_SAFE_NO_PAD.encode([7u8; 32]);
        let jwk = json!({"kty": "EC", "crv": "P-256", "x": short, "y": full});
        assert!(matches!(
            Jwk::from_value(&jwk),
            Err(JwkError::BadCoordinateLength { member: "x", .. })
        ));
    }

    #[test]
    fn private_key_material_is_refused() {
        let c = URL_SAFE_NO_PAD.encode([7u8; 32]);
        let jwk = json!({"kty": "EC", "crv": "P-256", "x": c, "y": c, "d": c});
        assert_eq!(
            Jwk::from_value(&jwk),
            Err(JwkError::PrivateKeyMaterial("d"))
        );
    }

    #[test]
    fn an_rsa_1024_bit_modulus_is_refused() {
        let mut n = vec![0xc5u8; 128];
        n[127] = 1;
        assert_eq!(
            Jwk::rsa(n, vec![1, 0, 1]),
            Err(JwkError::BadRsaModulusSize(1024))
        );
    }

    #[test]
    fn padded_base64_is_refused() {
        let jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": "AAAA="});
        assert_eq!(Jwk::from_value(&jwk), Err(JwkError::BadBase64("x")));
    }

    #[test]
    fn unknown_key_types_and_curves_are_refused() {
        assert!(matches!(
            Jwk::from_value(&json!({"kty": "oct", "k": "AAAA"})),
            Err(JwkError::PrivateKeyMaterial("k"))
        ));
        assert!(matches!(
            Jwk::from_value(&json!({"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA"})),
            Err(JwkError::UnsupportedCurve(_))
        ));
    }

    #[test]
    fn an_ed25519_signature_verifies_with_the_key_it_came_from() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        use ring::signature::KeyPair;
        let jwk = Jwk::Ed25519 {
            x: pair.public_key().as_ref().to_vec(),
        };
        let sig = pair.sign(b"hello");
        assert!(jwk.verify(b"hello", sig.as_ref()));
        assert!(!jwk.verify(b"hellO", sig.as_ref()));
    }
}
