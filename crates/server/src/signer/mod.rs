//! Signer backends: what turns a checked CSR into a certificate chain.
//!
//! There are three built in: `local_ca` (the embedded CA), `relay` (an
//! upstream ACME CA, through a job) and `custom` (the operator's program);
//! a library user may plug in more (`server::start_with`). The authority
//! only sees [`SignerBackend`] and asks it questions, never its kind, so
//! adding a backend adds an implementation and nothing in the authority's
//! state machine.
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

/// The signer of one profile, as the authority holds it.
pub type Signer = std::sync::Arc<dyn SignerBackend>;

/// A signer's future: boxed, so that [`SignerBackend`] stays object-safe.
pub type BoxFuture<'a, T> = crate::jobs::BoxFuture<'a, T>;

/// An outside party's renewal window being asked (Unix seconds; None:
/// it has none), or why it could not be had.
pub type AskedWindow<'a> = BoxFuture<'a, Result<Option<(i64, i64)>, String>>;

/// How a signer issues, asked once at finalize (RFC 8555 §7.4): it decides
/// the order's path through processing.
#[derive(Clone, Copy)]
pub enum Issuance<'a> {
    /// Signs inside the request in microseconds (a key in memory): the
    /// order goes ready → valid in the one transaction that stores the
    /// certificate, and is never processing.
    Inline,
    /// Signs inside the request but takes its time and may keep a record
    /// of what it signed (a token, an outside program): the order is
    /// processing before it is asked, and exactly one request asks.
    Guarded {
        /// The signer's time limit: a signing not done by then has
        /// failed, so an order processing much longer than this was being
        /// signed by a process that is gone.
        within: std::time::Duration,
    },
    /// Issues through a durable job, not inside the request (the relay).
    Deferred(&'a dyn Deferred),
}

impl std::fmt::Debug for Issuance<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Inline => "Inline",
            Self::Guarded { .. } => "Guarded",
            Self::Deferred(_) => "Deferred",
        })
    }
}

impl<'a> Issuance<'a> {
    /// The durable-job capability, when it issues through one.
    pub fn deferred(self) -> Option<&'a dyn Deferred> {
        match self {
            Self::Deferred(d) => Some(d),
            Self::Inline | Self::Guarded { .. } => None,
        }
    }
}

/// Whether and how a signer publishes a CRL (RFC 5280 §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crl {
    /// None here (a relay's upstream publishes its own).
    None,
    /// The authority signs one through [`SignerBackend::sign_crl`] from the
    /// revocations it recorded, valid this long.
    Signed { validity: std::time::Duration },
    /// The signer serves its own ([`SignerBackend::served_crl`]).
    Served,
}

/// What a signer does with a requested `notBefore`/`notAfter` (RFC 8555
/// §7.4): honour them within these bounds, or refuse them with a reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestedWindow {
    /// Honoured: a certificate lives `validity` unless a certificate
    /// profile says otherwise, and starts at most `backdate` in the past.
    Honoured {
        validity: std::time::Duration,
        backdate: std::time::Duration,
    },
    /// Refused, with the client's `malformed` detail.
    Refused(&'static str),
}

/// A certificate this profile issued, as a signer is asked about it.
#[derive(Debug)]
pub struct IssuedCertificate<'a> {
    /// Lowercase hex.
    pub serial: &'a str,
    /// The upstream that issued it, for a relay of several (None: its
    /// preferred one, or a signer that has no upstreams).
    pub upstream: Option<&'a str>,
    pub chain_pem: &'a str,
    /// The leaf's DER, when the chain parses.
    pub leaf_der: Option<&'a [u8]>,
}

/// A revocation the signer did not carry out (RFC 8555 §7.6).
#[derive(Debug)]
pub struct RevokeFailure {
    /// The log line's message: who did not revoke.
    pub message: &'static str,
    /// For the operator's log.
    pub error: String,
    /// The problem the client is told, when the signer's refusal concerns
    /// the request; otherwise `serverInternal`.
    pub problem: Option<(acme_proxy_protocol::ProblemType, String)>,
}

/// A signer backend: what turns a checked CSR into a certificate chain,
/// and what the authority asks of it. The authority never asks which kind
/// it is, only these questions; every answer but [`Self::issue`] and
/// [`Self::ca_pem`] has the default of a signer that signs inside the
/// request and has nothing more to say.
pub trait SignerBackend: std::fmt::Debug + Send + Sync {
    /// How it issues (asked once per finalize).
    fn issuance(&self) -> Issuance<'_>;

