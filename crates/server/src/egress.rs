//! The server's own outbound HTTP(S): the one place its clients to the
//! outside (the relay's upstream CA, webhooks) are built, and where each
//! connection is routed — straight to its destination, or through the
//! operator's HTTP proxy (`[egress]`): a `CONNECT` tunnel for https://
//! destinations (hyper-util's connector), absolute-form forwarding for
//! http:// ones.
//!
//! Never here: challenge validation (RFC 8555 §8.3 — the server must
//! reach the host itself), DNS, RFC 2136 updates and e-mail.

use std::error::Error as StdError;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tower::Service;

use crate::config::{EgressConfig, LoopbackRoute};
use crate::metrics::Metrics;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Why a proxy URL cannot be used, saying what to write; `None` for one
/// this build speaks to (`http://HOST:PORT`, nothing else).
pub fn check_proxy_url(url: &str) -> Result<(), String> {
    const EXAMPLE: &str = "write e.g. \"http://proxy.example.internal:3128\"";
    let uri: Uri = url
        .parse()
        .map_err(|_| format!("{url:?} is not a URL; {EXAMPLE}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "{url:?}: TLS to the proxy is not supported; an https:// destination is still encrypted end to end through an http:// proxy's CONNECT, so {EXAMPLE}"
            ));
        }
        Some(s) if s.starts_with("socks") => {
            return Err(format!(
                "{url:?}: SOCKS proxies are not supported, only HTTP proxies; {EXAMPLE}"
            ));
        }
        _ => return Err(format!("{url:?} must start with http://; {EXAMPLE}")),
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("{url:?} names no host; {EXAMPLE}"));
    };
    if authority.as_str().contains('@') {
        return Err(
            "credentials do not go in the URL (it is logged and shown): put USER:PASSWORD in a file named by proxy_credentials_file".into(),
        );
    }
    if authority.port_u16().is_none() {
        return Err(format!("{url:?} names no port; {EXAMPLE}"));
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!("{url:?}: a proxy URL has no path; {EXAMPLE}"));
    }
    Ok(())
}

/// How one destination is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Direct(Direct),
    /// Through this proxy (`http://HOST:PORT/`, never with credentials).
    Proxy(Uri),
}

/// Why a destination is reached directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direct {
    /// No proxy is configured for its scheme.
    NoProxy,
    /// `no_proxy` names it.
    Excepted,
    /// It is this host's loopback.
    Loopback,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::Proxy(uri) => write!(
                f,
                "via proxy http://{}",
                uri.authority().map(|a| a.as_str()).unwrap_or("?")
            ),
            Route::Direct(Direct::NoProxy) => f.write_str("direct"),
            Route::Direct(Direct::Excepted) => f.write_str("direct (no_proxy)"),
            Route::Direct(Direct::Loopback) => f.write_str("direct (loopback)"),
        }
    }
}

/// The effective outbound policy of one client: which proxy, which
/// credentials, which exceptions.
pub struct Egress {
    /// With the exceptions applied.
    matcher: Matcher,
    /// Without them, to tell "excepted" from "no proxy" in descriptions.
    unexcepted: Matcher,
    /// Basic credentials from `proxy_credentials_file` (sensitive: hyper
    /// never prints it); env proxies carry theirs in the matcher.
    auth: Option<HeaderValue>,
    loopback: LoopbackRoute,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("matcher", &self.matcher)
            .field("credentials", &self.auth.is_some())
            .field("loopback", &self.loopback)
            .finish()
    }
}

/// The first set one of `names` in the environment.
fn first_env(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
}

impl Egress {
    /// Straight to every destination.
    #[cfg(test)]
    fn direct() -> Egress {
        Egress {
            matcher: Matcher::builder().build(),
            unexcepted: Matcher::builder().build(),
            auth: None,
            loopback: LoopbackRoute::Direct,
        }
    }

