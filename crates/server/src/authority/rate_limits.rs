//! `[rate_limits]`: how much one account or one address may ask for,
//! counted in the database (`rate_limits` table) so that a restart does
//! not hand out a fresh allowance. A refusal is `rateLimited` with
//! `Retry-After` and a detail naming the limit and when it frees (RFC 8555
//! §6.6).

use std::collections::BTreeSet;
use std::net::IpAddr;

use acme_proxy_protocol::ProblemType;
use acme_proxy_protocol::types::{Identifier, IdentifierType};
use acme_proxy_store::{AccountRow, RateLimitKey, RateLimitTake};

use super::{Authority, RequestContext};
use crate::config::{Rate, RateOverride};
use crate::error::{AcmeError, AcmeResult};
use crate::jobs::Outcome;

/// The limits a request can run into, by their name in keys, details and
/// metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Limit {
    NewAccounts,
    NewOrders,
    PendingAuthorizations,
    FailedValidations,
    CertificatesPerDomain,
    DuplicateCertificates,
    UpstreamOrders,
    UpstreamPause,
    UpstreamCertificatesPerDomain,
    UpstreamFailedValidations,
    UpstreamPendingAuthorizations,
}

impl Limit {
    pub(super) fn name(self) -> &'static str {
        match self {
            Limit::NewAccounts => "new_accounts_per_address",
            Limit::NewOrders => "new_orders_per_account",
            Limit::PendingAuthorizations => "pending_authorizations_per_account",
            Limit::FailedValidations => "failed_validations_per_account_and_name",
            Limit::CertificatesPerDomain => "certificates_per_domain",
            Limit::DuplicateCertificates => "duplicate_certificates",
            Limit::UpstreamOrders => "upstream_orders",
            Limit::UpstreamPause => "upstream_pause",
            Limit::UpstreamCertificatesPerDomain => "upstream_certificates_per_domain",
            Limit::UpstreamFailedValidations => "upstream_failed_validations",
            Limit::UpstreamPendingAuthorizations => "upstream_pending_authorizations",
        }
    }
}

/// A place taken, to give back if what it was taken for is not done.
#[derive(Debug)]
pub(super) struct Place {
    key: String,
    interval_ms: i64,
}

/// What a relay took for one new upstream order: budget places, and the
/// order's reserved upstream authorizations; given back when the upstream
/// made nothing.
#[derive(Debug, Default)]
pub(super) struct UpstreamTurn {
    places: Vec<Place>,
    reserved: Option<String>,
}

/// How long a relay waits when its profile's upstream authorizations in
/// flight leave no room: until some of them settle, which nothing
/// announces, so it looks again then.
const PENDING_AUTHORIZATIONS_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One place a request needs: of which limit, under which key, at which
/// rate, and what for (in the refusal's detail).
#[derive(Debug)]
struct Want {
    limit: Limit,
    key: String,
    rate: Rate,
    about: Option<String>,
}

/// The longest identifier-set key kept readable; a longer set is keyed by
/// its SHA-256 (what `ratelimit show` lists stays short).
const READABLE_SET: usize = 400;

/// The registered domain a certificate for `id` counts against: the name
/// one label below its public suffix (the Public Suffix List; a name
/// under a suffix the list does not know counts its last label as one),
/// the name itself when it has none, an IP address itself.
pub(super) fn registered_domain(id: &Identifier) -> String {
    let name = id.value.strip_prefix("*.").unwrap_or(&id.value);
    match id.kind {
        IdentifierType::Ip => name.to_owned(),
        IdentifierType::Dns => psl::domain_str(name).unwrap_or(name).to_owned(),
    }
}

impl Authority {
    /// The limit `pick` reads for `account`: its own override's, else its
    /// EAB credential's, else `default`.
    fn limit_for<T>(
        &self,
        account: &AccountRow,
        pick: impl Fn(&RateOverride) -> Option<T>,
        default: Option<T>,
    ) -> Option<T> {
        self.overriding(account, &pick).or(default)
    }

    /// What `pick` reads in the override of `account` that sets it: the
    /// account's own first, then its credential's.
    fn overriding<T>(
        &self,
        account: &AccountRow,
        pick: &impl Fn(&RateOverride) -> Option<T>,
    ) -> Option<T> {
        self.overriding_for(account, pick).map(|(_, value)| value)
    }

