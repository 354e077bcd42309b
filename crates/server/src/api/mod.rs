//! The ACME front end (the "web front end" in Boulder's terms): routes,
//! request verification, response headers, admission control.
//!
//! Architecture Invariant: `api` is the only module that builds problem
//! documents and HTTP responses; it never changes state itself, it asks the
//! authority.

mod documents;
pub mod forwarded;
mod handlers;
mod reply;
pub mod urls;
mod verify;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;
use axum::routing::{get, post};
use http::{HeaderValue, Method, header};
use tracing::Instrument;

use crate::authority::{Authority, Profile, RequestContext};
use crate::error::{AcmeError, AcmeResult};
pub use urls::Urls;

/// Everything a handler needs.
#[derive(Debug)]
pub struct AppState {
    pub authority: Arc<Authority>,
    /// `public_url`, without a trailing slash.
    pub base_url: String,
    pub max_body: usize,
    /// Time a request body may take to arrive (`connections.body_read_timeout`).
    pub body_read_timeout: std::time::Duration,
    admission: Arc<Admission>,
    /// Whose forwarded header is believed for the client's address.
    pub forwarding: forwarded::Forwarding,
}

pub type App = Arc<AppState>;

impl AppState {
    pub fn new(
        authority: Arc<Authority>,
        base_url: String,
        max_body: usize,
        body_read_timeout: std::time::Duration,
        admission: Arc<Admission>,
        forwarding: forwarded::Forwarding,
    ) -> Self {
        Self {
            authority,
            base_url,
            max_body,
            body_read_timeout,
            admission,
            forwarding,
        }
    }

    pub fn profile(&self, name: &str) -> AcmeResult<Arc<Profile>> {
        self.authority
            .profile(name)
            .cloned()
            .ok_or_else(|| AcmeError::not_found("profile"))
    }

    pub fn urls(&self, profile: &str) -> Urls {
        Urls::new(&self.base_url, profile)
    }
}

/// The whole HTTP surface.
pub fn router(app: App) -> Router {
    let acme = Router::new()
        .route("/profile/{profile}/directory", get(handlers::directory))
        .route(
            "/profile/{profile}/new-nonce",
            get(handlers::new_nonce_get).head(handlers::new_nonce_head),
        )
        .route(
            "/profile/{profile}/new-account",
            post(handlers::new_account),
        )
        .route("/profile/{profile}/new-order", post(handlers::new_order))
        .route(
            "/profile/{profile}/revoke-cert",
            post(handlers::revoke_cert),
        )
        .route("/profile/{profile}/key-change", post(handlers::key_change))
        .route("/profile/{profile}/acct/{id}", post(handlers::account))
        .route(
            "/profile/{profile}/acct/{id}/orders",
            post(handlers::account_orders),
        )
        .route("/profile/{profile}/order/{id}", post(handlers::order))
        .route(
            "/profile/{profile}/order/{id}/finalize",
            post(handlers::finalize),
        )
        .route("/profile/{profile}/authz/{id}", post(handlers::authz))
        .route("/profile/{profile}/chall/{id}", post(handlers::challenge))
        .route("/profile/{profile}/cert/{id}", post(handlers::certificate))
        .route("/profile/{profile}/crl", get(handlers::crl))
        .route("/profile/{profile}/ca.pem", get(handlers::ca_pem))
        .route(
            "/profile/{profile}/renewal-info/{id}",
            get(handlers::renewal_info),
        )
        .layer(from_fn_with_state(Arc::clone(&app), acme_headers))
        .layer(from_fn_with_state(Arc::clone(&app), policy_gate))
        .layer(from_fn_with_state(Arc::clone(&app), admission))
        .layer(from_fn_with_state(Arc::clone(&app), read_body));
    // The acme-dns API (`[dns_zone.api]`): its own wire format, body
    // limits and in-flight bound, so that it never holds the ACME
    // routes' admission slots.
    let acme = match &app.authority.dns_api {
        Some(api) => acme.nest("/acme-dns", crate::dns_api::router(Arc::clone(api))),
        None => acme,
    };
    Router::new()
        .merge(acme)
        .route("/", get(handlers::index))
        .route("/health", get(handlers::health))
        .route(
            "/.well-known/acme-challenge/{token}",
            get(handlers::upstream_http01),
        )
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(from_fn_with_state(Arc::clone(&app), request_context))
        .with_state(app)
}

