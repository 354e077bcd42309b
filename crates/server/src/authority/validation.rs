//! Challenge validation as durable jobs (RFC 8555 §7.5.1: the server
//! validates after the client's trigger, off the request path).
//!
//! The trigger moves the challenge to `processing` and queues the job in
//! one transaction. The job validates and records the outcome; a validation
//! that was running when the process died is reclaimed by the next runner
//! after one lease. A job that is retired for good (it kept failing for
//! reasons of ours, or its authorization expired meanwhile) settles the
//! challenge `invalid` with `serverInternal`, so no order waits forever.

use acme_proxy_protocol::types::{ChallengeStatus, IdentifierType};
use std::time::Duration;

use acme_proxy_protocol::{Problem, ProblemType};
use acme_proxy_store::JobRow;

use crate::events::Event;
use crate::generation::Generations;
use crate::jobs::{BoxFuture, JobHandler, JobSpec, Outcome, Queue, RetireReason};
use crate::notify::Notice;
use crate::validators::ValidationTarget;

/// The job kind; the key is the challenge id.
pub const VALIDATION_KIND: &str = crate::jobs::JobKind::ChallengeValidation.as_str();

/// Interrupted validations picked up per start (the rest at the next).
const RECOVER_BATCH: i64 = 10_000;

/// The handler of [`VALIDATION_KIND`] jobs.
#[derive(Debug)]
pub struct ValidationJobs {
    pub generations: Generations,
}

fn challenge_id(job: &JobRow) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(&job.payload)
        .ok()?
        .get("challenge")?
        .as_str()
        .map(str::to_owned)
}

