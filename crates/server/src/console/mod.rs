//! The web console (`[admin]`): server-rendered pages for operators, on a
//! listener of its own, behind a login.
//!
//! Every request passes [`guard`] first, which is where the console's
//! security lives, so that no handler can forget it:
//!
//! - on the JSON API (`/api/`), an `Authorization: Bearer` API token, when
//!   sent, is what proves who asks: it is not ambient (browsers never send
//!   it by themselves), so neither check below applies and no cookie is
//!   looked at; a token that fails is answered 401;
//! - otherwise a mutating request (anything but GET and HEAD) from another
//!   site is refused: its `Origin` must be this console's own, and without
//!   one its `Sec-Fetch-Site` must not say `cross-site` or `same-site`;
//! - a session is found from its cookie (only the token's SHA-256 is
//!   stored), and ended past its idle or absolute lifetime or once its
//!   operator is disabled;
//! - every page but the login's wants a session (a page without one is
//!   sent to the login, the API answers 401), and a mutating request also
//!   the session's CSRF token, in the `X-CSRF-Token` header or the `csrf`
//!   form field, compared in constant time;
//! - every answer gets a strict Content-Security-Policy (no inline script
//!   or style, no framing), `no-store` (pages may show secrets once), and
//!   is counted in `acme_proxy_admin_http_requests`.
//!
//! Templates autoescape everything they print; the only markup built in
//! Rust is numbers (the chart's geometry).

mod api;
mod auth;
mod chart;
mod pages;
mod queries;

use std::net::SocketAddr;
use std::sync::Arc;

use acme_proxy_store::SessionStage;
use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Path, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use subtle::ConstantTimeEq;
use tokio::sync::{Semaphore, watch};

use crate::config::AdminConfig;
use crate::generation::Generations;

/// The session cookie. `__Host-` makes browsers keep it only when it is
/// `Secure`, for this host alone and for every path (RFC 6265bis §4.1.3.2).
pub const SESSION_COOKIE: &str = "__Host-acme-proxy-session";
/// The CSRF token's header, for scripts and htmx.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// A mutating request's body (and any request's with an API token) is
/// read whole before anything else, up to this: forms are small.
const MAX_FORM_BYTES: usize = 64 * 1024;
/// Password hashes computed at once (each holds ~19 MiB and a core for
/// tens of milliseconds).
const HASHING_AT_ONCE: usize = 2;
/// A session's last use is written at most this often (seconds): its idle
/// lifetime is that much less precise, and a page view is not a write.
const TOUCH_EVERY: i64 = 60;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's state: shared by every request of its listener.
pub struct Console {
    generations: Generations,
    settings: AdminConfig,
    /// Whether the listener terminates TLS (the console's own origin).
    https: bool,
    throttle: auth::Throttle,
    hashing: Arc<Semaphore>,
    /// A hash of a random password, checked when the name given at login
    /// is no operator's, so that both cost the same time.
    unknown_hash: String,
    templates: minijinja::Environment<'static>,
    stylesheet: Asset,
    /// htmx, vendored (see `assets/vendor/README.md`).
    htmx: Asset,
}

/// A static file served under a name with its digest in it, so that it
/// can be cached for ever.
struct Asset {
    name: String,
    body: &'static str,
    content_type: &'static str,
}

impl Asset {
    fn new(stem: &str, extension: &str, body: &'static str, content_type: &'static str) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, body.as_bytes());
        Self {
            name: format!("{stem}-{}.{extension}", hex::encode(&digest.as_ref()[..8])),
            body,
            content_type,
        }
    }
}

/// How a request proved who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The session cookie of a browser's login.
    Cookie,
    /// An operator's API token (`Authorization: Bearer`), on the JSON API
    /// only.
    Token,
}

/// The operator a request acts as, put in its extensions by [`guard`].
#[derive(Clone, Debug)]
pub struct Session {
    /// The session's id, or the API token's.
    pub id: String,
    pub operator: String,
    pub csrf: String,
    pub stage: SessionStage,
    /// A TOTP secret shown for enrolment, not yet confirmed.
    pending_totp: Option<Vec<u8>>,
    token_hash: Vec<u8>,
    pub via: Via,
}

impl Session {
    /// `operator:NAME`, as the audit trail names who acted.
    pub fn actor(&self) -> String {
        format!("operator:{}", self.operator)
    }
}

