//! The acme-dns-compatible HTTP API (`[dns_zone.api]`): clients that
//! already speak acme-dns (lego's `acme-dns` provider, certbot's acme-dns
//! hooks) register an account for one name of our zone and publish their
//! own dns-01 values there, for our CA or any other, with no DNS
//! credentials. The corporate zone delegates `_acme-challenge.HOST` to the
//! account's name by CNAME once.
//!
//! The wire format is acme-dns's (its clients are the point): `POST
//! /register` (optional `{"allowfrom": [CIDR…]}`) answers 201 with
//! `username`, `password`, `subdomain`, `fulldomain`, `allowfrom`; `POST
//! /update` with `X-Api-User` and `X-Api-Key` and `{"subdomain", "txt"}`
//! answers 200 `{"txt"}`; errors are `{"error": "…"}`. JSON keys are
//! matched without regard to case, as acme-dns's Go decoder does (lego
//! sends `SubDomain`, `Txt`, `AllowFrom`).
//!
//! Passwords are kept only as argon2id hashes (RFC 9106), verified on a
//! blocking thread, at most [`HASHING_AT_ONCE`] at a time: a flood of
//! wrong passwords cannot take every core. Only the two newest values per
//! name are kept (a name and its wildcard are validated at once), as
//! acme-dns does. Every registration and update is audited, and every
//! refused update of an account (not those naming no account, which
//! anyone can send in any amount: those are logged and counted).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acme_proxy_store::{AuditEvent, AuditOutcome, NewAuditRow, NewDnsAccount, Store};
use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::json;

use crate::api::forwarded::client_key;
use crate::authority::RequestContext;
use crate::clock::SharedClock;
use crate::config::{DnsApiConfig, DnsRegistration};
use crate::metrics::Metrics;

/// Password hashes computed at once; more requests wait for one.
const HASHING_AT_ONCE: usize = 2;
/// Requests handled at once once their body is in; more get 503.
const MAX_IN_FLIGHT: usize = 64;
/// How long a request waits for a hashing slot before 503.
const HASHING_WAIT: Duration = Duration::from_secs(5);
/// The largest body either endpoint reads.
const MAX_BODY: usize = 4096;
/// Networks one account's `allowfrom` may list.
const MAX_ALLOW_FROM: usize = 32;
/// Keys a rate limiter remembers at once (bounded memory, whatever the
/// clients send); when full, the oldest window is forgotten.
const MAX_LIMITER_KEYS: usize = 65_536;
/// A dns-01 value: base64url of a SHA-256 digest (RFC 8555 §8.4), 43
/// characters; acme-dns accepts nothing else.
const TXT_LEN: usize = 43;

/// The API over the store, shared by every configuration generation (its
/// configuration cannot change by reload, as `[dns_zone]` cannot).
#[derive(Debug)]
pub struct DnsApi {
    config: DnsApiConfig,
    /// The zone accounts get their names in (the first of `[dns_zone]`).
    zone: String,
    store: Store,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    body_read_timeout: Duration,
    /// Password hashes being computed; each blocking job holds its permit
    /// until it ends, even when its client has gone.
    hashing: Arc<tokio::sync::Semaphore>,
    /// Requests past their body (the ACME routes' `max_in_flight` is for
    /// ACME work: a flood here must not take its slots).
    in_flight: Arc<tokio::sync::Semaphore>,
    registrations: Limiter,
    updates: Limiter,
    /// Registrations refused at `max_accounts`, for their audit rows.
    at_limit: std::sync::Mutex<AtLimit>,
}

/// Registrations refused at `max_accounts`, audited without letting a
/// flood of them (clients with many addresses) fill the audit log in the
/// accounts' place: the first refusal of a minute gets a row at once, the
/// others of that minute one row together when the minute ends.
#[derive(Debug, Default)]
struct AtLimit {
    /// When the minute began (Unix seconds): its first refusal's row.
    since: Option<i64>,
    /// Refused since then without a row of their own.
    unrecorded: u64,
}

