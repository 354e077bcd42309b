//! The relay's side of the state machine (docs/design.md draws it step
//! by step): finalize records the mapping and queues the job; the job's
//! attempts drive the upstream; settle and abandon are the only writers of
//! the local order's outcome.

use std::time::Duration;

use acme_proxy_protocol::types::{OrderStatus, RawIdentifier};
use acme_proxy_protocol::{Problem, ProblemType};
use acme_proxy_store::{
    AccountRow, AuditEvent, AuditOutcome, JobRow, NewAuditRow, NewCertificateRow, NewJob,
    NewUpstreamOrder, OrderRow, UpstreamOrderRow,
};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{Authority, Profile, RequestContext};
use crate::error::{AcmeError, AcmeResult};
use crate::events::Event;
use crate::generation::Generations;
use crate::jobs::{BoxFuture, JobHandler, JobSpec, Outcome, Queue, RetireReason, backoff};
use crate::notify::Notice;
use crate::signer::relay::{RelayError, SETTLE_MARGIN};
use crate::signer::{Deferred, Upstream};

/// Upstream refusals at finalize that concern the order, passed to the
/// client as they are.
const CLIENT_VISIBLE: [ProblemType; 5] = [
    ProblemType::RejectedIdentifier,
    ProblemType::UnsupportedIdentifier,
    ProblemType::Caa,
    ProblemType::BadCsr,
    ProblemType::RateLimited,
];

/// The job kind; the key is the local order id.
pub const RELAY_KIND: &str = crate::jobs::JobKind::SignerRelayIssue.as_str();

/// Relays picked up per start (the rest at the next).
const RECOVER_BATCH: i64 = 10_000;

/// What the client sees when a relay is abandoned: nothing of the
/// upstream's words, which are for the operator (audit row, mapping row).
const GENERIC_FAILURE: &str =
    "the certificate could not be obtained; the operator's audit log has the reason";

fn payload(order_id: &str, profile: &str) -> String {
    serde_json::json!({ "order": order_id, "profile": profile }).to_string()
}

fn order_of(job: &JobRow) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(&job.payload).ok()?;
    Some((
        v.get("order")?.as_str()?.to_owned(),
        v.get("profile")?.as_str()?.to_owned(),
    ))
}

