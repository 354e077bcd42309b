//! Orders (RFC 8555 §7.4), authorizations (§7.5) and challenges (§7.5.1, §8).

use std::sync::Arc;

use acme_proxy_protocol::names::check_dns_name;
use acme_proxy_protocol::types::{
    AuthorizationStatus, ChallengeStatus, ChallengeType, Identifier, IdentifierType, NewOrder,
    OrderStatus, RawIdentifier,
};
use acme_proxy_protocol::{Problem, ProblemType, Subproblem};
use acme_proxy_store::{
    AccountRow, AuditEvent, AuthorizationRow, ChallengeRow, InsertOrder, NewAuthorization,
    NewChallenge, NewOrderRow, OrderAuthorizations, OrderRow,
};

use super::rate_limits::Limit;
use super::{Authority, Profile};
use crate::clock::parse_rfc3339;
use crate::config::CertificateProfileConfig;
use crate::config::Stage;
use crate::error::{AcmeError, AcmeResult};
use crate::ids;
use crate::signer::RequestedWindow;

impl Authority {
    /// newOrder (§7.4): checks every identifier (all faults reported at once,
    /// as one `compound` problem when there are several), and creates the
    /// order with one pending authorization per identifier. `req` is the
    /// payload, or why it did not parse: refused and audited like any
    /// refusal.
    pub async fn new_order(
        &self,
        profile: &Profile,
        account: &AccountRow,
        req: AcmeResult<&NewOrder>,
    ) -> AcmeResult<OrderRow> {
        let (result, identifiers) = match req {
            Ok(req) => (
                self.new_order_checked(profile, account, req).await,
                Some(&req.identifiers[..]),
            ),
            Err(e) => (Err(e), None),
        };
        if let Err(e) = &result {
            // The identifiers as asked, unchecked: the audit writer keeps
            // the first few, each cut to a DNS name's length, and their
            // number (`bounded`).
            self.audit(super::audit::Fact {
                account: Some(&account.id),
                identifiers,
                error: Some(e),
                ..super::audit::Fact::new(
                    AuditEvent::OrderRefused,
                    super::audit::outcome_of(e),
                    &profile.name,
                )
            })
            .await;
        }
        result
    }

