//! Test machinery for the relay signer, whose upstream ACME CA is Pebble
//! (Debian 2.4): a throwaway PKI for every TLS listener of a test, Pebble
//! itself, and a fault-injecting HTTPS reverse proxy to put between the relay
//! and Pebble. The tests at the bottom prove the machinery works.
//!
//! Pebble speaks only HTTPS and builds every URL it hands out (directory,
//! `Location`, `Link`, order, authorization, finalize and certificate URLs)
//! from the request's `Host` header, and checks each JWS `url` against that
//! same host. So a proxy that forwards `Host` untouched is transparent: the
//! relay only ever sees the proxy's address, and nothing needs rewriting.
//!
//! Pebble's ACME paths (2.4): `/dir`, `/nonce-plz`, `/sign-me-up` (newAccount),
//! `/my-account/{id}`, `/order-plz` (newOrder), `/my-order/{id}`,
//! `/finalize-order/{id}`, `/authZ/{id}`, `/chalZ/{id}`, `/certZ/{id}`,
//! `/revoke-cert`, `/rollover-account-key`. Its management listener serves
//! `/roots/0` and `/intermediates/0`.
//!
//! How Pebble 2.4 behaves, as seen through these tests: it sends no
//! `Retry-After` at all; a triggered challenge answers `pending` (never
//! `processing`) and is valid within ~10 ms (real http-01 with
//! `PEBBLE_VA_NOSLEEP`, three fetches per validation, one per "perspective");
//! finalize answers 200 `processing` and the order is `valid` ~30 ms later;
//! finalizing again (or before `ready`) is 403 `orderNotReady`; an unknown
//! order is 404 with an empty body; certificates last five years; it reorders
//! an order's identifiers (DNS first); wildcards get only dns-01. `-strict`
//! is not needed (it defaults to false).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use crate::harness::{ChildGuard, free_port, require_program};
use crate::raw::Resp;

/// The tree's only crypto provider: every rustls
/// configuration here is built on it explicitly, never on a process default.
fn ring_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A name Pebble's certificate holds and no resolver knows: an outbound
/// proxy is told where it is (`proxy.rs`).
pub const PEBBLE_NAME: &str = "pebble.test";

/// A throwaway certificate authority (ECDSA P-256, made with rcgen) for the
/// TLS listeners of one test: Pebble's ACME and management listeners and the
/// fault proxy. The relay is configured to trust [`TestPki::ca_pem_path`]
/// and nothing else, as an operator would trust a private CA.
pub struct TestPki {
    dir: tempfile::TempDir,
    ca_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    /// Numbers the leaf files so that several leaves can coexist.
    issued: AtomicUsize,
}