    /// Builds the policy of `config` (already checked by the configuration):
    /// reads the credentials file, and with `from_env` the environment —
    /// refusing there what `check_proxy_url` refuses in a file.
    pub fn from_config(config: &EgressConfig) -> Result<Egress, String> {
        let (http, https, all, no) = if config.from_env {
            let http = first_env(&["http_proxy", "HTTP_PROXY"]);
            let https = first_env(&["https_proxy", "HTTPS_PROXY"]);
            let all = first_env(&["all_proxy", "ALL_PROXY"]);
            for (name, value) in [
                ("http_proxy", &http),
                ("https_proxy", &https),
                ("all_proxy", &all),
            ] {
                if let Some(value) = value {
                    // Credentials in a variable are the environment's own
                    // convention, and so is a bare HOST:PORT (http, as
                    // curl reads it); the rest is held to the file's rules
                    // (no password is ever printed).
                    let shown = without_userinfo(value);
                    let shown = if shown.contains("://") {
                        shown
                    } else {
                        format!("http://{shown}")
                    };
                    check_proxy_url(&shown).map_err(|why| {
                        format!(
                            "egress.from_env: the variable {name} (or its upper-case form): {why}"
                        )
                    })?;
                }
            }
            (
                http,
                https,
                all,
                first_env(&["no_proxy", "NO_PROXY"]).unwrap_or_default(),
            )
        } else {
            (
                config.proxy.clone(),
                config.proxy.clone(),
                None,
                config.no_proxy.join(","),
            )
        };
        let build = |no: &str| {
            let mut b = Matcher::builder();
            if let Some(all) = &all {
                b = b.all(all.clone());
            }
            if let Some(http) = &http {
                b = b.http(http.clone());
            }
            if let Some(https) = &https {
                b = b.https(https.clone());
            }
            b.no(no.to_owned()).build()
        };
        let auth = match &config.proxy_credentials_file {
            Some(path) => Some(read_credentials(path)?),
            None => None,
        };
        Ok(Egress {
            matcher: build(&no),
            unexcepted: build(""),
            auth,
            loopback: config.loopback,
        })
    }

    /// How a connection to `dst` goes.
    pub fn route(&self, dst: &Uri) -> Route {
        if self.loopback == LoopbackRoute::Direct && dst.host().is_some_and(is_loopback) {
            return Route::Direct(Direct::Loopback);
        }
        match self.matcher.intercept(dst) {
            Some(proxy) => Route::Proxy(proxy.uri().clone()),
            None if self.unexcepted.intercept(dst).is_some() => Route::Direct(Direct::Excepted),
            None => Route::Direct(Direct::NoProxy),
        }
    }

    /// How `url` is reached, for the start-up summary and `config check`.
    pub fn describe(&self, url: &str) -> String {
        match url.parse::<Uri>() {
            Ok(uri) => self.route(&uri).to_string(),
            Err(_) => "unreachable (not a URL)".into(),
        }
    }

    /// The `Proxy-Authorization` for the proxy that `dst` goes through.
    fn authorization(&self, dst: &Uri) -> Option<HeaderValue> {
        if let Some(auth) = &self.auth {
            return Some(auth.clone());
        }
        self.matcher
            .intercept(dst)
            .and_then(|p| p.basic_auth().cloned())
    }
}

/// `url` without a `user:password@` part, for messages.
fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit('@').next().unwrap_or(authority);
            format!("{scheme}://{host}{path}")
        }
        None => url.rsplit('@').next().unwrap_or(url).to_owned(),
    }
}

/// Whether `host` (a URI's host: a name, an IPv4 address or a bracketed
/// IPv6 one) is this host's loopback.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(v4)) => v4.is_loopback(),
        Ok(std::net::IpAddr::V6(v6)) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        // RFC 6761 §6.3: `localhost` and its subdomains are loopback.
        Err(_) => {
            let name = bare.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
    }
}

/// Reads `USER:PASSWORD` (the first line) into a Basic header value
/// (RFC 9110 §11.7.1, §11.6.2), marked sensitive.
fn read_credentials(path: &PathBuf) -> Result<HeaderValue, String> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the proxy credentials {}: {e}", path.display()))?;
    let line = text
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches('\r');
    if !line.contains(':') || line.starts_with(':') {
        return Err(format!(
            "the proxy credentials file {} must hold USER:PASSWORD on its first line",
            path.display()
        ));
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(line);
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}"))
        .map_err(|_| format!("the proxy credentials in {} cannot be sent", path.display()))?;
    value.set_sensitive(true);
    Ok(value)
}

