//! CSRs built from valid parts and properly signed, so that the fuzzer
//! reaches what comes after the signature (RFC 8555 §7.4): subjects of any
//! attribute, SANs of every kind and content, requested extensions with
//! any content, criticality and OID, and orders whose names are, or are
//! not, the CSR's. A CSR the check accepts must name exactly the order's
//! identifiers and have a key that is not the account key.
#![no_main]

use std::net::IpAddr;
use std::sync::OnceLock;

use acme_proxy::authority::csr::{check_csr, csr_key};
use acme_proxy::config::ExtendedKeyUsage;
use acme_proxy_protocol::types::Identifier;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use rcgen::{
    CertificateParams, CustomExtension, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose,
    SanType, string::Ia5String,
};

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Key {
    P256,
    P384,
    Ed25519,
    Rsa2048,
}

#[derive(Arbitrary, Debug)]
enum San {
    Dns(String),
    Ip(IpAddr),
    Email(String),
    Uri(String),
}

#[derive(Arbitrary, Debug)]
struct Extension {
    arcs: Vec<u64>,
    critical: bool,
    content: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    key: Key,
    common_name: Option<String>,
    // Other subject attributes, by OID (organisation, country, anything).
    subject: Vec<(Vec<u64>, String)>,
    sans: Vec<San>,
    ekus: Vec<u8>,
    key_usages: Vec<u8>,
    extensions: Vec<Extension>,
    // The order: the CSR's own names, or names of the fuzzer's.
    order_is_csr: bool,
    order: Vec<(bool, String)>,
    account_key_is_csr_key: bool,
    requestable: u8,
}

fn keys() -> &'static [KeyPair; 4] {
    static KEYS: OnceLock<[KeyPair; 4]> = OnceLock::new();
    KEYS.get_or_init(|| {
        [
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256"),
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).expect("P-384"),
            KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("Ed25519"),
            KeyPair::from_pem(include_str!("../keys/rsa2048.pem")).expect("RSA"),
        ]
    })
}

/// An OID DER can encode (rcgen panics on any other): two arcs at least,
/// the first 0–2, the second under 40 below 2.
fn oid(arcs: &[u64]) -> Vec<u64> {
    let first = arcs.first().copied().unwrap_or(1) % 3;
    let second = arcs.get(1).copied().unwrap_or(3);
    let second = if first < 2 {
        second % 40
    } else {
        second % (u64::MAX / 2)
    };
    let mut oid = vec![first, second];
    oid.extend(arcs.iter().skip(2).take(16).map(|arc| arc % (u64::MAX / 2)));
    oid
}

fn eku(b: u8) -> ExtendedKeyUsagePurpose {
    match b % 8 {
        0 => ExtendedKeyUsagePurpose::ServerAuth,
        1 => ExtendedKeyUsagePurpose::ClientAuth,
        2 => ExtendedKeyUsagePurpose::Any,
        3 => ExtendedKeyUsagePurpose::CodeSigning,
        4 => ExtendedKeyUsagePurpose::EmailProtection,
        5 => ExtendedKeyUsagePurpose::TimeStamping,
        6 => ExtendedKeyUsagePurpose::OcspSigning,
        _ => ExtendedKeyUsagePurpose::Other(vec![1, 3, 6, 1, 4, 1, u64::from(b)]),
    }
}

fn key_usage(b: u8) -> KeyUsagePurpose {
    match b % 9 {
        0 => KeyUsagePurpose::DigitalSignature,
        1 => KeyUsagePurpose::ContentCommitment,
        2 => KeyUsagePurpose::KeyEncipherment,
        3 => KeyUsagePurpose::DataEncipherment,
        4 => KeyUsagePurpose::KeyAgreement,
        5 => KeyUsagePurpose::KeyCertSign,
        6 => KeyUsagePurpose::CrlSign,
        7 => KeyUsagePurpose::EncipherOnly,
        _ => KeyUsagePurpose::DecipherOnly,
    }
}

fn identifier(dns: bool, value: &str) -> Identifier {
    if dns {
        Identifier::dns(value.to_owned())
    } else {
        Identifier::ip(value.to_owned())
    }
}

fuzz_target!(|input: Input| {
    let mut params = CertificateParams::default();
    if let Some(cn) = &input.common_name {
        params
            .distinguished_name
            .push(DnType::CommonName, cn.as_str());
    }
    for (arcs, value) in input.subject.iter().take(8) {
        params
            .distinguished_name
            .push(DnType::CustomDnType(oid(arcs)), value.as_str());
    }
    let mut order = Vec::new();
    for san in input.sans.iter().take(16) {
        let (san, id) = match san {
            San::Dns(name) => {
                let Ok(ia5) = Ia5String::try_from(name.as_str()) else {
                    return;
                };
                (
                    SanType::DnsName(ia5),
                    Some(identifier(true, &name.to_ascii_lowercase())),
                )
            }
            San::Ip(ip) => (
                SanType::IpAddress(*ip),
                Some(identifier(false, &ip.to_string())),
            ),
            San::Email(s) | San::Uri(s) => {
                let Ok(ia5) = Ia5String::try_from(s.as_str()) else {
                    return;
                };
                let san = match san {
                    San::Email(_) => SanType::Rfc822Name(ia5),
                    _ => SanType::URI(ia5),
                };
                (san, None)
            }
        };
        params.subject_alt_names.push(san);
        order.extend(id);
    }
    params.extended_key_usages = input.ekus.iter().take(8).map(|b| eku(*b)).collect();
    params.key_usages = input
        .key_usages
        .iter()
        .take(9)
        .map(|b| key_usage(*b))
        .collect();
    for ext in input.extensions.iter().take(4) {
        let mut custom = CustomExtension::from_oid_content(&oid(&ext.arcs), ext.content.clone());
        custom.set_criticality(ext.critical);
        params.custom_extensions.push(custom);
    }
    let key = &keys()[input.key as usize];
    // rcgen refuses what it cannot encode (a string of the wrong kind…).
    let Ok(csr) = params.serialize_request(key) else {
        return;
    };
    let der = csr.der().as_ref();

    let identifiers: Vec<Identifier> = if input.order_is_csr {
        if let Some(cn) = &input.common_name {
            order.push(identifier(true, &cn.to_ascii_lowercase()));
        }
        order.sort();
        order.dedup();
        order
    } else {
        input
            .order
            .iter()
            .take(8)
            .map(|(dns, v)| identifier(*dns, v))
            .collect()
    };
    let account = if input.account_key_is_csr_key {
        csr_key(der).ok().and_then(|(_, t)| t).unwrap_or_default()
    } else {
        "another key".to_owned()
    };
    let requestable: &[ExtendedKeyUsage] = match input.requestable % 3 {
        0 => &[ExtendedKeyUsage::ServerAuth],
        1 => &[ExtendedKeyUsage::ClientAuth],
        _ => &[ExtendedKeyUsage::ServerAuth, ExtendedKeyUsage::ClientAuth],
    };
    if let Ok(checked) = check_csr(der, &identifiers, &account, requestable) {
        assert!(!identifiers.is_empty(), "a CSR for no names was accepted");
        assert_ne!(checked.key_thumbprint.as_deref(), Some(account.as_str()));
        assert!(
            !matches!(input.key, Key::Ed25519),
            "an Ed25519 key was accepted"
        );
        for san in &params.subject_alt_names {
            assert!(
                matches!(san, SanType::DnsName(_) | SanType::IpAddress(_)),
                "a CSR with a {san:?} SAN was accepted"
            );
        }
    }
});
