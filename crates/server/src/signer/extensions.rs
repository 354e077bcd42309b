//! What the subject and the extensions of a CSR, and of a leaf that came
//! from outside, may hold: one table, read at finalize before any signer
//! runs (RFC 8555 §7.4 leaves to the CA which CSRs it accepts; a refusal is
//! `badCSR`), and again on the leaf a custom signer's program returns,
//! before it is stored or served.
//!
//! A CSR is a request, not a template: the signers build a certificate's
//! subject and extensions from the order and its certificate profile. The
//! request side keeps out what no certificate here may carry, so that a
//! program copying from the CSR anyway (`openssl x509 -req
//! -copy_extensions`) cannot be steered by the client; the leaf side holds
//! what such a program returns to the same rules.

use x509_parser::extensions::{
    ExtendedKeyUsage as ParsedEku, KeyUsage, ParsedExtension, X509Extension,
};
use x509_parser::objects::{oid_registry, oid2abbrev, oid2sn};
use x509_parser::oid_registry::{OID_X509_COMMON_NAME, Oid};
use x509_parser::x509::X509Name;

use crate::config::ExtendedKeyUsage;

/// Which of the two is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The extensions a CSR asks for (its extensionRequest, PKCS #9).
    Request,
    /// The leaf certificate an operator's program returned.
    Leaf,
}

impl Side {
    fn noun(self) -> &'static str {
        match self {
            Self::Request => "the CSR",
            Self::Leaf => "the leaf",
        }
    }
}

/// What is accepted of one extension, on one side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// As it is (the SANs are held to the order's identifiers elsewhere).
    Any,
    /// basicConstraints with cA FALSE and no pathLenConstraint: a
    /// certificate here is never a CA (RFC 5280 §4.2.1.9).
    EndEntity,
    /// keyUsage with only the bits [`KEY_USAGE`] allows on that side.
    KeyUsageBits,
    /// extKeyUsage: on a request, within the purposes the certificate
    /// profile lets a CSR ask for; on a leaf, exactly those it grants.
    Purposes,
    /// Refused.
    Never,
}

/// An extension this server knows (RFC 5280 §4.2 unless said).
struct Known {
    oid: &'static str,
    name: &'static str,
    request: Rule,
    leaf: Rule,
}

const EXTENSIONS: [Known; 12] = [
    Known {
        oid: "2.5.29.17",
        name: "subjectAltName",
        request: Rule::Any,
        leaf: Rule::Any,
    },
    // TLS Feature (RFC 7633): "must-staple", which certbot and lego send
    // when asked to.
    Known {
        oid: "1.3.6.1.5.5.7.1.24",
        name: "tlsFeature",
        request: Rule::Any,
        leaf: Rule::Any,
    },
    // cert-manager asks for basicConstraints cA FALSE.
    Known {
        oid: "2.5.29.19",
        name: "basicConstraints",
        request: Rule::EndEntity,
        leaf: Rule::EndEntity,
    },
    Known {
        oid: "2.5.29.15",
        name: "keyUsage",
        request: Rule::KeyUsageBits,
        leaf: Rule::KeyUsageBits,
    },
    Known {
        oid: "2.5.29.37",
        name: "extKeyUsage",
        request: Rule::Purposes,
        leaf: Rule::Purposes,
    },
    // Constrains what a CA may certify (§4.2.1.10): meaningless, or worse,
    // anywhere but in a CA certificate.
    Known {
        oid: "2.5.29.30",
        name: "nameConstraints",
        request: Rule::Never,
        leaf: Rule::Never,
    },
    // What an issuing CA writes on its own: never the client's to ask.
    Known {
        oid: "2.5.29.35",
        name: "authorityKeyIdentifier",
        request: Rule::Never,
        leaf: Rule::Any,
    },
    Known {
        oid: "2.5.29.14",
        name: "subjectKeyIdentifier",
        request: Rule::Never,
        leaf: Rule::Any,
    },
    Known {
        oid: "2.5.29.31",
        name: "cRLDistributionPoints",
        request: Rule::Never,
        leaf: Rule::Any,
    },
    Known {
        oid: "1.3.6.1.5.5.7.1.1",
        name: "authorityInfoAccess",
        request: Rule::Never,
        leaf: Rule::Any,
    },
    Known {
        oid: "2.5.29.32",
        name: "certificatePolicies",
        request: Rule::Never,
        leaf: Rule::Any,
    },
    // Certificate Transparency SCTs (RFC 6962 §3.3).
    Known {
        oid: "1.3.6.1.4.1.11129.2.4.2",
        name: "signedCertificateTimestampList",
        request: Rule::Never,
        leaf: Rule::Any,
    },
];

