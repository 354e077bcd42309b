//! Every listener's connections (the ACME listener, plain or TLS, and the
//! metrics listener), served by hyper-util's HTTP/1.1-or-HTTP/2 server with
//! tokio's timer, within bounds that one client cannot stretch:
//!
//! - connections open at once, in total and per client address (the
//!   addresses of trusted proxies excepted), refused at accept past either;
//! - a TLS handshake within `tls.handshake_timeout`;
//! - an HTTP/1.1 request head within `header_read_timeout` of the
//!   connection's start or of the previous request's end (hyper's own
//!   timer, which is therefore also the keep-alive idle limit);
//! - no request in progress for `idle_timeout`: the connection is closed
//!   gracefully (HTTP/2: GOAWAY), and not waited for past [`CLOSE_GRACE`];
//! - HTTP/2 keep-alive pings, and a cap on concurrent streams.
//!
//! The request body's own deadline is the front end's (`api::read_body`),
//! which reads it before the request takes an admission slot.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::forwarded::client_network;
use crate::config::ConnectionsConfig;
use crate::metrics::Metrics;

/// How long a connection being closed (idle, or the server stopping) may
/// take to finish what it was doing before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// TLS on a listener: the acceptor and the handshake's deadline.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub handshake_timeout: Duration,
}

/// One listener's settings.
#[derive(Clone)]
pub struct Listener {
    /// The listener's name in logs and metrics (`acme`, `metrics`, and
    /// `dns` for the DNS zone's TCP connections, which are bounded alike).
    pub name: &'static str,
    pub tls: Option<Tls>,
    pub limits: ConnectionsConfig,
    /// Peers not limited per address (trusted reverse proxies).
    pub exempt: Vec<ipnet::IpNet>,
    pub metrics: Arc<Metrics>,
}

/// How often a listener whose accepts keep failing logs it. Out of file
/// descriptors, every accept fails until a connection closes, and the loop
/// retries ten times a second: a line each would flood the log just when
/// someone floods the listener.
const ACCEPT_FAILURES_LOGGED_EVERY: Duration = Duration::from_secs(60);

/// How long an accept loop pauses after a failed accept, rather than spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// One listener's failed accepts: each counted in `accept_failures`, the
/// first logged at once and the rest at most once a minute, with how many
/// there were.
#[derive(Debug, Default)]
pub(crate) struct AcceptFailures {
    logged_at: Option<Instant>,
    unlogged: u64,
}

impl AcceptFailures {
    /// Counts a failure at `now`; how many failures to log now, if a line
    /// is due.
    fn count(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        match self.logged_at {
            Some(at) if now.saturating_duration_since(at) < ACCEPT_FAILURES_LOGGED_EVERY => None,
            _ => {
                self.logged_at = Some(now);
                Some(std::mem::take(&mut self.unlogged))
            }
        }
    }

    /// Counts and perhaps logs a failed accept of `l`, then pauses before
    /// the next.
    pub(crate) async fn failed(&mut self, l: &Listener, e: &std::io::Error) {
        l.metrics
            .accept_failures
            .get_or_create(&vec![("listener", l.name.to_owned())])
            .inc();
        if let Some(failures) = self.count(Instant::now()) {
            tracing::warn!(event = "connection.accept", outcome = "failure", listener = l.name, error = %e, failures, "accepts failed (counted in accept_failures_total; logged at most once a minute)");
        }
        tokio::time::sleep(ACCEPT_RETRY).await;
    }
}

/// Connections open now: in total (watched, so that a stop can wait for
/// zero) and per client (an IPv4 address or an IPv6 network:
/// [`client_network`]).
#[derive(Debug)]
pub(crate) struct Open {
    total: watch::Sender<usize>,
    per_client: Mutex<HashMap<IpNet, usize>>,
}

