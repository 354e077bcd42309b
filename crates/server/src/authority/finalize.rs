//! Finalization (RFC 8555 §7.4): the order's checks and the CSR's, then
//! one question to the signer — how it issues — and the path its answer
//! picks: signed inside the request and stored with the order's step to
//! valid ([`Issuance::Inline`]); signed inside the request while the order
//! is processing ([`Issuance::Guarded`]); or a durable job (the relay,
//! `super::relay`).

use acme_proxy_protocol::ProblemType;
use acme_proxy_protocol::types::{OrderStatus, RawIdentifier};
use std::time::Duration;

use acme_proxy_store::{
    AccountRow, AuditEvent, AuditOutcome, AuthorizationRow, ChallengeRow, JobRow, NewAuditRow,
    NewCertificateRow, NewJob, OrderRow,
};
use time::OffsetDateTime;

use super::audit::{AuditContext, Fact};
use super::csr::{CheckedCsr, bad_csr, check_csr};
use super::orders::owns_order;
use super::recheck::rechecks_caa;
use super::{Authority, Profile};
use crate::config::{CertificateProfileConfig, ExtendedKeyUsage, Stage};
use crate::error::{AcmeError, AcmeResult};
use crate::events::Event;
use crate::generation::Generations;
use crate::jobs::{BoxFuture, JobHandler, JobObserver, JobSpec, Outcome, Queue, RetireReason};
use crate::notify::{Notice, Outbox};
use crate::signer::{Issuance, IssueContext, IssueRequest, Issued, SignerError};

/// The kind of the job that watches a guarded finalize.
pub const FINALIZE_WATCH_KIND: &str = crate::jobs::JobKind::FinalizeWatch.as_str();

/// How long past the signer's time limit a watch waits before it calls
/// the finalize dead: the storing of the outcome, which may wait for the
/// database, must not be cut off. At least this much, and at least the
/// limit again.
const WATCH_MARGIN: Duration = Duration::from_secs(10);

/// The time limit assumed for an order found processing without a watch
/// (it began under a version without them): the longest any signer may
/// have (a custom program's or a token's `timeout` is at most 60 s).
const LONGEST_SIGNING: Duration = Duration::from_secs(60);

/// A watch retries a database that is down rather than give up on an
/// order.
const WATCH_ATTEMPTS: u32 = 1_000_000;

/// Start-up recovery reads at most this many unwatched orders.
const RECOVER_BATCH: i64 = 10_000;

/// When after its start a guarded finalize with this time limit is dead.
fn watch_after(within: Duration) -> Duration {
    within + within.max(WATCH_MARGIN)
}

/// What a watch watches: one attempt at finalizing one order, and when it
/// is dead. The time is fixed when the attempt begins, with the limit of
/// the signer that attempt asks: a reload that shortens it, or another
/// replica's configuration, cannot cut a live signing short.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Watch {
    order: String,
    /// The attempt's start (the order's `processing_since`), Unix ms.
    since: i64,
    /// When the attempt is dead, Unix ms.
    due: i64,
}

impl Watch {
    fn of(order: &str, since: i64, within: Duration) -> Watch {
        let after = i64::try_from(watch_after(within).as_millis()).unwrap_or(i64::MAX);
        Watch {
            order: order.to_owned(),
            since,
            due: since.saturating_add(after),
        }
    }

    /// One watch per attempt: a watch of an earlier attempt still queued
    /// (after a badCSR made the order ready again) does not stand in for
    /// this one.
    fn key(&self) -> String {
        format!("{}@{}", self.order, self.since)
    }

    fn payload(&self) -> String {
        serde_json::json!(self).to_string()
    }
}

/// Whether a finalize at `profile`, whose signer answered `issuance`, may
/// sign an order this process created without reading it
/// ([`Authority::ordered_here`]); newOrder keeps a copy only then.
pub(super) fn finalizes_unread(profile: &Profile, issuance: &Issuance<'_>) -> bool {
    matches!(issuance, Issuance::Inline) && !rechecks_caa(profile)
}

