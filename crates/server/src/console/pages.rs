//! The console's pages: each gathers a view from the operation layer and
//! renders it.

use std::sync::Arc;

use acme_proxy_protocol::types::OrderStatus;
use acme_proxy_store::AuditEvent;
use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};

use super::queries::{
    AccountQuery, AuditQuery, EabQuery, ExplainQuery, Failure, JobQuery, MintForm, OrderQuery,
    RelayQuery, check_reason, field, given,
};
use super::{Console, Session};

pub async fn dashboard(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Response {
    let generation = console.generations.current();
    let authority = &generation.authority;
    let now = authority.clock.unix();
    let view = match crate::admin::dashboard::dashboard(&generation.config, authority.store(), now)
        .await
    {
        Ok(view) => view,
        Err(e) => return console.unavailable(&e),
    };
    let charts: Vec<_> = view
        .profiles
        .iter()
        .map(|p| {
            minijinja::context! {
                profile => p.name.clone(),
                issued => p.issued_total,
                failed => p.failed_total,
                chart => super::chart::build(&view.days, &p.issued, &p.failed),
            }
        })
        .collect();
    console.page(
        StatusCode::OK,
        "dashboard.html",
        Some(&session),
        minijinja::context! { view, charts },
    )
}

/// Rows to a page.
const PAGE: i64 = 50;

pub async fn orders(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<OrderQuery>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let filter = query.filter()?;
        let page = filter.run(authority.store(), PAGE).await?;
        Ok::<_, Failure>((filter, page))
    };
    let (filter, page) = match found.await {
        Ok(found) => found,
        Err(failure) => return console.failed(failure),
    };
    let next = page
        .next
        .as_ref()
        .map(|cursor| next_link("/orders", &query, cursor));
    console.page(
        StatusCode::OK,
        "orders.html",
        Some(&session),
        minijinja::context! {
            orders => page.orders,
            next,
            q => filter,
            statuses => ["pending", "ready", "processing", "valid", "invalid"],
        },
    )
}

pub async fn order(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
) -> Response {
    let authority = console.generations.authority();
    let order = match crate::admin::ops::show_order(authority.store(), &id).await {
        Ok(order) => order,
        Err(e) => return console.failed(Failure::of(e, Some("There is no such order."))),
    };
    let reasons: Vec<_> = crate::admin::ops::REVOCATION_REASONS
        .iter()
        .map(|(code, name)| minijinja::context! { code, name })
        .collect();
    console.page(
        StatusCode::OK,
        "order.html",
        Some(&session),
        minijinja::context! { order, reasons },
    )
}

pub async fn order_chain(State(console): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let authority = console.generations.authority();
    match crate::admin::ops::order_chain(authority.store(), &id).await {
        Ok((serial, pem)) => (
            [
                (
                    header::CONTENT_TYPE,
                    "application/pem-certificate-chain".to_owned(),
                ),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{serial}.pem\""),
                ),
            ],
            pem,
        )
            .into_response(),
        Err(e) => console.failed(Failure::of(e, Some("That order has no certificate."))),
    }
}

#[derive(serde::Deserialize)]
pub struct RevokeForm {
    reason: u64,
    #[serde(default)]
    confirm: String,
}

/// Revokes an order's certificate as the logged-in operator, once the
/// form's confirmation box is ticked.
pub async fn revoke(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<RevokeForm>,
) -> Response {
    if let Some(refused) = unconfirmed(&console, &form.confirm, "Nothing was revoked") {
        return refused;
    }
    if let Err(failure) = check_reason(form.reason) {
        return console.failed(failure);
    }
    let authority = console.generations.authority();
    let revoked =
        crate::admin::ops::revoke_order(&authority, &id, Some(form.reason), &session.actor()).await;
    // A revoked order's id is base64url: a path segment as it is.
    outcome(&console, revoked, || see_other_to(&format!("/orders/{id}")))
}

/// A destructive form whose confirmation box is not ticked: the page
/// saying nothing happened.
fn unconfirmed(console: &Console, confirm: &str, nothing: &str) -> Option<Response> {
    (confirm != "yes").then(|| {
        console.refusal(
            StatusCode::BAD_REQUEST,
            &format!("{nothing}: tick the box that confirms it."),
        )
    })
}

/// An operation's outcome as the answer: `done` when it went through,
/// else its failure's page (404, 409 with the refusal in the operator's
/// words, 503 when the store failed).
fn outcome<T>(
    console: &Console,
    result: Result<T, crate::admin::ops::OpsError>,
    done: impl FnOnce() -> Response,
) -> Response {
    match result {
        Ok(_) => done(),
        Err(e) => console.failed(e.into()),
    }
}