/// One admitted connection; dropping it gives its place back.
pub(crate) struct Admitted {
    open: Arc<Open>,
    /// The client counted, unless exempt.
    client: Option<IpNet>,
    listener: &'static str,
    metrics: Arc<Metrics>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(ip) = self.client {
            let mut per = self
                .open
                .per_client
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(n) = per.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    per.remove(&ip);
                }
            }
        }
        self.open.total.send_modify(|n| *n = n.saturating_sub(1));
        self.metrics
            .connections_open
            .get_or_create(&vec![("listener", self.listener.to_owned())])
            .dec();
    }
}

impl Open {
    pub(crate) fn new() -> Arc<Open> {
        Arc::new(Open {
            total: watch::Sender::new(0),
            per_client: Mutex::new(HashMap::new()),
        })
    }

    /// Counts a new connection from `peer`, or says which bound refuses it
    /// (counted in `connections_refused`).
    pub(crate) fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        l: &Listener,
    ) -> Result<Admitted, &'static str> {
        let admitted = self.count(peer, l);
        if let Err(bound) = admitted {
            l.metrics
                .connections_refused
                .get_or_create(&vec![
                    ("listener", l.name.to_owned()),
                    ("bound", bound.to_owned()),
                ])
                .inc();
        }
        admitted
    }

    fn count(self: &Arc<Self>, peer: IpAddr, l: &Listener) -> Result<Admitted, &'static str> {
        // An IPv4 client on a dual-stack socket arrives as ::ffff:a.b.c.d.
        let peer = peer.to_canonical();
        let exempt = l.exempt.iter().any(|n| n.contains(&peer));
        let client = if exempt {
            None
        } else {
            let client = client_network(peer, l.limits.ipv6_client_prefix);
            let mut per = self.per_client.lock().unwrap_or_else(|p| p.into_inner());
            let n = per.entry(client).or_insert(0);
            if *n >= l.limits.max_open_per_client {
                return Err("max_open_per_client");
            }
            *n += 1;
            Some(client)
        };
        let mut admitted = false;
        self.total.send_if_modified(|n| {
            admitted = *n < l.limits.max_open;
            if admitted {
                *n += 1;
            }
            admitted
        });
        if !admitted {
            // Give back the per-client place taken above.
            if let Some(ip) = client {
                let mut per = self.per_client.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(n) = per.get_mut(&ip) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        per.remove(&ip);
                    }
                }
            }
            return Err("max_open");
        }
        l.metrics
            .connections_open
            .get_or_create(&vec![("listener", l.name.to_owned())])
            .inc();
        Ok(Admitted {
            open: Arc::clone(self),
            client,
            listener: l.name,
            metrics: Arc::clone(&l.metrics),
        })
    }
}

/// Serves `router` on `listener` until `stop`, then lets open connections
/// finish their requests (the caller bounds how long it waits). Each request
/// carries the peer's address as `ConnectInfo`.
pub async fn serve(
    listener: TcpListener,
    settings: Listener,
    routes: Routes,
    mut stop: watch::Receiver<bool>,
) {
    let settings = Arc::new(settings);
    let open = Open::new();
    let builder = builder(&settings.limits);
    let mut failures = AcceptFailures::default();
    loop {
        let (tcp, peer) = tokio::select! {
            () = stopped(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    failures.failed(&settings, &e).await;
                    continue;
                }
            },
        };
        let admitted = match open.admit(peer.ip(), &settings) {
            Ok(admitted) => admitted,
            Err(bound) => {
                // Closed at once (dropped): a client over its share gets
                // no slot to hold. Counted, not logged line by line, as a
                // flood would flood the log too.
                tracing::debug!(event = "http.connection", outcome = "refused", listener = settings.name, %peer, bound, "connection refused");
                continue;
            }
        };
        // Nagle's algorithm costs ~40 ms per small response on loopback.
        let _ = tcp.set_nodelay(true);
        let settings = Arc::clone(&settings);
        let routes = routes.clone();
        let builder = builder.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _admitted = admitted;
            match settings.tls.clone() {
                None => connection(tcp, peer, &settings, &builder, routes, stop).await,
                Some(tls) => {
                    let mut stopping = stop.clone();
                    // A peer that never finishes its handshake holds its
                    // place no longer than this, nor past a stop.
                    let accepted = tokio::select! {
                        () = stopped(&mut stopping) => return,
                        done = tokio::time::timeout(tls.handshake_timeout, tls.acceptor.accept(tcp)) => done,
                    };
                    match accepted {
                        Ok(Ok(stream)) => {
                            connection(stream, peer, &settings, &builder, routes, stop).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(event = "tls.handshake", outcome = "failure", %peer, error = %e, "TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(event = "tls.handshake", outcome = "timeout", %peer, "TLS handshake timed out");
                        }
                    }
                }
            }
        });
    }
    // Stopped: no new connection (closing the socket refuses them rather
    // than leave them in the backlog); wait for the open ones to close.
    drop(listener);
    let mut total = open.total.subscribe();
    let _ = total.wait_for(|n| *n == 0).await;
}