/// Logs a certificate the embedded CA signed inside a finalize that could
/// not store it: it never leaves the process, but its serial was used.
fn discarded(profile: &Profile, account: &AccountRow, order: &OrderRow, serial: &str, why: &str) {
    tracing::info!(
        event = "certificate.discarded",
        profile = %profile.name,
        account = %account.id,
        order = %order.id,
        serial = %serial,
        why,
        "a signed certificate is discarded, never stored nor served"
    );
}

/// A finalize past the order's and the CSR's checks, to be signed.
struct Signing<'a> {
    profile: &'a Profile,
    account: &'a AccountRow,
    order: OrderRow,
    csr_der: &'a [u8],
    csr: CheckedCsr,
    /// The order's certificate profile, if the configuration still has it
    /// (an operator may have removed it since: then the signer's defaults
    /// apply).
    usage: Option<&'a CertificateProfileConfig>,
    /// The order's identifiers, for the audit rows.
    identifiers: Vec<RawIdentifier>,
}

impl<'a> Signing<'a> {
    /// The issuance's audit fact (its serial filled in once signed).
    fn issued_fact(&'a self) -> Fact<'a> {
        Fact {
            account: Some(&self.account.id),
            order: Some(&self.order.id),
            identifiers: Some(&self.identifiers),
            ..Fact::new(
                AuditEvent::CertificateIssued,
                AuditOutcome::Success,
                &self.profile.name,
            )
        }
    }

    fn purposes(&self) -> Option<&'a [ExtendedKeyUsage]> {
        self.usage.and_then(|u| u.extended_key_usages.as_deref())
    }
}

impl Authority {
    /// finalize (§7.4). With the embedded CA's key in memory the order goes
    /// ready → valid in the one transaction that stores the certificate;
    /// with a token or an outside signer it is processing while the signer
    /// works. Either way a write guarded on the order being ready (and
    /// `certificates.order_id` being unique) makes two concurrent finalizes
    /// store exactly one certificate.
    /// A bad CSR leaves the order ready. `csr` is the DER, or why the
    /// request gave none that decodes: refused and audited like any
    /// refusal.
    pub async fn finalize(
        &self,
        profile: &Profile,
        account: &AccountRow,
        order_id: &str,
        csr: AcmeResult<&[u8]>,
        ctx: &super::RequestContext,
    ) -> AcmeResult<OrderRow> {
        let result = match csr {
            Ok(csr_der) => {
                self.finalize_checked(profile, account, order_id, csr_der, ctx)
                    .await
            }
            Err(e) => Err(e),
        };
        // Issuance is audited where it happens (finalize_checked, or the
        // relay's job); refusals here, whatever the path.
        match &result {
            Ok(_) => {}
            Err(e) => {
                // Not another account's names in this account's row.
                let identifiers = self
                    .store
                    .order(order_id)
                    .await
                    .ok()
                    .flatten()
                    .filter(|o| o.account_id == account.id)
                    .map(|o| {
                        o.identifiers
                            .iter()
                            .map(RawIdentifier::from)
                            .collect::<Vec<_>>()
                    });
                self.audit(super::audit::Fact {
                    account: Some(&account.id),
                    order: Some(order_id),
                    identifiers: identifiers.as_deref(),
                    error: Some(e),
                    ..Fact::new(
                        AuditEvent::CertificateIssueFailed,
                        super::audit::outcome_of(e),
                        &profile.name,
                    )
                })
                .await;
            }
        }
        result
    }

