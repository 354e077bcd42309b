//! Finalization (RFC 8555 §7.4), certificate download (§7.4.2), revocation
//! (§7.6) and the CRL (RFC 5280 §5).

use acme_proxy_protocol::jwk::EcCurve;
use acme_proxy_protocol::types::{Identifier, OrderStatus, RawIdentifier};
use acme_proxy_protocol::{Jwk, ProblemType};
use acme_proxy_store::{
    AccountRow, CertificateRow, CrlRow, NewCertificateRow, OrderRow, RevokeOutcome,
};
use time::OffsetDateTime;
use x509_parser::certification_request::{X509CertificationRequest, X509CertificationRequestInfo};
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::der_parser::der::parse_der;
use x509_parser::extensions::{GeneralName, ParsedExtension, X509Extension};
use x509_parser::objects::{oid_registry, oid2sn};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
    OID_PKCS9_EXTENSION_REQUEST,
};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::public_key::PublicKey;
use x509_parser::signature_algorithm::RsaSsaPssParams;
use x509_parser::x509::AlgorithmIdentifier;

use super::{Authority, Profile};
use crate::config::{ExtendedKeyUsage, SignerConfig};
use crate::error::{AcmeError, AcmeResult};
use crate::events::Event;
use crate::notify::Notice;
use crate::signer::extensions::{self, Side};
use crate::signer::{IssueContext, IssueRequest, SignerError};

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

