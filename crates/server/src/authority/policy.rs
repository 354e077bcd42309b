//! `[policy]` at its three stages: the connection (every request to a
//! profile, before anything is read), newOrder and finalize (each
//! identifier). The engine is `crate::policy`; here its decisions become
//! RFC 8555 problems, audit rows, log lines and metrics.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use acme_proxy_protocol::types::{Identifier, RawIdentifier};
use acme_proxy_protocol::{ProblemType, Subproblem};
use acme_proxy_store::{AccountRow, AuditEvent, AuditOutcome};

use super::audit::Fact;
use super::{Authority, RequestContext};
use crate::config::Stage;
use crate::error::{AcmeError, AcmeResult};
use crate::policy::{Evaluation, Subject, Verdict};

/// How long a client is told to wait when the policy could not decide:
/// long enough for a restarted system of record, short enough that an
/// ACME client's retry finds it back.
const UNDECIDED_RETRY_AFTER: u64 = 10;

/// The most one request's stage may spend in checks (a check program per
/// identifier adds up): past it the decision is undecided, so a request
/// holds its admission slot for a bounded time.
const STAGE_BUDGET: Duration = Duration::from_secs(15);

/// One `policy.refused`, `policy.undecided` or `policy.warned` row per
/// client address, event and rule in this window at the connection stage:
/// anyone can send requests there, and they must not grow the audit trail
/// without bound (each is still logged and counted).
const CONNECTION_AUDIT_EVERY: i64 = 60;

/// Addresses remembered for that; past it the memory starts again.
const CONNECTION_AUDIT_REMEMBERED: usize = 10_000;

/// When each (client address, event and rule) last got a connection-stage
/// audit row.
#[derive(Debug, Default)]
pub(super) struct AuditedRefusals(Mutex<HashMap<(String, String), i64>>);

impl AuditedRefusals {
    /// Whether a row is due for `client` and `what` (an event and its
    /// rule) at `now`, and if so, remembers it.
    fn due(&self, client: &str, what: &str, now: i64) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key = (client.to_owned(), what.to_owned());
        if seen
            .get(&key)
            .is_some_and(|at| now.saturating_sub(*at) < CONNECTION_AUDIT_EVERY)
        {
            return false;
        }
        if seen.len() >= CONNECTION_AUDIT_REMEMBERED {
            seen.clear();
        }
        seen.insert(key, now);
        true
    }
}

/// What the identifier stages found: the refused identifiers as
/// subproblems, and for the audit row why.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    pub faults: Vec<Subproblem>,
    pub reasons: Vec<String>,
}

impl Authority {
    /// The connection stage for a request to `profile`: `unauthorized`
    /// when a rule refuses it, 503 with `Retry-After` when the policy
    /// cannot decide. Both are audited.
    pub async fn admit(&self, profile: &str) -> AcmeResult<()> {
        if !self.policy.matters_at(Stage::Connection, profile) {
            return Ok(());
        }
        let ctx = RequestContext::current();
        let subject = Subject {
            profile,
            client_ip: client_ip(&ctx),
            ..Subject::default()
        };
        let e = match tokio::time::timeout(
            STAGE_BUDGET,
            self.policy.evaluate(Stage::Connection, &subject),
        )
        .await
        {
            Ok(e) => e,
            Err(_) => self.policy.out_of_time(Stage::Connection, STAGE_BUDGET),
        };
        e.count(&self.metrics);
        let (event, outcome, refusal) = match e.verdict {
            Verdict::Allow if e.warned.is_none() => return Ok(()),
            Verdict::Allow => (AuditEvent::PolicyWarned, AuditOutcome::Success, None),
            Verdict::Deny => (
                AuditEvent::PolicyRefused,
                AuditOutcome::Refused,
                Some(AcmeError::unauthorized(e.message.clone())),
            ),
            Verdict::Undecided => (
                AuditEvent::PolicyUndecided,
                AuditOutcome::Failure,
                Some(undecided(&e)),
            ),
        };
        let summary = e.summary();
        log(&e, profile, &summary);
        // A warn rule at the connection sees every request of a client
        // it would refuse, polling included: warnings are held to the
        // same one row a minute as refusals.
        let client = ctx.client_ip.as_deref().unwrap_or("");
        if self.audited_refusals.due(
            client,
            &format!("{event}:{}", e.rule_name()),
            self.clock.unix(),
        ) {
            self.audit(Fact {
                detail: Some(&summary),
                ..Fact::new(event, outcome, profile)
            })
            .await;
        }
        match refusal {
            Some(r) => Err(r),
            None => Ok(()),
        }
    }

