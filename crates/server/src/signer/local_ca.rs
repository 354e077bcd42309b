//! The embedded CA: a self-generated ECDSA P-256 CA (key written 0600 in the
//! data directory) or the operator's own CA certificate, key and chain.
//!
//! Leaves carry exactly the order's names as SANs, the certificate
//! profile's EKU (serverAuth by default), AKI/SKI, a serial of the time and
//! 80 random bits (`ids::serial`), the configured validity and backdating,
//! and optionally a CRL distribution point and an AIA caIssuers URL. CRLs are RFC 5280 v2 CRLs with an AKI and a CRL
//! number.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use acme_proxy_protocol::types::IdentifierType;
use acme_proxy_store::RevokedEntry;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CrlDistributionPoint,
    CustomExtension, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod,
    KeyPair, KeyUsagePurpose, RevocationReason, RevokedCertParams, SanType, SerialNumber,
    SubjectPublicKeyInfo,
};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, ParsedExtension, X509Certificate};

use super::{IssueRequest, Issued, SignerError};
use crate::config::{ExtendedKeyUsage, KeyUsage, LocalCaConfig};
use crate::ids;

/// The embedded CA of one profile.
pub struct LocalCa {
    /// Shared with the blocking-pool thread that signs with a token key.
    issuer: Arc<Issuer<'static, CaKey>>,
    /// The CA certificate followed by the configured chain, PEM.
    ca_pem: String,
    /// SKI of the CA certificate, for the CRL's AKI (RFC 5280 §5.2.1).
    key_id: KeyIdMethod,
    config: LocalCaConfig,
}

impl std::fmt::Debug for LocalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("LocalCa").finish_non_exhaustive()
    }
}

/// Where the CA's private key is: a PKCS#8 file read at start-up, or a
/// PKCS#11 token that signs for us.
enum CaKey {
    File(KeyPair),
    #[cfg(feature = "pkcs11")]
    Token(super::pkcs11::TokenKey),
}

impl rcgen::PublicKeyData for CaKey {
    fn der_bytes(&self) -> &[u8] {
        match self {
            Self::File(k) => k.der_bytes(),
            #[cfg(feature = "pkcs11")]
            Self::Token(k) => k.der_bytes(),
        }
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        match self {
            Self::File(k) => rcgen::PublicKeyData::algorithm(k),
            #[cfg(feature = "pkcs11")]
            Self::Token(k) => k.algorithm(),
        }
    }
}

impl rcgen::SigningKey for CaKey {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        match self {
            Self::File(k) => k.sign(msg),
            #[cfg(feature = "pkcs11")]
            Self::Token(k) => k.sign(msg),
        }
    }
}

fn internal(context: &str) -> impl Fn(rcgen::Error) -> SignerError + '_ {
    move |e| SignerError::Internal(format!("{context}: {e}"))
}

/// The directory, certificate and key of `profile`'s self-generated CA;
/// None when the configuration names the operator's CA (a certificate with
/// a key file, or with a key in a token).
fn self_generated(
    profile: &str,
    config: &LocalCaConfig,
    data_dir: &Path,
) -> Option<(PathBuf, PathBuf, PathBuf)> {
    match (&config.ca_cert, &config.ca_key) {
        (Some(_), Some(_)) => None,
        (Some(_), None) if config.pkcs11.is_some() => None,
        _ => {
            let dir = data_dir.join("ca").join(profile);
            let cert = dir.join("ca.pem");
            let key = dir.join("ca.key");
            Some((dir, cert, key))
        }
    }
}

/// Where the CA certificate of a `local_ca` profile is: the operator's,
/// or the self-generated one's place (which may not exist yet).
pub fn ca_cert_path(profile: &str, config: &LocalCaConfig, data_dir: &Path) -> PathBuf {
    match self_generated(profile, config, data_dir) {
        Some((_, cert, _)) => cert,
        None => config.ca_cert.clone().unwrap_or_default(),
    }
}

impl LocalCa {
    /// Whether [`LocalCa::load_or_create`] would generate the CA, for a
    /// dry run of start-up that creates nothing.
    pub fn still_to_generate(profile: &str, config: &LocalCaConfig, data_dir: &Path) -> bool {
        self_generated(profile, config, data_dir)
            .is_some_and(|(_, cert, key)| !cert.exists() && !key.exists())
    }

