//! The custom signer: an operator's program turns the CSR into a chain
//! (a legacy PKI, an internal API behind a script).
//!
//! Each operation is one run of a program through [`crate::operator_program::run`]:
//! no shell, a cleared environment, the request as JSON on stdin, killed at
//! the deadline (or when the request that started it goes away), output
//! capped. What comes back is checked before anyone trusts it: the chain
//! parses, each certificate is signed by the next, the leaf's key is the
//! CSR's, its names are exactly the order's, and its subject and
//! extensions are what a leaf here may carry (see [`check_chain`]).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use acme_proxy_protocol::types::{Identifier, IdentifierType};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::extensions::{Side, check_extensions, check_subject};
use super::{IssueRequest, Issued, SignerError};
use crate::config::{CustomConfig, CustomOperation};

/// Output kept from one run: a chain or a CRL is far below this.
const OUTPUT_CAP: usize = 1 << 20;
/// How long a CRL from the program is served before it is asked again.
const CRL_CACHE: Duration = Duration::from_secs(60);

/// What the issuing program is told, beyond [`IssueRequest`].
#[derive(Debug)]
pub struct IssueContext<'a> {
    pub profile: &'a str,
    pub order_id: &'a str,
    pub csr_der: &'a [u8],
    pub certificate_profile: Option<&'a str>,
}

pub struct Custom {
    profile: String,
    config: CustomConfig,
    ca_pem: String,
    crl: tokio::sync::Mutex<Option<(Instant, Vec<u8>)>>,
    windows: super::WindowCache,
}

impl std::fmt::Debug for Custom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Custom")
            .field("profile", &self.profile)
            .field("command", &self.config.command)
            .finish_non_exhaustive()
    }
}

