//! Accounts: creation and lookup (RFC 8555 §7.3), contact updates (§7.3.2),
//! key rollover (§7.3.5) and deactivation (§7.3.6).

use acme_proxy_protocol::types::{AccountStatus, AccountUpdate, NewAccount};
use acme_proxy_protocol::{Jwk, ProblemType};
use acme_proxy_store::{AccountRow, AuditEvent, AuditOutcome, KeyChangeOutcome, NewAccountRow};

use super::{Authority, Profile};
use crate::error::{AcmeError, AcmeResult};
use crate::events::Event;
use crate::notify::Notice;

/// Contacts accepted per account.
const MAX_CONTACTS: usize = 10;

impl Authority {
    /// newAccount (§7.3): returns the account and whether it was created now.
    pub async fn new_account(
        &self,
        profile: &Profile,
        jwk: &Jwk,
        req: &NewAccount,
        url: &str,
    ) -> AcmeResult<(AccountRow, bool)> {
        let thumbprint = jwk.thumbprint_b64();
        if let Some(existing) = self
            .store
            .account_by_key(&profile.name, &thumbprint)
            .await?
        {
            // §7.3.6: a deactivated (or operator-revoked) account's key
            // authorizes nothing more, so it does not even learn the
            // account back; Boulder and Pebble answer `unauthorized` too.
            if existing.status != AccountStatus::Valid {
                let e = AcmeError::deactivated_account(format!(
                    "the account of this key is {}; create an account with another key",
                    existing.status.as_str()
                ));
                return Err(self
                    .account_refused(profile, &thumbprint, Some(&existing.id), e)
                    .await);
            }
            // §7.3.1: an existing key returns the existing account, 200.
            return Ok((existing, false));
        }
        if req.only_return_existing == Some(true) {
            return Err(AcmeError::new(
                ProblemType::AccountDoesNotExist,
                "no account exists for this key at this profile (onlyReturnExisting was set)",
            ));
        }
        if profile.config.terms_of_service.is_some() && req.terms_of_service_agreed != Some(true) {
            // §7.3: the server may require agreement; Boulder and Pebble
            // report a missing agreement as malformed.
            return Err(AcmeError::malformed(
                "this profile has terms of service: set termsOfServiceAgreed to true to create an account",
            ));
        }
        let contact = check_contacts(req.contact.as_deref().unwrap_or(&[]))?;
        let binding = match self
            .external_account(profile, jwk, req.external_account_binding.as_ref(), url)
            .await
        {
            Ok(b) => b,
            // A refused binding is someone trying to register without
            // the operator's leave: worth a row.
            Err(e) => return Err(self.account_refused(profile, &thumbprint, None, e).await),
        };
        if let Err(e) = self.take_new_account_place().await {
            return Err(self.account_refused(profile, &thumbprint, None, e).await);
        }
        let eab_kid = binding.as_ref().map(|b| b.kid.as_str());
        let jwk_json = jwk.to_value().to_string();
        let id = crate::ids::object_id(self.clock.unix_ms());
        // Queued only if this request creates the account.
        let mut notice = Notice::new(Event::AccountCreated, &profile.name, self.clock.unix());
        notice.account = Some(id.clone());
        let outbox = self.notifier.outbox(&notice);
        let (row, created) = self
            .store
            .insert_account(
                &NewAccountRow {
                    id: &id,
                    profile: &profile.name,
                    key_thumbprint: &thumbprint,
                    jwk: &jwk_json,
                    contact: &contact,
                    tos_agreed: req.terms_of_service_agreed == Some(true),
                    eab_kid,
                    now: self.clock.unix(),
                },
                &outbox.jobs(),
            )
            .await?;
        if created {
            self.notifier.posted(&outbox);
            let detail = eab_kid.map(|k| format!("external account {k}"));
            self.audit(super::audit::Fact {
                account: Some(&row.id),
                detail: detail.as_deref(),
                ..super::audit::Fact::new(
                    AuditEvent::AccountCreated,
                    AuditOutcome::Success,
                    &profile.name,
                )
            })
            .await;
            tracing::info!(
                event = "account.created",
                outcome = "success",
                profile = %profile.name,
                account = %row.id,
                "account created"
            );
        }
        Ok((row, created))
    }