    async fn finalize_checked(
        &self,
        profile: &Profile,
        account: &AccountRow,
        order_id: &str,
        csr_der: &[u8],
        ctx: &super::RequestContext,
    ) -> AcmeResult<OrderRow> {
        // The signer's answer, asked once, picks the path.
        let issuance = profile.signer.issuance();
        // An order this process created moments ago is signed without a
        // read when the write that stores the certificate checks all that
        // changes (`recent.rs`).
        let (order, read) = match self.ordered_here(profile, account, order_id, &issuance) {
            Some(order) => (order, None),
            None => {
                let (order, authorizations) = self
                    .order_with_authorizations(profile, account, order_id)
                    .await?;
                (order, Some(authorizations))
            }
        };
        // An account whose external account credential was revoked since
        // it ordered finalizes nothing more.
        self.external_account_limits(account, &[]).await?;
        if let Some(authorizations) = &read {
            self.ready_to_finalize(profile, account, &order, authorizations)
                .await?;
        }
        let usage = order
            .certificate_profile
            .as_deref()
            .and_then(|name| profile.config.certificate_profiles.get(name));
        let purposes = usage.and_then(|u| u.extended_key_usages.as_deref());
        let csr = check_csr(
            csr_der,
            &order.identifiers,
            &account.key_thumbprint,
            ExtendedKeyUsage::requestable(purposes),
        )?;
        // `[policy]` again, over the CSR's names (which are the order's):
        // a reload since newOrder may refuse what it allowed.
        let policy = self
            .policy_refusals(Stage::Finalize, &profile.name, account, &order.identifiers)
            .await?;
        if !policy.faults.is_empty() {
            let names: Vec<String> = policy
                .faults
                .iter()
                .map(|f| {
                    format!(
                        "{} ({})",
                        f.identifier.as_ref().map_or("", |i| i.value.as_str()),
                        f.detail.as_deref().unwrap_or("")
                    )
                })
                .collect();
            let mut e = bad_csr(format!(
                "the policy refuses a certificate for {}",
                names.join(", ")
            ));
            e.internal = Some(policy.reasons.join("; "));
            return Err(e);
        }
        // `[rate_limits]` on certificates: taken now, given back when the
        // signer here did not issue.
        let places = self
            .take_issuance_places(account, &order.identifiers)
            .await?;
        let signing = Signing {
            profile,
            account,
            identifiers: order.identifiers.iter().map(RawIdentifier::from).collect(),
            order,
            csr_der,
            csr,
            usage,
        };
        let result = match issuance {
            // Kept whatever this request answers: once the relay is
            // queued, its job may issue even if a later step here failed.
            Issuance::Deferred(deferred) => {
                return self
                    .finalize_relay(profile, deferred, account, &signing.order, csr_der, ctx)
                    .await;
            }
            Issuance::Inline => self.finalize_inline(&signing).await,
            Issuance::Guarded { within } => self.finalize_guarded(&signing, within).await,
        };
        if result.is_err() {
            self.give_back(places).await;
        }
        result
    }

    /// The order `id` as this process created it moments ago, assumed
    /// ready, if the finalize may sign it unread: only for the embedded CA
    /// (`Issuance::Inline`), whose write stores the certificate only while
    /// the order is ready and unexpired and its authorizations valid and
    /// unexpired (`Store::complete_ready_order`), and only where no CAA is
    /// checked again (that needs the authorizations' validation times).
    /// Taken, so it stands for one finalize at most.
    fn ordered_here(
        &self,
        profile: &Profile,
        account: &AccountRow,
        id: &str,
        issuance: &Issuance<'_>,
    ) -> Option<OrderRow> {
        if !finalizes_unread(profile, issuance) {
            return None;
        }
        let now = self.clock.unix();
        let order = self
            .recent
            .take_ordered(id, self.clock.unix_ms())
            .filter(|o| owns_order(o, profile, account) && o.expires_at > now)?;
        Some(OrderRow {
            status: OrderStatus::Ready,
            ..order
        })
    }

    /// What a finalize checks of an order it read: ready, and each of its
    /// authorizations still valid ([`Authority::recheck_authorizations`]).
    async fn ready_to_finalize(
        &self,
        profile: &Profile,
        account: &AccountRow,
        order: &OrderRow,
        authorizations: &[(AuthorizationRow, Vec<ChallengeRow>)],
    ) -> AcmeResult<()> {
        if order.status != OrderStatus::Ready {
            return Err(AcmeError::new(
                ProblemType::OrderNotReady,
                format!(
                    "the order is {}, not ready; finalize needs every authorization valid",
                    order.status
                ),
            ));
        }
        self.recheck_authorizations(
            profile,
            &self.account_url(&profile.name, &account.id),
            order,
            authorizations,
        )
        .await
    }