    async fn new_order_checked(
        &self,
        profile: &Profile,
        account: &AccountRow,
        req: &NewOrder,
    ) -> AcmeResult<OrderRow> {
        if req.identifiers.is_empty() {
            return Err(AcmeError::malformed("the order has no identifiers"));
        }
        let max = profile.config.max_identifiers;
        if req.identifiers.len() > max {
            return Err(AcmeError::new(
                ProblemType::RejectedIdentifier,
                format!("an order may name at most {max} identifiers"),
            ));
        }
        // draft-ietf-acme-profiles §4: an unknown profile is refused
        // before anything else is looked at.
        let certificate_profile = profile
            .config
            .certificate_profile(req.profile.as_deref())
            .map_err(|asked| {
                let offered: Vec<&str> = profile
                    .config
                    .certificate_profiles
                    .keys()
                    .map(String::as_str)
                    .collect();
                AcmeError::new(
                    ProblemType::InvalidProfile,
                    if offered.is_empty() {
                        format!("this endpoint offers no certificate profiles; order without \"profile\" (asked for {asked:?})")
                    } else {
                        format!(
                            "{asked:?} is not a certificate profile of this endpoint; it offers {}",
                            offered.join(", ")
                        )
                    },
                )
            })?;
        // A signer that issues elsewhere (a relay's upstream) may not offer
        // the certificate profile: it would silently become its default.
        // While the upstream is known to be down it answers from the
        // directory it read before, if any: asking would be one request
        // timeout later and unknown.
        if let Some((name, _)) = certificate_profile
            && profile
                .signer
                .offers_profile(name, self.upstream_down(profile, None).await.is_none())
                .await
                == Some(false)
        {
            return Err(AcmeError::new(
                ProblemType::InvalidProfile,
                format!(
                    "the upstream CA of this endpoint does not offer the certificate profile {name:?}"
                ),
            ));
        }
        let mut identifiers: Vec<Identifier> = Vec::with_capacity(req.identifiers.len());
        let mut faults: Vec<Subproblem> = Vec::new();
        for id in &req.identifiers {
            match check_identifier(profile, &self.validators.egress, id).and_then(|normal| {
                match certificate_profile {
                    Some((name, cp)) => allowed_by(name, cp, normal),
                    None => Ok(normal),
                }
            }) {
                Ok(normal) => {
                    if !identifiers.contains(&normal) {
                        identifiers.push(normal);
                    }
                }
                Err((kind, detail)) => faults.push(Subproblem::new(kind, detail, id.clone())),
            }
        }
        // The names the account's external account credential allows (a
        // revoked credential refuses the whole order).
        faults.extend(self.external_account_limits(account, &identifiers).await?);
        // `[policy]`, for the identifiers nothing above refused.
        let checked: Vec<Identifier> = identifiers
            .iter()
            .filter(|id| {
                !faults
                    .iter()
                    .any(|f| f.identifier.as_ref() == Some(&RawIdentifier::from(*id)))
            })
            .cloned()
            .collect();
        let policy = self
            .policy_refusals(Stage::NewOrder, &profile.name, account, &checked)
            .await?;
        // A refusal by policy alone is a 403: the identifier is well
        // formed, and this client may not have it.
        let forbidden = faults.is_empty() && !policy.faults.is_empty();
        faults.extend(policy.faults);
        if faults.is_empty() {
            faults.extend(self.missing_delegations(profile, &identifiers).await);
        }
        let refusal = match faults.len() {
            0 => None,
            1 => {
                let only = faults.remove(0);
                let kind = only
                    .kind
                    .strip_prefix("urn:ietf:params:acme:error:")
                    .and_then(|n| ProblemType::ALL.into_iter().find(|t| t.name() == n))
                    .unwrap_or(ProblemType::RejectedIdentifier);
                let mut e = AcmeError::new(kind, only.detail.clone().unwrap_or_default());
                e.subproblems = vec![only];
                Some(e)
            }
            n => {
                let mut e = AcmeError::new(
                    ProblemType::Compound,
                    format!("{n} identifiers were refused; see subproblems"),
                );
                e.subproblems = faults;
                Some(e)
            }
        };
        if let Some(mut e) = refusal {
            // The audit row says which rule refused and what its checks were.
            if !policy.reasons.is_empty() {
                e.internal = Some(policy.reasons.join("; "));
            }
            if forbidden {
                e = e.with_status(403);
            }
            return Err(e);
        }

        let now = self.clock.unix();
        let replaces = match &req.replaces {
            Some(r) => {
                let (sent, cert_id) = self
                    .replaced_certificate(profile, account, r, &identifiers)
                    .await?;
                // An earlier replacing order past its lifetime is expired
                // first: abandoned, it must not block this one.
                let p = Problem::new(
                    ProblemType::Malformed,
                    "the order expired before it was finalized",
                );
                self.store
                    .expire_replacing_orders(&cert_id, now, &p)
                    .await?;
                Some((sent, cert_id))
            }
            None => None,
        };
        let (not_before, not_after) =
            self.requested_validity(profile, certificate_profile.map(|c| c.1), req, now)?;
        let expires_at = now + profile.config.order_lifetime.as_secs() as i64;
        let now_ms = self.clock.unix_ms();
        let mut authorizations = Vec::with_capacity(identifiers.len());
        for id in &identifiers {
            // RFC 8555 §7.1.3: a wildcard's authorization is for the base
            // name, flagged `wildcard`, and only dns-01 can prove it (§8.4).
            let (value, wildcard) = match id.value.strip_prefix("*.") {
                Some(base) if id.kind == IdentifierType::Dns => (base.to_owned(), true),
                _ => (id.value.clone(), false),
            };
            let identifier = Identifier {
                kind: id.kind,
                value,
            };
            let challenges = profile
                .config
                .challenges
                .iter()
                .filter(|&&kind| !wildcard || kind == ChallengeType::Dns01)
                // dns-01 cannot prove an IP address (RFC 8738 §7).
                .filter(|&&kind| {
                    identifier.kind != IdentifierType::Ip || kind != ChallengeType::Dns01
                })
                .map(|&kind| NewChallenge {
                    id: ids::object_id(now_ms),
                    kind,
                    token: ids::token(),
                })
                .collect();
            authorizations.push(NewAuthorization {
                id: ids::object_id(now_ms),
                identifier,
                wildcard,
                expires_at,
                challenges,
            });
        }
        let new = NewOrderRow {
            id: ids::object_id(now_ms),
            profile: profile.name.clone(),
            account_id: account.id.clone(),
            identifiers,
            not_before,
            not_after,
            expires_at,
            now,
            authorizations,
            // An authorization still valid from within the reuse window
            // replaces a new one (the store looks it up as it writes).
            reuse_validated_since: profile
                .config
                .authorization_reuse
                .map(|window| now - window.as_secs() as i64),
            certificate_profile: certificate_profile.map(|(name, _)| name.to_owned()),
            replaces,
            // One account cannot pile up work it never finishes. Counted
            // by the write, in its snapshot, so after the checks above:
            // on PostgreSQL N orders racing may pass it by N - 1 orders'
            // worth, a bound all the same.
            max_pending_authorizations: i64::try_from(
                self.pending_authorizations_cap(account, profile.config.max_pending_authorizations),
            )
            .unwrap_or(i64::MAX),
        };
        // An order that could not be issued, or names what failed
        // validation too often, is refused before anything is made.
        self.check_order_limits(account, &new.identifiers).await?;
        // Counted only for an order that would be made, and given back
        // when the store then does not make it.
        let place = self.take_new_order_place(account).await?;
        let inserted = self
            .store
            .insert_order(&new, super::guard(account))
            .await
            .map_err(|e| self.guarded_write_error(account, e));
        if !matches!(inserted, Ok(InsertOrder::Inserted(_))) {
            self.give_back(place).await;
        }
        let inserted = inserted?;
        crash_point!("order.created");
        let row = match inserted {
            InsertOrder::Inserted(row) => *row,
            // RFC 9773 §5: 409 with alreadyReplaced.
            InsertOrder::AlreadyReplaced => {
                return Err(AcmeError::new(
                    ProblemType::AlreadyReplaced,
                    "the certificate named by replaces is already replaced by another order that is not invalid",
                )
                .with_status(409));
            }
            InsertOrder::TooManyPending { pending } => {
                self.count_refusal(Limit::PendingAuthorizations);
                let mut e = AcmeError::new(
                    ProblemType::RateLimited,
                    format!(
                        "over the limit {} ({} at this profile): this account has {pending} pending authorizations; validate or let expire some before ordering more",
                        Limit::PendingAuthorizations.name(),
                        new.max_pending_authorizations,
                    ),
                );
                e.retry_after = Some(60);
                return Err(e);
            }
        };
        let reused = row
            .authorization_ids
            .iter()
            .filter(|id| !new.authorizations.iter().any(|a| &a.id == *id))
            .count();
        tracing::info!(
            event = "order.created",
            outcome = "success",
            profile = %profile.name,
            account = %account.id,
            order = %new.id,
            identifiers = new.identifiers.len(),
            reused_authorizations = reused,
            "order created"
        );
        if super::finalize::finalizes_unread(profile, &profile.signer.issuance()) {
            self.recent.keep_ordered(self.clock.unix_ms(), row.clone());
        }
        Ok(row)
    }

