//! The relay signer: certificates obtained from an upstream ACME CA with
//! one upstream account per profile, through a durable job (the steps are
//! drawn in docs/design.md, "The relay").
//!
//! This module is the upstream *client* side: the account, one attempt of
//! the relay (re-read the upstream order, answer its challenges with the
//! profile's strategy, finalize with the client's CSR byte for byte, collect
//! the chain), revocation, registration. The job that drives attempts and
//! settles or abandons the local order is the authority's
//! (`authority/relay.rs`): signers never change order status.
//!
//! Every attempt starts from the top and re-reads everything: RFC 8555
//! lets an order be re-read at any time, so "start again" and "carry on"
//! are the same code and nothing is checkpointed.

pub mod board;
pub mod classify;
pub mod http;
pub mod publish;
pub mod rfc2136;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use acme_proxy_protocol::types::{Identifier, IdentifierType};
use instant_acme::{
    Account, AuthorizationHandle, AuthorizationStatus, ChallengeStatus, ChallengeType, NewAccount,
    NewOrder, Order, OrderStatus, RetryPolicy,
};
use tokio::time::Instant;

pub use board::ChallengeBoard;
pub use classify::{Class, RelayError, classify};

use crate::config::{RelayConfig, RelayStrategy};
use board::Published;
use http::UpstreamHttp;
use publish::Publisher;

/// One upstream of a relay profile: its account, its client, how it
/// answers challenges.
pub struct Relay {
    pub profile: String,
    pub config: RelayConfig,
    key_path: PathBuf,
    account_url: String,
    http: UpstreamHttp,
    /// Built on first use: the directory is fetched lazily, so the server
    /// starts and serves while the upstream is unreachable.
    account: tokio::sync::Mutex<Option<Account>>,
    /// The upstream's renewal windows, cached (RFC 9773 renewalInfo is public).
    windows: crate::signer::WindowCache,
    dns: Option<Arc<Publisher>>,
    board: Arc<ChallengeBoard>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("profile", &self.profile)
            .field("upstream", &self.config.name)
            .field("directory", &self.config.directory)
            .field("strategy", &self.config.strategy)
            .field("account_url", &self.account_url)
            .finish_non_exhaustive()
    }
}

/// An upstream authorization this attempt answered.
#[derive(Debug)]
struct Answered {
    /// The challenge it answered.
    kind: ChallengeType,
    /// Whether the upstream heard our trigger; false: it is sent again
    /// while waiting.
    triggered: bool,
    /// The upstream's refusal of our trigger. A CA whose validation fails
    /// before it answers the trigger answers it with the challenge's
    /// error (RFC 8555 §7.5.1): so the refusal stands only if the
    /// authorization, read again while waiting, is still pending.
    refused: Option<RelayError>,
}

/// What a successful attempt collected.
#[derive(Debug, Clone)]
pub struct Collected {
    /// Leaf first, as the upstream served it.
    pub chain_pem: String,
    pub certificate_url: String,
}

impl Relay {
    /// `profile`'s upstream `config` whose account is `account` (from the
    /// database; registration is an operator's act, never start-up's)
    /// with the key at `key_path`, reaching the upstream through `http`
    /// ([`UpstreamHttp::new`]).
    pub fn new(
        profile: &str,
        config: &RelayConfig,
        http: UpstreamHttp,
        key_path: PathBuf,
        account: &acme_proxy_store::UpstreamAccountRow,
        board: Arc<ChallengeBoard>,
        dns: Option<Publisher>,
    ) -> Result<Self, String> {
        let key_thumbprint = account.key_thumbprint.as_str();
        let upstream = &config.name;
        if !key_path.exists() {
            return Err(format!(
                "the upstream account key {} is missing; run `acme-proxy upstream register --profile {profile} --upstream {upstream}` (or restore the file)",
                key_path.display()
            ));
        }
        // A wrong key would make every upstream request a 4xx, which is
        // permanent: every relay in flight would be abandoned. Refuse now.
        let found = key_thumbprint_of(&read_key(&key_path)?)?;
        if found != key_thumbprint {
            return Err(format!(
                "the upstream account key {} is not the key registered for profile {profile} at its upstream {upstream} (thumbprint {found}, registered {key_thumbprint}); restore the right file or run `acme-proxy upstream register --profile {profile} --upstream {upstream}` again",
                key_path.display()
            ));
        }
        let dns = dns.map(Arc::new);
        Ok(Self {
            profile: profile.to_owned(),
            config: config.clone(),
            key_path,
            account_url: account.account_url.clone(),
            http,
            account: tokio::sync::Mutex::new(None),
            windows: crate::signer::WindowCache::default(),
            dns,
            board,
        })
    }

    /// The key authorization published under `token` for the upstream's
    /// http-01 fetch (RFC 8555 §8.3), if any attempt published it.
    pub fn key_authorization(&self, token: &str) -> Option<String> {
        self.board.get(token)
    }