impl TestPki {
    /// Makes the CA and writes its certificate to a temporary directory.
    pub fn new() -> TestPki {
        let dir = crate::harness::tempdir();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, "acme-proxy test PKI");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        std::fs::write(dir.path().join("ca.pem"), cert.pem()).expect("write the CA certificate");
        TestPki {
            ca_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
            dir,
            issued: AtomicUsize::new(0),
        }
    }

    /// The CA certificate (PEM) that clients of the test's TLS listeners
    /// trust.
    pub fn ca_pem_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Issues a server certificate for `names` (an IP address becomes an IP
    /// SAN, anything else a DNS SAN) and writes it and its key (PKCS#8) as
    /// PEM files; returns (certificate path, key path). Pebble takes these.
    pub fn server_cert(&self, names: &[&str]) -> (PathBuf, PathBuf) {
        let (cert, key) = self.issue(names);
        let n = self.issued.fetch_add(1, Ordering::SeqCst);
        let cert_path = self.dir.path().join(format!("leaf-{n}.pem"));
        let key_path = self.dir.path().join(format!("leaf-{n}.key.pem"));
        std::fs::write(&cert_path, cert.pem()).expect("write the leaf certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write the leaf key");
        (cert_path, key_path)
    }

    /// A rustls server configuration presenting a fresh certificate for
    /// `names`, offering only HTTP/1.1 in ALPN (for the fault proxy).
    pub fn rustls_server_config(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let (cert, key) = self.issue(names);
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(ring_provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .expect("server certificate");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A rustls client configuration trusting only this CA: for the fault
    /// proxy's forwarding to Pebble and for tests that talk to Pebble or the
    /// proxy directly.
    pub fn rustls_client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.ca_der.clone())
            .expect("the test CA as a root");
        Arc::new(
            rustls::ClientConfig::builder_with_provider(ring_provider())
                .with_safe_default_protocol_versions()
                .expect("protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }

    fn issue(&self, names: &[&str]) -> (rcgen::Certificate, KeyPair) {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("leaf key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .expect("leaf parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or("test"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        (cert, key)
    }
}

/// Aborts a spawned task when dropped, so that a connection driver dies with
/// the request (or the aborted task) that started it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One HTTPS request over a fresh connection, trusting what `tls` trusts,
/// with the URL's authority as `Host`. An error (refused, reset, TLS
/// failure, no answer within 30 s) is returned as text, so a test can
/// assert that the fault proxy's `Reset` is seen as a failure.
pub async fn https_request(
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    url: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Result<Resp, String> {
    let sent_nonce = crate::raw::nonce_sent(&body);
    let exchange = async {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let host = uri.host().ok_or_else(|| format!("{url}: no host"))?;
        let port = uri.port_u16().unwrap_or(443);
        let tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
        let stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let _driver = AbortOnDrop(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or(host);
        let mut req = http::Request::builder()
            .method(method)
            .uri(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
            .header("host", authority);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("request: {}", error_chain(&e)))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {}", error_chain(&e)))?
            .to_bytes()
            .to_vec();
        Ok(Resp {
            status,
            headers,
            body,
            sent_nonce,
        })
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| format!("{method} {url}: no answer within 30s"))?
}

/// An error with its sources ("connection error: Connection reset by
/// peer"): hyper's own message alone does not say what happened.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// How to run Pebble.
#[derive(Clone, Debug)]
pub struct PebbleOptions {
    /// Skip challenge validation entirely (`PEBBLE_VA_ALWAYS_VALID=1`): every
    /// triggered challenge becomes valid at once.
    pub always_valid: bool,
    /// The port Pebble fetches http-01 challenges from (a `Responder`'s).
    pub http_port: u16,
    /// The port Pebble connects to for tls-alpn-01 (may be an unused port).
    pub tls_port: u16,
    /// Pebble's DNS server for every lookup it makes (`-dnsserver`), e.g.
    /// `Dns::addr` so that test names resolve to 127.0.0.1, or a `Bind` for
    /// dns-01. None: the system resolver.
    pub dns_server: Option<SocketAddr>,
    /// More environment for Pebble, applied after the defaults so it can
    /// override them (e.g. `PEBBLE_WFE_NONCEREJECT=50` to test badNonce
    /// retries, `PEBBLE_CHAIN_LENGTH`).
    pub extra_env: Vec<(String, String)>,
    /// Require external account binding with this key id and base64url
    /// MAC key (`externalAccountMACKeys`).
    pub eab: Option<(String, String)>,
}

impl Default for PebbleOptions {
    /// Real validation, unused free ports for http-01 and tls-alpn-01, the
    /// system resolver.
    fn default() -> PebbleOptions {
        PebbleOptions {
            always_valid: false,
            http_port: free_port(),
            tls_port: free_port(),
            dns_server: None,
            extra_env: Vec::new(),
            eab: None,
        }
    }
}

/// Debian's `pebble` (2.4): a real ACME CA on [`crate::harness::own_host`], its ACME and
/// management listeners serving a certificate from a [`TestPki`]. Killed on
/// drop. It keeps nothing between runs: a new root and intermediate each
/// start.
pub struct Pebble {
    /// The ACME listener (`/dir` and everything it links to).
    pub addr: SocketAddr,
    /// The management listener (`/roots/0`, `/intermediates/0`, …), HTTPS
    /// with the same certificate.
    pub management: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    child: ChildGuard,
    dir: tempfile::TempDir,
}

impl Pebble {
    /// Starts Pebble and waits until both listeners accept connections;
    /// None when pebble is not installed (and the test should skip).
    ///
    /// Nonces are never rejected on purpose (`PEBBLE_WFE_NONCEREJECT=0`; by
    /// default Pebble refuses 5% of good nonces), validation does not sleep
    /// (`PEBBLE_VA_NOSLEEP=1`) and valid authorizations are never reused
    /// (`PEBBLE_AUTHZREUSE=0`; by default half of them are), so that a test
    /// sees the same flow every run.
    pub fn start(pki: &TestPki, opts: PebbleOptions) -> Option<Pebble> {
        if !require_program("pebble") {
            return None;
        }
        // Pebble must be given its addresses and cannot report them: they
        // are own_addrs, which no other test can take.
        let dir = crate::harness::tempdir();
        let own_host = crate::harness::own_host().to_string();
        let (cert, key) = pki.server_cert(&["127.0.0.1", "localhost", &own_host, PEBBLE_NAME]);
        let addr = crate::harness::own_addr();
        let management = crate::harness::own_addr();
        let config = serde_json::json!({"pebble": {
            "listenAddress": addr.to_string(),
            "managementListenAddress": management.to_string(),
            "certificate": cert,
            "privateKey": key,
            "httpPort": opts.http_port,
            "tlsPort": opts.tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": opts.eab.is_some(),
            "externalAccountMACKeys": opts.eab.iter().map(|(k, v)| (k.clone(), serde_json::Value::from(v.clone()))).collect::<serde_json::Map<_, _>>(),
        }});
        let config_path = dir.path().join("pebble-config.json");
        std::fs::write(&config_path, config.to_string()).expect("write the Pebble config");
        let log = std::fs::File::create(dir.path().join("pebble.log")).expect("log file");
        let mut cmd = Command::new("pebble");
        cmd.arg("-config").arg(&config_path);
        if let Some(dns) = opts.dns_server {
            cmd.args(["-dnsserver", &dns.to_string()]);
        }
        cmd.env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0");
        if opts.always_valid {
            cmd.env("PEBBLE_VA_ALWAYS_VALID", "1");
        } else {
            cmd.env_remove("PEBBLE_VA_ALWAYS_VALID");
        }
        for (k, v) in &opts.extra_env {
            cmd.env(k, v);
        }
        let child = cmd
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start pebble");
        let mut pebble = Pebble {
            addr,
            management,
            tls: pki.rustls_client_config(),
            child: ChildGuard(child),
            dir,
        };
        for listener in [addr, management] {
            if let Err(e) = pebble.wait_listening(listener) {
                panic!("{e}");
            }
        }
        Some(pebble)
    }

    /// Like waiting for a TCP listener, but gives up at once with Pebble's log when it
    /// has exited (a bad configuration, a port taken).
    fn wait_listening(&mut self, addr: SocketAddr) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.0.try_wait() {
                return Err(format!(
                    "pebble exited ({status}) before listening:\n{}",
                    self.log()
                ));
            }
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "pebble did not listen on {addr} within 20s:\n{}",
            self.log()
        ))
    }

    /// Pebble's own directory URL (the relay normally goes through a
    /// [`FaultProxy`] instead).
    pub fn directory_url(&self) -> String {
        format!("https://{}/dir", self.addr)
    }

    /// Pebble's directory URL by the name [`PEBBLE_NAME`], which only a
    /// proxy told where it is can reach (this machine's resolver does not
    /// know it).
    pub fn directory_url_by_name(&self) -> String {
        format!("https://{PEBBLE_NAME}:{}/dir", self.addr.port())
    }

    /// Pebble's stdout and stderr so far (one line per request it handled),
    /// for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pebble.log")).unwrap_or_default()
    }

    /// The root Pebble issues under in this run (PEM).
    pub async fn root_pem(&self) -> String {
        self.management_get("/roots/0").await
    }

    /// The intermediate that signs Pebble's certificates in this run (PEM).
    pub async fn intermediate_pem(&self) -> String {
        self.management_get("/intermediates/0").await
    }

    async fn management_get(&self, path: &str) -> String {
        let url = format!("https://{}{path}", self.management);
        let r = https_request(&self.tls, "GET", &url, None, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}\n{}", self.log()));
        assert_eq!(r.status, 200, "GET {url}\n{}", self.log());
        String::from_utf8(r.body).expect("PEM is text")
    }
}

/// Which requests a [`Fault`] applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// Every request.
    Any,
    /// Requests whose path (with query) contains this, e.g. `"/dir"`,
    /// `"nonce-plz"`, `"order-plz"` (newOrder), `"finalize-order"`,
    /// `"authZ"`, `"chalZ"`, `"certZ"`, `"my-order"`, `"sign-me-up"`.
    PathContains(&'static str),
}

impl Match {
    fn matches(&self, path: &str) -> bool {
        match self {
            Match::Any => true,
            Match::PathContains(s) => path.contains(s),
        }
    }
}

/// What the fault proxy does instead of (or after) forwarding a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 502 with an nginx-like HTML page, as a load balancer in front of a
    /// CA answers when the CA is down: not an ACME problem document.
    Html502,
    /// 503 `serverInternal` problem ("maintenance").
    Unavailable503,
    /// 429 `rateLimited` problem with `Retry-After: retry_after_secs`.
    RateLimited429 { retry_after_secs: u64 },
    /// Closes the connection without answering (SO_LINGER 0, so the client
    /// sees a reset); the request never reaches Pebble.
    Reset,
    /// Reads the request and never answers; the connection stays open until
    /// the proxy is dropped. The request never reaches Pebble.
    Hang,
    /// 403 `unauthorized` problem ("upstream says no: account is not
    /// allowed").
    Forbidden403,
    /// 400 `rejectedIdentifier` problem, as a CA whose policy will not
    /// issue for a name answers its newOrder.
    Rejected400,
    /// Forwards the request, so Pebble acts on it, then resets the
    /// connection instead of relaying the answer: the lost-response case
    /// (e.g. a finalize that happened upstream although the relay saw an
    /// error).
    ResetAfterForward,
    /// Forwards a challenge's trigger, so Pebble validates, and answers
    /// with Pebble's challenge turned invalid with a `connection` error:
    /// what a CA whose validation fails before it answers the trigger
    /// sends (Pebble itself does on a slow host), made certain.
    FailedBeforeAnswer,
}

/// What the proxy did with one request.
struct Entry {
    /// When it was handled.
    at: Instant,
    method: String,
    path: String,
    /// The status sent to the client; 0 for a reset or a hang.
    status: u16,
    /// Pebble answered the request.
    forwarded: bool,
}

/// State shared by the proxy's tasks and its handle.
#[derive(Default)]
struct ProxyState {
    queue: Mutex<VecDeque<(Match, Fault)>>,
    always: Mutex<Vec<(Match, Fault)>>,
    log: Mutex<Vec<Entry>>,
    applied: AtomicUsize,
    limit: Mutex<Option<UpstreamLimit>>,
}

/// The stand-in for an upstream CA's own rate limit (Pebble has none): as
/// Let's Encrypt's, the generic cell rate algorithm, `count` at once, then
/// one more every `per / count`.
struct UpstreamLimit {
    when: Match,
    interval: Duration,
    burst: Duration,
    /// The theoretical arrival time: from then on nothing is taken.
    tat: Option<Instant>,
}

impl UpstreamLimit {
    /// Takes a place now, or says how many seconds until one frees.
    fn take(&mut self, now: Instant) -> Result<(), u64> {
        let tat = self.tat.map_or(now, |t| t.max(now));
        let allowed_at = (tat + self.interval).checked_sub(self.burst).unwrap_or(now);
        if allowed_at > now {
            return Err((allowed_at - now).as_secs() + 1);
        }
        self.tat = Some(tat + self.interval);
        Ok(())
    }
}

impl ProxyState {
    /// The first queued fault matching `path` (consumed), else the first
    /// persistent one.
    fn take_fault(&self, path: &str) -> Option<Fault> {
        {
            let mut queue = self.queue.lock().expect("lock");
            if let Some(i) = queue.iter().position(|(m, _)| m.matches(path)) {
                return queue.remove(i).map(|(_, f)| f);
            }
        }
        let always = self
            .always
            .lock()
            .expect("lock")
            .iter()
            .find(|(m, _)| m.matches(path))
            .map(|(_, f)| f.clone());
        if always.is_some() {
            return always;
        }
        let mut limit = self.limit.lock().expect("lock");
        match limit.as_mut() {
            Some(l) if l.when.matches(path) => l
                .take(Instant::now())
                .err()
                .map(|retry_after_secs| Fault::RateLimited429 { retry_after_secs }),
            _ => None,
        }
    }

    fn record(&self, method: &str, path: &str, status: u16, forwarded: bool) {
        self.log.lock().expect("lock").push(Entry {
            at: Instant::now(),
            method: method.to_owned(),
            path: path.to_owned(),
            status,
            forwarded,
        });
    }
}

/// What every connection task needs.
struct ProxyContext {
    upstream: SocketAddr,
    upstream_tls: Arc<rustls::ClientConfig>,
    state: Arc<ProxyState>,
}

/// The error a request handler returns to make hyper drop the connection
/// without writing a response.
#[derive(Debug)]
struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fault proxy: connection dropped on purpose")
    }
}