/// What to write for one refusal.
#[derive(Debug, PartialEq, Eq)]
enum AtLimitRow {
    /// A row now.
    Now,
    /// None now; the minute's row in this many seconds.
    Later(u64),
    /// None: counted for the row already on its way.
    Counted,
}

/// The minute of [`AtLimit`].
const AT_LIMIT_MINUTE: i64 = 60;

impl AtLimit {
    fn refused(&mut self, now: i64) -> AtLimitRow {
        match self.since {
            Some(since) if now - since < AT_LIMIT_MINUTE => {
                self.unrecorded += 1;
                if self.unrecorded == 1 {
                    AtLimitRow::Later(u64::try_from(since + AT_LIMIT_MINUTE - now).unwrap_or(0))
                } else {
                    AtLimitRow::Counted
                }
            }
            _ => {
                self.since = Some(now);
                AtLimitRow::Now
            }
        }
    }

    /// The refusals the minute's row tells of; the next refusal starts a
    /// new minute.
    fn take(&mut self) -> u64 {
        self.since = None;
        std::mem::take(&mut self.unrecorded)
    }
}

/// The account a registration created: what the client is told, once.
pub struct Registered {
    pub username: String,
    pub password: String,
    pub subdomain: String,
    pub fulldomain: String,
    pub allow_from: Vec<String>,
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("username", &self.username)
            .field("fulldomain", &self.fulldomain)
            .finish_non_exhaustive()
    }
}

/// Who asked for a registration, for its audit row.
pub struct Registrant<'a> {
    pub actor: &'a str,
    /// The request's, when it came through the API.
    pub context: Option<&'a RequestContext>,
}

impl DnsApi {
    pub fn new(
        config: DnsApiConfig,
        zone: String,
        store: Store,
        clock: SharedClock,
        metrics: Arc<Metrics>,
        body_read_timeout: Duration,
    ) -> Self {
        Self {
            registrations: Limiter::new(Duration::from_secs(3600), config.registrations_per_hour),
            updates: Limiter::new(Duration::from_secs(60), config.updates_per_minute),
            at_limit: std::sync::Mutex::new(AtLimit::default()),
            config,
            zone,
            store,
            clock,
            metrics,
            body_read_timeout,
            hashing: Arc::new(tokio::sync::Semaphore::new(HASHING_AT_ONCE)),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        }
    }

    /// A slot for a request whose body is in; None when all are taken.
    fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.in_flight).try_acquire_owned().ok()
    }

    fn count(&self, endpoint: &'static str, outcome: &'static str) {
        self.metrics
            .dns_api_requests
            .get_or_create(&vec![
                ("endpoint", endpoint.to_owned()),
                ("outcome", outcome.to_owned()),
            ])
            .inc();
    }

    /// Creates an account (see [`register_account`]) when a hashing slot
    /// is free.
    pub async fn register(
        &self,
        allow_from: &[IpNet],
        who: Registrant<'_>,
    ) -> anyhow::Result<Registered> {
        // Before the password is hashed: a registration at the limit costs
        // no hashing slot. Checked again by the insert.
        if self.store.dns_account_count().await?
            >= i64::try_from(self.config.max_accounts).unwrap_or(i64::MAX)
        {
            return Err(AccountLimit(self.config.max_accounts).into());
        }
        let slot = self.hashing_slot().await?;
        register_account(
            &self.store,
            &self.zone,
            allow_from,
            None,
            Some(self.config.max_accounts),
            who,
            self.clock.unix(),
            Some(slot),
        )
        .await
    }

    /// Whether `password` is the one `hash` was made of (constant time:
    /// the comparison is argon2's).
    async fn verify(&self, password: &str, hash: &str) -> anyhow::Result<bool> {
        let slot = self.hashing_slot().await?;
        let checked =
            crate::passwords::check(password.to_owned(), hash.to_owned(), Some(slot)).await?;
        Ok(checked != crate::passwords::Checked::Wrong)
    }

    async fn hashing_slot(&self) -> anyhow::Result<tokio::sync::OwnedSemaphorePermit> {
        tokio::time::timeout(HASHING_WAIT, Arc::clone(&self.hashing).acquire_owned())
            .await
            .map_err(|_| anyhow::anyhow!("no password hashing slot within {HASHING_WAIT:?}"))?
            .map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// A registration refused because `max_accounts` accounts exist.
#[derive(Debug)]
pub struct AccountLimit(pub u64);

impl std::fmt::Display for AccountLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[dns_zone.api] max_accounts ({}) accounts exist already",
            self.0
        )
    }
}