    /// newOrder's or finalize's stage over `identifiers` for `account`:
    /// the refused ones, or 503 with `Retry-After` when the policy cannot
    /// decide one of them. A `warn` rule's would-be refusals are audited
    /// here (one `policy.warned` row); refusals by the caller's row.
    pub(super) async fn policy_refusals(
        &self,
        stage: Stage,
        profile: &str,
        account: &AccountRow,
        identifiers: &[Identifier],
    ) -> AcmeResult<Refusals> {
        let mut refusals = Refusals::default();
        if !self.policy.matters_at(stage, profile) {
            return Ok(refusals);
        }
        let ctx = RequestContext::current();
        let label = match (&account.eab_kid, self.policy.wants_eab_label()) {
            (Some(kid), true) => self.store.eab(kid).await?.and_then(|c| c.label),
            _ => None,
        };
        let evaluated = tokio::time::timeout(
            STAGE_BUDGET,
            self.evaluate_each(stage, profile, account, label.as_deref(), &ctx, identifiers),
        )
        .await
        .unwrap_or_else(|_| Err(undecided(&self.policy.out_of_time(stage, STAGE_BUDGET))))?;
        let mut warned: Vec<(RawIdentifier, String)> = Vec::new();
        for (id, e) in identifiers.iter().zip(evaluated) {
            e.count(&self.metrics);
            match e.verdict {
                Verdict::Allow => {
                    if e.warned.is_some() {
                        let summary = e.summary();
                        log(&e, profile, &summary);
                        warned.push((RawIdentifier::from(id), summary));
                    }
                }
                Verdict::Deny => {
                    let summary = e.summary();
                    log(&e, profile, &summary);
                    refusals.reasons.push(format!("{}: {summary}", id.value));
                    refusals.faults.push(Subproblem::new(
                        ProblemType::RejectedIdentifier,
                        e.message.clone(),
                        id.clone(),
                    ));
                }
                Verdict::Undecided => {
                    let summary = e.summary();
                    log(&e, profile, &summary);
                    let mut err = undecided(&e);
                    err.internal = Some(format!("{}: {summary}", id.value));
                    return Err(err);
                }
            }
        }
        if !warned.is_empty() {
            let (ids, summaries): (Vec<RawIdentifier>, Vec<String>) = warned.into_iter().unzip();
            let detail = summaries.join("; ");
            self.audit(Fact {
                account: Some(&account.id),
                identifiers: Some(&ids),
                detail: Some(&detail),
                ..Fact::new(AuditEvent::PolicyWarned, AuditOutcome::Success, profile)
            })
            .await;
        }
        Ok(refusals)
    }
}

impl Authority {
    /// Each identifier's evaluation, in order.
    async fn evaluate_each(
        &self,
        stage: Stage,
        profile: &str,
        account: &AccountRow,
        label: Option<&str>,
        ctx: &RequestContext,
        identifiers: &[Identifier],
    ) -> AcmeResult<Vec<Evaluation>> {
        let mut out = Vec::with_capacity(identifiers.len());
        for id in identifiers {
            let subject = crate::policy::Subject {
                profile,
                client_ip: client_ip(ctx),
                account: Some(&account.id),
                eab: account.eab_kid.as_deref().map(|kid| (kid, label)),
                identifier: Some(id),
            };
            out.push(self.policy.evaluate(stage, &subject).await);
        }
        Ok(out)
    }
}

/// The 503 of an undecided policy; its reason goes to the audit row.
fn undecided(e: &Evaluation) -> AcmeError {
    let mut err = AcmeError::new(ProblemType::ServerInternal, e.message.clone()).with_status(503);
    err.retry_after = Some(UNDECIDED_RETRY_AFTER);
    err.internal = Some(e.summary());
    err
}

fn client_ip(ctx: &RequestContext) -> Option<IpAddr> {
    ctx.client_ip.as_deref().and_then(|ip| ip.parse().ok())
}

fn log(e: &Evaluation, profile: &str, summary: &str) {
    let outcome = match (e.verdict, &e.warned) {
        (Verdict::Allow, _) => "warning",
        (Verdict::Deny, _) => "refused",
        (Verdict::Undecided, _) => "failure",
    };
    tracing::info!(
        event = "policy.decision",
        outcome,
        profile = %profile,
        stage = %e.stage,
        rule = %e.rule_name(),
        "{summary}"
    );
}
