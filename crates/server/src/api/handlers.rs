//! One handler per ACME resource (RFC 8555 §7). Each verifies the request
//! through [`AppState::verify`], calls the authority, and renders the result.

use acme_proxy_protocol::types::{
    AccountUpdate, Directory, DirectoryMeta, Finalize, KeyChange, NewAccount, NewOrder, OrdersList,
    RenewalInfo, Revocation, SuggestedWindow,
};
use acme_proxy_protocol::{Jws, KeyRef, base64url};
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, Uri};

use super::reply::{Reply, respond};
use super::verify::KeyMode;
use super::{App, documents};
use crate::authority::RevocationSigner;
use crate::error::{AcmeError, AcmeResult};

/// Orders listed per page of an account's orders list (§7.1.2.1).
const ORDERS_PER_PAGE: u32 = 100;
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
    /// Kept as text and read by [`orders_page`], so that no number is too
    /// large for the query extractor.
    page: Option<String>,
}

/// One page of an account's orders list, as `?page=N` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OrdersPage {
    number: u64,
    /// Orders before the page; None for a page past any list this server
    /// can hold (its offset does not fit the store's integers): empty.
    offset: Option<i64>,
}

/// Reads `?page=` (§7.1.2.1 leaves the paging URLs to the server; ours are
/// `…/orders?page=N`, from 0). Whatever the number, the arithmetic is
/// checked: a page too far for an offset, even one past `u64`, is a page
/// past the end of the list, answered empty without a `next` link, as any
/// page past the end is. Anything but decimal digits is `malformed`.
fn orders_page(page: Option<&str>) -> AcmeResult<OrdersPage> {
    let Some(text) = page else {
        return Ok(OrdersPage {
            number: 0,
            offset: Some(0),
        });
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AcmeError::malformed(
            "?page= takes a page number (0, 1, 2, …), as the orders list's Link rel=\"next\" gives it",
        ));
    }
    // Digits only: parsing fails only when the number exceeds u64.
    let Ok(number) = text.parse::<u64>() else {
        return Ok(OrdersPage {
            number: u64::MAX,
            offset: None,
        });
    };
    let offset = number
        .checked_mul(u64::from(ORDERS_PER_PAGE))
        .and_then(|o| i64::try_from(o).ok())
        // The store reads one more than a page, to know if a next exists.
        .filter(|o| o.checked_add(i64::from(ORDERS_PER_PAGE) + 1).is_some());
    Ok(OrdersPage { number, offset })
}