impl std::error::Error for AccountLimit {}

/// Creates an account for a new name under `zone`, whose updates may come
/// from `allow_from` (empty: anywhere), bound to the EAB credential
/// `eab_kid` if any, and audits it as `who`; the password is shown here
/// only, and kept as its argon2id hash (computed holding `slot`, when
/// given, until it is done). With `max_accounts`, errs with
/// [`AccountLimit`], writing nothing, once that many exist.
#[allow(clippy::too_many_arguments)]
pub async fn register_account(
    store: &Store,
    zone: &str,
    allow_from: &[IpNet],
    eab_kid: Option<&str>,
    max_accounts: Option<u64>,
    who: Registrant<'_>,
    now: i64,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) -> anyhow::Result<Registered> {
    let username = crate::ids::uuid_v4();
    let password = crate::ids::dns_api_password();
    let subdomain = crate::ids::uuid_v4();
    let hash = crate::passwords::hash(password.clone(), slot).await?;
    let allow_from: Vec<String> = allow_from.iter().map(ToString::to_string).collect();
    let detail = format!(
        "account {username} for {subdomain}.{zone}; updates from {}{}",
        if allow_from.is_empty() {
            "anywhere".to_owned()
        } else {
            allow_from.join(", ")
        },
        eab_kid.map_or(String::new(), |k| format!("; bound to EAB {k}"))
    );
    let mut audit = NewAuditRow::new(
        now,
        AuditEvent::DnsAccountRegistered,
        AuditOutcome::Success,
        who.actor,
    );
    audit.detail = Some(&detail);
    if let Some(ctx) = who.context {
        with_context(&mut audit, ctx);
    }
    let inserted = store
        .insert_dns_account(
            &NewDnsAccount {
                username: &username,
                password_hash: &hash,
                subdomain: &subdomain,
                zone,
                allow_from: &allow_from,
                eab_kid,
                created_at: now,
            },
            max_accounts,
            &audit,
        )
        .await?;
    if !inserted {
        return Err(AccountLimit(max_accounts.unwrap_or_default()).into());
    }
    Ok(Registered {
        fulldomain: format!("{subdomain}.{zone}"),
        username,
        password,
        subdomain,
        allow_from,
    })
}

/// The routes, mounted under `/acme-dns` on the ACME listener.
pub fn router<S>(api: Arc<DnsApi>) -> Router<S> {
    Router::new()
        .route("/register", post(register))
        .route("/update", post(update))
        .route("/health", get(health))
        .with_state(api)
}

async fn health() -> StatusCode {
    StatusCode::OK
}

/// An acme-dns error document.
fn error(status: StatusCode, error: &str) -> Response {
    (status, axum::Json(json!({ "error": error }))).into_response()
}

/// 503 with `Retry-After`: the server's own trouble (the database, no
/// free hashing slot, too many requests at once), worth retrying.
fn unavailable() -> Response {
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1));
    response
}

fn limited(retry_after: u64) -> Response {
    let mut response = error(StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// The body, at most [`MAX_BODY`] octets within the listener's body read
/// timeout.
async fn read_body(api: &DnsApi, body: Body) -> Result<bytes::Bytes, Response> {
    match tokio::time::timeout(api.body_read_timeout, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "malformed_json_payload",
        )),
        Err(_) => Err(error(StatusCode::REQUEST_TIMEOUT, "malformed_json_payload")),
    }
}

