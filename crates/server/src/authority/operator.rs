//! What operators do through the authority (the admin CLI now, the web
//! admin later): the same state changes, audit rows and notifications as
//! the ACME requests they mirror, attributed to `operator:NAME`.

use acme_proxy_protocol::types::ReasonCode;
use acme_proxy_store::{
    AccountRow, AuditEvent, AuditOutcome, Blocker, CertificateRow, DeleteOutcome, NewAuditRow,
};

use super::certificates::leaf_der;
use super::{Authority, RevocationSigner};
use crate::error::{AcmeError, AcmeResult};

impl Authority {
    /// Deactivates an account as if it had asked (RFC 8555 §7.3.6): its
    /// authorizations deactivated, its unfinished orders invalid.
    pub async fn operator_deactivate_account(
        &self,
        id: &str,
        actor: &str,
    ) -> AcmeResult<AccountRow> {
        let account = self.account_row(id).await?;
        if account.status != acme_proxy_protocol::types::AccountStatus::Valid {
            return Err(AcmeError::malformed(format!(
                "account {id} is already {}",
                account.status
            )));
        }
        self.deactivate(&account.profile, id, Some(actor)).await?;
        self.account_row(id).await
    }

    /// Revokes the certificate of an order (RFC 8555 §7.6 effects: upstream
    /// first for a relayed one, then the CRL), whoever owns it.
    pub async fn operator_revoke_order(
        &self,
        order_id: &str,
        reason: Option<u64>,
        actor: &str,
    ) -> AcmeResult<CertificateRow> {
        let order = self
            .store
            .order(order_id)
            .await?
            .ok_or_else(|| AcmeError::not_found("order"))?;
        let cert_id = order.certificate_id.ok_or_else(|| {
            AcmeError::malformed(format!(
                "order {order_id} is {} and has no certificate",
                order.status
            ))
        })?;
        let cert = self
            .store
            .certificate(&cert_id)
            .await?
            .ok_or_else(|| AcmeError::not_found("certificate"))?;
        let profile = self.profile(&cert.profile).ok_or_else(|| {
            AcmeError::malformed(format!(
                "profile {} is not in the configuration; its certificates cannot be revoked from here",
                cert.profile
            ))
        })?;
        let der = leaf_der(&cert.chain_pem)
            .ok_or_else(|| AcmeError::internal("the stored chain has no certificate"))?;
        self.revoke(
            profile,
            RevocationSigner::Operator(actor),
            Ok(&der),
            reason.map(ReasonCode::from),
        )
        .await?;
        self.store
            .certificate(&cert_id)
            .await?
            .ok_or_else(|| AcmeError::not_found("certificate"))
    }

    /// Deletes an account and everything it owns once none of its
    /// certificates is unexpired and nothing of it is in flight; the audit
    /// row stays.
    pub async fn operator_delete_account(&self, id: &str, actor: &str) -> AcmeResult<()> {
        let account = self.account_row(id).await?;
        let fact = super::audit::Fact {
            account: Some(id),
            actor: Some(actor),
            ..super::audit::Fact::new(
                AuditEvent::AccountDeleted,
                AuditOutcome::Success,
                &account.profile,
            )
        };
        let context = self.audit_context(&fact).await;
        let row = context.row(&fact);
        let outcome = self
            .store
            .delete_account(id, self.clock.unix(), Some(&row))
            .await?;
        self.account_changed(id);
        self.deleted(outcome, "account", &row)
    }

    /// Deletes an order (with its expired certificate and the
    /// authorizations no other order uses).
    pub async fn operator_delete_order(&self, id: &str, actor: &str) -> AcmeResult<()> {
        let order = self
            .store
            .order(id)
            .await?
            .ok_or_else(|| AcmeError::not_found("order"))?;
        let fact = super::audit::Fact {
            account: Some(&order.account_id),
            actor: Some(actor),
            order: Some(id),
            ..super::audit::Fact::new(
                AuditEvent::OrderDeleted,
                AuditOutcome::Success,
                &order.profile,
            )
        };
        let context = self.audit_context(&fact).await;
        let row = context.row(&fact);
        let outcome = self
            .store
            .delete_order(id, self.clock.unix(), Some(&row))
            .await?;
        self.deleted(outcome, "order", &row)
    }

    async fn account_row(&self, id: &str) -> AcmeResult<AccountRow> {
        self.store
            .account(id)
            .await?
            .ok_or_else(|| AcmeError::not_found("account"))
    }

    /// A deletion's answer: said why it was refused, or, deleted with its
    /// audit row `row` (`account.deleted` / `order.deleted`), counted.
    fn deleted(&self, outcome: DeleteOutcome, what: &str, row: &NewAuditRow<'_>) -> AcmeResult<()> {
        match outcome {
            DeleteOutcome::NotFound => Err(AcmeError::not_found(what)),
            DeleteOutcome::Refused(blocker) => {
                let why = match blocker {
                    Blocker::Unexpired { serial, not_after } => format!(
                        "certificate {serial} has not expired (notAfter {}); it stays for revocation and the CRL until then",
                        crate::clock::rfc3339(not_after)
                    ),
                    Blocker::InFlight { order } => format!(
                        "order {order} is being validated or finalized; wait for it, or cancel its job (acme-proxy job list)"
                    ),
                };
                Err(AcmeError::malformed(format!("the {what} is kept: {why}")))
            }
            DeleteOutcome::Deleted => {
                self.metrics.audited(row);
                tracing::info!(event = %row.event, outcome = "success", profile = row.profile, account = row.account_id, order = row.order_id, by = row.actor, "deleted by an operator");
                Ok(())
            }
        }
    }
}