    /// notBefore/notAfter (§7.4): accepted when they describe a window this
    /// profile would issue anyway: not starting earlier than the signer's
    /// backdating allows nor later than the order lives, not ending in the
    /// past, and not longer than the signer's validity.
    fn requested_validity(
        &self,
        profile: &Profile,
        certificate_profile: Option<&CertificateProfileConfig>,
        req: &NewOrder,
        now: i64,
    ) -> AcmeResult<(Option<i64>, Option<i64>)> {
        let parse = |name: &str, v: &Option<String>| -> AcmeResult<Option<i64>> {
            v.as_deref()
                .map(|s| {
                    parse_rfc3339(s).ok_or_else(|| {
                        AcmeError::malformed(format!("{name} {s:?} is not an RFC 3339 timestamp"))
                    })
                })
                .transpose()
        };
        let not_before = parse("notBefore", &req.not_before)?;
        let not_after = parse("notAfter", &req.not_after)?;
        if not_before.is_none() && not_after.is_none() {
            return Ok((None, None));
        }
        // The signer says whether it can honour a requested window: the
        // operator's program is told it (it may still refuse it: badCSR);
        // a relay cannot forward it.
        let (default_validity, backdate) = match profile.signer.requested_window() {
            RequestedWindow::Honoured { validity, backdate } => (validity, backdate),
            RequestedWindow::Refused(detail) => return Err(AcmeError::malformed(detail)),
        };
        let validity = certificate_profile
            .and_then(|c| c.validity)
            .unwrap_or(default_validity)
            .as_secs() as i64;
        let backdate = backdate.as_secs() as i64;
        if let Some(nb) = not_before {
            if nb < now - backdate {
                return Err(AcmeError::malformed(format!(
                    "notBefore is more than {backdate} seconds in the past; certificates are not backdated further"
                )));
            }
            if nb > now + profile.config.order_lifetime.as_secs() as i64 {
                return Err(AcmeError::malformed(
                    "notBefore is further in the future than the order lives",
                ));
            }
        }
        let start = not_before.unwrap_or(now);
        let end = not_after.unwrap_or(start + validity);
        if end <= start || end <= now {
            return Err(AcmeError::malformed(
                "notAfter must be in the future and after notBefore",
            ));
        }
        if end - start > validity {
            return Err(AcmeError::malformed(format!(
                "the requested validity is longer than this profile issues ({validity} seconds)"
            )));
        }
        Ok((not_before, Some(end)))
    }