/// `{"allowfrom": [...]}`, any case of the key.
#[derive(Debug, Default)]
struct RegisterBody {
    allow_from: Vec<String>,
}

/// `{"subdomain": "...", "txt": "..."}`, any case of the keys.
#[derive(Debug, Default)]
struct UpdateBody {
    subdomain: String,
    txt: String,
}

/// The members of a JSON object, keys in lower case: acme-dns's decoder
/// matches keys without regard to case, and clients rely on it.
fn members(body: &[u8]) -> Option<HashMap<String, serde_json::Value>> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    Some(
        map.into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect(),
    )
}

fn register_body(body: &[u8]) -> Option<RegisterBody> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Some(RegisterBody::default());
    }
    let mut m = members(body)?;
    match m.remove("allowfrom") {
        None | Some(serde_json::Value::Null) => Some(RegisterBody::default()),
        Some(v) => Vec::<String>::deserialize(v)
            .ok()
            .map(|allow_from| RegisterBody { allow_from }),
    }
}

fn update_body(body: &[u8]) -> Option<UpdateBody> {
    let mut m = members(body)?;
    let mut text = |k: &str| match m.remove(k) {
        Some(serde_json::Value::String(s)) => Some(s),
        None => Some(String::new()),
        Some(_) => None,
    };
    Some(UpdateBody {
        subdomain: text("subdomain")?,
        txt: text("txt")?,
    })
}

/// A network of `allowfrom`: a CIDR (acme-dns's form) or a bare address.
pub fn network(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}

fn client_ip(ctx: &RequestContext) -> Option<IpAddr> {
    ctx.client_ip.as_deref().and_then(|ip| ip.parse().ok())
}

fn with_context<'a>(audit: &mut NewAuditRow<'a>, ctx: &'a RequestContext) {
    audit.client_ip = ctx.client_ip.as_deref();
    audit.user_agent = ctx.user_agent.as_deref();
    audit.request_id = ctx.request_id.as_deref();
}