    /// The upstream account, restored from the key file and the recorded
    /// URL; fetching the directory is the first upstream request.
    pub async fn account(&self) -> Result<Account, RelayError> {
        if let Some(a) = self.account.lock().await.as_ref() {
            return Ok(a.clone());
        }
        // Built without holding the lock: while the upstream hangs, every
        // caller pays its own request timeout, not the sum of the queue's.
        let key = read_key(&self.key_path).map_err(RelayError::permanent)?;
        let account = Account::builder_with_http(Box::new(self.http.clone()))
            .from_parts(self.account_url.clone(), key, self.config.directory.clone())
            .await
            .map_err(|e| classify(&e).context("fetching the upstream directory"))?;
        *self.account.lock().await = Some(account.clone());
        Ok(account)
    }

    /// Places the upstream order for the same identifiers (one request).
    ///
    /// `notBefore`/`notAfter` are not forwarded: instant-acme 0.8's
    /// `NewOrder` has no such fields, and Let's Encrypt refuses them anyway.
    ///
    /// The order's certificate profile is forwarded, under the upstream's
    /// name for it (`upstream_profiles`), when the upstream's directory
    /// advertises one of that name (draft-ietf-acme-profiles); otherwise
    /// the upstream's default applies.
    pub async fn create_order(
        &self,
        identifiers: &[Identifier],
        certificate_profile: Option<&str>,
    ) -> Result<String, RelayError> {
        let account = self.account().await?;
        let ids = identifiers
            .iter()
            .map(upstream_identifier)
            .collect::<Result<Vec<_>, _>>()?;
        let mut new_order = NewOrder::new(&ids);
        if let Some(name) = certificate_profile.map(|local| self.config.upstream_profile(local))
            && account.profiles().any(|p| p.name == name)
        {
            new_order = new_order.profile(name);
        }
        let order = account
            .new_order(&new_order)
            .await
            .map_err(|e| classify(&e).context("creating the upstream order"))?;
        Ok(order.url().to_owned())
    }

    /// Whether the upstream's directory advertises the certificate profile
    /// `name` (draft-ietf-acme-profiles); None when the upstream cannot be
    /// reached within one request timeout (the directory is fetched once),
    /// or, with `ask` false, has not been fetched yet.
    pub async fn offers_profile(&self, name: &str, ask: bool) -> Option<bool> {
        let name = self.config.upstream_profile(name);
        if !ask {
            let known = self.account.lock().await.clone()?;
            return Some(known.profiles().any(|p| p.name == name));
        }
        let account = tokio::time::timeout(self.config.request_timeout, self.account())
            .await
            .ok()?
            .ok()?;
        Some(account.profiles().any(|p| p.name == name))
    }

