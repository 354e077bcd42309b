//! What one client can hold of a listener, with real sockets: request heads
//! and bodies trickled a byte at a time (slowloris) hold connections,
//! never the `max_in_flight` slots everyone's requests need; heads, bodies
//! and idle connections have deadlines; and connections are capped per
//! client address. Over plain HTTP/1.1, over TLS, and over HTTP/2.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::clients::{lego_http_run, run_with_env};
use crate::harness::{self, Dns, TestServer};
use crate::raw;
use crate::tls::{connect, get};
use crate::upstream::TestPki;

/// The request slots of the servers below: as many stallers of each kind.
const SLOTS: usize = 4;

/// A request head cut short: the blank line that ends it never comes.
const PARTIAL_HEAD: &[u8] = b"POST /profile/default/new-account HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/jose+json\r\n";

/// A whole head announcing 1000 octets of body, and the first of them.
const STALLED_BODY: &[u8] = b"POST /profile/default/new-account HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/jose+json\r\nContent-Length: 1000\r\n\r\n{";

/// `max_in_flight = SLOTS` and `connections` settings prepended / appended
/// to a test server's configuration.
/// A metrics listener, to read how many connections the server holds.
const METRICS: &str = "[metrics]\nlisten = \"127.0.0.1:0\"\n";

fn bounded(toml: String, connections: &str) -> String {
    format!("max_in_flight = {SLOTS}\n{toml}\n[connections]\n{connections}\n")
}

/// Waits (up to 10 s) until the server's `connections_open` gauge for the
/// ACME listener reads `n`: every staller has been accepted and is being
/// read.
pub(crate) async fn wait_open_connections(server: &TestServer, n: usize) {
    wait_open_connections_on(server, "acme", n).await;
}

/// [`wait_open_connections`] for the listener named `listener`.
pub(crate) async fn wait_open_connections_on(server: &TestServer, listener: &str, n: usize) {
    let gauge = format!("acme_proxy_connections_open{{listener=\"{listener}\"}}");
    let url = format!(
        "http://{}/metrics",
        server.running().metrics_addr.expect("a metrics listener")
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, body) = crate::flow::reqwest_get(&url).await;
        let body = String::from_utf8_lossy(&body).into_owned();
        let open = body
            .lines()
            .find(|l| l.starts_with(&gauge))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<usize>().ok());
        if open == Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connections_open of {listener} did not reach {n} within 10 s (last {open:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TCP connection to `to` from 127.0.0.`last`: another loopback
/// address stands for another host.
pub(crate) async fn connect_from(last: u8, to: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)),
            0,
        ))
        .unwrap();
    socket.connect(to).await.unwrap()
}

/// Sends `bytes` on a new connection to `addr` and keeps it open.
async fn stall(addr: SocketAddr, bytes: &[u8]) -> tokio::net::TcpStream {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    tcp
}

/// HEAD newNonce at `directory`'s server, plain HTTP: its status and how
/// long it took.
pub(crate) async fn new_nonce(directory: &str) -> (u16, Duration) {
    let url = directory.replace("/directory", "/new-nonce");
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        raw::request("HEAD", &url, None, Vec::new()),
    )
    .await
    .expect("newNonce answered");
    (r.status, started.elapsed())
}

