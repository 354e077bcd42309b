//! TLS termination and reverse proxies: the ACME listener over rustls with
//! HTTP/2 and HTTP/1.1, a certificate reloaded when its files change or on
//! SIGHUP, a bounded handshake, a key that is not the certificate's refused
//! at start-up; and the audited client address taken from a trusted
//! proxy's forwarded header only.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;

use crate::client;
use crate::harness::{self, TestServer};
use crate::upstream::TestPki;

/// A TLS connection to `addr` trusting `tls`, offering `alpn`; returns the
/// stream (for a request) and the serial of the certificate it was shown.
pub(crate) async fn connect(
    tls: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    alpn: &[&[u8]],
) -> (
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    Vec<u8>,
) {
    let mut config = (**tls).clone();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
        .expect("TLS handshake");
    let der = stream
        .get_ref()
        .1
        .peer_certificates()
        .expect("a certificate")[0]
        .clone();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("parses");
    let serial = cert.raw_serial().to_vec();
    (stream, serial)
}

fn leaf_serial(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).expect("read the certificate");
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).expect("PEM");
    pem.parse_x509().expect("parses").raw_serial().to_vec()
}

/// Sends `req` (an absolute `https://` URI) over an established
/// connection, h2 or HTTP/1.1 by what ALPN chose: over h2 the authority
/// travels in `:authority` only, as a browser sends it; over HTTP/1.1 in
/// a `Host` header.
pub(crate) async fn send<B>(
    stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    req: http::Request<B>,
) -> http::Response<hyper::body::Incoming>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("h2 handshake");
        tokio::spawn(conn);
        return sender.send_request(req).await.expect("h2 request");
    }
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("http/1.1 handshake");
    tokio::spawn(conn);
    let (mut parts, body) = req.into_parts();
    let host = parts.uri.authority().expect("an absolute URI").to_string();
    parts.uri = parts
        .uri
        .path_and_query()
        .expect("a path")
        .as_str()
        .parse()
        .expect("path");
    parts
        .headers
        .insert(http::header::HOST, host.parse().expect("host"));
    sender
        .send_request(http::Request::from_parts(parts, body))
        .await
        .expect("http/1.1 request")
}

/// GET `path` over an established connection, h2 or HTTP/1.1 by what ALPN
/// chose; returns the status and the HTTP version the server answered in.
pub(crate) async fn get(
    stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    path: &str,
) -> (u16, http::Version) {
    let req = http::Request::get(format!("https://127.0.0.1{path}"))
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = send(stream, req).await;
    let status = resp.status().as_u16();
    let version = resp.version();
    let _ = resp.into_body().collect().await;
    (status, version)
}

fn tls_server_text(data_dir: &Path, cert: &Path, key: &Path, extra_tls: &str) -> String {
    format!(
        "{}\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n{extra_tls}",
        TestServer::config_text(data_dir, harness::free_port(), None, ""),
        cert.display(),
        key.display()
    )
}