impl Console {
    pub async fn new(
        generations: Generations,
        settings: AdminConfig,
        https: bool,
    ) -> anyhow::Result<Arc<Self>> {
        let unknown_hash = crate::passwords::hash(crate::ids::session_token(), None).await?;
        let mut templates = minijinja::Environment::new();
        // Every template's output is HTML-escaped, whatever its name.
        templates.set_auto_escape_callback(|_| minijinja::AutoEscape::Html);
        templates.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        for (name, source) in TEMPLATES {
            templates
                .add_template(name, source)
                .with_context(|| format!("the console's template {name}"))?;
        }
        Ok(Arc::new(Self {
            generations,
            settings,
            https,
            throttle: auth::Throttle::default(),
            hashing: Arc::new(Semaphore::new(HASHING_AT_ONCE)),
            unknown_hash,
            templates,
            stylesheet: Asset::new(
                "console",
                "css",
                include_str!("assets/console.css"),
                "text/css; charset=utf-8",
            ),
            htmx: Asset::new("htmx", "js", HTMX, "text/javascript; charset=utf-8"),
        }))
    }

    fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/", get(pages::dashboard))
            .route("/login", get(auth::login_page).post(auth::login))
            .route("/login/totp", post(auth::login_totp))
            .route("/account/totp", get(auth::totp_page).post(auth::enrol_totp))
            .route("/logout", post(auth::logout))
            .route("/orders", get(pages::orders))
            .route("/orders/{id}", get(pages::order))
            .route("/orders/{id}/chain.pem", get(pages::order_chain))
            .route("/orders/{id}/revoke", post(pages::revoke))
            .route("/accounts", get(pages::accounts))
            .route("/accounts/{id}", get(pages::account))
            .route("/accounts/{id}/deactivate", post(pages::deactivate_account))
            .route("/accounts/{id}/delete", post(pages::delete_account))
            .route("/audit", get(pages::audit))
            .route("/relay", get(pages::relay))
            .route("/profiles", get(pages::profiles))
            .route("/policy", get(pages::policy))
            .route("/jobs", get(pages::jobs))
            .route("/jobs/{id}/retry", post(pages::retry_job))
            .route("/jobs/{id}/cancel", post(pages::cancel_job))
            .route("/eab", get(pages::eab).post(pages::mint_eab))
            .route("/eab/{kid}/revoke", post(pages::revoke_eab))
            .route("/static/{file}", get(asset))
            .nest("/api/v1", api::routes())
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(self),
                guard,
            ))
            .with_state(Arc::clone(self))
    }

    /// A page: `template` with `context`, plus what every page shows.
    fn page(
        &self,
        status: StatusCode,
        template: &str,
        session: Option<&Session>,
        context: minijinja::Value,
    ) -> Response {
        let base = minijinja::context! {
            stylesheet => format!("/static/{}", self.stylesheet.name),
            htmx => format!("/static/{}", self.htmx.name),
            operator => session.map(|s| s.operator.clone()),
            csrf => session.map(|s| s.csrf.clone()),
        };
        let rendered = self
            .templates
            .get_template(template)
            .and_then(|t| t.render(minijinja::context! { ..base, ..context }));
        match rendered {
            Ok(html) => (
                status,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                html,
            )
                .into_response(),
            Err(e) => {
                tracing::error!(event = "admin.render", outcome = "failure", template, error = %e, "a console page did not render");
                StatusCode::INTERNAL_SERVER_ERROR.into_response()
            }
        }
    }

    /// A short page saying why a request was refused.
    fn refusal(&self, status: StatusCode, message: &str) -> Response {
        self.page(
            status,
            "message.html",
            None,
            minijinja::context! { title => status.canonical_reason().unwrap_or("Refused"), message },
        )
    }

    /// A refusal as the request's side of the console reads one: a problem
    /// document for the API (`/api/…`), a page for a browser.
    fn refuse(&self, api: bool, status: StatusCode, message: &str) -> Response {
        if api {
            api::problem(status, message)
        } else {
            self.refusal(status, message)
        }
    }

    /// The page saying why a request got no answer.
    fn failed(&self, failure: queries::Failure) -> Response {
        match failure {
            queries::Failure::Unavailable(why) => self.unavailable(&why),
            queries::Failure::Later { why, retry_after } => {
                let mut response = self.refusal(StatusCode::SERVICE_UNAVAILABLE, &why);
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
                response
            }
            other => {
                let (status, why) = other.status_and_words();
                self.refusal(status, &why)
            }
        }
    }

    fn unavailable(&self, why: &dyn std::fmt::Display) -> Response {
        tracing::error!(event = "admin.request", outcome = "failure", error = %why, "the console could not answer");
        let mut response = self.refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "The database did not answer; try again in a moment.",
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        response
    }

    /// The session the request's cookie names, if it is alive; a stale one
    /// is deleted. An error is the store's, in words.
    async fn session_of(&self, headers: &HeaderMap) -> Result<Option<Session>, String> {
        let Some(token) = auth::cookie(headers, SESSION_COOKIE) else {
            return Ok(None);
        };
        let token_hash = auth::token_hash(token);
        let authority = self.generations.authority();
        let store = authority.store();
        let found = store
            .operator_session(&token_hash)
            .await
            .map_err(|e| e.to_string())?;
        let Some((session, operator)) = found else {
            return Ok(None);
        };
        let now = authority.clock.unix();
        let idle = i64::try_from(self.settings.session_idle.as_secs()).unwrap_or(i64::MAX);
        let lifetime = i64::try_from(self.settings.session_lifetime.as_secs()).unwrap_or(i64::MAX);
        if operator.disabled_at.is_some()
            || now.saturating_sub(session.last_seen_at) > idle
            || now.saturating_sub(session.created_at) > lifetime
        {
            store
                .end_operator_session(&token_hash, None)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(None);
        }
        if now.saturating_sub(session.last_seen_at) >= TOUCH_EVERY {
            store
                .touch_operator_session(&token_hash, now)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(Some(Session {
            id: session.id,
            operator: session.operator,
            csrf: session.csrf_token,
            stage: session.stage,
            pending_totp: session.pending_totp,
            token_hash,
            via: Via::Cookie,
        }))
    }

    /// The operator an API token acts as, when the token is known,
    /// unexpired, and its operator not disabled.
    async fn token_session(&self, token: &str) -> Result<Option<Session>, String> {
        // Anything longer than a token is not one: no digest of it.
        if token.len() > 128 || !token.starts_with(crate::admin::operators::TOKEN_PREFIX) {
            return Ok(None);
        }
        let token_hash = auth::token_hash(token);
        let authority = self.generations.authority();
        let store = authority.store();
        let Some((row, operator)) = store
            .operator_token(&token_hash)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        let now = authority.clock.unix();
        if operator.disabled_at.is_some() || now >= row.expires_at {
            return Ok(None);
        }
        if now.saturating_sub(row.last_used_at.unwrap_or(0)) >= TOUCH_EVERY {
            store
                .touch_operator_token(&row.id, now)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(Some(Session {
            id: row.id,
            operator: row.operator,
            csrf: String::new(),
            stage: SessionStage::Full,
            pending_totp: None,
            token_hash,
            via: Via::Token,
        }))
    }

    /// Whether a mutating request comes from this console's own pages (or
    /// from no browser at all: a script, which must then carry the CSRF
    /// token like anyone).
    ///
    /// The host is the request's `Host` header, or over HTTP/2 (which the
    /// TLS listener offers first) its `:authority`, which arrives in the
    /// URI: browsers send no `Host` header there (RFC 9113 §8.3.1).
    fn same_origin(&self, req: &Request) -> bool {
        let headers = req.headers();
        if let Some(origin) = headers.get(header::ORIGIN) {
            let host = match headers.get(header::HOST) {
                Some(host) => host.to_str().ok(),
                None => req.uri().authority().map(|a| a.as_str()),
            };
            let Some(host) = host else {
                return false;
            };
            let scheme = if self.https { "https" } else { "http" };
            return origin.as_bytes() == format!("{scheme}://{host}").as_bytes();
        }
        match headers.get("sec-fetch-site").map(HeaderValue::as_bytes) {
            None => true,
            Some(site) => site == b"same-origin" || site == b"none",
        }
    }
}

/// htmx as published (`assets/vendor/README.md` says which and why).
const HTMX: &str = include_str!("assets/vendor/htmx.min.js");

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("login.html", include_str!("templates/login.html")),
    ("login_totp.html", include_str!("templates/login_totp.html")),
    ("totp.html", include_str!("templates/totp.html")),
    ("message.html", include_str!("templates/message.html")),
    ("dashboard.html", include_str!("templates/dashboard.html")),
    ("orders.html", include_str!("templates/orders.html")),
    ("order.html", include_str!("templates/order.html")),
    ("eab.html", include_str!("templates/eab.html")),
    ("accounts.html", include_str!("templates/accounts.html")),
    ("account.html", include_str!("templates/account.html")),
    ("audit.html", include_str!("templates/audit.html")),
    ("relay.html", include_str!("templates/relay.html")),
    ("profiles.html", include_str!("templates/profiles.html")),
    ("policy.html", include_str!("templates/policy.html")),
    ("jobs.html", include_str!("templates/jobs.html")),
];