async fn register(
    State(api): State<Arc<DnsApi>>,
    Extension(ctx): Extension<RequestContext>,
    body: Body,
) -> Response {
    let endpoint = "register";
    if api.config.registration == DnsRegistration::Operator {
        api.count(endpoint, "refused");
        return error(StatusCode::FORBIDDEN, "registration_disabled");
    }
    let Some(ip) = client_ip(&ctx) else {
        api.count(endpoint, "failure");
        return error(StatusCode::INTERNAL_SERVER_ERROR, "no_client_address");
    };
    if !api.config.register_from.is_empty()
        && !api.config.register_from.iter().any(|n| n.contains(&ip))
    {
        api.count(endpoint, "refused");
        return error(StatusCode::FORBIDDEN, "forbidden");
    }
    let body = match read_body(&api, body).await {
        Ok(body) => body,
        Err(response) => {
            api.count(endpoint, "refused");
            return response;
        }
    };
    let Some(_admitted) = api.admit() else {
        api.count(endpoint, "limited");
        return unavailable();
    };
    let Some(body) = register_body(&body) else {
        api.count(endpoint, "refused");
        return error(StatusCode::BAD_REQUEST, "malformed_json_payload");
    };
    let networks: Option<Vec<IpNet>> = body.allow_from.iter().map(|t| network(t)).collect();
    let Some(networks) = networks.filter(|n| n.len() <= MAX_ALLOW_FROM) else {
        api.count(endpoint, "refused");
        return error(StatusCode::BAD_REQUEST, "invalid_allowfrom_cidr");
    };
    // Counted only for a registration about to be made: a request turned
    // away above costs the client none of its quota (one refused at
    // `max_accounts` below does).
    if let Err(retry_after) = api.registrations.take(&client_key(ip), api.clock.unix()) {
        api.count(endpoint, "limited");
        return limited(retry_after);
    }
    match api
        .register(
            &networks,
            Registrant {
                actor: "dns-api:anonymous",
                context: Some(&ctx),
            },
        )
        .await
    {
        Ok(account) => {
            api.count(endpoint, "success");
            tracing::info!(
                event = "dns.account_registered",
                outcome = "success",
                username = %account.username,
                fulldomain = %account.fulldomain,
                "acme-dns account registered"
            );
            (
                StatusCode::CREATED,
                axum::Json(json!({
                    "username": account.username,
                    "password": account.password,
                    "fulldomain": account.fulldomain,
                    "subdomain": account.subdomain,
                    "allowfrom": account.allow_from,
                })),
            )
                .into_response()
        }
        Err(e) if e.downcast_ref::<AccountLimit>().is_some() => {
            api.count(endpoint, "refused");
            let now = api.clock.unix();
            let row = api
                .at_limit
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .refused(now);
            match row {
                AtLimitRow::Now => {
                    let detail = e.to_string();
                    let mut audit = NewAuditRow::new(
                        now,
                        AuditEvent::DnsAccountRegistered,
                        AuditOutcome::Refused,
                        "dns-api:anonymous",
                    );
                    audit.detail = Some(&detail);
                    with_context(&mut audit, &ctx);
                    at_limit_row(&api, &audit).await;
                }
                // The rest of the minute's refusals, told in one row when
                // it ends (one lost only if the process stops before;
                // `dns_api_requests` counts each).
                AtLimitRow::Later(seconds) => {
                    let api = Arc::clone(&api);
                    let reason = e.to_string();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(seconds)).await;
                        let refused = api
                            .at_limit
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .take();
                        let detail = format!(
                            "{reason}; {refused} more registration(s) refused within the minute"
                        );
                        let mut audit = NewAuditRow::new(
                            api.clock.unix(),
                            AuditEvent::DnsAccountRegistered,
                            AuditOutcome::Refused,
                            "dns-api:anonymous",
                        );
                        audit.detail = Some(&detail);
                        at_limit_row(&api, &audit).await;
                    });
                }
                AtLimitRow::Counted => {}
            }
            error(StatusCode::FORBIDDEN, "account_limit")
        }
        Err(e) => {
            api.count(endpoint, "failure");
            tracing::error!(event = "dns.account_registered", outcome = "failure", error = %e, "could not register an acme-dns account");
            unavailable()
        }
    }
}

/// Writes and logs an audit row of registrations refused at
/// `max_accounts`.
async fn at_limit_row(api: &DnsApi, audit: &NewAuditRow<'_>) {
    if let Err(e) = api.store.insert_audit(audit).await {
        tracing::error!(event = "dns.account_registered", outcome = "failure", error = %e, "could not audit a refused acme-dns registration");
    }
    tracing::warn!(
        event = "dns.account_registered",
        outcome = "refused",
        detail = audit.detail.unwrap_or_default(),
        "acme-dns registration refused: the account limit is reached"
    );
}

/// Why an update was refused: the answer and the audit row's detail.
struct Refusal {
    status: StatusCode,
    error: &'static str,
    detail: String,
}

fn refused(status: StatusCode, error: &'static str, detail: impl Into<String>) -> Refusal {
    Refusal {
        status,
        error,
        detail: detail.into(),
    }
}