    /// Asks whether the upstream is up, for its circuit breaker: a GET of
    /// the directory (RFC 8555 §7.1.1), fresh (not the account's copy),
    /// then a HEAD of its newNonce (§7.2), which a cache in front of the
    /// CA cannot answer for it. Up only when both answer as ACME does (an
    /// error is `unreachable` otherwise); a 429 or `Retry-After` is an
    /// upstream at work asking for a pause. Each request is bounded by
    /// `request_timeout`.
    pub async fn probe(&self) -> Result<(), RelayError> {
        const DOING: &str = "probing the upstream";
        let (parts, body) = self
            .probe_request(::http::Method::GET, &self.config.directory)
            .await?;
        let down = |what: String| RelayError::down(format!("{DOING}: {what}"));
        if !parts.status.is_success() {
            return Err(down(format!("the directory answered {}", parts.status)));
        }
        let directory: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| down(format!("the directory is not JSON: {e}")))?;
        let Some(new_nonce) = directory
            .get("newNonce")
            .and_then(serde_json::Value::as_str)
        else {
            return Err(down("the directory names no newNonce".into()));
        };
        let (parts, _) = self.probe_request(::http::Method::HEAD, new_nonce).await?;
        if !parts.status.is_success() || !parts.headers.contains_key("replay-nonce") {
            return Err(down(format!(
                "newNonce answered {} without a Replay-Nonce",
                parts.status
            )));
        }
        Ok(())
    }

    /// One request of the probe: the answer's head and body.
    async fn probe_request(
        &self,
        method: ::http::Method,
        url: &str,
    ) -> Result<(::http::response::Parts, bytes::Bytes), RelayError> {
        use instant_acme::{BodyWrapper, HttpClient};
        let request = ::http::Request::builder()
            .method(method)
            .uri(url)
            .header(
                ::http::header::USER_AGENT,
                concat!("acme-proxy/", env!("CARGO_PKG_VERSION")),
            )
            .body(BodyWrapper::default())
            .map_err(|e| RelayError::permanent(format!("the probe's URL {url}: {e}")))?;
        let mut response = self
            .http
            .request(request)
            .await
            .map_err(|e| classify(&e).context("probing the upstream"))?;
        let body =
            response.body.into_bytes().await.map_err(|e| {
                RelayError::down(format!("probing the upstream: reading {url}: {e}"))
            })?;
        Ok((response.parts, body))
    }

    /// The upstream's renewal window (RFC 9773) for the leaf `leaf_der` it
    /// issued, as Unix seconds; None when the upstream offers no renewal
    /// information. One request, bounded by `request_timeout`.
    pub async fn renewal_window(&self, leaf_der: &[u8]) -> Result<Option<(i64, i64)>, RelayError> {
        let key = hex::encode(ring::digest::digest(&ring::digest::SHA256, leaf_der));
        self.windows.get(&key, self.ask_window(leaf_der)).await
    }

    async fn ask_window(&self, leaf_der: &[u8]) -> Result<Option<(i64, i64)>, RelayError> {
        let account = self.account().await?;
        let cert = rustls::pki_types::CertificateDer::from(leaf_der.to_vec());
        let id = instant_acme::CertificateIdentifier::try_from(&cert)
            .map_err(|e| RelayError::permanent(format!("no certificate identifier: {e}")))?;
        match tokio::time::timeout(self.config.request_timeout, account.renewal_info(&id)).await {
            Err(_) => Err(RelayError::permanent(
                "the upstream's renewalInfo did not answer within request_timeout",
            )),
            Ok(Err(instant_acme::Error::Unsupported(_))) => Ok(None),
            Ok(Err(e)) => Err(classify(&e).context("reading the upstream's renewalInfo")),
            Ok(Ok((info, _))) => {
                let w = info.suggested_window;
                Ok(Some((w.start.unix_timestamp(), w.end.unix_timestamp())))
            }
        }
    }

    /// One attempt: from the upstream order at `url` to the chain, within
    /// `deadline`, running `before_finalize` before the finalize is sent.
    /// Records published for the upstream's challenges are retracted on
    /// every exit path.
    pub async fn attempt(
        &self,
        url: &str,
        csr_der: &[u8],
        deadline: Instant,
        before_finalize: super::BeforeFinalize<'_>,
    ) -> Result<Collected, RelayError> {
        let account = self.account().await?;
        let mut order = account
            .order(url.to_owned())
            .await
            .map_err(|e| classify(&e).context("reading the upstream order"))?;
        let mut cleanup = Cleanup {
            dns: self.dns.clone(),
            records: Vec::new(),
            published: Vec::new(),
        };
        let result = self
            .drive(&mut order, csr_der, deadline, before_finalize, &mut cleanup)
            .await;
        cleanup.finish().await;
        result
    }

    async fn drive(
        &self,
        order: &mut Order,
        csr_der: &[u8],
        deadline: Instant,
        before_finalize: super::BeforeFinalize<'_>,
        cleanup: &mut Cleanup,
    ) -> Result<Collected, RelayError> {
        let mut status = order.state().status;
        if status == OrderStatus::Invalid {
            return Err(order_invalid(order));
        }
        if status == OrderStatus::Pending {
            self.solve(order, deadline, cleanup).await?;
            status = order
                .poll_ready(&self.policy(deadline))
                .await
                .map_err(|e| polled(order, &e, "waiting for the upstream order to be ready"))?;
        }
        match status {
            OrderStatus::Invalid => return Err(order_invalid(order)),
            OrderStatus::Ready => {
                if order.state().finalize.is_empty() {
                    return Err(RelayError::permanent(
                        "the upstream order is ready but has no finalize URL",
                    ));
                }
                // Recorded before it is sent: the order must not move to
                // another upstream once this one may issue it.
                before_finalize().await.map_err(|e| {
                    RelayError::retryable(format!("recording the upstream finalize: {e}"))
                })?;
                // The client's CSR byte for byte: the key and names are theirs.
                if let Err(e) = order.finalize_csr(csr_der).await {
                    // The finalize may have happened although we did not
                    // hear (a lost answer, a second runner): the order then
                    // is processing or valid, and a second finalize would be
                    // refused as orderNotReady. Re-read before judging.
                    match order.refresh().await.map(|s| s.status) {
                        Ok(OrderStatus::Processing | OrderStatus::Valid) => {}
                        _ => return Err(polled(order, &e, "finalizing the upstream order")),
                    }
                }
            }
            _ => {}
        }
        let chain_pem = if order.state().status == OrderStatus::Valid {
            order
                .certificate()
                .await
                .map_err(|e| polled(order, &e, "downloading the certificate"))?
                .ok_or_else(|| RelayError::retryable("the upstream order is still processing"))?
        } else {
            order
                .poll_certificate(&self.policy(deadline))
                .await
                .map_err(|e| polled(order, &e, "waiting for the upstream certificate"))?
        };
        let certificate_url = order.state().certificate.clone().ok_or_else(|| {
            RelayError::permanent("the upstream order is valid but has no certificate URL")
        })?;
        Ok(Collected {
            chain_pem,
            certificate_url,
        })
    }

    /// Answers every pending upstream authorization with the profile's
    /// strategy and waits until each is terminal.
    async fn solve(
        &self,
        order: &mut Order,
        deadline: Instant,
        cleanup: &mut Cleanup,
    ) -> Result<(), RelayError> {
        // Publish everything first, then (after any propagation wait) tell
        // the upstream: a CA may check as soon as it hears. What was
        // answered is keyed by the authorization's URL (RFC 8555 §7.1.4),
        // not by its place in the list, which each read may order anew.
        let mut answered: HashMap<String, Answered> = HashMap::new();
        let mut auths = order.authorizations();
        while let Some(a) = auths.next().await {
            let mut a = a.map_err(|e| classify(&e).context("reading an upstream authorization"))?;
            match a.status {
                AuthorizationStatus::Valid => continue,
                AuthorizationStatus::Pending => {}
                other => {
                    let mut e = RelayError::permanent(format!(
                        "the upstream authorization for {} is {other:?}",
                        a.identifier()
                    ));
                    if other == AuthorizationStatus::Invalid {
                        e.failed_validation = Some(a.identifier().to_string());
                    }
                    return Err(e);
                }
            }
            let identifier = a.identifier().to_string();
            let url = a.url().to_owned();
            let offered: Vec<ChallengeType> =
                a.challenges.iter().map(|c| c.r#type.clone()).collect();
            let kind = pick_challenge(self.config.strategy, a.wildcard, &identifier, &offered)?;
            let Some(challenge) = a.challenge(kind.clone()) else {
                return Err(RelayError::permanent(format!(
                    "the upstream offers no {kind:?} challenge for {identifier}"
                )));
            };
            let key_authorization = challenge.key_authorization();
            match self.config.strategy {
                RelayStrategy::Http01 => cleanup.published.push(
                    self.board
                        .publish(&challenge.token, key_authorization.as_str()),
                ),
                RelayStrategy::Dns01 | RelayStrategy::Dns01Delegated => {
                    let dns = self.dns.as_ref().ok_or_else(|| {
                        RelayError::permanent("a dns-01 strategy with nowhere to publish")
                    })?;
                    let name = dns.record_name(&identifier);
                    let value = key_authorization.dns_value();
                    // Listed before the update is sent: an update applied
                    // whose answer was lost must still be removed (deleting
                    // an absent value does nothing).
                    cleanup.records.push((name.clone(), value.clone()));
                    dns.add_txt(&name, &value).await?;
                }
                RelayStrategy::Bypass => {}
            }
            answered.insert(
                url,
                Answered {
                    kind,
                    triggered: true,
                    refused: None,
                },
            );
        }
        if matches!(
            self.config.strategy,
            RelayStrategy::Dns01 | RelayStrategy::Dns01Delegated
        ) && !self.config.propagation_wait.is_zero()
        {
            tokio::time::sleep(self.config.propagation_wait).await;
        }
        let mut auths = order.authorizations();
        while let Some(a) = auths.next().await {
            let mut a = a.map_err(|e| classify(&e).context("reading an upstream authorization"))?;
            let Some(answer) = answered.get_mut(a.url()) else {
                continue;
            };
            // A challenge already processing (an earlier attempt told the
            // upstream before the process died) is only waited for.
            let triggered = match a.challenge(answer.kind.clone()) {
                Some(mut challenge) if challenge.status == ChallengeStatus::Pending => {
                    challenge.set_ready().await
                }
                _ => continue,
            };
            if let Err(e) = triggered {
                let e = classify(&e).context("answering the upstream challenge");
                if e.is_permanent() {
                    answer.refused = Some(e);
                    continue;
                }
                // The trigger may have reached the upstream although its
                // answer did not reach us: the wait below re-reads the
                // authorization and triggers a still-pending challenge
                // again. Retracting now could fail a validation in progress.
                tracing::debug!(event = "relay.trigger", outcome = "retry", error = %e, "will re-read the authorization");
                answer.triggered = false;
            }
        }
        // Wait until every authorization we answered is terminal. A blip
        // while polling is polled through: the records stay published
        // until the upstream has decided (or the budget runs out).
        loop {
            let mut waiting = false;
            let mut auths = order.authorizations();
            while let Some(a) = auths.next().await {
                let mut a =
                    a.map_err(|e| classify(&e).context("reading an upstream authorization"))?;
                if a.status != AuthorizationStatus::Pending {
                    continue;
                }
                if let Err(e) = a.refresh().await {
                    let e = classify(&e).context("polling an upstream authorization");
                    if e.is_permanent() {
                        return Err(e);
                    }
                    waiting = true;
                    continue;
                }
                if a.status == AuthorizationStatus::Pending {
                    if let Some(refused) = answered.get_mut(a.url()).and_then(|x| x.refused.take())
                    {
                        return Err(refused);
                    }
                    waiting = true;
                    // Our trigger did not get through: send it again.
                    if let Some(answer) = answered.get_mut(a.url()).filter(|x| !x.triggered) {
                        let triggered = match a.challenge(answer.kind.clone()) {
                            Some(mut challenge) if challenge.status == ChallengeStatus::Pending => {
                                Some(challenge.set_ready().await)
                            }
                            _ => None,
                        };
                        match triggered {
                            Some(Ok(())) => answer.triggered = true,
                            Some(Err(e)) => {
                                let e = classify(&e).context("answering the upstream challenge");
                                if e.is_permanent() {
                                    answer.triggered = true;
                                    answer.refused = Some(e);
                                }
                            }
                            None => {}
                        }
                    }
                    continue;
                }
                match a.status {
                    AuthorizationStatus::Pending => waiting = true,
                    AuthorizationStatus::Valid => {}
                    other => return Err(authorization_turned(&a, other)),
                }
            }
            if !waiting {
                return Ok(());
            }
            if Instant::now() + self.config.poll_interval >= deadline {
                return Err(RelayError::retryable(
                    "an upstream authorization did not settle within the attempt's budget",
                ));
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    fn policy(&self, deadline: Instant) -> RetryPolicy {
        RetryPolicy::new()
            .initial_delay(self.config.poll_interval)
            .backoff(1.0)
            .timeout(deadline.saturating_duration_since(Instant::now()))
    }

    /// Revokes a relayed certificate upstream (RFC 8555 §7.6); a
    /// certificate the upstream already revoked counts as done.
    pub async fn revoke(&self, cert_der: &[u8], reason: u64) -> Result<(), RelayError> {
        use instant_acme::{RevocationReason as R, RevocationRequest};
        let account = self.account().await?;
        let reason = match reason {
            1 => R::KeyCompromise,
            3 => R::AffiliationChanged,
            4 => R::Superseded,
            5 => R::CessationOfOperation,
            _ => R::Unspecified,
        };
        let der = rustls::pki_types::CertificateDer::from(cert_der.to_vec());
        match account
            .revoke(&RevocationRequest {
                certificate: &der,
                reason: Some(reason),
            })
            .await
        {
            Ok(()) => Ok(()),
            Err(instant_acme::Error::Api(p))
                if p.r#type.as_deref() == Some("urn:ietf:params:acme:error:alreadyRevoked") =>
            {
                Ok(())
            }
            Err(e) => Err(classify(&e).context("revoking upstream")),
        }
    }
}

/// What an attempt published and must retract. `finish` retracts in
/// order; if the attempt is cancelled before that (budget, shutdown,
/// operator), `Drop` retracts in a spawned task.
struct Cleanup {
    dns: Option<Arc<Publisher>>,
    records: Vec<(String, String)>,
    published: Vec<Published>,
}

impl Cleanup {
    async fn finish(&mut self) {
        self.published.clear();
        if let Some(dns) = self.dns.clone() {
            // One at a time, so that if the attempt is cancelled midway,
            // `Drop` still sees what is left.
            while let Some((name, value)) = self.records.last().cloned() {
                retract(&dns, &name, &value).await;
                self.records.pop();
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let records = std::mem::take(&mut self.records);
        if records.is_empty() {
            return;
        }
        let (Some(dns), Ok(rt)) = (self.dns.clone(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        rt.spawn(async move {
            for (name, value) in records {
                retract(&dns, &name, &value).await;
            }
        });
    }
}

/// Deletes one published TXT value; best-effort and logged.
async fn retract(dns: &Publisher, name: &str, value: &str) {
    match dns.delete_txt(name, value).await {
        Ok(()) => {
            tracing::debug!(event = "relay.dns01.cleanup", outcome = "success", %name, "TXT record removed")
        }
        Err(e) => {
            tracing::warn!(event = "relay.dns01.cleanup", outcome = "failure", %name, error = %e, "could not remove the TXT record")
        }
    }
}

/// The challenge type a strategy answers for one authorization. No
/// strategy falls back to another type.
pub fn pick_challenge(
    strategy: RelayStrategy,
    wildcard: bool,
    identifier: &str,
    offered: &[ChallengeType],
) -> Result<ChallengeType, RelayError> {
    let want = match strategy {
        RelayStrategy::Bypass => {
            return offered.first().cloned().ok_or_else(|| {
                RelayError::permanent(format!(
                    "the upstream offers no challenge at all for {identifier}"
                ))
            });
        }
        RelayStrategy::Http01 if wildcard => {
            return Err(RelayError::permanent(format!(
                "{identifier} is a wildcard, which http-01 cannot prove (RFC 8555 §7.1.3); use strategy = \"dns01\""
            )));
        }
        RelayStrategy::Http01 => ChallengeType::Http01,
        RelayStrategy::Dns01 | RelayStrategy::Dns01Delegated => ChallengeType::Dns01,
    };
    if offered.contains(&want) {
        Ok(want)
    } else {
        Err(RelayError::permanent(format!(
            "the upstream offers no {want:?} challenge for {identifier} (offered: {offered:?})"
        )))
    }
}

/// The error of an upstream authorization that ended otherwise than valid
/// (RFC 8555 §7.1.6): the CA's reason from its challenge; an invalid one
/// is a failed validation of its identifier.
fn authorization_turned(a: &AuthorizationHandle<'_>, status: AuthorizationStatus) -> RelayError {
    let why = a
        .challenges
        .iter()
        .find_map(|c| c.error.as_ref())
        .map(|p| p.to_string())
        .unwrap_or_default();
    let mut e = RelayError::permanent(format!(
        "the upstream authorization for {} turned {status:?}: {why}",
        a.identifier()
    ));
    if status == AuthorizationStatus::Invalid {
        e.failed_validation = Some(a.identifier().to_string());
    }
    e
}

/// The error of an order that turned invalid: the CA's own detail.
fn order_invalid(order: &mut Order) -> RelayError {
    let state = order.state();
    let mut e = RelayError::permanent(match &state.error {
        Some(p) => format!("the upstream order is invalid: {p}"),
        None => "the upstream order is invalid".to_owned(),
    });
    e.problem_type = state.error.as_ref().and_then(|p| p.r#type.clone());
    e
}

/// Classifies a polling error, treating an order that turned invalid as
/// permanent whatever the error said.
fn polled(order: &mut Order, e: &instant_acme::Error, doing: &str) -> RelayError {
    if order.state().status == OrderStatus::Invalid {
        return order_invalid(order);
    }
    classify(e).context(doing)
}

fn upstream_identifier(id: &Identifier) -> Result<instant_acme::Identifier, RelayError> {
    match id.kind {
        IdentifierType::Dns => Ok(instant_acme::Identifier::Dns(id.value.clone())),
        IdentifierType::Ip => id
            .value
            .parse()
            .map(instant_acme::Identifier::Ip)
            .map_err(|_| RelayError::permanent(format!("{:?} is not an IP address", id.value))),
    }
}

/// Reads a PKCS#8 PEM key.
fn read_key(path: &Path) -> Result<rustls::pki_types::PrivatePkcs8KeyDer<'static>, String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("reading the upstream account key {}: {e}", path.display()))?;
    let block = pem::parse(&text).map_err(|e| {
        format!(
            "the upstream account key {} is not PEM: {e}",
            path.display()
        )
    })?;
    if block.tag() != "PRIVATE KEY" {
        return Err(format!(
            "the upstream account key {} must be a PKCS#8 \"PRIVATE KEY\" PEM, not {:?}",
            path.display(),
            block.tag()
        ));
    }
    Ok(block.into_contents().into())
}

/// Writes a new PKCS#8 key PEM readable by the owner only (0600), in a
/// directory only the owner can enter.
fn write_key(path: &Path, pkcs8: &[u8]) -> Result<(), String> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        crate::private::create_dir(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let text = pem::encode(&pem::Pem::new("PRIVATE KEY", pkcs8.to_vec()));
    crate::private::write_new(path, text.as_bytes())
        .map_err(|e| format!("creating {}: {e}", path.display()))
}

/// External account binding credentials for registration (RFC 8555 §7.3.4).
pub struct Eab {
    pub kid: String,
    /// The decoded MAC key; never logged.
    pub hmac_key: Vec<u8>,
}

impl std::fmt::Debug for Eab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eab")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// The RFC 7638 thumbprint of a P-256 account key (the kind
/// instant-acme makes), computed locally.
fn key_thumbprint_of(pkcs8: &rustls::pki_types::PrivatePkcs8KeyDer<'_>) -> Result<String, String> {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    let pair = EcdsaKeyPair::from_pkcs8(
        &ECDSA_P256_SHA256_FIXED_SIGNING,
        pkcs8.secret_pkcs8_der(),
        &ring::rand::SystemRandom::new(),
    )
    .map_err(|_| "the upstream account key is not a P-256 ECDSA key".to_owned())?;
    acme_proxy_protocol::Jwk::from_ec_point(
        acme_proxy_protocol::jwk::EcCurve::P256,
        pair.public_key().as_ref(),
    )
    .map(|j| j.thumbprint_b64())
    .ok_or_else(|| "the upstream account key's public point is malformed".to_owned())
}

/// A registered upstream account.
#[derive(Debug, Clone)]
pub struct Registered {
    pub account_url: String,
    pub key_thumbprint: String,
    pub key_path: PathBuf,
    pub key_created: bool,
}

/// Registers (or finds, for an existing key) the account of a relay
/// profile at its upstream `config`, with the key at `key_path`. With no
/// key file, a P-256 key is made and written 0600; with one, the same key
/// is registered again (the upstream answers with the existing account).
pub async fn register(
    config: &RelayConfig,
    key_path: PathBuf,
    egress: Arc<crate::egress::Egress>,
    eab: Option<&Eab>,
) -> Result<Registered, String> {
    let http = UpstreamHttp::new(&config.trust_anchors, config.request_timeout, egress, None)?;
    let builder = Account::builder_with_http(Box::new(http));
    let contact: Vec<&str> = config.contact.iter().map(String::as_str).collect();
    let upstream_error = |e: instant_acme::Error| {
        format!(
            "the upstream CA at {} refused or could not be reached: {e}",
            config.directory
        )
    };
    if key_path.exists() {
        if eab.is_some() {
            return Err(format!(
                "{} already exists; a registration with external account binding creates a new key: move the file away first",
                key_path.display()
            ));
        }
        let pkcs8 = read_key(&key_path)?;
        let key = instant_acme::Key::from_pkcs8_der(pkcs8.clone_key())
            .map_err(|e| format!("the upstream account key is unusable: {e}"))?;
        let (account, _) = builder
            .create_from_key(
                (key, rustls::pki_types::PrivateKeyDer::Pkcs8(pkcs8)),
                config.directory.clone(),
            )
            .await
            .map_err(upstream_error)?;
        return Ok(Registered {
            account_url: account.id().to_owned(),
            key_thumbprint: account.key_thumbprint().to_owned(),
            key_path,
            key_created: false,
        });
    }
    let eab_key = eab.map(|e| instant_acme::ExternalAccountKey::new(e.kid.clone(), &e.hmac_key));
    let (account, credentials) = builder
        .create(
            &NewAccount {
                contact: &contact,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            config.directory.clone(),
            eab_key.as_ref(),
        )
        .await
        .map_err(upstream_error)?;
    write_key(&key_path, credentials.private_key().secret_pkcs8_der())?;
    Ok(Registered {
        account_url: account.id().to_owned(),
        key_thumbprint: account.key_thumbprint().to_owned(),
        key_path,
        key_created: true,
    })
}

/// How long an attempt may take beyond its own budget to record the outcome.
pub const SETTLE_MARGIN: Duration = Duration::from_secs(15);

/// A relay profile's upstreams, in priority order (at least one).
#[derive(Debug)]
pub struct RelayPool {
    upstreams: Vec<Relay>,
    max_attempts: u32,
    failover_after: Option<Duration>,
    failover_on: Vec<acme_proxy_protocol::ProblemType>,
}

impl RelayPool {
    /// The pool of `upstreams` (the preferred first; at least one) of a
    /// relay configured as `config`.
    pub fn new(upstreams: Vec<Relay>, config: &RelayConfig) -> Result<Self, String> {
        if upstreams.is_empty() {
            return Err("a relay needs at least one upstream".into());
        }
        Ok(Self {
            upstreams,
            max_attempts: config.max_attempts,
            failover_after: config.failover_after,
            failover_on: config.failover_on.clone(),
        })
    }

    fn preferred(&self) -> &Relay {
        // Never empty: `new` refuses that.
        &self.upstreams[0]
    }

    /// The upstream that issued `cert` (its preferred one when it does not
    /// say), or why there is none.
    fn issuer(&self, cert: &super::IssuedCertificate<'_>) -> Result<&Relay, String> {
        match cert.upstream {
            None => Ok(self.preferred()),
            Some(name) => self
                .upstreams
                .iter()
                .find(|u| u.config.name == name)
                .ok_or_else(|| {
                    format!(
                        "the certificate was issued by upstream {name:?}, which the profile no longer has"
                    )
                }),
        }
    }
}

/// The relay issues through a durable job (`authority::relay`), revokes
/// upstream first, takes the upstream's renewal window, and publishes no
/// CRL (its upstream does) nor a CA certificate (the upstream's chain
/// comes with each certificate).
impl super::SignerBackend for RelayPool {
    fn issuance(&self) -> super::Issuance<'_> {
        super::Issuance::Deferred(self)
    }

    fn issue<'a>(
        &'a self,
        _req: &'a super::IssueRequest<'a>,
        _ctx: &'a super::IssueContext<'a>,
    ) -> super::BoxFuture<'a, Result<super::Issued, super::SignerError>> {
        Box::pin(std::future::ready(Err(super::SignerError::Internal(
            "a relay issues through its job, not inline".into(),
        ))))
    }

    fn ca_pem(&self) -> &str {
        ""
    }

    /// The upstream client (instant-acme 0.8) cannot forward them, and
    /// accepting a window we cannot honour would mislead.
    fn requested_window(&self) -> super::RequestedWindow {
        super::RequestedWindow::Refused(
            "this profile relays to an upstream CA and cannot forward notBefore or notAfter; order without them",
        )
    }

    /// The upstream can only be shown a wildcard over dns-01.
    fn delegated_dns01_zone(&self) -> Option<&str> {
        self.upstreams.iter().find_map(|u| match u.dns.as_deref() {
            Some(Publisher::Zone { zone, .. }) => Some(zone.as_str()),
            _ => None,
        })
    }

    /// Any upstream may have to take the order: one that cannot prove a
    /// wildcard refuses it for all.
    fn refuses_wildcards(&self) -> Option<&'static str> {
        self.upstreams.iter().any(|u| u.config.strategy == RelayStrategy::Http01).then_some(
            "this profile obtains certificates upstream over http-01, which cannot prove a wildcard; a relay profile with strategy = \"dns01\" can",
        )
    }

    /// A profile the upstream does not offer would silently become its
    /// default. The preferred upstream is asked: the order goes there
    /// while it is up.
    fn offers_profile<'a>(
        &'a self,
        name: &'a str,
        ask: bool,
    ) -> super::BoxFuture<'a, Option<bool>> {
        Box::pin(Relay::offers_profile(self.preferred(), name, ask))
    }

    fn renewal_window<'a>(
        &'a self,
        cert: &'a super::IssuedCertificate<'a>,
    ) -> Option<super::AskedWindow<'a>> {
        let der = cert.leaf_der?;
        let issuer = self.issuer(cert);
        Some(Box::pin(async move {
            Relay::renewal_window(issuer?, der)
                .await
                .map_err(|e| format!("the upstream's renewal information: {e}"))
        }))
    }

    /// Revoked where it was issued first, so that a failure leaves nothing
    /// half-done and the client can simply retry; the upstream's stated,
    /// permanent refusal goes to the client as that problem.
    fn revoke<'a>(
        &'a self,
        cert: &'a super::IssuedCertificate<'a>,
        reason: u64,
    ) -> super::BoxFuture<'a, Result<(), super::RevokeFailure>> {
        Box::pin(async move {
            let der = cert.leaf_der.unwrap_or_default();
            let issuer = self.issuer(cert).map_err(|e| super::RevokeFailure {
                message: "the upstream did not revoke the certificate",
                error: e,
                problem: None,
            })?;
            Relay::revoke(issuer, der, reason).await.map_err(|e| {
                let kind = e
                    .problem_type
                    .as_deref()
                    .and_then(acme_proxy_protocol::ProblemType::from_urn)
                    .filter(|_| e.is_permanent());
                super::RevokeFailure {
                    message: "the upstream did not revoke the certificate",
                    error: e.to_string(),
                    problem: kind.map(|kind| {
                        (
                            kind,
                            format!("the upstream CA refused the revocation: {}", e.detail),
                        )
                    }),
                }
            })
        })
    }

    /// The upstreams share one board.
    fn key_authorization(&self, token: &str) -> Option<String> {
        Relay::key_authorization(self.preferred(), token)
    }
}

