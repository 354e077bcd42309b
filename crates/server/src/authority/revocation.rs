//! Revocation (RFC 8555 §7.6) and the CRL (RFC 5280 §5): the authority
//! records revocations; the signer is told first (where it issued) and
//! says whether, and how, it publishes a CRL.

use acme_proxy_protocol::ProblemType;
use acme_proxy_protocol::types::{Identifier, RawIdentifier, ReasonCode};
use acme_proxy_store::{AccountRow, AuditEvent, AuditOutcome, CrlRow, RevokeOutcome};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::certificates::leaf_der;
use super::{Authority, Profile};
use crate::error::{AcmeError, AcmeResult};
use crate::events::Event;
use crate::notify::Notice;
use crate::signer::{Crl, IssuedCertificate};

/// Who signed a revocation request (§7.6).
#[derive(Debug)]
pub enum RevocationSigner<'a> {
    /// An account (`kid`): it must own the certificate or hold valid
    /// authorizations for all its names.
    Account(&'a AccountRow),
    /// The certificate's own key (`jwk`), by its RFC 7638 thumbprint.
    CertificateKey(String),
    /// An operator (`operator:NAME`), through the admin CLI: always allowed.
    Operator(&'a str),
}

/// Reason codes a client may give (RFC 5280 §5.3.1): unspecified,
/// keyCompromise, affiliationChanged, superseded, cessationOfOperation.
/// The others describe CA or attribute events, not a subscriber's.
const CLIENT_REASONS: [u64; 5] = [0, 1, 3, 4, 5];

impl Authority {
    /// revokeCert (§7.6). `certificate` is the DER, or why the request
    /// gave none that decodes: refused and audited like any refusal.
    pub async fn revoke(
        &self,
        profile: &Profile,
        signer: RevocationSigner<'_>,
        certificate: AcmeResult<&[u8]>,
        reason: Option<ReasonCode>,
    ) -> AcmeResult<()> {
        let (account, key_actor) = match &signer {
            RevocationSigner::Account(a) => (Some(a.id.clone()), None),
            RevocationSigner::CertificateKey(thumb) => {
                (None, Some(format!("certificate-key:{thumb}")))
            }
            RevocationSigner::Operator(actor) => (None, Some((*actor).to_owned())),
        };
        let by_key = matches!(signer, RevocationSigner::CertificateKey(_));
        // A revocation's success row goes in with it (`revoke_checked`);
        // a refusal's or failure's is written here.
        let decoded = certificate.is_ok();
        let (cert_der, e) = match certificate {
            Ok(cert_der) => {
                let Err(e) = self
                    .revoke_checked(
                        profile,
                        signer,
                        cert_der,
                        reason.as_ref(),
                        (account.as_deref(), key_actor.as_deref()),
                    )
                    .await
                else {
                    return Ok(());
                };
                (cert_der, e)
            }
            Err(e) => (&[][..], e),
        };
        // The certificate named, if this profile issued it: its serial and
        // its very DER (one minted with a serial of ours is not ours).
        let (serial, stored) = match X509Certificate::from_der(cert_der) {
            Ok((_, x509)) => {
                let serial = hex::encode(x509.raw_serial());
                let stored = self
                    .store
                    .certificate_by_serial(&profile.name, &serial)
                    .await
                    .ok()
                    .flatten()
                    .filter(|c| leaf_der(&c.chain_pem).as_deref() == Some(cert_der));
                (Some(serial), stored)
            }
            Err(_) => (None, None),
        };
        // RFC 8555 §7.6 lets a request signed by any key (the certificate's,
        // it claims) ask: anyone can mint such requests for certificates
        // we never issued, at no cost. Those refusals are counted and
        // logged at debug, never audited, so that they cannot grow the
        // audit log; an account's refusals, ours (`serverInternal`) and
        // those about a certificate we issued keep their rows.
        if by_key && stored.is_none() && super::audit::outcome_of(&e) == AuditOutcome::Refused {
            self.metrics
                .revocation_refused(&profile.name, e.kind.name());
            tracing::debug!(
                event = "certificate.revoke",
                outcome = "refused",
                profile = %profile.name,
                problem = e.kind.name(),
                serial = %crate::bounded::value(serial.as_deref().unwrap_or("")),
                "revocation refused for a certificate this profile did not issue, signed by no account; not audited"
            );
            return Err(e);
        }
        let identifiers: Option<Vec<RawIdentifier>> = stored
            .as_ref()
            .map(|c| c.identifiers.iter().map(RawIdentifier::from).collect());
        // A serial of a certificate we did not issue is the client's text.
        let serial = serial.map(|s| crate::bounded::value(&s).into_owned());
        // Revoked by its key or an operator: the row is about the owner's
        // certificate, so `audit list --account` finds it.
        let account = account.or_else(|| stored.map(|c| c.account_id));
        // Refused before it was read, a payload's missing reason is not
        // the unspecified (0) a revocation without one gets.
        let reason_text = match (&reason, decoded) {
            (None, false) => "reason not given".to_owned(),
            _ => format!("reason {}", reason.unwrap_or(ReasonCode::from(0))),
        };
        self.audit(super::audit::Fact {
            account: account.as_deref(),
            actor: key_actor.as_deref(),
            serial: serial.as_deref(),
            identifiers: identifiers.as_deref(),
            error: Some(&e),
            detail: Some(&reason_text),
            ..super::audit::Fact::new(
                AuditEvent::CertificateRevokeFailed,
                super::audit::outcome_of(&e),
                &profile.name,
            )
        })
        .await;
        Err(e)
    }

    /// `(account, actor)`: who asked, for the audit row written with the
    /// revocation (the account defaults to the certificate's owner).
    async fn revoke_checked(
        &self,
        profile: &Profile,
        signer: RevocationSigner<'_>,
        cert_der: &[u8],
        reason: Option<&ReasonCode>,
        (account, actor): (Option<&str>, Option<&str>),
    ) -> AcmeResult<()> {
        let (_, x509) = X509Certificate::from_der(cert_der)
            .map_err(|_| AcmeError::malformed("\"certificate\" is not a DER X.509 certificate"))?;
        let serial = hex::encode(x509.raw_serial());
        // Absent: 0, unspecified (§7.6).
        let reason = reason
            .map_or(Some(0), ReasonCode::code)
            .filter(|code| CLIENT_REASONS.contains(code))
            .ok_or_else(|| {
                AcmeError::new(
                    ProblemType::BadRevocationReason,
                    format!(
                        "reason {} is not accepted; use one of {CLIENT_REASONS:?}",
                        reason.map_or_else(|| "0".to_owned(), ToString::to_string)
                    ),
                )
            })?;
        let cert = self
            .store
            .certificate_by_serial(&profile.name, &serial)
            .await?
            .filter(|c| leaf_der(&c.chain_pem).as_deref() == Some(cert_der))
            .ok_or_else(|| AcmeError::not_found("certificate issued by this profile"))?;
        let allowed = match &signer {
            RevocationSigner::Account(acct) => {
                acct.id == cert.account_id || {
                    let now = self.clock.unix();
                    let mut all = !cert.identifiers.is_empty();
                    for id in &cert.identifiers {
                        // A wildcard name is authorized by a wildcard
                        // authorization of its base name (RFC 8555 §7.1.3),
                        // never by a plain one: proving example.com over
                        // http-01 says nothing about *.example.com.
                        let wildcard = id.value.starts_with("*.");
                        let base = Identifier {
                            kind: id.kind,
                            value: id.value.strip_prefix("*.").unwrap_or(&id.value).to_owned(),
                        };
                        if !self
                            .store
                            .has_valid_authorization(&profile.name, &acct.id, &base, wildcard, now)
                            .await?
                        {
                            all = false;
                            break;
                        }
                    }
                    all
                }
            }
            RevocationSigner::CertificateKey(thumb) => {
                cert.key_thumbprint.as_deref() == Some(thumb.as_str())
            }
            RevocationSigner::Operator(_) => true,
        };
        if !allowed {
            return Err(AcmeError::unauthorized(
                "the signer of this request may not revoke this certificate: sign with the account that ordered it, an account authorized for all its names, or the certificate's own key",
            ));
        }
        if cert.revoked_at.is_some() {
            return Err(AcmeError::new(
                ProblemType::AlreadyRevoked,
                "the certificate is already revoked",
            ));
        }
        // The signer revokes where it issued first (a relay's upstream, the
        // operator's revocation program); only then is it recorded here, so
        // a failure leaves nothing half-done and the client can simply
        // retry.
        let upstream = self.issuing_upstream(profile, &cert.order_id).await;
        let issued = IssuedCertificate {
            serial: &serial,
            upstream: upstream.as_deref(),
            chain_pem: &cert.chain_pem,
            leaf_der: Some(cert_der),
        };
        // An upstream known to be down is not asked: the client hears at
        // once when to try again (its next probe).
        if let Some(down) = self.upstream_down(profile, upstream.as_deref()).await {
            tracing::warn!(
                event = "certificate.revoke",
                outcome = "failure",
                profile = %profile.name,
                serial = %serial,
                error = down.last_error.as_deref().unwrap_or(""),
                "the upstream's circuit breaker is open; the revocation is refused until it closes"
            );
            let mut e = AcmeError::new(
                ProblemType::ServerInternal,
                "the upstream CA that issued this certificate cannot be reached; try again later",
            )
            .with_status(503);
            e.retry_after = Some(
                u64::try_from((down.retry_at - self.clock.unix_ms() + 999) / 1000)
                    .unwrap_or(1)
                    .max(1),
            );
            e.internal = down.last_error;
            return Err(e);
        }
        if let Err(e) = profile.signer.revoke(&issued, reason).await {
            tracing::warn!(
                event = "certificate.revoke",
                outcome = "failure",
                profile = %profile.name,
                serial = %serial,
                error = %e.error,
                "{}",
                e.message
            );
            return Err(match e.problem {
                Some((kind, detail)) => AcmeError::new(kind, detail),
                None => AcmeError::internal(e.error),
            });
        }
        let mut notice = Notice::new(Event::CertificateRevoked, &profile.name, self.clock.unix())
            .identifiers(&cert.identifiers);
        notice.account = Some(cert.account_id.clone());
        notice.order = Some(cert.order_id.clone());
        notice.serial = Some(serial.clone());
        notice.detail = Some(format!("reason {reason}"));
        let outbox = self.notifier.outbox(&notice);
        // The `certificate.revoked` row is written with the revocation: no
        // certificate is revoked without the trail saying who did it.
        let identifiers: Vec<RawIdentifier> =
            cert.identifiers.iter().map(RawIdentifier::from).collect();
        let reason_text = format!("reason {reason}");
        let fact = super::audit::Fact {
            account: Some(account.unwrap_or(&cert.account_id)),
            actor,
            serial: Some(&serial),
            identifiers: Some(&identifiers),
            detail: Some(&reason_text),
            ..super::audit::Fact::new(
                AuditEvent::CertificateRevoked,
                AuditOutcome::Success,
                &profile.name,
            )
        };
        let context = self.audit_context(&fact).await;
        let audit = context.row(&fact);
        match self
            .store
            .revoke_certificate(
                &profile.name,
                &serial,
                Some(reason as i64),
                self.clock.unix(),
                &outbox.jobs(),
                Some(&audit),
            )
            .await?
        {
            RevokeOutcome::Revoked => {
                crash_point!("revocation.stored");
                self.metrics.audited(&audit);
                self.notifier.posted(&outbox);
            }
            RevokeOutcome::AlreadyRevoked => {
                return Err(AcmeError::new(
                    ProblemType::AlreadyRevoked,
                    "the certificate is already revoked",
                ));
            }
            RevokeOutcome::NotFound => return Err(AcmeError::not_found("certificate")),
        }
        tracing::info!(
            event = "certificate.revoked",
            outcome = "success",
            profile = %profile.name,
            serial = %serial,
            reason,
            by = match &signer { RevocationSigner::Account(a) => a.id.as_str(), RevocationSigner::CertificateKey(_) => "certificate key", RevocationSigner::Operator(actor) => actor },
            "certificate revoked"
        );
        // The CRL should list the serial before we answer. If re-signing
        // fails the revocation still stands (it is recorded): the periodic
        // check re-signs any CRL missing a revocation (counted), so the
        // client is not told "failed" for something that happened.
        if !matches!(profile.signer.crl(), Crl::Signed { .. }) {
            return Ok(());
        }
        if let Err(e) = self.refresh_crl(profile).await {
            tracing::error!(
                event = "crl.refresh",
                outcome = "failure",
                profile = %profile.name,
                error = ?e.internal,
                "could not re-sign the CRL after a revocation; the periodic check will retry"
            );
        }
        Ok(())
    }

    /// The profile's current CRL (DER), signing a new one if there is none,
    /// the stored one is past half its life or misses a revocation
    /// ([`crl_needs_refresh`]).
    pub async fn crl(&self, profile: &Profile) -> AcmeResult<Vec<u8>> {
        let validity = match profile.signer.crl() {
            Crl::Signed { validity } => validity.as_secs() as i64,
            Crl::Served => {
                return match profile.signer.served_crl().await {
                    Ok(Some(der)) => Ok(der),
                    Ok(None) => Err(AcmeError::not_found(
                        "CRL (this profile's signer publishes none)",
                    )),
                    Err(e) => Err(AcmeError::internal(e)),
                };
            }
            Crl::None => {
                return Err(AcmeError::not_found(
                    "CRL (this profile's signer publishes none)",
                ));
            }
        };
        let now = self.clock.unix();
        let revocations = self.store.revocations(&profile.name).await?;
        match self.store.crl(&profile.name).await? {
            Some(row) if !crl_needs_refresh(&row, now, validity, revocations) => Ok(row.der),
            _ => self.refresh_crl(profile).await,
        }
    }

    /// Re-signs the CRL of `profile` with the next CRL number; the CRL the
    /// store holds afterwards, which is another process's when it stored a
    /// newer one meanwhile (so every process serves the same, newest CRL).
    pub async fn refresh_crl(&self, profile: &Profile) -> AcmeResult<Vec<u8>> {
        if !matches!(profile.signer.crl(), Crl::Signed { .. }) {
            return Err(AcmeError::not_found("CRL"));
        }
        // One signing at a time in this process; the number is reserved
        // in the database, for the other processes.
        let _guard = profile.crl_lock.lock().await;
        let now = self.clock.now();
        // Taken before the revocations are read: a CRL with a higher
        // number never lists fewer of them.
        let number = self.store.reserve_crl_number(&profile.name).await?;
        crash_point!("crl.number_reserved");
        let listed = self
            .store
            .revoked_entries(&profile.name, now.unix_timestamp())
            .await?;
        let (der, next_update) = profile
            .signer
            .sign_crl(number, now, &listed.entries)
            .await
            .map_err(AcmeError::internal)?;
        let stored = self
            .store
            .store_crl(
                &profile.name,
                &CrlRow {
                    number,
                    this_update: now.unix_timestamp(),
                    next_update: next_update.unix_timestamp(),
                    der: der.clone(),
                    revocations: Some(listed.revocations),
                },
            )
            .await?;
        if !stored {
            // Another process stored a CRL with a higher number while this
            // one signed: that is the CRL now.
            if let Some(newer) = self.store.crl(&profile.name).await? {
                return Ok(newer.der);
            }
        }
        tracing::info!(
            event = "crl.signed",
            outcome = "success",
            profile = %profile.name,
            number,
            entries = listed.entries.len(),
            "CRL signed"
        );
        Ok(der)
    }

    /// Re-signs every profile's CRL that is past half its life or misses
    /// a revocation; run periodically so a CRL never reaches its
    /// nextUpdate unreplaced, nor goes on without a revocation whose own
    /// re-sign failed.
    /// Profiles whose signer signs or serves none are skipped: asking would
    /// log an error every minute for a configuration that is fine. Returns how many profiles' CRLs could not be
    /// had (each logged as an error).
    pub async fn refresh_stale_crls(&self) -> usize {
        let mut failed = 0;
        for profile in self.profiles() {
            if profile.signer.crl() == Crl::None {
                continue;
            }
            if let Err(e) = self.crl(profile).await {
                failed += 1;
                tracing::error!(
                    event = "crl.refresh",
                    outcome = "failure",
                    profile = %profile.name,
                    error = ?e.internal,
                    "could not re-sign the CRL"
                );
            }
        }
        failed
    }
}

/// A CRL is re-signed once half of its validity has passed, so relying
/// parties always find one well before nextUpdate — and at once if the
/// profile has had a revocation it does not list: its count of
/// revocations (`revocations`) is above the one the CRL was signed with.
/// Counts, not times: the replica that revoked and the one that signed may
/// disagree on the time, and a revocation stamped before the CRL's
/// thisUpdate by a clock running behind may still be missing from it.
pub fn crl_needs_refresh(row: &CrlRow, now: i64, validity: i64, revocations: i64) -> bool {
    now >= row.next_update - validity / 2
        || row.revocations.is_none_or(|listed| listed < revocations)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CRL signed at `next_update - 100` listing 3 revocations.
    fn row(next_update: i64) -> CrlRow {
        CrlRow {
            number: 1,
            this_update: next_update - 100,
            next_update,
            der: vec![],
            revocations: Some(3),
        }
    }

    #[test]
    fn a_crl_is_re_signed_once_half_its_life_has_passed() {
        assert!(!crl_needs_refresh(&row(1100), 1000, 100, 3));
        assert!(!crl_needs_refresh(&row(1100), 1049, 100, 3));
        assert!(crl_needs_refresh(&row(1100), 1050, 100, 3));
        assert!(crl_needs_refresh(&row(1100), 2000, 100, 3));
    }

    #[test]
    fn a_crl_missing_a_revocation_is_re_signed_at_once_whatever_the_clocks_said() {
        assert!(!crl_needs_refresh(&row(1100), 1010, 100, 3));
        assert!(crl_needs_refresh(&row(1100), 1010, 100, 4));
        // Signed before counts were kept: re-signed once.
        let unknown = CrlRow {
            revocations: None,
            ..row(1100)
        };
        assert!(crl_needs_refresh(&unknown, 1010, 100, 0));
    }
}