    /// Why the write refused to store a certificate for `order_id`: what
    /// the finalize's checks answer of the order as it is now, unless
    /// another finalize completed it (or is completing it) or it passes
    /// them after all: then that it moved on while this one signed.
    async fn not_ready_now(
        &self,
        profile: &Profile,
        account: &AccountRow,
        order_id: &str,
    ) -> AcmeError {
        let checked = match self
            .order_with_authorizations(profile, account, order_id)
            .await
        {
            Ok((order, _))
                if matches!(order.status, OrderStatus::Valid | OrderStatus::Processing) =>
            {
                Ok(())
            }
            Ok((order, authorizations)) => {
                self.ready_to_finalize(profile, account, &order, &authorizations)
                    .await
            }
            Err(e) => Err(e),
        };
        checked.err().unwrap_or_else(|| {
            AcmeError::new(
                ProblemType::OrderNotReady,
                "the order is no longer ready: another finalize request completed it, or it moved on while this one signed",
            )
        })
    }

    /// Who asked and from where, for the issuance's audit row: found
    /// before the order is processing, because the reverse-name lookup may
    /// take a while, and a client hanging up during it must not cost a
    /// certificate already signed.
    async fn issuance_audit(&self, signing: &Signing<'_>) -> AuditContext {
        self.audit_context(&signing.issued_fact()).await
    }

    /// The embedded CA with its key in memory signs inside this request in
    /// microseconds: the order goes ready → valid in the one transaction
    /// that stores the certificate, after signing, and is never
    /// processing (nor left so by a crash or an error). Of two
    /// concurrent finalizes both sign but only one commits; the other
    /// certificate never leaves the process (its serial is logged).
    async fn finalize_inline(&self, signing: &Signing<'_>) -> AcmeResult<OrderRow> {
        let Signing {
            profile,
            account,
            order,
            ..
        } = signing;
        let audit = self.issuance_audit(signing).await;
        let issued = match self.sign(signing).await {
            Ok(issued) => issued,
            Err(SignerError::BadCsr(detail)) => return Err(bad_csr(detail)),
            Err(e) => return Err(self.signer_failed(signing, e, "the order was not changed")),
        };
        let cert_id = crate::ids::object_id(self.clock.unix_ms());
        let outbox = self.issuance_outbox(signing, &issued);
        // The issuance's audit row commits with the certificate.
        let audit_row = audit.row(&Fact {
            serial: Some(&issued.serial),
            ..signing.issued_fact()
        });
        let certificate = self.certificate_row(signing, &issued, &cert_id);
        let stored = self
            .store
            .complete_ready_order(
                &certificate,
                &audit_row,
                &outbox.jobs(),
                super::guard(account),
            )
            .await;
        match stored {
            Ok(true) => {
                crash_point!("finalize.completed");
            }
            Ok(false) => {
                // Another finalize completed the order while this one
                // signed, it became invalid or expired, an authorization
                // did, or (signed unread) it was never ready: this
                // certificate is dropped.
                discarded(
                    profile,
                    account,
                    order,
                    &issued.serial,
                    "the order was not ready when stored",
                );
                return Err(self.not_ready_now(profile, account, &order.id).await);
            }
            Err(e) => {
                // The transaction rolled back whole: the order is still
                // ready, and nothing signed left the process.
                discarded(profile, account, order, &issued.serial, &e.to_string());
                return Err(self.guarded_write_error(account, e));
            }
        }
        let certificate = certificate.into_row();
        let order = self.issued(signing, &issued, cert_id, &outbox, &audit_row);
        // What the client asks for next, final from now on.
        self.recent
            .keep(self.clock.unix_ms(), order.clone(), certificate);
        Ok(order)
    }