impl std::error::Error for DropConnection {}

type ProxyResponse = http::Response<Full<Bytes>>;

/// A fault-injecting HTTPS reverse proxy in front of Pebble, run as tokio
/// tasks on the test's runtime: TLS with a [`TestPki`] certificate for
/// 127.0.0.1/localhost, HTTP/1.1, each request forwarded to Pebble over a
/// fresh TLS connection with its `Host` header untouched (so Pebble's URLs
/// all name the proxy), unless a fault matches. Dropping it (or
/// [`FaultProxy::shutdown`]) stops accepting and aborts every connection,
/// hung ones included.
pub struct FaultProxy {
    /// Where the proxy listens (127.0.0.1, TLS, HTTP/1.1).
    pub addr: SocketAddr,
    state: Arc<ProxyState>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to Pebble's ACME
    /// listener at `upstream`. Must be called within a tokio runtime.
    pub fn start(pki: &TestPki, upstream: SocketAddr) -> FaultProxy {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("addr");
        let listener = tokio::net::TcpListener::from_std(std_listener).expect("tokio listener");
        let acceptor =
            tokio_rustls::TlsAcceptor::from(pki.rustls_server_config(&["127.0.0.1", "localhost"]));
        let state = Arc::new(ProxyState::default());
        let context = Arc::new(ProxyContext {
            upstream,
            upstream_tls: pki.rustls_client_config(),
            state: Arc::clone(&state),
        });
        let accept = tokio::spawn(accept_loop(listener, acceptor, context));
        FaultProxy {
            addr,
            state,
            accept,
        }
    }