    /// As [`Authority::overriding`], with whom the override is for: the
    /// scope of the keys it counts apart (`account:ID` or `eab:KID`, so
    /// that a credential's accounts share one allowance).
    fn overriding_for<T>(
        &self,
        account: &AccountRow,
        pick: &impl Fn(&RateOverride) -> Option<T>,
    ) -> Option<(String, T)> {
        let overrides = &self.rate_limits.overrides;
        overrides
            .values()
            .filter(|o| o.account.as_deref() == Some(account.id.as_str()))
            .find_map(pick)
            .map(|v| (format!("account:{}", account.id), v))
            .or_else(|| {
                let kid = account.eab_kid.as_deref()?;
                overrides
                    .values()
                    .filter(|o| o.eab_key_id.as_deref() == Some(kid))
                    .find_map(pick)
                    .map(|v| (format!("eab:{kid}"), v))
            })
    }

    /// Takes a new order's place for `account`, or refuses.
    pub(super) async fn take_new_order_place(
        &self,
        account: &AccountRow,
    ) -> AcmeResult<Vec<Place>> {
        let Some(rate) = self.limit_for(
            account,
            |o| o.new_orders_per_account,
            self.rate_limits.new_orders_per_account,
        ) else {
            return Ok(Vec::new());
        };
        let want = Want {
            limit: Limit::NewOrders,
            key: format!("new_orders:account:{}", account.id),
            rate,
            about: None,
        };
        self.take_all(vec![want], RateLimitTake::Take).await
    }

    /// How many pending authorizations `account` may hold at a profile
    /// whose own bound is `profile_cap`.
    pub(super) fn pending_authorizations_cap(
        &self,
        account: &AccountRow,
        profile_cap: usize,
    ) -> usize {
        self.limit_for(
            account,
            |o| o.pending_authorizations_per_account,
            Some(profile_cap),
        )
        .unwrap_or(profile_cap)
    }

    /// Counts a refusal by a count limit (not a rate) in the metrics.
    pub(super) fn count_refusal(&self, limit: Limit) {
        self.metrics
            .rate_limited
            .get_or_create(&vec![("limit", limit.name().to_owned())])
            .inc();
    }

    /// The places an issuance for `identifiers` takes: one of each
    /// registered domain it names, and one of its identifier set.
    fn issuance_wants(&self, account: &AccountRow, identifiers: &[Identifier]) -> Vec<Want> {
        let mut wants = Vec::new();
        let limits = &self.rate_limits;
        let own =
            |pick: &dyn Fn(&RateOverride) -> Option<Rate>| self.overriding_for(account, &pick);
        // An override counts the certificates of its account (or of its
        // credential's accounts, together) apart.
        let (per_domain, scope) = match own(&|o| o.certificates_per_domain) {
            Some((scope, rate)) => (Some(rate), format!("{scope}:")),
            None => (limits.certificates_per_domain, String::new()),
        };
        if let Some(rate) = per_domain {
            let domains: BTreeSet<String> = identifiers.iter().map(registered_domain).collect();
            for domain in domains {
                wants.push(Want {
                    limit: Limit::CertificatesPerDomain,
                    key: format!("certificates:{scope}domain:{domain}"),
                    rate,
                    about: Some(domain),
                });
            }
        }
        let (duplicates, scope) = match own(&|o| o.duplicate_certificates) {
            Some((scope, rate)) => (Some(rate), format!("{scope}:")),
            None => (limits.duplicate_certificates, String::new()),
        };
        if let Some(rate) = duplicates {
            let set: BTreeSet<String> = identifiers
                .iter()
                .map(|i| format!("{}:{}", i.kind.as_str(), i.value))
                .collect();
            let joined = set.into_iter().collect::<Vec<_>>().join(",");
            let names = if joined.len() <= READABLE_SET {
                joined
            } else {
                let digest = ring::digest::digest(&ring::digest::SHA256, joined.as_bytes());
                format!("sha256:{}", hex::encode(digest.as_ref()))
            };
            wants.push(Want {
                limit: Limit::DuplicateCertificates,
                key: format!("duplicate_certificates:{scope}set:{names}"),
                rate,
                about: Some("this set of identifiers".to_owned()),
            });
        }
        wants
    }