/// Reads a POST's body, at most `max_body` octets within
/// `body_read_timeout`, before the request is admitted: a client that
/// trickles its body holds its connection (bounded by the listener), never
/// one of the `max_in_flight` slots the server's work needs.
async fn read_body(State(app): State<App>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        AcmeError::malformed(format!(
            "the request body is larger than {} octets",
            app.max_body
        ))
        .with_status(413)
    };
    let refused = if declared.is_some_and(|n| n > app.max_body as u64) {
        too_large()
    } else {
        match tokio::time::timeout(
            app.body_read_timeout,
            axum::body::to_bytes(body, app.max_body),
        )
        .await
        {
            Ok(Ok(bytes)) => {
                return next
                    .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                    .await;
            }
            Ok(Err(e))
                if std::error::Error::source(&e)
                    .is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) =>
            {
                too_large()
            }
            // The client went away mid-body: nobody reads the answer.
            Ok(Err(_)) => AcmeError::malformed("the request body could not be read"),
            Err(_) => AcmeError::malformed(format!(
                "the request body did not arrive within {:?}",
                app.body_read_timeout
            ))
            .with_status(408),
        }
    };
    // Answered like any ACME error, with a fresh nonce (§6.5). The body
    // left unread, hyper closes an HTTP/1.1 connection after the answer.
    let response = reply::problem_response(refused);
    decorate(&app, parts.uri.path(), true, response).await
}

/// `[policy]`'s connection stage, before anything is stored: a refused
/// client gets 403 `unauthorized` (503 with `Retry-After` when the policy
/// cannot decide), and no nonce. Inside admission, so that checks that
/// take time (a program) are bounded by `max_in_flight` like any work.
/// The CRL and the CA certificate are for relying parties anywhere, not
/// only the clients the policy lets in, and are not gated.
async fn policy_gate(State(app): State<App>, req: Request, next: Next) -> Response {
    // Without a connection rule (the profiles' defaults allow there),
    // there is nothing to ask.
    let ungated = !app
        .authority
        .policy
        .asks_at(crate::config::Stage::Connection)
        || req
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .is_some_and(|m| m.as_str().ends_with("/crl") || m.as_str().ends_with("/ca.pem"));
    if ungated {
        return next.run(req).await;
    }
    // The profile as the router decoded it for the handler (a percent-
    // encoded name must not pass the gate undecoded and be served decoded).
    let (mut parts, body) = req.into_parts();
    let profile = axum::extract::RawPathParams::from_request_parts(&mut parts, &())
        .await
        .ok()
        .and_then(|params| {
            params
                .iter()
                .find(|(key, _)| *key == "profile")
                .map(|(_, value)| value.to_owned())
        });
    if let Some(profile) = profile.filter(|name| app.authority.profile(name).is_some())
        && let Err(e) = app.authority.admit(&profile).await
    {
        return reply::problem_response(e);
    }
    next.run(Request::from_parts(parts, body)).await
}

/// The `max_in_flight` slots of the ACME routes, one set for the whole
/// process: a reload's new generation takes its slots from the same count
/// as the requests still finishing on the one it replaced, so that the
/// bound holds across the swap instead of doubling while they drain. The
/// limit is the generation in force's, set when it is swapped in.
#[derive(Debug)]
pub struct Admission {
    limit: AtomicUsize,
    taken: AtomicUsize,
}

/// One request's slot, given back when the response is made.
struct Slot(Arc<Admission>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: AtomicUsize::new(limit),
            taken: AtomicUsize::new(0),
        })
    }

    /// From now on at most `limit` requests are admitted at once. Slots
    /// already taken past a lower limit are kept to the end of their
    /// requests; no new one is admitted until the count is below it.
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Release);
    }

    fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let limit = self.limit.load(Ordering::Acquire);
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(self)))
    }
}

/// Sheds load instead of queueing without bound: past `max_in_flight`
/// requests, answer 503 with `Retry-After` at once.
async fn admission(State(app): State<App>, req: Request, next: Next) -> Response {
    match app.admission.try_take() {
        Some(_slot) => next.run(req).await,
        None => {
            let mut e = AcmeError::new(
                acme_proxy_protocol::ProblemType::ServerInternal,
                "the server is at capacity; retry after the indicated delay",
            )
            .with_status(503);
            e.retry_after = Some(1);
            reply::problem_response(e)
        }
    }
}