/// One keyUsage bit (RFC 5280 §4.2.1.3): its name, how it is read, and
/// whether a CSR may ask for it and a leaf carry it. A TLS key signs (ECDHE
/// handshakes) or enciphers or agrees keys (RSA and static-DH key
/// exchange), which is all a CSR may ask for (cert-manager asks for
/// digitalSignature and keyEncipherment); the other end-entity bits are
/// the certificate profile's to grant (`content_commitment`). keyCertSign
/// and cRLSign make a CA key: never.
struct Bit {
    name: &'static str,
    set: fn(&KeyUsage) -> bool,
    request: bool,
    leaf: bool,
}

const KEY_USAGE: [Bit; 9] = [
    Bit {
        name: "digitalSignature",
        set: KeyUsage::digital_signature,
        request: true,
        leaf: true,
    },
    Bit {
        name: "contentCommitment",
        set: KeyUsage::non_repudiation,
        request: false,
        leaf: true,
    },
    Bit {
        name: "keyEncipherment",
        set: KeyUsage::key_encipherment,
        request: true,
        leaf: true,
    },
    Bit {
        name: "dataEncipherment",
        set: KeyUsage::data_encipherment,
        request: false,
        leaf: true,
    },
    Bit {
        name: "keyAgreement",
        set: KeyUsage::key_agreement,
        request: true,
        leaf: true,
    },
    Bit {
        name: "keyCertSign",
        set: KeyUsage::key_cert_sign,
        request: false,
        leaf: false,
    },
    Bit {
        name: "cRLSign",
        set: KeyUsage::crl_sign,
        request: false,
        leaf: false,
    },
    Bit {
        name: "encipherOnly",
        set: KeyUsage::encipher_only,
        request: false,
        leaf: true,
    },
    Bit {
        name: "decipherOnly",
        set: KeyUsage::decipher_only,
        request: false,
        leaf: true,
    },
];