    /// The directory URL through the proxy: what the relay is configured
    /// with.
    pub fn directory_url(&self) -> String {
        format!("https://{}/dir", self.addr)
    }

    /// Queues `fault` for the next request matching `when`; queued faults
    /// are consumed in order and take precedence over persistent ones.
    pub fn inject(&self, when: Match, fault: Fault) {
        self.state
            .queue
            .lock()
            .expect("lock")
            .push_back((when, fault));
    }

    /// Applies `fault` to every request matching `when` until called again
    /// with None for the same `when` (e.g. every request 503 while the relay
    /// boots).
    pub fn set_always(&self, when: Match, fault: Option<Fault>) {
        let mut always = self.state.always.lock().expect("lock");
        always.retain(|(m, _)| *m != when);
        if let Some(f) = fault {
            always.push((when, f));
        }
    }

    /// POST requests whose path contains `path_contains` that reached Pebble
    /// and were answered by it (whether or not the answer was passed on),
    /// e.g. `count("finalize-order")` for upstream finalizes.
    pub fn count(&self, path_contains: &str) -> usize {
        self.state
            .log
            .lock()
            .expect("lock")
            .iter()
            .filter(|e| e.forwarded && e.method == "POST" && e.path.contains(path_contains))
            .count()
    }

    /// From now on, answers requests matching `when` past `count` per
    /// `per` with 429 `rateLimited` and `Retry-After`, as an upstream CA
    /// past its own limit does (see [`UpstreamLimit`]).
    pub fn limit(&self, when: Match, count: u32, per: Duration) {
        let interval = per / count;
        *self.state.limit.lock().expect("lock") = Some(UpstreamLimit {
            when,
            interval,
            burst: interval * count,
            tat: None,
        });
    }