    /// A token or an outside signer takes its time and may keep a record
    /// of what it signed, so the order is processing before it is asked,
    /// and exactly one request asks.
    ///
    /// The order's watch is queued with the step to processing: if this
    /// process dies before the outcome is recorded, the watch makes the
    /// order invalid once the signer's time limit (`within`) is well past
    /// (see [`FinalizeWatch`]).
    async fn finalize_guarded(
        &self,
        signing: &Signing<'_>,
        within: Duration,
    ) -> AcmeResult<OrderRow> {
        let Signing { account, order, .. } = signing;
        let audit = self.issuance_audit(signing).await;
        let since = self.clock.unix_ms();
        let watch = Watch::of(&order.id, since, within);
        let (key, payload) = (watch.key(), watch.payload());
        let job = NewJob {
            kind: FINALIZE_WATCH_KIND,
            key: &key,
            payload: &payload,
            run_at: watch.due,
            deadline: None,
            max_attempts: i64::from(WATCH_ATTEMPTS),
            fair_key: None,
        };
        if !self
            .store
            .begin_finalize(&order.id, since, &job, super::guard(account))
            .await
            .map_err(|e| self.guarded_write_error(account, e))?
        {
            return Err(AcmeError::new(
                ProblemType::OrderNotReady,
                "the order is already being finalized",
            ));
        }
        // Counted as queued; due later, so the runner is not woken for it.
        self.queue.observer.enqueued(FINALIZE_WATCH_KIND);
        crash_point!("finalize.began");
        // From here the order is processing: if this request goes away
        // before the outcome is recorded (the client hung up while the
        // signer ran), the guard marks it invalid rather than leave it
        // processing for ever.
        let mut guard = FinalizeGuard {
            store: self.store.clone(),
            order_id: order.id.clone(),
            armed: true,
        };
        let issued = match self.sign(signing).await {
            Ok(issued) => {
                crash_point!("finalize.signed");
                issued
            }
            Err(SignerError::BadCsr(detail)) => {
                self.store.abort_finalize(&order.id).await?;
                guard.armed = false;
                return Err(bad_csr(detail));
            }
            Err(e) => {
                let then = if matches!(e, SignerError::Failed(_)) {
                    // An outside signer failed: it may have signed
                    // something, so the order is not offered again; the
                    // client starts anew.
                    let problem = acme_proxy_protocol::Problem::new(
                        ProblemType::ServerInternal,
                        "the signing service failed to issue this certificate; place a new order",
                    );
                    self.store.fail_order(&order.id, &problem).await?;
                    "the order is invalid"
                } else {
                    // Our failure, nothing signed: put the order back so it
                    // can be finalized again once the operator has fixed
                    // the signer.
                    self.store.abort_finalize(&order.id).await?;
                    "the order is ready again"
                };
                guard.armed = false;
                return Err(self.signer_failed(signing, e, then));
            }
        };
        let cert_id = crate::ids::object_id(self.clock.unix_ms());
        let outbox = self.issuance_outbox(signing, &issued);
        // The issuance's audit row commits with the certificate.
        let audit_row = audit.row(&Fact {
            serial: Some(&issued.serial),
            ..signing.issued_fact()
        });
        let stored = self
            .store
            .complete_order(
                &self.certificate_row(signing, &issued, &cert_id),
                &audit_row,
                &outbox.jobs(),
            )
            .await;
        guard.armed = false;
        match stored {
            Ok(true) => {
                crash_point!("finalize.completed");
            }
            Ok(false) => {
                return Err(AcmeError::internal(
                    "order left processing while it was being signed",
                ));
            }
            Err(e) => {
                // Signed by an outside PKI but not stored (e.g. a serial
                // that another profile's certificate already has): the
                // order cannot become valid; it is made invalid, not left
                // processing.
                let problem = acme_proxy_protocol::Problem::new(
                    ProblemType::ServerInternal,
                    "the certificate could not be stored; place a new order",
                );
                let _ = self.store.fail_order(&order.id, &problem).await;
                return Err(self.guarded_write_error(account, e));
            }
        }
        Ok(self.issued(signing, &issued, cert_id, &outbox, &audit_row))
    }