    /// Loads the operator's CA, or loads (creating on first start) the
    /// self-generated CA of `profile` under `data_dir/ca/{profile}/`.
    pub fn load_or_create(
        profile: &str,
        config: &LocalCaConfig,
        data_dir: &Path,
        now: OffsetDateTime,
    ) -> Result<Self, SignerError> {
        let (cert_path, key_path, chain_path) = match self_generated(profile, config, data_dir) {
            Some((dir, cert, key)) => {
                if !cert.exists() && !key.exists() {
                    generate(profile, &dir, &cert, &key, now)?;
                }
                // Another process on the same data directory (a replica
                // started at the same moment) may have written the key
                // and not yet the certificate: the CA is theirs.
                wait_for_certificate(&cert, &key)?;
                (cert, key, None)
            }
            None => (
                config.ca_cert.clone().unwrap_or_default(),
                // Without a key file, the key is in a token.
                config.ca_key.clone().unwrap_or_default(),
                config.chain.clone(),
            ),
        };
        let read = |p: &PathBuf| {
            fs::read_to_string(p)
                .map_err(|e| SignerError::Internal(format!("reading {}: {e}", p.display())))
        };
        let cert_pem = read(&cert_path)?;
        let cert_der = pem::parse(&cert_pem)
            .map_err(|e| SignerError::Internal(format!("{}: {e}", cert_path.display())))?
            .into_contents();
        let (_, cert) = X509Certificate::from_der(&cert_der)
            .map_err(|e| SignerError::Internal(format!("{}: {e}", cert_path.display())))?;
        let key = match &config.pkcs11 {
            Some(p11) => token_key(p11, cert.public_key().raw, &cert_path)?,
            None => {
                let key_pem = read(&key_path)?;
                let key = KeyPair::from_pem(&key_pem).map_err(|e| {
                    SignerError::Internal(format!(
                        "{} is not a PKCS#8 PEM private key rcgen can use: {e}",
                        key_path.display()
                    ))
                })?;
                // A key that does not match the certificate would sign
                // leaves nobody can verify: stop start-up instead.
                if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
                    return Err(SignerError::Internal(format!(
                        "the key in {} does not belong to the certificate in {}",
                        key_path.display(),
                        cert_path.display()
                    )));
                }
                CaKey::File(key)
            }
        };
        let key_id = cert
            .extensions()
            .iter()
            .find_map(|ext| match ext.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(ski) => {
                    Some(KeyIdMethod::PreSpecified(ski.0.to_vec()))
                }
                _ => None,
            })
            .unwrap_or(KeyIdMethod::Sha256);
        let issuer = Issuer::from_ca_cert_der(&cert_der.clone().into(), key)
            .map_err(internal("parsing the CA certificate"))?;
        let mut ca_pem = pem::encode(&pem::Pem::new("CERTIFICATE", cert_der));
        if let Some(chain) = chain_path {
            ca_pem.push_str(&read(&chain)?);
        }
        Ok(Self {
            issuer: Arc::new(issuer),
            ca_pem,
            key_id,
            config: config.clone(),
        })
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn config(&self) -> &LocalCaConfig {
        &self.config
    }

    /// The time limit of one signing through a PKCS#11 token; None when
    /// the key signs in this process's memory (a key file), in
    /// microseconds.
    pub fn token_time_limit(&self) -> Option<Duration> {
        match self.issuer.key() {
            CaKey::File(_) => None,
            #[cfg(feature = "pkcs11")]
            CaKey::Token(token) => Some(token.time_limit()),
        }
    }

    /// The default validity window for a certificate issued at `now`;
    /// `validity` is a certificate profile's, if it sets one.
    pub fn default_window(
        &self,
        now: OffsetDateTime,
        validity: Option<Duration>,
    ) -> (OffsetDateTime, OffsetDateTime) {
        (
            now - self.config.backdate,
            now + validity.unwrap_or(self.config.validity),
        )
    }

    pub async fn issue(&self, req: &IssueRequest<'_>) -> Result<Issued, SignerError> {
        let spki = SubjectPublicKeyInfo::from_der(req.spki_der).map_err(|e| {
            SignerError::BadCsr(format!("the CSR's public key cannot be used: {e}"))
        })?;
        let serial = ids::serial(crate::clock::unix_ms(req.now));
        let mut params = CertificateParams::default();
        params.not_before = req.not_before;
        params.not_after = req.not_after;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.key_identifier_method = KeyIdMethod::Sha256;
        params.key_usages = match req.key_usages {
            Some(usages) => usages
                .iter()
                .map(|u| match u {
                    KeyUsage::DigitalSignature => KeyUsagePurpose::DigitalSignature,
                    KeyUsage::KeyEncipherment => KeyUsagePurpose::KeyEncipherment,
                    KeyUsage::KeyAgreement => KeyUsagePurpose::KeyAgreement,
                    KeyUsage::ContentCommitment => KeyUsagePurpose::ContentCommitment,
                })
                .collect(),
            None if spki_is_rsa(req.spki_der) => vec![
                KeyUsagePurpose::DigitalSignature,
                // RSA key exchange in TLS 1.2 needs keyEncipherment.
                KeyUsagePurpose::KeyEncipherment,
            ],
            None => vec![KeyUsagePurpose::DigitalSignature],
        };
        params.extended_key_usages = req
            .extended_key_usages
            .iter()
            .map(|p| match p {
                ExtendedKeyUsage::ServerAuth => ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsage::ClientAuth => ExtendedKeyUsagePurpose::ClientAuth,
            })
            .collect();
        let mut dn = DistinguishedName::new();
        if let Some(first) = req
            .identifiers
            .iter()
            .find(|i| i.kind == IdentifierType::Dns)
        {
            // A CN is optional but some older TLS clients still look at it;
            // it must fit the 64-character upper bound (RFC 5280 App. A).
            if first.value.len() <= 64 {
                dn.push(DnType::CommonName, first.value.clone());
            }
        }
        params.distinguished_name = dn;
        for id in req.identifiers {
            let san = match id.kind {
                IdentifierType::Dns => SanType::DnsName(
                    id.value
                        .clone()
                        .try_into()
                        .map_err(|_| SignerError::BadCsr(format!("{:?} is not IA5", id.value)))?,
                ),
                IdentifierType::Ip => SanType::IpAddress(id.value.parse().map_err(|_| {
                    SignerError::BadCsr(format!("{:?} is not an IP address", id.value))
                })?),
            };
            params.subject_alt_names.push(san);
        }
        if let Some(url) = &self.config.crl_url {
            params.crl_distribution_points = vec![CrlDistributionPoint {
                uris: vec![url.clone()],
            }];
        }
        if let Some(url) = &self.config.issuer_url {
            params
                .custom_extensions
                .push(CustomExtension::from_oid_content(
                    OID_AIA,
                    aia_ca_issuers(url),
                ));
        }
        let cert = self
            .with_key(
                &format!("certificate {}", hex::encode(serial)),
                move |issuer| {
                    params
                        .signed_by(&spki, issuer)
                        .map_err(internal("signing the certificate"))
                },
            )
            .await?;
        let mut chain_pem = cert.pem();
        chain_pem.push_str(&self.ca_pem);
        Ok(Issued {
            chain_pem,
            serial: hex::encode(serial),
            not_before: req.not_before.unix_timestamp(),
            not_after: req.not_after.unix_timestamp(),
        })
    }

    /// Signs a CRL (RFC 5280 §5) listing `entries`.
    pub async fn sign_crl(
        &self,
        number: i64,
        this_update: OffsetDateTime,
        entries: &[RevokedEntry],
    ) -> Result<(Vec<u8>, OffsetDateTime), SignerError> {
        let next_update = this_update + self.config.crl_validity;
        let mut revoked_certs = Vec::with_capacity(entries.len());
        for e in entries {
            let serial = hex::decode(&e.serial).map_err(|_| {
                SignerError::Internal(format!("stored serial {:?} is not hex", e.serial))
            })?;
            revoked_certs.push(RevokedCertParams {
                serial_number: SerialNumber::from_slice(&serial),
                revocation_time: OffsetDateTime::from_unix_timestamp(e.revoked_at)
                    .map_err(|err| SignerError::Internal(err.to_string()))?,
                reason_code: e.reason.and_then(revocation_reason),
                invalidity_date: None,
            });
        }
        let params = CertificateRevocationListParams {
            this_update,
            next_update,
            crl_number: SerialNumber::from(number.max(0) as u64),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: self.key_id.clone(),
        };
        let der = self
            .with_key(&format!("CRL {number}"), move |issuer| {
                params
                    .signed_by(issuer)
                    .map(|crl| crl.der().to_vec())
                    .map_err(internal("signing the CRL"))
            })
            .await?;
        Ok((der, next_update))
    }

    /// Runs `sign`, an rcgen signing call with the CA key (`what` names
    /// what it signs, for the log). A key in memory signs inline, in
    /// microseconds: cheaper than a thread hop. A token's module may take
    /// long or never return, and rcgen calls it synchronously, so the
    /// whole call goes to the blocking pool, within the token's deadline
    /// ([`super::pkcs11::TokenKey::offload`]).
    #[cfg_attr(not(feature = "pkcs11"), allow(unused_variables))]
    async fn with_key<T, F>(&self, what: &str, sign: F) -> Result<T, SignerError>
    where
        T: Send + 'static,
        F: FnOnce(&Issuer<'static, CaKey>) -> Result<T, SignerError> + Send + 'static,
    {
        match self.issuer.key() {
            CaKey::File(_) => sign(&self.issuer),
            #[cfg(feature = "pkcs11")]
            CaKey::Token(token) => {
                let issuer = Arc::clone(&self.issuer);
                token
                    .offload(what, move || sign(&issuer))
                    .await
                    .map_err(SignerError::Internal)?
            }
        }
    }

    /// How long a CRL stays valid.
    pub fn crl_validity(&self) -> Duration {
        self.config.crl_validity
    }
}

