//! The relay's circuit breaker per upstream: requests that find the
//! upstream down (no answer, a 5xx, a page that is not ACME) are counted
//! in the database, shared by every job and replica; at the profile's
//! `breaker_failures` in a row the breaker opens and relays wait in the
//! queue (the wait is not an attempt) instead of asking. Every
//! `breaker_open_for`, one job claims the probe (the directory, then a fresh nonce):
//! an answer closes the breaker and that job carries on, no answer opens
//! it again. Any answer at any time closes it: the upstream is up. A job
//! of its own (`upstream_probe`) probes while no relay waits, so that an
//! idle profile's breaker closes when the upstream is back too.

use std::time::Duration;

use acme_proxy_store::{BreakerFailure, BreakerRow, BreakerState, JobRow};

use super::{Authority, Profile};
use crate::generation::Generations;
use crate::jobs::{BoxFuture, JobHandler, JobSpec, Outcome, Queue, RetireReason};
use crate::signer::Upstream;
use crate::signer::relay::RelayError;

/// The job kind that probes an open breaker while no relay waits on it;
/// the key is the profile and the upstream, `PROFILE/UPSTREAM`.
pub const UPSTREAM_PROBE_KIND: &str = crate::jobs::JobKind::UpstreamProbe.as_str();

/// The probe job's key: one per upstream of a profile.
fn probe_key(profile: &str, upstream: &str) -> String {
    format!("{profile}/{upstream}")
}

/// Attempts of a probe job: it ends when the breaker closes, however long
/// the outage.
const PROBE_ATTEMPTS: u32 = 1_000_000;

impl Authority {
    /// Whether `profile`'s upstream `relay` may be sent a request now: not
    /// while it is paused (its `Retry-After`) or its breaker is open, when
    /// the job waits. An open breaker whose time has come is probed here
    /// when `may_probe` (a job; a client's finalize leaves it to the job).
    pub(super) async fn upstream_gate(
        &self,
        profile: &str,
        relay: &dyn Upstream,
        may_probe: bool,
    ) -> Result<(), Outcome> {
        self.upstream_open(profile, relay.name()).await?;
        let directory = relay.directory();
        let row = match self.store.breaker(profile, directory).await {
            Ok(row) => row,
            Err(e) => {
                return Err(Outcome::Retry(format!(
                    "reading the upstream's breaker: {e}"
                )));
            }
        };
        let Some(row) = row.filter(|r| r.state != BreakerState::Closed) else {
            return Ok(());
        };
        let now_ms = self.clock.unix_ms();
        if row.retry_at > now_ms || !may_probe {
            return Err(self.breaker_wait(profile, &row, now_ms));
        }
        // The claim lapses after the probe's two requests and a second, so
        // that a probe whose process died is taken up by another.
        let lease_ms = i64::try_from(relay.request_timeout().as_millis())
            .unwrap_or(i64::MAX)
            .saturating_mul(2)
            .saturating_add(1000);
        match self
            .store
            .claim_breaker_probe(profile, directory, now_ms, now_ms.saturating_add(lease_ms))
            .await
        {
            Ok(true) => {}
            // Another job got there first: its probe may have closed the
            // breaker already, or be under way.
            Ok(false) => {
                return match self.store.breaker(profile, directory).await {
                    Ok(Some(row)) if row.state != BreakerState::Closed => {
                        Err(self.breaker_wait(profile, &row, self.clock.unix_ms()))
                    }
                    Ok(_) => Ok(()),
                    Err(e) => Err(Outcome::Retry(format!(
                        "reading the upstream's breaker: {e}"
                    ))),
                };
            }
            Err(e) => return Err(Outcome::Retry(format!("claiming the breaker's probe: {e}"))),
        }
        self.metrics
            .breaker_changed(profile, relay.name(), BreakerState::Probing);
        tracing::info!(
            event = "relay.breaker",
            outcome = "probing",
            profile,
            upstream = relay.name(),
            directory,
            "asking whether the upstream is back"
        );
        let probed = relay.probe().await;
        let after = self
            .upstream_heard(profile, relay, probed.as_ref().err())
            .await;
        match probed {
            Ok(()) => Ok(()),
            // Up, and asking for a pause: everyone waits for it.
            Err(RelayError {
                retry_after: Some(after),
                ..
            }) => {
                self.pause_upstream(profile, relay.name(), after).await;
                Err(Outcome::Wait(self.clock.now() + after))
            }
            Err(e) => match after {
                Some(row) => Err(self.breaker_wait(profile, &row, self.clock.unix_ms())),
                None => Err(Outcome::Retry(e.detail)),
            },
        }
    }

