//! What operators do through the authority (the admin CLI now, the web
//! admin later): the same state changes, audit rows and notifications as
//! the ACME requests they mirror, attributed to `operator:NAME`.

use acme_proxy_store::{
    AccountRow, AuditEvent, AuditOutcome, Blocker, CertificateRow, DeleteOutcome,
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
        self.revoke(profile, RevocationSigner::Operator(actor), &der, reason)
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
        let outcome = self.store.delete_account(id, self.clock.unix()).await?;
        self.account_changed(id);
        let what = ("account", AuditEvent::AccountDeleted);
        self.deleted(outcome, what, &account.profile, Some(id), None, actor)
            .await
    }

    /// Deletes an order (with its expired certificate and the
    /// authorizations no other order uses).
    pub async fn operator_delete_order(&self, id: &str, actor: &str) -> AcmeResult<()> {
        let order = self
            .store
            .order(id)
            .await?
            .ok_or_else(|| AcmeError::not_found("order"))?;
        let outcome = self.store.delete_order(id, self.clock.unix()).await?;
        self.deleted(
            outcome,
            ("order", AuditEvent::OrderDeleted),
            &order.profile,
            Some(&order.account_id),
            Some(id),
            actor,
        )
        .await
    }

    async fn account_row(&self, id: &str) -> AcmeResult<AccountRow> {
        self.store
            .account(id)
            .await?
            .ok_or_else(|| AcmeError::not_found("account"))
    }

    /// Audits a deletion (`account.deleted` / `order.deleted`) or says why
    /// it was refused.
    async fn deleted(
        &self,
        outcome: DeleteOutcome,
        (what, event): (&str, AuditEvent),
        profile: &str,
        account: Option<&str>,
        order: Option<&str>,
        actor: &str,
    ) -> AcmeResult<()> {
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
                self.audit(super::audit::Fact {
                    account,
                    actor: Some(actor),
                    order,
                    ..super::audit::Fact::new(event, AuditOutcome::Success, profile)
                })
                .await;
                tracing::info!(event = %event, outcome = "success", profile, account, order, by = actor, "deleted by an operator");
                Ok(())
            }
        }
    }
}