/// A proxy's failure, as the relay and the webhooks report it: whose
/// fault, and what came back. Never carries the credentials.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProxyError {
    /// 407 to our `CONNECT`: credentials missing or wrong.
    #[error(
        "the proxy {proxy} answered 407 Proxy Authentication Required for {target} ({})",
        if *sent_credentials { "the credentials of proxy_credentials_file were refused" } else { "write its USER:PASSWORD in a file named by proxy_credentials_file" }
    )]
    AuthRequired {
        proxy: String,
        target: String,
        sent_credentials: bool,
    },
    /// Any answer to `CONNECT` but 200 or 407 (squid's 403 when its rules
    /// deny the destination), with the proxy's status line.
    #[error(
        "the proxy {proxy} refused to open a tunnel to {target}: it answered {answer} (its access rules may deny this destination)"
    )]
    Refused {
        proxy: String,
        target: String,
        answer: String,
    },
    /// The proxy could not be reached or dropped the connection.
    #[error("the proxy {proxy} could not be reached for {target}: {reason}")]
    Unreachable {
        proxy: String,
        target: String,
        reason: String,
    },
}

impl ProxyError {
    /// The operator's misconfiguration (the proxy answered and said no),
    /// rather than a connection failure that time may fix.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, ProxyError::Unreachable { .. })
    }

    /// The metric label of the proxy's answer: its status code, or
    /// `refused` (not HTTP) or `unreachable`.
    fn answer(&self) -> String {
        match self {
            ProxyError::AuthRequired { .. } => "407".into(),
            ProxyError::Refused { answer, .. } => match answer.get(..3) {
                Some(code) if code.bytes().all(|b| b.is_ascii_digit()) => code.into(),
                _ => "refused".into(),
            },
            ProxyError::Unreachable { .. } => "unreachable".into(),
        }
    }

    /// The first `ProxyError` in `e`'s chain of sources.
    pub fn find<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a ProxyError> {
        let mut next: Option<&(dyn StdError + 'static)> = Some(e);
        while let Some(e) = next {
            if let Some(p) = e.downcast_ref::<ProxyError>() {
                return Some(p);
            }
            next = e.source();
        }
        None
    }
}

/// The chain of `e`'s messages, for a reason worth reading.
pub fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(e) = next {
        text.push_str(": ");
        text.push_str(&e.to_string());
        next = e.source();
    }
    text
}

/// Who uses a client, for its log lines and metrics.
#[derive(Clone)]
struct Observer {
    metrics: Arc<Metrics>,
    profile: String,
    client: &'static str,
}

/// A connection the legacy client uses: TCP to the destination or to the
/// proxy (a tunnel is TCP to the proxy too, then the destination's bytes).
pub struct Stream {
    io: TokioIo<TcpStream>,
    /// Plain http:// sent to the proxy: the client then writes requests in
    /// absolute form (RFC 9112 §3.2.2).
    forwarding: bool,
    /// While a tunnel is being opened: the first bytes the proxy sends,
    /// so that a refusal is reported with the proxy's status line (the
    /// tunnel connector tells only "unsuccessful").
    answer: Option<Arc<std::sync::Mutex<Vec<u8>>>>,
}

/// How much of a proxy's answer to `CONNECT` is kept: the status line.
const ANSWER_KEPT: usize = 512;

impl Stream {
    fn new(io: TokioIo<TcpStream>) -> Stream {
        Stream {
            io,
            forwarding: false,
            answer: None,
        }
    }
}

impl hyper::rt::Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let Some(answer) = &this.answer else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        let mut bytes = [0u8; ANSWER_KEPT];
        let want = buf.remaining().min(bytes.len());
        let mut read = hyper::rt::ReadBuf::new(&mut bytes[..want]);
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, read.unfilled()))?;
        let filled = read.filled();
        if let Ok(mut kept) = answer.lock() {
            let room = ANSWER_KEPT.saturating_sub(kept.len());
            kept.extend_from_slice(&filled[..filled.len().min(room)]);
        }
        buf.put_slice(filled);
        Poll::Ready(Ok(()))
    }
}