    /// Counts what a request to `profile`'s upstream `relay` met: `failed` when it
    /// failed, None when it was answered. A failure that shows the
    /// upstream down counts towards opening the breaker; any other
    /// outcome shows it up, and closes it. Returns the breaker after a
    /// failure. A database error is logged: the breaker is advice.
    pub(super) async fn upstream_heard(
        &self,
        profile: &str,
        relay: &dyn Upstream,
        failed: Option<&RelayError>,
    ) -> Option<BreakerRow> {
        let directory = relay.directory();
        let now_ms = self.clock.unix_ms();
        match failed {
            Some(e) if e.unreachable => {
                let (threshold, open_for) = relay.breaker();
                let failure = BreakerFailure {
                    profile,
                    directory,
                    now_ms,
                    error: &e.detail,
                    threshold: i64::from(threshold),
                    open_until_ms: now_ms
                        .saturating_add(i64::try_from(open_for.as_millis()).unwrap_or(i64::MAX)),
                };
                match self.store.breaker_failed(&failure).await {
                    Ok((was, row)) => {
                        if row.state == BreakerState::Open && was != BreakerState::Open {
                            self.queue_probe(profile, relay.name(), row.retry_at).await;
                            self.metrics
                                .breaker_changed(profile, relay.name(), BreakerState::Open);
                            tracing::warn!(
                                event = "relay.breaker",
                                outcome = "opened",
                                profile,
                                upstream = relay.name(),
                                directory,
                                failures = row.failures,
                                probe_in_ms = row.retry_at - now_ms,
                                error = %e,
                                "the upstream is down; relays wait and one probe asks whether it is back"
                            );
                        }
                        Some(row)
                    }
                    Err(err) => {
                        tracing::error!(event = "relay.breaker", outcome = "failure", profile, error = %err, "could not count the upstream's failure");
                        None
                    }
                }
            }
            _ => {
                // A read first: the breaker is closed with no failures
                // nearly always, and then nothing is written.
                match self.store.breaker(profile, directory).await {
                    Ok(Some(row)) if row.state != BreakerState::Closed || row.failures > 0 => {}
                    Ok(_) => return None,
                    Err(err) => {
                        tracing::error!(event = "relay.breaker", outcome = "failure", profile, error = %err, "could not read the upstream's breaker");
                        return None;
                    }
                }
                match self
                    .store
                    .breaker_answered(profile, directory, now_ms)
                    .await
                {
                    Ok(Some(was)) if was != BreakerState::Closed => {
                        self.metrics
                            .breaker_changed(profile, relay.name(), BreakerState::Closed);
                        tracing::info!(
                            event = "relay.breaker",
                            outcome = "closed",
                            profile,
                            upstream = relay.name(),
                            directory,
                            "the upstream answers again; relays go on"
                        );
                    }
                    Ok(_) => {}
                    Err(err) => {
                        tracing::error!(event = "relay.breaker", outcome = "failure", profile, error = %err, "could not record the upstream's answer");
                    }
                }
                None
            }
        }
    }

