//! External Account Binding (RFC 8555 §7.3.4): the credentials operators
//! mint, the binding newAccount checks, and the limits a credential puts on
//! the orders of the accounts registered with it.

use acme_proxy_protocol::names::glob_matches;
use acme_proxy_protocol::types::Identifier;
use acme_proxy_protocol::{Eab, EabError, Jwk, ProblemType, Subproblem};
use acme_proxy_store::{AccountRow, AuditEvent, AuditOutcome, EabRow, NewEab};

use super::{Authority, Profile};
use crate::config::EabMode;
use crate::error::{AcmeError, AcmeResult};

/// A credential just minted: the only time its HMAC key is seen (no
/// `Debug`, so no log line can carry it).
pub struct MintedEab {
    pub row: EabRow,
    /// base64url, as `--eab-hmac-key` / `--hmac` take it.
    pub hmac_key_b64: String,
}

impl Authority {
    /// The credential a newAccount request binds to, if the profile looks at
    /// bindings and one was sent: `url` is the newAccount URL the outer JWS
    /// was checked against, `jwk` the key that signed it.
    ///
    /// Unknown key ids and wrong MACs get the same answer, so a client
    /// cannot probe which key ids exist.
    pub(crate) async fn external_account(
        &self,
        profile: &Profile,
        jwk: &Jwk,
        binding: Option<&serde_json::Value>,
        url: &str,
    ) -> AcmeResult<Option<EabRow>> {
        let binding = match (profile.config.eab, binding) {
            (EabMode::Off, _) | (EabMode::Optional, None) => return Ok(None),
            (EabMode::Required, None) => {
                return Err(AcmeError::new(
                    ProblemType::ExternalAccountRequired,
                    "this profile registers only accounts bound to an external account: \
                     ask the operator for a key id and HMAC key and register with them \
                     (certbot --eab-kid/--eab-hmac-key, lego --eab --kid/--hmac)",
                ));
            }
            (_, Some(b)) => b,
        };
        let eab = Eab::parse(binding).map_err(|e| match e {
            EabError::UnsupportedAlgorithm(_) => {
                AcmeError::new(ProblemType::BadSignatureAlgorithm, e.to_string())
            }
            _ => AcmeError::malformed(e.to_string()),
        })?;
        if eab.url != url {
            return Err(AcmeError::malformed(
                "externalAccountBinding: its url must be the newAccount URL the request is sent to",
            ));
        }
        if eab.key != *jwk {
            return Err(AcmeError::malformed(
                "externalAccountBinding: its payload must be the account key that signs this request",
            ));
        }
        let refused = || {
            AcmeError::unauthorized(
                "externalAccountBinding does not verify: unknown key id, or not MACed with its HMAC key",
            )
        };
        let credential = self.store.eab(&eab.kid).await?.ok_or_else(refused)?;
        if !eab.verify(&credential.hmac_key) {
            return Err(refused());
        }
        if credential.revoked_at.is_some() {
            return Err(AcmeError::unauthorized(
                "this external account credential was revoked; ask the operator for a new one",
            ));
        }
        if let Some(only) = &credential.profile
            && *only != profile.name
        {
            return Err(AcmeError::unauthorized(
                "this external account credential is for another ACME endpoint of this server",
            ));
        }
        Ok(Some(credential))
    }

    /// What the credential of `account` forbids in a new order: refused
    /// outright once it is revoked; otherwise one `rejectedIdentifier` per
    /// identifier outside its name globs.
    pub(crate) async fn external_account_limits(
        &self,
        account: &AccountRow,
        identifiers: &[Identifier],
    ) -> AcmeResult<Vec<Subproblem>> {
        let Some(kid) = &account.eab_kid else {
            return Ok(Vec::new());
        };
        let credential = self.store.eab(kid).await?.ok_or_else(|| {
            AcmeError::internal(format!("the account's external account {kid} is missing"))
        })?;
        if credential.revoked_at.is_some() {
            return Err(AcmeError::unauthorized(
                "the external account credential this account registered with was revoked; it may not order any more",
            ));
        }
        let Some(globs) = &credential.names else {
            return Ok(Vec::new());
        };
        Ok(identifiers
            .iter()
            .filter(|id| !globs.iter().any(|g| glob_matches(g, &id.value)))
            .map(|id| {
                Subproblem::new(
                    ProblemType::RejectedIdentifier,
                    format!(
                        "the external account this account registered with allows only {}",
                        globs.join(", ")
                    ),
                    id.clone(),
                )
            })
            .collect())
    }