    /// When each POST whose path contains `path_contains` reached Pebble
    /// and was answered by it, in completion order.
    pub fn forwarded_at(&self, path_contains: &str) -> Vec<Instant> {
        self.state
            .log
            .lock()
            .expect("lock")
            .iter()
            .filter(|e| e.forwarded && e.method == "POST" && e.path.contains(path_contains))
            .map(|e| e.at)
            .collect()
    }

    /// Every request handled so far with when it was (method, path, status
    /// sent, as [`Self::requests`]), in completion order.
    pub fn requests_at(&self) -> Vec<(Instant, String, String, u16)> {
        self.state
            .log
            .lock()
            .expect("lock")
            .iter()
            .map(|e| (e.at, e.method.clone(), e.path.clone(), e.status))
            .collect()
    }

    /// Faults applied so far (queued and persistent).
    pub fn faults_applied(&self) -> usize {
        self.state.applied.load(Ordering::SeqCst)
    }

    /// Every request handled so far, in completion order: (method, path,
    /// status sent, 0 for a reset or a hang). A hung request is listed as
    /// soon as it starts hanging.
    pub fn requests(&self) -> Vec<(String, String, u16)> {
        self.state
            .log
            .lock()
            .expect("lock")
            .iter()
            .map(|e| (e.method.clone(), e.path.clone(), e.status))
            .collect()
    }