pub async fn account_orders(
    State(app): State<App>,
    Path((profile, id)): Path<(String, String)>,
    query: Result<Query<PageQuery>, QueryRejection>,
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
            let Query(q) = query.map_err(|e| {
                AcmeError::malformed(format!("the query string is not understood: {e}"))
            })?;
            let page = orders_page(q.page.as_deref())?;
            let per_page = i64::from(ORDERS_PER_PAGE);
            let ids = match page.offset {
                Some(offset) => {
                    app.authority
                        .account_orders(acct, offset, per_page + 1)
                        .await?
                }
                None => Vec::new(),
            };
            let urls = app.urls(&p.name);
            let more = ids.len() > ORDERS_PER_PAGE as usize;
            let orders = ids
                .iter()
                .take(ORDERS_PER_PAGE as usize)
                .map(|o| urls.order(o))
                .collect();
            let mut reply = Reply::json(200, &OrdersList { orders });
            if more && let Some(next) = page.number.checked_add(1) {
                reply = reply.link(
                    &format!("{}?page={next}", urls.account_orders(&acct.id)),
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
            let (req, nonce) = app
                .verify_deferring(&p, &headers, &uri, body, KeyMode::KidGuarded)
                .await?;
            let row = app
                .authority
                .spending(nonce, async {
                    let account = req.account()?;
                    let payload = req.payload::<NewOrder>();
                    app.authority
                        .new_order(&p, account, payload.as_ref().map_err(Clone::clone))
                        .await
                })
                .await?;
            let urls = app.urls(&p.name);
            Ok(Reply::json(201, &documents::order(&urls, &row)).location(urls.order(&row.id)))
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
    let mut reply = Reply::json(200, &documents::order(&urls, row)).location(urls.order(&row.id));
    if row.status == acme_proxy_protocol::types::OrderStatus::Processing {
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
            let (req, nonce) = app
                .verify_deferring(&p, &headers, &uri, body, KeyMode::Kid)
                .await?;
            let row = app
                .authority
                .spending(nonce, async {
                    req.require_post_as_get()?;
                    app.authority.order(&p, req.account()?, &id).await
                })
                .await?;
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
            let (req, nonce) = app
                .verify_deferring(&p, &headers, &uri, body, KeyMode::KidGuarded)
                .await?;
            // §7.4: "the base64url-encoded version of the DER format", with
            // §6.1's rule that a value with trailing '=' MUST be rejected.
            // An encoding fault is the request's (malformed); badCSR is for
            // a CSR that decodes but is unacceptable.
            let csr = req.payload::<Finalize>().and_then(|payload| {
                base64url::decode(&payload.csr).map_err(|_| {
                    AcmeError::malformed(
                        "\"csr\" is not the unpadded base64url of a DER CSR (RFC 8555 §7.4, §6.1)",
                    )
                })
            });
            let ctx = ctx.map(|c| c.0).unwrap_or_default();
            let row = app
                .authority
                .spending(nonce, async {
                    app.authority
                        .finalize(
                            &p,
                            req.account()?,
                            &id,
                            csr.as_deref().map_err(Clone::clone),
                            &ctx,
                        )
                        .await
                })
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
            let (req, nonce) = app
                .verify_deferring(&p, &headers, &uri, body, KeyMode::Kid)
                .await?;
            let (row, challenges) = app
                .authority
                .spending(nonce, async {
                    let acct = req.account()?;
                    if req.jws.is_post_as_get() {
                        return app.authority.authorization(&p, acct, &id).await;
                    }
                    let update: AuthzUpdate = req.payload()?;
                    // The one status a client may ask for; anything else,
                    // known or not, is refused alike.
                    if update.status.and_then(|s| s.parse().ok())
                        != Some(acme_proxy_protocol::types::AuthorizationStatus::Deactivated)
                    {
                        return Err(AcmeError::malformed(
                            "an authorization accepts only POST-as-GET or {\"status\": \"deactivated\"} (RFC 8555 §7.5.2)",
                        ));
                    }
                    app.authority.deactivate_authorization(&p, acct, &id).await
                })
                .await?;
            let urls = app.urls(&p.name);
            let doc = documents::authorization(&urls, &row, &challenges, app.authority.clock.unix());
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
            let (req, nonce) = app
                .verify_deferring(&p, &headers, &uri, body, KeyMode::KidGuarded)
                .await?;
            let (ch, authz) = app
                .authority
                .spending(nonce, async {
                    let acct = req.account()?;
                    if req.jws.is_post_as_get() {
                        return app.authority.challenge(&p, acct, &id).await;
                    }
                    // §7.5.1: the client's "ready" is an empty JSON object;
                    // any object is accepted (fields are ignored).
                    let _: serde_json::Map<String, serde_json::Value> = req.payload()?;
                    app.authority.trigger_challenge(&p, acct, &id).await
                })
                .await?;
            let urls = app.urls(&p.name);
            let mut reply = Reply::json(200, &documents::challenge(&urls, &ch))
                .link(&urls.authz(&authz.id), "up");
            if ch.status == acme_proxy_protocol::types::ChallengeStatus::Processing {
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
            let payload = req.payload::<Revocation>();
            let reason = payload.as_ref().ok().and_then(|p| p.reason.clone());
            // §7.6: base64url DER, unpadded as §6.1 requires.
            let der = payload.and_then(|payload| {
                base64url::decode(&payload.certificate).map_err(|_| {
                    AcmeError::malformed(
                        "\"certificate\" is not the unpadded base64url of a DER certificate (RFC 8555 §7.6, §6.1)",
                    )
                })
            });
            let signer = match &req.account {
                Some(acct) => RevocationSigner::Account(acct),
                None => RevocationSigner::CertificateKey(req.key.thumbprint_b64()),
            };
            app.authority
                .revoke(&p, signer, der.as_deref().map_err(Clone::clone), reason)
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

/// `/`: the profiles this server answers for, each with its directory URL
/// (what a client is configured with) and how it signs: an HTML page for
/// a browser (its `Accept` names `text/html`), JSON otherwise.
pub async fn index(State(app): State<App>, headers: HeaderMap) -> Response {
    use crate::config::SignerConfig;

    // (name, directory URL, the signer's `type`, what it is, for people).
    let mut profiles: Vec<(String, String, &'static str, &'static str)> = app
        .authority
        .profiles()
        .map(|p| {
            let (signer, signs) = match &p.config.signer {
                SignerConfig::LocalCa(_) => ("local_ca", "the embedded CA"),
                SignerConfig::Relay(_) => ("relay", "an upstream ACME CA, through the relay"),
                SignerConfig::Custom(_) => ("custom", "the operator's program"),
            };
            (p.name.clone(), app.urls(&p.name).directory(), signer, signs)
        })
        .collect();
    profiles.sort();
    let wants_html = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| {
            accept
                .split(',')
                .any(|t| t.trim().to_ascii_lowercase().starts_with("text/html"))
        });
    if !wants_html {
        let profiles: Vec<_> = profiles
            .iter()
            .map(|(name, directory, signer, _)| {
                serde_json::json!({"name": name, "directory": directory, "signer": signer})
            })
            .collect();
        return respond(Ok(Reply::json(
            200,
            &serde_json::json!({"profiles": profiles}),
        )));
    }
    let mut rows = String::new();
    for (name, directory, _, signs) in &profiles {
        rows.push_str(&format!(
            "<tr><td>{}</td><td><a href=\"{url}\">{url}</a></td><td>{signs}</td></tr>\n",
            html_escape(name),
            url = html_escape(directory),
        ));
    }
    let page = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>acme-proxy</title></head>\n<body><h1>acme-proxy</h1>\n<p>An ACME (RFC 8555) server. Point a client such as certbot or lego at a profile's directory URL.</p>\n<table><thead><tr><th>profile</th><th>directory</th><th>signed by</th></tr></thead>\n<tbody>\n{rows}</tbody></table></body></html>\n"
    );
    respond(Ok(Reply::bytes(
        "text/html; charset=utf-8",
        page.into_bytes(),
    )))
}

/// Text for an HTML page: the five characters that could end a text node
/// or an attribute value, as entities.
fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub async fn health(State(app): State<App>) -> Response {
    match app.authority.ping().await {
        Ok(()) => respond(Ok(Reply::json(200, &serde_json::json!({"status": "ok"})))),
        Err(e) => respond(Err(e.with_status(503))),
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
    match app.authority.upstream_key_authorization(&token) {
        Some(key_authorization) => (
            [(http::header::CONTENT_TYPE, "application/octet-stream")],
            key_authorization,
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn offset(page: Option<&str>) -> Option<i64> {
        orders_page(page).unwrap().offset
    }

    #[test]
    fn a_page_number_gives_its_offset_and_no_page_gives_the_first() {
        assert_eq!(offset(None), Some(0));
        assert_eq!(offset(Some("0")), Some(0));
        assert_eq!(offset(Some("3")), Some(300));
        assert_eq!(offset(Some("007")), Some(700));
        assert_eq!(orders_page(Some("3")).unwrap().number, 3);
    }

    #[test]
    fn a_page_too_far_for_any_offset_is_an_empty_page_not_an_overflow() {
        for far in [
            "18446744073709551615",
            "99999999999999999999",
            "92233720368547758",
            &"9".repeat(400),
        ] {
            assert_eq!(offset(Some(far)), None, "{far}");
        }
        // The last page whose offset and one-more-than-a-page read fit.
        let last = (i64::MAX - 101) / 100;
        assert_eq!(offset(Some(&last.to_string())), Some(last * 100));
        assert_eq!(offset(Some(&(last + 1).to_string())), None);
    }

    #[test]
    fn a_page_that_is_not_a_decimal_number_is_malformed() {
        for bad in ["", "-1", "+1", "1.5", "one", " 1", "0x10", "١"] {
            let e = orders_page(Some(bad)).unwrap_err();
            assert_eq!(
                e.kind,
                acme_proxy_protocol::ProblemType::Malformed,
                "{bad:?}"
            );
        }
    }
}