impl Authority {
    /// finalize for a relay profile (§7.4): record the mapping and the job
    /// with ready → processing in one transaction, then try the upstream
    /// `newOrder` once. A blip leaves the job to create it; a stated
    /// refusal goes back to the client as that problem and the order is
    /// ready again.
    pub(super) async fn finalize_relay(
        &self,
        profile: &Profile,
        relay: &dyn Deferred,
        account: &AccountRow,
        order: &OrderRow,
        csr_der: &[u8],
        ctx: &RequestContext,
    ) -> AcmeResult<OrderRow> {
        let pool = relay;
        let now_ms = self.clock.unix_ms();
        // The job waits for this request's own newOrder (one request
        // timeout) so that the two do not both create an upstream order;
        // it is woken as soon as the request is done.
        let hold = relay
            .upstreams()
            .iter()
            .map(|u| u.request_timeout())
            .max()
            .unwrap_or_default()
            + Duration::from_secs(1);
        let payload = payload(&order.id, &profile.name);
        let job = NewJob {
            kind: RELAY_KIND,
            key: &order.id,
            payload: &payload,
            run_at: now_ms + hold.as_millis() as i64,
            // Past the order's expiry the client could never collect it.
            deadline: Some(order.expires_at * 1000),
            max_attempts: i64::from(relay.max_attempts()),
            fair_key: None,
        };
        // Recorded now, for the audit rows the job writes later.
        let reverse_name = match ctx.client_ip.as_deref().and_then(|ip| ip.parse().ok()) {
            Some(ip) => self.reverse.lookup(ip).await,
            None => None,
        };
        let row = NewUpstreamOrder {
            order_id: &order.id,
            profile: &profile.name,
            account_id: &account.id,
            csr_der,
            client_ip: ctx.client_ip.as_deref(),
            reverse_name: reverse_name.as_deref(),
            user_agent: ctx.user_agent.as_deref(),
            request_id: ctx.request_id.as_deref(),
            now: self.clock.unix(),
        };
        if !self
            .store
            .begin_relay(&row, &job, now_ms, super::guard(account))
            .await
            .map_err(|e| self.guarded_write_error(account, e))?
        {
            return Err(AcmeError::new(
                ProblemType::OrderNotReady,
                "the order is already being finalized",
            ));
        }
        self.queue.wake(RELAY_KIND);
        let mut retry_after = None;
        let mut turn_at = None;
        // An upstream paused or down is not asked (and no budget place is
        // spent): the order goes to the next, or the job creates it when
        // one is back.
        let turn = match self
            .pick_upstream(
                &profile.name,
                relay,
                false,
                None,
                order.certificate_profile.as_deref(),
            )
            .await
        {
            Ok(relay) => self
                .upstream_order_turn(&profile.name, &order.id, &order.identifiers, relay)
                .await
                .map(|places| (relay, places)),
            Err(waiting) => Err(waiting),
        };
        match turn {
            Ok((relay, places)) => {
                // One bounded try: the client's request must not wait on a hung
                // upstream for longer than one request timeout (the job's hold).
                let created = match tokio::time::timeout(
                    relay.request_timeout(),
                    relay.create_order(&order.identifiers, order.certificate_profile.as_deref()),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => Err(RelayError::down(format!(
                        "the upstream newOrder did not finish within {:?}",
                        relay.request_timeout()
                    ))),
                };
                self.upstream_heard(&profile.name, relay, created.as_ref().err())
                    .await;
                match created {
                    Ok(url) => {
                        self.store
                            .set_upstream_url(&order.id, relay.name(), &url, self.clock.unix())
                            .await?;
                    }
                    Err(e) if e.is_permanent() => {
                        self.give_back_turn(places).await;
                        // A refusal the next upstream may not share: the
                        // job places the order there.
                        if self
                            .pass_on(&profile.name, pool, relay, &order.id, &account.id, &e)
                            .await
                        {
                        } else if self
                            .store
                            .undo_relay(&order.id, RELAY_KIND, self.clock.unix_ms())
                            .await?
                        {
                            return Err(Self::refused_upstream(profile, order, &e));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(
                            event = "relay.new_order",
                            outcome = "retry",
                            profile = %profile.name,
                            order = %order.id,
                            error = %e,
                            "the upstream newOrder failed transiently; the relay job will create it"
                        );
                        if let Some(after) = e.retry_after {
                            self.pause_upstream(&profile.name, relay.name(), after)
                                .await;
                        }
                        if created_nothing(&e) {
                            self.give_back_turn(places).await;
                        }
                        retry_after = e.retry_after;
                    }
                }
            }
            // The profile's upstream order budget is spent: the job creates
            // the upstream order at its turn.
            Err(Outcome::Wait(at)) => turn_at = Some(crate::clock::unix_ms(at)),
            Err(_) => {}
        }
        // Due now, at the budget's turn, or when the upstream asked us to
        // come back (at most a day on: its number is unbounded, our run
        // times are not).
        let now_ms = self.clock.unix_ms();
        let due = turn_at
            .unwrap_or_else(|| {
                backoff::later(
                    now_ms,
                    retry_after.map_or(Duration::ZERO, backoff::retry_after),
                )
            })
            // Past the order's expiry the job is retired: no later than that.
            .min(order.expires_at.saturating_mul(1000));
        self.store
            .schedule_queued_job(RELAY_KIND, &order.id, due, now_ms)
            .await?;
        self.queue.nudge();
        tracing::info!(
            event = "relay.queued",
            outcome = "success",
            profile = %profile.name,
            account = %account.id,
            order = %order.id,
            "order relayed upstream; the client polls while the job runs"
        );
        self.store
            .order(&order.id)
            .await?
            .ok_or_else(|| AcmeError::internal("order vanished after finalize"))
    }

    /// The client's problem for an upstream refusal at finalize (finalize
    /// writes its audit row, the upstream's words in the operator-only
    /// detail).
    fn refused_upstream(profile: &Profile, order: &OrderRow, e: &RelayError) -> AcmeError {
        // Only refusals about the order itself are the client's to see;
        // one about our upstream account (accountDoesNotExist,
        // unauthorized, userActionRequired…) would mislead the client about
        // its own account, so it becomes a generic server error.
        let kind = e
            .problem_type
            .as_deref()
            .and_then(ProblemType::from_urn)
            .filter(|k| CLIENT_VISIBLE.contains(k))
            .unwrap_or(ProblemType::ServerInternal);
        tracing::warn!(
            event = "relay.new_order",
            outcome = "refused",
            profile = %profile.name,
            order = %order.id,
            error = %e,
            "the upstream refused the order"
        );
        if kind == ProblemType::ServerInternal {
            return AcmeError::internal(&e.detail);
        }
        AcmeError::new(
            kind,
            format!("the upstream CA refused this order: {}", e.detail),
        )
    }

    /// One attempt of the relay job for `order_id`.
    async fn relay_attempt(&self, order_id: &str, profile_name: &str) -> Outcome {
        let mapping = match self.store.upstream_order(order_id).await {
            Ok(Some(m)) => m,
            // Nothing to relay (an undone finalize): done.
            Ok(None) => return Outcome::Done,
            Err(e) => return Outcome::Retry(format!("reading the mapping row: {e}")),
        };
        if mapping.status != OrderStatus::Processing {
            return Outcome::Done;
        }
        let order = match self.store.order(order_id).await {
            Ok(Some(o)) => o,
            Ok(None) => return Outcome::Done,
            Err(e) => return Outcome::Retry(format!("reading the order: {e}")),
        };
        if order.status != OrderStatus::Processing {
            return Outcome::Done;
        }
        // A profile that is not mounted right now (a reload in progress, a
        // configuration being fixed, a profile taken out for a while) is
        // held, not failed: its waiting costs no attempt.
        let Some(profile) = self.profile(profile_name).cloned() else {
            return Outcome::Hold(format!("profile {profile_name} is not mounted"));
        };
        let Some(pool) = profile.signer.issuance().deferred() else {
            return Outcome::Hold(format!("profile {profile_name} is not a relay profile"));
        };
        // Taken before the gate: a probe's time is the attempt's too.
        let started = tokio::time::Instant::now();
        let (relay, url) = match mapping.upstream_url.clone() {
            // Sticky: an order stays on the upstream that accepted it.
            Some(url) => {
                let Some(relay) = pool.upstream(mapping.upstream.as_deref()) else {
                    return Outcome::Hold(format!(
                        "profile {profile_name} has no upstream {:?} (the order's) mounted",
                        mapping.upstream
                    ));
                };
                if let Err(wait) = self.upstream_gate(profile_name, relay, true).await {
                    // Down for longer than the profile lets an order wait
                    // on it, before its finalize: the order moves on.
                    return match self.fail_over(&profile, pool, relay, &mapping).await {
                        Some(moved) => moved,
                        None => wait,
                    };
                }
                (relay, url)
            }
            None => {
                let relay = match self
                    .pick_upstream(
                        profile_name,
                        pool,
                        true,
                        mapping.moved_from.as_deref(),
                        order.certificate_profile.as_deref(),
                    )
                    .await
                {
                    Ok(relay) => relay,
                    Err(wait) => return wait,
                };
                let places = match self
                    .upstream_order_turn(profile_name, order_id, &order.identifiers, relay)
                    .await
                {
                    Ok(places) => places,
                    Err(outcome) => return outcome,
                };
                let created = self
                    .heard(
                        profile_name,
                        relay,
                        relay
                            .create_order(&order.identifiers, order.certificate_profile.as_deref())
                            .await,
                    )
                    .await;
                match created {
                    Ok(url) => match self
                        .store
                        .set_upstream_url(order_id, relay.name(), &url, self.clock.unix())
                        .await
                    {
                        // The finalize request may have made one first,
                        // at an upstream this job passed over: its gate
                        // is asked before anything is sent there.
                        Ok(Some((in_force, at))) => match pool.upstream(at.as_deref()) {
                            Some(in_force_relay) if in_force_relay.name() != relay.name() => {
                                if let Err(wait) =
                                    self.upstream_gate(profile_name, in_force_relay, true).await
                                {
                                    return wait;
                                }
                                (in_force_relay, in_force)
                            }
                            Some(relay) => (relay, in_force),
                            None => {
                                return Outcome::Retry(format!(
                                    "profile {profile_name} has no upstream {at:?} (the order's) mounted"
                                ));
                            }
                        },
                        Ok(None) => return Outcome::Done,
                        Err(e) => {
                            return Outcome::Retry(format!("recording the upstream order: {e}"));
                        }
                    },
                    Err(e) => {
                        if created_nothing(&e) {
                            self.give_back_turn(places).await;
                        }
                        if e.is_permanent()
                            && self
                                .pass_on(
                                    profile_name,
                                    pool,
                                    relay,
                                    order_id,
                                    &mapping.account_id,
                                    &e,
                                )
                                .await
                        {
                            return Outcome::Wait(self.clock.now());
                        }
                        return self.relay_failed(profile_name, relay, e).await;
                    }
                }
            }
        };
        let deadline = started + relay.attempt_budget();
        let store = self.store.clone();
        let clock = std::sync::Arc::clone(&self.clock);
        let id = order_id.to_owned();
        let at = url.clone();
        let before_finalize = move || -> crate::jobs::BoxFuture<'static, Result<(), String>> {
            let (store, clock, id, at) = (
                store.clone(),
                std::sync::Arc::clone(&clock),
                id.clone(),
                at.clone(),
            );
            Box::pin(async move {
                match store
                    .mark_upstream_finalize(&id, &at, clock.unix_ms())
                    .await
                {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(format!(
                        "the order no longer waits at upstream order {at} (moved or settled meanwhile); its finalize is not sent there"
                    )),
                    Err(e) => Err(e.to_string()),
                }
            })
        };
        let collected = match self
            .heard(
                profile_name,
                relay,
                relay
                    .attempt(&url, &mapping.csr_der, deadline, &before_finalize)
                    .await,
            )
            .await
        {
            Ok(c) => c,
            Err(e) => {
                // Failed for a reason the next upstream may not share,
                // before its finalize was sent: the order moves on.
                if e.is_permanent()
                    && pool.fails_over_on(&e)
                    && let Some(moved) = self
                        .move_off(&profile, pool, relay, &mapping, &format!("failed it: {e}"))
                        .await
                {
                    return moved;
                }
                return self.relay_failed(profile_name, relay, e).await;
            }
        };
        match self
            .settle_relay(
                &profile,
                &mapping,
                &order,
                &collected.chain_pem,
                &collected.certificate_url,
            )
            .await
        {
            Ok(()) => Outcome::Done,
            Err(e) => e,
        }
    }