/// Headers every ACME response of a profile carries: `Link` to the
/// directory (§7.1), and on POSTs and newNonce a fresh `Replay-Nonce` (§6.5,
/// errors included, so a client can retry a `badNonce` at once) with
/// `Cache-Control: no-store` (§7.2).
async fn acme_headers(State(app): State<App>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let wants_nonce = req.method() == Method::POST || path.ends_with("/new-nonce");
    let response = next.run(req).await;
    decorate(&app, &path, wants_nonce, response).await
}

/// Adds [`acme_headers`]' headers to `response`, an answer to `path`.
async fn decorate(
    app: &AppState,
    path: &str,
    wants_nonce: bool,
    mut response: Response,
) -> Response {
    let Some(profile) = path
        .strip_prefix("/profile/")
        .and_then(|rest| rest.split('/').next())
        .filter(|name| app.authority.profile(name).is_some())
    else {
        return response;
    };
    if wants_nonce && !response.headers().contains_key("replay-nonce") {
        match app.authority.new_nonce().await {
            Ok(nonce) => {
                if let Ok(v) = HeaderValue::from_str(&nonce) {
                    response.headers_mut().insert("replay-nonce", v);
                }
            }
            Err(e) => {
                tracing::error!(event = "nonce.issue", outcome = "failure", error = ?e.internal, "could not issue a nonce");
            }
        }
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    let index = format!("<{}>;rel=\"index\"", app.urls(profile).directory());
    if let Ok(v) = HeaderValue::from_str(&index) {
        response.headers_mut().append(header::LINK, v);
    }
    response
}

/// Gives every request an id, a span that every log line of the request
/// carries, and one summary line.
async fn request_context(State(app): State<App>, mut req: Request, next: Next) -> Response {
    let request_id = crate::ids::request_id();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    // Both go to every log line of the request, and the user agent to its
    // audit rows: bounded (`bounded`), whatever the client sent.
    let user_agent = crate::bounded::truncate(
        req.headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or(""),
        crate::bounded::USER_AGENT_OCTETS,
    )
    .into_owned();
    let logged_path = crate::bounded::truncate(&path, crate::bounded::PATH_OCTETS).into_owned();
    let client_ip = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| {
            app.forwarding
                .client_ip(c.0.ip(), req.headers())
                .to_string()
        });
    let logged_client = client_ip.clone().unwrap_or_default();
    req.extensions_mut().insert(RequestContext {
        client_ip,
        user_agent: Some(user_agent.clone()).filter(|u| !u.is_empty()),
        request_id: Some(request_id.clone()),
    });
    let span = tracing::info_span!("request", request_id = %request_id, method = %method, path = %logged_path);
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    // Only configured profiles become label values: a scanner's random
    // paths must not grow the metric families without bound.
    let profile = path
        .strip_prefix("/profile/")
        .and_then(|rest| rest.split('/').next())
        .filter(|name| app.authority.profile(name).is_some())
        .unwrap_or("")
        .to_owned();
    let ctx = req
        .extensions()
        .get::<RequestContext>()
        .cloned()
        .unwrap_or_default();
    let mut response = ctx.scope(next.run(req).instrument(span.clone())).await;
    let status = response.status().as_u16();
    let m = &app.authority.metrics;
    m.requests
        .get_or_create(&vec![
            ("profile", profile.clone()),
            ("route", route.clone()),
            ("status", status.to_string()),
        ])
        .inc();
    m.request_seconds
        .get_or_create(&vec![("route", route)])
        .observe(started.elapsed().as_secs_f64());
    let outcome = match status {
        0..=399 => "success",
        400..=499 => "refused",
        _ => "failure",
    };
    span.in_scope(|| {
        tracing::info!(
            target: crate::logging::REQUEST_TARGET,
            event = "http.request",
            outcome,
            status,
            elapsed_us = started.elapsed().as_micros() as u64,
            client = %logged_client,
            profile = %profile,
            user_agent = %user_agent,
            "request served"
        );
    });
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}