    /// Mints a credential (`acme-proxy eab create`), audited as `eab.created`.
    pub async fn operator_create_eab(
        &self,
        label: Option<&str>,
        profile: Option<&str>,
        names: Option<&[String]>,
        actor: &str,
    ) -> AcmeResult<MintedEab> {
        if let Some(p) = profile
            && self.profile(p).is_none()
        {
            return Err(AcmeError::malformed(format!(
                "there is no profile {p:?} in the configuration"
            )));
        }
        let names: Option<Vec<String>> = names.map(|n| {
            n.iter()
                .map(|g| g.trim().trim_end_matches('.').to_ascii_lowercase())
                .collect()
        });
        if let Some(bad) = names.iter().flatten().find(|g| g.is_empty()) {
            return Err(AcmeError::malformed(format!("name glob {bad:?} is empty")));
        }
        let kid = crate::ids::eab_kid();
        let key = crate::ids::eab_hmac_key();
        let detail = format!(
            "kid {kid}{}{}",
            label.map(|l| format!(", label {l:?}")).unwrap_or_default(),
            names
                .as_ref()
                .map(|n| format!(", names {}", n.join(" ")))
                .unwrap_or_default()
        );
        let fact = super::audit::Fact {
            actor: Some(actor),
            detail: Some(&detail),
            ..super::audit::Fact::new(
                AuditEvent::EabCreated,
                AuditOutcome::Success,
                profile.unwrap_or(""),
            )
        };
        // The row goes in with the credential: none exists unaudited.
        let context = self.audit_context(&fact).await;
        let row = context.row(&fact);
        self.store
            .insert_eab(
                &NewEab {
                    kid: &kid,
                    hmac_key: &key,
                    label,
                    profile,
                    names: names.as_deref(),
                    now: self.clock.unix(),
                },
                &row,
            )
            .await?;
        self.metrics.audited(&row);
        let row = self
            .store
            .eab(&kid)
            .await?
            .ok_or_else(|| AcmeError::internal("credential vanished after insert"))?;
        Ok(MintedEab {
            row,
            hmac_key_b64: {
                use base64::Engine;
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
            },
        })
    }

    /// Revokes a credential (`acme-proxy eab revoke`): no more registrations
    /// with it, and no more orders from the accounts registered with it.
    pub async fn operator_revoke_eab(&self, kid: &str, actor: &str) -> AcmeResult<EabRow> {
        let row = self
            .store
            .eab(kid)
            .await?
            .ok_or_else(|| AcmeError::not_found("external account credential"))?;
        let detail = format!("kid {kid}, {} account(s) registered with it", row.accounts);
        let fact = super::audit::Fact {
            actor: Some(actor),
            detail: Some(&detail),
            ..super::audit::Fact::new(
                AuditEvent::EabRevoked,
                AuditOutcome::Success,
                row.profile.as_deref().unwrap_or(""),
            )
        };
        let context = self.audit_context(&fact).await;
        let audit = context.row(&fact);
        if !self
            .store
            .revoke_eab(kid, self.clock.unix(), &audit)
            .await?
        {
            return Err(AcmeError::malformed(format!(
                "external account credential {kid} is already revoked"
            )));
        }
        self.metrics.audited(&audit);
        self.store
            .eab(kid)
            .await?
            .ok_or_else(|| AcmeError::internal("credential vanished after revocation"))
    }
}
