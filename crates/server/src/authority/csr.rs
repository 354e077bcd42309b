//! The CSR checks of finalize (RFC 8555 §7.4): pure functions of the CSR,
//! the order's identifiers, the account key and the certificate profile,
//! made before any signer sees the CSR. Public for the fuzz targets
//! (`fuzz/`), which feed them what a client could send.

use acme_proxy_protocol::jwk::EcCurve;
use acme_proxy_protocol::types::Identifier;
use acme_proxy_protocol::{Jwk, ProblemType};
use x509_parser::certification_request::{X509CertificationRequest, X509CertificationRequestInfo};
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::der_parser::der::parse_der;
use x509_parser::extensions::{GeneralName, ParsedExtension, X509Extension};
use x509_parser::objects::{oid_registry, oid2sn};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
    OID_PKCS9_EXTENSION_REQUEST,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::signature_algorithm::RsaSsaPssParams;
use x509_parser::x509::AlgorithmIdentifier;

use crate::config::ExtendedKeyUsage;
use crate::error::{AcmeError, AcmeResult};
use crate::signer::extensions::{self, Side};

/// What finalize keeps from a checked CSR.
pub struct CheckedCsr {
    pub spki_der: Vec<u8>,
    pub key_thumbprint: Option<String>,
}

pub(super) fn bad_csr(detail: impl Into<String>) -> AcmeError {
    AcmeError::new(ProblemType::BadCsr, detail)
}

/// The CSR checks of §7.4, made before any signer sees the CSR, whatever
/// the signer: a SHA-2 self-signature that verifies; a subject of
/// commonNames only; at most one extensionRequest, asking only for what
/// [`extensions::check_extensions`] lets in (`requestable`: the extKeyUsage
/// purposes the order's certificate profile lets a CSR ask for); exactly
/// the order's names (SANs, and the CN if any); and an acceptable key that
/// is not the account key.
pub fn check_csr(
    der: &[u8],
    identifiers: &[Identifier],
    account_thumbprint: &str,
    requestable: &[ExtendedKeyUsage],
) -> AcmeResult<CheckedCsr> {
    let (rest, csr) = X509CertificationRequest::from_der(der)
        .map_err(|_| bad_csr("the CSR is not a DER PKCS#10 request"))?;
    if !rest.is_empty() {
        return Err(bad_csr("the CSR has trailing data"));
    }
    check_csr_signature(&csr.signature_algorithm)?;
    csr.verify_signature()
        .map_err(|_| bad_csr("the CSR's signature does not verify with its own key"))?;
    let info = &csr.certification_request_info;
    extensions::check_subject(Side::Request, &info.subject).map_err(bad_csr)?;
    let requested = requested_extensions(info)?;
    extensions::check_extensions(Side::Request, requested, requestable).map_err(bad_csr)?;

    let mut names: Vec<Identifier> = Vec::new();
    for ext in requested {
        if let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() {
            for gn in &san.general_names {
                let id = match gn {
                    GeneralName::DNSName(n) => Identifier::dns(n.to_ascii_lowercase()),
                    GeneralName::IPAddress(bytes) => {
                        let ip = match bytes.len() {
                            4 => std::net::IpAddr::from(
                                <[u8; 4]>::try_from(*bytes).map_err(|_| bad_csr("bad IP SAN"))?,
                            ),
                            16 => std::net::IpAddr::from(
                                <[u8; 16]>::try_from(*bytes).map_err(|_| bad_csr("bad IP SAN"))?,
                            ),
                            _ => return Err(bad_csr("an IP address SAN has a bad length")),
                        };
                        Identifier::ip(ip.to_string())
                    }
                    other => {
                        return Err(bad_csr(format!(
                            "the CSR asks for a SAN of a kind this server does not issue: {other}"
                        )));
                    }
                };
                if !names.contains(&id) {
                    names.push(id);
                }
            }
        }
    }
    for cn in info.subject.iter_common_name() {
        let cn = cn
            .as_str()
            .map_err(|_| bad_csr("the CSR's common name is not a string"))?
            .to_ascii_lowercase();
        if !identifiers.iter().any(|i| i.value == cn) {
            return Err(bad_csr(format!(
                "the CSR's common name {cn:?} is not one of the order's identifiers"
            )));
        }
        if !names.iter().any(|i| i.value == cn) {
            names.push(Identifier::dns(cn));
        }
    }
    let mut want: Vec<&Identifier> = identifiers.iter().collect();
    let mut got: Vec<&Identifier> = names.iter().collect();
    want.sort();
    got.sort();
    if want != got {
        return Err(bad_csr(format!(
            "the CSR names {:?} but the order is for {:?}; they must be the same set (RFC 8555 §7.4)",
            got.iter().map(|i| i.value.as_str()).collect::<Vec<_>>(),
            want.iter().map(|i| i.value.as_str()).collect::<Vec<_>>()
        )));
    }

    let key_thumbprint = checked_key(&info.subject_pki)?;
    if key_thumbprint.as_deref() == Some(account_thumbprint) {
        return Err(bad_csr("the certificate key must not be the account key"));
    }
    Ok(CheckedCsr {
        spki_der: info.subject_pki.raw.to_vec(),
        key_thumbprint,
    })
}