    /// Signs a request (asked only when [`Self::issuance`] is not
    /// deferred).
    fn issue<'a>(
        &'a self,
        req: &'a IssueRequest<'a>,
        ctx: &'a IssueContext<'a>,
    ) -> BoxFuture<'a, Result<Issued, SignerError>>;

    /// PEM of the CA certificate clients should trust (and what is above
    /// it); empty when each certificate comes with its own chain.
    fn ca_pem(&self) -> &str;

    /// The validity window of a certificate issued at `now` whose order
    /// asked for none; `validity` is its certificate profile's, if set.
    fn default_window(
        &self,
        now: OffsetDateTime,
        validity: Option<std::time::Duration>,
    ) -> (OffsetDateTime, OffsetDateTime) {
        (now, now + validity.unwrap_or(DEFAULT_VALIDITY))
    }

    /// What it does with a `notBefore`/`notAfter` in newOrder. By default
    /// it is told the window and may still refuse it (badCSR).
    fn requested_window(&self) -> RequestedWindow {
        RequestedWindow::Honoured {
            validity: DEFAULT_VALIDITY,
            backdate: std::time::Duration::ZERO,
        }
    }

    /// Why a wildcard identifier (RFC 8555 §7.1.3) is refused in newOrder,
    /// when this signer cannot issue one; None: accepted as the profile's
    /// challenges allow.
    fn refuses_wildcards(&self) -> Option<&'static str> {
        None
    }

    /// The zone of ours its dns-01 answers are published in, the
    /// `_acme-challenge` names being delegated there by CNAME (a relay
    /// with strategy `dns01_delegated`); None: no such delegation.
    fn delegated_dns01_zone(&self) -> Option<&str> {
        None
    }

    /// Whether a certificate profile (draft-ietf-acme-profiles) is
    /// offered where it issues; None: it has no say, or cannot tell now.
    /// With `ask` false it answers only from what it knows already (its
    /// upstream is known to be down: asking would only wait).
    fn offers_profile<'a>(&'a self, _name: &'a str, _ask: bool) -> BoxFuture<'a, Option<bool>> {
        Box::pin(std::future::ready(None))
    }

    /// An outside party's renewal window (RFC 9773 §4.2) for `cert`, as
    /// Unix seconds; None when the signer asks no one (the authority
    /// spreads [`Self::renewal_fractions`] of the lifetime).
    fn renewal_window<'a>(&'a self, _cert: &'a IssuedCertificate<'a>) -> Option<AskedWindow<'a>> {
        None
    }

    /// The renewal window as fractions of a certificate's lifetime; None:
    /// the authority's default.
    fn renewal_fractions(&self) -> Option<[f64; 2]> {
        None
    }

    /// Revokes where the certificate was issued, before the authority
    /// records it (RFC 8555 §7.6); by default there is nothing to tell.
    fn revoke<'a>(
        &'a self,
        _cert: &'a IssuedCertificate<'a>,
        _reason: u64,
    ) -> BoxFuture<'a, Result<(), RevokeFailure>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether and how it publishes a CRL.
    fn crl(&self) -> Crl {
        Crl::None
    }

    /// Signs a CRL (RFC 5280 §5) listing `entries` (asked when
    /// [`Self::crl`] is [`Crl::Signed`]); returns it and its nextUpdate.
    fn sign_crl<'a>(
        &'a self,
        _number: i64,
        _this_update: OffsetDateTime,
        _entries: &'a [acme_proxy_store::RevokedEntry],
    ) -> BoxFuture<'a, Result<(Vec<u8>, OffsetDateTime), SignerError>> {
        Box::pin(std::future::ready(Err(SignerError::Internal(
            "this signer signs no CRL".into(),
        ))))
    }

    /// The CRL it serves (asked when [`Self::crl`] is [`Crl::Served`]).
    fn served_crl(&self) -> BoxFuture<'_, Result<Option<Vec<u8>>, SignerError>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// The key authorization it publishes under `token` for an upstream
    /// CA's http-01 fetch (RFC 8555 §8.3), if any.
    fn key_authorization(&self, _token: &str) -> Option<String> {
        None
    }
}

/// The validity a signer that decides in the end (an outside program, a
/// plugged-in backend) is asked for when neither the order nor its
/// certificate profile says.
pub const DEFAULT_VALIDITY: std::time::Duration = std::time::Duration::from_secs(90 * 86400);