/// See the module's documentation.
async fn guard(State(console): State<Arc<Console>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    let started = std::time::Instant::now();
    let mut response = checked(&console, req, next).await;
    let headers = response.headers_mut();
    // The server's own time to answer, for operators' browsers and
    // scripts/bench-console (W3C Server Timing).
    if let Ok(timing) = HeaderValue::from_str(&format!(
        "app;dur={:.1}",
        started.elapsed().as_secs_f64() * 1000.0
    )) {
        headers.insert("server-timing", timing);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: with it, browsers send `Origin: null` on the
    // console's own form posts (Fetch §3.2.5), which the same-origin
    // check must refuse. `same-origin` keeps the Origin for them and sends
    // nothing to other sites.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    if console.https {
        headers.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    let authority = console.generations.authority();
    authority
        .metrics
        .admin_requests
        .get_or_create(&vec![
            ("route", route),
            ("status", response.status().as_u16().to_string()),
        ])
        .inc();
    response
}

/// Who may reach a path: anyone, or a session at one of some stages.
enum Access {
    Anyone,
    Stages(&'static [SessionStage]),
}

fn access(path: &str) -> Access {
    use SessionStage::{Enrol, Full, Totp};
    match path {
        "/login" => Access::Anyone,
        _ if path.starts_with("/static/") => Access::Anyone,
        "/login/totp" => Access::Stages(&[Totp]),
        "/account/totp" => Access::Stages(&[Enrol, Full]),
        "/logout" => Access::Stages(&[Totp, Enrol, Full]),
        _ => Access::Stages(&[Full]),
    }
}

/// Where a session at `stage` is sent when it asks for a page it may not
/// see yet.
fn home_of(stage: SessionStage) -> &'static str {
    match stage {
        SessionStage::Totp => "/login",
        SessionStage::Enrol => "/account/totp",
        SessionStage::Full => "/",
    }
}

async fn checked(console: &Console, req: Request, next: Next) -> Response {
    let mutating = !matches!(*req.method(), Method::GET | Method::HEAD);
    let path = req.uri().path();
    let access = access(path);
    let api = path.starts_with("/api/");
    let htmx = req.headers().contains_key("hx-request");
    let refuse = |status: StatusCode, words: &str| console.refuse(api, status, words);
    let unavailable = |why: String| {
        if api {
            tracing::error!(event = "admin.request", outcome = "failure", error = %why, "the console could not answer");
            api::problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database did not answer; try again in a moment.",
            )
        } else {
            console.unavailable(&why)
        }
    };
    if api && let Some(authorization) = bearer(req.headers()) {
        // A script's API token. Browsers never send one by themselves, so
        // it carries no ambient authority: neither the same-origin check
        // nor a CSRF token applies, and no cookie is looked at.
        let session = match console.token_session(authorization).await {
            Ok(Some(session)) => session,
            Ok(None) => {
                return api::unauthorized(
                    "That API token is unknown, expired, revoked, or its operator is disabled.",
                    true,
                );
            }
            Err(why) => return unavailable(why),
        };
        let (parts, bytes) = match bounded(console, req).await {
            Ok(read) => read,
            Err(refused) => return refused,
        };
        let mut req = Request::from_parts(parts, Body::from(bytes));
        req.extensions_mut().insert(session);
        return next.run(req).await;
    }
    if mutating && !console.same_origin(&req) {
        return refuse(
            StatusCode::FORBIDDEN,
            "This request came from another site and was refused.",
        );
    }
    let session = match console.session_of(req.headers()).await {
        Ok(session) => session,
        Err(why) => return unavailable(why),
    };
    if let Access::Stages(stages) = access {
        let Some(session) = &session else {
            return if api {
                api::unauthorized(
                    "Log in first, or send an API token (Authorization: Bearer).",
                    false,
                )
            } else if mutating {
                refuse(StatusCode::FORBIDDEN, "You are not logged in.")
            } else {
                elsewhere(htmx, "/login")
            };
        };
        if !stages.contains(&session.stage) {
            return if mutating || api {
                refuse(
                    StatusCode::FORBIDDEN,
                    "Finish logging in first (the TOTP code, or enrolling an authenticator).",
                )
            } else {
                elsewhere(htmx, home_of(session.stage))
            };
        }
    }
    let mut req = req;
    if mutating {
        let (parts, bytes) = match bounded(console, req).await {
            Ok(read) => read,
            Err(refused) => return refused,
        };
        if matches!(access, Access::Stages(_)) {
            let expected = session.as_ref().map(|s| s.csrf.as_bytes()).unwrap_or(b"");
            let given = parts
                .headers
                .get(CSRF_HEADER)
                .map(|v| v.as_bytes().to_vec())
                .or_else(|| auth::form_field(&bytes, "csrf").map(String::into_bytes))
                .unwrap_or_default();
            if expected.is_empty() || !bool::from(given.as_slice().ct_eq(expected)) {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "This form has expired or did not come from this console; reload the page and try again.",
                );
            }
        }
        req = Request::from_parts(parts, Body::from(bytes));
    }
    if let Some(session) = session {
        req.extensions_mut().insert(session);
    }
    next.run(req).await
}