/// What a listener serves: fixed routes, or those of the current
/// configuration generation, taken anew for each request.
#[derive(Clone, Debug)]
pub enum Routes {
    Fixed(Router),
    Current(crate::generation::Generations),
}

impl Routes {
    fn get(&self) -> Router {
        match self {
            Routes::Fixed(router) => router.clone(),
            Routes::Current(generations) => generations.router(),
        }
    }
}

/// hyper-util's server with the configured limits and tokio's timer (a
/// builder without a timer silently ignores every timeout).
fn builder(limits: &ConnectionsConfig) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.h2_keep_alive_interval)
        .keep_alive_timeout(limits.h2_keep_alive_timeout)
        .max_concurrent_streams(limits.h2_max_concurrent_streams);
    builder
}

/// Serves one connection until it ends, is idle for `idle_timeout`, or the
/// server stops; the last two close it gracefully, within [`CLOSE_GRACE`].
async fn connection<IO>(
    io: IO,
    peer: SocketAddr,
    settings: &Listener,
    builder: &Builder<TokioExecutor>,
    routes: Routes,
    mut stop: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Requests in progress on this connection, and when the last ended.
    let activity = Arc::new(Activity {
        busy: AtomicUsize::new(0),
        last_ms: AtomicU64::new(0),
        opened: Instant::now(),
    });
    let service = hyper::service::service_fn({
        let activity = Arc::clone(&activity);
        move |mut req: http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
            // Per request, not per connection: a kept-alive connection's
            // next request sees a reload at once.
            let mut router = routes.get();
            let busy = Busy::start(&activity);
            async move {
                let response =
                    tower::Service::call(&mut router, req.map(axum::body::Body::new)).await;
                drop(busy);
                response
            }
        }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let why = tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(event = "http.connection", outcome = "failure", listener = settings.name, %peer, error = %e, "connection ended with an error");
            }
            return;
        }
        () = idle_for(&activity, settings.limits.idle_timeout) => "idle",
        () = stopped(&mut stop) => "stop",
    };
    conn.as_mut().graceful_shutdown();
    if tokio::time::timeout(CLOSE_GRACE, conn).await.is_err() {
        tracing::debug!(event = "http.connection", outcome = "timeout", listener = settings.name, %peer, why, "connection dropped: it did not close in time");
    }
}

/// A connection's requests in progress and the end of its last one: two
/// atomic updates per request, read by [`idle_for`] about once per
/// `idle_timeout`. (A watch channel woken at each request, with a timer
/// armed anew each time the connection went idle, cost 8–11 % of the
/// issuances per second at 64 clients in `scripts/bench`.)
struct Activity {
    busy: AtomicUsize,
    /// When the last request ended, in milliseconds since `opened`.
    last_ms: AtomicU64,
    opened: Instant,
}

impl Activity {
    fn since_opened(&self) -> Duration {
        self.opened.elapsed()
    }
}

/// A request in progress, counted until dropped.
struct Busy(Arc<Activity>);

impl Busy {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.busy.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(activity))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = u64::try_from(self.0.since_opened().as_millis()).unwrap_or(u64::MAX);
        self.0.last_ms.store(now, Ordering::Release);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Resolves once no request has been in progress for `timeout`: sleeps
