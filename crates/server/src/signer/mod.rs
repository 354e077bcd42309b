//! Signer backends: what turns a checked CSR into a certificate chain.
//!
//! There are three: `local_ca` (the embedded CA), `relay` (an
//! upstream ACME CA, through a job) and `custom` (the operator's program).
//! The authority only sees [`Signer`], so adding a backend adds
//! a variant here and nothing in the authority's state machine.
//!
//! Architecture Invariant: signers never change order status; they return a
//! result and the authority records it.

pub mod custom;
pub mod extensions;
pub mod local_ca;
#[cfg(feature = "pkcs11")]
pub mod pkcs11;
pub mod relay;

use acme_proxy_protocol::types::Identifier;
use time::OffsetDateTime;

pub use custom::{Custom, IssueContext};
pub use local_ca::LocalCa;
pub use relay::Relay;

/// What a signer is asked to sign. The authority has already checked the
/// CSR's signature, key strength and names against the order, and its
/// subject and extensions against [`extensions`].
#[derive(Debug)]
pub struct IssueRequest<'a> {
    /// When the certificate is asked for (the serial number starts with it).
    pub now: OffsetDateTime,
    pub identifiers: &'a [Identifier],
    /// The subject public key of the CSR, DER SubjectPublicKeyInfo.
    pub spki_der: &'a [u8],
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    /// The certificate profile's keyUsage bits; none: the signer's default.
    pub key_usages: Option<&'a [crate::config::KeyUsage]>,
    /// The extKeyUsage purposes the certificate carries, exactly
    /// ([`crate::config::ExtendedKeyUsage::granted`]).
    pub extended_key_usages: &'a [crate::config::ExtendedKeyUsage],
}

/// Renewal windows (RFC 9773) asked of an outside party — the upstream CA,
/// the operator's program — kept for a while and asked at most a few at a
/// time: renewalInfo is unauthenticated and certificate ids are public, so
/// anyone could otherwise make us run a program or call the upstream per
/// request. Saturated, the caller answers the default window.
#[derive(Debug)]
pub struct WindowCache {
    entries: std::sync::Mutex<std::collections::HashMap<String, Remembered>>,
    asking: tokio::sync::Semaphore,
}

/// A window (or the lack of one) and when it was asked.
type Remembered = (std::time::Instant, Option<(i64, i64)>);

/// How long an outside party's window is reused.
const WINDOW_TTL: std::time::Duration = std::time::Duration::from_secs(600);
/// Windows remembered at most (then forgotten all at once).
const WINDOW_CAP: usize = 10_000;

impl Default for WindowCache {
    fn default() -> Self {
        Self {
            entries: std::sync::Mutex::new(std::collections::HashMap::new()),
            asking: tokio::sync::Semaphore::new(4),
        }
    }
}

impl WindowCache {
    /// The window of `serial`: remembered, or from `ask` when a slot is
    /// free; `Ok(None)` when there is none or no slot.
    pub async fn get<F, E>(&self, serial: &str, ask: F) -> Result<Option<(i64, i64)>, E>
    where
        F: std::future::Future<Output = Result<Option<(i64, i64)>, E>>,
    {
        if let Ok(entries) = self.entries.lock()
            && let Some((at, w)) = entries.get(serial)
            && at.elapsed() < WINDOW_TTL
        {
            return Ok(*w);
        }
        let Ok(_slot) = self.asking.try_acquire() else {
            return Ok(None);
        };
        let w = ask.await?;
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= WINDOW_CAP {
                entries.clear();
            }
            entries.insert(serial.to_owned(), (std::time::Instant::now(), w));
        }
        Ok(w)
    }
}

/// A certificate as issued.
#[derive(Debug, Clone)]
pub struct Issued {
    /// Leaf first, then the issuers (RFC 8555 §7.4.2).
    pub chain_pem: String,
    /// Lowercase hex.
    pub serial: String,
    pub not_before: i64,
    pub not_after: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    /// The CSR cannot be signed as it is; the client may send another.
    #[error("{0}")]
    BadCsr(String),
    /// Nothing was signed (e.g. our own setup failed): logged, never shown
    /// to the client; the order can be finalized again.
    #[error("signer failure: {0}")]
    Internal(String),
    /// An outside signer failed or returned something unusable: it may
    /// have done something (signed, half-signed), so the order is not
    /// offered for another finalize — it becomes invalid with a generic
    /// problem, and this is logged.
    #[error("signer failure: {0}")]
    Failed(String),
}

/// The signer of one profile.
#[derive(Debug)]
pub enum Signer {
    LocalCa(LocalCa),
    /// Issues through a durable job, not inside the request: the authority
    /// takes the relay path at finalize. Boxed: it is the largest variant
    /// by far.
    Relay(Box<Relay>),
    Custom(Custom),
}

impl Signer {
    pub async fn issue(
        &self,
        req: &IssueRequest<'_>,
        ctx: &IssueContext<'_>,
    ) -> Result<Issued, SignerError> {
        match self {
            // A key in memory signs inline; a token's key on the blocking
            // pool, within its deadline (`LocalCa::with_key`).
            Self::LocalCa(ca) => ca.issue(req).await,
            Self::Custom(c) => c.issue(req, ctx).await,
            Self::Relay(_) => Err(SignerError::Internal(
                "a relay issues through its job, not inline".into(),
            )),
        }
    }

    /// PEM of the CA certificate clients should trust (and what is above it).
    /// Empty for a relay: the upstream's chain comes with each certificate.
    pub fn ca_pem(&self) -> &str {
        match self {
            Self::LocalCa(ca) => ca.ca_pem(),
            Self::Custom(c) => c.ca_pem(),
            Self::Relay(_) => "",
        }
    }

    pub fn custom(&self) -> Option<&Custom> {
        match self {
            Self::Custom(c) => Some(c),
            _ => None,
        }
    }

    pub fn local_ca(&self) -> Option<&LocalCa> {
        match self {
            Self::LocalCa(ca) => Some(ca),
            _ => None,
        }
    }

    pub fn relay(&self) -> Option<&Relay> {
        match self {
            Self::Relay(r) => Some(r.as_ref()),
            _ => None,
        }
    }
}