impl Custom {
    /// Checks that the programs exist and reads `ca_cert`.
    pub fn new(profile: &str, config: &CustomConfig) -> Result<Self, String> {
        let mut programs = vec![&config.command];
        for op in [&config.revoke, &config.crl, &config.renewal_window]
            .into_iter()
            .flatten()
        {
            programs.push(&op.command);
        }
        for p in programs {
            let meta = std::fs::metadata(p)
                .map_err(|e| format!("the program {} cannot be used: {e}", p.display()))?;
            use std::os::unix::fs::PermissionsExt;
            if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
                return Err(format!(
                    "{} is not an executable file; chmod +x it or name the right program",
                    p.display()
                ));
            }
        }
        let ca_pem = match &config.ca_cert {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("reading ca_cert {}: {e}", path.display()))?,
            None => String::new(),
        };
        Ok(Self {
            profile: profile.to_owned(),
            config: config.clone(),
            ca_pem,
            crl: tokio::sync::Mutex::new(None),
            windows: super::WindowCache::default(),
        })
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn config(&self) -> &CustomConfig {
        &self.config
    }

    /// Runs the issuing program and checks what it printed.
    pub async fn issue(
        &self,
        req: &IssueRequest<'_>,
        ctx: &IssueContext<'_>,
    ) -> Result<Issued, SignerError> {
        let input = serde_json::json!({
            "operation": "issue",
            "profile": ctx.profile,
            "order": ctx.order_id,
            "certificate_profile": ctx.certificate_profile,
            "identifiers": req.identifiers,
            "csr": STANDARD.encode(ctx.csr_der),
            "not_before": crate::clock::rfc3339(req.not_before.unix_timestamp()),
            "not_after": crate::clock::rfc3339(req.not_after.unix_timestamp()),
            "key_usages": req.key_usages,
            "extended_key_usages": req.extended_key_usages,
        });
        let out = crate::operator_program::run(
            &self.config.command,
            &self.config.args,
            input.to_string().as_bytes(),
            self.config.timeout,
            OUTPUT_CAP,
        )
        .await
        .map_err(|e| match e {
            // Not started: nothing can have been signed.
            crate::operator_program::RunError::Spawn(..) => {
                SignerError::Internal(format!("the issuing program {e}"))
            }
            _ => SignerError::Failed(format!("the issuing program {e}")),
        })?;
        if out.status.code() == Some(self.config.bad_csr_exit_code) {
            tracing::info!(
                event = "signer.custom",
                outcome = "refused",
                profile = %self.profile,
                order = ctx.order_id,
                first_line = %out.first_error_line(),
                "the issuing program refused the CSR"
            );
            return Err(SignerError::BadCsr(
                "the signing service refused this CSR".to_owned(),
            ));
        }
        if !out.status.success() {
            return Err(SignerError::Failed(format!(
                "the issuing program exited with {}: {}",
                out.status,
                out.first_error_line()
            )));
        }
        let chain_pem = String::from_utf8(out.stdout)
            .map_err(|_| SignerError::Failed("the issuing program printed non-UTF-8".into()))?;
        check_chain(
            &chain_pem,
            req.spki_der,
            req.identifiers,
            req.extended_key_usages,
        )
        .map_err(SignerError::Failed)
    }

    /// Runs the revocation program, if there is one; Ok(false) when there
    /// is none (the revocation is then only recorded here).
    pub async fn revoke(
        &self,
        serial: &str,
        chain_pem: &str,
        reason: u64,
    ) -> Result<bool, SignerError> {
        let Some(op) = &self.config.revoke else {
            return Ok(false);
        };
        let input = serde_json::json!({
            "operation": "revoke",
            "profile": self.profile,
            "serial": serial,
            "certificate": chain_pem,
            "reason": reason,
        });
        let out = self.run(op, &input).await?;
        if !out.status.success() {
            return Err(SignerError::Failed(format!(
                "the revocation program exited with {}: {}",
                out.status,
                out.first_error_line()
            )));
        }
        Ok(true)
    }

    /// The CRL (DER) from the CRL program, cached for a minute; None when
    /// the profile declares no CRL program.
    pub async fn crl(&self) -> Result<Option<Vec<u8>>, SignerError> {
        let Some(op) = &self.config.crl else {
            return Ok(None);
        };
        let mut cache = self.crl.lock().await;
        if let Some((at, der)) = cache.as_ref()
            && at.elapsed() < CRL_CACHE
        {
            return Ok(Some(der.clone()));
        }
        let input = serde_json::json!({"operation": "crl", "profile": self.profile});
        let out = self.run(op, &input).await?;
        if !out.status.success() || out.stdout.is_empty() {
            return Err(SignerError::Failed(format!(
                "the CRL program exited with {} and {} bytes: {}",
                out.status,
                out.stdout.len(),
                out.first_error_line()
            )));
        }
        x509_parser::revocation_list::CertificateRevocationList::from_der(&out.stdout)
            .map_err(|e| SignerError::Failed(format!("the CRL program printed no DER CRL: {e}")))?;
        *cache = Some((Instant::now(), out.stdout.clone()));
        Ok(Some(out.stdout))
    }

    /// The renewal window (Unix seconds) the renewal-window program gives,
    /// None when there is none or it printed nothing (cached a while, a few
    /// runs at a time: see [`super::WindowCache`]).
    pub async fn renewal_window(
        &self,
        serial: &str,
        chain_pem: &str,
    ) -> Result<Option<(i64, i64)>, SignerError> {
        let Some(op) = &self.config.renewal_window else {
            return Ok(None);
        };
        self.windows
            .get(serial, self.ask_window(op, serial, chain_pem))
            .await
    }

    async fn ask_window(
        &self,
        op: &CustomOperation,
        serial: &str,
        chain_pem: &str,
    ) -> Result<Option<(i64, i64)>, SignerError> {
        let input = serde_json::json!({
            "operation": "renewal_window",
            "profile": self.profile,
            "serial": serial,
            "certificate": chain_pem,
        });
        let out = self.run(op, &input).await?;
        if !out.status.success() {
            return Err(SignerError::Failed(format!(
                "the renewal-window program exited with {}: {}",
                out.status,
                out.first_error_line()
            )));
        }
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        #[derive(serde::Deserialize)]
        struct Window {
            start: String,
            end: String,
        }
        let w: Window = serde_json::from_slice(&out.stdout).map_err(|e| {
            SignerError::Failed(format!("the renewal-window program printed no window: {e}"))
        })?;
        let parse = |s: &str| {
            crate::clock::parse_rfc3339(s).ok_or_else(|| {
                SignerError::Failed(format!("the renewal-window program printed {s:?}"))
            })
        };
        let (start, end) = (parse(&w.start)?, parse(&w.end)?);
        if end <= start {
            // RFC 9773 §4.2: never serve such a window.
            return Err(SignerError::Failed(
                "the renewal-window program's end is not after its start".into(),
            ));
        }
        Ok(Some((start, end)))
    }

    async fn run(
        &self,
        op: &CustomOperation,
        input: &serde_json::Value,
    ) -> Result<crate::operator_program::Finished, SignerError> {
        crate::operator_program::run(
            &op.command,
            &op.args,
            input.to_string().as_bytes(),
            self.config.timeout,
            OUTPUT_CAP,
        )
        .await
        .map_err(|e| SignerError::Failed(format!("{} {e}", op.command.display())))
    }
}