async fn update(
    State(api): State<Arc<DnsApi>>,
    Extension(ctx): Extension<RequestContext>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let endpoint = "update";
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (user, key) = (header("x-api-user"), header("x-api-key"));
    let body = match read_body(&api, body).await {
        Ok(body) => body,
        Err(response) => {
            api.count(endpoint, "refused");
            return response;
        }
    };
    let Some(_admitted) = api.admit() else {
        api.count(endpoint, "limited");
        return unavailable();
    };
    let outcome = authorize(&api, &ctx, &user, &key, &body).await;
    let now = api.clock.unix();
    // Only a user name that names an account is audited: anything else
    // is the client's text, and a refusal of no account is noise anyone
    // can make in any amount (logged and counted, not written).
    let actor = match &outcome {
        Ok(authorized) => format!("dns-api:{}", authorized.username),
        Err(Failure::Refused {
            known_user: true, ..
        }) => format!("dns-api:{user}"),
        Err(_) => "dns-api:unknown".to_owned(),
    };
    match outcome {
        Ok(Authorized {
            username: _,
            zone,
            fulldomain,
            txt,
        }) => {
            let detail = format!("TXT {fulldomain} = {txt}");
            let mut audit = NewAuditRow::new(
                now,
                AuditEvent::DnsRecordUpdated,
                AuditOutcome::Success,
                &actor,
            );
            audit.detail = Some(&detail);
            with_context(&mut audit, &ctx);
            match api
                .store
                .rotate_dns_txt(&zone, &fulldomain, &txt, now, &audit)
                .await
            {
                Ok(()) => {
                    api.count(endpoint, "success");
                    tracing::info!(event = "dns.record_updated", outcome = "success", name = %fulldomain, "acme-dns update");
                    (StatusCode::OK, axum::Json(json!({ "txt": txt }))).into_response()
                }
                Err(e) => {
                    api.count(endpoint, "failure");
                    tracing::error!(event = "dns.record_updated", outcome = "failure", error = %e, "could not store an acme-dns update");
                    unavailable()
                }
            }
        }
        Err(Failure::Refused {
            refusal,
            known_user: false,
        }) => {
            api.count(endpoint, "refused");
            tracing::info!(event = "dns.record_updated", outcome = "refused", reason = %refusal.detail, "acme-dns update refused");
            error(refusal.status, refusal.error)
        }
        Err(Failure::Refused { refusal, .. }) => {
            api.count(endpoint, "refused");
            let mut audit = NewAuditRow::new(
                now,
                AuditEvent::DnsRecordUpdated,
                AuditOutcome::Refused,
                &actor,
            );
            audit.detail = Some(&refusal.detail);
            with_context(&mut audit, &ctx);
            if let Err(e) = api.store.insert_audit(&audit).await {
                tracing::error!(event = "dns.record_updated", outcome = "failure", error = %e, "could not audit a refused acme-dns update");
            }
            tracing::info!(event = "dns.record_updated", outcome = "refused", reason = %refusal.detail, "acme-dns update refused");
            error(refusal.status, refusal.error)
        }
        Err(Failure::Limited(retry_after)) => {
            api.count(endpoint, "limited");
            limited(retry_after)
        }
        Err(Failure::Internal(e)) => {
            api.count(endpoint, "failure");
            tracing::error!(event = "dns.record_updated", outcome = "failure", error = %e, "could not check an acme-dns update");
            unavailable()
        }
    }
}

struct Authorized {
    username: String,
    /// The account's zone (the first configured when it registered),
    /// whose serial the update moves on.
    zone: String,
    fulldomain: String,
    txt: String,
}

enum Failure {
    Refused {
        refusal: Refusal,
        /// Whether the user name is an account's (then it is audited).
        known_user: bool,
    },
    /// The account's updates per minute are spent (seconds to wait).
    Limited(u64),
    Internal(anyhow::Error),
}

impl From<Refusal> for Failure {
    fn from(refusal: Refusal) -> Self {
        Failure::Refused {
            refusal,
            known_user: false,
        }
    }
}