/// RFC 5280 §5.3.1 reason codes as rcgen names them. Unspecified (0) is
/// omitted from the entry, as the RFC recommends.
fn revocation_reason(code: i64) -> Option<RevocationReason> {
    Some(match code {
        1 => RevocationReason::KeyCompromise,
        2 => RevocationReason::CaCompromise,
        3 => RevocationReason::AffiliationChanged,
        4 => RevocationReason::Superseded,
        5 => RevocationReason::CessationOfOperation,
        6 => RevocationReason::CertificateHold,
        8 => RevocationReason::RemoveFromCrl,
        9 => RevocationReason::PrivilegeWithdrawn,
        10 => RevocationReason::AaCompromise,
        _ => return None,
    })
}

/// The CA key in a PKCS#11 token, checked against the certificate.
#[cfg(feature = "pkcs11")]
fn token_key(
    config: &crate::config::Pkcs11Config,
    spki_der: &[u8],
    cert_path: &Path,
) -> Result<CaKey, SignerError> {
    super::pkcs11::TokenKey::open(config, spki_der)
        .map(CaKey::Token)
        .map_err(|e| SignerError::Internal(format!("the CA key of {}: {e}", cert_path.display())))
}

#[cfg(not(feature = "pkcs11"))]
fn token_key(_: &crate::config::Pkcs11Config, _: &[u8], _: &Path) -> Result<CaKey, SignerError> {
    Err(SignerError::Internal(
        "this build has no PKCS#11 support: rebuild with `cargo build --release --features pkcs11`, or use ca_key".into(),
    ))
}