    /// Loads an order of `account` at `profile`, marking it invalid first if
    /// it has expired (§7.1.6: pending or ready orders expire).
    pub async fn order(
        &self,
        profile: &Profile,
        account: &AccountRow,
        id: &str,
    ) -> AcmeResult<OrderRow> {
        // Another account's order is answered as an unknown one: a
        // different answer would tell whoever asks that the id exists
        // (RFC 8555 §10.5). One this process just made valid is final
        // (`recent.rs`), and valid orders do not expire.
        if let Some(order) = self
            .recent
            .order(id, self.clock.unix_ms())
            .filter(|o| owns_order(o, profile, account))
        {
            return Ok(order);
        }
        let order = self
            .store
            .order(id)
            .await?
            .filter(|o| owns_order(o, profile, account))
            .ok_or_else(|| AcmeError::not_found("order"))?;
        Ok(self.expired(&order).await?.unwrap_or(order))
    }

    /// [`Authority::order`] with the order's authorizations and their
    /// challenges, read together (the finalize checks them again). An
    /// order that expired is answered without them.
    pub(super) async fn order_with_authorizations(
        &self,
        profile: &Profile,
        account: &AccountRow,
        id: &str,
    ) -> AcmeResult<OrderAuthorizations> {
        let (order, authorizations) = self
            .store
            .order_with_authorizations(id)
            .await?
            .filter(|(o, _)| owns_order(o, profile, account))
            .ok_or_else(|| AcmeError::not_found("order"))?;
        Ok(match self.expired(&order).await? {
            Some(expired) => (expired, Vec::new()),
            None => (order, authorizations),
        })
    }

    /// An order pending or ready past its expiry is invalid (§7.1.6),
    /// written when it is next read: the order as that left it, or `None`
    /// when `order` has not expired.
    async fn expired(&self, order: &OrderRow) -> AcmeResult<Option<OrderRow>> {
        let now = self.clock.unix();
        if !(matches!(order.status, OrderStatus::Pending | OrderStatus::Ready)
            && order.expires_at <= now)
        {
            return Ok(None);
        }
        let p = Problem::new(
            ProblemType::Malformed,
            "the order expired before it was finalized",
        );
        self.store.expire_order(&order.id, now, &p).await?;
        self.store
            .order(&order.id)
            .await?
            .map(Some)
            .ok_or_else(|| AcmeError::internal("order vanished after expiry"))
    }

    /// The account's orders (§7.1.2.1): `limit` of them after the first
    /// `offset` (the front end computes the offset of a page, checked).
    pub async fn account_orders(
        &self,
        account: &AccountRow,
        offset: i64,
        limit: i64,
    ) -> AcmeResult<Vec<String>> {
        Ok(self
            .store
            .account_order_ids(&account.id, offset, limit)
            .await?)
    }