/// The status of an HTTP answer's first line (`403 Forbidden`), printable
/// characters only and bounded: it is the proxy's text, and it is logged.
fn status_of(answer: &[u8]) -> Option<String> {
    let line = answer.split(|&b| b == b'\r' || b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let (version, status) = line.split_once(' ')?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let status: String = status
        .chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(80)
        .collect();
    let code = status.get(..3)?;
    code.bytes().all(|b| b.is_ascii_digit()).then_some(status)
}

/// TCP to the proxy whose answer to `CONNECT` is kept in `answer`: the
/// connector the tunnel runs over.
#[derive(Clone)]
struct ToProxy {
    tcp: HttpConnector,
    answer: Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Service<Uri> for ToProxy {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, proxy: Uri) -> Self::Future {
        let mut tcp = self.tcp.clone();
        let answer = Arc::clone(&self.answer);
        Box::pin(async move {
            let mut stream = Stream::new(tcp.call(proxy).await?);
            stream.answer = Some(answer);
            Ok(stream)
        })
    }
}

impl hyper::rt::Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        let connected = self.io.connected();
        if self.forwarding {
            connected.proxy(true)
        } else {
            connected
        }
    }
}

/// Connects as the [`Egress`] policy routes each destination.
#[derive(Clone)]
pub struct Connector {
    tcp: HttpConnector,
    egress: Arc<Egress>,
    observer: Option<Observer>,
}

/// Logs and meters a proxy's failure: a refusal is the operator's to fix,
/// so it is an error, not a warning.
fn report(observer: Option<&Observer>, e: &ProxyError) {
    let (profile, client) = observer
        .map(|o| (o.profile.as_str(), o.client))
        .unwrap_or(("", "cli"));
    if e.is_refusal() {
        tracing::error!(event = "egress.proxy_refused", profile, client, error = %e, "the proxy refused a connection");
    } else {
        tracing::warn!(event = "egress.proxy_unreachable", profile, client, error = %e, "the proxy could not be reached");
    }
    if let Some(o) = observer {
        o.metrics
            .egress_proxy_failures
            .get_or_create(&vec![
                ("profile", o.profile.clone()),
                ("client", o.client.to_owned()),
                ("answer", e.answer()),
            ])
            .inc();
    }
}

impl Service<Uri> for Connector {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let mut tcp = this.tcp.clone();
            let proxy = match this.egress.route(&dst) {
                Route::Direct(_) => return Ok(Stream::new(tcp.call(dst).await?)),
                Route::Proxy(proxy) => proxy,
            };
            let shown = proxy.authority().map(|a| a.to_string()).unwrap_or_default();
            let target = format!(
                "{}:{}",
                dst.host().unwrap_or_default(),
                dst.port_u16()
                    .unwrap_or(if dst.scheme() == Some(&http::uri::Scheme::HTTPS) {
                        443
                    } else {
                        80
                    })
            );
            let auth = this.egress.authorization(&dst);
            let result = if dst.scheme() == Some(&http::uri::Scheme::HTTPS) {
                let answer = Arc::new(std::sync::Mutex::new(Vec::new()));
                let to_proxy = ToProxy {
                    tcp,
                    answer: Arc::clone(&answer),
                };
                let mut tunnel = Tunnel::new(proxy, to_proxy);
                if let Some(auth) = auth.clone() {
                    tunnel = tunnel.with_auth(auth);
                }
                tunnel
                    .call(dst)
                    .await
                    .map(|mut stream| {
                        // Open: from here on the bytes are the destination's.
                        stream.answer = None;
                        stream
                    })
                    .map_err(|e| {
                        // hyper-util 0.1 does not export its tunnel error
                        // type, so its variants are told apart by their
                        // messages ("proxy authorization required" for a
                        // 407, "unsuccessful" for any other answer but 200).
                        let text = e.to_string();
                        if text.ends_with("proxy authorization required") {
                            ProxyError::AuthRequired {
                                proxy: shown.clone(),
                                target: target.clone(),
                                sent_credentials: auth.is_some(),
                            }
                        } else if text.ends_with("unsuccessful") {
                            let kept = answer.lock().map(|a| a.clone()).unwrap_or_default();
                            ProxyError::Refused {
                                proxy: shown.clone(),
                                target: target.clone(),
                                answer: status_of(&kept)
                                    .unwrap_or_else(|| "something other than HTTP".into()),
                            }
                        } else {
                            ProxyError::Unreachable {
                                proxy: shown.clone(),
                                target: target.clone(),
                                reason: chain(&e),
                            }
                        }
                    })
            } else {
                tcp.call(proxy)
                    .await
                    .map(|io| Stream {
                        forwarding: true,
                        ..Stream::new(io)
                    })
                    .map_err(|e| ProxyError::Unreachable {
                        proxy: shown.clone(),
                        target: target.clone(),
                        reason: chain(&e),
                    })
            };
            result.map_err(|e| {
                report(this.observer.as_ref(), &e);
                BoxError::from(e)
            })
        })
    }
}