/// The extKeyUsage purposes x509-parser reads by name (RFC 5280
/// §4.2.1.12), and which of the configurable ones each is; any other is
/// read as its OID.
struct Purpose {
    name: &'static str,
    set: fn(&ParsedEku<'_>) -> bool,
    ours: Option<ExtendedKeyUsage>,
}

const PURPOSES: [Purpose; 7] = [
    Purpose {
        name: "serverAuth",
        set: |e| e.server_auth,
        ours: Some(ExtendedKeyUsage::ServerAuth),
    },
    Purpose {
        name: "clientAuth",
        set: |e| e.client_auth,
        ours: Some(ExtendedKeyUsage::ClientAuth),
    },
    Purpose {
        name: "codeSigning",
        set: |e| e.code_signing,
        ours: None,
    },
    Purpose {
        name: "emailProtection",
        set: |e| e.email_protection,
        ours: None,
    },
    Purpose {
        name: "timeStamping",
        set: |e| e.time_stamping,
        ours: None,
    },
    Purpose {
        name: "OCSPSigning",
        set: |e| e.ocsp_signing,
        ours: None,
    },
    Purpose {
        name: "anyExtendedKeyUsage",
        set: |e| e.any,
        ours: None,
    },
];

/// The subject: commonName attributes only, or none at all. Any other
/// attribute (O, OU, C, emailAddress, …) would be a claim about the
/// subscriber that no ACME challenge proved (RFC 8555 §7.4 has the CSR
/// name identifiers, and a CN, when there is one, is one of them — checked
/// by the caller).
pub fn check_subject(side: Side, subject: &X509Name<'_>) -> Result<(), String> {
    match subject
        .iter_attributes()
        .find(|a| *a.attr_type() != OID_X509_COMMON_NAME)
    {
        None => Ok(()),
        Some(other) => {
            let oid = other.attr_type();
            let name = oid2abbrev(oid, oid_registry()).unwrap_or("an attribute");
            Err(format!(
                "{}'s subject has {name} ({}); only a commonName (or an empty subject) is accepted",
                side.noun(),
                oid.to_id_string()
            ))
        }
    }
}

/// The extensions of one side, each against its rule in [`EXTENSIONS`],
/// each at most once (RFC 5280 §4.2). On a request, an extension the table
/// does not let in is refused, known or not; on a leaf, one the server does
/// not know is refused when critical (§4.2: whoever does not recognise a
/// critical extension must reject the certificate, and nothing is served
/// here that the server cannot vouch for), and the leaf must carry an
/// extKeyUsage. `purposes`: on a request, what the certificate profile lets
/// a CSR ask for ([`ExtendedKeyUsage::requestable`]); on a leaf, what it
/// grants ([`ExtendedKeyUsage::granted`]).
pub fn check_extensions(
    side: Side,
    extensions: &[X509Extension<'_>],
    purposes: &[ExtendedKeyUsage],
) -> Result<(), String> {
    let mut seen: Vec<&Oid<'_>> = Vec::with_capacity(extensions.len());
    let mut had_purposes = false;
    for ext in extensions {
        if seen.contains(&&ext.oid) {
            return Err(format!(
                "{} has the {} extension twice; RFC 5280 §4.2 allows one of each",
                side.noun(),
                describe(&ext.oid)
            ));
        }
        seen.push(&ext.oid);
        let dotted = ext.oid.to_id_string();
        let known = EXTENSIONS.iter().find(|k| k.oid == dotted);
        let rule = match (known, side) {
            (Some(k), Side::Request) => k.request,
            (Some(k), Side::Leaf) => k.leaf,
            (None, Side::Leaf) if !ext.critical => Rule::Any,
            (None, Side::Request) => {
                return Err(format!(
                    "the CSR asks for an extension this server does not issue: {}; {}",
                    describe(&ext.oid),
                    requestable()
                ));
            }
            (None, Side::Leaf) => {
                return Err(format!(
                    "the leaf has a critical extension this server does not know: {}",
                    describe(&ext.oid)
                ));
            }
        };
        if let ParsedExtension::ParseError { error } = ext.parsed_extension() {
            return Err(format!(
                "{}'s {} extension does not parse: {error}",
                side.noun(),
                describe(&ext.oid)
            ));
        }
        match (rule, ext.parsed_extension()) {
            (Rule::Any, _) => {}
            (Rule::Never, _) => {
                return Err(match side {
                    Side::Request => format!(
                        "the CSR asks for {}, which no certificate here carries; {}",
                        describe(&ext.oid),
                        requestable()
                    ),
                    Side::Leaf => format!(
                        "the leaf has {}, which no leaf here may carry",
                        describe(&ext.oid)
                    ),
                });
            }
            (Rule::EndEntity, ParsedExtension::BasicConstraints(bc)) => {
                if bc.ca {
                    return Err(format!(
                        "{} has basicConstraints cA TRUE; a certificate here is never a CA",
                        side.noun()
                    ));
                }
                if bc.path_len_constraint.is_some() {
                    return Err(format!(
                        "{} has basicConstraints with a pathLenConstraint, which only a CA may have (RFC 5280 §4.2.1.9)",
                        side.noun()
                    ));
                }
            }
            (Rule::KeyUsageBits, ParsedExtension::KeyUsage(ku)) => check_key_usage(side, ku)?,
            (Rule::Purposes, ParsedExtension::ExtendedKeyUsage(eku)) => {
                had_purposes = true;
                check_purposes(side, eku, purposes)?;
            }
            (_, _) => {
                return Err(format!(
                    "{}'s {} extension does not parse",
                    side.noun(),
                    describe(&ext.oid)
                ));
            }
        }
    }
    if side == Side::Leaf && !had_purposes {
        return Err(format!(
            "the leaf has no extKeyUsage; the certificate profile's is {}",
            names(purposes)
        ));
    }
    Ok(())
}

fn check_key_usage(side: Side, ku: &KeyUsage) -> Result<(), String> {
    let allowed = |b: &Bit| match side {
        Side::Request => b.request,
        Side::Leaf => b.leaf,
    };
    let refused: Vec<&str> = KEY_USAGE
        .iter()
        .filter(|b| (b.set)(ku) && !allowed(b))
        .map(|b| b.name)
        .collect();
    // Bits past decipherOnly (8) have no meaning.
    let unknown = ku.flags >> KEY_USAGE.len() != 0;
    if refused.is_empty() && !unknown {
        return Ok(());
    }
    let accepted: Vec<&str> = KEY_USAGE
        .iter()
        .filter(|b| allowed(b))
        .map(|b| b.name)
        .collect();
    let what = if refused.is_empty() {
        "a bit RFC 5280 does not define".to_owned()
    } else {
        refused.join(", ")
    };
    Err(format!(
        "{}'s keyUsage has {what}; accepted bits: {}",
        side.noun(),
        accepted.join(", ")
    ))
}

fn check_purposes(
    side: Side,
    eku: &ParsedEku<'_>,
    purposes: &[ExtendedKeyUsage],
) -> Result<(), String> {
    let mut ours: Vec<ExtendedKeyUsage> = Vec::new();
    let mut others: Vec<String> = Vec::new();
    for p in PURPOSES.iter().filter(|p| (p.set)(eku)) {
        match p.ours {
            Some(o) => ours.push(o),
            None => others.push(p.name.to_owned()),
        }
    }
    others.extend(eku.other.iter().map(|oid| oid.to_id_string()));
    let asked: Vec<String> = ours
        .iter()
        .map(|o| o.rfc5280_name().to_owned())
        .chain(others.iter().cloned())
        .collect();
    match side {
        Side::Request => {
            if others.is_empty() && ours.iter().all(|o| purposes.contains(o)) {
                return Ok(());
            }
            Err(format!(
                "the CSR asks for extKeyUsage {}; at this certificate profile a CSR may ask for {} only",
                asked.join(", "),
                names(purposes)
            ))
        }
        Side::Leaf => {
            if others.is_empty()
                && ours.iter().all(|o| purposes.contains(o))
                && purposes.iter().all(|p| ours.contains(p))
            {
                return Ok(());
            }
            Err(format!(
                "the leaf's extKeyUsage is {}; the certificate profile's is {}",
                if asked.is_empty() {
                    "empty".to_owned()
                } else {
                    asked.join(", ")
                },
                names(purposes)
            ))
        }
    }
}

/// What a CSR may ask for, said from the table.
fn requestable() -> String {
    let mut said: Vec<String> = Vec::new();
    for k in EXTENSIONS.iter() {
        match k.request {
            Rule::Never => {}
            Rule::Any => said.push(k.name.to_owned()),
            Rule::EndEntity => said.push(format!("{} (cA FALSE)", k.name)),
            Rule::KeyUsageBits => said.push(format!(
                "{} ({})",
                k.name,
                KEY_USAGE
                    .iter()
                    .filter(|b| b.request)
                    .map(|b| b.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Rule::Purposes => said.push(format!("{} (within the certificate profile)", k.name)),
        }
    }
    format!("a CSR may ask for {} only", said.join(", "))
}

fn names(purposes: &[ExtendedKeyUsage]) -> String {
    purposes
        .iter()
        .map(|p| p.rfc5280_name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// An extension's name and OID, or its OID alone when nobody knows it.
fn describe(oid: &Oid<'_>) -> String {
    let dotted = oid.to_id_string();
    let name = EXTENSIONS
        .iter()
        .find(|k| k.oid == dotted)
        .map(|k| k.name)
        .or_else(|| oid2sn(oid, oid_registry()).ok());
    match name {
        Some(name) => format!("{name} ({dotted})"),
        None => dotted,
    }
}
