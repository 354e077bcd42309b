//! The console's JSON API, under `/api/v1/` on the console's listener: the
//! same operations as the pages, for scripts.
//!
//! A request proves who it is with a session cookie (and, when it changes
//! something, the session's CSRF token in `X-CSRF-Token`, which
//! `GET /api/v1/session` tells), or with an operator's API token
//! (`Authorization: Bearer apx_…`, from `acme-proxy admin token create`),
//! which browsers never send by themselves and so needs no CSRF token.
//! [`super::guard`] checks both before any handler runs.
//!
//! Lists answer `{"items": [...], "next": CURSOR}`, newest first; `next`
//! given as `before` is the following page (`null` on the last page).
//! `limit` sets a page's size (1 to 200, 50 by default). Refusals are
//! RFC 9457 problem documents.

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderValue, StatusCode, header};
use serde::{Deserialize, Serialize};

use super::queries::{
    AccountQuery, AuditQuery, EabQuery, ExplainQuery, Failure, JobQuery, MAX_NAMES, OrderQuery,
    RelayQuery, check_reason, mint,
};
use super::{Console, Session};
use crate::admin::ops;

const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 200;

pub fn routes() -> Router<Arc<Console>> {
    Router::new()
        .route("/session", get(session))
        .route("/dashboard", get(dashboard))
        .route("/orders", get(orders))
        .route("/orders/{id}", get(order))
        .route("/orders/{id}/chain", get(chain))
        .route("/orders/{id}/revoke", post(revoke))
        .route("/accounts", get(accounts))
        .route("/accounts/{id}", get(account).delete(delete_account))
        .route("/accounts/{id}/deactivate", post(deactivate_account))
        .route("/audit", get(audit))
        .route("/relay", get(relay))
        .route("/jobs", get(jobs))
        .route("/jobs/{id}", get(job))
        .route("/jobs/{id}/retry", post(retry_job))
        .route("/jobs/{id}/cancel", post(cancel_job))
        .route("/eab", get(eab).post(mint_eab))
        .route("/eab/{kid}/revoke", post(revoke_eab))
        .route("/profiles", get(profiles))
        .route("/policy/explain", get(explain))
        .fallback(not_found)
        .layer(axum::middleware::map_response(as_problem))
}

/// Every refusal as a problem document, axum's own too (a path or query
/// that does not parse, a method a route does not have): scripts read one
/// shape.
async fn as_problem(response: Response) -> Response {
    let status = response.status();
    let already = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/problem+json");
    if !(status.is_client_error() || status.is_server_error()) || already {
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let detail = match text.trim() {
        "" => status.canonical_reason().unwrap_or("Refused"),
        text => text,
    };
    let mut answer = problem(status, detail);
    // A 405's methods stay (RFC 9110 §15.5.6).
    if let Some(allow) = parts.headers.get(header::ALLOW) {
        answer.headers_mut().insert(header::ALLOW, allow.clone());
    }
    answer
}

/// An RFC 9457 problem document.
pub fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Refused"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    response
}

/// 401 with the challenge RFC 6750 §3 asks for.
pub fn unauthorized(detail: &str, bad_token: bool) -> Response {
    let mut response = problem(StatusCode::UNAUTHORIZED, detail);
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(if bad_token {
            "Bearer error=\"invalid_token\""
        } else {
            "Bearer"
        }),
    );
    response
}

fn failed(failure: Failure) -> Response {
    if let Failure::Later { why, retry_after } = &failure {
        let mut response = problem(StatusCode::SERVICE_UNAVAILABLE, why);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
        return response;
    }
    if let Failure::Unavailable(why) = &failure {
        tracing::error!(event = "admin.request", outcome = "failure", error = %why, "the console's API could not answer");
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "The database did not answer; try again in a moment.",
        );
    }
    let (status, why) = failure.status_and_words();
    problem(status, &why)
}

fn answer<T: Serialize, E: Into<Failure>>(result: Result<T, E>) -> Response {
    match result {
        Ok(value) => axum::Json(value).into_response(),
        Err(failure) => failed(failure.into()),
    }
}