fn see_other_to(to: &str) -> Response {
    match http::HeaderValue::from_str(to) {
        Ok(location) => (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response(),
        Err(_) => super::see_other("/"),
    }
}

pub async fn eab(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<EabQuery>,
) -> Response {
    eab_page(&console, &session, &query, StatusCode::OK, None, None).await
}

/// The credentials, the form that mints one, and (once, after minting)
/// the new credential with its key.
async fn eab_page(
    console: &Console,
    session: &Session,
    query: &EabQuery,
    status: StatusCode,
    minted: Option<crate::admin::ops::EabView>,
    error: Option<String>,
) -> Response {
    let generation = console.generations.current();
    let page = match query.run(generation.authority.store(), PAGE).await {
        Ok(page) => page,
        Err(failure) => return console.failed(failure),
    };
    let next = page
        .next
        .as_ref()
        .map(|cursor| next_link("/eab", query, cursor));
    let profiles: Vec<String> = generation.config.profiles.keys().cloned().collect();
    console.page(
        status,
        "eab.html",
        Some(session),
        minijinja::context! { credentials => page.credentials, next, profiles, minted, error },
    )
}

/// Mints a credential as the logged-in operator; its HMAC key is on this
/// answer only.
pub async fn mint_eab(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    axum::Form(form): axum::Form<MintForm>,
) -> Response {
    let authority = console.generations.authority();
    let first = EabQuery::default();
    match form.mint(&authority, &session.actor()).await {
        Ok(view) => eab_page(&console, &session, &first, StatusCode::OK, Some(view), None).await,
        Err(Failure::Bad(why)) => {
            eab_page(
                &console,
                &session,
                &first,
                StatusCode::BAD_REQUEST,
                None,
                Some(why),
            )
            .await
        }
        Err(failure) => console.failed(failure),
    }
}

#[derive(serde::Deserialize)]
pub struct ConfirmForm {
    #[serde(default)]
    confirm: String,
}

pub async fn revoke_eab(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(kid): Path<String>,
    axum::Form(form): axum::Form<ConfirmForm>,
) -> Response {
    if let Some(refused) = unconfirmed(&console, &form.confirm, "Nothing was revoked") {
        return refused;
    }
    let authority = console.generations.authority();
    let revoked = crate::admin::ops::revoke_eab(&authority, &kid, &session.actor()).await;
    outcome(&console, revoked, || super::see_other("/eab"))
}

/// The query string of `query` with `before` set to `cursor`: the next
/// page's link.
fn next_link<Q: serde::Serialize>(path: &str, query: &Q, cursor: &str) -> String {
    let mut pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(&serde_urlencoded::to_string(query).unwrap_or_default())
            .unwrap_or_default();
    pairs.retain(|(k, v)| k != "before" && !v.is_empty());
    pairs.push(("before".to_owned(), cursor.to_owned()));
    format!(
        "{path}?{}",
        serde_urlencoded::to_string(&pairs).unwrap_or_default()
    )
}

pub async fn accounts(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<AccountQuery>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let filter = query.filter()?;
        let page = filter.run(authority.store(), PAGE).await?;
        Ok::<_, Failure>((filter, page))
    };
    let (filter, page) = match found.await {
        Ok(found) => found,
        Err(failure) => return console.failed(failure),
    };
    let next = page
        .next
        .as_ref()
        .map(|cursor| next_link("/accounts", &query, cursor));
    console.page(
        StatusCode::OK,
        "accounts.html",
        Some(&session),
        minijinja::context! {
            accounts => page.accounts,
            next,
            q => filter,
            statuses => ["valid", "deactivated", "revoked"],
        },
    )
}

pub async fn account(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
) -> Response {
    let authority = console.generations.authority();
    match crate::admin::ops::show_account(authority.store(), &id).await {
        Ok(account) => console.page(
            StatusCode::OK,
            "account.html",
            Some(&session),
            minijinja::context! { account },
        ),
        Err(e) => console.failed(Failure::of(e, Some("There is no such account."))),
    }
}

/// Deactivates an account (RFC 8555 §7.3.6, on its holder's behalf) once
/// confirmed.
pub async fn deactivate_account(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<ConfirmForm>,
) -> Response {
    if let Some(refused) = unconfirmed(&console, &form.confirm, "Nothing was changed") {
        return refused;
    }
    let authority = console.generations.authority();
    let done = crate::admin::ops::deactivate_account(&authority, &id, &session.actor()).await;
    outcome(&console, done, || see_other_to(&format!("/accounts/{id}")))
}

/// Deletes an account once confirmed (refused while it still has
/// certificates that have not expired, as the CLI is).
pub async fn delete_account(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<ConfirmForm>,
) -> Response {
    if let Some(refused) = unconfirmed(&console, &form.confirm, "Nothing was deleted") {
        return refused;
    }
    let authority = console.generations.authority();
    let done = crate::admin::ops::delete_account(&authority, &id, &session.actor()).await;
    outcome(&console, done, || super::see_other("/accounts"))
}

