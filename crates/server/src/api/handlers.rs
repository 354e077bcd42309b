//! One handler per ACME resource (RFC 8555 §7). Each verifies the request
//! through [`AppState::verify`], calls the authority, and renders the result.

use acme_proxy_protocol::types::{
    AccountUpdate, Directory, DirectoryMeta, Finalize, KeyChange, NewAccount, NewOrder, OrdersList,
    RenewalInfo, Revocation, SuggestedWindow,
};
use acme_proxy_protocol::{Jws, KeyRef};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, StatusCode, Uri};

use super::reply::{Reply, respond};
use super::verify::KeyMode;
use super::{App, documents};
use crate::authority::RevocationSigner;
use crate::error::{AcmeError, AcmeResult};

/// Orders listed per page of an account's orders list (§7.1.2.1).
const ORDERS_PER_PAGE: i64 = 100;
/// Seconds a client is asked to wait before polling again.
const RETRY_AFTER: u64 = 1;

pub async fn directory(State(app): State<App>, Path(profile): Path<String>) -> Response {
    respond((|| {
        let p = app.profile(&profile)?;
        let urls = app.urls(&p.name);
        let c = &p.config;
        let meta = DirectoryMeta {
            terms_of_service: c.terms_of_service.clone(),
            website: c.website.clone(),
            caa_identities: c.caa_identities.clone(),
            external_account_required: c.eab == crate::config::EabMode::Required,
            profiles: c
                .certificate_profiles
                .iter()
                .map(|(name, cp)| (name.clone(), cp.description.clone()))
                .collect(),
        };
        let has_meta = meta.terms_of_service.is_some()
            || meta.website.is_some()
            || !meta.caa_identities.is_empty()
            || meta.external_account_required
            || !meta.profiles.is_empty();
        Ok(Reply::json(
            200,
            &Directory {
                new_nonce: urls.new_nonce(),
                new_account: urls.new_account(),
                new_order: urls.new_order(),
                revoke_cert: urls.revoke_cert(),
                key_change: urls.key_change(),
                new_authz: None,
                renewal_info: Some(urls.renewal_info()),
                meta: has_meta.then_some(meta),
            },
        ))
    })())
}

/// newNonce (§7.2): HEAD answers 200, GET 204; the nonce header is added by
/// the profile middleware like on every other response.
pub async fn new_nonce_head(State(app): State<App>, Path(profile): Path<String>) -> Response {
    respond(app.profile(&profile).map(|_| Reply::empty(StatusCode::OK)))
}

pub async fn new_nonce_get(State(app): State<App>, Path(profile): Path<String>) -> Response {
    respond(
        app.profile(&profile)
            .map(|_| Reply::empty(StatusCode::NO_CONTENT)),
    )
}

pub async fn new_account(
    State(app): State<App>,
    Path(profile): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app.verify(&p, &headers, &uri, body, KeyMode::Jwk).await?;
            let payload: NewAccount = req.payload()?;
            let (row, created) = app
                .authority
                .new_account(&p, &req.key, &payload, &req.jws.protected.url)
                .await?;
            let urls = app.urls(&p.name);
            Ok(Reply::json(
                if created { 201 } else { 200 },
                &documents::account(&urls, &row),
            )
            .location(urls.account(&row.id)))
        }
        .await,
    )
}

pub async fn account(
    State(app): State<App>,
    Path((profile, id)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app.verify(&p, &headers, &uri, body, KeyMode::Kid).await?;
            let acct = req.account()?;
            if acct.id != id {
                return Err(AcmeError::unauthorized(
                    "a request about an account must be signed by that account",
                ));
            }
            let urls = app.urls(&p.name);
            let row = if req.jws.is_post_as_get() {
                acct.clone()
            } else {
                let update: AccountUpdate = req.payload()?;
                app.authority.update_account(&p, acct, &update).await?
            };
            Ok(Reply::json(200, &documents::account(&urls, &row)).location(urls.account(&row.id)))
        }
        .await,
    )
}

#[derive(Debug, serde::Deserialize)]
pub struct PageQuery {
    #[serde(default)]
    page: i64,
}

pub async fn account_orders(
    State(app): State<App>,
    Path((profile, id)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app.verify(&p, &headers, &uri, body, KeyMode::Kid).await?;
            req.require_post_as_get()?;
            let acct = req.account()?;
            if acct.id != id {
                return Err(AcmeError::unauthorized(
                    "only the account itself may list its orders",
                ));
            }
            let page = q.page.max(0);
            let ids = app
                .authority
                .account_orders(acct, page, ORDERS_PER_PAGE + 1)
                .await?;
            let urls = app.urls(&p.name);
            let more = ids.len() as i64 > ORDERS_PER_PAGE;
            let orders = ids
                .iter()
                .take(ORDERS_PER_PAGE as usize)
                .map(|o| urls.order(o))
                .collect();
            let mut reply = Reply::json(200, &OrdersList { orders });
            if more {
                reply = reply.link(
                    &format!("{}?page={}", urls.account_orders(&acct.id), page + 1),
                    "next",
                );
            }
            Ok(reply)
        }
        .await,
    )
}