/// A list's page.
#[derive(Serialize)]
struct Page<T> {
    items: Vec<T>,
    next: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Paging {
    limit: String,
}

impl Paging {
    fn limit(&self) -> Result<i64, Failure> {
        if self.limit.is_empty() {
            return Ok(DEFAULT_LIMIT);
        }
        self.limit
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=MAX_LIMIT).contains(l))
            .ok_or_else(|| Failure::Bad(format!("limit must be 1 to {MAX_LIMIT}")))
    }
}

/// A request's JSON body (already bounded by the guard).
fn body<T: for<'de> Deserialize<'de>>(bytes: &Bytes) -> Result<T, Failure> {
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    serde_json::from_slice(bytes)
        .map_err(|e| Failure::Bad(format!("The request's body is not the JSON expected: {e}")))
}

#[derive(Serialize)]
struct SessionInfo {
    operator: String,
    /// `session` (a cookie) or `token`.
    via: &'static str,
    /// The id of the session or of the token.
    id: String,
    /// What `X-CSRF-Token` must say on a session's changes; none for a
    /// token.
    csrf_token: Option<String>,
}

async fn session(Extension(session): Extension<Session>) -> Response {
    let by_token = session.via == super::Via::Token;
    axum::Json(SessionInfo {
        operator: session.operator.clone(),
        via: if by_token { "token" } else { "session" },
        id: session.id.clone(),
        csrf_token: (!by_token).then(|| session.csrf.clone()),
    })
    .into_response()
}

async fn dashboard(State(console): State<Arc<Console>>) -> Response {
    let generation = console.generations.current();
    let authority = &generation.authority;
    answer(
        crate::admin::dashboard::dashboard(
            &generation.config,
            authority.store(),
            authority.clock.unix(),
        )
        .await
        .map_err(|e| Failure::Unavailable(e.to_string())),
    )
}

async fn orders(
    State(console): State<Arc<Console>>,
    Query(query): Query<OrderQuery>,
    Query(paging): Query<Paging>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let page = query
            .filter()?
            .run(authority.store(), paging.limit()?)
            .await?;
        Ok::<_, Failure>(Page {
            items: page.orders,
            next: page.next,
        })
    };
    answer(found.await)
}

async fn order(State(console): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let authority = console.generations.authority();
    answer(
        ops::show_order(authority.store(), &id)
            .await
            .map_err(|e| Failure::of(e, Some("There is no such order."))),
    )
}

async fn chain(State(console): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let authority = console.generations.authority();
    match ops::order_chain(authority.store(), &id).await {
        Ok((_, pem)) => (
            [(header::CONTENT_TYPE, "application/pem-certificate-chain")],
            pem,
        )
            .into_response(),
        // The operation's own words tell a missing order from one
        // without a certificate.
        Err(e) => failed(Failure::from(e)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Revocation {
    /// RFC 5280 §5.3.1; 0 (unspecified) when absent.
    #[serde(default)]
    reason: u64,
}

async fn revoke(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Response {
    let authority = console.generations.authority();
    let done = async {
        let revocation: Revocation = body(&bytes)?;
        check_reason(revocation.reason)?;
        Ok::<_, Failure>(
            ops::revoke_order(&authority, &id, Some(revocation.reason), &session.actor()).await?,
        )
    };
    answer(done.await)
}

async fn accounts(
    State(console): State<Arc<Console>>,
    Query(query): Query<AccountQuery>,
    Query(paging): Query<Paging>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let page = query
            .filter()?
            .run(authority.store(), paging.limit()?)
            .await?;
        Ok::<_, Failure>(Page {
            items: page.accounts,
            next: page.next,
        })
    };
    answer(found.await)
}

async fn account(State(console): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let authority = console.generations.authority();
    answer(
        ops::show_account(authority.store(), &id)
            .await
            .map_err(|e| Failure::of(e, Some("There is no such account."))),
    )
}

async fn deactivate_account(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
) -> Response {
    let authority = console.generations.authority();
    answer(ops::deactivate_account(&authority, &id, &session.actor()).await)
}

async fn delete_account(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
) -> Response {
    let authority = console.generations.authority();
    match ops::delete_account(&authority, &id, &session.actor()).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => failed(e.into()),
    }
}

async fn audit(
    State(console): State<Arc<Console>>,
    Query(query): Query<AuditQuery>,
    Query(paging): Query<Paging>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let page = query
            .filter()?
            .run(authority.store(), paging.limit()?)
            .await?;
        Ok::<_, Failure>(Page {
            items: page.rows,
            next: page.next,
        })
    };
    answer(found.await)
}

async fn relay(
    State(console): State<Arc<Console>>,
    Query(query): Query<RelayQuery>,
    Query(paging): Query<Paging>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let page = query.run(authority.store(), paging.limit()?).await?;
        Ok::<_, Failure>(Page {
            items: page.rows,
            next: page.next,
        })
    };
    answer(found.await)
}