    /// Audits the refusal `e` of newAccount for the key `thumbprint`, and
    /// returns it. `account`: the account that key already has (one no
    /// longer valid), so that `audit list --account` finds the row; none
    /// when there is no account to name yet.
    async fn account_refused(
        &self,
        profile: &Profile,
        thumbprint: &str,
        account: Option<&str>,
        e: AcmeError,
    ) -> AcmeError {
        let actor = format!("key:{thumbprint}");
        self.audit(super::audit::Fact {
            account,
            actor: Some(&actor),
            error: Some(&e),
            ..super::audit::Fact::new(
                AuditEvent::AccountRefused,
                super::audit::outcome_of(&e),
                &profile.name,
            )
        })
        .await;
        e
    }

    /// Account update (§7.3.2) or deactivation (§7.3.6). An empty update
    /// returns the account unchanged.
    pub async fn update_account(
        &self,
        profile: &Profile,
        account: &AccountRow,
        update: &AccountUpdate,
    ) -> AcmeResult<AccountRow> {
        if let Some(status) = &update.status {
            // The one status a client may set (§7.3.6).
            if status.parse() != Ok(AccountStatus::Deactivated) {
                return Err(AcmeError::malformed(
                    "the only status a client may set on its account is \"deactivated\"",
                ));
            }
            self.deactivate(&profile.name, &account.id, None).await?;
        } else {
            let contact = update.contact.as_deref().map(check_contacts).transpose()?;
            let updated = async {
                if let Some(contact) = &contact {
                    self.store
                        .update_account_contact(&account.id, contact)
                        .await?;
                }
                if update.terms_of_service_agreed == Some(true) && !account.tos_agreed {
                    self.store.agree_account_tos(&account.id).await?;
                }
                Ok::<_, acme_proxy_store::StoreError>(())
            }
            .await;
            // Forgotten even if only the first of the two writes committed.
            self.account_changed(&account.id);
            updated?;
        }
        self.store
            .account(&account.id)
            .await?
            .ok_or_else(|| AcmeError::internal("account vanished during update"))
    }

    /// valid → deactivated (§7.3.6), with its authorizations and unfinished
    /// orders, audited and notified; `actor` is the operator when it is not
    /// the account itself. Deactivating a deactivated account changes
    /// nothing and tells no one.
    pub(crate) async fn deactivate(
        &self,
        profile: &str,
        account_id: &str,
        actor: Option<&str>,
    ) -> AcmeResult<bool> {
        let mut notice = Notice::new(Event::AccountDeactivated, profile, self.clock.unix());
        notice.account = Some(account_id.to_owned());
        let outbox = self.notifier.outbox(&notice);
        // The row goes in with the change: no account is deactivated
        // without the trail saying by whom.
        let fact = super::audit::Fact {
            account: Some(account_id),
            actor,
            ..super::audit::Fact::new(
                AuditEvent::AccountDeactivated,
                AuditOutcome::Success,
                profile,
            )
        };
        let context = self.audit_context(&fact).await;
        let row = context.row(&fact);
        let deactivated = self
            .store
            .deactivate_account(account_id, &outbox.jobs(), Some(&row))
            .await?;
        self.account_changed(account_id);
        if !deactivated {
            return Ok(false);
        }
        self.metrics.audited(&row);
        self.notifier.posted(&outbox);
        tracing::info!(
            event = "account.deactivated",
            outcome = "success",
            profile = %profile,
            account = %account_id,
            by = actor.unwrap_or("the account"),
            "account deactivated"
        );
        Ok(true)
    }