    /// Stops accepting and aborts every connection (as dropping does).
    pub fn shutdown(&self) {
        self.accept.abort();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Accepts connections until aborted. The connection tasks live in a
/// `JoinSet` owned by this task, so aborting it aborts them all.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    context: Arc<ProxyContext>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        match listener.accept().await {
            Ok((tcp, _)) => {
                connections.spawn(serve_connection(
                    tcp,
                    acceptor.clone(),
                    Arc::clone(&context),
                ));
            }
            // Out of descriptors or the like: do not spin.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// One client connection: the TLS handshake, then HTTP/1.1 requests until
/// the client leaves or a fault drops the connection.
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    context: Arc<ProxyContext>,
) {
    let _ = tcp.set_nodelay(true);
    // A second descriptor of the socket lets a Reset set SO_LINGER 0 while
    // hyper owns the stream; it is closed with the connection.
    let Ok(std_tcp) = tcp.into_std() else { return };
    let Ok(twin) = std_tcp.try_clone() else {
        return;
    };
    let Ok(tcp) = tokio::net::TcpStream::from_std(std_tcp) else {
        return;
    };
    let twin = Arc::new(twin);
    let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
    else {
        return;
    };
    let service =
        hyper::service::service_fn(move |req| handle(req, Arc::clone(&context), Arc::clone(&twin)));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

/// Makes the socket's close send a TCP reset instead of a FIN.
fn set_reset_on_close(twin: &std::net::TcpStream) {
    if let Ok(dup) = twin.try_clone() {
        let _ = tokio::net::TcpSocket::from_std_stream(dup).set_zero_linger();
    }
}

async fn handle(
    req: http::Request<Incoming>,
    context: Arc<ProxyContext>,
    twin: Arc<std::net::TcpStream>,
) -> Result<ProxyResponse, DropConnection> {
    let method = req.method().as_str().to_owned();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    let (parts, body) = req.into_parts();
    // The whole request is read first, also when it will not be forwarded:
    // a fault hits a request the client has finished sending.
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Err(DropConnection);
    };
    let state = &context.state;
    let Some(fault) = state.take_fault(&path) else {
        let (resp, forwarded) = forward(parts, body, &context).await;
        state.record(&method, &path, resp.status().as_u16(), forwarded);
        return Ok(resp);
    };
    state.applied.fetch_add(1, Ordering::SeqCst);
    match fault {
        Fault::Reset => {
            state.record(&method, &path, 0, false);
            set_reset_on_close(&twin);
            Err(DropConnection)
        }
        Fault::ResetAfterForward => {
            let (_, forwarded) = forward(parts, body, &context).await;
            state.record(&method, &path, 0, forwarded);
            set_reset_on_close(&twin);
            Err(DropConnection)
        }
        Fault::Hang => {
            state.record(&method, &path, 0, false);
            std::future::pending().await
        }
        Fault::FailedBeforeAnswer => {
            let (resp, forwarded) = forward(parts, body, &context).await;
            let (mut head, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let mut challenge: serde_json::Value =
                serde_json::from_slice(&body).unwrap_or_else(|_| serde_json::json!({}));
            challenge["status"] = "invalid".into();
            challenge["error"] = serde_json::json!({
                "type": "urn:ietf:params:acme:error:connection",
                "detail": "fault proxy: the validation failed before the trigger was answered",
                "status": 400,
            });
            let body = Bytes::from(challenge.to_string());
            head.headers.remove(http::header::CONTENT_LENGTH);
            state.record(&method, &path, head.status.as_u16(), forwarded);
            Ok(http::Response::from_parts(head, Full::new(body)))
        }
        other => {
            let resp = canned(&other);
            state.record(&method, &path, resp.status().as_u16(), false);
            Ok(resp)
        }
    }
}

/// The answer a fault gives in place of Pebble's.
fn canned(fault: &Fault) -> ProxyResponse {
    let problem = |status: u16, kind: &str, detail: &str| {
        let body = serde_json::json!({
            "type": format!("urn:ietf:params:acme:error:{kind}"),
            "detail": detail,
            "status": status,
        });
        http::Response::builder()
            .status(status)
            .header("content-type", "application/problem+json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("response")
    };
    match fault {
        Fault::Html502 => html_error(502, "Bad Gateway"),
        Fault::Unavailable503 => problem(503, "serverInternal", "maintenance"),
        Fault::RateLimited429 { retry_after_secs } => {
            let mut resp = problem(
                429,
                "rateLimited",
                "too many requests (fault proxy): try again later",
            );
            resp.headers_mut()
                .insert("retry-after", http::HeaderValue::from(*retry_after_secs));
            resp
        }
        Fault::Forbidden403 => problem(
            403,
            "unauthorized",
            "upstream says no: account is not allowed",
        ),
        Fault::Rejected400 => problem(
            400,
            "rejectedIdentifier",
            "upstream policy forbids issuing for this name",
        ),
        Fault::Reset | Fault::Hang | Fault::ResetAfterForward | Fault::FailedBeforeAnswer => {
            unreachable!("{fault:?} has no response")
        }
    }
}

/// An error page as nginx writes it.
fn html_error(status: u16, reason: &str) -> ProxyResponse {
    let body = format!(
        "<html>\r\n<head><title>{status} {reason}</title></head>\r\n<body>\r\n<center><h1>{status} {reason}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
    );
    http::Response::builder()
        .status(status)
        .header("content-type", "text/html")
        .header("server", "nginx")
        .body(Full::new(Bytes::from(body)))
        .expect("response")
}

/// Headers that describe one hop, not the message; the length is
/// recomputed from the buffered body.
fn hop_by_hop(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
    )
}

/// Forwards one request to Pebble; returns the answer to pass on and
/// whether Pebble gave it. When Pebble cannot be reached the proxy answers
/// 502 (504 after 30 s), like a real reverse proxy.
async fn forward(
    parts: http::request::Parts,
    body: Bytes,
    context: &ProxyContext,
) -> (ProxyResponse, bool) {
    match tokio::time::timeout(Duration::from_secs(30), send_upstream(parts, body, context)).await {
        Ok(Ok(resp)) => (resp, true),
        Ok(Err(_)) => (html_error(502, "Bad Gateway"), false),
        Err(_) => (html_error(504, "Gateway Time-out"), false),
    }
}

async fn send_upstream(
    parts: http::request::Parts,
    body: Bytes,
    context: &ProxyContext,
) -> Result<ProxyResponse, String> {
    let tcp = tokio::net::TcpStream::connect(context.upstream)
        .await
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let name = ServerName::IpAddress(context.upstream.ip().into());
    let stream = tokio_rustls::TlsConnector::from(Arc::clone(&context.upstream_tls))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let _driver = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let mut req = http::Request::builder().method(parts.method).uri(
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/"),
    );
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            req = req.header(name, value);
        }
    }
    let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let mut out = http::Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            out = out.header(name, value);
        }
    }
    out.body(Full::new(body)).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn pebble_serves_its_directory_through_the_fault_proxy_and_faults_apply_in_turn() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(
        &pki,
        PebbleOptions {
            always_valid: true,
            ..PebbleOptions::default()
        },
    ) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let tls = pki.rustls_client_config();
    let directory_url = proxy.directory_url();
    let get_dir = || https_request(&tls, "GET", &directory_url, None, Vec::new());

    // Pebble names whatever host it was asked by: itself directly, the
    // proxy through the proxy.
    let direct = https_request(&tls, "GET", &pebble.directory_url(), None, Vec::new())
        .await
        .unwrap();
    assert_eq!(direct.status, 200, "{}", pebble.log());
    assert_eq!(
        direct.json()["newOrder"],
        format!("https://{}/order-plz", pebble.addr)
    );
    let dir = get_dir().await.unwrap();
    assert_eq!(dir.status, 200, "{}", pebble.log());
    let doc = dir.json();
    for key in [
        "newNonce",
        "newAccount",
        "newOrder",
        "revokeCert",
        "keyChange",
    ] {
        let url = doc[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key} in {doc}"));
        assert!(
            url.starts_with(&format!("https://{}/", proxy.addr)),
            "{key} names the proxy: {doc}"
        );
    }

    // A queued fault hits the next matching request only.
    proxy.inject(Match::PathContains("/dir"), Fault::Html502);
    let r = get_dir().await.unwrap();
    assert_eq!(r.status, 502);
    assert_eq!(r.headers["content-type"], "text/html");
    assert!(String::from_utf8_lossy(&r.body).contains("502 Bad Gateway"));
    assert_eq!(get_dir().await.unwrap().status, 200);

    // A fault for another path waits for it.
    proxy.inject(Match::PathContains("finalize-order"), Fault::Unavailable503);
    assert_eq!(get_dir().await.unwrap().status, 200);

    let reset = get_dir_with_fault(&proxy, Fault::Reset, &get_dir).await;
    let error = reset.expect_err("a reset is an error");
    assert!(error.contains("reset"), "a TCP reset, not a FIN: {error}");
    assert_eq!(get_dir().await.unwrap().status, 200);

    // Problem documents, as a CA (or its front end) sends them.
    let r = get_dir_with_fault(
        &proxy,
        Fault::RateLimited429 {
            retry_after_secs: 7,
        },
        &get_dir,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 429);
    assert_eq!(r.headers["retry-after"], "7");
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert_eq!(r.problem(), "rateLimited");
    assert_eq!(r.json()["status"], 429);
    let r = get_dir_with_fault(&proxy, Fault::Forbidden403, &get_dir)
        .await
        .unwrap();
    assert_eq!((r.status, r.problem().as_str()), (403, "unauthorized"));

    // A persistent fault stays until cleared.
    proxy.set_always(Match::Any, Some(Fault::Unavailable503));
    for _ in 0..2 {
        let r = get_dir().await.unwrap();
        assert_eq!((r.status, r.problem().as_str()), (503, "serverInternal"));
        assert_eq!(r.json()["detail"], "maintenance");
    }
    proxy.set_always(Match::Any, None);
    assert_eq!(get_dir().await.unwrap().status, 200);

    // A hang holds the client until it gives up.
    proxy.inject(Match::Any, Fault::Hang);
    let hung = tokio::time::timeout(Duration::from_millis(500), get_dir()).await;
    assert!(hung.is_err(), "a hung request gets no answer: {hung:?}");

    // Only POSTs that Pebble answered are counted: a newAccount with a
    // garbage body (Pebble refuses it) and one reset after forwarding.
    let new_account = doc["newAccount"].as_str().unwrap();
    let post = || {
        https_request(
            &tls,
            "POST",
            new_account,
            Some("application/jose+json"),
            b"{}".to_vec(),
        )
    };
    let r = post().await.unwrap();
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    proxy.inject(Match::PathContains("sign-me-up"), Fault::Reset);
    assert!(post().await.is_err());
    proxy.inject(Match::PathContains("sign-me-up"), Fault::ResetAfterForward);
    assert!(post().await.is_err());
    assert_eq!(proxy.count("sign-me-up"), 2, "{:?}", proxy.requests());
    assert_eq!(proxy.count("/dir"), 0, "GETs are not counted");

    assert_eq!(proxy.faults_applied(), 9);
    let requests = proxy.requests();
    let statuses: Vec<u16> = requests.iter().map(|(_, _, s)| *s).collect();
    assert_eq!(
        statuses,
        [
            200, 502, 200, 200, 0, 200, 429, 403, 503, 503, 200, 0, 400, 0, 0
        ],
        "{requests:?}"
    );
    assert_eq!(requests[0], ("GET".to_owned(), "/dir".to_owned(), 200));

    // The management listener gives this run's root and intermediate.
    let root = pebble.root_pem().await;
    let intermediate = pebble.intermediate_pem().await;
    assert!(root.starts_with("-----BEGIN CERTIFICATE-----"), "{root}");
    assert!(
        intermediate.starts_with("-----BEGIN CERTIFICATE-----"),
        "{intermediate}"
    );
    assert_ne!(root, intermediate);
}