    /// Asks the signer, with the window the order asked for or the
    /// signer's default for the certificate profile.
    async fn sign(&self, signing: &Signing<'_>) -> Result<Issued, SignerError> {
        let Signing {
            profile,
            order,
            usage,
            ..
        } = signing;
        let now = self.clock.now();
        let (default_nb, default_na) = profile
            .signer
            .default_window(now, usage.and_then(|u| u.validity));
        let not_before = order
            .not_before
            .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok())
            .unwrap_or(default_nb);
        let not_after = order
            .not_after
            .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok())
            .unwrap_or(default_na);
        profile
            .signer
            .issue(
                &IssueRequest {
                    now,
                    identifiers: &order.identifiers,
                    spki_der: &signing.csr.spki_der,
                    not_before,
                    not_after,
                    key_usages: usage.and_then(|u| u.key_usages.as_deref()),
                    extended_key_usages: ExtendedKeyUsage::granted(signing.purposes()),
                },
                &IssueContext {
                    profile: &profile.name,
                    order_id: &order.id,
                    csr_der: signing.csr_der,
                    certificate_profile: order.certificate_profile.as_deref(),
                },
            )
            .await
    }

    /// Logs a signer's failure (`then`: what became of the order) and
    /// says `serverInternal`.
    fn signer_failed(&self, signing: &Signing<'_>, e: SignerError, then: &str) -> AcmeError {
        tracing::error!(
            event = "certificate.issue",
            outcome = "failure",
            profile = %signing.profile.name,
            account = %signing.account.id,
            order = %signing.order.id,
            error = %e,
            then,
            "the signer failed"
        );
        AcmeError::internal(e)
    }

    /// The webhooks the issuance is told to, queued with the certificate.
    fn issuance_outbox(&self, signing: &Signing<'_>, issued: &Issued) -> Outbox {
        let order = &signing.order;
        let mut notice = Notice::new(
            Event::CertificateIssued,
            &signing.profile.name,
            self.clock.unix(),
        )
        .identifiers(&order.identifiers);
        notice.account = Some(signing.account.id.clone());
        notice.order = Some(order.id.clone());
        notice.serial = Some(issued.serial.clone());
        notice.not_after = Some(crate::clock::rfc3339(issued.not_after));
        self.notifier.outbox(&notice)
    }

    fn certificate_row<'s>(
        &self,
        signing: &'s Signing<'_>,
        issued: &'s Issued,
        cert_id: &'s str,
    ) -> NewCertificateRow<'s> {
        NewCertificateRow {
            id: cert_id,
            profile: &signing.profile.name,
            order_id: &signing.order.id,
            account_id: &signing.account.id,
            serial: &issued.serial,
            chain_pem: &issued.chain_pem,
            key_thumbprint: signing.csr.key_thumbprint.as_deref(),
            identifiers: &signing.order.identifiers,
            not_before: issued.not_before,
            not_after: issued.not_after,
            now: self.clock.unix(),
        }
    }

    /// After the certificate is stored: the webhooks and the audit row
    /// are counted, the issuance logged; the order as the transaction left
    /// it (no read back).
    fn issued(
        &self,
        signing: &Signing<'_>,
        issued: &Issued,
        cert_id: String,
        outbox: &Outbox,
        audit_row: &acme_proxy_store::NewAuditRow<'_>,
    ) -> OrderRow {
        let Signing {
            profile,
            account,
            order,
            ..
        } = signing;
        self.notifier.posted(outbox);
        self.metrics.audited(audit_row);
        tracing::info!(
            event = "certificate.issued",
            outcome = "success",
            profile = %profile.name,
            account = %account.id,
            order = %order.id,
            serial = %issued.serial,
            // Up to 100 names of 253 octets: the audit row has them all,
            // the log line the first few.
            identifiers = %crate::bounded::identifier_list(&order.identifiers),
            "certificate issued"
        );
        OrderRow {
            status: OrderStatus::Valid,
            certificate_id: Some(cert_id),
            ..order.clone()
        }
    }
}

/// Marks an order invalid if the finalize that moved it to processing is
/// dropped before recording the outcome.
struct FinalizeGuard {
    store: acme_proxy_store::Store,
    order_id: String,
    armed: bool,
}

impl Drop for FinalizeGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        let id = std::mem::take(&mut self.order_id);
        tracing::warn!(
            event = "certificate.issue",
            outcome = "abandoned",
            order = %id,
            "the finalize request went away while signing; the order is made invalid"
        );
        runtime.spawn(async move {
            let problem = acme_proxy_protocol::Problem::new(
                ProblemType::ServerInternal,
                "the finalize request went away while the certificate was being signed; place a new order",
            );
            let _ = store.fail_order(&id, &problem).await;
        });
    }
}