/// What finalize keeps from a checked CSR.
struct CheckedCsr {
    spki_der: Vec<u8>,
    key_thumbprint: Option<String>,
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

fn bad_csr(detail: impl Into<String>) -> AcmeError {
    AcmeError::new(ProblemType::BadCsr, detail)
}

impl Authority {
    /// finalize (§7.4). With the embedded CA's key in memory the order goes
    /// ready → processing → valid in the one transaction that stores the
    /// certificate; with a token or an outside signer it is processing
    /// while the signer works. Either way the guarded ready → processing
    /// step makes two concurrent finalizes store exactly one certificate.
    /// A bad CSR leaves the order ready.
    pub async fn finalize(
        &self,
        profile: &Profile,
        account: &AccountRow,
        order_id: &str,
        csr_der: &[u8],
        ctx: &super::RequestContext,
    ) -> AcmeResult<OrderRow> {
        let result = self
            .finalize_checked(profile, account, order_id, csr_der, ctx)
            .await;
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
                    event: "certificate.issue_failed",
                    outcome: super::audit::outcome_of(e),
                    profile: &profile.name,
                    account: Some(&account.id),
                    order: Some(order_id),
                    identifiers: identifiers.as_deref(),
                    error: Some(e),
                    ..Default::default()
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
        let order = self.order(profile, account, order_id).await?;
        // An account whose external account credential was revoked since
        // it ordered finalizes nothing more.
        self.external_account_limits(account, &[]).await?;
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
            &order,
        )
        .await?;
        // The order's certificate profile, if the configuration still has
        // it (an operator may have removed it since: then the signer's
        // defaults apply).
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
        if let Some(relay) = profile.signer.relay() {
            return self
                .finalize_relay(profile, relay, account, &order, csr_der, ctx)
                .await;
        }
        // Who asked and from where, for the issuance's audit row: found
        // before the order is processing, because the reverse-name lookup
        // may take a while, and a client hanging up during it must not cost
        // a certificate already signed.
        let issued: Vec<RawIdentifier> =
            order.identifiers.iter().map(RawIdentifier::from).collect();
        let issued_fact = super::audit::Fact {
            event: "certificate.issued",
            outcome: "success",
            profile: &profile.name,
            account: Some(&account.id),
            order: Some(&order.id),
            identifiers: Some(&issued),
            ..Default::default()
        };
        let audit = self.audit_context(&issued_fact).await;
        // The embedded CA with its key in memory signs inside this request
        // in microseconds: the order goes ready → processing → valid in the
        // one transaction that stores the certificate, after signing, and
        // is never seen (nor left, by a crash or an error) processing. Of
        // two concurrent finalizes both sign but only one commits; the
        // other certificate never leaves the process (its serial is
        // logged). A token or an outside signer takes its time and may
        // keep a record of what it signed, so the order is processing
        // before it is asked, and exactly one request asks.
        let inline = profile
            .signer
            .local_ca()
            .is_some_and(|ca| ca.signs_in_memory());
        if !inline
            && !self
                .store
                .begin_finalize(&order.id, super::guard(account))
                .await
                .map_err(|e| self.guarded_write_error(account, e))?
        {
            return Err(AcmeError::new(
                ProblemType::OrderNotReady,
                "the order is already being finalized",
            ));
        }
        // From here the order is processing (outside signer): if this
        // request goes away before the outcome is recorded (the client hung
        // up while the signer ran), the guard marks it invalid rather than
        // leave it processing for ever.
        let mut guard = FinalizeGuard {
            store: self.store.clone(),
            order_id: order.id.clone(),
            armed: !inline,
        };
        let now = self.clock.now();
        let (default_nb, default_na) = match profile.signer.local_ca() {
            Some(ca) => ca.default_window(now, usage.and_then(|u| u.validity)),
            None => (
                now,
                now + usage
                    .and_then(|u| u.validity)
                    .unwrap_or(crate::signer::custom::DEFAULT_VALIDITY),
            ),
        };
        let not_before = order
            .not_before
            .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok())
            .unwrap_or(default_nb);
        let not_after = order
            .not_after
            .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok())
            .unwrap_or(default_na);
        let issued = profile
            .signer
            .issue(
                &IssueRequest {
                    now,
                    identifiers: &order.identifiers,
                    spki_der: &csr.spki_der,
                    not_before,
                    not_after,
                    key_usages: usage.and_then(|u| u.key_usages.as_deref()),
                    extended_key_usages: ExtendedKeyUsage::granted(purposes),
                },
                &IssueContext {
                    profile: &profile.name,
                    order_id: &order.id,
                    csr_der,
                    certificate_profile: order.certificate_profile.as_deref(),
                },
            )
            .await;
        let issued = match issued {
            Ok(issued) => issued,
            Err(SignerError::BadCsr(detail)) => {
                if !inline {
                    self.store.abort_finalize(&order.id).await?;
                }
                guard.armed = false;
                return Err(bad_csr(detail));
            }
            Err(e) => {
                let then = if inline {
                    "the order was not changed"
                } else if matches!(e, SignerError::Failed(_)) {
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
                tracing::error!(
                    event = "certificate.issue",
                    outcome = "failure",
                    profile = %profile.name,
                    account = %account.id,
                    order = %order.id,
                    error = %e,
                    then,
                    "the signer failed"
                );
                return Err(AcmeError::internal(e));
            }
        };
        let cert_id = crate::ids::object_id(self.clock.unix_ms());
        let mut notice = Notice::new(Event::CertificateIssued, &profile.name, self.clock.unix())
            .identifiers(&order.identifiers);
        notice.account = Some(account.id.clone());
        notice.order = Some(order.id.clone());
        notice.serial = Some(issued.serial.clone());
        notice.not_after = Some(crate::clock::rfc3339(issued.not_after));
        let outbox = self.notifier.outbox(&notice);
        // The issuance's audit row commits with the certificate.
        let audit_row = audit.row(&super::audit::Fact {
            serial: Some(&issued.serial),
            ..issued_fact
        });
        let cert_row = NewCertificateRow {
            id: &cert_id,
            profile: &profile.name,
            order_id: &order.id,
            account_id: &account.id,
            serial: &issued.serial,
            chain_pem: &issued.chain_pem,
            key_thumbprint: csr.key_thumbprint.as_deref(),
            identifiers: &order.identifiers,
            not_before: issued.not_before,
            not_after: issued.not_after,
            now: self.clock.unix(),
        };
        let jobs = outbox.jobs();
        let stored = if inline {
            self.store
                .complete_ready_order(&cert_row, &audit_row, &jobs, super::guard(account))
                .await
        } else {
            self.store
                .complete_order(&cert_row, &audit_row, &jobs)
                .await
        };
        let stored = match stored {
            Ok(stored) => stored,
            Err(e) => {
                if !inline {
                    // Signed by an outside PKI but not stored (e.g. a
                    // serial that another profile's certificate already
                    // has): the order cannot become valid; it is made
                    // invalid, not left processing. (Inline, the
                    // transaction rolled back whole: the order is still
                    // ready, and nothing signed left the process.)
                    let problem = acme_proxy_protocol::Problem::new(
                        ProblemType::ServerInternal,
                        "the certificate could not be stored; place a new order",
                    );
                    let _ = self.store.fail_order(&order.id, &problem).await;
                }
                guard.armed = false;
                if inline {
                    discarded(profile, account, &order, &issued.serial, &e.to_string());
                }
                return Err(self.guarded_write_error(account, e));
            }
        };
        guard.armed = false;
        if !stored {
            if !inline {
                return Err(AcmeError::internal(
                    "order left processing while it was being signed",
                ));
            }
            // Another finalize completed the order while this one signed
            // (or it became invalid): this certificate is dropped.
            discarded(
                profile,
                account,
                &order,
                &issued.serial,
                "the order was no longer ready",
            );
            return Err(AcmeError::new(
                ProblemType::OrderNotReady,
                "the order is no longer ready: another finalize request completed it, or it became invalid",
            ));
        }
        self.notifier.posted(&outbox);
        self.metrics.audited(&audit_row);
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
        // The order as the transaction left it (no read back).
        Ok(OrderRow {
            status: OrderStatus::Valid,
            certificate_id: Some(cert_id),
            ..order
        })
    }

    /// The certificate resource (§7.4.2), for the account that ordered it.
    pub async fn certificate(
        &self,
        profile: &Profile,
        account: &AccountRow,
        id: &str,
    ) -> AcmeResult<CertificateRow> {
        // Another account's certificate is answered as an unknown one: a
        // different answer would tell whoever asks that the id exists
        // (RFC 8555 §10.5).
        self.store
            .certificate(id)
            .await?
            .filter(|c| c.profile == profile.name && c.account_id == account.id)
            .ok_or_else(|| AcmeError::not_found("certificate"))
    }

    /// revokeCert (§7.6).
    pub async fn revoke(
        &self,
        profile: &Profile,
        signer: RevocationSigner<'_>,
        cert_der: &[u8],
        reason: Option<u64>,
    ) -> AcmeResult<()> {
        let (account, key_actor) = match &signer {
            RevocationSigner::Account(a) => (Some(a.id.clone()), None),
            RevocationSigner::CertificateKey(thumb) => {
                (None, Some(format!("certificate-key:{thumb}")))
            }
            RevocationSigner::Operator(actor) => (None, Some((*actor).to_owned())),
        };
        let by_key = matches!(signer, RevocationSigner::CertificateKey(_));
        let result = self.revoke_checked(profile, signer, cert_der, reason).await;
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
        if let Err(e) = &result
            && by_key
            && stored.is_none()
            && super::audit::outcome_of(e) == "refused"
        {
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
            return result;
        }
        let identifiers: Option<Vec<RawIdentifier>> = stored
            .as_ref()
            .map(|c| c.identifiers.iter().map(RawIdentifier::from).collect());
        // A serial of a certificate we did not issue is the client's text.
        let serial = serial.map(|s| crate::bounded::value(&s).into_owned());
        // Revoked by its key or an operator: the row is about the owner's
        // certificate, so `audit list --account` finds it.
        let account = account.or_else(|| stored.map(|c| c.account_id));
        let reason_text = format!("reason {}", reason.unwrap_or(0));
        self.audit(super::audit::Fact {
            event: if result.is_ok() {
                "certificate.revoked"
            } else {
                "certificate.revoke_failed"
            },
            outcome: match &result {
                Ok(()) => "success",
                Err(e) => super::audit::outcome_of(e),
            },
            profile: &profile.name,
            account: account.as_deref(),
            actor: key_actor.as_deref(),
            serial: serial.as_deref(),
            identifiers: identifiers.as_deref(),
            error: result.as_ref().err(),
            detail: Some(&reason_text),
            ..Default::default()
        })
        .await;
        result
    }

    async fn revoke_checked(
        &self,
        profile: &Profile,
        signer: RevocationSigner<'_>,
        cert_der: &[u8],
        reason: Option<u64>,
    ) -> AcmeResult<()> {
        let (_, x509) = X509Certificate::from_der(cert_der)
            .map_err(|_| AcmeError::malformed("\"certificate\" is not a DER X.509 certificate"))?;
        let serial = hex::encode(x509.raw_serial());
        let reason = reason.unwrap_or(0);
        if !CLIENT_REASONS.contains(&reason) {
            return Err(AcmeError::new(
                ProblemType::BadRevocationReason,
                format!("reason {reason} is not accepted; use one of {CLIENT_REASONS:?}"),
            ));
        }
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
        // A relayed certificate is revoked where it was issued first; only
        // then is it recorded here, so a failure leaves nothing half-done
        // and the client can simply retry.
        if let Some(relay) = profile.signer.relay()
            && let Err(e) = relay.revoke(cert_der, reason).await
        {
            tracing::warn!(
                event = "certificate.revoke",
                outcome = "failure",
                profile = %profile.name,
                serial = %serial,
                error = %e,
                "the upstream did not revoke the certificate"
            );
            let kind = e
                .problem_type
                .as_deref()
                .and_then(ProblemType::from_urn)
                .filter(|_| e.is_permanent());
            return Err(match kind {
                Some(kind) => AcmeError::new(
                    kind,
                    format!("the upstream CA refused the revocation: {}", e.detail),
                ),
                None => AcmeError::internal(e),
            });
        }
        // Likewise the operator's program, when it declares a revocation.
        if let Some(custom) = profile.signer.custom()
            && let Err(e) = custom.revoke(&serial, &cert.chain_pem, reason).await
        {
            tracing::warn!(
                event = "certificate.revoke",
                outcome = "failure",
                profile = %profile.name,
                serial = %serial,
                error = %e,
                "the revocation program did not revoke the certificate"
            );
            return Err(AcmeError::internal(e));
        }
        let mut notice = Notice::new(Event::CertificateRevoked, &profile.name, self.clock.unix())
            .identifiers(&cert.identifiers);
        notice.account = Some(cert.account_id.clone());
        notice.order = Some(cert.order_id.clone());
        notice.serial = Some(serial.clone());
        notice.detail = Some(format!("reason {reason}"));
        let outbox = self.notifier.outbox(&notice);
        match self
            .store
            .revoke_certificate(
                &profile.name,
                &serial,
                Some(reason as i64),
                self.clock.unix(),
                &outbox.jobs(),
            )
            .await?
        {
            RevokeOutcome::Revoked => self.notifier.posted(&outbox),
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
        // check re-signs any CRL older than the newest revocation, so the
        // client is not told "failed" for something that happened.
        if profile.signer.local_ca().is_none() {
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

    /// The profile's current CRL (DER), signing a new one if there is none
    /// or the stored one is past half its life.
    pub async fn crl(&self, profile: &Profile) -> AcmeResult<Vec<u8>> {
        if let Some(custom) = profile.signer.custom() {
            return match custom.crl().await {
                Ok(Some(der)) => Ok(der),
                Ok(None) => Err(AcmeError::not_found(
                    "CRL (this profile's signer publishes none)",
                )),
                Err(e) => Err(AcmeError::internal(e)),
            };
        }
        let validity = match profile.signer.local_ca() {
            Some(ca) => ca.crl_validity().as_secs() as i64,
            None => {
                return Err(AcmeError::not_found(
                    "CRL (this profile's signer publishes none)",
                ));
            }
        };
        let now = self.clock.unix();
        let latest = self.store.latest_revocation(&profile.name).await?;
        match self.store.crl(&profile.name).await? {
            Some(row) if !crl_needs_refresh(&row, now, validity, latest) => Ok(row.der),
            _ => self.refresh_crl(profile).await,
        }
    }

    /// Re-signs the CRL of `profile` with the next CRL number.
    pub async fn refresh_crl(&self, profile: &Profile) -> AcmeResult<Vec<u8>> {
        let Some(ca) = profile.signer.local_ca() else {
            return Err(AcmeError::not_found("CRL"));
        };
        let _guard = profile.crl_lock.lock().await;
        let now = self.clock.now();
        let number = self.store.next_crl_number(&profile.name).await?;
        let entries = self
            .store
            .revoked_entries(&profile.name, now.unix_timestamp())
            .await?;
        let (der, next_update) = ca
            .sign_crl(number, now, &entries)
            .await
            .map_err(AcmeError::internal)?;
        self.store
            .store_crl(
                &profile.name,
                &CrlRow {
                    number,
                    this_update: now.unix_timestamp(),
                    next_update: next_update.unix_timestamp(),
                    der: der.clone(),
                },
            )
            .await?;
        tracing::info!(
            event = "crl.signed",
            outcome = "success",
            profile = %profile.name,
            number,
            entries = entries.len(),
            "CRL signed"
        );
        Ok(der)
    }

    /// Re-signs every profile's CRL that is past half its life; run
    /// periodically so a CRL never reaches its nextUpdate unreplaced.
    /// Profiles whose signer publishes no CRL are skipped (see
    /// [`publishes_crl`]). Returns how many profiles' CRLs could not be
    /// had (each logged as an error).
    pub async fn refresh_stale_crls(&self) -> usize {
        let mut failed = 0;
        for profile in self.profiles() {
            if !publishes_crl(&profile.config.signer) {
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

/// Whether a profile with `signer` publishes a CRL, and so whether the
/// periodic refresh asks for it: the embedded CA signs one (RFC 5280 §5);
/// a custom signer serves its program's only when it declares a `crl`
/// operation; a relay publishes none (its upstream CA does). Asking a
/// signer without one would log an error every minute for a
/// configuration that is fine.
pub fn publishes_crl(signer: &SignerConfig) -> bool {
    match signer {
        SignerConfig::LocalCa(_) => true,
        SignerConfig::Custom(custom) => custom.crl.is_some(),
        SignerConfig::Relay(_) => false,
    }
}

/// A CRL is re-signed once half of its validity has passed, so relying
/// parties always find one well before nextUpdate — and at once if a
/// revocation is not older than it (`latest_revocation`, Unix seconds): a
/// revocation in the same second as the CRL may have missed it, and costs
/// at most a re-sign during that second.
pub fn crl_needs_refresh(
    row: &CrlRow,
    now: i64,
    validity: i64,
    latest_revocation: Option<i64>,
) -> bool {
    now >= row.next_update - validity / 2 || latest_revocation.is_some_and(|r| r >= row.this_update)
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

pub(crate) fn leaf_der(chain_pem: &str) -> Option<Vec<u8>> {
    pem::parse_many(chain_pem)
        .ok()?
        .into_iter()
        .next()
        .map(pem::Pem::into_contents)
}

/// The CSR checks of §7.4, made before any signer sees the CSR, whatever
/// the signer: a SHA-2 self-signature that verifies; a subject of
/// commonNames only; at most one extensionRequest, asking only for what
/// [`extensions::check_extensions`] lets in (`requestable`: the extKeyUsage
/// purposes the order's certificate profile lets a CSR ask for); exactly
/// the order's names (SANs, and the CN if any); and an acceptable key that
/// is not the account key.
fn check_csr(
    der: &[u8],
    identifiers: &[Identifier],
    account_thumbprint: &str,
    requestable: &[ExtendedKeyUsage],
) -> AcmeResult<CheckedCsr> {
    let (rest, csr) = X509CertificationRequest::from_der(der)
        .map_err(|_| bad_csr("the CSR is not a DER PKCS#10 request"))?;
    if !rest.is_empty() {
        return Err(bad_csr("the CSR has trailing data"));
    }
    check_csr_signature(&csr.signature_algorithm)?;
    csr.verify_signature()
        .map_err(|_| bad_csr("the CSR's signature does not verify with its own key"))?;
    let info = &csr.certification_request_info;
    extensions::check_subject(Side::Request, &info.subject).map_err(bad_csr)?;
    let requested = requested_extensions(info)?;
    extensions::check_extensions(Side::Request, requested, requestable).map_err(bad_csr)?;

    let mut names: Vec<Identifier> = Vec::new();
    for ext in requested {
        if let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() {
            for gn in &san.general_names {
                let id = match gn {
                    GeneralName::DNSName(n) => Identifier::dns(n.to_ascii_lowercase()),
                    GeneralName::IPAddress(bytes) => {
                        let ip = match bytes.len() {
                            4 => std::net::IpAddr::from(
                                <[u8; 4]>::try_from(*bytes).map_err(|_| bad_csr("bad IP SAN"))?,
                            ),
                            16 => std::net::IpAddr::from(
                                <[u8; 16]>::try_from(*bytes).map_err(|_| bad_csr("bad IP SAN"))?,
                            ),
                            _ => return Err(bad_csr("an IP address SAN has a bad length")),
                        };
                        Identifier::ip(ip.to_string())
                    }
                    other => {
                        return Err(bad_csr(format!(
                            "the CSR asks for a SAN of a kind this server does not issue: {other}"
                        )));
                    }
                };
                if !names.contains(&id) {
                    names.push(id);
                }
            }
        }
    }
    for cn in info.subject.iter_common_name() {
        let cn = cn
            .as_str()
            .map_err(|_| bad_csr("the CSR's common name is not a string"))?
            .to_ascii_lowercase();
        if !identifiers.iter().any(|i| i.value == cn) {
            return Err(bad_csr(format!(
                "the CSR's common name {cn:?} is not one of the order's identifiers"
            )));
        }
        if !names.iter().any(|i| i.value == cn) {
            names.push(Identifier::dns(cn));
        }
    }
    let mut want: Vec<&Identifier> = identifiers.iter().collect();
    let mut got: Vec<&Identifier> = names.iter().collect();
    want.sort();
    got.sort();
    if want != got {
        return Err(bad_csr(format!(
            "the CSR names {:?} but the order is for {:?}; they must be the same set (RFC 8555 §7.4)",
            got.iter().map(|i| i.value.as_str()).collect::<Vec<_>>(),
            want.iter().map(|i| i.value.as_str()).collect::<Vec<_>>()
        )));
    }

    let key_thumbprint = checked_key(&info.subject_pki)?;
    if key_thumbprint.as_deref() == Some(account_thumbprint) {
        return Err(bad_csr("the certificate key must not be the account key"));
    }
    Ok(CheckedCsr {
        spki_der: info.subject_pki.raw.to_vec(),
        key_thumbprint,
    })
}

/// The extensions a CSR asks for: those of its one extensionRequest
/// attribute (PKCS #9, RFC 2985 §5.4.2, which makes it SINGLE VALUE); none
/// without one. Two attributes, or two values, are refused rather than one
/// of them chosen: x509-parser's `requested_extensions` reads the first,
/// another reader (an operator's program) may read the last, and would then
/// act on extensions these checks never saw.
fn requested_extensions<'s>(
    info: &'s X509CertificationRequestInfo<'_>,
) -> AcmeResult<&'s [X509Extension<'s>]> {
    let mut found = info
        .attributes()
        .iter()
        .filter(|a| a.oid == OID_PKCS9_EXTENSION_REQUEST);
    let Some(attribute) = found.next() else {
        return Ok(&[]);
    };
    if found.next().is_some() {
        return Err(bad_csr(
            "the CSR has more than one extensionRequest attribute (1.2.840.113549.1.9.14); one is accepted (RFC 2985 §5.4.2)",
        ));
    }
    // The attribute's values, a SET (RFC 2986 §4.1).
    let values = parse_der(attribute.value)
        .ok()
        .and_then(|(_, set)| set.as_set().ok().map(Vec::len));
    if values != Some(1) {
        return Err(bad_csr(
            "the CSR's extensionRequest attribute does not have exactly one value (RFC 2985 §5.4.2)",
        ));
    }
    match attribute.parsed_attribute() {
        ParsedCriAttribute::ExtensionRequest(request) => Ok(&request.extensions),
        _ => Err(bad_csr(
            "the CSR's extensionRequest attribute does not parse",
        )),
    }
}

/// How a CSR may be signed. RFC 8555 §7.4 leaves it to the CA; SHA-1 and
/// MD5 are refused (as Let's Encrypt's Boulder does) because their
/// collisions are practical: the self-signature over a weak digest proves
/// little about what was signed. ECDSA with SHA-512 and Ed25519 are left
/// out because nothing here can verify them (ring has no P-256/P-384 with
/// SHA-512) or issue for them (an Ed25519 key: see [`checked_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CsrSignature {
    RsaSha256,
    RsaSha384,
    RsaSha512,
    /// RSASSA-PSS, its hash named in its parameters.
    RsaPss,
    EcdsaSha256,
    EcdsaSha384,
}

impl CsrSignature {
    const ALL: [Self; 6] = [
        Self::RsaSha256,
        Self::RsaSha384,
        Self::RsaSha512,
        Self::RsaPss,
        Self::EcdsaSha256,
        Self::EcdsaSha384,
    ];

    /// Its AlgorithmIdentifier (RFC 4055 §5 and §3.1, RFC 5758 §3.2).
    fn oid(self) -> &'static str {
        match self {
            Self::RsaSha256 => "1.2.840.113549.1.1.11",
            Self::RsaSha384 => "1.2.840.113549.1.1.12",
            Self::RsaSha512 => "1.2.840.113549.1.1.13",
            Self::RsaPss => "1.2.840.113549.1.1.10",
            Self::EcdsaSha256 => "1.2.840.10045.4.3.2",
            Self::EcdsaSha384 => "1.2.840.10045.4.3.3",
        }
    }
}

/// The hashes an RSASSA-PSS signature may use: SHA-256, SHA-384, SHA-512
/// (RFC 4055 §2.1; an absent hashAlgorithm means SHA-1, §3.1).
const PSS_HASHES: [&str; 3] = [
    "2.16.840.1.101.3.4.2.1",
    "2.16.840.1.101.3.4.2.2",
    "2.16.840.1.101.3.4.2.3",
];

const CSR_SIGNATURES_SAID: &str = "accepted: RSA (PKCS #1 v1.5 or PSS) with SHA-256, SHA-384 or SHA-512, and ECDSA with SHA-256 or SHA-384";

/// The CSR's signature algorithm is one of [`CsrSignature`], checked before
/// its signature is (a SHA-1 signature would verify).
fn check_csr_signature(algorithm: &AlgorithmIdentifier<'_>) -> AcmeResult<()> {
    let oid = &algorithm.algorithm;
    let dotted = oid.to_id_string();
    let Some(signature) = CsrSignature::ALL.into_iter().find(|s| s.oid() == dotted) else {
        let name = oid2sn(oid, oid_registry()).unwrap_or("an unknown algorithm");
        return Err(bad_csr(format!(
            "the CSR is signed with {name} ({dotted}); {CSR_SIGNATURES_SAID}"
        )));
    };
    if signature == CsrSignature::RsaPss {
        let hash = algorithm
            .parameters
            .as_ref()
            .and_then(|p| RsaSsaPssParams::try_from(p).ok())
            .map(|p| p.hash_algorithm_oid().to_id_string());
        if !hash.as_deref().is_some_and(|h| PSS_HASHES.contains(&h)) {
            return Err(bad_csr(format!(
                "the CSR's RSASSA-PSS signature uses {}; {CSR_SIGNATURES_SAID}",
                hash.as_deref().unwrap_or("parameters that do not parse")
            )));
        }
    }
    Ok(())
}

/// The SubjectPublicKeyInfo (DER) and key thumbprint of a stored CSR that
/// finalize already checked.
pub(super) fn csr_key(der: &[u8]) -> Result<(Vec<u8>, Option<String>), String> {
    let (_, csr) = X509CertificationRequest::from_der(der).map_err(|e| e.to_string())?;
    let spki = &csr.certification_request_info.subject_pki;
    let thumbprint = checked_key(spki).map_err(|e| e.detail)?;
    Ok((spki.raw.to_vec(), thumbprint))
}

/// An acceptable key (ECDSA P-256/P-384, RSA 2048–8192) and its RFC 7638
/// thumbprint.
fn checked_key(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> AcmeResult<Option<String>> {
    let alg = &spki.algorithm.algorithm;
    let key_thumbprint = if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .ok_or_else(|| bad_csr("the CSR's EC key names no curve"))?;
        let point = spki.subject_public_key.data.as_ref();
        if curve == OID_EC_P256 {
            Jwk::from_ec_point(EcCurve::P256, point).map(|j| j.thumbprint_b64())
        } else if curve == OID_NIST_EC_P384 {
            Jwk::from_ec_point(EcCurve::P384, point).map(|j| j.thumbprint_b64())
        } else {
            return Err(bad_csr(
                "the CSR's EC key is on a curve this server does not issue for; use P-256 or P-384",
            ));
        }
    } else if *alg == OID_PKCS1_RSAENCRYPTION {
        let Ok(PublicKey::RSA(rsa)) = spki.parsed() else {
            return Err(bad_csr("the CSR's RSA key does not parse"));
        };
        let bits = rsa.key_size();
        if !(2048..=8192).contains(&bits) {
            return Err(bad_csr(format!(
                "the CSR's RSA key has {bits} bits; 2048 to 8192 are accepted"
            )));
        }
        let strip = |b: &[u8]| {
            b.iter()
                .skip_while(|x| **x == 0)
                .copied()
                .collect::<Vec<u8>>()
        };
        let exponent = strip(rsa.exponent);
        // 65537 only, as Boulder: e = 3 is what the PKCS #1 v1.5 signature
        // forgeries against lax verifiers need (Bleichenbacher, 2006), and
        // no TLS stack needs any other.
        if exponent != [0x01, 0x00, 0x01] {
            let said = if exponent.len() <= 8 {
                exponent
                    .iter()
                    .fold(0u64, |n, b| (n << 8) | u64::from(*b))
                    .to_string()
            } else {
                format!("of {} bytes", exponent.len())
            };
            return Err(bad_csr(format!(
                "the CSR's RSA key has public exponent {said}; only 65537 is accepted"
            )));
        }
        Jwk::rsa(strip(rsa.modulus), exponent)
            .ok()
            .map(|j| j.thumbprint_b64())
    } else {
        return Err(bad_csr(
            "the CSR's key type is not accepted; use ECDSA P-256/P-384 or RSA of at least 2048 bits",
        ));
    };
    Ok(key_thumbprint)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(next_update: i64) -> CrlRow {
        CrlRow {
            number: 1,
            this_update: next_update - 100,
            next_update,
            der: vec![],
        }
    }

    #[test]
    fn a_crl_is_re_signed_once_half_its_life_has_passed() {
        assert!(!crl_needs_refresh(&row(1100), 1000, 100, None));
        assert!(!crl_needs_refresh(&row(1100), 1049, 100, None));
        assert!(crl_needs_refresh(&row(1100), 1050, 100, None));
        assert!(crl_needs_refresh(&row(1100), 2000, 100, None));
    }

    #[test]
    fn a_crl_older_than_the_newest_revocation_is_re_signed_at_once() {
        // row(1100) was signed at 1000.
        assert!(!crl_needs_refresh(&row(1100), 1010, 100, Some(999)));
        assert!(crl_needs_refresh(&row(1100), 1010, 100, Some(1000)));
        assert!(crl_needs_refresh(&row(1100), 1010, 100, Some(1005)));
    }

    #[test]
    fn only_the_embedded_ca_and_a_custom_signer_with_a_crl_program_have_their_crl_refreshed() {
        let config = crate::config::Config::from_toml(
            "[profiles.ca]\n\
             [profiles.edge.signer]\ntype = \"relay\"\ndirectory = \"https://ca.test/dir\"\n\
             [profiles.plain.signer]\ntype = \"custom\"\ncommand = \"/bin/true\"\n\
             [profiles.listed.signer]\ntype = \"custom\"\ncommand = \"/bin/true\"\n\
             [profiles.listed.signer.crl]\ncommand = \"/bin/true\"\n",
        )
        .unwrap();
        let refreshed = |name: &str| publishes_crl(&config.profiles[name].signer);
        assert!(refreshed("ca"));
        assert!(!refreshed("edge"), "a relay publishes no CRL");
        assert!(!refreshed("plain"), "a custom signer without a crl program");
        assert!(refreshed("listed"));
    }

    fn csr(names: &[&str], key: &rcgen::KeyPair) -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        // rcgen's default subject has a CN that is no identifier.
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.serialize_request(key).unwrap().der().to_vec()
    }

    #[test]
    fn csr_names_must_be_exactly_the_orders() {
        let key = rcgen::KeyPair::generate().unwrap();
        let order = vec![
            Identifier::dns("a.example.test"),
            Identifier::dns("b.example.test"),
        ];
        assert!(
            check_csr(
                &csr(&["b.example.test", "A.example.test"], &key),
                &order,
                "x",
                ANY_TLS
            )
            .is_ok()
        );
        let e = check_csr(&csr(&["a.example.test"], &key), &order, "x", ANY_TLS)
            .err()
            .unwrap();
        assert_eq!(e.kind, ProblemType::BadCsr);
        let e = check_csr(
            &csr(
                &["a.example.test", "b.example.test", "c.example.test"],
                &key,
            ),
            &order,
            "x",
            ANY_TLS,
        )
        .err()
        .unwrap();
        assert_eq!(e.kind, ProblemType::BadCsr);
    }

    #[test]
    fn a_csr_with_a_broken_signature_is_bad() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut der = csr(&["a.example.test"], &key);
        let last = der.len() - 1;
        der[last] ^= 1;
        let e = check_csr(&der, &[Identifier::dns("a.example.test")], "x", ANY_TLS)
            .err()
            .unwrap();
        assert_eq!(e.kind, ProblemType::BadCsr);
    }

    #[test]
    fn the_account_key_cannot_be_certified() {
        let key = rcgen::KeyPair::generate().unwrap();
        let der = csr(&["a.example.test"], &key);
        let thumb = check_csr(&der, &[Identifier::dns("a.example.test")], "x", ANY_TLS)
            .unwrap_or_else(|e| panic!("{}", e.detail))
            .key_thumbprint
            .unwrap();
        let e = check_csr(&der, &[Identifier::dns("a.example.test")], &thumb, ANY_TLS)
            .err()
            .unwrap();
        assert_eq!(e.kind, ProblemType::BadCsr);
    }

    /// What a CSR may ask for at a profile that names no purposes.
    const ANY_TLS: &[ExtendedKeyUsage] =
        &[ExtendedKeyUsage::ServerAuth, ExtendedKeyUsage::ClientAuth];

    const NAME: &str = "a.example.test";

    /// A CSR for `NAME` (its SAN, no subject) by rcgen, after `tweak`, with
    /// extra PKCS #10 `attributes`.
    fn rcgen_csr(
        tweak: fn(&mut rcgen::CertificateParams),
        attributes: Vec<rcgen::Attribute>,
    ) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![NAME.to_owned()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        tweak(&mut params);
        params
            .serialize_request_with_attributes(&key, attributes)
            .unwrap()
            .der()
            .to_vec()
    }

    /// A DER TLV with a short-form length (every value here is short).
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let len = u8::try_from(content.len()).unwrap();
        assert!(len < 0x80);
        [&[tag, len][..], content].concat()
    }

    /// A CSR for `NAME` made by the openssl command line: an RSA key from
    /// `genpkey` with `key_options`, signed with `digest`.
    fn openssl_csr(key_options: &[&str], digest: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap_or_else(|e| panic!("the openssl command is needed here: {e}"));
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let mut genpkey = vec!["genpkey", "-algorithm", "RSA", "-out", "key.pem"];
        genpkey.extend(key_options.iter().flat_map(|o| ["-pkeyopt", o]));
        run(&genpkey);
        let san = format!("subjectAltName=DNS:{NAME}");
        run(&[
            "req", "-new", "-key", "key.pem", digest, "-subj", "/", "-addext", &san, "-outform",
            "DER", "-out", "csr.der",
        ]);
        std::fs::read(dir.path().join("csr.der")).unwrap()
    }

    fn refusal(der: &[u8], requestable: &[ExtendedKeyUsage]) -> String {
        match check_csr(der, &[Identifier::dns(NAME)], "x", requestable) {
            Ok(_) => "accepted".to_owned(),
            Err(e) => {
                assert_eq!(e.kind, ProblemType::BadCsr, "{}", e.detail);
                e.detail
            }
        }
    }

    #[test]
    fn a_csr_asking_for_more_than_its_names_and_tls_usages_is_bad_csr() {
        use rcgen::{DnType, ExtendedKeyUsagePurpose as Eku, KeyUsagePurpose as Ku};
        // A second extensionRequest attribute asking for basicConstraints
        // cA TRUE (critical): Extensions inside the attribute's SET.
        let ca_true = tlv(
            0x30,
            &[
                &[0x06, 0x03, 0x55, 0x1d, 0x13, 0x01, 0x01, 0xff][..],
                &tlv(0x04, &tlv(0x30, &[0x01, 0x01, 0xff])),
            ]
            .concat(),
        );
        let second_request = || {
            vec![rcgen::Attribute {
                oid: &[1, 2, 840, 113_549, 1, 9, 14],
                values: tlv(0x31, &tlv(0x30, &ca_true)),
            }]
        };
        let table: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "an O attribute",
                rcgen_csr(
                    |p| p.distinguished_name.push(DnType::OrganizationName, "Evil"),
                    vec![],
                ),
                "subject has O (2.5.4.10)",
            ),
            (
                "an OU attribute beside the CN",
                rcgen_csr(
                    |p| {
                        p.distinguished_name.push(DnType::CommonName, NAME);
                        p.distinguished_name
                            .push(DnType::OrganizationalUnitName, "Ops");
                    },
                    vec![],
                ),
                "subject has OU (2.5.4.11)",
            ),
            (
                "codeSigning",
                rcgen_csr(
                    |p| p.extended_key_usages = vec![Eku::ServerAuth, Eku::CodeSigning],
                    vec![],
                ),
                "extKeyUsage serverAuth, codeSigning",
            ),
            (
                "anyExtendedKeyUsage",
                rcgen_csr(|p| p.extended_key_usages = vec![Eku::Any], vec![]),
                "extKeyUsage anyExtendedKeyUsage",
            ),
            (
                "keyCertSign",
                rcgen_csr(
                    |p| p.key_usages = vec![Ku::DigitalSignature, Ku::KeyCertSign],
                    vec![],
                ),
                "keyUsage has keyCertSign",
            ),
            (
                "nameConstraints",
                rcgen_csr(
                    |p| {
                        // permittedSubtrees: one dNSName.
                        let subtrees = tlv(0xa0, &tlv(0x30, &tlv(0x82, b"example.test")));
                        p.custom_extensions
                            .push(rcgen::CustomExtension::from_oid_content(
                                &[2, 5, 29, 30],
                                tlv(0x30, &subtrees),
                            ));
                    },
                    vec![],
                ),
                "nameConstraints (2.5.29.30)",
            ),
            (
                "basicConstraints CA:TRUE",
                rcgen_csr(
                    |p| p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained),
                    vec![],
                ),
                "basicConstraints cA TRUE",
            ),
            (
                "an extension nobody knows",
                rcgen_csr(
                    |p| {
                        p.custom_extensions
                            .push(rcgen::CustomExtension::from_oid_content(
                                &[1, 3, 6, 1, 4, 1, 55555, 7],
                                vec![0x05, 0x00],
                            ))
                    },
                    vec![],
                ),
                "does not issue: 1.3.6.1.4.1.55555.7",
            ),
            (
                "two extensionRequest attributes",
                rcgen_csr(|_| {}, second_request()),
                "more than one extensionRequest",
            ),
            (
                "a SHA-1 signature",
                openssl_csr(&["rsa_keygen_bits:2048"], "-sha1"),
                "sha1WithRSAEncryption (1.2.840.113549.1.1.5)",
            ),
            (
                "an RSA key with exponent 3",
                openssl_csr(&["rsa_keygen_bits:2048", "rsa_keygen_pubexp:3"], "-sha256"),
                "public exponent 3;",
            ),
        ];
        for (case, der, said) in &table {
            let detail = refusal(der, ANY_TLS);
            assert!(detail.contains(said), "{case}: {detail}");
        }
        // The same tools make CSRs that pass: the refusals are the cases'.
        assert_eq!(refusal(&rcgen_csr(|_| {}, vec![]), ANY_TLS), "accepted");
        assert_eq!(
            refusal(&openssl_csr(&["rsa_keygen_bits:2048"], "-sha256"), ANY_TLS),
            "accepted"
        );
    }

    #[test]
    fn a_csr_asking_for_usages_within_the_certificate_profile_passes() {
        use rcgen::{ExtendedKeyUsagePurpose as Eku, KeyUsagePurpose as Ku};
        // What cert-manager sends (usages encoded in the request,
        // basicConstraints cA FALSE), with must-staple as certbot and lego
        // send it: TLS Feature, status_request (5).
        let der = rcgen_csr(
            |p| {
                p.key_usages = vec![Ku::DigitalSignature, Ku::KeyEncipherment];
                p.extended_key_usages = vec![Eku::ServerAuth, Eku::ClientAuth];
                p.is_ca = rcgen::IsCa::ExplicitNoCa;
                p.custom_extensions
                    .push(rcgen::CustomExtension::from_oid_content(
                        &[1, 3, 6, 1, 5, 5, 7, 1, 24],
                        tlv(0x30, &[0x02, 0x01, 0x05]),
                    ));
            },
            vec![],
        );
        assert_eq!(refusal(&der, ANY_TLS), "accepted");
        // A profile granting clientAuth alone refuses serverAuth.
        let detail = refusal(&der, &[ExtendedKeyUsage::ClientAuth]);
        assert!(detail.contains("may ask for clientAuth only"), "{detail}");
        let client_only = rcgen_csr(|p| p.extended_key_usages = vec![Eku::ClientAuth], vec![]);
        assert_eq!(
            refusal(&client_only, &[ExtendedKeyUsage::ClientAuth]),
            "accepted"
        );
    }
}