    /// Queues the probe job of `profile`'s upstream `upstream` for `at_ms`
    /// (a no-op while one is queued: the job looks at the breaker when it
    /// runs).
    async fn queue_probe(&self, profile: &str, upstream: &str, at_ms: i64) {
        let mut spec = JobSpec::new(
            UPSTREAM_PROBE_KIND,
            probe_key(profile, upstream),
            serde_json::json!({ "profile": profile, "upstream": upstream }),
        );
        spec.run_at =
            time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(at_ms) * 1_000_000).ok();
        spec.max_attempts = Some(PROBE_ATTEMPTS);
        if let Err(e) = self.queue.enqueue(spec).await {
            tracing::error!(event = "relay.breaker", outcome = "failure", profile, error = %e, "could not queue the upstream's probe");
        }
    }

    /// The probe job's run: probes `profile`'s upstream `upstream` when
    /// its breaker's time has come. Done once the breaker is closed (or
    /// the upstream gone); otherwise again at the breaker's next time.
    async fn probe_upstream(&self, profile_name: &str, upstream: &str) -> Outcome {
        let Some(profile) = self.profile(profile_name).cloned() else {
            return Outcome::Done;
        };
        let Some(relay) = profile
            .signer
            .issuance()
            .deferred()
            .and_then(|d| d.upstream(Some(upstream)))
        else {
            return Outcome::Done;
        };
        match self.upstream_gate(profile_name, relay, true).await {
            // A relay may have opened the breaker again meanwhile, and its
            // queueing of a probe found this job still live: look once
            // more before ending, so that an idle profile keeps its probe.
            Ok(()) => match self.upstream_down(&profile, Some(upstream)).await {
                Some(row) => Outcome::Reschedule(
                    self.clock.now()
                        + Duration::from_millis(
                            u64::try_from(row.retry_at - self.clock.unix_ms()).unwrap_or(0),
                        ),
                ),
                None => Outcome::Done,
            },
            Err(Outcome::Wait(at)) => Outcome::Reschedule(at),
            Err(other) => other,
        }
    }

    /// The open (or probing) breaker of `profile`'s upstream `upstream`
    /// (None: the preferred one), if it is a relay profile whose upstream
    /// was found down: what a client's request (a profile check at
    /// newOrder, renewal information, a revocation) does not wait on.
    pub(super) async fn upstream_down(
        &self,
        profile: &Profile,
        upstream: Option<&str>,
    ) -> Option<BreakerRow> {
        let relay = profile.signer.issuance().deferred()?.upstream(upstream)?;
        match self.store.breaker(&profile.name, relay.directory()).await {
            Ok(Some(row)) if row.state != BreakerState::Closed => Some(row),
            _ => None,
        }
    }

    /// The upstream of relay profile `profile` that issued the certificate
    /// of `order_id` (None: the preferred one, or not a relay profile).
    pub(super) async fn issuing_upstream(
        &self,
        profile: &Profile,
        order_id: &str,
    ) -> Option<String> {
        profile.signer.issuance().deferred()?;
        match self.store.relayed_by(order_id).await {
            Ok(upstream) => upstream,
            Err(e) => {
                tracing::warn!(event = "relay.upstream", outcome = "failure", profile = %profile.name, order = %order_id, error = %e, "could not read which upstream issued the certificate; asking the preferred one");
                None
            }
        }
    }

    /// The job's wait for an open breaker: until its probe may go. While
    /// another job probes, it looks again within a second, so that a probe
    /// that closed the breaker lets everyone on at once.
    fn breaker_wait(&self, profile: &str, row: &BreakerRow, now_ms: i64) -> Outcome {
        let until = match row.state {
            BreakerState::Probing => row.retry_at.min(now_ms.saturating_add(1000)),
            _ => row.retry_at,
        };
        // At most a day: the wait is added to the clock's time.
        let wait_ms = (until - now_ms).clamp(1, 86_400_000);
        tracing::debug!(
            event = "relay.breaker",
            outcome = "deferred",
            profile,
            state = row.state.as_str(),
            wait_ms,
            "the upstream's breaker is open; this relay waits"
        );
        Outcome::Wait(self.clock.now() + Duration::from_millis(u64::try_from(wait_ms).unwrap_or(1)))
    }
}

/// The handler of [`UPSTREAM_PROBE_KIND`] jobs.
#[derive(Debug)]
pub struct UpstreamProbes {
    pub generations: Generations,
}

impl JobHandler for UpstreamProbes {
    fn kind(&self) -> &'static str {
        UPSTREAM_PROBE_KIND
    }

    fn run<'a>(&'a self, job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let authority = self.generations.authority();
            let payload: serde_json::Value = serde_json::from_str(&job.payload).unwrap_or_default();
            let field = |name: &str| payload.get(name).and_then(serde_json::Value::as_str);
            // A probe queued before upstreams had names: the preferred one.
            let Some(profile) = field("profile") else {
                return Outcome::Failed(format!("payload {:?} names no profile", job.payload));
            };
            let upstream = match field("upstream") {
                Some(u) => u.to_owned(),
                None => match authority
                    .profile(profile)
                    .and_then(|p| p.signer.issuance().deferred())
                    .and_then(|d| d.upstream(None))
                {
                    Some(u) => u.name().to_owned(),
                    None => return Outcome::Done,
                },
            };
            authority.probe_upstream(profile, &upstream).await
        })
    }

    fn abandon<'a>(
        &'a self,
        _job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        tracing::warn!(event = "relay.breaker", outcome = "failure", reason = %reason, "an upstream's probe job was retired; relays still probe when they run");
        Box::pin(async { Ok(()) })
    }

    /// Queues the probe of every mounted upstream whose breaker is not
    /// closed (the identity key makes this safe on every start).
    fn recover<'a>(&'a self, _queue: &'a Queue) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let authority = self.generations.authority();
            let rows = authority
                .store
                .breakers()
                .await
                .map_err(|e| e.to_string())?;
            for row in rows.into_iter().filter(|r| r.state != BreakerState::Closed) {
                let mounted = authority
                    .profile(&row.profile)
                    .and_then(|p| p.signer.issuance().deferred())
                    .and_then(|relay| {
                        relay
                            .upstreams()
                            .into_iter()
                            .find(|u| u.directory() == row.directory)
                            .map(|u| u.name().to_owned())
                    });
                if let Some(upstream) = mounted {
                    authority
                        .queue_probe(&row.profile, &upstream, row.retry_at)
                        .await;
                }
            }
            Ok(())
        })
    }
}