/// acme-dns's order: the credentials, the client's address, then the
/// subdomain and the value; every failure of the first three is the same
/// 401 `forbidden`, so that a caller learns nothing of which.
async fn authorize(
    api: &DnsApi,
    ctx: &RequestContext,
    user: &str,
    key: &str,
    body: &[u8],
) -> Result<Authorized, Failure> {
    let forbidden = |detail: String| refused(StatusCode::UNAUTHORIZED, "forbidden", detail);
    // A user name is a UUID: anything else is no account, and is not
    // looked up (nor hashed against).
    if user.len() != 36 || !user.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Err(forbidden("no or malformed X-Api-User".into()).into());
    }
    let account = match api.store.dns_account(user).await {
        Ok(Some(account)) => account,
        Ok(None) => return Err(forbidden("X-Api-User names no account".into()).into()),
        Err(e) => return Err(Failure::Internal(e.into())),
    };
    let known = |refusal: Refusal| Failure::Refused {
        refusal,
        known_user: true,
    };
    if key.is_empty() || key.len() > 128 {
        return Err(known(forbidden("no or malformed X-Api-Key".into())));
    }
    let ip = client_ip(ctx);
    let allowed = account.allow_from.is_empty()
        || ip.is_some_and(|ip| {
            account
                .allow_from
                .iter()
                .filter_map(|n| network(n))
                .any(|n| n.contains(&ip))
        });
    // Every attempt on an account counts against its updates per minute,
    // a wrong key too, and before the key is hashed: wrong keys sent in a
    // flood would otherwise hold the hashing slots every client's update
    // waits for, and write an audit row each. Attempts from outside its
    // allowfrom count apart, so that they cannot spend the budget of the
    // client inside.
    let budget = if allowed {
        account.username.clone()
    } else {
        format!("{}/outside", account.username)
    };
    if let Err(retry_after) = api.updates.take(&budget, api.clock.unix()) {
        return Err(Failure::Limited(retry_after));
    }
    match api.verify(key, &account.password_hash).await {
        Ok(true) => {}
        Ok(false) => return Err(known(forbidden("wrong X-Api-Key".into()))),
        Err(e) => return Err(Failure::Internal(e)),
    }
    if !allowed {
        return Err(known(forbidden(format!(
            "address {} is outside the account's allowfrom ({})",
            ip.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string()),
            account.allow_from.join(", ")
        ))));
    }
    if let Some(kid) = &account.eab_kid {
        match api.store.eab(kid).await {
            Ok(Some(eab)) if eab.revoked_at.is_none() => {}
            Ok(_) => {
                return Err(known(forbidden(format!(
                    "the account's EAB credential {kid} is revoked or gone"
                ))));
            }
            Err(e) => return Err(Failure::Internal(e.into())),
        }
    }
    let Some(body) = update_body(body) else {
        return Err(known(refused(
            StatusCode::BAD_REQUEST,
            "malformed_json_payload",
            "the body is not a JSON object of subdomain and txt",
        )));
    };
    if !body.subdomain.eq_ignore_ascii_case(&account.subdomain) {
        return Err(known(forbidden(format!(
            "the account may update {}, not {:?}",
            account.subdomain,
            crate::bounded::truncate(&body.subdomain, 64)
        ))));
    }
    if body.txt.len() != TXT_LEN
        || !body
            .txt
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(known(refused(
            StatusCode::BAD_REQUEST,
            "bad_txt",
            format!(
                "the value is not a dns-01 digest (43 base64url characters): {:?}",
                crate::bounded::truncate(&body.txt, 64)
            ),
        )));
    }
    Ok(Authorized {
        username: account.username.clone(),
        zone: account.zone.clone(),
        fulldomain: account.fulldomain(),
        txt: body.txt,
    })
}

/// A counter per key over a window that opens at the key's first request
/// (so that a limit of N allows exactly N in any run starting then), in
/// memory: per replica, and reset by a restart (a ceiling on a runaway
/// client, not an accounting).
#[derive(Debug)]
struct Limiter {
    window: i64,
    limit: u32,
    /// Keys remembered at most ([`MAX_LIMITER_KEYS`]).
    capacity: usize,
    counts: Mutex<HashMap<String, (i64, u32)>>,
}