/// The extensions a CSR asks for: those of its one extensionRequest
/// attribute (PKCS #9, RFC 2985 §5.4.2, which makes it SINGLE VALUE); none
/// without one. Two attributes, or two values, are refused rather than one
/// of them chosen: x509-parser's `requested_extensions` reads the first,
/// another reader (an operator's program) may read the last, and would then
/// act on extensions these checks never saw.
fn requested_extensions<'s>(
    info: &'s X509CertificationRequestInfo<'_>,
) -> AcmeResult<&'s [X509Extension<'s>]> {
    let mut found = info
        .attributes()
        .iter()
        .filter(|a| a.oid == OID_PKCS9_EXTENSION_REQUEST);
    let Some(attribute) = found.next() else {
        return Ok(&[]);
    };
    if found.next().is_some() {
        return Err(bad_csr(
            "the CSR has more than one extensionRequest attribute (1.2.840.113549.1.9.14); one is accepted (RFC 2985 §5.4.2)",
        ));
    }
    // The attribute's values, a SET (RFC 2986 §4.1).
    let values = parse_der(attribute.value)
        .ok()
        .and_then(|(_, set)| set.as_set().ok().map(Vec::len));
    if values != Some(1) {
        return Err(bad_csr(
            "the CSR's extensionRequest attribute does not have exactly one value (RFC 2985 §5.4.2)",
        ));
    }
    match attribute.parsed_attribute() {
        ParsedCriAttribute::ExtensionRequest(request) => Ok(&request.extensions),
        _ => Err(bad_csr(
            "the CSR's extensionRequest attribute does not parse",
        )),
    }
}

/// How a CSR may be signed. RFC 8555 §7.4 leaves it to the CA; SHA-1 and
/// MD5 are refused (as Let's Encrypt's Boulder does) because their
/// collisions are practical: the self-signature over a weak digest proves
/// little about what was signed. ECDSA with SHA-512 and Ed25519 are left
/// out because nothing here can verify them (ring has no P-256/P-384 with
/// SHA-512) or issue for them (an Ed25519 key: see [`checked_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CsrSignature {
    RsaSha256,
    RsaSha384,
    RsaSha512,
    /// RSASSA-PSS, its hash named in its parameters.
    RsaPss,
    EcdsaSha256,
    EcdsaSha384,
}

impl CsrSignature {
    const ALL: [Self; 6] = [
        Self::RsaSha256,
        Self::RsaSha384,
        Self::RsaSha512,
        Self::RsaPss,
        Self::EcdsaSha256,
        Self::EcdsaSha384,
    ];

    /// Its AlgorithmIdentifier (RFC 4055 §5 and §3.1, RFC 5758 §3.2).
    fn oid(self) -> &'static str {
        match self {
            Self::RsaSha256 => "1.2.840.113549.1.1.11",
            Self::RsaSha384 => "1.2.840.113549.1.1.12",
            Self::RsaSha512 => "1.2.840.113549.1.1.13",
            Self::RsaPss => "1.2.840.113549.1.1.10",
            Self::EcdsaSha256 => "1.2.840.10045.4.3.2",
            Self::EcdsaSha384 => "1.2.840.10045.4.3.3",
        }
    }
}