impl super::Deferred for RelayPool {
    fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    fn failover_after(&self) -> Option<Duration> {
        self.failover_after
    }

    fn fails_over_on(&self, e: &RelayError) -> bool {
        e.problem_type
            .as_deref()
            .and_then(acme_proxy_protocol::ProblemType::from_urn)
            .is_some_and(|t| self.failover_on.contains(&t))
    }

    fn upstreams(&self) -> Vec<&dyn super::Upstream> {
        self.upstreams
            .iter()
            .map(|u| u as &dyn super::Upstream)
            .collect()
    }
}

impl super::Upstream for Relay {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn offers_profile<'a>(&'a self, name: &'a str) -> super::BoxFuture<'a, Option<bool>> {
        Box::pin(Relay::offers_profile(self, name, false))
    }

    fn request_timeout(&self) -> std::time::Duration {
        self.config.request_timeout
    }

    fn attempt_budget(&self) -> std::time::Duration {
        self.config.attempt_budget
    }

    fn upstream_orders(&self) -> Option<crate::config::Rate> {
        self.config.upstream_orders
    }

    fn upstream_certificates_per_domain(&self) -> Option<crate::config::Rate> {
        self.config.upstream_certificates_per_domain
    }

    fn upstream_failed_validations(&self) -> Option<crate::config::Rate> {
        self.config.upstream_failed_validations
    }