const TOO_LARGE: &str = "The request's body was too large or cut off.";

/// The token of an `Authorization: Bearer` header (RFC 6750 §2.1; the
/// scheme's name is case-insensitive, RFC 9110 §11.1). Another scheme (a
/// proxy's Basic in front of the console) is not a token: the request is
/// then looked at as a browser's.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let (scheme, token) = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// A request's body read whole, up to [`MAX_FORM_BYTES`] within
/// `connections.body_read_timeout`, before anything looks at it: a client
/// that trickles a form, or stops half-way, must not keep its connection
/// and this task for ever (the listener's idle timeout does not run while
/// a request is being read).
async fn bounded(
    console: &Console,
    req: Request,
) -> Result<(http::request::Parts, axum::body::Bytes), Response> {
    let within = console
        .generations
        .current()
        .config
        .connections
        .body_read_timeout;
    let api = req.uri().path().starts_with("/api/");
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(within, axum::body::to_bytes(body, MAX_FORM_BYTES)).await {
        Ok(Ok(bytes)) => Ok((parts, bytes)),
        Ok(Err(_)) => Err(console.refuse(api, StatusCode::PAYLOAD_TOO_LARGE, TOO_LARGE)),
        Err(_) => Err(console.refuse(
            api,
            StatusCode::REQUEST_TIMEOUT,
            &format!("The request's body did not arrive within {within:?}."),
        )),
    }
}