    /// At newOrder: refuses an order that could not be issued, or whose
    /// identifiers failed validation too often, before its authorizations
    /// are made. Takes nothing.
    pub(super) async fn check_order_limits(
        &self,
        account: &AccountRow,
        identifiers: &[Identifier],
    ) -> AcmeResult<()> {
        let mut wants = self.issuance_wants(account, identifiers);
        if let Some(rate) = self.limit_for(
            account,
            |o| o.failed_validations_per_account_and_name,
            self.rate_limits.failed_validations_per_account_and_name,
        ) {
            // Each name once, in one order (two requests lock the same
            // rows in the same order).
            let names: BTreeSet<&str> = identifiers
                .iter()
                .map(|id| id.value.strip_prefix("*.").unwrap_or(&id.value))
                .collect();
            for name in names {
                wants.push(Want {
                    limit: Limit::FailedValidations,
                    key: failed_validations_key(&account.id, name),
                    rate,
                    about: Some(name.to_owned()),
                });
            }
        }
        self.take_all(wants, RateLimitTake::Check).await.map(drop)
    }

    /// At finalize: takes the places of the certificate about to be
    /// issued, or refuses (the order stays ready).
    pub(super) async fn take_issuance_places(
        &self,
        account: &AccountRow,
        identifiers: &[Identifier],
    ) -> AcmeResult<Vec<Place>> {
        let wants = self.issuance_wants(account, identifiers);
        self.take_all(wants, RateLimitTake::Take).await
    }

    /// Counts a failed validation of `name` (the authorization's
    /// identifier) for `account`; best effort, and a full key stays full.
    pub(super) async fn count_failed_validation(&self, account: &AccountRow, name: &str) {
        let Some(rate) = self.limit_for(
            account,
            |o| o.failed_validations_per_account_and_name,
            self.rate_limits.failed_validations_per_account_and_name,
        ) else {
            return;
        };
        let key = failed_validations_key(&account.id, name);
        if let Err(e) = self
            .store
            .take_rate_limit(
                &key,
                self.clock.unix_ms(),
                rate.interval_ms(),
                rate.burst_ms(),
            )
            .await
        {
            tracing::warn!(event = "ratelimit.take", outcome = "failure", %key, error = %e, "could not count a failed validation");
        }
    }

    /// Gives `places` back (best effort: a failure leaves a place taken
    /// until it frees by itself).
    pub(super) async fn give_back(&self, places: Vec<Place>) {
        for place in places {
            if let Err(e) = self
                .store
                .give_back_rate_limit(&place.key, place.interval_ms)
                .await
            {
                tracing::warn!(event = "ratelimit.give_back", outcome = "failure", key = %place.key, error = %e, "could not give a rate-limit place back");
            }
        }
    }

    /// Takes a new account's place for the request's client address (an
    /// IPv6 client's /64: one host holds a whole /64), or refuses. A
    /// request without a client address (none reaches the front end
    /// without one) is not limited.
    pub(super) async fn take_new_account_place(&self) -> AcmeResult<()> {
        let Some(rate) = self.rate_limits.new_accounts_per_address else {
            return Ok(());
        };
        let Some(ip) = RequestContext::current()
            .client_ip
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        else {
            return Ok(());
        };
        let who = crate::api::forwarded::client_key(ip);
        let want = Want {
            limit: Limit::NewAccounts,
            key: format!("new_accounts:address:{who}"),
            rate,
            about: None,
        };
        self.take_all(vec![want], RateLimitTake::Take)
            .await
            .map(drop)
    }

    /// Takes a place of each of `wants`, all or none (or with
    /// [`RateLimitTake::Check`] only looks), or refuses with the first
    /// full one.
    async fn take_all(&self, wants: Vec<Want>, take: RateLimitTake) -> AcmeResult<Vec<Place>> {
        if wants.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<RateLimitKey<'_>> = wants
            .iter()
            .map(|w| RateLimitKey {
                key: &w.key,
                interval_ms: w.rate.interval_ms(),
                burst_ms: w.rate.burst_ms(),
            })
            .collect();
        let now_ms = self.clock.unix_ms();
        let Some((full, wait_ms)) = self.store.take_rate_limits(&keys, now_ms, take).await? else {
            return Ok(match take {
                RateLimitTake::Take => wants
                    .into_iter()
                    .map(|w| Place {
                        interval_ms: w.rate.interval_ms(),
                        key: w.key,
                    })
                    .collect(),
                RateLimitTake::Check => Vec::new(),
            });
        };
        let want = &wants[full.min(wants.len() - 1)];
        self.count_refusal(want.limit);
        let seconds = u64::try_from(wait_ms.saturating_add(999) / 1000).unwrap_or(1);
        let at = crate::clock::rfc3339(self.clock.unix() + i64::try_from(seconds).unwrap_or(0));
        let about = want
            .about
            .as_deref()
            .map(|a| format!(" for {a}"))
            .unwrap_or_default();
        let mut e = AcmeError::new(
            ProblemType::RateLimited,
            format!(
                "over the rate limit {} ({}){about}: the next is allowed at {at}, in {seconds} seconds",
                want.limit.name(),
                want.rate,
            ),
        );
        e.retry_after = Some(seconds);
        Err(e)
    }