    /// An authorization of `account` with its challenges (§7.5).
    pub async fn authorization(
        &self,
        profile: &Profile,
        account: &AccountRow,
        id: &str,
    ) -> AcmeResult<(AuthorizationRow, Vec<ChallengeRow>)> {
        let (authz, challenges) = self
            .store
            .authorization_with_challenges(id)
            .await?
            .filter(|(a, _)| owned_by(a, profile, account))
            .ok_or_else(|| AcmeError::not_found("authorization"))?;
        Ok((authz, challenges))
    }

    /// Deactivation of an authorization by its client (§7.5.2).
    pub async fn deactivate_authorization(
        &self,
        profile: &Profile,
        account: &AccountRow,
        id: &str,
    ) -> AcmeResult<(AuthorizationRow, Vec<ChallengeRow>)> {
        let (authz, _) = self.authorization(profile, account, id).await?;
        if !self.store.deactivate_authorization(&authz.id).await? {
            return Err(AcmeError::malformed(format!(
                "an authorization that is {} cannot be deactivated (only pending or valid ones)",
                authz.status
            )));
        }
        tracing::info!(
            event = "authorization.deactivated",
            outcome = "success",
            profile = %profile.name,
            account = %account.id,
            authorization = %authz.id,
            "authorization deactivated by its client"
        );
        self.authorization(profile, account, id).await
    }

    /// A challenge of `account` (§7.5.1).
    pub async fn challenge(
        &self,
        profile: &Profile,
        account: &AccountRow,
        id: &str,
    ) -> AcmeResult<(ChallengeRow, AuthorizationRow)> {
        let (ch, authz) = self
            .store
            .challenge_with_authorization(id)
            .await?
            .filter(|(_, a)| owned_by(a, profile, account))
            .ok_or_else(|| AcmeError::not_found("challenge"))?;
        Ok((ch, authz))
    }

    /// The client says it is ready (§7.5.1): the challenge goes processing
    /// and is validated in the background; with `bypass` it goes valid here.
    /// Returns the challenge as it now stands.
    pub async fn trigger_challenge(
        self: &Arc<Self>,
        profile: &Arc<Profile>,
        account: &AccountRow,
        id: &str,
    ) -> AcmeResult<(ChallengeRow, AuthorizationRow)> {
        let now = self.clock.unix();
        let valid_until = now + profile.config.authorization_lifetime.as_secs() as i64;
        if profile.config.bypass {
            // The trigger as it usually is — a pending challenge of this
            // account's, of a type the profile offers, its authorization
            // pending and unexpired — in one write transaction, without
            // reading the challenge first; the store writes nothing in
            // every other case, answered from the read below as without
            // bypass.
            // At most one of each type (the configuration names each once).
            let offered = offered(profile);
            let bypassed = self
                .store
                .bypass_challenge(
                    id,
                    &profile.name,
                    &offered,
                    now,
                    valid_until,
                    super::guard(account),
                )
                .await
                .map_err(|e| self.guarded_write_error(account, e))?;
            if let Some((ch, authz)) = bypassed {
                crash_point!("challenge.bypassed");
                self.bypassed(profile, &ch, &authz);
                return Ok((ch, authz));
            }
        }
        let (ch, authz) = self.challenge(profile, account, id).await?;
        if ch.status != ChallengeStatus::Pending {
            // §7.5.1: a repeated trigger is harmless; answer with the state.
            return Ok((ch, authz));
        }
        if authz.status != AuthorizationStatus::Pending || authz.expires_at <= now {
            // §7.1.6: past its expiry it reads as expired, written or not.
            let status = if authz.expires_at <= now {
                AuthorizationStatus::Expired
            } else {
                authz.status
            };
            return Err(AcmeError::malformed(format!(
                "the authorization is {status} and no longer accepts challenge responses"
            )));
        }
        if let Some(refused) = not_offered(profile, &ch) {
            return Err(refused);
        }
        if profile.config.bypass {
            // Statuses only move forward, and owner, profile and expiry do
            // not change: a challenge the bypass above did not move cannot
            // be pending, of an offered type, with its authorization
            // pending and unexpired now.
            return Err(AcmeError::internal(format!(
                "challenge {id} is pending with a pending authorization, yet the bypass did not move it"
            )));
        }
        // The state change and the job that settles it commit together.
        let payload = serde_json::json!({ "challenge": ch.id }).to_string();
        let now_ms = self.clock.unix_ms();
        let job = acme_proxy_store::NewJob {
            kind: super::VALIDATION_KIND,
            key: &ch.id,
            payload: &payload,
            run_at: now_ms,
            // Past the authorization's expiry a result is useless.
            deadline: Some(authz.expires_at * 1000),
            max_attempts: i64::from(self.queue.config().max_attempts),
            // One account's validations take at most
            // `jobs.validations_per_account` slots at once.
            fair_key: Some(&account.id),
        };
        if self
            .store
            .start_challenge_with_job(&ch.id, now, &job, now_ms, super::guard(account))
            .await
            .map_err(|e| self.guarded_write_error(account, e))?
        {
            crash_point!("challenge.started");
            self.queue.wake(super::VALIDATION_KIND);
            return Ok((
                ChallengeRow {
                    status: ChallengeStatus::Processing,
                    ..ch
                },
                authz,
            ));
        }
        // Another request started it first: answer with its state now.
        self.challenge(profile, account, id).await
    }