/// A page to be shown elsewhere (the login, when the session ended). For
/// htmx, which would follow a redirect inside the page and swap a piece of
/// the login page in, a `HX-Redirect` that makes the browser go there.
fn elsewhere(htmx: bool, to: &'static str) -> Response {
    if htmx {
        ([("hx-redirect", to)], "").into_response()
    } else {
        see_other(to)
    }
}

fn see_other(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

async fn asset(State(console): State<Arc<Console>>, Path(file): Path<String>) -> Response {
    let Some(asset) = [&console.stylesheet, &console.htmx]
        .into_iter()
        .find(|a| a.name == file)
    else {
        return console.refusal(StatusCode::NOT_FOUND, "There is no such page.");
    };
    (
        [
            (header::CONTENT_TYPE, asset.content_type),
            (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
        ],
        asset.body,
    )
        .into_response()
}

async fn not_found(State(console): State<Arc<Console>>, uri: http::Uri) -> Response {
    // A script that asked another version of the API reads problem
    // documents, not pages.
    if uri.path().starts_with("/api/") {
        return api::problem(
            StatusCode::NOT_FOUND,
            "There is no such API endpoint: the API is under /api/v1/.",
        );
    }
    console.refusal(StatusCode::NOT_FOUND, "There is no such page.")
}

/// Binds the console's listener and serves it until `stop`.
pub async fn serve(
    console: Arc<Console>,
    at: SocketAddr,
    settings: crate::listener::Listener,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(at)
        .await
        .with_context(|| format!("binding the console's listener {at} ([admin] listen)"))?;
    let addr = listener.local_addr()?;
    let router = console.router();
    tokio::spawn(crate::listener::serve(
        listener,
        settings,
        crate::listener::Routes::Fixed(router),
        stop,
    ));
    let scheme = if console.https { "https" } else { "http" };
    tracing::info!(event = "admin.started", outcome = "success", %addr, "the web console is at {scheme}://{addr}/");
    Ok(addr)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_vendored_htmx_is_the_file_its_record_names() {
        let record = include_str!("assets/vendor/README.md");
        let digest = hex::encode(ring::digest::digest(
            &ring::digest::SHA256,
            super::HTMX.as_bytes(),
        ));
        assert!(
            record.contains(&format!("`{digest}`")),
            "assets/vendor/htmx.min.js (SHA-256 {digest}) is not the file assets/vendor/README.md records"
        );
        assert!(include_str!("assets/vendor/htmx.LICENSE").contains("Zero-Clause BSD"));
    }
}
