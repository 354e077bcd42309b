//! Store rows rendered as RFC 8555 §7.1 documents.

use acme_proxy_protocol::types::{Account, Authorization, AuthorizationStatus, Challenge, Order};
use acme_proxy_store::{AccountRow, AuthorizationRow, ChallengeRow, OrderRow};

use super::urls::Urls;
use crate::clock::rfc3339;

pub fn account(urls: &Urls, row: &AccountRow) -> Account {
    Account {
        status: row.status,
        contact: row.contact.clone(),
        terms_of_service_agreed: Some(row.tos_agreed),
        orders: urls.account_orders(&row.id),
    }
}

pub fn order(urls: &Urls, row: &OrderRow) -> Order {
    Order {
        status: row.status,
        expires: Some(rfc3339(row.expires_at)),
        identifiers: row.identifiers.clone(),
        not_before: row.not_before.map(rfc3339),
        not_after: row.not_after.map(rfc3339),
        error: row.error.clone(),
        authorizations: row
            .authorization_ids
            .iter()
            .map(|id| urls.authz(id))
            .collect(),
        finalize: urls.finalize(&row.id),
        certificate: row.certificate_id.as_deref().map(|id| urls.certificate(id)),
        profile: row.certificate_profile.clone(),
        replaces: row.replaces.clone(),
    }
}

pub fn challenge(urls: &Urls, row: &ChallengeRow) -> Challenge {
    Challenge {
        kind: row.kind,
        url: urls.challenge(&row.id),
        status: row.status,
        token: row.token.clone(),
        validated: row.validated_at.map(rfc3339),
        error: row.error.clone(),
    }
}

/// An authorization; one whose expiry has passed reads as `expired`
/// (§7.1.6) even before a sweep has written it.
pub fn authorization(
    urls: &Urls,
    row: &AuthorizationRow,
    challenges: &[ChallengeRow],
    now: i64,
) -> Authorization {
    let mut status = row.status;
    if matches!(
        status,
        AuthorizationStatus::Pending | AuthorizationStatus::Valid
    ) && row.expires_at <= now
    {
        status = AuthorizationStatus::Expired;
    }
    Authorization {
        identifier: row.identifier.clone(),
        status,
        expires: Some(rfc3339(row.expires_at)),
        challenges: challenges.iter().map(|c| challenge(urls, c)).collect(),
        wildcard: row.wildcard.then_some(true),
    }
}