    /// keyChange (§7.3.5). The front end has verified both signatures and the
    /// inner `url`; this checks the claims and swaps the key atomically.
    /// `account_url_matches` says whether the inner payload's `account` named
    /// the outer `kid`.
    pub async fn change_key(
        &self,
        profile: &Profile,
        account: &AccountRow,
        account_url_matches: bool,
        old_key: &serde_json::Value,
        new_key: &Jwk,
        location_of: impl Fn(&str) -> String,
    ) -> AcmeResult<AccountRow> {
        if !account_url_matches {
            return Err(AcmeError::unauthorized(
                "the inner payload's \"account\" is not the account that signed the outer request",
            ));
        }
        let old = Jwk::from_value(old_key)
            .map_err(|e| AcmeError::malformed(format!("oldKey is not a usable JWK: {e}")))?;
        if old.thumbprint_b64() != account.key_thumbprint {
            return Err(AcmeError::unauthorized(
                "oldKey is not the account's current key",
            ));
        }
        let new_thumbprint = new_key.thumbprint_b64();
        let outcome = self
            .store
            .change_account_key(
                &account.id,
                &profile.name,
                &account.key_thumbprint,
                &new_thumbprint,
                &new_key.to_value().to_string(),
            )
            .await;
        self.account_changed(&account.id);
        match outcome? {
            KeyChangeOutcome::Changed => {
                self.audit(super::audit::Fact {
                    account: Some(&account.id),
                    detail: Some(&format!("new key thumbprint {new_thumbprint}")),
                    ..super::audit::Fact::new(
                        AuditEvent::AccountKeyChanged,
                        AuditOutcome::Success,
                        &profile.name,
                    )
                })
                .await;
                tracing::info!(
                    event = "account.key_changed",
                    outcome = "success",
                    profile = %profile.name,
                    account = %account.id,
                    "account key rolled over"
                );
                self.store
                    .account(&account.id)
                    .await?
                    .ok_or_else(|| AcmeError::internal("account vanished during key change"))
            }
            KeyChangeOutcome::NewKeyInUse { account_id } => {
                // §7.3.5: 409 Conflict with the Location of the account that
                // holds the new key.
                let mut e = AcmeError::malformed("the new key already belongs to an account")
                    .with_status(409);
                e.location = Some(location_of(&account_id));
                Err(e)
            }
            KeyChangeOutcome::Stale => Err(AcmeError::unauthorized(
                "the account's key changed concurrently, or the account is no longer valid",
            )),
        }
    }
}

/// Checks contact URLs (§7.3): only `mailto:` with one plain address.
fn check_contacts(contacts: &[String]) -> AcmeResult<Vec<String>> {
    if contacts.len() > MAX_CONTACTS {
        return Err(AcmeError::new(
            ProblemType::InvalidContact,
            format!("at most {MAX_CONTACTS} contacts are accepted"),
        ));
    }
    let mut out = Vec::with_capacity(contacts.len());
    for c in contacts {
        let Some(addr) = c.strip_prefix("mailto:") else {
            return Err(AcmeError::new(
                ProblemType::UnsupportedContact,
                format!("contact {c:?}: only mailto: contacts are supported"),
            ));
        };
        if addr.contains('?') || addr.contains(',') {
            return Err(AcmeError::new(
                ProblemType::InvalidContact,
                format!("contact {c:?}: a single address without header fields is required"),
            ));
        }
        let valid = match addr.rsplit_once('@') {
            Some((local, domain)) => {
                !local.is_empty()
                    && local.len() <= 64
                    && local
                        .bytes()
                        .all(|b| b.is_ascii_graphic() && b != b'@' && b != b'<' && b != b'>')
                    && acme_proxy_protocol::names::check_dns_name(domain)
                        .is_ok_and(|d| !d.is_wildcard())
            }
            None => false,
        };
        if !valid {
            return Err(AcmeError::new(
                ProblemType::InvalidContact,
                format!("contact {c:?} is not a valid email address"),
            ));
        }
        out.push(c.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contacts_must_be_single_plain_mailto_addresses() {
        let check = |c: &str| check_contacts(&[c.to_owned()]).map_err(|e| e.kind);
        assert!(check("mailto:ops@example.test").is_ok());
        assert_eq!(check("tel:+123"), Err(ProblemType::UnsupportedContact));
        assert_eq!(
            check("mailto:a@b.test?subject=x"),
            Err(ProblemType::InvalidContact)
        );
        assert_eq!(
            check("mailto:a@b.test,c@d.test"),
            Err(ProblemType::InvalidContact)
        );
        assert_eq!(check("mailto:nobody"), Err(ProblemType::InvalidContact));
        assert_eq!(check("mailto:a b@b.test"), Err(ProblemType::InvalidContact));
        assert_eq!(
            check("mailto:a@localhost"),
            Err(ProblemType::InvalidContact)
        );
    }
}