pub async fn key_change(
    State(app): State<App>,
    Path(profile): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app.verify(&p, &headers, &uri, body, KeyMode::Kid).await?;
            let acct = req.account()?;
            let inner_value: serde_json::Value = req.payload()?;
            let inner = Jws::from_value(&inner_value)
                .map_err(|e| AcmeError::new(e.problem_type(), format!("inner JWS: {e}")))?;
            // §7.3.5: the inner JWS has a jwk, the same url, and no nonce.
            let KeyRef::Jwk(new_key) = &inner.protected.key else {
                return Err(AcmeError::malformed(
                    "the inner JWS must carry the new key as \"jwk\"",
                ));
            };
            if inner.protected.url != req.jws.protected.url {
                return Err(AcmeError::malformed(
                    "the inner JWS \"url\" must equal the outer one",
                ));
            }
            if inner.protected.nonce.is_some() {
                return Err(AcmeError::malformed(
                    "the inner JWS must not carry a \"nonce\"",
                ));
            }
            inner
                .verify(new_key)
                .map_err(|e| AcmeError::new(e.problem_type(), format!("inner JWS: {e}")))?;
            let claims: KeyChange = serde_json::from_slice(&inner.payload)
                .map_err(|e| AcmeError::malformed(format!("inner payload: {e}")))?;
            let urls = app.urls(&p.name);
            let matches = claims.account == urls.account(&acct.id);
            let row = app
                .authority
                .change_key(&p, acct, matches, &claims.old_key, new_key, |id| {
                    urls.account(id)
                })
                .await?;
            Ok(Reply::json(200, &documents::account(&urls, &row)).location(urls.account(&row.id)))
        }
        .await,
    )
}

pub async fn new_order(
    State(app): State<App>,
    Path(profile): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app
                .verify(&p, &headers, &uri, body, KeyMode::KidGuarded)
                .await?;
            let payload: NewOrder = req.payload()?;
            let row = app
                .authority
                .new_order(&p, req.account()?, &payload)
                .await?;
            let urls = app.urls(&p.name);
            Ok(Reply::json(201, &documents::order(&urls, &row)?).location(urls.order(&row.id)))
        }
        .await,
    )
}

async fn order_reply(
    app: &App,
    profile: &str,
    row: &acme_proxy_store::OrderRow,
) -> AcmeResult<Reply> {
    let urls = app.urls(profile);
    let mut reply = Reply::json(200, &documents::order(&urls, row)?).location(urls.order(&row.id));
    if row.status == "processing" {
        reply = reply.retry_after(RETRY_AFTER);
    }
    Ok(reply)
}

pub async fn order(
    State(app): State<App>,
    Path((profile, id)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app.verify(&p, &headers, &uri, body, KeyMode::Kid).await?;
            req.require_post_as_get()?;
            let row = app.authority.order(&p, req.account()?, &id).await?;
            order_reply(&app, &p.name, &row).await
        }
        .await,
    )
}

pub async fn finalize(
    State(app): State<App>,
    Path((profile, id)): Path<(String, String)>,
    ctx: Option<axum::Extension<crate::authority::RequestContext>>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app
                .verify(&p, &headers, &uri, body, KeyMode::KidGuarded)
                .await?;
            let payload: Finalize = req.payload()?;
            let csr = URL_SAFE_NO_PAD
                .decode(payload.csr.trim_end_matches('='))
                .map_err(|_| {
                    AcmeError::new(
                        acme_proxy_protocol::ProblemType::BadCsr,
                        "\"csr\" is not base64url",
                    )
                })?;
            let row = app
                .authority
                .finalize(
                    &p,
                    req.account()?,
                    &id,
                    &csr,
                    &ctx.map(|c| c.0).unwrap_or_default(),
                )
                .await?;
            order_reply(&app, &p.name, &row).await
        }
        .await,
    )
}

#[derive(Debug, serde::Deserialize)]
struct AuthzUpdate {
    status: Option<String>,
}

pub async fn authz(
    State(app): State<App>,
    Path((profile, id)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app.verify(&p, &headers, &uri, body, KeyMode::Kid).await?;
            let acct = req.account()?;
            let (row, challenges) = if req.jws.is_post_as_get() {
                app.authority.authorization(&p, acct, &id).await?
            } else {
                let update: AuthzUpdate = req.payload()?;
                if update.status.as_deref() != Some("deactivated") {
                    return Err(AcmeError::malformed(
                        "an authorization accepts only POST-as-GET or {\"status\": \"deactivated\"} (RFC 8555 §7.5.2)",
                    ));
                }
                app.authority.deactivate_authorization(&p, acct, &id).await?
            };
            let urls = app.urls(&p.name);
            let doc = documents::authorization(&urls, &row, &challenges, app.authority.clock.unix())?;
            let mut reply = Reply::json(200, &doc);
            // A pending authorization will change (once its challenge is
            // answered and validated): tell pollers when to come back.
            if doc.status == acme_proxy_protocol::types::AuthorizationStatus::Pending {
                reply = reply.retry_after(RETRY_AFTER);
            }
            Ok(reply)
        }
        .await,
    )
}