pub async fn audit(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<AuditQuery>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let filter = query.filter()?;
        let page = filter.run(authority.store(), PAGE).await?;
        Ok::<_, Failure>((filter, page))
    };
    let (filter, page) = match found.await {
        Ok(found) => found,
        Err(failure) => return console.failed(failure),
    };
    let next = page
        .next
        .as_ref()
        .map(|cursor| next_link("/audit", &query, cursor));
    let events: Vec<&str> = AuditEvent::ALL.iter().map(|e| e.as_str()).collect();
    console.page(
        StatusCode::OK,
        "audit.html",
        Some(&session),
        minijinja::context! {
            rows => page.rows,
            next,
            events,
            outcomes => ["success", "refused", "failure"],
            q => filter,
        },
    )
}

/// The relay queue: relayed orders (in flight by default) with their
/// upstream, state, attempts and last error; retry or cancel their job.
pub async fn relay(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<RelayQuery>,
) -> Response {
    let authority = console.generations.authority();
    let found = async {
        let status = query.status()?;
        let page = query.run(authority.store(), PAGE).await?;
        Ok::<_, Failure>((status, page))
    };
    let (status, page) = match found.await {
        Ok(found) => found,
        Err(failure) => return console.failed(failure),
    };
    let next = page
        .next
        .as_ref()
        .map(|cursor| next_link("/relay", &query, cursor));
    console.page(
        StatusCode::OK,
        "relay.html",
        Some(&session),
        minijinja::context! {
            rows => page.rows,
            next,
            status => status.map_or("any", OrderStatus::as_str),
            statuses => ["processing", "valid", "invalid", "any"],
        },
    )
}

/// The job queue, of one kind and status when given.
pub async fn jobs(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<JobQuery>,
) -> Response {
    let authority = console.generations.authority();
    let page = match query.run(authority.store(), PAGE).await {
        Ok(page) => page,
        Err(failure) => return console.failed(failure),
    };
    let next = page
        .next
        .as_ref()
        .map(|cursor| next_link("/jobs", &query, cursor));
    console.page(
        StatusCode::OK,
        "jobs.html",
        Some(&session),
        minijinja::context! {
            jobs => page.jobs,
            next,
            q => minijinja::context! { kind => field(&query.kind), status => field(&query.status) },
            statuses => acme_proxy_store::JobStatus::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        },
    )
}

#[derive(serde::Deserialize)]
pub struct JobActionForm {
    #[serde(default)]
    confirm: String,
    /// Where to go back to: the relay queue or the jobs page.
    #[serde(default)]
    back: String,
}

fn back_to(back: &str) -> &'static str {
    if back == "relay" { "/relay" } else { "/jobs" }
}

/// Queues a failed or cancelled job again, or makes a queued one due now.
pub async fn retry_job(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<i64>,
    axum::Form(form): axum::Form<JobActionForm>,
) -> Response {
    let authority = console.generations.authority();
    let done = crate::admin::ops::retry_job(
        authority.store(),
        authority.clock.as_ref(),
        id,
        &session.actor(),
    )
    .await;
    outcome(&console, done, || super::see_other(back_to(&form.back)))
}

/// Cancels a job once confirmed: for a relay job, the client's order ends
/// invalid (the job's own abandon, naming the operator).
pub async fn cancel_job(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<i64>,
    axum::Form(form): axum::Form<JobActionForm>,
) -> Response {
    if let Some(refused) = unconfirmed(&console, &form.confirm, "Nothing was cancelled") {
        return refused;
    }
    let authority = console.generations.authority();
    let done = crate::admin::ops::cancel_job(
        authority.store(),
        authority.clock.as_ref(),
        id,
        &session.actor(),
    )
    .await;
    outcome(&console, done, || super::see_other(back_to(&form.back)))
}

/// Every profile: its directory and a summary of its settings.
pub async fn profiles(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Response {
    let generation = console.generations.current();
    console.page(
        StatusCode::OK,
        "profiles.html",
        Some(&session),
        minijinja::context! { profiles => super::queries::profiles(&generation.config) },
    )
}

/// `policy explain` as a form: what `[policy]` decides for a client, from
/// the configuration in force, with the real lookups.
pub async fn policy(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<ExplainQuery>,
) -> Response {
    let generation = console.generations.current();
    let profiles: Vec<String> = generation.config.profiles.keys().cloned().collect();
    let form = minijinja::context! {
        profile => field(&query.profile),
        client_ip => field(&query.client_ip),
        identifiers => field(&query.identifiers),
        eab => field(&query.eab),
        account => field(&query.account),
    };
    let asked =
        given(&field(&query.profile)).is_some() || given(&field(&query.client_ip)).is_some();
    let (status, explained, error) = if !asked {
        (StatusCode::OK, None, None)
    } else {
        match query
            .explain(&generation.config, generation.authority.store())
            .await
        {
            Ok(explained) => (StatusCode::OK, Some(explained), None),
            Err(Failure::Unavailable(why)) => return console.unavailable(&why),
            Err(failure) => {
                let (status, why) = failure.status_and_words();
                (status, None, Some(why))
            }
        }
    };
    let (explanation, decision) = explained.map(|e| (e.explanation, e.decision)).unzip();
    console.page(
        status,
        "policy.html",
        Some(&session),
        minijinja::context! { profiles, form, explanation, decision, error },
    )
}