impl JobHandler for ValidationJobs {
    fn kind(&self) -> &'static str {
        VALIDATION_KIND
    }

    /// The validation's own timeout plus room to record the outcome.
    fn budget(&self, _job: &JobRow) -> Option<Duration> {
        Some(self.generations.authority().validators.timeout + Duration::from_secs(10))
    }

    fn run<'a>(&'a self, job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let a = &self.generations.authority();
            let Some(id) = challenge_id(job) else {
                return Outcome::Failed(format!("payload {:?} names no challenge", job.payload));
            };
            let (ch, authz, thumbprint) = match a.store.challenge_to_validate(&id).await {
                Ok(Some(found)) => found,
                Ok(None) => return Outcome::Done,
                Err(e) => return Outcome::Retry(format!("reading the challenge: {e}")),
            };
            // Already settled (a previous attempt got this far): nothing to do.
            if ch.status != ChallengeStatus::Processing {
                return Outcome::Done;
            }
            // A profile taken out by a reload may come back (its orders
            // are kept for it): the validation waits for it, as a relay
            // job does, rather than failing the client's challenge.
            let Some(profile) = a.profile(&authz.profile).cloned() else {
                return Outcome::Hold(format!("profile {} is not mounted", authz.profile));
            };
            let refused = super::orders::not_offered(&profile, &ch);
            let result = if let Some(refused) = &refused {
                // Triggered while the profile offered it; the method has
                // been turned off since, so it settles nothing valid.
                tracing::info!(event = "validation.finished", outcome = "invalid", profile = %profile.name, challenge = %ch.id, kind = %ch.kind, error = %refused.detail, "validation refused: the type is no longer offered");
                Err(Problem::new(refused.kind, refused.detail.clone()))
            } else if profile.config.bypass {
                Ok(())
            } else {
                let target = ValidationTarget {
                    identifier: authz.identifier.value.clone(),
                    token: ch.token.clone(),
                    key_authorization: format!("{}.{}", ch.token, thumbprint),
                };
                let started = std::time::Instant::now();
                let mut r = a.validators.validate(ch.kind, &target).await;
                if r.is_ok() && profile.config.caa {
                    // RFC 8659 §3: checked when the name is validated.
                    let account_uri = a.account_url(&profile.name, &authz.account_id);
                    let request = crate::validators::caa::CaaRequest {
                        name: &authz.identifier.value,
                        wildcard: authz.wildcard,
                        identities: &profile.config.caa_identities,
                        account_uri: &account_uri,
                        method: ch.kind.as_str(),
                    };
                    if authz.identifier.kind == IdentifierType::Dns {
                        r = crate::validators::caa::check(&a.validators, &request).await;
                    }
                }
                // The label is the status the challenge settles in (§7.1.6).
                let outcome = if r.is_ok() {
                    ChallengeStatus::Valid
                } else {
                    ChallengeStatus::Invalid
                };
                a.metrics
                    .validations
                    .get_or_create(&vec![
                        ("type", ch.kind.as_str().to_owned()),
                        ("outcome", outcome.as_str().to_owned()),
                    ])
                    .inc();
                a.metrics
                    .validation_seconds
                    .get_or_create(&vec![("type", ch.kind.as_str().to_owned())])
                    .observe(started.elapsed().as_secs_f64());
                tracing::info!(
                    event = "validation.finished",
                    outcome = outcome.as_str(),
                    profile = %profile.name,
                    challenge = %ch.id,
                    kind = %ch.kind,
                    identifier = %target.identifier,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    error = r.as_ref().err().map(|e| e.detail.as_str()),
                    "validation finished"
                );
                r.map_err(|e| Problem::new(e.kind, e.detail))
            };
            // A failed challenge is told in the transaction that records it.
            let outbox = match &result {
                Err(p) => {
                    let mut notice =
                        Notice::new(Event::ChallengeFailed, &profile.name, a.clock.unix());
                    notice.account = Some(authz.account_id.clone());
                    notice.challenge = Some(ch.id.clone());
                    notice.identifiers = vec![authz.identifier.value.clone()];
                    notice.detail = Some(format!(
                        "{}: {}",
                        ch.kind,
                        p.detail.as_deref().unwrap_or_default()
                    ));
                    a.notifier.outbox(&notice)
                }
                Ok(()) => crate::notify::Outbox::default(),
            };
            // Counted before the failure is visible: a new order that
            // follows it sees the count. Not when the operator turned the
            // method off: that is no failure of the client's.
            // The account is read only then (its overrides may set the
            // limit), and as the count is, best effort: a read that fails
            // does not throw the finished validation away.
            if result.is_err() && refused.is_none() {
                match a.store.account(&authz.account_id).await {
                    Ok(Some(account)) => {
                        a.count_failed_validation(&account, &authz.identifier.value)
                            .await;
                    }
                    // Gone since: nothing to count against.
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(event = "ratelimit.take", outcome = "failure", account = %authz.account_id, error = %e, "could not read the account to count a failed validation");
                    }
                }
            }
            match a.settle(&profile, &ch, result, &outbox.jobs()).await {
                Ok(true) => {
                    crash_point!("challenge.settled");
                    a.notifier.posted(&outbox);
                    Outcome::Done
                }
                Ok(false) => Outcome::Done,
                // Our database refused: validate again next attempt.
                Err(e) => Outcome::Retry(format!("recording the outcome: {:?}", e.internal)),
            }
        })
    }

    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let a = &self.generations.authority();
            let Some(id) = challenge_id(job) else {
                return Ok(());
            };
            let problem = Problem::new(
                ProblemType::ServerInternal,
                "the server could not complete this validation; create a new order to try again",
            );
            let now = a.clock.unix();
            match a
                .store
                .settle_challenge(&id, Err(&problem), now, now, &[])
                .await
            {
                Ok(true) => tracing::warn!(
                    event = "validation.abandoned",
                    outcome = "failure",
                    challenge = %id,
                    reason = %reason,
                    "validation retired; the challenge is invalid"
                ),
                Ok(false) => {}
                Err(e) => return Err(format!("marking challenge {id} invalid: {e}")),
            }
            Ok(())
        })
    }

    /// Re-queues a job for every challenge left `processing` without one
    /// (the identity key makes this safe to run any number of times).
    fn recover<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let pending = self
                .generations
                .authority()
                .store
                .orphaned_processing_challenges(VALIDATION_KIND, RECOVER_BATCH)
                .await
                .map_err(|e| e.to_string())?;
            let specs = pending
                .iter()
                .map(|p| {
                    let mut spec = JobSpec::new(
                        VALIDATION_KIND,
                        p.challenge.id.clone(),
                        serde_json::json!({ "challenge": p.challenge.id }),
                    );
                    spec.deadline =
                        time::OffsetDateTime::from_unix_timestamp(p.authorization.expires_at).ok();
                    spec.fair_key = Some(p.authorization.account_id.clone());
                    spec
                })
                .collect();
            queue
                .requeue_lost("validation.recover", specs, RECOVER_BATCH)
                .await
        })
    }
}