/// The hashes an RSASSA-PSS signature may use: SHA-256, SHA-384, SHA-512
/// (RFC 4055 §2.1; an absent hashAlgorithm means SHA-1, §3.1).
const PSS_HASHES: [&str; 3] = [
    "2.16.840.1.101.3.4.2.1",
    "2.16.840.1.101.3.4.2.2",
    "2.16.840.1.101.3.4.2.3",
];

const CSR_SIGNATURES_SAID: &str = "accepted: RSA (PKCS #1 v1.5 or PSS) with SHA-256, SHA-384 or SHA-512, and ECDSA with SHA-256 or SHA-384";

/// The CSR's signature algorithm is one of [`CsrSignature`], checked before
/// its signature is (a SHA-1 signature would verify).
fn check_csr_signature(algorithm: &AlgorithmIdentifier<'_>) -> AcmeResult<()> {
    let oid = &algorithm.algorithm;
    let dotted = oid.to_id_string();
    let Some(signature) = CsrSignature::ALL.into_iter().find(|s| s.oid() == dotted) else {
        let name = oid2sn(oid, oid_registry()).unwrap_or("an unknown algorithm");
        return Err(bad_csr(format!(
            "the CSR is signed with {name} ({dotted}); {CSR_SIGNATURES_SAID}"
        )));
    };
    if signature == CsrSignature::RsaPss {
        let hash = algorithm
            .parameters
            .as_ref()
            .and_then(|p| RsaSsaPssParams::try_from(p).ok())
            .map(|p| p.hash_algorithm_oid().to_id_string());
        if !hash.as_deref().is_some_and(|h| PSS_HASHES.contains(&h)) {
            return Err(bad_csr(format!(
                "the CSR's RSASSA-PSS signature uses {}; {CSR_SIGNATURES_SAID}",
                hash.as_deref().unwrap_or("parameters that do not parse")
            )));
        }
    }
    Ok(())
}

/// The SubjectPublicKeyInfo (DER) and key thumbprint of a stored CSR that
/// finalize already checked.
pub fn csr_key(der: &[u8]) -> Result<(Vec<u8>, Option<String>), String> {
    let (_, csr) = X509CertificationRequest::from_der(der).map_err(|e| e.to_string())?;
    let spki = &csr.certification_request_info.subject_pki;
    let thumbprint = checked_key(spki).map_err(|e| e.detail)?;
    Ok((spki.raw.to_vec(), thumbprint))
}

