//! The one gate every signed request passes before any handler logic runs
//! (RFC 8555 §6.2–§6.5), in this order:
//!
//! 1. `Content-Type: application/jose+json`, checked before the body is read (415);
//! 2. the body fits the configured limit (413);
//! 3. flattened JWS, no `crit`, exactly one of `jwk`/`kid`, supported `alg`
//!    (protocol crate);
//! 4. the protected `url` equals the URL reached (§6.4, `unauthorized`);
//! 5. a nonce is present and well-formed;
//! 6. the key: a strict `jwk`, or the `kid` of a valid account of *this*
//!    profile;
//! 7. the signature verifies with the algorithm taken from the key;
//! 8. the nonce is consumed, atomically, exactly once (`badNonce`) — for
//!    the requests of an issuance, checked here and recorded by their
//!    work's first statement ([`AppState::verify_deferring`]);
//! 9. the account is still valid (§7.3.6: 401 `unauthorized` otherwise) —
//!    as of the authority's copy of it, up to `account_cache_ttl` old, for a
//!    POST-as-GET or a resource whose writes check the account again in
//!    their own transaction.

use acme_proxy_protocol::{Jwk, Jws, KeyRef, ProblemType};
use acme_proxy_store::AccountRow;
use axum::body::Body;
use http::{HeaderMap, Uri, header};
use serde::de::DeserializeOwned;

use super::AppState;
use crate::authority::{DueNonce, Profile};
use crate::error::{AcmeError, AcmeResult};

/// Which key reference a resource accepts (§6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMode {
    /// newAccount: a `jwk`, no account yet.
    Jwk,
    /// Everything an account does: a `kid`.
    Kid,
    /// A `kid`, for a resource whose writes on the account's behalf carry
    /// an [`acme_proxy_store::AccountGuard`] (newOrder, challenge,
    /// finalize): the account may come from the authority's in-memory copy.
    /// (Refusals still write their audit row, and reading an order may
    /// expire it: neither depends on the account.)
    KidGuarded,
    /// revokeCert: either.
    Either,
}

/// A request that passed every check above.
#[derive(Debug)]
pub struct Verified {
    pub jws: Jws,
    pub key: Jwk,
    pub account: Option<AccountRow>,
}

impl Verified {
    /// The account of a `kid` request.
    pub fn account(&self) -> AcmeResult<&AccountRow> {
        self.account.as_ref().ok_or_else(|| {
            AcmeError::malformed("this resource needs a request signed with \"kid\"")
        })
    }

    /// The payload as `T`; malformed if it is not.
    pub fn payload<T: DeserializeOwned>(&self) -> AcmeResult<T> {
        if self.jws.is_post_as_get() {
            return Err(AcmeError::malformed(
                "this request needs a JSON payload, not POST-as-GET",
            ));
        }
        serde_json::from_slice(&self.jws.payload).map_err(|e| {
            AcmeError::malformed(format!(
                "the payload is not what this resource expects: {e}"
            ))
        })
    }

    /// Refuses anything but POST-as-GET (§6.3).
    pub fn require_post_as_get(&self) -> AcmeResult<()> {
        if self.jws.is_post_as_get() {
            Ok(())
        } else {
            Err(AcmeError::malformed(
                "POST-as-GET requires an empty payload (RFC 8555 §6.3)",
            ))
        }
    }
}

fn is_jose_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/jose+json"))
}

