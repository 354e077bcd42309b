//! `acme-loadgen`: whole ACME issuances (newOrder → authorization →
//! challenge → poll → finalize → poll → download, the certificate checked)
//! at a chosen concurrency against any ACME server, with issuances per
//! second and latency percentiles. The client is instant-acme over hyper
//! with `TCP_NODELAY` on (without it, loopback costs ~40 ms per request).
//!
//! A server that sheds load answers 503 with `Retry-After`: the request is
//! sent again after that delay and counted, not reported as an error.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::BodyExt;
use instant_acme::{
    Account, AccountCredentials, BodyWrapper, BytesResponse, ChallengeType, HttpClient, Identifier,
    NewAccount, NewOrder, OrderStatus, RetryPolicy,
};

#[derive(Debug, Parser)]
#[command(name = "acme-loadgen", about = "Whole ACME issuances under load")]
struct Args {
    /// The ACME directory URL.
    #[arg(long)]
    directory: String,
    /// Issuances to run.
    #[arg(long, default_value_t = 200)]
    orders: usize,
    /// Issuances in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// DNS names per order (one authorization each).
    #[arg(long, default_value_t = 1)]
    names_per_order: usize,
    /// The certificate key type.
    #[arg(long, value_enum, default_value_t = KeyKind::Ec256)]
    key: KeyKind,
    /// One account for every order, or a new account per order.
    #[arg(long, value_enum, default_value_t = Accounts::One)]
    accounts: Accounts,
    /// `none`: trigger http-01 without serving it (the server bypasses or
    /// always accepts); `http-01`: serve the key authorizations on
    /// `--http-port`.
    #[arg(long, value_enum, default_value_t = Challenge::None)]
    challenge: Challenge,
    /// Where the http-01 responder listens (the server's validation port).
    #[arg(long, default_value_t = 5002)]
    http_port: u16,
    /// A CA certificate (PEM) to trust for an https:// directory.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Names are `{n}.{domain}`.
    #[arg(long, default_value = "loadgen.example.test")]
    domain: String,
    /// How long to wait before the first poll of an order (for ready, then
    /// for its certificate); each further poll waits 1.5 times longer
    /// unless the server sends `Retry-After`. instant-acme always waits
    /// before the first poll, so this is idle time in every issuance: kept
    /// short so that a benchmark measures the server, not the client's
    /// sleeps (a server that is not ready yet is simply polled again).
    /// At least 1: instant-acme multiplies the delay, so 0 would poll
    /// without pause.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    poll_delay_ms: u64,
    /// Give up an issuance after this long.
    #[arg(long, default_value = "60")]
    timeout_secs: u64,
    /// Give up the whole run, with exit status 3 and no figures, when no
    /// issuance has finished (issued or failed) for this long: a server
    /// that has deadlocked (Pebble 2.4 can) is found in seconds, not after
    /// `--timeout-secs`. Off unless given.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    stall_secs: Option<u64>,
    /// One JSON line instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum KeyKind {
    Ec256,
    Rsa2048,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Accounts {
    One,
    PerOrder,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Challenge {
    None,
    #[value(name = "http-01")]
    Http01,
}

/// Requests the server shed (503 with `Retry-After`) and that were sent again.
static SHED: AtomicU64 = AtomicU64::new(0);

/// The exit status of a run given up by `--stall-secs`.
const STALLED: i32 = 3;

/// Ends the process with [`STALLED`] once `finished` has not moved for
/// `stall`, checking ten times per period.
fn watch_for_stall(finished: Arc<AtomicU64>, stall: Duration) {
    tokio::spawn(async move {
        let mut seen = finished.load(Ordering::Relaxed);
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(stall / 10).await;
            let now = finished.load(Ordering::Relaxed);
            if now != seen {
                (seen, since) = (now, Instant::now());
            } else if since.elapsed() >= stall {
                eprintln!(
                    "acme-loadgen: no issuance finished within {stall:?} ({now} so far): the server stalled"
                );
                std::process::exit(STALLED);
            }
        }
    });
}

/// The HTTP client: hyper with `TCP_NODELAY`, https through rustls trusting
/// `--ca-file`, and 503 + `Retry-After` retried.
#[derive(Clone)]
struct Client {
    inner: Arc<dyn HttpClient>,
}

impl Client {
    fn new(ca_file: Option<&PathBuf>) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        if let Some(path) = ca_file {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject;
            for cert in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("reading {}", path.display()))?
            {
                roots.add(cert.context("a PEM certificate")?)?;
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client: hyper_util::client::legacy::Client<_, BodyWrapper<Bytes>> =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_max_idle_per_host(1024)
                .build(https);
        Ok(Self {
            inner: Arc::new(client),
        })
    }
}

type Response =
    Pin<Box<dyn std::future::Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>>;

impl HttpClient for Client {
    fn request(&self, req: http::Request<BodyWrapper<Bytes>>) -> Response {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            loop {
                let mut req = http::Request::builder()
                    .method(parts.method.clone())
                    .uri(parts.uri.clone());
                for (k, v) in &parts.headers {
                    req = req.header(k, v);
                }
                let req = req
                    .body(BodyWrapper::from(body.to_vec()))
                    .map_err(|e| instant_acme::Error::Other(Box::new(e)))?;
                let resp = this.inner.request(req).await?;
                let retry_after = resp
                    .parts
                    .headers
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                match (resp.parts.status.as_u16(), retry_after) {
                    (503, Some(secs)) => {
                        SHED.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_secs(secs.clamp(0, 5))).await;
                    }
                    _ => return Ok(resp),
                }
            }
        })
    }
}