    /// Moves a relayed order off its upstream `relay` when that upstream
    /// has been down (its breaker open) for the profile's `failover_after`
    /// and the order's finalize was never sent there. None: it stays and
    /// waits.
    async fn fail_over(
        &self,
        profile: &Profile,
        pool: &dyn Deferred,
        relay: &dyn Upstream,
        mapping: &UpstreamOrderRow,
    ) -> Option<Outcome> {
        let after = pool.failover_after()?;
        if mapping.finalize_sent_at.is_some() {
            return None;
        }
        let down = self
            .upstream_down(profile, Some(relay.name()))
            .await
            .filter(|row| row.state != acme_proxy_store::BreakerState::Closed)?;
        let now_ms = self.clock.unix_ms();
        let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
        if now_ms.saturating_sub(down.since) < after_ms {
            return None;
        }
        let why = format!(
            "was down since {}, past failover_after {}: {}",
            crate::clock::rfc3339(down.since.div_euclid(1000)),
            humantime::format_duration(after),
            down.last_error.as_deref().unwrap_or("no error recorded")
        );
        self.move_off(profile, pool, relay, mapping, &why).await
    }

    /// Moves a relayed order whose upstream order `relay` made off it,
    /// because `relay` `why`, if its finalize was never sent there and an
    /// upstream comes after it: one transaction forgets the upstream order
    /// and writes the audit row, and the job places the order anew at once,
    /// further down the list. None: it stays.
    async fn move_off(
        &self,
        profile: &Profile,
        pool: &dyn Deferred,
        relay: &dyn Upstream,
        mapping: &UpstreamOrderRow,
        why: &str,
    ) -> Option<Outcome> {
        if mapping.finalize_sent_at.is_some() || !has_next(pool, relay) {
            return None;
        }
        let detail = format!(
            "moved off upstream {} (its finalize was never sent there), which {why}",
            relay.name()
        );
        let actor = format!("account:{}", mapping.account_id);
        let audit = NewAuditRow {
            profile: Some(&profile.name),
            account_id: Some(&mapping.account_id),
            order_id: Some(&mapping.order_id),
            client_ip: mapping.client_ip.as_deref(),
            reverse_name: mapping.reverse_name.as_deref(),
            user_agent: mapping.user_agent.as_deref(),
            request_id: mapping.request_id.as_deref(),
            detail: Some(&detail),
            ..NewAuditRow::new(
                self.clock.unix(),
                AuditEvent::OrderUpstreamMoved,
                AuditOutcome::Success,
                &actor,
            )
        };
        match self
            .record_move(&audit, mapping.upstream.as_deref(), relay)
            .await
        {
            Ok(true) => {
                tracing::warn!(
                    event = "relay.failover",
                    outcome = "moved",
                    profile = %profile.name,
                    order = %mapping.order_id,
                    upstream = relay.name(),
                    reason = why,
                    "the order moves off its upstream to the next one"
                );
                Some(Outcome::Wait(self.clock.now()))
            }
            Ok(false) => None,
            Err(e) => Some(Outcome::Retry(format!(
                "moving the order off its upstream: {e}"
            ))),
        }
    }

