//! The console's pages: each gathers a view from the operation layer and
//! renders it.

use std::sync::Arc;

use acme_proxy_protocol::types::{AccountStatus, OrderStatus};
use acme_proxy_store::{AuditEvent, AuditOutcome};
use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};

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

/// Orders to a page.
const PAGE: i64 = 50;
/// A search field is cut to this before use (a name is at most 253).
const FIELD_MAX: usize = 256;

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct OrderQuery {
    name: String,
    serial: String,
    account: String,
    profile: String,
    status: String,
    before: String,
}

/// A search field as typed, trimmed and bounded.
fn field(text: &str) -> String {
    crate::bounded::truncate(text.trim(), FIELD_MAX)
        .trim()
        .to_owned()
}

pub async fn orders(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<OrderQuery>,
) -> Response {
    // A name as stored: lower case, no wildcard label, no final dot; a
    // serial as stored: lower-case hex without colons.
    let name = field(&query.name).to_ascii_lowercase();
    let name = name
        .trim_start_matches("*.")
        .trim_end_matches('.')
        .to_owned();
    let serial: String = field(&query.serial)
        .chars()
        .filter(|c| *c != ':' && !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase();
    let account = field(&query.account);
    let profile = field(&query.profile);
    let status = field(&query.status);
    let parsed_status = if status.is_empty() {
        None
    } else {
        match status.parse::<OrderStatus>() {
            Ok(s) => Some(s),
            Err(_) => {
                return console.refusal(
                    StatusCode::BAD_REQUEST,
                    "That is not an order status (pending, ready, processing, valid, invalid).",
                );
            }
        }
    };
    let before = crate::admin::ops::parse_cursor(&query.before);
    let search = acme_proxy_store::OrderSearch {
        name: Some(name.as_str()).filter(|s| !s.is_empty()),
        serial: Some(serial.as_str()).filter(|s| !s.is_empty()),
        account: Some(account.as_str()).filter(|s| !s.is_empty()),
        profile: Some(profile.as_str()).filter(|s| !s.is_empty()),
        status: parsed_status,
        before,
    };
    let authority = console.generations.authority();
    let page = match crate::admin::ops::search_orders(authority.store(), &search, PAGE).await {
        Ok(page) => page,
        Err(e) => return console.unavailable(&e),
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
            q => minijinja::context! { name, serial, account, profile, status },
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
        Err(crate::admin::ops::OpsError::Refused(_)) => {
            return console.refusal(StatusCode::NOT_FOUND, "There is no such order.");
        }
        Err(e) => return console.unavailable(&e),
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
        Err(crate::admin::ops::OpsError::Refused(_)) => {
            console.refusal(StatusCode::NOT_FOUND, "That order has no certificate.")
        }
        Err(e) => console.unavailable(&e),
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
    if !crate::admin::ops::REVOCATION_REASONS
        .iter()
        .any(|(code, _)| *code == form.reason)
    {
        return console.refusal(StatusCode::BAD_REQUEST, "That is not a revocation reason.");
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

/// An operation's outcome as the answer: `done` when it went through, 409
/// with its refusal in the operator's words, 503 when the store failed.
fn outcome<T>(
    console: &Console,
    result: Result<T, crate::admin::ops::OpsError>,
    done: impl FnOnce() -> Response,
) -> Response {
    use crate::admin::ops::OpsError;
    match result {
        Ok(_) => done(),
        Err(e @ (OpsError::Refused(_) | OpsError::NoSuchJob(_))) => {
            console.refusal(StatusCode::CONFLICT, &e.to_string())
        }
        Err(e) => console.unavailable(&e),
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
) -> Response {
    eab_page(&console, &session, StatusCode::OK, None, None).await
}

/// The credentials, the form that mints one, and (once, after minting)
/// the new credential with its key.
async fn eab_page(
    console: &Console,
    session: &Session,
    status: StatusCode,
    minted: Option<crate::admin::ops::EabView>,
    error: Option<String>,
) -> Response {
    let generation = console.generations.current();
    let credentials = match crate::admin::ops::list_eab(generation.authority.store()).await {
        Ok(list) => list,
        Err(e) => return console.unavailable(&e),
    };
    let profiles: Vec<String> = generation.config.profiles.keys().cloned().collect();
    console.page(
        status,
        "eab.html",
        Some(session),
        minijinja::context! { credentials, profiles, minted, error },
    )
}

#[derive(serde::Deserialize)]
pub struct MintForm {
    #[serde(default)]
    label: String,
    #[serde(default)]
    profile: String,
    /// Name globs, one per line or separated by commas or spaces.
    #[serde(default)]
    names: String,
}

/// Mints a credential as the logged-in operator; its HMAC key is on this
/// answer only.
pub async fn mint_eab(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    axum::Form(form): axum::Form<MintForm>,
) -> Response {
    let label = field(&form.label);
    let profile = field(&form.profile);
    let names: Vec<String> = crate::bounded::truncate(&form.names, 16 * 1024)
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    let authority = console.generations.authority();
    let minted = crate::admin::ops::create_eab(
        &authority,
        Some(label.as_str()).filter(|l| !l.is_empty()),
        Some(profile.as_str()).filter(|p| !p.is_empty()),
        (!names.is_empty()).then_some(names.as_slice()),
        &session.actor(),
    )
    .await;
    match minted {
        Ok(view) => eab_page(&console, &session, StatusCode::OK, Some(view), None).await,
        Err(crate::admin::ops::OpsError::Refused(why)) => {
            eab_page(&console, &session, StatusCode::BAD_REQUEST, None, Some(why)).await
        }
        Err(e) => console.unavailable(&e),
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

/// `text` as an optional filter: none when empty.
fn given(text: &str) -> Option<&str> {
    Some(text).filter(|t| !t.is_empty())
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct AccountQuery {
    id: String,
    contact: String,
    profile: String,
    status: String,
    before: String,
}

pub async fn accounts(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<AccountQuery>,
) -> Response {
    let (id, contact, profile, status) = (
        field(&query.id),
        field(&query.contact),
        field(&query.profile),
        field(&query.status),
    );
    let parsed_status = match given(&status).map(str::parse::<AccountStatus>) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(_)) => {
            return console.refusal(
                StatusCode::BAD_REQUEST,
                "That is not an account status (valid, deactivated, revoked).",
            );
        }
    };
    let search = acme_proxy_store::AccountSearch {
        id: given(&id),
        contact: given(&contact),
        profile: given(&profile),
        status: parsed_status,
        before: crate::admin::ops::parse_cursor(&query.before),
    };
    let authority = console.generations.authority();
    let page = match crate::admin::ops::search_accounts(authority.store(), &search, PAGE).await {
        Ok(page) => page,
        Err(e) => return console.unavailable(&e),
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
            q => minijinja::context! { id, contact, profile, status },
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
        Err(crate::admin::ops::OpsError::Refused(_)) => {
            console.refusal(StatusCode::NOT_FOUND, "There is no such account.")
        }
        Err(e) => console.unavailable(&e),
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

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct AuditQuery {
    event: String,
    outcome: String,
    profile: String,
    account: String,
    order: String,
    serial: String,
    before: String,
}

pub async fn audit(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<AuditQuery>,
) -> Response {
    let (event, outcome) = (field(&query.event), field(&query.outcome));
    let (profile, account, order) = (
        field(&query.profile),
        field(&query.account),
        field(&query.order),
    );
    let serial: String = field(&query.serial)
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    let Ok(event_filter) = given(&event).map(str::parse::<AuditEvent>).transpose() else {
        return console.refusal(StatusCode::BAD_REQUEST, "That is not an audit event.");
    };
    let Ok(outcome_filter) = given(&outcome).map(str::parse::<AuditOutcome>).transpose() else {
        return console.refusal(
            StatusCode::BAD_REQUEST,
            "That is not an outcome (success, refused, failure).",
        );
    };
    let filter = acme_proxy_store::AuditFilter {
        profile: given(&profile),
        account: given(&account),
        order: given(&order),
        serial: given(&serial),
        event: event_filter,
        outcome: outcome_filter,
        since: None,
        before: query.before.parse().ok(),
    };
    let authority = console.generations.authority();
    let rows = match crate::admin::ops::list_audit(authority.store(), &filter, PAGE).await {
        Ok(rows) => rows,
        Err(e) => return console.unavailable(&e),
    };
    let next = (rows.len() as i64 == PAGE)
        .then(|| {
            rows.last()
                .map(|r| next_link("/audit", &query, &r.id.to_string()))
        })
        .flatten();
    let events: Vec<&str> = AuditEvent::ALL.iter().map(|e| e.as_str()).collect();
    console.page(
        StatusCode::OK,
        "audit.html",
        Some(&session),
        minijinja::context! {
            rows,
            next,
            events,
            outcomes => ["success", "refused", "failure"],
            q => minijinja::context! { event, outcome, profile, account, order, serial },
        },
    )
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct StatusQuery {
    status: String,
    kind: String,
}

/// The relay queue: relayed orders (in flight by default) with their
/// upstream, state, attempts and last error; retry or cancel their job.
pub async fn relay(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<StatusQuery>,
) -> Response {
    let status = field(&query.status);
    let parsed = match status.as_str() {
        "" => Some(OrderStatus::Processing),
        "any" => None,
        other => match other.parse::<OrderStatus>() {
            Ok(s) => Some(s),
            Err(_) => {
                return console.refusal(StatusCode::BAD_REQUEST, "That is not an order status.");
            }
        },
    };
    let authority = console.generations.authority();
    match crate::admin::ops::relay_queue(authority.store(), parsed, PAGE).await {
        Ok(rows) => console.page(
            StatusCode::OK,
            "relay.html",
            Some(&session),
            minijinja::context! {
                rows,
                status => parsed.map_or("any", OrderStatus::as_str),
                statuses => ["processing", "valid", "invalid", "any"],
            },
        ),
        Err(e) => console.unavailable(&e),
    }
}

/// The job queue, of one kind and status when given.
pub async fn jobs(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<StatusQuery>,
) -> Response {
    let (kind, status) = (field(&query.kind), field(&query.status));
    let Ok(parsed) = given(&status)
        .map(str::parse::<acme_proxy_store::JobStatus>)
        .transpose()
    else {
        return console.refusal(StatusCode::BAD_REQUEST, "That is not a job status.");
    };
    let authority = console.generations.authority();
    match crate::admin::ops::list_jobs(authority.store(), given(&kind), parsed, PAGE).await {
        Ok(jobs) => console.page(
            StatusCode::OK,
            "jobs.html",
            Some(&session),
            minijinja::context! {
                jobs,
                q => minijinja::context! { kind, status },
                statuses => acme_proxy_store::JobStatus::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            },
        ),
        Err(e) => console.unavailable(&e),
    }
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
    Path(id): Path<i64>,
    axum::Form(form): axum::Form<JobActionForm>,
) -> Response {
    let authority = console.generations.authority();
    let done = crate::admin::ops::retry_job(authority.store(), authority.clock.as_ref(), id).await;
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
    let config = &generation.config;
    let base = config.base_url();
    let summaries = crate::admin::ops::describe_profiles(config);
    let profiles: Vec<_> = config
        .profiles
        .iter()
        .zip(summaries)
        .map(|((name, p), summary)| {
            minijinja::context! {
                name,
                directory => format!("{base}/profile/{name}/directory"),
                summary,
                eab => format!("{:?}", p.eab).to_lowercase(),
                bypass => p.bypass,
                order_lifetime => humantime::format_duration(p.order_lifetime).to_string(),
                authorization_lifetime => humantime::format_duration(p.authorization_lifetime).to_string(),
                max_identifiers => p.max_identifiers,
                policy_default => format!("{:?}", p.policy_default).to_lowercase(),
            }
        })
        .collect();
    console.page(
        StatusCode::OK,
        "profiles.html",
        Some(&session),
        minijinja::context! { profiles },
    )
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct ExplainQuery {
    profile: String,
    client_ip: String,
    identifiers: String,
    eab: String,
    account: String,
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
    let profile = field(&query.profile);
    let client_ip = field(&query.client_ip);
    let form = minijinja::context! {
        profile,
        client_ip,
        identifiers => field(&query.identifiers),
        eab => field(&query.eab),
        account => field(&query.account),
    };
    let page = |status,
                explanation: Option<Vec<String>>,
                decision: Option<&str>,
                error: Option<String>| {
        console.page(
            status,
            "policy.html",
            Some(&session),
            minijinja::context! { profiles, form, explanation, decision, error },
        )
    };
    if profile.is_empty() && client_ip.is_empty() {
        return page(StatusCode::OK, None, None, None);
    }
    if !generation.config.profiles.contains_key(&profile) {
        return page(
            StatusCode::BAD_REQUEST,
            None,
            None,
            Some("Choose one of the profiles.".to_owned()),
        );
    }
    let Ok(ip) = client_ip.parse::<std::net::IpAddr>() else {
        return page(
            StatusCode::BAD_REQUEST,
            None,
            None,
            Some("The client's address is not an IP address.".to_owned()),
        );
    };
    let identifiers: Vec<String> = field(&query.identifiers)
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|i| !i.is_empty())
        .take(100)
        .map(str::to_owned)
        .collect();
    let request = crate::admin::explain::ExplainRequest {
        profile: profile.clone(),
        client_ip: ip,
        identifiers,
        eab: given(&field(&query.eab)).map(str::to_owned),
        account: given(&field(&query.account)).map(str::to_owned),
    };
    let policy = match crate::admin::explain::build_policy(&generation.config) {
        Ok(policy) => policy,
        Err(problems) => {
            return page(
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                None,
                Some(problems.join("; ")),
            );
        }
    };
    let label = match &request.eab {
        Some(kid) if policy.wants_eab_label() => {
            match generation.authority.store().eab(kid).await {
                Ok(Some(credential)) => credential.label,
                Ok(None) => {
                    return page(
                        StatusCode::BAD_REQUEST,
                        None,
                        None,
                        Some(format!(
                            "There is no External Account Binding credential {kid}."
                        )),
                    );
                }
                Err(e) => return console.unavailable(&e),
            }
        }
        _ => None,
    };
    let explanation = crate::admin::explain::explain(&policy, &request, label).await;
    page(
        StatusCode::OK,
        Some(crate::admin::explain::lines(&explanation)),
        Some(explanation.decision.as_str()),
        None,
    )
}