    /// A relay's turn to send a new upstream order for `identifiers` to
    /// `relay`, one of its profile's upstreams, under that upstream's
    /// budgets, all or none: `upstream_orders` (smooth: a
    /// single place, freeing every period / N, so that no period ever holds
    /// more than N; an upstream's own limit may have no room for a burst
    /// on top of what it counted already) and
    /// `upstream_certificates_per_domain` (a place of each registered
    /// domain named, N at once as the upstream allows). Now, or the job
    /// waits in the queue (the wait is not an attempt) until the places
    /// free.
    ///
    /// Before them: no identifier whose upstream validations failed
    /// `upstream_failed_validations` times within its period (each waits
    /// until its window frees, instead of failing at the upstream again),
    /// and room for the order's authorizations under
    /// `upstream_pending_authorizations` (reserved on the order's mapping
    /// row; it waits and looks again while there is none).
    pub(super) async fn upstream_order_turn(
        &self,
        profile: &str,
        order_id: &str,
        identifiers: &[Identifier],
        relay: &dyn crate::signer::Upstream,
    ) -> Result<UpstreamTurn, Outcome> {
        if let Some(rate) = relay.upstream_failed_validations() {
            let names: BTreeSet<String> = identifiers.iter().map(|i| i.value.clone()).collect();
            let keys: Vec<String> = names
                .iter()
                .map(|name| upstream_failed_validations_key(profile, relay.name(), name))
                .collect();
            let checked: Vec<RateLimitKey<'_>> = keys
                .iter()
                .map(|key| RateLimitKey {
                    key,
                    interval_ms: rate.interval_ms(),
                    burst_ms: rate.burst_ms(),
                })
                .collect();
            match self
                .store
                .take_rate_limits(&checked, self.clock.unix_ms(), RateLimitTake::Check)
                .await
            {
                Ok(None) => {}
                Ok(Some((full, wait_ms))) => {
                    return Err(self.budget_wait(
                        profile,
                        Limit::UpstreamFailedValidations,
                        &keys[full.min(keys.len() - 1)],
                        wait_ms,
                        &rate.to_string(),
                    ));
                }
                Err(e) => {
                    return Err(Outcome::Retry(format!(
                        "checking the upstream's failed validations: {e}"
                    )));
                }
            }
        }
        let mut turn = UpstreamTurn::default();
        if let Some(max) = relay.upstream_pending_authorizations() {
            let count = i64::try_from(identifiers.len()).unwrap_or(i64::MAX);
            match self
                .store
                .reserve_upstream_authorizations(
                    order_id,
                    profile,
                    relay.name(),
                    count,
                    i64::from(max),
                )
                .await
            {
                Ok(true) => turn.reserved = Some(order_id.to_owned()),
                Ok(false) => {
                    return Err(self.budget_wait(
                        profile,
                        Limit::UpstreamPendingAuthorizations,
                        &format!("profile:{profile}:upstream:{}", relay.name()),
                        i64::try_from(PENDING_AUTHORIZATIONS_WAIT.as_millis()).unwrap_or(5000),
                        &max.to_string(),
                    ));
                }
                Err(e) => {
                    return Err(Outcome::Retry(format!(
                        "reserving upstream authorizations: {e}"
                    )));
                }
            }
        }
        let mut budgets: Vec<(Limit, String, Rate, i64)> = Vec::new();
        if let Some(rate) = relay.upstream_orders() {
            budgets.push((
                Limit::UpstreamOrders,
                format!(
                    "upstream_orders:profile:{profile}:upstream:{}",
                    relay.name()
                ),
                rate,
                rate.interval_ms(),
            ));
        }
        if let Some(rate) = relay.upstream_certificates_per_domain() {
            let domains: BTreeSet<String> = identifiers.iter().map(registered_domain).collect();
            for domain in domains {
                budgets.push((
                    Limit::UpstreamCertificatesPerDomain,
                    format!(
                        "upstream_certificates:profile:{profile}:upstream:{}:domain:{domain}",
                        relay.name()
                    ),
                    rate,
                    rate.burst_ms(),
                ));
            }
        }
        if budgets.is_empty() {
            return Ok(turn);
        }
        let keys: Vec<RateLimitKey<'_>> = budgets
            .iter()
            .map(|(_, key, rate, burst_ms)| RateLimitKey {
                key,
                interval_ms: rate.interval_ms(),
                burst_ms: *burst_ms,
            })
            .collect();
        match self
            .store
            .take_rate_limits(&keys, self.clock.unix_ms(), RateLimitTake::Take)
            .await
        {
            Ok(None) => {
                turn.places = budgets
                    .into_iter()
                    .map(|(_, key, rate, _)| Place {
                        key,
                        interval_ms: rate.interval_ms(),
                    })
                    .collect();
                Ok(turn)
            }
            Ok(Some((full, wait_ms))) => {
                self.give_back_turn(turn).await;
                let (limit, key, rate, _) = &budgets[full.min(budgets.len() - 1)];
                Err(self.budget_wait(profile, *limit, key, wait_ms, &rate.to_string()))
            }
            Err(e) => {
                self.give_back_turn(turn).await;
                Err(Outcome::Retry(format!(
                    "taking places of the upstream budgets: {e}"
                )))
            }
        }
    }