async fn jobs(
    State(console): State<Arc<Console>>,
    Query(query): Query<JobQuery>,
    Query(paging): Query<Paging>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let page = query.run(authority.store(), paging.limit()?).await?;
        Ok::<_, Failure>(Page {
            items: page.jobs,
            next: page.next,
        })
    };
    answer(found.await)
}

async fn job(State(console): State<Arc<Console>>, Path(id): Path<i64>) -> Response {
    let authority = console.generations.authority();
    answer(ops::show_job(authority.store(), id).await)
}

async fn retry_job(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<i64>,
) -> Response {
    let authority = console.generations.authority();
    answer(
        ops::retry_job(
            authority.store(),
            authority.clock.as_ref(),
            id,
            &session.actor(),
        )
        .await,
    )
}

async fn cancel_job(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<i64>,
) -> Response {
    let authority = console.generations.authority();
    answer(
        ops::cancel_job(
            authority.store(),
            authority.clock.as_ref(),
            id,
            &session.actor(),
        )
        .await,
    )
}

async fn eab(
    State(console): State<Arc<Console>>,
    Query(query): Query<EabQuery>,
    Query(paging): Query<Paging>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let page = query.run(authority.store(), paging.limit()?).await?;
        Ok::<_, Failure>(Page {
            items: page.credentials,
            next: page.next,
        })
    };
    answer(found.await)
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct NewCredential {
    label: Option<String>,
    profile: Option<String>,
    /// Name globs its accounts may order; absent: any name.
    names: Option<Vec<String>>,
}

/// Mints a credential; its `hmac_key` is in this answer only.
async fn mint_eab(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    bytes: Bytes,
) -> Response {
    let authority = console.generations.authority();
    let minted = async {
        let new: NewCredential = body(&bytes)?;
        // Absent: any name. An empty list is not taken for that: a
        // script whose list of names came out empty meant none.
        let names = match new.names {
            Some(names) if names.is_empty() => {
                return Err(Failure::Bad(
                    "names: an empty list allows no name; leave names out to allow any name"
                        .to_owned(),
                ));
            }
            names => names.unwrap_or_default(),
        };
        if names.len() > MAX_NAMES || names.iter().any(|n| n.len() > 256) {
            return Err(Failure::Bad(format!(
                "names: at most {MAX_NAMES}, each at most 256 bytes"
            )));
        }
        mint(
            &authority,
            new.label.as_deref().unwrap_or(""),
            new.profile.as_deref().unwrap_or(""),
            names,
            &session.actor(),
        )
        .await
    };
    match minted.await {
        Ok(view) => (StatusCode::CREATED, axum::Json(view)).into_response(),
        Err(failure) => failed(failure),
    }
}

async fn revoke_eab(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(kid): Path<String>,
) -> Response {
    let authority = console.generations.authority();
    answer(ops::revoke_eab(&authority, &kid, &session.actor()).await)
}

async fn profiles(State(console): State<Arc<Console>>) -> Response {
    let generation = console.generations.current();
    axum::Json(super::queries::profiles(&generation.config)).into_response()
}

async fn explain(
    State(console): State<Arc<Console>>,
    Query(query): Query<ExplainQuery>,
) -> Response {
    let generation = console.generations.current();
    answer(
        query
            .explain(&generation.config, generation.authority.store())
            .await,
    )
}

async fn not_found() -> Response {
    problem(StatusCode::NOT_FOUND, "There is no such API route.")
}