    /// Moves the order `audit` is about off `relay` (recorded on its
    /// mapping as `recorded`), with `audit`, in one transaction
    /// ([`acme_proxy_store::Store::move_relay`]); true when it moved.
    async fn record_move(
        &self,
        audit: &NewAuditRow<'_>,
        recorded: Option<&str>,
        relay: &dyn Upstream,
    ) -> Result<bool, acme_proxy_store::StoreError> {
        let order_id = audit.order_id.unwrap_or_default();
        let moved = self
            .store
            .move_relay(order_id, recorded, relay.name(), self.clock.unix(), audit)
            .await?;
        if moved {
            crash_point!("relay.moved");
            self.metrics.audited(audit);
        }
        Ok(moved)
    }

    /// Passes a new order that `relay` refused (no upstream order made)
    /// with one of the profile's `failover_on` problem types to the next
    /// upstream: its refusal recorded (`moved_from`) with an audit row, so
    /// that the job places it further down the list. False when the
    /// refusal is not one of those, or no upstream comes after `relay`.
    async fn pass_on(
        &self,
        profile: &str,
        pool: &dyn Deferred,
        relay: &dyn Upstream,
        order_id: &str,
        account_id: &str,
        e: &RelayError,
    ) -> bool {
        if !pool.fails_over_on(e) || !has_next(pool, relay) {
            return false;
        }
        let detail = format!(
            "upstream {} refused the order, a refusal the next upstream may not share: {e}",
            relay.name()
        );
        let actor = format!("account:{account_id}");
        let audit = NewAuditRow {
            profile: Some(profile),
            account_id: Some(account_id),
            order_id: Some(order_id),
            problem_type: e
                .problem_type
                .as_deref()
                .and_then(ProblemType::from_urn)
                .map(ProblemType::name),
            detail: Some(&detail),
            ..NewAuditRow::new(
                self.clock.unix(),
                AuditEvent::OrderUpstreamMoved,
                AuditOutcome::Success,
                &actor,
            )
        };
        match self.record_move(&audit, None, relay).await {
            Ok(true) => {
                tracing::warn!(
                    event = "relay.failover",
                    outcome = "passed_on",
                    profile,
                    order = %order_id,
                    upstream = relay.name(),
                    error = %e,
                    "the upstream refused the order; the next upstream is asked"
                );
                true
            }
            Ok(false) => false,
            Err(err) => {
                tracing::error!(event = "relay.failover", outcome = "failure", profile, order = %order_id, error = %err, "could not pass the refused order on");
                false
            }
        }
    }