/// The TLS and proxy settings of one outbound client.
pub struct Builder {
    egress: Arc<Egress>,
    tls: rustls::ClientConfig,
    connect_timeout: Option<Duration>,
    https_only: bool,
    observer: Option<Observer>,
}

/// The system's trust anchors plus the PEM certificates in `anchors`.
pub fn roots(anchors: &[PathBuf]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A system store may hold certificates rustls cannot use; skip them.
        let _ = roots.add(cert);
    }
    for path in anchors {
        let text = std::fs::read(path)
            .map_err(|e| format!("reading trust anchor {}: {e}", path.display()))?;
        let blocks = pem::parse_many(&text)
            .map_err(|e| format!("trust anchor {} is not PEM: {e}", path.display()))?;
        let mut added = 0;
        for block in blocks.iter().filter(|b| b.tag() == "CERTIFICATE") {
            roots
                .add(block.contents().to_vec().into())
                .map_err(|e| format!("trust anchor {}: {e}", path.display()))?;
            added += 1;
        }
        if added == 0 {
            return Err(format!(
                "trust anchor {} holds no CERTIFICATE block",
                path.display()
            ));
        }
    }
    Ok(roots)
}

impl Builder {
    /// A client trusting `roots`, routed by `egress`.
    pub fn new(egress: Arc<Egress>, roots: rustls::RootCertStore) -> Result<Builder, String> {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Builder {
            egress,
            tls,
            connect_timeout: None,
            https_only: false,
            observer: None,
        })
    }

    /// Bounds each TCP connection (to the destination or to the proxy).
    pub fn connect_timeout(mut self, timeout: Duration) -> Builder {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Refuses http:// destinations.
    pub fn https_only(mut self) -> Builder {
        self.https_only = true;
        self
    }

    /// Logs and meters proxy failures under `profile` and `client`
    /// (`relay`, `webhook`).
    pub fn observed(
        mut self,
        metrics: Arc<Metrics>,
        profile: &str,
        client: &'static str,
    ) -> Builder {
        self.observer = Some(Observer {
            metrics,
            profile: profile.to_owned(),
            client,
        });
        self
    }

    /// The HTTP/1.1 client.
    pub fn build<B>(self) -> Outbound<B>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
    {
        let mut tcp = HttpConnector::new();
        // https:// destinations go through this connector before TLS.
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(self.connect_timeout);
        let connector = Connector {
            tcp,
            egress: Arc::clone(&self.egress),
            observer: self.observer.clone(),
        };
        let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(self.tls);
        let https = if self.https_only {
            https.https_only()
        } else {
            https.https_or_http()
        };
        let connector = https.enable_http1().wrap_connector(connector);
        Outbound {
            inner: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
            egress: self.egress,
            observer: self.observer,
        }
    }
}

/// An outbound HTTP(S) client that follows its [`Egress`] policy.
pub struct Outbound<B> {
    inner: Client<hyper_rustls::HttpsConnector<Connector>, B>,
    egress: Arc<Egress>,
    observer: Option<Observer>,
}