impl Limiter {
    fn new(window: Duration, limit: u32) -> Self {
        Self {
            window: window.as_secs().max(1) as i64,
            limit,
            capacity: MAX_LIMITER_KEYS,
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one request of `key` at `now` (Unix seconds); Err with the
    /// seconds until its window ends when it is over the limit.
    fn take(&self, key: &str, now: i64) -> Result<(), u64> {
        let Ok(mut counts) = self.counts.lock() else {
            return Err(1);
        };
        let window = self.window;
        if counts.len() >= self.capacity && !counts.contains_key(key) {
            counts.retain(|_, (opened, _)| now - *opened < window);
            // Still full: the oldest window goes (its key starts afresh if
            // it comes back), so a flood of keys bounds memory without
            // locking everyone out.
            if counts.len() >= self.capacity
                && let Some(oldest) = counts
                    .iter()
                    .min_by_key(|(_, (opened, _))| *opened)
                    .map(|(k, _)| k.clone())
            {
                counts.remove(&oldest);
            }
        }
        let entry = counts.entry(key.to_owned()).or_insert((now, 0));
        if now - entry.0 >= window {
            *entry = (now, 0);
        }
        if entry.1 >= self.limit {
            return Err((entry.0 + window - now).max(1) as u64);
        }
        entry.1 += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn refusals_at_the_account_limit_get_a_row_at_once_then_one_for_the_rest_of_the_minute() {
        let mut at = AtLimit::default();
        assert_eq!(at.refused(100), AtLimitRow::Now);
        assert_eq!(at.refused(110), AtLimitRow::Later(50));
        assert_eq!(at.refused(120), AtLimitRow::Counted);
        assert_eq!(at.refused(159), AtLimitRow::Counted);
        assert_eq!(at.take(), 3);
        // A new minute: its first refusal has its row at once again.
        assert_eq!(at.refused(161), AtLimitRow::Now);
        assert_eq!(
            at.refused(230),
            AtLimitRow::Now,
            "past the minute, none pending"
        );
        assert_eq!(at.take(), 0);
    }

    #[test]
    fn json_keys_are_matched_in_any_case_as_acme_dns_clients_send_them() {
        let lego = update_body(br#"{"SubDomain": "abc", "Txt": "xyz"}"#).unwrap();
        assert_eq!((lego.subdomain.as_str(), lego.txt.as_str()), ("abc", "xyz"));
        let plain = update_body(br#"{"subdomain": "abc", "txt": "xyz"}"#).unwrap();
        assert_eq!(plain.subdomain, "abc");
        assert!(update_body(br#"{"subdomain": 7}"#).is_none());
        assert!(update_body(b"[]").is_none());

        assert_eq!(
            register_body(br#"{"AllowFrom": ["10.0.0.0/8"]}"#)
                .unwrap()
                .allow_from,
            ["10.0.0.0/8"]
        );
        assert!(register_body(b"").unwrap().allow_from.is_empty());
        assert!(
            register_body(br#"{"allowfrom": null}"#)
                .unwrap()
                .allow_from
                .is_empty()
        );
        assert!(register_body(br#"{"allowfrom": "10.0.0.0/8"}"#).is_none());
        assert_eq!(network("192.0.2.7"), Some("192.0.2.7/32".parse().unwrap()));
        assert!(network("lan").is_none());
    }

    #[test]
    fn a_limiter_refuses_past_its_limit_until_the_window_ends_and_forgets_old_windows() {
        let l = Limiter::new(Duration::from_secs(60), 2);
        assert!(l.take("a", 119).is_ok());
        assert!(l.take("a", 125).is_ok());
        // The window opened at the first request, not on a minute.
        assert_eq!(l.take("a", 150), Err(29));
        // Another key has its own count.
        assert!(l.take("b", 150).is_ok());
        // Once the window is over, a new one opens.
        assert!(l.take("a", 179).is_ok());
        assert!(l.take("a", 180).is_ok());
        assert_eq!(l.take("a", 181), Err(58));
    }

    #[test]
    fn a_full_limiter_forgets_its_oldest_window_rather_than_refusing_newcomers() {
        let mut l = Limiter::new(Duration::from_secs(60), 1);
        l.capacity = 2;
        assert!(l.take("a", 10).is_ok());
        assert!(l.take("b", 20).is_ok());
        // Full: "c" is counted, "a" (the oldest) forgotten.
        assert!(l.take("c", 30).is_ok());
        assert_eq!(l.take("b", 31), Err(49));
        assert_eq!(l.take("c", 31), Err(59));
        assert!(l.take("a", 31).is_ok());
    }
}