/// The checks a chain from outside passes before it is stored: PEM
/// `CERTIFICATE` blocks and nothing else, leaf first, each signed by the
/// next; the leaf's key is the CSR's; its subject is commonNames only (each
/// one of the order's names) or empty; its extensions pass
/// [`super::extensions::check_extensions`] — extKeyUsage exactly
/// `extended_key_usages`, no keyCertSign or cRLSign, not a CA, no
/// nameConstraints, no critical extension the server does not know —; and
/// its names are exactly the order's. The program is told to build the
/// certificate from the order, but nothing it prints is trusted for that:
/// one that copied the CSR's subject or extensions is caught here, before
/// anything is stored or served. What is stored and served is re-encoded
/// from the checked certificates, never the program's text.
fn check_chain(
    chain_pem: &str,
    spki_der: &[u8],
    identifiers: &[Identifier],
    extended_key_usages: &[crate::config::ExtendedKeyUsage],
) -> Result<Issued, String> {
    let blocks = pem::parse_many(chain_pem).map_err(|e| format!("the chain is not PEM: {e}"))?;
    if chain_pem.matches("-----BEGIN ").count() != blocks.len() {
        return Err("the output has a malformed PEM block".into());
    }
    if let Some(other) = blocks.iter().find(|b| b.tag() != "CERTIFICATE") {
        return Err(format!(
            "the output has a {:?} block; only CERTIFICATE blocks are accepted",
            other.tag()
        ));
    }
    let ders: Vec<Vec<u8>> = blocks.into_iter().map(pem::Pem::into_contents).collect();
    if ders.is_empty() {
        return Err("the program printed no certificate".into());
    }
    let mut certs = Vec::with_capacity(ders.len());
    for (i, der) in ders.iter().enumerate() {
        let (_, c) = X509Certificate::from_der(der)
            .map_err(|e| format!("certificate {i} of the chain does not parse: {e}"))?;
        certs.push(c);
    }
    for (i, pair) in certs.windows(2).enumerate() {
        pair[0]
            .verify_signature(Some(pair[1].public_key()))
            .map_err(|_| format!("certificate {i} of the chain is not signed by the next"))?;
    }
    let leaf = &certs[0];
    if leaf.public_key().raw != spki_der {
        return Err("the leaf's public key is not the CSR's".into());
    }
    check_subject(Side::Leaf, leaf.subject())?;
    for cn in leaf.subject().iter_common_name() {
        let cn = cn.as_str().map_err(|_| "the leaf's CN is not text")?;
        if !identifiers.iter().any(|i| i.value.eq_ignore_ascii_case(cn)) {
            return Err(format!(
                "the leaf's CN {cn:?} is not one of the order's names"
            ));
        }
    }
    check_extensions(Side::Leaf, leaf.extensions(), extended_key_usages)?;
    let mut names = BTreeSet::new();
    if let Ok(Some(san)) = leaf.subject_alternative_name() {
        for g in &san.value.general_names {
            match g {
                GeneralName::DNSName(n) => {
                    names.insert((IdentifierType::Dns.as_str(), n.to_ascii_lowercase()));
                }
                GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).map(|a| std::net::IpAddr::from(a).to_string()),
                        16 => {
                            <[u8; 16]>::try_from(*b).map(|a| std::net::IpAddr::from(a).to_string())
                        }
                        _ => return Err("the leaf has a malformed IP SAN".into()),
                    }
                    .map_err(|_| "the leaf has a malformed IP SAN".to_owned())?;
                    names.insert((IdentifierType::Ip.as_str(), ip));
                }
                other => return Err(format!("the leaf names something else: {other:?}")),
            }
        }
    }
    // Pairs of strings, so that the refusal prints them as before.
    let wanted: BTreeSet<(&str, String)> = identifiers
        .iter()
        .map(|i| (i.kind.as_str(), i.value.to_ascii_lowercase()))
        .collect();
    if names != wanted {
        return Err(format!(
            "the leaf's names {names:?} are not the order's {wanted:?}"
        ));
    }
    let chain_pem = ders
        .iter()
        .map(|der| pem::encode(&pem::Pem::new("CERTIFICATE", der.clone())))
        .collect::<String>();
    Ok(Issued {
        chain_pem,
        serial: hex::encode(leaf.raw_serial()),
        not_before: leaf.validity().not_before.timestamp(),
        not_after: leaf.validity().not_after.timestamp(),
    })
}