    /// The job's wait for an upstream budget with no room: counted,
    /// logged, and requeued for when it frees.
    fn budget_wait(
        &self,
        profile: &str,
        limit: Limit,
        key: &str,
        wait_ms: i64,
        budget: &str,
    ) -> Outcome {
        self.count_refusal(limit);
        tracing::info!(
            event = "relay.budget",
            outcome = "deferred",
            profile,
            limit = limit.name(),
            key = %key,
            wait_ms,
            budget,
            "an upstream budget is spent; this relay waits for its turn"
        );
        let wait = std::time::Duration::from_millis(u64::try_from(wait_ms).unwrap_or(1));
        Outcome::Wait(self.clock.now() + wait)
    }

    /// Gives back what a relay took for an upstream order the upstream did
    /// not make (best effort, as [`Self::give_back`]).
    pub(super) async fn give_back_turn(&self, turn: UpstreamTurn) {
        self.give_back(turn.places).await;
        if let Some(order_id) = turn.reserved
            && let Err(e) = self.store.release_upstream_authorizations(&order_id).await
        {
            tracing::warn!(event = "ratelimit.give_back", outcome = "failure", order = %order_id, error = %e, "could not release reserved upstream authorizations");
        }
    }

    /// Counts an upstream validation of `name` that failed against the
    /// profile's `upstream_failed_validations`, so that new orders for it
    /// wait while the upstream would refuse them.
    pub(super) async fn count_upstream_failed_validation(
        &self,
        profile: &str,
        name: &str,
        relay: &dyn crate::signer::Upstream,
    ) {
        let Some(rate) = relay.upstream_failed_validations() else {
            return;
        };
        let key = upstream_failed_validations_key(profile, relay.name(), name);
        // A full key is left as it is (a take writes nothing then): it
        // holds new orders for the name until its window frees already.
        let taken = RateLimitKey {
            key: &key,
            interval_ms: rate.interval_ms(),
            burst_ms: rate.burst_ms(),
        };
        if let Err(e) = self
            .store
            .take_rate_limits(&[taken], self.clock.unix_ms(), RateLimitTake::Take)
            .await
        {
            tracing::warn!(event = "relay.budget", outcome = "failure", profile, key = %key, error = %e, "could not count an upstream validation that failed");
        }
    }

    /// Whether `profile`'s upstream `upstream` may be sent a request now:
    /// not while it is paused ([`Self::pause_upstream`]), when the job
    /// waits in the queue until the pause ends (the wait is not an
    /// attempt).
    pub(super) async fn upstream_open(&self, profile: &str, upstream: &str) -> Result<(), Outcome> {
        // A pause is a key held until a time (a read: every relay attempt
        // and finalize asks, and must not queue behind the writer).
        let now_ms = self.clock.unix_ms();
        match self
            .store
            .rate_limit_tat(&upstream_pause_key(profile, upstream))
            .await
        {
            Ok(None) => Ok(()),
            Ok(Some(until)) if until <= now_ms => Ok(()),
            Ok(Some(until)) => {
                let wait_ms = until - now_ms;
                self.count_refusal(Limit::UpstreamPause);
                tracing::info!(
                    event = "relay.paused",
                    outcome = "deferred",
                    profile,
                    upstream,
                    wait_ms,
                    "the upstream asked to be left alone for a while; this relay waits"
                );
                let wait = std::time::Duration::from_millis(u64::try_from(wait_ms).unwrap_or(1));
                Err(Outcome::Wait(self.clock.now() + wait))
            }
            Err(e) => Err(Outcome::Retry(format!("reading the upstream's pause: {e}"))),
        }
    }