/// Replaces the certificate files the server reads with a fresh pair.
fn replace_files(pki: &TestPki, cert: &Path, key: &Path) -> Vec<u8> {
    let (new_cert, new_key) = pki.server_cert(&["127.0.0.1"]);
    std::fs::copy(&new_key, key).expect("replace the key");
    std::fs::copy(&new_cert, cert).expect("replace the certificate");
    leaf_serial(cert)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_listener_speaks_h2_and_http11_and_serves_a_changed_certificate_to_new_connections()
{
    let pki = TestPki::new();
    let files = crate::harness::tempdir();
    let (cert, key) = (files.path().join("tls.pem"), files.path().join("tls.key"));
    let first = replace_files(&pki, &cert, &key);
    let dir = crate::harness::tempdir();
    let toml = tls_server_text(dir.path(), &cert, &key, "reload_interval = \"1s\"\n");
    let server = TestServer::start_in(dir, &toml).await;
    assert!(
        server.base().starts_with("https://127.0.0.1:"),
        "{}",
        server.base()
    );
    let addr = server.running().addr;
    let tls = pki.rustls_client_config();

    let (stream, serial) = connect(&tls, addr, &[b"h2", b"http/1.1"]).await;
    assert_eq!(serial, first);
    assert_eq!(
        get(stream, "/profile/default/directory").await,
        (200, http::Version::HTTP_2)
    );
    let (stream, _) = connect(&tls, addr, &[b"http/1.1"]).await;
    assert_eq!(
        get(stream, "/profile/default/directory").await,
        (200, http::Version::HTTP_11)
    );
    // An ACME client over https (instant-acme, HTTP/1.1 or h2 as it likes).
    let account =
        client::account_with_roots(&server.directory("default"), &pki.ca_pem_path()).await;
    assert!(account.id().starts_with("https://"), "{}", account.id());

    // The operator renews the certificate in place: new connections get it.
    let second = replace_files(&pki, &cert, &key);
    assert_ne!(first, second);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, serial) = connect(&tls, addr, &[b"h2"]).await;
        if serial == second {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the changed certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_finishes_its_handshake_is_disconnected_at_the_bound() {
    use tokio::io::AsyncReadExt;
    let pki = TestPki::new();
    let (cert, key) = pki.server_cert(&["127.0.0.1"]);
    let dir = crate::harness::tempdir();
    let toml = tls_server_text(dir.path(), &cert, &key, "handshake_timeout = \"500ms\"\n");
    let server = TestServer::start_in(dir, &toml).await;
    let mut tcp = tokio::net::TcpStream::connect(server.running().addr)
        .await
        .expect("connect");
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("the server closed the silent connection");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "closed after {:?}, before the bound",
        started.elapsed()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_the_certificates_stops_start_up() {
    let pki = TestPki::new();
    let (cert, _) = pki.server_cert(&["127.0.0.1"]);
    let (_, other_key) = pki.server_cert(&["127.0.0.1"]);
    let dir = crate::harness::tempdir();
    let toml = tls_server_text(dir.path(), &cert, &other_key, "");
    let config = acme_proxy::config::Config::from_toml(&toml).expect("parses");
    let err = acme_proxy::server::start(config, Arc::new(acme_proxy::clock::SystemClock))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("is not the key"), "{err:#}");
}

#[test]
fn sighup_makes_the_server_read_its_certificate_files_again() {
    let pki = TestPki::new();
    let files = crate::harness::tempdir();
    let (cert, key) = (files.path().join("tls.pem"), files.path().join("tls.key"));
    let first = replace_files(&pki, &cert, &key);
    // The console's listener has files of its own.
    let (admin_cert, admin_key) = (
        files.path().join("admin.pem"),
        files.path().join("admin.key"),
    );
    let admin_first = replace_files(&pki, &admin_cert, &admin_key);
    let dir = crate::harness::tempdir();
    // Files are not polled within the test: only SIGHUP can reload.
    let text = tls_server_text(
        &dir.path().join("data"),
        &cert,
        &key,
        &format!(
            "reload_interval = \"1h\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[admin.tls]\n\
             cert = \"{}\"\nkey = \"{}\"\nreload_interval = \"1h\"\n",
            admin_cert.display(),
            admin_key.display()
        ),
    );
    let config = dir.path().join("acme-proxy.toml");
    std::fs::write(&config, text).expect("config");
    let (child, directory) = harness::spawn_binary(
        dir.path(),
        &["serve", "--config", config.to_str().expect("utf-8")],
        &[],
    );
    let addr: SocketAddr = directory
        .strip_prefix("https://")
        .and_then(|r| r.split('/').next())
        .expect("an https directory URL")
        .parse()
        .expect("address");
    let log = std::fs::read_to_string(dir.path().join("acme-proxy.log")).expect("the log");
    let admin_addr: SocketAddr = log
        .split("the web console is at https://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no console address in the log:\n{log}"))
        .parse()
        .expect("the console's address");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let tls = pki.rustls_client_config();
    let served = || runtime.block_on(async { connect(&tls, addr, &[b"http/1.1"]).await.1 });
    let admin_served =
        || runtime.block_on(async { connect(&tls, admin_addr, &[b"http/1.1"]).await.1 });
    assert_eq!(served(), first);
    assert_eq!(admin_served(), admin_first);
    let second = replace_files(&pki, &cert, &key);
    let admin_second = replace_files(&pki, &admin_cert, &admin_key);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(served(), first, "no reload without the signal");
    assert_eq!(admin_served(), admin_first, "no reload without the signal");
    let status = std::process::Command::new("kill")
        .arg("-HUP")
        .arg(child.0.id().to_string())
        .status()
        .expect("kill -HUP");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while served() != second {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload the certificate"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    while admin_served() != admin_second {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload the console's certificate"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

type Forward = (
    hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<Bytes>,
    >,
    SocketAddr,
    &'static str,
);

/// A reverse proxy speaking real HTTP: forwards every request to `target`
/// and appends `hop` to `X-Forwarded-For`, as nginx's
/// `$proxy_add_x_forwarded_for` does with the address it saw.
struct ForwardingProxy {
    _task: tokio::task::JoinHandle<()>,
}

impl ForwardingProxy {
    async fn start(
        listener: tokio::net::TcpListener,
        target: SocketAddr,
        hop: &'static str,
    ) -> Self {
        use axum::extract::{Request, State};
        use axum::response::IntoResponse;
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build_http::<http_body_util::Full<Bytes>>();
        async fn forward(
            State((client, target, hop)): State<Forward>,
            req: Request,
        ) -> axum::response::Response {
            let (mut parts, body) = req.into_parts();
            let body = body.collect().await.expect("body").to_bytes();
            let chain = match parts.headers.get("x-forwarded-for") {
                Some(v) => format!("{}, {hop}", v.to_str().expect("ascii")),
                None => hop.to_owned(),
            };
            parts
                .headers
                .insert("x-forwarded-for", chain.parse().expect("header"));
            let path = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            parts.uri = format!("http://{target}{path}").parse().expect("uri");
            let resp = client
                .request(http::Request::from_parts(
                    parts,
                    http_body_util::Full::new(body),
                ))
                .await
                .expect("forwarded");
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.expect("body").to_bytes();
            (parts, body).into_response()
        }
        let app = axum::Router::new()
            .fallback(forward)
            .with_state((client, target, hop));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ForwardingProxy { _task: task }
    }
}

/// A server behind a forwarding proxy (its public URL is the proxy's);
/// returns the audited client address of the account a client created
/// through the proxy, which sends its own (spoofed) forwarded header.
async fn audited_address_through_a_proxy(trusted: &str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let proxy_addr = listener.local_addr().expect("addr");
    let dir = crate::harness::tempdir();
    let toml = format!(
        "public_url = \"http://{proxy_addr}\"\ntrusted_proxies = [\"{trusted}\"]\n{}",
        TestServer::config_text(dir.path(), harness::free_port(), None, "")
    );
    let server = TestServer::start_in(dir, &toml).await;
    let _proxy = ForwardingProxy::start(listener, server.running().addr, "198.51.100.7").await;
    client::account_with_header(
        &server.directory("default"),
        ("x-forwarded-for", "203.0.113.66"),
    )
    .await;
    let store = server.running().authority().store().clone();
    let rows = store
        .audit_recent(Some("account.created"), 1)
        .await
        .expect("audit");
    server.stop().await;
    rows[0].client_ip.clone().expect("a client address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_trusted_proxy_the_forwarded_client_is_audited_and_a_spoofed_hop_is_not() {
    assert_eq!(
        audited_address_through_a_proxy("127.0.0.1/32").await,
        "198.51.100.7"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_an_untrusted_hop_the_peer_address_is_audited() {
    assert_eq!(
        audited_address_through_a_proxy("10.0.0.0/8").await,
        "127.0.0.1"
    );
}