    /// The loud line every bypassed challenge gets.
    fn bypassed(&self, profile: &Profile, ch: &ChallengeRow, authz: &AuthorizationRow) {
        tracing::warn!(
            event = "validation.bypassed",
            outcome = "success",
            profile = %profile.name,
            challenge = %ch.id,
            identifier = %authz.identifier.value,
            "DANGER: validation bypass is on for this profile; the challenge is marked valid without any check"
        );
    }

    /// Records a validation outcome on the challenge, its authorization and
    /// orders, with `notices` (one store transaction). False when the
    /// challenge had already been settled (nothing written).
    pub(super) async fn settle(
        &self,
        profile: &Profile,
        ch: &ChallengeRow,
        result: Result<(), Problem>,
        notices: &[acme_proxy_store::NewJob<'_>],
    ) -> AcmeResult<bool> {
        let now = self.clock.unix();
        let valid_until = now + profile.config.authorization_lifetime.as_secs() as i64;
        Ok(self
            .store
            .settle_challenge(
                &ch.id,
                result.as_ref().map(|_| ()),
                now,
                valid_until,
                notices,
            )
            .await?)
    }
}

/// An account reads only its own authorizations and challenges, at the
/// profile the request came to. The others are answered exactly as unknown
/// ids are (404 `malformed`, the same detail): a different answer would
/// tell whoever asks that the id exists (RFC 8555 §10.5).
fn owned_by(authz: &AuthorizationRow, profile: &Profile, account: &AccountRow) -> bool {
    authz.profile == profile.name && authz.account_id == account.id
}

/// Whether `order` is `account`'s at `profile`.
pub(super) fn owns_order(order: &OrderRow, profile: &Profile, account: &AccountRow) -> bool {
    order.profile == profile.name && order.account_id == account.id
}

/// What a certificate profile allows of an identifier already checked
/// against the endpoint: its type, and a wildcard.
fn allowed_by(
    name: &str,
    cp: &CertificateProfileConfig,
    id: Identifier,
) -> Result<Identifier, (ProblemType, String)> {
    if !cp.identifier_types.contains(&id.kind) {
        return Err((
            ProblemType::RejectedIdentifier,
            format!(
                "certificate profile {name:?} does not certify {} identifiers",
                id.kind
            ),
        ));
    }
    if !cp.wildcards && id.value.starts_with("*.") {
        return Err((
            ProblemType::RejectedIdentifier,
            format!("certificate profile {name:?} does not certify wildcards"),
        ));
    }
    Ok(id)
}

impl Authority {
    /// For a signer that answers dns-01 in our own zone (a relay with
    /// `dns01_delegated`): the names whose `_acme-challenge` CNAME is
    /// missing or points elsewhere, each refused with the record to
    /// create. Checked at newOrder, when the client can still be told what
    /// to ask the DNS team for, rather than as the upstream CA's failed
    /// validation later. A lookup that gets no answer (a timeout, SERVFAIL)
    /// refuses nothing: it is logged, and the upstream decides.
    async fn missing_delegations(
        &self,
        profile: &Profile,
        identifiers: &[Identifier],
    ) -> Vec<acme_proxy_protocol::problem::Subproblem> {
        use hickory_resolver::proto::rr::{RData, RecordType};
        let Some(zone) = profile.signer.delegated_dns01_zone() else {
            return Vec::new();
        };
        let mut checked = std::collections::HashSet::new();
        let names: Vec<(&Identifier, String)> = identifiers
            .iter()
            .filter(|i| i.kind == IdentifierType::Dns)
            .filter_map(|id| {
                let base = id.value.trim_start_matches("*.");
                // Absolute, so no search domain is appended.
                checked
                    .insert(base.to_owned())
                    .then(|| (id, format!("_acme-challenge.{base}.")))
            })
            .collect();
        // One deadline for all the lookups, not one each: the names are the
        // client's, whose name servers may never answer, and the request
        // holds one of `max_in_flight` slots meanwhile. A name not looked up
        // in time is unknown, as a timeout is. The lookups run together, a
        // few at a time, so that an order of many names on slow name
        // servers has each of them checked within that deadline rather
        // than the first few; the tasks end with the request.
        let deadline = tokio::time::Instant::now() + self.validators.timeout;
        let mut found: Vec<Option<LookupOutcome>> = vec![None; names.len()];
        let mut lookups = tokio::task::JoinSet::new();
        let mut next = 0;
        loop {
            while next < names.len() && lookups.len() < DELEGATION_LOOKUPS_AT_ONCE {
                let resolver = Arc::clone(&self.validators.resolver);
                let name = names[next].1.clone();
                let at = next;
                lookups.spawn(async move {
                    let outcome = match tokio::time::timeout_at(
                        deadline,
                        resolver.lookup(name.as_str(), RecordType::CNAME),
                    )
                    .await
                    {
                        Ok(Ok(lookup)) => LookupOutcome::Found(lookup.answers().iter().find_map(
                            |r| match &r.data {
                                RData::CNAME(target) => Some(target.0.to_ascii()),
                                _ => None,
                            },
                        )),
                        Ok(Err(e)) if e.is_nx_domain() || e.is_no_records_found() => {
                            LookupOutcome::Found(None)
                        }
                        Ok(Err(e)) => LookupOutcome::Failed(e.to_string()),
                        Err(_) => LookupOutcome::Late,
                    };
                    (at, outcome)
                });
                next += 1;
            }
            match lookups.join_next().await {
                Some(Ok((at, outcome))) => found[at] = Some(outcome),
                // A lookup task cannot panic short of a bug in the
                // resolver; its name is then unknown, as a failure is.
                Some(Err(_)) => {}
                None => break,
            }
        }
        let mut faults = Vec::new();
        for ((id, name), outcome) in names.into_iter().zip(found) {
            let want = format!("{}.", crate::dns_zone::delegation_target(zone, &id.value));
            let record = crate::dns_zone::delegation_record(zone, &id.value);
            let target = match outcome {
                Some(LookupOutcome::Found(target)) => target,
                Some(LookupOutcome::Failed(e)) => {
                    tracing::warn!(event = "order.delegation", outcome = "unknown", %name, error = %e, "could not check the dns-01 delegation");
                    continue;
                }
                Some(LookupOutcome::Late) => {
                    tracing::warn!(event = "order.delegation", outcome = "unknown", %name, "the dns-01 delegation lookups of this order ran out of time");
                    continue;
                }
                None => {
                    tracing::warn!(event = "order.delegation", outcome = "unknown", %name, "the dns-01 delegation lookup of this name did not finish");
                    continue;
                }
            };
            let detail = match target {
                Some(target) if target.eq_ignore_ascii_case(&want) => continue,
                Some(target) => format!(
                    "{name} is an alias of {target}, not of this server's zone; the record must read: {record}"
                ),
                None => format!(
                    "{name} is not delegated to this server's zone; ask for this record: {record}"
                ),
            };
            faults.push(acme_proxy_protocol::problem::Subproblem::new(
                ProblemType::RejectedIdentifier,
                detail,
                RawIdentifier::from(id),
            ));
        }
        faults
    }
}

/// The `_acme-challenge` CNAME lookups one newOrder runs at once: enough
/// for an order of many names to be checked within one validation
/// timeout, few enough that `max_in_flight` such orders do not flood the
/// resolver.
const DELEGATION_LOOKUPS_AT_ONCE: usize = 8;

/// How one delegation lookup ended.
#[derive(Clone, Debug)]
enum LookupOutcome {
    /// The name's CNAME target, or none (no such name, no CNAME).
    Found(Option<String>),
    /// The resolver failed (SERVFAIL, refused…): unknown.
    Failed(String),
    /// Past the order's deadline: unknown.
    Late,
}

/// Syntax and policy for one identifier; returns it normalised.
fn check_identifier(
    profile: &Profile,
    egress: &crate::validators::Egress,
    id: &RawIdentifier,
) -> Result<Identifier, (ProblemType, String)> {
    // RFC 8555 §7.4: a type the server does not know is
    // `unsupportedIdentifier`, as is one this profile does not take.
    match id.kind.parse() {
        Ok(IdentifierType::Dns) => {
            let name = check_dns_name(&id.value).map_err(|e| {
                (
                    ProblemType::RejectedIdentifier,
                    format!("{:?}: {e}", id.value),
                )
            })?;
            if name.is_wildcard() && !profile.config.challenges.contains(&ChallengeType::Dns01) {
                return Err((
                    ProblemType::RejectedIdentifier,
                    format!(
                        "{:?}: a wildcard can only be proven with dns-01, which this profile does not offer",
                        id.value
                    ),
                ));
            }
            // Refused up front, when the signer cannot issue a wildcard,
            // rather than failing later (a relay's job).
            if name.is_wildcard()
                && let Some(why) = profile.signer.refuses_wildcards()
            {
                return Err((
                    ProblemType::RejectedIdentifier,
                    format!("{:?}: {why}", id.value),
                ));
            }
            Ok(Identifier::dns(name.as_str()))
        }
        // RFC 8738: IP addresses, proven by http-01 or tls-alpn-01.
        Ok(IdentifierType::Ip) if profile.config.ip_identifiers => {
            let ip: std::net::IpAddr = id.value.parse().map_err(|_| {
                (
                    ProblemType::Malformed,
                    format!("{:?} is not an IP address (RFC 8738 §3)", id.value),
                )
            })?;
            if !profile
                .config
                .challenges
                .iter()
                .any(|&c| c == ChallengeType::Http01 || c == ChallengeType::TlsAlpn01)
            {
                return Err((
                    ProblemType::RejectedIdentifier,
                    format!(
                        "{ip}: an IP address is proven by http-01 or tls-alpn-01, which this profile does not offer"
                    ),
                ));
            }
            // Refused here rather than at validation: no certificate for an
            // address validation would never be allowed to reach.
            if let Some(net) = egress.refusal(ip) {
                return Err((
                    ProblemType::RejectedIdentifier,
                    format!(
                        "{ip}: this server does not validate addresses in {net} (validation.deny_networks)"
                    ),
                ));
            }
            // The canonical text form, so the CSR's IP SAN compares equal.
            Ok(Identifier::ip(ip.to_string()))
        }
        _ => Err((
            ProblemType::UnsupportedIdentifier,
            format!(
                "identifier type {:?} is not supported at this profile ({})",
                id.kind,
                if profile.config.ip_identifiers {
                    "\"dns\" and \"ip\" are"
                } else {
                    "\"dns\" is"
                }
            ),
        )),
    }
}

/// Why `ch` may not be validated at `profile` now, if it may not: its type
/// is no longer among the profile's `challenges` (a reload took it away
/// after the authorization was made). The operator turned that method
/// off, so it proves nothing from then on: a response to it is refused
/// (the client answers another challenge of the authorization), and a
/// validation already under way fails, which ends the authorization and
/// its orders (the client orders again).
pub(super) fn not_offered(profile: &Profile, ch: &ChallengeRow) -> Option<AcmeError> {
    if profile.config.challenges.contains(&ch.kind) {
        return None;
    }
    // Never empty: the configuration refuses a profile without challenges.
    Some(AcmeError::malformed(format!(
        "profile {} no longer validates {}; it offers {}",
        profile.name,
        ch.kind,
        offered(profile).join(", ")
    )))
}

/// The challenge types `profile` offers now, as written in its
/// configuration.
fn offered(profile: &Profile) -> Vec<&str> {
    profile
        .config
        .challenges
        .iter()
        .map(|c| c.as_str())
        .collect()
}