/// Key authorizations served for http-01, by token.
type Board = Arc<Mutex<std::collections::HashMap<String, String>>>;

async fn serve_http01(port: u16, board: Board) -> anyhow::Result<()> {
    use axum::extract::{Path, State};
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/.well-known/acme-challenge/{token}",
            get(
                |State(board): State<Board>, Path(token): Path<String>| async move {
                    match board.lock().unwrap_or_else(|p| p.into_inner()).get(&token) {
                        Some(ka) => (http::StatusCode::OK, ka.clone()),
                        None => (http::StatusCode::NOT_FOUND, String::new()),
                    }
                },
            ),
        )
        .with_state(board);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))
        .await
        .with_context(|| format!("binding the http-01 responder on port {port}"))?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(())
}

fn retry(first: Duration) -> RetryPolicy {
    RetryPolicy::new()
        .initial_delay(first)
        .backoff(1.5)
        .timeout(Duration::from_secs(60))
}

async fn new_account(
    client: &Client,
    directory: &str,
) -> anyhow::Result<(Account, AccountCredentials)> {
    Account::builder_with_http(Box::new(client.clone()))
        .create(
            &NewAccount {
                contact: &[],
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            directory.to_owned(),
            None,
        )
        .await
        .context("newAccount")
}

/// The CSR key: a fresh P-256 key per order, or one RSA 2048 key (made
/// once with openssl; ring signs RSA but does not generate it).
enum CsrKey {
    Ec256,
    Rsa(String),
}

impl CsrKey {
    fn new(kind: KeyKind) -> anyhow::Result<Self> {
        Ok(match kind {
            KeyKind::Ec256 => Self::Ec256,
            KeyKind::Rsa2048 => {
                let out = std::process::Command::new("openssl")
                    .args([
                        "genpkey",
                        "-algorithm",
                        "RSA",
                        "-pkeyopt",
                        "rsa_keygen_bits:2048",
                    ])
                    .output()
                    .context("running openssl genpkey for the RSA key")?;
                if !out.status.success() {
                    bail!("openssl genpkey failed");
                }
                Self::Rsa(String::from_utf8(out.stdout)?)
            }
        })
    }

    fn key_pair(&self) -> anyhow::Result<rcgen::KeyPair> {
        Ok(match self {
            Self::Ec256 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?,
            Self::Rsa(pem) => rcgen::KeyPair::from_pem_and_sign_algo(pem, &rcgen::PKCS_RSA_SHA256)?,
        })
    }
}

/// How long the newOrder and finalize requests of one issuance took (the
/// two writes whose cost may grow with the number of stored orders).
#[derive(Clone, Copy, Debug, Default)]
struct Steps {
    new_order: Duration,
    finalize: Duration,
}

/// One whole issuance; the certificate's names are checked.
async fn issue(
    account: &Account,
    names: &[String],
    challenge: Challenge,
    board: &Board,
    key: &CsrKey,
    poll: Duration,
) -> anyhow::Result<Steps> {
    let ids: Vec<Identifier> = names.iter().map(|n| Identifier::Dns(n.clone())).collect();
    let t = Instant::now();
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .context("newOrder")?;
    let new_order = t.elapsed();
    let mut tokens = Vec::new();
    let mut auths = order.authorizations();
    while let Some(authz) = auths.next().await {
        let mut authz = authz.context("authorization")?;
        if authz.status == instant_acme::AuthorizationStatus::Valid {
            continue;
        }
        let mut ch = authz
            .challenge(ChallengeType::Http01)
            .context("no http-01 challenge offered")?;
        if challenge == Challenge::Http01 {
            let ka = ch.key_authorization().as_str().to_owned();
            board
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(ch.token.clone(), ka);
            tokens.push(ch.token.clone());
        }
        ch.set_ready().await.context("challenge")?;
    }
    let status = order
        .poll_ready(&retry(poll))
        .await
        .context("polling to ready")?;
    for t in &tokens {
        board.lock().unwrap_or_else(|p| p.into_inner()).remove(t);
    }
    if status != OrderStatus::Ready {
        bail!("order {status:?}, not ready: {:?}", order.state().error);
    }
    let key = key.key_pair()?;
    let mut params = rcgen::CertificateParams::new(names.to_vec())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params.serialize_request(&key)?;
    let t = Instant::now();
    order.finalize_csr(csr.der()).await.context("finalize")?;
    let finalize = t.elapsed();
    let chain = order
        .poll_certificate(&retry(poll))
        .await
        .context("polling to the certificate")?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).context("chain PEM")?;
    let cert = pem.parse_x509().context("the leaf parses")?;
    let mut sans: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|g| match g {
                    x509_parser::extensions::GeneralName::DNSName(n) => Some((*n).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    sans.sort();
    let mut want = names.to_vec();
    want.sort();
    if sans != want {
        bail!("the certificate names {sans:?}, not {want:?}");
    }
    Ok(Steps {
        new_order,
        finalize,
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.concurrency == 0 || args.orders == 0 || args.names_per_order == 0 {
        bail!("--orders, --concurrency and --names-per-order must be at least 1");
    }
    let client = Client::new(args.ca_file.as_ref())?;
    let board: Board = Arc::default();
    if args.challenge == Challenge::Http01 {
        serve_http01(args.http_port, Arc::clone(&board)).await?;
    }
    let key = Arc::new(CsrKey::new(args.key)?);
    // Counts issued and failed issuances; watched from the first request
    // (after the local set-up, which may generate an RSA key), so that a
    // server that stalls on the directory or the account is found too.
    let finished = Arc::new(AtomicU64::new(0));
    if let Some(secs) = args.stall_secs {
        watch_for_stall(Arc::clone(&finished), Duration::from_secs(secs));
    }
    let shared = match args.accounts {
        Accounts::One => Some(new_account(&client, &args.directory).await?.0),
        Accounts::PerOrder => None,
    };
    let next = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(args.orders)));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (client, board, key, shared, next, latencies, errors, finished) = (
            client.clone(),
            Arc::clone(&board),
            Arc::clone(&key),
            shared.clone(),
            Arc::clone(&next),
            Arc::clone(&latencies),
            Arc::clone(&errors),
            Arc::clone(&finished),
        );
        let directory = args.directory.clone();
        let (orders, per, domain, challenge, timeout, poll) = (
            args.orders as u64,
            args.names_per_order,
            args.domain.clone(),
            args.challenge,
            Duration::from_secs(args.timeout_secs),
            Duration::from_millis(args.poll_delay_ms),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= orders {
                    return;
                }
                let names: Vec<String> = (0..per).map(|i| format!("{n}-{i}.{domain}")).collect();
                let t = Instant::now();
                let result = tokio::time::timeout(timeout, async {
                    let account = match &shared {
                        Some(a) => a.clone(),
                        None => new_account(&client, &directory).await?.0,
                    };
                    issue(&account, &names, challenge, &board, &key, poll).await
                })
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("no certificate within {timeout:?}")));
                match result {
                    Ok(steps) => latencies
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((t.elapsed(), steps)),
                    Err(e) => errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("{e:#}")),
                }
                finished.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let elapsed = started.elapsed();
    let done = latencies.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let sorted = |f: fn(&(Duration, Steps)) -> Duration| {
        let mut v: Vec<Duration> = done.iter().map(f).collect();
        v.sort();
        v
    };
    let lat = sorted(|d| d.0);
    let new_order = sorted(|d| d.1.new_order);
    let finalize = sorted(|d| d.1.finalize);
    let errors = errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let rate = lat.len() as f64 / elapsed.as_secs_f64();
    let summary = serde_json::json!({
        "directory": args.directory,
        "orders": args.orders,
        "concurrency": args.concurrency,
        "issued": lat.len(),
        "errors": errors.len(),
        "shed_retried": SHED.load(Ordering::Relaxed),
        "seconds": (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        "per_second": (rate * 10.0).round() / 10.0,
        "p50_ms": ms(percentile(&lat, 0.50)),
        "p90_ms": ms(percentile(&lat, 0.90)),
        "p99_ms": ms(percentile(&lat, 0.99)),
        "max_ms": ms(lat.last().copied().unwrap_or_default()),
        "new_order_p50_ms": ms(percentile(&new_order, 0.50)),
        "new_order_p99_ms": ms(percentile(&new_order, 0.99)),
        "finalize_p50_ms": ms(percentile(&finalize, 0.50)),
        "finalize_p99_ms": ms(percentile(&finalize, 0.99)),
        "first_error": errors.first(),
    });
    if args.json {
        println!("{summary}");
    } else {
        println!(
            "{} issued, {} errors ({} shed requests retried) in {:.2}s: {:.1}/s; latency p50 {} ms, p90 {} ms, p99 {} ms, max {} ms; newOrder p50 {} ms, p99 {} ms; finalize p50 {} ms, p99 {} ms",
            lat.len(),
            errors.len(),
            SHED.load(Ordering::Relaxed),
            elapsed.as_secs_f64(),
            rate,
            summary["p50_ms"],
            summary["p90_ms"],
            summary["p99_ms"],
            summary["max_ms"],
            summary["new_order_p50_ms"],
            summary["new_order_p99_ms"],
            summary["finalize_p50_ms"],
            summary["finalize_p99_ms"]
        );
        if let Some(e) = errors.first() {
            println!("first error: {e}");
        }
    }
    if !errors.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