/// The operator's program decides in the end: it is told the window asked
/// for and signs inside the request, taking its time (the order is
/// processing meanwhile).
impl super::SignerBackend for Custom {
    fn issuance(&self) -> super::Issuance<'_> {
        super::Issuance::Guarded {
            within: self.config.timeout,
        }
    }

    fn issue<'a>(
        &'a self,
        req: &'a IssueRequest<'a>,
        ctx: &'a IssueContext<'a>,
    ) -> super::BoxFuture<'a, Result<Issued, SignerError>> {
        Box::pin(Custom::issue(self, req, ctx))
    }

    fn ca_pem(&self) -> &str {
        Custom::ca_pem(self)
    }

    fn renewal_window<'a>(
        &'a self,
        cert: &'a super::IssuedCertificate<'a>,
    ) -> Option<super::AskedWindow<'a>> {
        Some(Box::pin(async move {
            Custom::renewal_window(self, cert.serial, cert.chain_pem)
                .await
                .map_err(|e| format!("the renewal-window program: {e}"))
        }))
    }

    /// The revocation program, when the profile declares one.
    fn revoke<'a>(
        &'a self,
        cert: &'a super::IssuedCertificate<'a>,
        reason: u64,
    ) -> super::BoxFuture<'a, Result<(), super::RevokeFailure>> {
        Box::pin(async move {
            Custom::revoke(self, cert.serial, cert.chain_pem, reason)
                .await
                .map(|_| ())
                .map_err(|e| super::RevokeFailure {
                    message: "the revocation program did not revoke the certificate",
                    error: e.to_string(),
                    problem: None,
                })
        })
    }

    /// Its CRL program's, only when it declares one.
    fn crl(&self) -> super::Crl {
        if self.config.crl.is_some() {
            super::Crl::Served
        } else {
            super::Crl::None
        }
    }

    fn served_crl(&self) -> super::BoxFuture<'_, Result<Option<Vec<u8>>, SignerError>> {
        Box::pin(Custom::crl(self))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rcgen::{
        BasicConstraints, CertificateParams, CustomExtension, DnType, ExtendedKeyUsagePurpose,
        GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose, NameConstraints, PublicKeyData,
    };

    use super::*;
    use crate::config::ExtendedKeyUsage;

    const SERVER: &[ExtendedKeyUsage] = &[ExtendedKeyUsage::ServerAuth];

    /// What a test changes in a leaf's parameters.
    type Tweak = fn(&mut CertificateParams);

    /// A CA, and a leaf for `names` with a fresh key signed by it (a CN,
    /// serverAuth, then whatever `tweak` does): (chain PEM, the leaf key's
    /// SPKI DER).
    fn chain_with(names: &[&str], signed_by_other_ca: bool, tweak: Tweak) -> (String, Vec<u8>) {
        let ca = |cn: &str| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let cert = p.self_signed(&key).unwrap();
            (cert, Issuer::new(p, key))
        };
        let (ca_cert, issuer) = ca("CA");
        let (_, other) = ca("other CA");
        let leaf_key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        tweak(&mut params);
        let leaf = params
            .signed_by(&leaf_key, if signed_by_other_ca { &other } else { &issuer })
            .unwrap();
        (
            format!("{}{}", leaf.pem(), ca_cert.pem()),
            leaf_key.subject_public_key_info(),
        )
    }

    fn chain(names: &[&str], signed_by_other_ca: bool) -> (String, Vec<u8>) {
        chain_with(names, signed_by_other_ca, |_| {})
    }

    fn ids(names: &[&str]) -> Vec<Identifier> {
        names.iter().map(|n| Identifier::dns(*n)).collect()
    }

    /// An extension under a private arc nobody knows.
    fn unknown_extension(critical: bool) -> CustomExtension {
        let mut ext = CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 55555, 7], vec![5, 0]);
        ext.set_criticality(critical);
        ext
    }

    #[test]
    fn a_chain_for_the_csrs_key_and_the_orders_names_is_accepted() {
        let (pem, spki) = chain(&["a.test", "b.test"], false);
        let issued = check_chain(&pem, &spki, &ids(&["b.test", "a.test"]), SERVER).unwrap();
        assert_eq!(
            ::pem::parse_many(&issued.chain_pem).unwrap(),
            ::pem::parse_many(&pem).unwrap()
        );
        assert_eq!(issued.serial.len() % 2, 0);
        // What an issuing CA adds, and an extension nobody knows that is
        // not critical, are fine.
        let (pem, spki) = chain_with(&["a.test"], false, |p| {
            p.use_authority_key_identifier_extension = true;
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            p.is_ca = IsCa::ExplicitNoCa;
            p.custom_extensions.push(unknown_extension(false));
        });
        check_chain(&pem, &spki, &ids(&["a.test"]), SERVER).unwrap();
    }

    #[test]
    fn other_names_another_key_a_broken_link_and_no_certificate_are_refused() {
        let (pem, spki) = chain(&["a.test"], false);
        let e = check_chain(&pem, &spki, &ids(&["a.test", "b.test"]), SERVER).unwrap_err();
        assert!(e.contains("not the order's"), "{e}");
        let (_, other_spki) = chain(&["a.test"], false);
        let e = check_chain(&pem, &other_spki, &ids(&["a.test"]), SERVER).unwrap_err();
        assert!(e.contains("public key"), "{e}");
        // A block another parser might take for a certificate, smuggled in
        // front of the checked leaf.
        let smuggled = format!(
            "-----BEGIN X509 CERTIFICATE-----\nAAAA\n-----END X509 CERTIFICATE-----\n{pem}"
        );
        let e = check_chain(&smuggled, &spki, &ids(&["a.test"]), SERVER).unwrap_err();
        assert!(e.contains("X509 CERTIFICATE"), "{e}");
        let e = check_chain(
            &pem,
            &spki,
            &ids(&["a.test"]),
            &[ExtendedKeyUsage::ClientAuth],
        )
        .unwrap_err();
        assert!(e.contains("extKeyUsage"), "{e}");
        let (pem, spki) = chain(&["a.test"], true);
        let e = check_chain(&pem, &spki, &ids(&["a.test"]), SERVER).unwrap_err();
        assert!(e.contains("not signed by the next"), "{e}");
        let e = check_chain("garbage", &spki, &ids(&["a.test"]), SERVER).unwrap_err();
        assert!(e.contains("no certificate") || e.contains("not PEM"), "{e}");
    }

    #[test]
    fn a_leaf_with_more_than_a_common_name_or_the_profiles_usages_is_refused() {
        let table: [(&str, Tweak, &str); 8] = [
            (
                "an O attribute",
                |p| p.distinguished_name.push(DnType::OrganizationName, "Evil"),
                "subject has O",
            ),
            (
                "an extra purpose",
                |p| {
                    p.extended_key_usages
                        .push(ExtendedKeyUsagePurpose::CodeSigning)
                },
                "extKeyUsage is serverAuth, codeSigning",
            ),
            (
                "no extKeyUsage",
                |p| p.extended_key_usages.clear(),
                "no extKeyUsage",
            ),
            (
                "keyCertSign",
                |p| {
                    p.key_usages = vec![
                        KeyUsagePurpose::DigitalSignature,
                        KeyUsagePurpose::KeyCertSign,
                    ]
                },
                "keyUsage has keyCertSign",
            ),
            (
                "cRLSign",
                |p| p.key_usages = vec![KeyUsagePurpose::CrlSign],
                "keyUsage has cRLSign",
            ),
            (
                "CA:TRUE",
                |p| p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained),
                "cA TRUE",
            ),
            (
                "nameConstraints",
                |p| {
                    p.name_constraints = Some(NameConstraints {
                        permitted_subtrees: vec![GeneralSubtree::DnsName("a.test".into())],
                        excluded_subtrees: vec![],
                    })
                },
                "nameConstraints (2.5.29.30)",
            ),
            (
                "an unknown critical extension",
                |p| p.custom_extensions.push(unknown_extension(true)),
                "critical extension this server does not know: 1.3.6.1.4.1.55555.7",
            ),
        ];
        for (case, tweak, said) in table {
            let (pem, spki) = chain_with(&["a.test"], false, tweak);
            let e = check_chain(&pem, &spki, &ids(&["a.test"]), SERVER)
                .err()
                .unwrap_or_else(|| panic!("{case}: accepted"));
            assert!(e.contains(said), "{case}: {e}");
        }
    }
}