fn generate(
    profile: &str,
    dir: &Path,
    cert_path: &Path,
    key_path: &Path,
    now: OffsetDateTime,
) -> Result<(), SignerError> {
    crate::private::create_dir(dir)
        .map_err(|e| SignerError::Internal(format!("creating {}: {e}", dir.display())))?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(internal("generating the CA key"))?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "acme-proxy");
    dn.push(DnType::CommonName, format!("acme-proxy CA ({profile})"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + Duration::from_secs(10 * 365 * 86400);
    params.serial_number = Some(SerialNumber::from_slice(&ids::serial(
        crate::clock::unix_ms(now),
    )));
    let cert = params
        .self_signed(&key)
        .map_err(internal("self-signing the CA"))?;
    // The key first, created 0600 and never world-readable even briefly;
    // the certificate is public, but everything in the data directory is
    // kept private alike. Whoever creates the key file generates the CA:
    // another process that got there first leaves this one to load theirs.
    match crate::private::write_new(key_path, key.serialize_pem().as_bytes()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => {
            return Err(SignerError::Internal(format!(
                "writing {}: {e}",
                key_path.display()
            )));
        }
    }
    // Then the certificate, whole or not at all: written aside and renamed
    // into place, as the sign for other processes that the CA is ready.
    let aside = cert_path.with_extension(format!("pem.{}.tmp", std::process::id()));
    crate::private::write(&aside, cert.pem().as_bytes())
        .and_then(|()| std::fs::rename(&aside, cert_path))
        .map_err(|e| SignerError::Internal(format!("writing {}: {e}", cert_path.display())))?;
    tracing::info!(
        event = "ca.generated",
        outcome = "success",
        profile,
        cert = %cert_path.display(),
        "generated a new CA for the profile"
    );
    Ok(())
}

/// How long a process waits for the certificate of a CA another process
/// is generating (it takes milliseconds).
const CA_GENERATION_WAIT: Duration = Duration::from_secs(10);

/// Returns once `cert` exists; an error if only `key` does for longer than
/// [`CA_GENERATION_WAIT`] (a process died between the two).
fn wait_for_certificate(cert: &Path, key: &Path) -> Result<(), SignerError> {
    let deadline = std::time::Instant::now() + CA_GENERATION_WAIT;
    while !cert.exists() {
        if std::time::Instant::now() >= deadline {
            return Err(SignerError::Internal(format!(
                "{} exists but {} does not: a CA generation was interrupted; remove the key file to generate a new CA",
                key.display(),
                cert.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn spki_is_rsa(spki_der: &[u8]) -> bool {
    x509_parser::x509::SubjectPublicKeyInfo::from_der(spki_der)
        .map(|(_, spki)| {
            spki.algorithm.algorithm == x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION
        })
        .unwrap_or(false)
}

/// id-pe-authorityInfoAccess (RFC 5280 §4.2.2.1).
const OID_AIA: &[u64] = &[1, 3, 6, 1, 5, 5, 7, 1, 1];

/// DER of `AuthorityInfoAccessSyntax` with one caIssuers URI.
fn aia_ca_issuers(url: &str) -> Vec<u8> {
    // id-ad-caIssuers 1.3.6.1.5.5.7.48.2
    let oid: &[u8] = &[0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x02];
    let uri = der_tlv(0x86, url.as_bytes()); // [6] IMPLICIT IA5String
    let access = der_tlv(0x30, &[oid, &uri].concat());
    der_tlv(0x30, &access)
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// The embedded CA: a key in memory signs inside the request; a token's
/// key takes its time. It honours a requested window within its validity
/// and backdate, spreads renewal over its `renewal_window`, and signs the
/// CRL from the revocations the authority recorded.
impl super::SignerBackend for LocalCa {
    fn issuance(&self) -> super::Issuance<'_> {
        match self.token_time_limit() {
            None => super::Issuance::Inline,
            Some(within) => super::Issuance::Guarded { within },
        }
    }

    fn issue<'a>(
        &'a self,
        req: &'a IssueRequest<'a>,
        _ctx: &'a super::IssueContext<'a>,
    ) -> super::BoxFuture<'a, Result<Issued, SignerError>> {
        // A key in memory signs inline; a token's key on the blocking
        // pool, within its deadline (`LocalCa::with_key`).
        Box::pin(LocalCa::issue(self, req))
    }

    fn ca_pem(&self) -> &str {
        LocalCa::ca_pem(self)
    }

    fn default_window(
        &self,
        now: OffsetDateTime,
        validity: Option<Duration>,
    ) -> (OffsetDateTime, OffsetDateTime) {
        LocalCa::default_window(self, now, validity)
    }

    fn requested_window(&self) -> super::RequestedWindow {
        super::RequestedWindow::Honoured {
            validity: self.config.validity,
            backdate: self.config.backdate,
        }
    }

    fn renewal_fractions(&self) -> Option<[f64; 2]> {
        Some(self.config.renewal_window)
    }

    fn crl(&self) -> super::Crl {
        super::Crl::Signed {
            validity: self.crl_validity(),
        }
    }

    fn sign_crl<'a>(
        &'a self,
        number: i64,
        this_update: OffsetDateTime,
        entries: &'a [RevokedEntry],
    ) -> super::BoxFuture<'a, Result<(Vec<u8>, OffsetDateTime), SignerError>> {
        Box::pin(LocalCa::sign_crl(self, number, this_update, entries))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn processes_generating_one_profiles_ca_at_once_all_load_the_same_one() {
        let dir = tempfile::tempdir().unwrap();
        let config = LocalCaConfig::default();
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let barrier = std::sync::Barrier::new(6);
        let loaded: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        LocalCa::load_or_create("p", &config, dir.path(), now).map(|ca| ca.ca_pem)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        assert!(loaded.windows(2).all(|w| w[0] == w[1]), "one CA for all");
        let files: Vec<_> = std::fs::read_dir(dir.path().join("ca").join("p"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            files.len(),
            2,
            "the key and the certificate only: {files:?}"
        );
    }
}