/// An acceptable key (ECDSA P-256/P-384, RSA 2048–8192) and its RFC 7638
/// thumbprint.
fn checked_key(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> AcmeResult<Option<String>> {
    let alg = &spki.algorithm.algorithm;
    let key_thumbprint = if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .ok_or_else(|| bad_csr("the CSR's EC key names no curve"))?;
        let point = spki.subject_public_key.data.as_ref();
        if curve == OID_EC_P256 {
            Jwk::from_ec_point(EcCurve::P256, point).map(|j| j.thumbprint_b64())
        } else if curve == OID_NIST_EC_P384 {
            Jwk::from_ec_point(EcCurve::P384, point).map(|j| j.thumbprint_b64())
        } else {
            return Err(bad_csr(
                "the CSR's EC key is on a curve this server does not issue for; use P-256 or P-384",
            ));
        }
    } else if *alg == OID_PKCS1_RSAENCRYPTION {
        let Ok(PublicKey::RSA(rsa)) = spki.parsed() else {
            return Err(bad_csr("the CSR's RSA key does not parse"));
        };
        let bits = rsa.key_size();
        if !(2048..=8192).contains(&bits) {
            return Err(bad_csr(format!(
                "the CSR's RSA key has {bits} bits; 2048 to 8192 are accepted"
            )));
        }
        let strip = |b: &[u8]| {
            b.iter()
                .skip_while(|x| **x == 0)
                .copied()
                .collect::<Vec<u8>>()
        };
        let exponent = strip(rsa.exponent);
        // 65537 only, as Boulder: e = 3 is what the PKCS #1 v1.5 signature
        // forgeries against lax verifiers need (Bleichenbacher, 2006), and
        // no TLS stack needs any other.
        if exponent != [0x01, 0x00, 0x01] {
            let said = if exponent.len() <= 8 {
                exponent
                    .iter()
                    .fold(0u64, |n, b| (n << 8) | u64::from(*b))
                    .to_string()
            } else {
                format!("of {} bytes", exponent.len())
            };
            return Err(bad_csr(format!(
                "the CSR's RSA key has public exponent {said}; only 65537 is accepted"
            )));
        }
        Jwk::rsa(strip(rsa.modulus), exponent)
            .ok()
            .map(|j| j.thumbprint_b64())
    } else {
        return Err(bad_csr(
            "the CSR's key type is not accepted; use ECDSA P-256/P-384 or RSA of at least 2048 bits",
        ));
    };
    Ok(key_thumbprint)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(names: &[&str], key: &rcgen::KeyPair) -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        // rcgen's default subject has a CN that is no identifier.
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.serialize_request(key).unwrap().der().to_vec()
    }

    #[test]
    fn csr_names_must_be_exactly_the_orders() {
        let key = rcgen::KeyPair::generate().unwrap();
        let order = vec![
            Identifier::dns("a.example.test"),
            Identifier::dns("b.example.test"),
        ];
        assert!(
            check_csr(
                &csr(&["b.example.test", "A.example.test"], &key),
                &order,
                "x",
                ANY_TLS
            )
            .is_ok()
        );
        let e = check_csr(&csr(&["a.example.test"], &key), &order, "x", ANY_TLS)
            .err()
            .unwrap();
        assert_eq!(e.kind, ProblemType::BadCsr);
        let e = check_csr(
            &csr(
                &["a.example.test", "b.example.test", "c.example.test"],
                &key,
            ),
            &order,
            "x",
            ANY_TLS,
        )
        .err()
        .unwrap();
        assert_eq!(e.kind, ProblemType::BadCsr);
    }

    #[test]
    fn a_csr_with_a_broken_signature_is_bad() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut der = csr(&["a.example.test"], &key);
        let last = der.len() - 1;
        der[last] ^= 1;
        let e = check_csr(&der, &[Identifier::dns("a.example.test")], "x", ANY_TLS)
            .err()
            .unwrap();
        assert_eq!(e.kind, ProblemType::BadCsr);
    }

    #[test]
    fn the_account_key_cannot_be_certified() {
        let key = rcgen::KeyPair::generate().unwrap();
        let der = csr(&["a.example.test"], &key);
        let thumb = check_csr(&der, &[Identifier::dns("a.example.test")], "x", ANY_TLS)
            .unwrap_or_else(|e| panic!("{}", e.detail))
            .key_thumbprint
            .unwrap();
        let e = check_csr(&der, &[Identifier::dns("a.example.test")], &thumb, ANY_TLS)
            .err()
            .unwrap();
        assert_eq!(e.kind, ProblemType::BadCsr);
    }

    #[test]
    fn each_csr_is_accepted_or_refused_with_the_rfc_8555_problem_type_the_table_says() {
        let key = rcgen::KeyPair::generate().unwrap();
        let account_key = rcgen::KeyPair::generate().unwrap();
        let order = [
            Identifier::dns("a.example.test"),
            Identifier::dns("b.example.test"),
        ];
        let both = csr(&["a.example.test", "b.example.test"], &key);
        let account_thumbprint = check_csr(
            &csr(&["a.example.test", "b.example.test"], &account_key),
            &order,
            "x",
            ANY_TLS,
        )
        .unwrap()
        .key_thumbprint
        .unwrap();
        let mut broken = both.clone();
        let last = broken.len() - 1;
        broken[last] ^= 1;
        let trailing = [both.as_slice(), &[0]].concat();
        // (what, CSR, account key thumbprint, None: accepted | the problem)
        let table: [(&str, Vec<u8>, &str, Option<ProblemType>); 8] = [
            ("exactly the order's names", both.clone(), "x", None),
            (
                "the names in another order and case",
                csr(&["B.example.test", "a.example.test"], &key),
                "x",
                None,
            ),
            (
                "a name short",
                csr(&["a.example.test"], &key),
                "x",
                Some(ProblemType::BadCsr),
            ),
            (
                "a name more",
                csr(
                    &["a.example.test", "b.example.test", "c.example.test"],
                    &key,
                ),
                "x",
                Some(ProblemType::BadCsr),
            ),
            ("a broken signature", broken, "x", Some(ProblemType::BadCsr)),
            ("trailing data", trailing, "x", Some(ProblemType::BadCsr)),
            (
                "not DER",
                b"not a CSR".to_vec(),
                "x",
                Some(ProblemType::BadCsr),
            ),
            (
                "the account key (RFC 8555 §11.1)",
                csr(&["a.example.test", "b.example.test"], &account_key),
                &account_thumbprint,
                Some(ProblemType::BadCsr),
            ),
        ];
        for (what, der, thumbprint, want) in table {
            let got = check_csr(&der, &order, thumbprint, ANY_TLS)
                .err()
                .map(|e| e.kind);
            assert_eq!(got, want, "{what}");
        }
    }

    /// What a CSR may ask for at a profile that names no purposes.
    const ANY_TLS: &[ExtendedKeyUsage] =
        &[ExtendedKeyUsage::ServerAuth, ExtendedKeyUsage::ClientAuth];

    const NAME: &str = "a.example.test";

    /// A CSR for `NAME` (its SAN, no subject) by rcgen, after `tweak`, with
    /// extra PKCS #10 `attributes`.
    fn rcgen_csr(
        tweak: fn(&mut rcgen::CertificateParams),
        attributes: Vec<rcgen::Attribute>,
    ) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![NAME.to_owned()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        tweak(&mut params);
        params
            .serialize_request_with_attributes(&key, attributes)
            .unwrap()
            .der()
            .to_vec()
    }

    /// A DER TLV with a short-form length (every value here is short).
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let len = u8::try_from(content.len()).unwrap();
        assert!(len < 0x80);
        [&[tag, len][..], content].concat()
    }

    /// A CSR for `NAME` made by the openssl command line: an RSA key from
    /// `genpkey` with `key_options`, signed with `digest`.
    fn openssl_csr(key_options: &[&str], digest: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap_or_else(|e| panic!("the openssl command is needed here: {e}"));
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let mut genpkey = vec!["genpkey", "-algorithm", "RSA", "-out", "key.pem"];
        genpkey.extend(key_options.iter().flat_map(|o| ["-pkeyopt", o]));
        run(&genpkey);
        let san = format!("subjectAltName=DNS:{NAME}");
        run(&[
            "req", "-new", "-key", "key.pem", digest, "-subj", "/", "-addext", &san, "-outform",
            "DER", "-out", "csr.der",
        ]);
        std::fs::read(dir.path().join("csr.der")).unwrap()
    }

    fn refusal(der: &[u8], requestable: &[ExtendedKeyUsage]) -> String {
        match check_csr(der, &[Identifier::dns(NAME)], "x", requestable) {
            Ok(_) => "accepted".to_owned(),
            Err(e) => {
                assert_eq!(e.kind, ProblemType::BadCsr, "{}", e.detail);
                e.detail
            }
        }
    }

    #[test]
    fn a_csr_asking_for_more_than_its_names_and_tls_usages_is_bad_csr() {
        use rcgen::{DnType, ExtendedKeyUsagePurpose as Eku, KeyUsagePurpose as Ku};
        // A second extensionRequest attribute asking for basicConstraints
        // cA TRUE (critical): Extensions inside the attribute's SET.
        let ca_true = tlv(
            0x30,
            &[
                &[0x06, 0x03, 0x55, 0x1d, 0x13, 0x01, 0x01, 0xff][..],
                &tlv(0x04, &tlv(0x30, &[0x01, 0x01, 0xff])),
            ]
            .concat(),
        );
        let second_request = || {
            vec![rcgen::Attribute {
                oid: &[1, 2, 840, 113_549, 1, 9, 14],
                values: tlv(0x31, &tlv(0x30, &ca_true)),
            }]
        };
        let table: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "an O attribute",
                rcgen_csr(
                    |p| p.distinguished_name.push(DnType::OrganizationName, "Evil"),
                    vec![],
                ),
                "subject has O (2.5.4.10)",
            ),
            (
                "an OU attribute beside the CN",
                rcgen_csr(
                    |p| {
                        p.distinguished_name.push(DnType::CommonName, NAME);
                        p.distinguished_name
                            .push(DnType::OrganizationalUnitName, "Ops");
                    },
                    vec![],
                ),
                "subject has OU (2.5.4.11)",
            ),
            (
                "codeSigning",
                rcgen_csr(
                    |p| p.extended_key_usages = vec![Eku::ServerAuth, Eku::CodeSigning],
                    vec![],
                ),
                "extKeyUsage serverAuth, codeSigning",
            ),
            (
                "anyExtendedKeyUsage",
                rcgen_csr(|p| p.extended_key_usages = vec![Eku::Any], vec![]),
                "extKeyUsage anyExtendedKeyUsage",
            ),
            (
                "keyCertSign",
                rcgen_csr(
                    |p| p.key_usages = vec![Ku::DigitalSignature, Ku::KeyCertSign],
                    vec![],
                ),
                "keyUsage has keyCertSign",
            ),
            (
                "nameConstraints",
                rcgen_csr(
                    |p| {
                        // permittedSubtrees: one dNSName.
                        let subtrees = tlv(0xa0, &tlv(0x30, &tlv(0x82, b"example.test")));
                        p.custom_extensions
                            .push(rcgen::CustomExtension::from_oid_content(
                                &[2, 5, 29, 30],
                                tlv(0x30, &subtrees),
                            ));
                    },
                    vec![],
                ),
                "nameConstraints (2.5.29.30)",
            ),
            (
                "basicConstraints CA:TRUE",
                rcgen_csr(
                    |p| p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained),
                    vec![],
                ),
                "basicConstraints cA TRUE",
            ),
            (
                "an extension nobody knows",
                rcgen_csr(
                    |p| {
                        p.custom_extensions
                            .push(rcgen::CustomExtension::from_oid_content(
                                &[1, 3, 6, 1, 4, 1, 55555, 7],
                                vec![0x05, 0x00],
                            ))
                    },
                    vec![],
                ),
                "does not issue: 1.3.6.1.4.1.55555.7",
            ),
            (
                "two extensionRequest attributes",
                rcgen_csr(|_| {}, second_request()),
                "more than one extensionRequest",
            ),
            (
                "a SHA-1 signature",
                openssl_csr(&["rsa_keygen_bits:2048"], "-sha1"),
                "sha1WithRSAEncryption (1.2.840.113549.1.1.5)",
            ),
            (
                "an RSA key with exponent 3",
                openssl_csr(&["rsa_keygen_bits:2048", "rsa_keygen_pubexp:3"], "-sha256"),
                "public exponent 3;",
            ),
        ];
        for (case, der, said) in &table {
            let detail = refusal(der, ANY_TLS);
            assert!(detail.contains(said), "{case}: {detail}");
        }
        // The same tools make CSRs that pass: the refusals are the cases'.
        assert_eq!(refusal(&rcgen_csr(|_| {}, vec![]), ANY_TLS), "accepted");
        assert_eq!(
            refusal(&openssl_csr(&["rsa_keygen_bits:2048"], "-sha256"), ANY_TLS),
            "accepted"
        );
    }

    #[test]
    fn a_csr_asking_for_usages_within_the_certificate_profile_passes() {
        use rcgen::{ExtendedKeyUsagePurpose as Eku, KeyUsagePurpose as Ku};
        // What cert-manager sends (usages encoded in the request,
        // basicConstraints cA FALSE), with must-staple as certbot and lego
        // send it: TLS Feature, status_request (5).
        let der = rcgen_csr(
            |p| {
                p.key_usages = vec![Ku::DigitalSignature, Ku::KeyEncipherment];
                p.extended_key_usages = vec![Eku::ServerAuth, Eku::ClientAuth];
                p.is_ca = rcgen::IsCa::ExplicitNoCa;
                p.custom_extensions
                    .push(rcgen::CustomExtension::from_oid_content(
                        &[1, 3, 6, 1, 5, 5, 7, 1, 24],
                        tlv(0x30, &[0x02, 0x01, 0x05]),
                    ));
            },
            vec![],
        );
        assert_eq!(refusal(&der, ANY_TLS), "accepted");
        // A profile granting clientAuth alone refuses serverAuth.
        let detail = refusal(&der, &[ExtendedKeyUsage::ClientAuth]);
        assert!(detail.contains("may ask for clientAuth only"), "{detail}");
        let client_only = rcgen_csr(|p| p.extended_key_usages = vec![Eku::ClientAuth], vec![]);
        assert_eq!(
            refusal(&client_only, &[ExtendedKeyUsage::ClientAuth]),
            "accepted"
        );
    }
}