/// Reads until the peer closes (or errors); returns what was read and how
/// long it took, failing past `within`.
pub(crate) async fn until_closed<S: AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> (String, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "still open after {within:?}; read so far: {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_heads_and_bodies_take_no_request_slot_so_new_nonce_and_lego_are_served_at_once() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("lego") {
        return;
    }
    let at = harness::own_addr();
    let dir = crate::harness::tempdir();
    // Deadlines far beyond the test: the stallers stay for all of it.
    let toml = bounded(
        TestServer::config_text(dir.path(), at.port(), Some(&dns), METRICS),
        "header_read_timeout = \"5m\"\nbody_read_timeout = \"5m\"",
    );
    let server = TestServer::start_in(dir, &toml).await;
    let addr = server.running().addr;
    let mut stallers = Vec::new();
    for _ in 0..SLOTS {
        stallers.push(stall(addr, STALLED_BODY).await);
        stallers.push(stall(addr, PARTIAL_HEAD).await);
    }
    wait_open_connections(&server, stallers.len()).await;

    let directory = server.directory("default");
    let (status, took) = new_nonce(&directory).await;
    assert_eq!(
        status,
        200,
        "newNonce with {} stallers open",
        stallers.len()
    );
    assert!(took < Duration::from_secs(2), "newNonce took {took:?}");

    let home = crate::harness::tempdir();
    let ran = run_with_env(
        "lego",
        lego_http_run(&directory, home.path(), at, "busy.example.test"),
        Vec::new(),
        home.path().to_path_buf(),
    )
    .await;
    assert!(ran.success(), "lego failed\n{}", ran.report());
    assert!(ran.elapsed < Duration::from_secs(20), "{:?}", ran.elapsed);
    // The stallers were there all along.
    for s in &stallers {
        let mut probe = [0u8; 1];
        assert!(
            matches!(s.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a staller was answered or closed"
        );
    }
    server.stop().await;
}

/// A newAccount POST of `octets` of body from 127.0.0.`last`, plain
/// HTTP/1.1: the answer's status.
async fn post_from(last: u8, addr: SocketAddr, octets: usize) -> u16 {
    let mut tcp = connect_from(last, addr).await;
    let head = format!(
        "POST /profile/default/new-account HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/jose+json\r\nContent-Length: {octets}\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    // Cut short when the server refuses before the end.
    let _ = tcp.write_all(&vec![b'x'; octets]).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut got))
        .await
        .expect("answered within 10 s");
    let got = String::from_utf8_lossy(&got);
    got.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {got:?}"))
}