impl Authority {
    /// A guarded finalize's watch: once the attempt it watches is dead
    /// (its signer's time limit well past, its outcome never recorded: the
    /// process asking died), the order is made invalid and audited.
    /// Earlier, it looks again when that time comes. An attempt that ended
    /// (or was followed by another, which has its own watch) ends the
    /// watch.
    async fn watch_finalize(&self, watch: &Watch) -> Outcome {
        match self.store.processing_since(&watch.order).await {
            Ok(Some(since)) if since == watch.since => {}
            Ok(_) => return Outcome::Done,
            Err(e) => return Outcome::Retry(format!("reading the order: {e}")),
        }
        if self.clock.unix_ms() < watch.due {
            let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(watch.due) * 1_000_000)
                .unwrap_or_else(|_| self.clock.now() + WATCH_MARGIN);
            return Outcome::Reschedule(at);
        }
        let order = match self.store.order(&watch.order).await {
            Ok(Some(order)) => order,
            Ok(None) => return Outcome::Done,
            Err(e) => return Outcome::Retry(format!("reading the order: {e}")),
        };
        let problem = acme_proxy_protocol::Problem::new(
            ProblemType::ServerInternal,
            "the server stopped while the certificate was being signed; place a new order",
        );
        let identifiers: Vec<RawIdentifier> =
            order.identifiers.iter().map(RawIdentifier::from).collect();
        let detail = format!(
            "the finalize that began at {} had not recorded its outcome by {}: the server asking the signer stopped",
            crate::clock::rfc3339(watch.since.div_euclid(1000)),
            crate::clock::rfc3339(watch.due.div_euclid(1000)),
        );
        let audit = NewAuditRow {
            profile: Some(&order.profile),
            account_id: Some(&order.account_id),
            order_id: Some(&watch.order),
            identifiers: Some(identifiers.as_slice()),
            problem_type: Some(ProblemType::ServerInternal.name()),
            detail: Some(&detail),
            ..NewAuditRow::new(
                self.clock.unix(),
                AuditEvent::CertificateIssueFailed,
                AuditOutcome::Failure,
                "system",
            )
        };
        match self
            .store
            .fail_stalled_finalize(&watch.order, watch.since, &problem, &audit)
            .await
        {
            Ok(true) => {
                self.metrics.audited(&audit);
                tracing::warn!(
                    event = "certificate.issue",
                    outcome = "abandoned",
                    profile = %order.profile,
                    account = %order.account_id,
                    order = %watch.order,
                    reason = %detail,
                    "a finalize died while signing; the order is made invalid"
                );
                Outcome::Done
            }
            // It ended meanwhile, or another attempt began (with its own
            // watch).
            Ok(false) => Outcome::Done,
            Err(e) => Outcome::Retry(format!("failing the order: {e}")),
        }
    }
}

/// The jobs that watch guarded finalizes, one per attempt (keyed
/// `ORDER@START`).
#[derive(Debug)]
pub struct FinalizeWatch {
    pub generations: Generations,
}

impl JobHandler for FinalizeWatch {
    fn kind(&self) -> &'static str {
        FINALIZE_WATCH_KIND
    }

    fn run<'a>(&'a self, job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            match serde_json::from_str::<Watch>(&job.payload) {
                Ok(watch) => self.generations.authority().watch_finalize(&watch).await,
                Err(e) => Outcome::Failed(format!("payload {:?}: {e}", job.payload)),
            }
        })
    }

    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            tracing::error!(
                event = "finalize.watch_retired",
                outcome = "failure",
                watch = %job.key,
                reason = %reason,
                "the watch of a finalize was retired; if the order stays processing, the next start watches it again"
            );
            Ok(())
        })
    }

    /// Watches every order processing without a relay and without a watch
    /// (one that was processing when this version was installed), as if
    /// its signer had the longest limit any may have.
    fn recover<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let ids = self
                .generations
                .authority()
                .store
                .unwatched_finalizes(FINALIZE_WATCH_KIND, RECOVER_BATCH)
                .await
                .map_err(|e| e.to_string())?;
            let specs = ids
                .into_iter()
                .map(|(id, since)| {
                    let watch = Watch::of(&id, since, LONGEST_SIGNING);
                    let mut spec =
                        JobSpec::new(FINALIZE_WATCH_KIND, watch.key(), serde_json::json!(watch));
                    spec.max_attempts = Some(WATCH_ATTEMPTS);
                    spec
                })
                .collect();
            queue
                .requeue_lost("finalize.recover", specs, RECOVER_BATCH)
                .await
        })
    }
}