    /// The upstream a new upstream order of `profile` goes to: the first
    /// in priority order that is neither paused nor down (its breaker
    /// open), after `moved_from` (an order that moved off an upstream
    /// goes on down the list, never back). With `may_probe` (a job), an
    /// upstream whose probe is due is probed, and taken when it answers:
    /// so orders go back to a preferred upstream once it is up. When
    /// every one waits, the job waits for the first to be back.
    pub(super) async fn pick_upstream<'r>(
        &self,
        profile: &str,
        pool: &'r dyn Deferred,
        may_probe: bool,
        moved_from: Option<&str>,
        certificate_profile: Option<&str>,
    ) -> Result<&'r dyn Upstream, Outcome> {
        let mut first_back: Option<time::OffsetDateTime> = None;
        let mut failed: Option<Outcome> = None;
        let mut unoffered: Option<&str> = None;
        let all = pool.upstreams();
        let skip = moved_from
            .and_then(|from| all.iter().position(|u| u.name() == from))
            .map_or(0, |at| at + 1);
        for (i, relay) in all.into_iter().enumerate().skip(skip) {
            // One that does not offer the order's certificate profile would
            // issue its default instead (what newOrder refuses): passed
            // over. Asked from the directory read before, if any.
            if let Some(name) = certificate_profile
                && relay.offers_profile(name).await == Some(false)
            {
                unoffered = Some(name);
                continue;
            }
            match self.upstream_gate(profile, relay, may_probe).await {
                Ok(()) => {
                    if i > 0 {
                        tracing::info!(
                            event = "relay.failover",
                            outcome = "success",
                            profile,
                            upstream = relay.name(),
                            "the upstreams before this one are down or paused; the new order goes here"
                        );
                    }
                    return Ok(relay);
                }
                Err(Outcome::Wait(at)) => {
                    first_back = Some(first_back.map_or(at, |t| t.min(at)));
                }
                // Its probe failed, or its state could not be read: the
                // next one may take the order.
                Err(other) => {
                    failed.get_or_insert(other);
                }
            }
        }
        Err(match (first_back, failed, unoffered) {
            (Some(at), ..) => Outcome::Wait(at),
            (None, Some(other), _) => other,
            (None, None, Some(name)) => Outcome::Failed(format!(
                "no upstream the order may go to offers the certificate profile {name:?}"
            )),
            (None, None, None) => Outcome::Wait(self.clock.now() + Duration::from_secs(1)),
        })
    }

    /// `result`, after counting it for the upstream's breaker.
    async fn heard<T>(
        &self,
        profile_name: &str,
        relay: &dyn Upstream,
        result: Result<T, RelayError>,
    ) -> Result<T, RelayError> {
        self.upstream_heard(profile_name, relay, result.as_ref().err())
            .await;
        result
    }

    /// The job outcome for an attempt's error; an upstream that asked us to
    /// come back later (`Retry-After`) is paused for every job first.
    async fn relay_failed(
        &self,
        profile_name: &str,
        relay: &dyn Upstream,
        e: RelayError,
    ) -> Outcome {
        if let (false, Some(after)) = (e.is_permanent(), e.retry_after) {
            self.pause_upstream(profile_name, relay.name(), after).await;
        }
        if let Some(name) = &e.failed_validation {
            self.count_upstream_failed_validation(profile_name, name, relay)
                .await;
        }
        relay_outcome(e)
    }

    /// Writes the certificate on the local order, the mapping and the audit
    /// row in one transaction.
    async fn settle_relay(
        &self,
        profile: &Profile,
        mapping: &UpstreamOrderRow,
        order: &OrderRow,
        chain_pem: &str,
        certificate_url: &str,
    ) -> Result<(), Outcome> {
        let leaf = match parse_leaf(chain_pem) {
            Ok(leaf) => leaf,
            Err(e) => return Err(Outcome::Failed(e)),
        };
        // The thumbprint of the client's key, for revocation signed by it.
        let thumbprint = match super::csr::csr_key(&mapping.csr_der) {
            Ok((spki, thumb)) => {
                if spki != leaf.spki_der {
                    return Err(Outcome::Failed(
                        "the upstream's leaf is not for the key in the client's CSR".into(),
                    ));
                }
                thumb
            }
            Err(e) => return Err(Outcome::Failed(format!("the stored CSR: {e}"))),
        };
        let now = self.clock.unix();
        let cert_id = crate::ids::object_id(self.clock.unix_ms());
        let actor = format!("account:{}", mapping.account_id);
        let issued: Vec<RawIdentifier> =
            order.identifiers.iter().map(RawIdentifier::from).collect();
        let audit = NewAuditRow {
            profile: Some(&profile.name),
            account_id: Some(&mapping.account_id),
            order_id: Some(&order.id),
            serial: Some(&leaf.serial),
            identifiers: Some(&issued),
            client_ip: mapping.client_ip.as_deref(),
            reverse_name: mapping.reverse_name.as_deref(),
            user_agent: mapping.user_agent.as_deref(),
            request_id: mapping.request_id.as_deref(),
            detail: Some(certificate_url),
            ..NewAuditRow::new(
                now,
                AuditEvent::CertificateIssued,
                AuditOutcome::Success,
                &actor,
            )
        };
        let mut notice = Notice::new(Event::CertificateIssued, &profile.name, now)
            .identifiers(&order.identifiers);
        notice.account = Some(mapping.account_id.clone());
        notice.order = Some(order.id.clone());
        notice.serial = Some(leaf.serial.clone());
        notice.not_after = Some(crate::clock::rfc3339(leaf.not_after));
        let outbox = self.notifier.outbox(&notice);
        let stored = self
            .store
            .settle_relay(
                &NewCertificateRow {
                    id: &cert_id,
                    profile: &profile.name,
                    order_id: &order.id,
                    account_id: &order.account_id,
                    serial: &leaf.serial,
                    chain_pem,
                    key_thumbprint: thumbprint.as_deref(),
                    identifiers: &order.identifiers,
                    not_before: leaf.not_before,
                    not_after: leaf.not_after,
                    now,
                },
                certificate_url,
                &audit,
                &outbox.jobs(),
            )
            .await;
        match stored {
            Ok(true) => {
                crash_point!("relay.settled");
                self.metrics.audited(&audit);
                self.notifier.posted(&outbox);
                tracing::info!(
                    event = "certificate.issued",
                    outcome = "success",
                    profile = %profile.name,
                    account = %mapping.account_id,
                    order = %order.id,
                    serial = %leaf.serial,
                    signer = "relay",
                    "certificate issued by the upstream CA"
                );
                Ok(())
            }
            // Someone else settled it (an operator cancelled meanwhile).
            Ok(false) => Ok(()),
            // Our database refused: the certificate is collected again next
            // attempt (the upstream order stays valid).
            Err(e) => Err(Outcome::Retry(format!("recording the certificate: {e}"))),
        }
    }

    /// Retires a relay for good: order invalid with a generic problem,
    /// mapping invalid with the real reason, audit row. Idempotent. `Err`
    /// when the database did not answer: nothing was written.
    async fn abandon_relay(&self, order_id: &str, reason: &RetireReason) -> Result<(), String> {
        let unread =
            |e: acme_proxy_store::StoreError| format!("reading relayed order {order_id}: {e}");
        let mapping = self.store.upstream_order(order_id).await.map_err(unread)?;
        let order = self.store.order(order_id).await.map_err(unread)?;
        let asked: Option<Vec<RawIdentifier>> = order
            .as_ref()
            .map(|o| o.identifiers.iter().map(RawIdentifier::from).collect());
        let actor = match (reason.cancelled_by(), &mapping) {
            (Some(operator), _) => operator,
            (None, Some(m)) => format!("account:{}", m.account_id),
            (None, None) => "system".to_owned(),
        };
        let detail = reason.to_string();
        let problem = Problem::new(ProblemType::ServerInternal, GENERIC_FAILURE);
        let audit = NewAuditRow {
            profile: mapping.as_ref().map(|m| m.profile.as_str()),
            account_id: mapping.as_ref().map(|m| m.account_id.as_str()),
            order_id: Some(order_id),
            identifiers: asked.as_deref(),
            client_ip: mapping.as_ref().and_then(|m| m.client_ip.as_deref()),
            reverse_name: mapping.as_ref().and_then(|m| m.reverse_name.as_deref()),
            user_agent: mapping.as_ref().and_then(|m| m.user_agent.as_deref()),
            request_id: mapping.as_ref().and_then(|m| m.request_id.as_deref()),
            problem_type: Some(ProblemType::ServerInternal.name()),
            detail: Some(&detail),
            ..NewAuditRow::new(
                self.clock.unix(),
                AuditEvent::CertificateIssueFailed,
                AuditOutcome::Failure,
                &actor,
            )
        };
        let outbox = match &mapping {
            Some(m) => {
                let mut notice = Notice::new(Event::RelayAbandoned, &m.profile, audit.at);
                notice.account = Some(m.account_id.clone());
                notice.order = Some(order_id.to_owned());
                notice.identifiers = order
                    .as_ref()
                    .map(|o| o.identifiers.iter().map(|i| i.value.clone()).collect())
                    .unwrap_or_default();
                notice.detail = Some(detail.clone());
                self.notifier.outbox(&notice)
            }
            None => crate::notify::Outbox::default(),
        };
        match self
            .store
            .abandon_relay(order_id, &problem, &detail, &audit, &outbox.jobs())
            .await
        {
            Ok(true) => {
                crash_point!("relay.abandoned");
                self.metrics.audited(&audit);
                self.notifier.posted(&outbox);
                tracing::warn!(
                    event = "relay.abandoned",
                    outcome = "failure",
                    order = %order_id,
                    actor = %actor,
                    reason = %detail,
                    "relay retired; the order is invalid"
                );
            }
            Ok(false) => {}
            Err(e) => return Err(format!("recording the abandoned relay of {order_id}: {e}")),
        }
        Ok(())
    }
}