/// A head announcing 1000 octets of body from 127.0.0.`last`, and
/// `sent` of them.
async fn stall_from(last: u8, addr: SocketAddr, sent: usize) -> tokio::net::TcpStream {
    let mut tcp = connect_from(last, addr).await;
    tcp.write_all(b"POST /profile/default/new-account HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/jose+json\r\nContent-Length: 1000\r\n\r\n")
        .await
        .unwrap();
    tcp.write_all(&vec![b'{'; sent]).await.unwrap();
    tcp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_hold_what_they_have_sent_of_max_buffered_body_bytes_and_a_client_its_share() {
    let dir = crate::harness::tempdir();
    // A budget of 2500 octets; a client's share is the one max_open_per_client
    // is of max_open: 2500 * 8 / 16 = 1250.
    let toml = format!(
        "max_body_bytes = 1000\nmax_buffered_body_bytes = 2500\n{}",
        bounded(
            TestServer::config_text(dir.path(), 1, None, METRICS),
            "body_read_timeout = \"5m\"\nmax_open = 16\nmax_open_per_client = 8",
        )
    );
    let server = TestServer::start_in(dir, &toml).await;
    let addr = server.running().addr;
    // Two clients have sent 900 of their 1000 octets; a third announced
    // 1000 octets four times and sent one of each.
    let first = stall_from(2, addr, 900).await;
    let second = stall_from(3, addr, 900).await;
    let mut announcers = Vec::new();
    for _ in 0..4 {
        announcers.push(stall_from(6, addr, 1).await);
    }
    // Once the 1800 octets are read, 1000 more do not fit. Each probe
    // before that is read whole and refused (400), which on a busy
    // machine once took the whole of a 10 s deadline: the stallers'
    // connections are waited for first, and the probes get 30 s.
    wait_open_connections(&server, 6).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while post_from(4, addr, 1000).await != 503 {
        assert!(Instant::now() < deadline, "never at capacity");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What was announced and not sent holds nothing: 600 still fit.
    assert_eq!(
        post_from(4, addr, 600).await,
        400,
        "announced octets were held"
    );
    // A client past its share is refused while the budget has room.
    assert_eq!(
        post_from(2, addr, 400).await,
        503,
        "the first client's share"
    );
    assert_eq!(post_from(4, addr, 400).await, 400, "another client's share");
    // Each 503 is counted by the bound that was full.
    let metrics = format!(
        "http://{}",
        server.running().metrics_addr.expect("a metrics listener")
    );
    assert_eq!(shed(&metrics, "body_share").await, 1);
    assert!(shed(&metrics, "max_buffered_body_bytes").await >= 1);
    assert_eq!(shed(&metrics, "max_in_flight").await, 0);
    // The answer to a refusal is an ACME problem with Retry-After.
    let r = raw::request(
        "POST",
        &format!("{}/profile/default/new-account", server.base()),
        Some("application/jose+json"),
        vec![b'x'; 1000],
    )
    .await;
    assert_eq!(
        (
            r.status,
            r.problem().as_str(),
            r.headers.get("retry-after").and_then(|v| v.to_str().ok())
        ),
        (503, "serverInternal", Some("1"))
    );

    // A client that leaves gives its octets back.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    while post_from(4, addr, 1000).await != 400 {
        assert!(Instant::now() < deadline, "the octets were not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A reload's budget applies at once, to what is held already: 904
    // octets of a budget of 1000 leave no room for 400.
    let reload = |budget: usize| {
        let toml = toml.replace(
            "max_buffered_body_bytes = 2500",
            &format!("max_buffered_body_bytes = {budget}"),
        );
        let running = server.running();
        async move {
            running
                .reload(acme_proxy::config::Config::from_toml(&toml).expect("config"))
                .await
                .expect("reloaded");
        }
    };
    reload(1000).await;
    assert_eq!(
        post_from(4, addr, 400).await,
        503,
        "the lower budget of the reload"
    );
    reload(2500).await;
    assert_eq!(
        post_from(4, addr, 400).await,
        400,
        "the budget reloaded back"
    );
    drop((second, announcers));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_trickling_and_idle_connections_are_closed_at_their_deadlines() {
    let dir = crate::harness::tempdir();
    let toml = bounded(
        TestServer::config_text(dir.path(), 1, None, ""),
        "header_read_timeout = \"1s\"\nbody_read_timeout = \"1s\"\nidle_timeout = \"2s\"",
    );
    let server = TestServer::start_in(dir, &toml).await;
    let addr = server.running().addr;
    let limit = Duration::from_secs(6);

    // Nothing sent: closed once the head is late.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (_, took) = until_closed(&mut silent, limit).await;
    assert!(took >= Duration::from_millis(800), "closed after {took:?}");

    // A head cut short: closed as well.
    let mut partial = stall(addr, PARTIAL_HEAD).await;
    until_closed(&mut partial, limit).await;

    // A body that stops: answered 408, as an ACME error with a nonce, and
    // closed.
    let mut body = stall(addr, STALLED_BODY).await;
    let (answer, took) = until_closed(&mut body, limit).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("replay-nonce:"),
        "{answer}"
    );
    assert!(answer.contains("did not arrive within"), "{answer}");
    assert!(
        took >= Duration::from_millis(800),
        "answered after {took:?}"
    );

    // A kept-alive connection, once its request is answered, is idle.
    let mut kept = tokio::net::TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = until_closed(&mut kept, limit).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // HTTP/2 (prior knowledge) after one request: closed by the idle bound.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let resp = sender
        .send_request(
            http::Request::get(format!("http://{addr}/health"))
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let started = Instant::now();
    tokio::time::timeout(limit, conn)
        .await
        .expect("the idle HTTP/2 connection was closed")
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "closed after {:?}",
        started.elapsed()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_address_holds_at_most_its_share_of_connections() {
    let dir = crate::harness::tempdir();
    let toml = bounded(
        TestServer::config_text(dir.path(), 1, None, METRICS),
        "max_open_per_client = 3\nheader_read_timeout = \"5m\"",
    );
    let server = TestServer::start_in(dir, &toml).await;
    let addr = server.running().addr;
    let from = |last: u8| connect_from(last, addr);
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = from(2).await;
        c.write_all(PARTIAL_HEAD).await.unwrap();
        held.push(c);
    }
    wait_open_connections(&server, held.len()).await;
    // The fourth from that address is closed at once, unanswered.
    let mut fourth = from(2).await;
    let (answer, took) = until_closed(&mut fourth, Duration::from_secs(3)).await;
    assert_eq!(answer, "");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // Another address is served.
    let mut other = from(3).await;
    other
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = until_closed(&mut other, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // One of the three closing gives the address its place back.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = from(2).await;
        again
            .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let (answer, _) = until_closed(&mut again, Duration::from_secs(3)).await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "the place was never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// A request body that sends one octet and then nothing, for ever.
struct Trickle(bool);

impl hyper::body::Body for Trickle {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.0 {
            return Poll::Pending;
        }
        self.0 = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"{")))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_and_http2_stalled_streams_take_no_request_slot_either() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("lego") {
        return;
    }
    let pki = TestPki::new();
    let (cert, key) = pki.server_cert(&["127.0.0.1"]);
    let at = harness::own_addr();
    let dir = crate::harness::tempdir();
    let toml = format!(
        "{}\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        bounded(
            TestServer::config_text(dir.path(), at.port(), Some(&dns), METRICS),
            "header_read_timeout = \"5m\"\nbody_read_timeout = \"5m\"",
        ),
        cert.display(),
        key.display()
    );
    let server = TestServer::start_in(dir, &toml).await;
    let addr = server.running().addr;
    let tls = pki.rustls_client_config();

    // HTTP/2 streams whose bodies stop after one octet, on two connections.
    let mut h2 = Vec::new();
    for _ in 0..2 {
        let (stream, _) = connect(&tls, addr, &[b"h2"]).await;
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        h2.push(tokio::spawn(conn));
        for _ in 0..SLOTS {
            let mut sender = sender.clone();
            let url = format!(
                "https://127.0.0.1:{}/profile/default/new-account",
                addr.port()
            );
            h2.push(tokio::spawn(async move {
                let req = http::Request::post(url)
                    .header("content-type", "application/jose+json")
                    .body(Trickle(false))
                    .unwrap();
                let _ = sender.send_request(req).await;
                Ok(())
            }));
        }
    }
    // HTTP/1.1 over TLS: heads cut short and bodies that stop.
    let mut h1 = Vec::new();
    for bytes in [PARTIAL_HEAD, STALLED_BODY] {
        for _ in 0..SLOTS {
            let (mut stream, _) = connect(&tls, addr, &[b"http/1.1"]).await;
            stream.write_all(bytes).await.unwrap();
            stream.flush().await.unwrap();
            h1.push(stream);
        }
    }
    wait_open_connections(&server, 2 + h1.len()).await;

    // newNonce over TLS, both protocols, answered at once.
    for alpn in [&b"h2"[..], &b"http/1.1"[..]] {
        let (stream, _) = connect(&tls, addr, &[alpn]).await;
        let started = Instant::now();
        let (status, _) = get(stream, "/profile/default/new-nonce").await;
        assert_eq!(status, 204, "{}", String::from_utf8_lossy(alpn));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    // And a whole issuance by lego over https.
    let home = crate::harness::tempdir();
    let ran = run_with_env(
        "lego",
        lego_http_run(
            &server.directory("default"),
            home.path(),
            at,
            "tls-busy.example.test",
        ),
        vec![(
            "LEGO_CA_CERTIFICATES".to_owned(),
            pki.ca_pem_path().display().to_string(),
        )],
        home.path().to_path_buf(),
    )
    .await;
    assert!(ran.success(), "lego failed\n{}", ran.report());
    for task in &h2 {
        assert!(
            !task.is_finished(),
            "an HTTP/2 staller was answered or closed"
        );
    }
    drop(h1);
    server.stop().await;
}

/// The server's open file descriptors.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .count()
}

/// `acme_proxy_accept_failures_total` of `listener`, read from `metrics`.
async fn accept_failures(metrics: &str, listener: &str) -> u64 {
    counter(
        metrics,
        &format!("acme_proxy_accept_failures_total{{listener=\"{listener}\"}}"),
    )
    .await
}

/// The counter `series` (its name and labels) scraped from `metrics`
/// (`http://ADDR`): 0 before its first count.
pub(crate) async fn counter(metrics: &str, series: &str) -> u64 {
    let (_, _, body) = crate::flow::reqwest_get(&format!("{metrics}/metrics")).await;
    let series = format!("{series} ");
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

/// `acme_proxy_requests_shed_total` of `bound`, scraped from `metrics`.
pub(crate) async fn shed(metrics: &str, bound: &str) -> u64 {
    counter(
        metrics,
        &format!("acme_proxy_requests_shed_total{{bound=\"{bound}\"}}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_file_descriptors_logs_failing_accepts_once_counts_each_and_recovers() {
    if !harness::require_program("prlimit") {
        return;
    }
    let dir = crate::harness::tempdir();
    let config = dir.path().join("acme-proxy.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n{METRICS}[profiles.default]\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut serve = harness::under_umask_022();
    serve
        .args(["serve", "--config", config.to_str().unwrap()])
        .current_dir(dir.path());
    let log = dir.path().join("acme-proxy.log");
    let (server, printed) = harness::spawn_serving_printed(serve, &log);
    let find = |prefix: &str| {
        printed
            .iter()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {printed:?}"))
            .trim()
            .to_owned()
    };
    let addr: SocketAddr = find("acme-proxy is listening on").parse().unwrap();
    let metrics = find("metrics:").trim_end_matches("/metrics").to_owned();
    let pid = server.0.id();
    assert_eq!(accept_failures(&metrics, "acme").await, 0);

    // Room for two more descriptors: the third connection and those after
    // it wait in the listen queue while every accept fails (EMFILE).
    let set_soft_limit = |limit: &str| {
        let status = std::process::Command::new("prlimit")
            .args(["--pid", &pid.to_string(), &format!("--nofile={limit}:")])
            .status()
            .unwrap();
        assert!(status.success());
    };
    let soft = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            "--nofile",
            "--output=SOFT",
            "--noheadings",
        ])
        .output()
        .unwrap();
    let soft = String::from_utf8(soft.stdout).unwrap().trim().to_owned();
    assert!(!soft.is_empty(), "prlimit printed no soft limit");
    set_soft_limit(&(open_files(pid) + 2).to_string());
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let failing = "accepts failed";
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap().contains(failing) {
        assert!(Instant::now() < deadline, "no accept failed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Kept out of descriptors for a while: a retry every 100 ms, each a
    // failure, none a line of its own.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(held);

    // The closed connections give their descriptors back: served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let health = tokio::time::timeout(
            Duration::from_secs(2),
            raw::request("GET", &format!("http://{addr}/health"), None, Vec::new()),
        )
        .await;
        if matches!(health, Ok(ref r) if r.status == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "not served again");
    }
    // The queued connections the server is still closing may hold every
    // descriptor the limit allows; the metrics listener's own accept
    // could then fail too, and log a line of its own.
    set_soft_limit(&soft);
    let failures = accept_failures(&metrics, "acme").await;
    assert!(failures >= 10, "{failures} failed accepts in 1.5 s");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<_> = text.lines().filter(|l| l.contains(failing)).collect();
    assert_eq!(lines.len(), 1, "{failures} failures logged as {lines:#?}");
    assert!(lines[0].contains("Too many open files"), "{}", lines[0]);
}