    fn upstream_pending_authorizations(&self) -> Option<u32> {
        self.config.upstream_pending_authorizations
    }

    fn directory(&self) -> &str {
        &self.config.directory
    }

    fn breaker(&self) -> (u32, Duration) {
        (self.config.breaker_failures, self.config.breaker_open_for)
    }

    fn probe(&self) -> super::BoxFuture<'_, Result<(), RelayError>> {
        Box::pin(Relay::probe(self))
    }

    fn create_order<'a>(
        &'a self,
        identifiers: &'a [Identifier],
        certificate_profile: Option<&'a str>,
    ) -> super::BoxFuture<'a, Result<String, RelayError>> {
        Box::pin(Relay::create_order(self, identifiers, certificate_profile))
    }

    fn attempt<'a>(
        &'a self,
        url: &'a str,
        csr_der: &'a [u8],
        deadline: Instant,
        before_finalize: super::BeforeFinalize<'a>,
    ) -> super::BoxFuture<'a, Result<Collected, RelayError>> {
        Box::pin(Relay::attempt(
            self,
            url,
            csr_der,
            deadline,
            before_finalize,
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn no_challenge_of_the_strategys_type_is_permanent_and_there_is_no_fallback() {
        let offered = [ChallengeType::Http01, ChallengeType::TlsAlpn01];
        let e = pick_challenge(RelayStrategy::Dns01, false, "a.test", &offered).unwrap_err();
        assert!(e.is_permanent());
        assert!(e.detail.contains("Dns01"), "{}", e.detail);
        let e = pick_challenge(
            RelayStrategy::Http01,
            false,
            "a.test",
            &[ChallengeType::Dns01],
        )
        .unwrap_err();
        assert!(e.is_permanent());
    }

    #[test]
    fn a_wildcard_with_http01_is_permanent_and_names_dns01() {
        let offered = [ChallengeType::Http01, ChallengeType::Dns01];
        let e = pick_challenge(RelayStrategy::Http01, true, "*.a.test", &offered).unwrap_err();
        assert!(e.is_permanent());
        assert!(e.detail.contains("dns01"), "{}", e.detail);
    }

    #[test]
    fn bypass_takes_the_first_challenge_offered() {
        let offered = [ChallengeType::TlsAlpn01, ChallengeType::Http01];
        assert_eq!(
            pick_challenge(RelayStrategy::Bypass, true, "*.a.test", &offered).unwrap(),
            ChallengeType::TlsAlpn01
        );
        assert!(
            pick_challenge(RelayStrategy::Bypass, false, "a.test", &[])
                .unwrap_err()
                .is_permanent()
        );
    }

    #[test]
    fn the_account_key_file_is_written_owner_only_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("upstream").join("p.key");
        let (_, pkcs8) = instant_acme::Key::generate_pkcs8().unwrap();
        write_key(&path, pkcs8.secret_pkcs8_der()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            read_key(&path).unwrap().secret_pkcs8_der(),
            pkcs8.secret_pkcs8_der()
        );
        // Never overwritten.
        assert!(write_key(&path, pkcs8.secret_pkcs8_der()).is_err());
    }
}