/// A signer that issues through a durable job (the relay) at one of its
/// upstreams, as the authority's relay path drives it (`authority::relay`).
pub trait Deferred: Send + Sync {
    /// Attempts before the job is abandoned, whichever upstream.
    fn max_attempts(&self) -> u32;
    /// Its upstreams in priority order: a new order goes to the first
    /// that takes it.
    fn upstreams(&self) -> Vec<&dyn Upstream>;
    /// How long an order's upstream may be down before the order moves
    /// (only before its finalize was sent); None: it never moves.
    fn failover_after(&self) -> Option<std::time::Duration>;
    /// Whether an upstream's refusal `e` is one another upstream may not
    /// share (the profile's `failover_on`): the order goes to the next.
    fn fails_over_on(&self, e: &relay::RelayError) -> bool;
    /// The upstream named `name` (None: the preferred one, the first).
    fn upstream(&self, name: Option<&str>) -> Option<&dyn Upstream> {
        let all = self.upstreams();
        match name {
            None => all.first().copied(),
            Some(name) => all.into_iter().find(|u| u.name() == name),
        }
    }
}

/// One upstream CA of a [`Deferred`] signer.
pub trait Upstream: Send + Sync {
    /// Its name in the profile (`primary` unless the configuration names it).
    fn name(&self) -> &str;
    /// How long one upstream request may take.
    fn request_timeout(&self) -> std::time::Duration;
    /// How long one attempt may take.
    fn attempt_budget(&self) -> std::time::Duration;
    /// How many new upstream orders may be sent per period, if bounded.
    fn upstream_orders(&self) -> Option<crate::config::Rate>;
    /// How many new upstream orders may name one registered domain per
    /// period, if bounded.
    fn upstream_certificates_per_domain(&self) -> Option<crate::config::Rate>;
    /// How many upstream validations of one identifier may fail per
    /// period before new orders for it wait, if bounded.
    fn upstream_failed_validations(&self) -> Option<crate::config::Rate>;
    /// How many upstream authorizations the profile's relays in flight
    /// may hold at once, if bounded.
    fn upstream_pending_authorizations(&self) -> Option<u32>;
    /// The upstream's directory URL: what names it (its breaker's key).
    fn directory(&self) -> &str;
    /// Failures in a row that open the upstream's breaker, and how long
    /// it then stays open before a probe.
    fn breaker(&self) -> (u32, std::time::Duration);
    /// Whether it offers the certificate profile `name` (its own name for
    /// it), from the directory it read before; None: not read yet.
    fn offers_profile<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<bool>>;
    /// One request asking whether the upstream is up (a GET of its
    /// directory): Ok when it answered as an ACME CA.
    fn probe(&self) -> BoxFuture<'_, Result<(), relay::RelayError>>;
    /// Places the upstream order; returns its URL.
    fn create_order<'a>(
        &'a self,
        identifiers: &'a [Identifier],
        certificate_profile: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, relay::RelayError>>;
    /// One attempt, from the upstream order at `url` to the chain.
    /// `before_finalize` runs when the upstream finalize is about to be
    /// sent; it is sent only if that returns Ok.
    fn attempt<'a>(
        &'a self,
        url: &'a str,
        csr_der: &'a [u8],
        deadline: tokio::time::Instant,
        before_finalize: BeforeFinalize<'a>,
    ) -> BoxFuture<'a, Result<relay::Collected, relay::RelayError>>;
}

/// What an attempt runs before it sends the upstream finalize (the
/// authority records that it is sent: the order never moves after that).
pub type BeforeFinalize<'a> =
    &'a (dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync);

/// Whether a profile with `signer` publishes a CRL, by its configuration:
/// the embedded CA signs one (RFC 5280 §5); a custom signer serves its
/// program's only when it declares a `crl` operation; a relay publishes
/// none (its upstream CA does). The built signer answers the same
/// ([`SignerBackend::crl`]).
pub fn publishes_crl(signer: &crate::config::SignerConfig) -> bool {
    use crate::config::SignerConfig;
    match signer {
        SignerConfig::LocalCa(_) => true,
        SignerConfig::Custom(custom) => custom.crl.is_some(),
        SignerConfig::Relay(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_embedded_ca_and_a_custom_signer_with_a_crl_program_have_their_crl_refreshed() {
        let config = crate::config::Config::from_toml(
            "[profiles.ca]\n\
             [profiles.edge.signer]\ntype = \"relay\"\ndirectory = \"https://ca.test/dir\"\n\
             [profiles.plain.signer]\ntype = \"custom\"\ncommand = \"/bin/true\"\n\
             [profiles.listed.signer]\ntype = \"custom\"\ncommand = \"/bin/true\"\n\
             [profiles.listed.signer.crl]\ncommand = \"/bin/true\"\n",
        )
        .unwrap();
        let refreshed = |name: &str| publishes_crl(&config.profiles[name].signer);
        assert!(refreshed("ca"));
        assert!(!refreshed("edge"), "a relay publishes no CRL");
        assert!(!refreshed("plain"), "a custom signer without a crl program");
        assert!(refreshed("listed"));
    }
}