/// until the earliest moment that could be true, and looks.
async fn idle_for(activity: &Activity, timeout: Duration) {
    let mut wait = timeout;
    loop {
        tokio::time::sleep(wait).await;
        if activity.busy.load(Ordering::Acquire) > 0 {
            wait = timeout;
            continue;
        }
        let last = Duration::from_millis(activity.last_ms.load(Ordering::Acquire));
        let idle = activity.since_opened().saturating_sub(last);
        // Looked at again: a request may have begun since the first look.
        if idle >= timeout && activity.busy.load(Ordering::Acquire) == 0 {
            return;
        }
        if idle >= timeout {
            wait = timeout;
            continue;
        }
        wait = timeout - idle;
    }
}

/// Resolves once `stop` is set (the watch guard is not held across awaits).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::net::IpAddr;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{AcceptFailures, Listener, Open};
    use crate::config::ConnectionsConfig;
    use crate::metrics::Metrics;

    /// A listener allowing `per_client` connections to one client, an IPv6
    /// client being a network of `ipv6_prefix` bits.
    fn listener(per_client: usize, ipv6_prefix: u8) -> Listener {
        Listener {
            name: "acme",
            tls: None,
            limits: ConnectionsConfig {
                max_open_per_client: per_client,
                ipv6_client_prefix: ipv6_prefix,
                ..ConnectionsConfig::default()
            },
            exempt: Vec::new(),
            metrics: Arc::new(Metrics::new(Default::default())),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_ipv6_client_is_held_to_its_share_across_its_64_and_an_ipv4_one_across_both_spellings() {
        let l = listener(2, 64);
        let open = Open::new();
        // Three addresses of one /64: a new address per connection does
        // not buy a new share.
        let first = open.admit(ip("2001:db8:1:2::1"), &l).unwrap();
        let _second = open.admit(ip("2001:db8:1:2:aaaa::7"), &l).unwrap();
        assert_eq!(
            open.admit(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), &l).err(),
            Some("max_open_per_client")
        );
        let _next_64 = open.admit(ip("2001:db8:1:3::1"), &l).unwrap();
        drop(first);
        let _again = open.admit(ip("2001:db8:1:2::9"), &l).unwrap();
        // An IPv4 client on a dual-stack socket is the same client.
        let _v4 = open.admit(ip("192.0.2.1"), &l).unwrap();
        let _mapped = open.admit(ip("::ffff:192.0.2.1"), &l).unwrap();
        assert_eq!(
            open.admit(ip("192.0.2.1"), &l).err(),
            Some("max_open_per_client")
        );
        let _neighbour = open.admit(ip("192.0.2.2"), &l).unwrap();
    }

    #[test]
    fn with_an_ipv6_client_prefix_of_128_each_address_has_a_share_of_its_own() {
        let l = listener(1, 128);
        let open = Open::new();
        let _a = open.admit(ip("2001:db8:1:2::1"), &l).unwrap();
        let _b = open.admit(ip("2001:db8:1:2::2"), &l).unwrap();
        assert_eq!(
            open.admit(ip("2001:db8:1:2::1"), &l).err(),
            Some("max_open_per_client")
        );
    }

    #[test]
    fn failing_accepts_are_logged_at_once_then_at_most_once_a_minute_with_their_count() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut failures = AcceptFailures::default();
        assert_eq!(failures.count(at(0)), Some(1), "the first at once");
        // Ten a second for a minute: not a line each.
        for ms in (100..60_000).step_by(100) {
            assert_eq!(failures.count(at(ms)), None, "at {ms} ms");
        }
        assert_eq!(
            failures.count(at(60_000)),
            Some(600),
            "a minute on, one line counting the 599 silent ones and itself"
        );
        assert_eq!(failures.count(at(60_100)), None);
        assert_eq!(
            failures.count(at(300_000)),
            Some(2),
            "after a quiet spell, at once"
        );
    }
}
