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

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;
use axum::routing::{get, post};
use http::{HeaderValue, Method, header};
use http_body_util::BodyExt as _;
use ipnet::IpNet;
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
    /// What one client's bodies may hold of `max_buffered_body_bytes`
    /// ([`BodyShare`]).
    body_share: BodyShare,
    /// Whose forwarded header is believed for the client's address.
    pub forwarding: forwarded::Forwarding,
}

/// One client's share of the body budget, and who counts as one client.
#[derive(Clone, Copy, Debug)]
pub struct BodyShare {
    /// Octets of bodies one client may have in memory at once.
    pub octets: usize,
    /// The IPv6 prefix counted as one client (`ipv6_client_prefix`).
    pub ipv6_prefix: u8,
}

impl BodyShare {
    /// The same share of the budget as `max_open_per_client` is of
    /// `max_open`, and never less than one whole body: as many addresses
    /// are needed to fill it as to fill the listener's connections
    /// (sixteen with the defaults).
    pub fn of(config: &crate::config::Config) -> Self {
        let c = &config.connections;
        let share = config.max_buffered_body_bytes as u128 * c.max_open_per_client as u128
            / c.max_open.max(1) as u128;
        // Never more than the whole budget (max_open_per_client may exceed
        // max_open), so the cast cannot truncate.
        let share = share.min(config.max_buffered_body_bytes as u128) as usize;
        Self {
            octets: share.max(config.max_body_bytes),
            ipv6_prefix: c.ipv6_client_prefix,
        }
    }
}

pub type App = Arc<AppState>;

