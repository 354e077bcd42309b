//! What finalize checks again (RFC 8555 §7.4): an order was `ready` once,
//! but its authorizations may have expired or been deactivated since, and
//! the CAA records seen when a name was validated may have changed.

use acme_proxy_protocol::ProblemType;
use acme_proxy_protocol::types::{AuthorizationStatus, ChallengeStatus, IdentifierType};
use acme_proxy_store::{AuthorizationRow, ChallengeRow, OrderRow};

use super::{Authority, Profile};
use crate::error::{AcmeError, AcmeResult};

impl Authority {
    /// Refuses to finalize `order` unless every one of its authorizations
    /// is valid and unexpired now, and — at a profile that checks CAA — a
    /// DNS name validated longer ago than `validation.caa_recheck_after`
    /// is still permitted by its CAA records (RFC 8659 §3 lets a CA rely
    /// on a lookup for a while; Boulder rechecks after 8 hours). Nothing
    /// changes on a refusal: the client may finalize again once it holds
    /// what is missing, until the order expires.
    pub(super) async fn recheck_authorizations(
        &self,
        profile: &Profile,
        account_url: &str,
        order: &OrderRow,
        authorizations: &[(AuthorizationRow, Vec<ChallengeRow>)],
    ) -> AcmeResult<()> {
        let now = self.clock.unix();
        let recheck_after =
            i64::try_from(self.validators.caa_recheck_after.as_secs()).unwrap_or(i64::MAX);
        // Read with the order (`authorizations`), in its order.
        for id in &order.authorization_ids {
            let (authz, challenges) = authorizations
                .iter()
                .find(|(a, _)| &a.id == id)
                .ok_or_else(|| AcmeError::internal("an order's authorization is missing"))?;
            let name = &authz.identifier.value;
            if authz.status != AuthorizationStatus::Valid {
                return Err(AcmeError::new(
                    ProblemType::OrderNotReady,
                    format!(
                        "the authorization for {name} is {} now; finalize needs every authorization valid",
                        authz.status
                    ),
                ));
            }
            if authz.expires_at <= now {
                return Err(AcmeError::new(
                    ProblemType::OrderNotReady,
                    format!(
                        "the authorization for {name} expired; finalize needs every authorization valid"
                    ),
                ));
            }
            if !rechecks_caa(profile) || authz.identifier.kind != IdentifierType::Dns {
                continue;
            }
            let validated = challenges.iter().filter_map(|c| c.validated_at).max();
            if validated.is_some_and(|at| now.saturating_sub(at) <= recheck_after) {
                continue;
            }
            let kind = challenges
                .iter()
                .find(|c| c.status == ChallengeStatus::Valid)
                .map_or("", |c| c.kind.as_str());
            let request = crate::validators::caa::CaaRequest {
                name,
                wildcard: authz.wildcard,
                identities: &profile.config.caa_identities,
                account_uri: account_url,
                method: kind,
            };
            crate::validators::caa::check(&self.validators, &request)
                .await
                .map_err(|e| {
                    AcmeError::new(
                        e.kind,
                        format!(
                            "CAA checked again at finalize, as {name} was validated more than {} ago: {}",
                            humantime::format_duration(self.validators.caa_recheck_after),
                            e.detail
                        ),
                    )
                })?;
        }
        Ok(())
    }
}

/// Whether a finalize at `profile` may check CAA again: where CAA is
/// checked and names are validated (a bypass validates nothing).
pub(super) fn rechecks_caa(profile: &Profile) -> bool {
    profile.config.caa && !profile.config.bypass
}