impl<B> Clone for Outbound<B> {
    fn clone(&self) -> Self {
        Outbound {
            inner: self.inner.clone(),
            egress: Arc::clone(&self.egress),
            observer: self.observer.clone(),
        }
    }
}

impl<B> Outbound<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// Sends `request`; a plain http:// request forwarded by the proxy
    /// carries the proxy's credentials (a tunnel sent them in `CONNECT`).
    /// A proxy's failure is the error itself, not buried in hyper's.
    pub async fn request(
        &self,
        mut request: http::Request<B>,
    ) -> Result<http::Response<hyper::body::Incoming>, BoxError> {
        if request.uri().scheme() == Some(&http::uri::Scheme::HTTP)
            && matches!(self.egress.route(request.uri()), Route::Proxy(_))
            && let Some(auth) = self.egress.authorization(request.uri())
        {
            request
                .headers_mut()
                .insert(http::header::PROXY_AUTHORIZATION, auth);
        }
        self.inner
            .request(request)
            .await
            .map_err(|e| match ProxyError::find(&e) {
                Some(p) => BoxError::from(p.clone()),
                None => BoxError::from(e),
            })
    }

    /// The proxy's refusal, logged and metered, when `status` came from
    /// the proxy rather than the destination: 407 to a forwarded http://
    /// request (a tunnel's 407 is an error of the connection instead).
    pub fn refused_by_proxy(&self, uri: &Uri, status: u16) -> Option<ProxyError> {
        let Route::Proxy(proxy) = self.egress.route(uri) else {
            return None;
        };
        if status != 407 {
            return None;
        }
        let e = ProxyError::AuthRequired {
            proxy: proxy.authority().map(|a| a.to_string()).unwrap_or_default(),
            target: uri.authority().map(|a| a.to_string()).unwrap_or_default(),
            sent_credentials: self.egress.authorization(uri).is_some(),
        };
        report(self.observer.as_ref(), &e);
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn egress(toml: &str) -> Egress {
        let config = crate::config::Config::from_toml(&format!("[egress]\n{toml}")).unwrap();
        Egress::from_config(&config.egress).unwrap()
    }

    fn route(e: &Egress, url: &str) -> String {
        e.route(&url.parse().unwrap()).to_string()
    }

    #[test]
    fn proxy_urls_other_than_plain_http_with_a_port_are_refused_saying_what_to_write() {
        check_proxy_url("http://proxy.corp:3128").unwrap();
        for (bad, says) in [
            (
                "https://proxy.corp:3128",
                "TLS to the proxy is not supported",
            ),
            (
                "socks5://proxy.corp:1080",
                "SOCKS proxies are not supported",
            ),
            ("socks5h://proxy.corp:1080", "SOCKS"),
            ("proxy.corp:3128", "must start with http://"),
            ("http://proxy.corp", "names no port"),
            ("http://u:secret@proxy.corp:3128", "proxy_credentials_file"),
            ("http://proxy.corp:3128/path", "no path"),
        ] {
            let why = check_proxy_url(bad).unwrap_err();
            assert!(why.contains(says), "{bad}: {why}");
            assert!(!why.contains("secret"), "{bad}: {why}");
        }
    }

    #[test]
    fn destinations_are_routed_through_the_proxy_except_loopback_and_no_proxy() {
        let e = egress(
            "proxy = \"http://proxy.corp:3128\"\nno_proxy = [\".internal.example\", \"10.0.0.0/8\", \"ca.example.org\"]",
        );
        assert_eq!(
            route(&e, "https://acme-v02.api.letsencrypt.org/directory"),
            "via proxy http://proxy.corp:3128"
        );
        assert_eq!(
            route(&e, "http://hooks.example.com/x"),
            "via proxy http://proxy.corp:3128"
        );
        for excepted in [
            "https://chat.internal.example/hook",
            "https://internal.example/",
            "http://10.1.2.3:8080/",
            "https://ca.example.org/dir",
            "https://sub.ca.example.org/dir",
        ] {
            assert_eq!(route(&e, excepted), "direct (no_proxy)", "{excepted}");
        }
        for loopback in [
            "http://127.0.0.1:9000/",
            "https://127.3.4.5/",
            "http://[::1]:80/",
            "http://[::ffff:127.0.0.1]/",
            "https://localhost:8443/",
            "https://a.localhost/",
        ] {
            assert_eq!(route(&e, loopback), "direct (loopback)", "{loopback}");
        }
        assert_eq!(
            route(&e, "https://notca.example.org/"),
            "via proxy http://proxy.corp:3128"
        );
    }

    #[test]
    fn loopback_goes_through_the_proxy_only_when_told_to() {
        let e = egress("proxy = \"http://127.0.0.1:3128\"\nloopback = \"proxy\"");
        assert_eq!(
            route(&e, "https://127.0.0.1:14000/dir"),
            "via proxy http://127.0.0.1:3128"
        );
        let e = egress(
            "proxy = \"http://127.0.0.1:3128\"\nloopback = \"proxy\"\nno_proxy = [\"127.0.0.1\"]",
        );
        assert_eq!(
            route(&e, "https://127.0.0.1:14000/dir"),
            "direct (no_proxy)"
        );
        assert_eq!(route(&Egress::direct(), "https://ca.example/"), "direct");
        let e = egress("no_proxy = [\"*\"]\nproxy = \"http://p:1\"");
        assert_eq!(route(&e, "https://ca.example/"), "direct (no_proxy)");
    }

    #[test]
    fn credentials_are_read_from_the_first_line_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("creds");
        std::fs::write(&path, "alice:s3cr:et\nignored\n").unwrap();
        let config = EgressConfig {
            proxy: Some("http://proxy.corp:3128".into()),
            proxy_credentials_file: Some(path.clone()),
            ..EgressConfig::default()
        };
        let e = Egress::from_config(&config).unwrap();
        let auth = e
            .authorization(&"https://x.example/".parse().unwrap())
            .unwrap();
        assert!(auth.is_sensitive());
        use base64::Engine as _;
        let want = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("alice:s3cr:et")
        );
        assert_eq!(auth.to_str().unwrap(), want);
        assert!(!format!("{e:?}").contains("s3cr"));
        std::fs::write(&path, "no-colon\n").unwrap();
        let why = Egress::from_config(&config).unwrap_err();
        assert!(why.contains("USER:PASSWORD"), "{why}");
    }

    #[test]
    fn a_proxy_error_is_found_under_the_errors_that_wrap_it() {
        let p = ProxyError::AuthRequired {
            proxy: "p:1".into(),
            target: "ca:443".into(),
            sent_credentials: true,
        };
        /// An error over another, as hyper's client error is over its
        /// connector's.
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Wrapper(#[source] BoxError);
        let wrapped = Wrapper(Box::new(Wrapper(Box::new(p))));
        assert!(matches!(
            ProxyError::find(&wrapped),
            Some(ProxyError::AuthRequired { .. })
        ));
        assert!(ProxyError::find(&std::io::Error::other("plain")).is_none());
        let refused = ProxyError::Refused {
            proxy: "p:1".into(),
            target: "ca:443".into(),
            answer: "403 Forbidden".into(),
        };
        assert!(refused.is_refusal());
        assert_eq!(refused.answer(), "403");
    }

    #[test]
    fn a_proxys_status_line_is_kept_printable_and_short() {
        assert_eq!(
            status_of(b"HTTP/1.1 403 Forbidden\r\nServer: squid\r\n\r\n<html>").as_deref(),
            Some("403 Forbidden")
        );
        assert_eq!(
            status_of(b"HTTP/1.0 502 Bad\x1b[31m Gateway\r\n").as_deref(),
            Some("502 Bad[31m Gateway")
        );
        let long = format!("HTTP/1.1 403 {}\r\n", "x".repeat(500));
        assert_eq!(status_of(long.as_bytes()).map(|s| s.len()), Some(80));
        for not_http in [&b"SSH-2.0-OpenSSH\r\n"[..], b"HTTP/1.1 abc\r\n", b""] {
            assert_eq!(status_of(not_http), None);
        }
    }
}