impl AppState {
    pub fn new(
        authority: Arc<Authority>,
        base_url: String,
        max_body: usize,
        body_read_timeout: std::time::Duration,
        admission: Arc<Admission>,
        body_share: BodyShare,
        forwarding: forwarded::Forwarding,
    ) -> Self {
        Self {
            authority,
            base_url,
            max_body,
            body_read_timeout,
            admission,
            body_share,
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
/// one of the `max_in_flight` slots the server's work needs. The octets
/// received are counted in `max_buffered_body_bytes` and the client's
/// share of it as they arrive, and until the response: a client holds
/// what it has sent, not what it announced, and connections times HTTP/2
/// streams times `max_body` is far more than a small machine has.
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
    // Trusted proxies carry many clients: held to the whole budget only,
    // as they are exempt from the per-client connection cap.
    let client = parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip().to_canonical())
        .filter(|ip| !app.forwarding.trusts(*ip))
        .map(|ip| forwarded::client_network(ip, app.body_share.ipv6_prefix));
    let mut charge = BodyCharge {
        admission: Arc::clone(&app.admission),
        client,
        octets: 0,
    };
    let refused = if declared.is_some_and(|n| n > app.max_body as u64) {
        too_large()
    } else {
        let read = async {
            let mut body = body;
            // Copied out of each frame at once: a frame is a slice of
            // hyper's read buffer and keeps all of it alive, so a body
            // trickled an octet a segment would otherwise hold a buffer
            // per octet. What is held is then at most twice what is
            // counted (the vector's growth).
            let mut bytes = Vec::new();
            while let Some(frame) = body.frame().await {
                let Ok(data) = frame?.into_data() else {
                    continue; // trailers
                };
                if bytes.len() + data.len() > app.max_body {
                    return Ok(Err(too_large()));
                }
                if let Err(full) = charge.grow(data.len(), app.body_share.octets) {
                    return Ok(Err(shed(&app, full)));
                }
                bytes.extend_from_slice(&data);
            }
            Ok::<_, axum::Error>(Ok(bytes))
        };
        match tokio::time::timeout(app.body_read_timeout, read).await {
            Ok(Ok(Ok(bytes))) => {
                return next
                    .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                    .await;
            }
            Ok(Ok(Err(refused))) => refused,
            // The client went away mid-body: nobody reads the answer.
            Ok(Err(_)) => AcmeError::malformed("the request body could not be read"),
            Err(_) => AcmeError::malformed(format!(
                "the request body did not arrive within {:?}",
                app.body_read_timeout
            ))
            .with_status(408),
        }
    };
    drop(charge);
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

/// What the ACME routes admit at once, one count for the whole process:
/// `max_in_flight` requests, and `max_buffered_body_bytes` of request
/// bodies. A reload's new generation takes from the same counts as the
/// requests still finishing on the one it replaced, so that the bounds
/// hold across the swap instead of doubling while they drain. The limits
/// are the generation in force's, set when it is swapped in.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Budget>,
    body_octets: Arc<Budget>,
    /// Body octets held per client (an IPv4 address or an IPv6 network),
    /// only while some are.
    body_octets_per_client: Mutex<HashMap<IpNet, usize>>,
}

/// The octets of one request's body received so far, counted in the body
/// budget and its client's share; given back when dropped.
struct BodyCharge {
    admission: Arc<Admission>,
    client: Option<IpNet>,
    octets: usize,
}

impl BodyCharge {
    /// Counts `more` octets, if the budget and the client's `share` have
    /// room for them now; else which of the two is full.
    fn grow(&mut self, more: usize, share: usize) -> Result<(), Full> {
        // An empty frame (HTTP/2's closing DATA) holds nothing, and must
        // not leave an entry in the map that nothing would remove.
        if more == 0 {
            return Ok(());
        }
        let budget = &self.admission.body_octets;
        if !budget.add(more) {
            return Err(Full::BodyBudget);
        }
        if let Some(client) = self.client {
            let mut per = self.admission.per_client();
            let held = per.get(&client).copied().unwrap_or(0);
            if held + more > share {
                drop(per);
                budget.taken.fetch_sub(more, Ordering::AcqRel);
                return Err(Full::BodyShare);
            }
            per.insert(client, held + more);
        }
        self.octets += more;
        Ok(())
    }
}

impl Drop for BodyCharge {
    fn drop(&mut self) {
        if self.octets == 0 {
            return;
        }
        self.admission
            .body_octets
            .taken
            .fetch_sub(self.octets, Ordering::AcqRel);
        if let Some(client) = self.client {
            let mut per = self.admission.per_client();
            if let Some(held) = per.get_mut(&client) {
                *held = held.saturating_sub(self.octets);
                if *held == 0 {
                    per.remove(&client);
                }
            }
        }
    }
}

/// A limit and how much of it is taken.
#[derive(Debug)]
struct Budget {
    limit: AtomicUsize,
    taken: AtomicUsize,
}

/// Some of a budget, given back when dropped (the response is made).
struct Taken {
    budget: Arc<Budget>,
    amount: usize,
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.budget.taken.fetch_sub(self.amount, Ordering::AcqRel);
    }
}

impl Budget {
    fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: AtomicUsize::new(limit),
            taken: AtomicUsize::new(0),
        })
    }

    /// Counts `amount` as taken, if that much is left now; never waits.
    fn add(&self, amount: usize) -> bool {
        let limit = self.limit.load(Ordering::Acquire);
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(amount).filter(|&after| after <= limit)
            })
            .is_ok()
    }

    /// `amount` of it, given back when the returned value is dropped.
    fn try_take(self: &Arc<Self>, amount: usize) -> Option<Taken> {
        self.add(amount).then(|| Taken {
            budget: Arc::clone(self),
            amount,
        })
    }
}