    /// Pauses `profile`'s upstream `upstream` for `after` (its
    /// `Retry-After`, at most a day): no job of any replica sends it a
    /// request until then (new orders go to the next upstream, if any). An
    /// error is logged: the job that saw the answer waits all the same.
    pub(super) async fn pause_upstream(
        &self,
        profile: &str,
        upstream: &str,
        after: std::time::Duration,
    ) {
        let after = crate::jobs::backoff::retry_after(after);
        let until_ms = self
            .clock
            .unix_ms()
            .saturating_add(i64::try_from(after.as_millis()).unwrap_or(i64::MAX));
        match self
            .store
            .hold_rate_limit(&upstream_pause_key(profile, upstream), until_ms)
            .await
        {
            Ok(()) => tracing::warn!(
                event = "relay.paused",
                outcome = "paused",
                profile,
                upstream,
                seconds = after.as_secs(),
                "the upstream answered with Retry-After; no relay asks it until then"
            ),
            Err(e) => tracing::error!(
                event = "relay.paused",
                outcome = "failure",
                profile,
                upstream,
                error = %e,
                "could not record the upstream's pause"
            ),
        }
    }

    /// Forgets rate-limit keys that hold nothing back (with the nonce sweep).
    pub async fn sweep_rate_limits(&self) -> AcmeResult<u64> {
        Ok(self.store.sweep_rate_limits(self.clock.unix_ms()).await?)
    }
}

/// The key of the pause of `profile`'s upstream `upstream`.
pub(crate) fn upstream_pause_key(profile: &str, upstream: &str) -> String {
    format!("upstream_pause:profile:{profile}:upstream:{upstream}")
}

/// The key of the failed validations of `name` at `profile`'s upstream
/// `upstream`. A wildcard counts against its base name: the upstream
/// validates `*.example.com` as `example.com` (RFC 8555 section 7.1.3).
fn upstream_failed_validations_key(profile: &str, upstream: &str, name: &str) -> String {
    let name = name.strip_prefix("*.").unwrap_or(name);
    format!("upstream_failed_validations:profile:{profile}:upstream:{upstream}:name:{name}")
}

/// The key of `account_id`'s failed validations of `name`.
fn failed_validations_key(account_id: &str, name: &str) -> String {
    format!("failed_validations:account:{account_id}:name:{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcards_failed_upstream_validations_count_against_its_base_name() {
        assert_eq!(
            upstream_failed_validations_key("p", "a", "*.example.com"),
            upstream_failed_validations_key("p", "a", "example.com")
        );
        assert_ne!(
            upstream_failed_validations_key("p", "a", "www.example.com"),
            upstream_failed_validations_key("p", "a", "example.com")
        );
        assert_ne!(
            upstream_failed_validations_key("p", "a", "example.com"),
            upstream_failed_validations_key("p", "b", "example.com")
        );
    }

    #[test]
    fn a_certificate_counts_against_the_name_one_label_below_its_public_suffix() {
        let cases = [
            (Identifier::dns("www.example.com"), "example.com"),
            (Identifier::dns("a.b.example.co.uk"), "example.co.uk"),
            (Identifier::dns("*.example.co.uk"), "example.co.uk"),
            // Suffixes the list does not know: the last label is one.
            (Identifier::dns("host1.lab.test"), "lab.test"),
            (Identifier::dns("*.db.corp.internal"), "corp.internal"),
            // No label below a suffix: the name itself.
            (Identifier::dns("localhost"), "localhost"),
            (Identifier::dns("co.uk"), "co.uk"),
            (Identifier::ip("192.0.2.7"), "192.0.2.7"),
            (Identifier::ip("2001:db8::1"), "2001:db8::1"),
        ];
        for (id, domain) in cases {
            assert_eq!(registered_domain(&id), domain, "{id:?}");
        }
    }
}
