//! The audit trail's writer for the authority: one row per issuance and per
//! refusal after authentication, each bumping the
//! matching metric from the same record.
//!
//! What a client sent is bounded here before it is written (`bounded`):
//! each identifier's type and value, the identifiers of a refusal (the
//! first [`bounded::IDENTIFIERS`], their number in the detail), and the
//! detail, whose problem text may quote the client.

use acme_proxy_protocol::types::RawIdentifier;
use acme_proxy_store::{AuditEvent, AuditOutcome, NewAuditRow, StoreError};

use super::{Authority, RequestContext};
use crate::bounded;
use crate::error::AcmeError;

/// A request whose nonce turned out used before (found when its refusal's
/// row was about to be written, `Store::spending_nonce`) is answered
/// `badNonce`, as when the nonce is refused up front: not as the refusal
/// the row would have recorded.
fn replayed_not_audited(event: AuditEvent) {
    tracing::debug!(
        audit_event = %event,
        "not audited: the request's nonce was used before"
    );
}

/// What one audit row says, before the request context is added.
#[derive(Debug)]
pub(crate) struct Fact<'a> {
    pub event: AuditEvent,
    pub outcome: AuditOutcome,
    pub profile: &'a str,
    pub account: Option<&'a str>,
    /// Who acted, when not the account (e.g. a certificate's own key).
    pub actor: Option<&'a str>,
    pub order: Option<&'a str>,
    pub serial: Option<&'a str>,
    /// As sent (a refusal) or as checked (an issuance, converted).
    pub identifiers: Option<&'a [RawIdentifier]>,
    /// A refusal: its problem type and (operator-only) detail.
    pub error: Option<&'a AcmeError>,
    pub detail: Option<&'a str>,
}

/// What an audit row adds to its [`Fact`]: who, when, and where the
/// request came from (owned, so that the row can be written inside another
/// store transaction).
#[derive(Debug)]
pub(crate) struct AuditContext {
    at: i64,
    ctx: RequestContext,
    actor: String,
    detail: Option<String>,
    reverse_name: Option<String>,
    /// The fact's identifiers, bounded, when they had to be.
    identifiers: Option<Vec<RawIdentifier>>,
}

impl<'a> Fact<'a> {
    /// What happened in `profile`; the caller fills in what else it knows.
    pub fn new(event: AuditEvent, outcome: AuditOutcome, profile: &'a str) -> Self {
        Self {
            event,
            outcome,
            profile,
            account: None,
            actor: None,
            order: None,
            serial: None,
            identifiers: None,
            error: None,
            detail: None,
        }
    }
}

impl AuditContext {
    /// The row of `fact`: the fact [`Authority::audit_context`] was given,
    /// with at most its order, serial and identifiers filled in since (the
    /// actor and the detail are the context's, and so are the identifiers
    /// when the context had to bound them).
    pub(crate) fn row<'a>(&'a self, fact: &Fact<'a>) -> NewAuditRow<'a> {
        NewAuditRow {
            at: self.at,
            event: fact.event,
            outcome: fact.outcome,
            profile: Some(fact.profile),
            actor: &self.actor,
            account_id: fact.account,
            order_id: fact.order,
            serial: fact.serial,
            identifiers: self.identifiers.as_deref().or(fact.identifiers),
            client_ip: self.ctx.client_ip.as_deref(),
            reverse_name: self.reverse_name.as_deref(),
            user_agent: self.ctx.user_agent.as_deref(),
            request_id: self.ctx.request_id.as_deref(),
            problem_type: fact.error.map(|e| e.kind.name()),
            detail: self.detail.as_deref(),
        }
    }
}

impl Authority {
    /// Writes one audit row of the server's own doing (`actor`), outside
    /// any request: a configuration reload applied or refused.
    pub(crate) async fn audit_server(
        &self,
        event: AuditEvent,
        outcome: AuditOutcome,
        actor: &str,
        detail: &str,
    ) {
        let detail = bounded::text(detail);
        let row = NewAuditRow {
            detail: Some(&detail),
            ..NewAuditRow::new(self.clock.unix(), event, outcome, actor)
        };
        self.audit_row(&row).await;
    }

    /// Writes `row` as it is (the web console's refusals); the metric
    /// moves only if it was written.
    pub(crate) async fn audit_row(&self, row: &NewAuditRow<'_>) {
        match self.store.insert_audit(row).await {
            Ok(()) => self.metrics.audited(row),
            Err(StoreError::NonceReplayed) => replayed_not_audited(row.event),
            Err(e) => tracing::error!(
                event = "audit.write",
                outcome = "failure",
                audit_event = %row.event,
                error = %e,
                "could not write the audit row"
            ),
        }
    }

    /// Writes one audit row for a request of an account, with where the
    /// request came from; the metric moves only if the row was written.
    pub(crate) async fn audit(&self, fact: Fact<'_>) {
        let context = self.audit_context(&fact).await;
        let row = context.row(&fact);
        match self.store.insert_audit(&row).await {
            Ok(()) => self.metrics.audited(&row),
            Err(StoreError::NonceReplayed) => replayed_not_audited(fact.event),
            Err(e) => tracing::error!(
                event = "audit.write",
                outcome = "failure",
                audit_event = %fact.event,
                error = %e,
                "could not write the audit row"
            ),
        }
    }

    /// Everything of `fact`'s audit row that is not in the fact.
    pub(crate) async fn audit_context(&self, fact: &Fact<'_>) -> AuditContext {
        let ctx = RequestContext::current();
        let actor = match (fact.actor, fact.account) {
            (Some(actor), _) => actor.to_owned(),
            (None, Some(a)) => format!("account:{a}"),
            (None, None) => "system".to_owned(),
        };
        // A success records what was checked and done (an issued
        // certificate's names, at most `MAX_IDENTIFIERS`); a refusal may
        // record what a client merely asked for, so it keeps the first few.
        let keep = if fact.outcome == AuditOutcome::Success {
            usize::MAX
        } else {
            bounded::IDENTIFIERS
        };
        let (identifiers, note) = match fact.identifiers {
            Some(ids) if bounded::needs_bounding(ids, keep) => {
                let b = bounded::identifiers(ids, keep);
                let note = b.note();
                (Some(b.kept), note)
            }
            _ => (None, None),
        };
        // The refusal (its problem detail may quote the client), the
        // fact's own detail, and how many identifiers were left out; each
        // part bounded, so the note is never cut off.
        let error = fact.error.map(|e| match &e.internal {
            Some(internal) => format!("{} ({internal})", e.detail),
            None => e.detail.clone(),
        });
        let parts: Vec<String> = [error.as_deref(), fact.detail]
            .into_iter()
            .flatten()
            .map(|p| bounded::text(p).into_owned())
            .chain(note)
            .collect();
        let detail = (!parts.is_empty()).then(|| parts.join("; "));
        // Best-effort and bounded (`audit.reverse_name_timeout`), cached.
        let reverse_name = match ctx.client_ip.as_deref().and_then(|ip| ip.parse().ok()) {
            Some(ip) => self.reverse.lookup(ip).await,
            None => None,
        };
        AuditContext {
            at: self.clock.unix(),
            ctx,
            actor,
            detail,
            reverse_name,
            identifiers,
        }
    }
}

/// Refused for the client's mistakes and policy, failure for ours.
pub(crate) fn outcome_of(e: &AcmeError) -> AuditOutcome {
    if e.kind == acme_proxy_protocol::ProblemType::ServerInternal {
        AuditOutcome::Failure
    } else {
        AuditOutcome::Refused
    }
}