/// Queues `fault` for any request and GETs the directory.
async fn get_dir_with_fault<F, Fut>(
    proxy: &FaultProxy,
    fault: Fault,
    get_dir: &F,
) -> Result<Resp, String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Resp, String>>,
{
    proxy.inject(Match::Any, fault);
    get_dir().await
}

/// One whole issuance for `name` with instant-acme through `proxy`,
/// trusting only the test PKI, answering http-01 through `responder` when
/// given (Pebble validating for real); returns the PEM chain.
async fn issue_through(
    pki: &TestPki,
    proxy: &FaultProxy,
    responder: Option<&crate::harness::Responder>,
    name: &str,
) -> String {
    use instant_acme::{Account, ChallengeType, Identifier, NewAccount, NewOrder, OrderStatus};
    let (account, _credentials) = Account::builder_with_root(pki.ca_pem_path())
        .expect("client trusting the test PKI")
        .create(
            &NewAccount {
                contact: &[],
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            proxy.directory_url(),
            None,
        )
        .await
        .expect("account at Pebble");
    let mut order = account
        .new_order(&NewOrder::new(&[Identifier::Dns(name.to_owned())]))
        .await
        .expect("new order");
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.expect("authorization");
        let mut challenge = authz
            .challenge(ChallengeType::Http01)
            .expect("http-01 offered");
        if let Some(r) = responder {
            r.publish(&challenge.token, challenge.key_authorization().as_str());
        }
        challenge.set_ready().await.expect("challenge triggered");
    }
    let status = order
        .poll_ready(&crate::client::retry())
        .await
        .expect("order settles");
    assert_eq!(status, OrderStatus::Ready);
    order.finalize().await.expect("finalize");
    order
        .poll_certificate(&crate::client::retry())
        .await
        .expect("certificate")
}