/// Whether an upstream comes after `relay` in `pool`: orders move down
/// the list only, and from the last nowhere.
fn has_next(pool: &dyn Deferred, relay: &dyn Upstream) -> bool {
    pool.upstreams()
        .last()
        .is_some_and(|last| last.name() != relay.name())
}

/// Whether a failed upstream newOrder surely made no order: the upstream
/// answered, with a problem document or a `Retry-After`, or refused for
/// good. A timeout or a lost connection may have made one, which the
/// upstream then counted: its budget places are kept.
fn created_nothing(e: &RelayError) -> bool {
    e.is_permanent() || e.problem_type.is_some() || e.retry_after.is_some()
}

/// The job outcome for an attempt's error.
fn relay_outcome(e: RelayError) -> Outcome {
    match (e.is_permanent(), e.retry_after) {
        (true, _) => Outcome::Failed(e.detail),
        (false, Some(after)) => Outcome::RetryAfter(after, e.detail),
        (false, None) => Outcome::Retry(e.detail),
    }
}

/// What settle needs from the upstream's leaf.
struct Leaf {
    serial: String,
    spki_der: Vec<u8>,
    not_before: i64,
    not_after: i64,
}

/// Parses the first certificate of a PEM chain; an error is permanent
/// (the same bytes will not parse next time).
fn parse_leaf(chain_pem: &str) -> Result<Leaf, String> {
    let blocks =
        pem::parse_many(chain_pem).map_err(|e| format!("the upstream's chain is not PEM: {e}"))?;
    let first = blocks
        .iter()
        .find(|b| b.tag() == "CERTIFICATE")
        .ok_or("the upstream's chain holds no certificate")?;
    let (_, cert) = X509Certificate::from_der(first.contents())
        .map_err(|e| format!("the upstream's leaf does not parse: {e}"))?;
    Ok(Leaf {
        serial: hex::encode(cert.raw_serial()),
        spki_der: cert.tbs_certificate.subject_pki.raw.to_vec(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    })
}

/// The handler of [`RELAY_KIND`] jobs: one for every relay profile; the
/// backend is picked per job from the profile the payload names.
#[derive(Debug)]
pub struct RelayJobs {
    pub generations: Generations,
}

impl JobHandler for RelayJobs {
    fn kind(&self) -> &'static str {
        RELAY_KIND
    }

    fn budget(&self, job: &JobRow) -> Option<Duration> {
        let (_, profile) = order_of(job)?;
        let authority = self.generations.authority();
        let relay = authority.profile(&profile)?.signer.issuance().deferred()?;
        // Whichever upstream the attempt goes to.
        let budget = relay.upstreams().iter().map(|u| u.attempt_budget()).max()?;
        Some(budget + SETTLE_MARGIN)
    }

    fn run<'a>(&'a self, job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let Some((order, profile)) = order_of(job) else {
                return Outcome::Failed(format!("payload {:?} names no order", job.payload));
            };
            // A profile this generation does not mount is retried, not
            // failed: a reload that adds it back resumes the relay.
            self.generations
                .authority()
                .relay_attempt(&order, &profile)
                .await
        })
    }

    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            match order_of(job) {
                Some((order, _)) => {
                    self.generations
                        .authority()
                        .abandon_relay(&order, reason)
                        .await
                }
                None => Ok(()),
            }
        })
    }

    /// Re-queues every relay still processing (the identity key makes this
    /// safe to run any number of times).
    fn recover<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let a = self.generations.authority();
            let rows = a
                .store
                .upstream_orders(Some(OrderStatus::Processing), None, RECOVER_BATCH)
                .await
                .map_err(|e| e.to_string())?;
            let mut specs = Vec::with_capacity(rows.len());
            for m in &rows {
                let Some(order) = a
                    .store
                    .order(&m.order_id)
                    .await
                    .map_err(|e| e.to_string())?
                else {
                    continue;
                };
                let mut spec = JobSpec::new(
                    RELAY_KIND,
                    m.order_id.clone(),
                    serde_json::from_str(&payload(&m.order_id, &m.profile))
                        .map_err(|e| e.to_string())?,
                );
                spec.deadline = time::OffsetDateTime::from_unix_timestamp(order.expires_at).ok();
                spec.max_attempts = a
                    .profile(&m.profile)
                    .and_then(|p| p.signer.issuance().deferred())
                    .map(|r| r.max_attempts());
                specs.push(spec);
            }
            queue
                .requeue_lost("relay.recover", specs, RECOVER_BATCH)
                .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_that_will_not_parse_is_a_permanent_failure() {
        assert!(parse_leaf("not pem at all").is_err());
        let garbage = pem::encode(&pem::Pem::new("CERTIFICATE", vec![1, 2, 3]));
        let e = parse_leaf(&garbage).err().unwrap_or_default();
        assert!(e.contains("does not parse"), "{e}");
    }

    #[test]
    fn the_job_payload_names_the_order_and_profile_and_nothing_else() {
        let p: serde_json::Value =
            serde_json::from_str(&payload("o1", "relay")).unwrap_or_default();
        assert_eq!(p, serde_json::json!({"order": "o1", "profile": "relay"}));
    }
}