fn is_nonce_syntax(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 256
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl AppState {
    pub async fn verify(
        &self,
        profile: &Profile,
        headers: &HeaderMap,
        uri: &Uri,
        body: Body,
        mode: KeyMode,
    ) -> AcmeResult<Verified> {
        let (verified, nonce) = self
            .verify_checking(profile, headers, uri, body, mode, false)
            .await?;
        // Used in step 8 already.
        drop(nonce);
        Ok(verified)
    }

    /// [`AppState::verify`] with step 8 left half done: the nonce is
    /// checked, and its use is recorded by the request's work, run in
    /// `Authority::spending` — with that work's first statement on
    /// PostgreSQL, where a record of its own is a round trip. For the
    /// requests of every issuance (a new order, an authorization, a
    /// challenge, an order, a finalize).
    pub async fn verify_deferring(
        &self,
        profile: &Profile,
        headers: &HeaderMap,
        uri: &Uri,
        body: Body,
        mode: KeyMode,
    ) -> AcmeResult<(Verified, DueNonce)> {
        self.verify_checking(profile, headers, uri, body, mode, true)
            .await
    }

    async fn verify_checking(
        &self,
        profile: &Profile,
        headers: &HeaderMap,
        uri: &Uri,
        body: Body,
        mode: KeyMode,
        defer: bool,
    ) -> AcmeResult<(Verified, DueNonce)> {
        if !is_jose_json(headers) {
            return Err(AcmeError::malformed(
                "requests must be sent with Content-Type: application/jose+json (RFC 8555 §6.2)",
            )
            .with_status(415));
        }
        let too_large = || {
            AcmeError::malformed(format!(
                "the request body is larger than {} octets",
                self.max_body
            ))
            .with_status(413)
        };
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > self.max_body) {
            return Err(too_large());
        }
        let bytes = axum::body::to_bytes(body, self.max_body)
            .await
            .map_err(|_| too_large())?;
        let jws =
            Jws::parse(&bytes).map_err(|e| AcmeError::new(e.problem_type(), e.to_string()))?;

        let urls = self.urls(&profile.name);
        // The URL reached includes its query (the orders list pages with
        // `?page=N`), so a JWS for one page cannot be replayed at another.
        let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
        let reached = format!("{}{}", self.base_url, path);
        if jws.protected.url != reached {
            return Err(AcmeError::unauthorized(format!(
                "the JWS \"url\" {:?} is not the URL this request reached ({reached:?}) (RFC 8555 §6.4)",
                jws.protected.url
            )));
        }
        let nonce = jws.protected.nonce.clone().ok_or_else(|| {
            AcmeError::new(
                ProblemType::BadNonce,
                "the JWS has no \"nonce\" (RFC 8555 §6.5)",
            )
        })?;
        if !is_nonce_syntax(&nonce) {
            return Err(AcmeError::malformed(
                "the \"nonce\" is not base64url (RFC 8555 §6.5.1)",
            ));
        }

        let (key, account) = match (&jws.protected.key, mode) {
            (KeyRef::Jwk(_), KeyMode::Kid | KeyMode::KidGuarded) => {
                return Err(AcmeError::malformed(
                    "this resource needs a request signed with \"kid\" (the account URL), not \"jwk\"",
                ));
            }
            (KeyRef::Kid(_), KeyMode::Jwk) => {
                return Err(AcmeError::malformed(
                    "this resource needs a request signed with \"jwk\", not \"kid\"",
                ));
            }
            (KeyRef::Jwk(jwk), _) => (jwk.clone(), None),
            (KeyRef::Kid(kid), _) => {
                let id = urls.account_id_from_kid(kid).ok_or_else(|| {
                    AcmeError::new(
                        ProblemType::AccountDoesNotExist,
                        "the \"kid\" is not an account URL of this profile",
                    )
                })?;
                // A copy of the account kept in memory may verify a
                // POST-as-GET, or a request whose writes on the account's
                // behalf check the account again in their own transaction
                // (authority/known_accounts.rs).
                let may_use_copy = jws.is_post_as_get() || mode == KeyMode::KidGuarded;
                let (account, key) = self
                    .authority
                    .account_for_kid(profile, id, may_use_copy)
                    .await?;
                (key, Some(account))
            }
        };
        jws.verify(&key)
            .map_err(|e| AcmeError::new(e.problem_type(), e.to_string()))?;
        let due = if defer {
            self.authority.check_nonce(&nonce).await?
        } else {
            self.authority.consume_nonce(&nonce).await?;
            DueNonce::spent()
        };
        // Whether the account came from the store or from the authority's
        // in-memory copy: a copy is forgotten as soon as this process
        // deactivates the account, so it reads "deactivated" here too; a
        // copy another process made stale is caught by the guarded write
        // (`StoreError::AccountChanged`, also 401).
        if let Some(acct) = &account
            && acct.status != acme_proxy_protocol::types::AccountStatus::Valid
        {
            return Err(AcmeError::deactivated_account(format!(
                "the account is {}; it can no longer make requests (RFC 8555 §7.3.6)",
                acct.status
            )));
        }
        Ok((Verified { jws, key, account }, due))
    }
}