#[tokio::test(flavor = "multi_thread")]
async fn pebble_issues_through_the_fault_proxy_with_every_url_naming_the_proxy() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(
        &pki,
        PebbleOptions {
            always_valid: true,
            ..PebbleOptions::default()
        },
    ) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let chain = issue_through(&pki, &proxy, None, "a.example.test").await;

    // Pebble's chain is the leaf and the intermediate of this run.
    let certs = pem::parse_many(&chain).expect("PEM chain");
    assert_eq!(certs.len(), 2, "{chain}");
    let intermediate = pem::parse(pebble.intermediate_pem().await).expect("PEM");
    assert_eq!(certs[1].contents(), intermediate.contents());

    // Every request went to the proxy (instant-acme follows the URLs Pebble
    // hands out), and exactly one finalize reached Pebble.
    let requests = proxy.requests();
    let paths: Vec<&str> = requests.iter().map(|(_, p, _)| p.as_str()).collect();
    for expected in [
        "/dir",
        "/nonce-plz",
        "/sign-me-up",
        "/order-plz",
        "/authZ/",
        "/chalZ/",
        "/my-order/",
        "/finalize-order/",
        "/certZ/",
    ] {
        assert!(
            paths.iter().any(|p| p.starts_with(expected)),
            "{expected} in {requests:?}"
        );
    }
    assert!(
        requests.iter().all(|(_, _, s)| (200..300).contains(s)),
        "{requests:?}\n{}",
        pebble.log()
    );
    assert_eq!(proxy.count("finalize-order"), 1, "{requests:?}");
    assert_eq!(proxy.faults_applied(), 0);

    // Once shut down, the proxy accepts nothing more.
    proxy.shutdown();
    let tls = pki.rustls_client_config();
    let deadline = Instant::now() + Duration::from_secs(5);
    while https_request(&tls, "GET", &proxy.directory_url(), None, Vec::new())
        .await
        .is_ok()
    {
        assert!(Instant::now() < deadline, "the proxy still answers");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pebble_validates_http01_against_the_responder_through_the_test_dns() {
    let Some(dns) = crate::harness::Dns::start() else {
        return;
    };
    let responder = crate::harness::Responder::start().await;
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(
        &pki,
        PebbleOptions {
            always_valid: false,
            http_port: responder.port,
            dns_server: Some(dns.addr),
            ..PebbleOptions::default()
        },
    ) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let chain = issue_through(&pki, &proxy, Some(&responder), "www.example.test").await;
    assert!(chain.contains("-----BEGIN CERTIFICATE-----"));
    // Pebble fetches from several "perspectives": three requests for one
    // validation.
    assert!(responder.hits() >= 1, "{}", pebble.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn bind_accepts_a_tsig_signed_update_and_serves_the_txt_record() {
    use std::io::Write;
    if !require_program("nsupdate") {
        return;
    }
    let secret = crate::harness::tsig_secret();
    let Some(bind) =
        crate::harness::Bind::start_dynamic("example.test", "relay-key", "hmac-sha256", &secret)
    else {
        return;
    };
    let name = "_acme-challenge.a.example.test.";
    assert!(bind.txt(name).is_empty());
    let update = |key: &str, value: &str| {
        let mut child = Command::new("nsupdate")
            .args(["-y", &format!("hmac-sha256:relay-key:{key}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nsupdate");
        write!(
            child.stdin.take().expect("stdin"),
            "server {} {}\nzone example.test\nupdate add {name} 60 TXT \"{value}\"\nsend\n",
            bind.addr.ip(),
            bind.addr.port()
        )
        .expect("write to nsupdate");
        let out = child.wait_with_output().expect("nsupdate");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };

    let (ok, output) = update(&secret, "token-1");
    assert!(ok, "nsupdate: {output}\n{}", bind.log());
    assert_eq!(bind.txt(name), ["token-1"], "{}", bind.log());

    // Another key (same name, other secret) is refused.
    let (ok, output) = update(&crate::harness::tsig_secret(), "intruder");
    assert!(!ok, "a wrong secret is refused: {output}");
    assert_eq!(bind.txt(name), ["token-1"]);
}