pub async fn challenge(
    State(app): State<App>,
    Path((profile, id)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app
                .verify(&p, &headers, &uri, body, KeyMode::KidGuarded)
                .await?;
            let acct = req.account()?;
            let (ch, authz) = if req.jws.is_post_as_get() {
                app.authority.challenge(&p, acct, &id).await?
            } else {
                // §7.5.1: the client's "ready" is an empty JSON object; any
                // object is accepted (fields are ignored).
                let _: serde_json::Map<String, serde_json::Value> = req.payload()?;
                app.authority.trigger_challenge(&p, acct, &id).await?
            };
            let urls = app.urls(&p.name);
            let mut reply = Reply::json(200, &documents::challenge(&urls, &ch)?)
                .link(&urls.authz(&authz.id), "up");
            if ch.status == "processing" {
                reply = reply.retry_after(RETRY_AFTER);
            }
            Ok(reply)
        }
        .await,
    )
}

pub async fn certificate(
    State(app): State<App>,
    Path((profile, id)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app.verify(&p, &headers, &uri, body, KeyMode::Kid).await?;
            req.require_post_as_get()?;
            let cert = app.authority.certificate(&p, req.account()?, &id).await?;
            Ok(Reply::bytes(
                "application/pem-certificate-chain",
                cert.chain_pem.into_bytes(),
            ))
        }
        .await,
    )
}

pub async fn revoke_cert(
    State(app): State<App>,
    Path(profile): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let req = app
                .verify(&p, &headers, &uri, body, KeyMode::Either)
                .await?;
            let payload: Revocation = req.payload()?;
            let der = URL_SAFE_NO_PAD
                .decode(payload.certificate.trim_end_matches('='))
                .map_err(|_| AcmeError::malformed("\"certificate\" is not base64url DER"))?;
            let signer = match &req.account {
                Some(acct) => RevocationSigner::Account(acct),
                None => RevocationSigner::CertificateKey(req.key.thumbprint_b64()),
            };
            app.authority
                .revoke(&p, signer, &der, payload.reason)
                .await?;
            Ok(Reply::empty(StatusCode::OK))
        }
        .await,
    )
}

pub async fn crl(State(app): State<App>, Path(profile): Path<String>) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let der = app.authority.crl(&p).await?;
            Ok(Reply::bytes("application/pkix-crl", der))
        }
        .await,
    )
}

/// RenewalInfo (RFC 9773 §4): an unauthenticated GET answered with the
/// certificate's suggested window and a `Retry-After` saying when to ask
/// again.
pub async fn renewal_info(
    State(app): State<App>,
    Path((profile, id)): Path<(String, String)>,
) -> Response {
    respond(
        async {
            let p = app.profile(&profile)?;
            let w = app.authority.renewal_info(&p, &id).await?;
            let info = RenewalInfo {
                suggested_window: SuggestedWindow {
                    start: crate::clock::rfc3339(w.start),
                    end: crate::clock::rfc3339(w.end),
                },
                explanation_url: None,
            };
            Ok(Reply::json(200, &info).retry_after(w.retry_after))
        }
        .await,
    )
}

pub async fn ca_pem(State(app): State<App>, Path(profile): Path<String>) -> Response {
    respond(app.profile(&profile).map(|p| {
        Reply::bytes(
            "application/pem-certificate-chain",
            p.signer.ca_pem().as_bytes().to_vec(),
        )
    }))
}

pub async fn health(State(app): State<App>) -> Response {
    match app.authority.store.ping().await {
        Ok(()) => respond(Ok(Reply::json(200, &serde_json::json!({"status": "ok"})))),
        Err(e) => respond(Err(AcmeError::internal(e).with_status(503))),
    }
}

pub async fn not_found() -> Response {
    respond(Err(AcmeError::not_found("resource")))
}

pub async fn method_not_allowed() -> Response {
    respond(Err(AcmeError::malformed(
        "method not allowed on this resource",
    )
    .with_status(405)))
}

/// The relay's http01 strategy: the upstream CA fetches the key
/// authorization it asked for, verbatim (RFC 8555 §8.3), from our root.
pub async fn upstream_http01(State(app): State<App>, Path(token): Path<String>) -> Response {
    match app.board.get(&token) {
        Some(key_authorization) => (
            [(http::header::CONTENT_TYPE, "application/octet-stream")],
            key_authorization,
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