impl Admission {
    pub fn new(max_in_flight: usize, max_buffered_body_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Budget::new(max_in_flight),
            body_octets: Budget::new(max_buffered_body_bytes),
            body_octets_per_client: Mutex::new(HashMap::new()),
        })
    }

    fn per_client(&self) -> std::sync::MutexGuard<'_, HashMap<IpNet, usize>> {
        self.body_octets_per_client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// From now on at most `max_in_flight` requests and
    /// `max_buffered_body_bytes` of bodies are admitted at once. What is
    /// already taken past a lower limit is kept to the end of its
    /// request; nothing more is admitted until the count is below it.
    pub fn set_limits(&self, max_in_flight: usize, max_buffered_body_bytes: usize) {
        self.slots.limit.store(max_in_flight, Ordering::Release);
        self.body_octets
            .limit
            .store(max_buffered_body_bytes, Ordering::Release);
    }
}

/// The bound of [`Admission`] that was full, as `requests_shed_total`
/// names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Full {
    /// `max_in_flight`.
    Slots,
    /// `max_buffered_body_bytes`.
    BodyBudget,
    /// A client's share of `max_buffered_body_bytes`.
    BodyShare,
}

impl Full {
    fn bound(self) -> &'static str {
        match self {
            Full::Slots => "max_in_flight",
            Full::BodyBudget => "max_buffered_body_bytes",
            Full::BodyShare => "body_share",
        }
    }
}

/// [`at_capacity`], counted by the bound that was full: which limit to
/// raise (or which client to look at) is the operator's next question.
fn shed(app: &App, full: Full) -> AcmeError {
    app.authority
        .metrics
        .requests_shed
        .get_or_create(&vec![("bound", full.bound().to_owned())])
        .inc();
    at_capacity()
}

/// The answer when a bound of [`Admission`] is reached: 503 at once, with
/// `Retry-After` (§6.6), rather than a queue without bound.
fn at_capacity() -> AcmeError {
    let mut e = AcmeError::new(
        acme_proxy_protocol::ProblemType::ServerInternal,
        "the server is at capacity; retry after the indicated delay",
    )
    .with_status(503);
    e.retry_after = Some(1);
    e
}

/// Sheds load instead of queueing without bound: past `max_in_flight`
/// requests, answer 503 with `Retry-After` at once.
async fn admission(State(app): State<App>, req: Request, next: Next) -> Response {
    match app.admission.slots.try_take(1) {
        Some(_slot) => next.run(req).await,
        None => reply::problem_response(shed(&app, Full::Slots)),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(admission: &Arc<Admission>, client: &str) -> BodyCharge {
        BodyCharge {
            admission: Arc::clone(admission),
            client: Some(client.parse().unwrap()),
            octets: 0,
        }
    }

    #[test]
    fn a_body_charge_counts_octets_in_the_budget_and_its_clients_share_and_gives_them_all_back() {
        let admission = Admission::new(1, 100);
        let taken = |a: &Arc<Admission>| a.body_octets.taken.load(Ordering::Acquire);
        let mut first = charge(&admission, "192.0.2.1/32");
        // An empty frame leaves no trace, even in a full budget.
        assert_eq!(first.grow(0, 40), Ok(()));
        assert!(admission.per_client().is_empty());
        assert_eq!(first.grow(30, 40), Ok(()));
        // Past the client's share: refused, and the budget given back.
        assert_eq!(first.grow(11, 40), Err(Full::BodyShare));
        assert_eq!(taken(&admission), 30);
        assert_eq!(first.grow(10, 40), Ok(()));
        // Another client has its own share, within what is left.
        let mut second = charge(&admission, "192.0.2.2/32");
        assert_eq!(second.grow(40, 40), Ok(()));
        assert_eq!(second.grow(0, 40), Ok(()), "an empty frame past the share");
        assert_eq!(taken(&admission), 80);
        let mut third = charge(&admission, "192.0.2.3/32");
        assert_eq!(
            third.grow(21, 40),
            Err(Full::BodyBudget),
            "past the whole budget"
        );
        assert_eq!(third.grow(20, 40), Ok(()));
        assert_eq!(taken(&admission), 100);
        drop((first, second, third));
        assert_eq!(taken(&admission), 0);
        assert!(admission.per_client().is_empty());
    }
}
