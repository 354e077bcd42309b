//! The relay signer against a real upstream ACME CA: Debian's Pebble, with
//! its own TLS certificate that the relay is configured to trust, often
//! behind the fault-injecting proxy of `upstream.rs`.
//!
//! Internal clients (instant-acme, certbot, lego) order from a relay
//! profile; the relay obtains the certificate from Pebble with the
//! profile's strategy (bypass, http01 served on our own root, dns01 through
//! RFC 2136 updates to a real BIND), through faults, crashes and restarts.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acme_proxy::clock::SystemClock;
use acme_proxy::config::{Config, SignerConfig};
use acme_proxy_store::{Store, StoreOptions};
use instant_acme::{Account, Identifier, NewOrder, OrderStatus};
use x509_parser::prelude::*;

use crate::client;
use crate::clients::{self, Ran};
use crate::harness::{self, Bind, Dns, TestServer};
use crate::upstream::{Fault, FaultProxy, Match, Pebble, PebbleOptions, TestPki};

/// Pebble's newOrder path.
pub(crate) const NEW_ORDER: &str = "order-plz";
/// Pebble's finalize path.
pub(crate) const FINALIZE: &str = "finalize-order";

/// A relay profile named `name` whose upstream is `directory`, trusting
/// the test PKI. Local validation is bypassed unless `extra_profile` says
/// otherwise: these tests are about the upstream side.
fn relay_profile(
    name: &str,
    directory: &str,
    pki: &TestPki,
    strategy: &str,
    extra_profile: &str,
    extra_signer: &str,
) -> String {
    // An outage a test stages opens the breaker for a second, not the
    // default half minute (unless the test sets its own).
    let breaker = if extra_signer.contains("breaker_open_for") {
        ""
    } else {
        "breaker_open_for = \"1s\"\n"
    };
    format!(
        "[profiles.{name}]\nchallenges = [\"http-01\", \"dns-01\"]\n{extra_profile}\n\n[profiles.{name}.signer]\ntype = \"relay\"\ndirectory = \"{directory}\"\ntrust_anchors = [\"{ca}\"]\nstrategy = \"{strategy}\"\npoll_interval = \"100ms\"\nrequest_timeout = \"2s\"\nattempt_budget = \"60s\"\n{breaker}{extra_signer}\n",
        ca = pki.ca_pem_path().display()
    )
}

/// Bypassed local validation: only the upstream side is under test.
const LOCAL_BYPASS: &str = "bypass = true";

/// The usual relay profile: "default", bypass strategy, local validation
/// bypassed, `extra_signer` added to its signer table.
pub(crate) fn bypass_profile(directory: &str, pki: &TestPki, extra_signer: &str) -> String {
    relay_profile(
        "default",
        directory,
        pki,
        "bypass",
        LOCAL_BYPASS,
        extra_signer,
    )
}

/// Two always-valid Pebbles, A and B, each behind a fault proxy of its own;
/// None when Pebble is missing (the start already failed the test).
pub(crate) fn two_pebbles(pki: &TestPki) -> Option<([Pebble; 2], FaultProxy, FaultProxy)> {
    let (Some(a), Some(b)) = (
        Pebble::start(pki, always_valid()),
        Pebble::start(pki, always_valid()),
    ) else {
        return None;
    };
    let (proxy_a, proxy_b) = (
        FaultProxy::start(pki, a.addr),
        FaultProxy::start(pki, b.addr),
    );
    Some(([a, b], proxy_a, proxy_b))
}

/// The "default" relay profile (bypass) whose preferred upstream, named
/// `a`, is `a` with `a_extra` in its table, and whose fallback, named `b`,
/// is `b`.
pub(crate) fn a_then_b(pki: &TestPki, a: &FaultProxy, a_extra: &str, b: &FaultProxy) -> String {
    bypass_profile(
        &a.directory_url(),
        pki,
        &format!(
            "name = \"a\"\n{a_extra}\n\n\
             [[profiles.default.signer.fallback]]\nname = \"b\"\ndirectory = \"{}\"\n\
             trust_anchors = [\"{}\"]\nstrategy = \"bypass\"\npoll_interval = \"100ms\"\n\
             request_timeout = \"2s\"\nattempt_budget = \"60s\"\nbreaker_open_for = \"1s\"",
            b.directory_url(),
            pki.ca_pem_path().display()
        ),
    )
}

/// A server relaying `profiles` (its "default" profile) with the account
/// of every upstream registered: the configuration file the CLI reads, a
/// client's account, and the directories they live in.
pub(crate) struct Relaying {
    pub server: TestServer,
    pub config: std::path::PathBuf,
    pub account: Account,
    /// Bound by the caller (`_dirs`) so that they live as long as it.
    pub _dirs: [tempfile::TempDir; 2],
}

impl Relaying {
    pub(crate) async fn start(profiles: &str) -> Relaying {
        let data = crate::harness::tempdir();
        let toml = server_toml(data.path(), harness::free_port(), None, profiles);
        register_upstream_accounts(&toml).await;
        let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
        let (etc, config) = harness::config_file(&toml);
        let account = client::account(&server.directory("default")).await;
        Relaying {
            server,
            config,
            account,
            _dirs: [data, etc],
        }
    }
}

/// A "default" relay profile with the dns01 strategy updating `bind`'s
/// example.test zone with the TSIG `key` (name, algorithm) whose secret is
/// in `secret_file`.
fn dns01_profile(
    directory: &str,
    pki: &TestPki,
    bind: &Bind,
    (key, algorithm): (&str, &str),
    secret_file: &Path,
) -> String {
    let signer = format!(
        "\n[profiles.default.signer.dns01]\nserver = \"{}\"\nzones = [\"example.test\"]\ntsig_key_name = \"{key}\"\ntsig_algorithm = \"{algorithm}\"\ntsig_secret_file = \"{}\"\nttl = 30\n",
        bind.addr,
        secret_file.display()
    );
    relay_profile("default", directory, pki, "dns01", LOCAL_BYPASS, &signer)
}

/// Pebble validating for real, its only resolver `bind`.
fn pebble_validating_through(pki: &TestPki, bind: &Bind) -> Option<Pebble> {
    Pebble::start(
        pki,
        PebbleOptions {
            always_valid: false,
            dns_server: Some(bind.addr),
            ..PebbleOptions::default()
        },
    )
}

/// Fast retries, short leases: the server configuration of these tests.
pub(crate) fn server_toml(
    data_dir: &Path,
    http_port: u16,
    dns: Option<&Dns>,
    profiles: &str,
) -> String {
    TestServer::config_text(
        data_dir,
        http_port,
        dns,
        &format!(
            "[jobs]\nbackoff_base = \"100ms\"\nbackoff_cap = \"1s\"\nlease = \"2s\"\npoll_interval = \"100ms\"\n\n{profiles}"
        ),
    )
}

/// Registers the account of every relay profile at each of its upstreams,
/// as an operator does once with `acme-proxy upstream register`.
pub(crate) async fn register_upstream_accounts(toml: &str) {
    let config = Config::from_toml(toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    acme_proxy::private::create_dir(&config.data_dir).expect("data dir");
    let store = Store::open(&config.database_url(), &StoreOptions::default())
        .await
        .expect("open the database");
    for (name, p) in &config.profiles {
        let SignerConfig::Relay(relay) = &p.signer else {
            continue;
        };
        for upstream in relay.upstreams() {
            acme_proxy::admin::ops::register_upstream(
                &store,
                &SystemClock,
                &config,
                Some(name),
                Some(&upstream.name),
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("registering {name} at {}: {e}", upstream.name));
        }
    }
    store.close().await;
}

/// Registers, then starts a server from `toml` (whose data_dir is `dir`).
async fn start_relay(dir: tempfile::TempDir, toml: &str) -> TestServer {
    register_upstream_accounts(toml).await;
    TestServer::start_in(dir, toml).await
}

/// One relayed issuance as the client saw it.
pub(crate) struct Relayed {
    order_url: String,
    /// Every order status the client saw after finalize, in order.
    seen: Vec<OrderStatus>,
    /// The chain, or the order's error.
    pub(crate) result: Result<String, String>,
    finalize_to_end: Duration,
}

impl Relayed {
    pub(crate) fn chain(&self) -> &str {
        match &self.result {
            Ok(chain) => chain,
            Err(e) => panic!(
                "the relayed order failed: {e} (statuses seen: {:?})",
                self.seen
            ),
        }
    }

    fn local_id(&self) -> String {
        self.order_url
            .rsplit('/')
            .next()
            .expect("order id")
            .to_owned()
    }
}

/// Orders `names` and brings the order to ready, answering each local
/// challenge with the first type offered (the profile bypasses validation).
pub(crate) async fn ready_order(account: &Account, names: &[&str]) -> instant_acme::Order {
    ready_order_in(account, names, None).await
}

/// [`ready_order`] asking for the certificate profile `profile`.
async fn ready_order_in(
    account: &Account,
    names: &[&str],
    profile: Option<&str>,
) -> instant_acme::Order {
    let ids: Vec<Identifier> = names
        .iter()
        .map(|n| Identifier::Dns((*n).to_owned()))
        .collect();
    let mut new_order = NewOrder::new(&ids);
    if let Some(p) = profile {
        new_order = new_order.profile(p);
    }
    let mut order = account.new_order(&new_order).await.expect("new order");
    let mut auths = order.authorizations();
    while let Some(a) = auths.next().await {
        let mut a = a.expect("authorization");
        let kind = a.challenges[0].r#type.clone();
        a.challenge(kind)
            .expect("challenge")
            .set_ready()
            .await
            .expect("trigger");
    }
    let status = order.poll_ready(&client::retry()).await.expect("ready");
    assert_eq!(status, OrderStatus::Ready);
    order
}

/// Orders `names`, answers the local challenges (the profile bypasses
/// validation, or the names' first offered challenge is enough), finalizes
/// and polls until the order is valid or invalid, recording what it saw.
pub(crate) async fn relay_issue(account: &Account, names: &[&str], within: Duration) -> Relayed {
    relay_issue_in(account, names, None, within).await
}

/// [`relay_issue`] asking for the certificate profile `profile`.
async fn relay_issue_in(
    account: &Account,
    names: &[&str],
    profile: Option<&str>,
    within: Duration,
) -> Relayed {
    let mut order = ready_order_in(account, names, profile).await;
    let started = Instant::now();
    order.finalize().await.expect("finalize answers");
    let mut seen = vec![order.state().status];
    let deadline = started + within;
    let result = loop {
        match order.state().status {
            OrderStatus::Valid => {
                break Ok(order.certificate().await.expect("download").expect("chain"));
            }
            OrderStatus::Invalid => {
                break Err(format!("{:?}", order.state().error));
            }
            _ => {}
        }
        if Instant::now() > deadline {
            break Err(format!("still {:?} after {within:?}", order.state().status));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let status = order.refresh().await.expect("poll the order").status;
        if seen.last() != Some(&status) {
            seen.push(status);
        }
    };
    Relayed {
        order_url: order.url().to_owned(),
        seen,
        result,
        finalize_to_end: started.elapsed(),
    }
}

/// Pebble skipping validation (`PEBBLE_VA_ALWAYS_VALID`): the bypass
/// strategy's upstream.
pub(crate) fn always_valid() -> PebbleOptions {
    PebbleOptions {
        always_valid: true,
        ..PebbleOptions::default()
    }
}

/// The single `certificate.issue_failed` audit row of a relayed order
/// (exactly one: abandon runs once).
async fn the_one_issue_failure(store: &Store, relayed: &Relayed) -> acme_proxy_store::AuditRow {
    let audit = store
        .audit_for_order(&relayed.local_id())
        .await
        .expect("audit");
    let mut failed: Vec<_> = audit
        .iter()
        .filter(|a| a.event == "certificate.issue_failed")
        .cloned()
        .collect();
    assert_eq!(failed.len(), 1, "exactly one abandon: {audit:?}");
    failed.remove(0)
}

/// The issuer (raw DER name) of the first certificate of a PEM chain, and
/// its DNS SANs.
fn leaf_of(chain: &str) -> (Vec<u8>, Vec<String>, Vec<u8>) {
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).expect("chain PEM");
    let cert = pem.parse_x509().expect("leaf parses");
    let sans = cert
        .subject_alternative_name()
        .expect("SAN")
        .map(|s| {
            s.value
                .general_names
                .iter()
                .filter_map(|g| match g {
                    GeneralName::DNSName(n) => Some((*n).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    (
        cert.issuer().as_raw().to_vec(),
        sans,
        cert.raw_serial().to_vec(),
    )
}

/// The subject (raw DER name) of a PEM certificate.
fn subject_of(pem_text: &str) -> Vec<u8> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes()).expect("PEM");
    let cert = pem.parse_x509().expect("certificate parses");
    cert.subject().as_raw().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_and_lego_obtain_certificates_from_a_relay_profile_and_get_pebbles_chain() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("certbot") || !harness::require_program("lego") {
        return;
    }
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let intermediate = subject_of(&pebble.intermediate_pem().await);
    // Clients prove control to us for real (http-01 to their standalone
    // servers); the relay's upstream trusts its account (bypass).
    let at = harness::own_addr();
    let dir = crate::harness::tempdir();
    let profiles = relay_profile("default", &pebble.directory_url(), &pki, "bypass", "", "")
        .replace(
            "challenges = [\"http-01\", \"dns-01\"]",
            "challenges = [\"http-01\"]",
        );
    let toml = server_toml(dir.path(), at.port(), Some(&dns), &profiles)
        .replace("timeout = \"5s\"", "timeout = \"10s\"");
    let server = start_relay(dir, &toml).await;
    let directory = server.directory("default");

    let home = crate::harness::tempdir();
    let d = home.path().to_path_buf();
    let name = "relay-certbot.example.test";
    let mut args = clients::certbot_common(&d, &directory);
    args.push("certonly".to_owned());
    args.extend(clients::certbot_standalone(at));
    args.extend(["-d".to_owned(), name.to_owned()]);
    let ran: Ran = clients::run("certbot", args, d.clone()).await;
    assert!(
        ran.success(),
        "certbot through the relay failed\n{}\n{}\n--- pebble ---\n{}",
        ran.report(),
        clients::certbot_log_tail(&d),
        pebble.log()
    );
    let cert = d.join("conf/live").join(name).join("cert.pem");
    let leaf = clients::leaf(&cert, &|| ran.report());
    assert_eq!(leaf.sans, vec![name.to_owned()]);
    assert_eq!(
        leaf.issuer, intermediate,
        "certbot's certificate was not issued by Pebble ({})",
        leaf.issuer_text
    );

    let home = crate::harness::tempdir();
    let d = home.path().to_path_buf();
    let name = "relay-lego.example.test";
    let args = clients::lego_http_run(&directory, &d, at, name);
    let ran = clients::run("lego", args, d.clone()).await;
    assert!(
        ran.success(),
        "lego through the relay failed\n{}\n--- pebble ---\n{}",
        ran.report(),
        pebble.log()
    );
    let cert = d.join("certificates").join(format!("{name}.crt"));
    let leaf = clients::leaf(&cert, &|| ran.report());
    assert_eq!(leaf.sans, vec![name.to_owned()]);
    assert_eq!(
        leaf.issuer, intermediate,
        "lego's certificate is not Pebble's"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http01_strategy_pebble_fetches_the_key_authorization_from_our_root_route() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    let pki = TestPki::new();
    // Pebble really validates, fetching from our listener: names resolve to
    // its address through pebble-challtestsrv.
    let at = harness::own_addr();
    let Some(pebble) = Pebble::start(
        &pki,
        PebbleOptions {
            always_valid: false,
            http_port: at.port(),
            dns_server: Some(dns.addr),
            ..PebbleOptions::default()
        },
    ) else {
        return;
    };
    let dir = crate::harness::tempdir();
    let profiles = relay_profile(
        "default",
        &pebble.directory_url(),
        &pki,
        "http01",
        LOCAL_BYPASS,
        "",
    );
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles)
        .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{at}\""));
    let server = start_relay(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;
    let relayed = relay_issue(
        &account,
        &["relay-http.example.test"],
        Duration::from_secs(60),
    )
    .await;
    let (issuer, sans, _) = leaf_of(relayed.chain());
    assert_eq!(sans, vec!["relay-http.example.test".to_owned()]);
    assert_eq!(issuer, subject_of(&pebble.intermediate_pem().await));
    let log = pebble.log();
    let token = log
        .split("/.well-known/acme-challenge/")
        .nth(1)
        .and_then(|rest| {
            rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .next()
        })
        .unwrap_or_else(|| panic!("Pebble's log shows no http-01 fetch:\n{log}"))
        .to_owned();
    // Retracted once the upstream authorization was terminal.
    let (status, _, _) = crate::flow::reqwest_get(&format!(
        "{}/.well-known/acme-challenge/{token}",
        server.base()
    ))
    .await;
    assert_eq!(status, 404, "token {token} is still published");
    // The issuance is audited, attributed to the account that asked, with
    // where the request came from.
    let audit = server
        .running()
        .authority()
        .store()
        .audit_for_order(&relayed.local_id())
        .await
        .expect("audit");
    let issued: Vec<_> = audit
        .iter()
        .filter(|a| a.event == "certificate.issued")
        .collect();
    assert_eq!(issued.len(), 1, "{audit:?}");
    assert!(issued[0].actor.starts_with("account:"), "{:?}", issued[0]);
    assert_eq!(issued[0].client_ip.as_deref(), Some("127.0.0.1"));
    assert!(issued[0].request_id.is_some() && issued[0].serial.is_some());

    // A wildcard cannot be proved over http-01: refused at newOrder, with
    // the strategy that can, and audited.
    let err = account
        .new_order(&NewOrder::new(&[Identifier::Dns(
            "*.wild.example.test".to_owned(),
        )]))
        .await
        .err()
        .expect("a wildcard over http01 must be refused");
    assert_eq!(client::problem_type(&err), "rejectedIdentifier");
    assert!(err.to_string().contains("dns01"), "{err}");
    let refused = server
        .running()
        .authority()
        .store()
        .audit_recent(Some("order.refused"), 10)
        .await
        .expect("audit");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(
        refused[0].problem_type.as_deref(),
        Some("rejectedIdentifier")
    );
    assert_eq!(refused[0].identifiers[0].value, "*.wild.example.test");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns01_strategy_publishes_through_tsig_signed_updates_to_bind_and_obtains_a_wildcard() {
    if !harness::require_program("dig") {
        return;
    }
    let secret = harness::tsig_secret();
    let Some(bind) = Bind::start_dynamic("example.test", "acme-proxy-key", "hmac-sha256", &secret)
    else {
        return;
    };
    let pki = TestPki::new();
    let Some(pebble) = pebble_validating_through(&pki, &bind) else {
        return;
    };
    let dir = crate::harness::tempdir();
    let secret_file = dir.path().join("tsig.secret");
    std::fs::write(&secret_file, format!("{secret}\n")).expect("secret file");
    let profiles = dns01_profile(
        &pebble.directory_url(),
        &pki,
        &bind,
        ("acme-proxy-key", "hmac-sha256"),
        &secret_file,
    );
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let server = start_relay(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;

    // The wildcard and its base name share one _acme-challenge RRset: watch
    // it while the relay runs.
    let record = "_acme-challenge.wild.example.test.";
    let bind = Arc::new(bind);
    let (stop, watcher) = {
        let bind = Arc::clone(&bind);
        watch_most(move || bind.txt(record).len())
    };
    let relayed = relay_issue(
        &account,
        &["*.wild.example.test", "wild.example.test"],
        Duration::from_secs(60),
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().expect("watcher");
    let (issuer, mut sans, _) = leaf_of(relayed.chain());
    sans.sort();
    assert_eq!(
        sans,
        vec![
            "*.wild.example.test".to_owned(),
            "wild.example.test".to_owned()
        ]
    );
    assert_eq!(issuer, subject_of(&pebble.intermediate_pem().await));
    assert_eq!(
        most, 2,
        "both values (the wildcard's and the base name's) must be in the RRset at once"
    );
    // Every value this relay added is gone, and only those.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !bind.txt(record).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        bind.txt(record).is_empty(),
        "left behind: {:?}",
        bind.txt(record)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns01_cleanup_removes_only_the_value_this_attempt_added() {
    if !harness::require_program("dig") {
        return;
    }
    let secret = harness::tsig_secret();
    let Some(bind) = Bind::start_dynamic("example.test", "k1", "hmac-sha512", &secret) else {
        return;
    };
    let pki = TestPki::new();
    let Some(pebble) = pebble_validating_through(&pki, &bind) else {
        return;
    };
    // Someone else's value already in the RRset (another order, another
    // tool) must survive our cleanup.
    let record = "_acme-challenge.shared.example.test.";
    let dir = crate::harness::tempdir();
    let secret_file = dir.path().join("tsig.secret");
    std::fs::write(&secret_file, &secret).expect("secret file");
    let status = std::process::Command::new("nsupdate")
        .arg("-y")
        .arg(format!("hmac-sha512:k1:{secret}"))
        .stdin({
            let input = format!(
                "server {} {}\nupdate add {record} 60 TXT \"someone-else\"\nsend\n",
                bind.addr.ip(),
                bind.addr.port()
            );
            let path = dir.path().join("nsupdate.txt");
            std::fs::write(&path, input).expect("nsupdate input");
            std::fs::File::open(path).expect("nsupdate input")
        })
        .status();
    if status.is_err() && !harness::require_program("nsupdate") {
        return;
    }
    assert!(status.expect("nsupdate").success(), "nsupdate add");
    assert_eq!(bind.txt(record), vec!["someone-else".to_owned()]);

    let profiles = dns01_profile(
        &pebble.directory_url(),
        &pki,
        &bind,
        ("k1", "hmac-sha512"),
        &secret_file,
    );
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let dir2 = crate::harness::tempdir();
    let toml = toml.replace(
        &format!("data_dir = \"{}\"", dir.path().display()),
        &format!("data_dir = \"{}\"", dir2.path().display()),
    );
    let server = start_relay(dir2, &toml).await;
    let account = client::account(&server.directory("default")).await;
    let relayed = relay_issue(&account, &["shared.example.test"], Duration::from_secs(60)).await;
    relayed.chain();
    let deadline = Instant::now() + Duration::from_secs(5);
    while bind.txt(record).len() > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        bind.txt(record),
        vec!["someone-else".to_owned()],
        "cleanup must delete by value, not the whole RRset"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relay_profiles_to_two_pebbles_in_one_process_both_issue() {
    let pki = TestPki::new();
    let opts = || PebbleOptions {
        always_valid: true,
        ..PebbleOptions::default()
    };
    let (Some(alpha), Some(beta)) = (Pebble::start(&pki, opts()), Pebble::start(&pki, opts()))
    else {
        return;
    };
    let dir = crate::harness::tempdir();
    let profiles = format!(
        "{}\n{}",
        relay_profile(
            "alpha",
            &alpha.directory_url(),
            &pki,
            "bypass",
            LOCAL_BYPASS,
            ""
        ),
        relay_profile(
            "beta",
            &beta.directory_url(),
            &pki,
            "bypass",
            LOCAL_BYPASS,
            ""
        )
    );
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let server = start_relay(dir, &toml).await;
    for (profile, pebble) in [("alpha", &alpha), ("beta", &beta)] {
        let account = client::account(&server.directory(profile)).await;
        let name = format!("{profile}.example.test");
        let relayed = relay_issue(&account, &[&name], Duration::from_secs(30)).await;
        let (issuer, sans, _) = leaf_of(relayed.chain());
        assert_eq!(sans, vec![name]);
        assert_eq!(
            issuer,
            subject_of(&pebble.intermediate_pem().await),
            "profile {profile} must issue from its own upstream"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_profile_without_an_upstream_account_stops_start_up_saying_what_to_run() {
    let pki = TestPki::new();
    let dir = crate::harness::tempdir();
    let profiles = relay_profile(
        "edge",
        "https://127.0.0.1:9/dir",
        &pki,
        "bypass",
        LOCAL_BYPASS,
        "",
    );
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let config = Config::from_toml(&toml).expect("config");
    let err = acme_proxy::server::start(config, Arc::new(SystemClock))
        .await
        .expect_err("start-up must refuse");
    let text = format!("{err:#}");
    assert!(
        text.contains("acme-proxy upstream register --profile edge"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_register_creates_an_owner_only_key_once_and_show_and_orders_report_it() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let dir = crate::harness::tempdir();
    let profiles = bypass_profile(&pebble.directory_url(), &pki, "");
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let config_path = dir.path().join("acme-proxy.toml");
    std::fs::write(&config_path, &toml).expect("config");
    let cli = |args: &[&str]| {
        let out = harness::under_umask_022()
            .args(args)
            .arg("--config")
            .arg(&config_path)
            .env_remove("ACME_PROXY_CONFIG")
            .output()
            .expect("run acme-proxy");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, before, err) = cli(&["upstream", "show"]);
    assert!(ok, "{err}");
    assert!(
        before.contains("upstream register --profile default"),
        "{before}"
    );

    let (ok, out, err) = cli(&["upstream", "register"]);
    assert!(ok, "register failed: {out}{err}");
    assert!(out.contains("created the upstream account key"), "{out}");
    let key = dir.path().join("upstream").join("default.key");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key)
        .expect("key file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the key file must be owner-only");
    // Under umask 022 too, what register made is private: the key's
    // directory and the database (its WAL and shared memory, removed when
    // the command closed it, are checked while a server runs elsewhere).
    let mut made = harness::not_private(&dir.path().join("upstream"));
    if !harness::on_postgres() {
        made.extend(harness::not_private(&dir.path().join("acme-proxy.db")));
    }
    assert_eq!(made, vec![]);
    let (ok, shown, err) = cli(&["upstream", "show", "--json"]);
    assert!(ok, "{err}");
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("JSON");
    let url = shown[0]["account_url"]
        .as_str()
        .expect("account URL")
        .to_owned();
    assert!(
        url.starts_with(&format!("https://{}", pebble.addr)),
        "{url}"
    );

    // Registering again keeps the key and finds the same account.
    let key_before = std::fs::read(&key).expect("key");
    let (ok, out, err) = cli(&["upstream", "register", "--profile", "default"]);
    assert!(ok, "{err}");
    assert!(!out.contains("created"), "{out}");
    assert_eq!(std::fs::read(&key).expect("key"), key_before);
    assert!(out.contains(&url), "{out}");

    // The server starts on the recorded account and relays; the mapping is
    // visible to operators.
    let server = TestServer::start_in(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;
    let relayed = relay_issue(&account, &["mapped.example.test"], Duration::from_secs(30)).await;
    relayed.chain();
    let (ok, listed, err) = cli(&["upstream", "orders", "--status", "valid", "--json"]);
    assert!(ok, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    let row = &listed[0];
    assert_eq!(row["order"], relayed.local_id());
    assert!(
        row["upstream_order"]
            .as_str()
            .is_some_and(|u| u.starts_with(&format!("https://{}", pebble.addr))),
        "{row}"
    );
    assert!(row["certificate_url"].is_string(), "{row}");
    assert_eq!(row["upstream"], "primary", "{row}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_relayed_certificate_revokes_it_upstream_too() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let dir = crate::harness::tempdir();
    let profiles = bypass_profile(&proxy.directory_url(), &pki, "");
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let server = start_relay(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;
    let relayed = relay_issue(&account, &["revoked.example.test"], Duration::from_secs(30)).await;
    let (_, pem) = x509_parser::pem::parse_x509_pem(relayed.chain().as_bytes()).expect("PEM");
    let der = rustls::pki_types::CertificateDer::from(pem.contents.clone());
    account
        .revoke(&instant_acme::RevocationRequest {
            certificate: &der,
            reason: Some(instant_acme::RevocationReason::KeyCompromise),
        })
        .await
        .expect("revocation accepted");
    let revokes: Vec<_> = proxy
        .requests()
        .into_iter()
        .filter(|(m, p, _)| m == "POST" && p.contains("revoke-cert"))
        .collect();
    assert_eq!(revokes.len(), 1, "one upstream revocation: {revokes:?}");
    assert_eq!(revokes[0].2, 200, "the upstream accepted it");
    server.stop().await;
}

/// The relay profile of the fault tests: through `proxy`, short request
/// timeout, a long attempt budget (so a hang that cost the budget would
/// show).
async fn fault_server(pki: &TestPki, proxy: &FaultProxy) -> TestServer {
    let dir = crate::harness::tempdir();
    let profiles = bypass_profile(&proxy.directory_url(), pki, "");
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    start_relay(dir, &toml).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_faults_at_finalize_and_in_the_background_are_retried_and_the_order_ends_valid() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let server = fault_server(&pki, &proxy).await;
    let account = client::account(&server.directory("default")).await;
    let faults = [
        Fault::Html502,
        Fault::Unavailable503,
        Fault::RateLimited429 {
            retry_after_secs: 1,
        },
        Fault::Reset,
        Fault::Hang,
    ];
    // newOrder is called inside the client's finalize request; finalize,
    // the order and its authorizations are the job's (background) path.
    let mut n = 0;
    for path in [NEW_ORDER, FINALIZE, "my-order", "authZ"] {
        for fault in faults
            .iter()
            .cloned()
            .chain((path == FINALIZE).then_some(Fault::ResetAfterForward))
        {
            n += 1;
            let applied = proxy.faults_applied();
            proxy.inject(Match::PathContains(path), fault.clone());
            let name = format!("fault{n}.example.test");
            let relayed = relay_issue(&account, &[&name], Duration::from_secs(45)).await;
            relayed.chain();
            assert!(
                !relayed.seen.contains(&OrderStatus::Invalid),
                "{fault:?} on {path}: the client saw invalid: {:?}",
                relayed.seen
            );
            assert_eq!(
                proxy.faults_applied(),
                applied + 1,
                "{fault:?} on {path} was not exercised"
            );
            if matches!(fault, Fault::RateLimited429 { .. }) {
                // Retry-After: 1 is honoured, wherever the 429 came from.
                assert!(
                    relayed.finalize_to_end >= Duration::from_secs(1),
                    "a 429 with Retry-After: 1 on {path} was retried after {:?}",
                    relayed.finalize_to_end
                );
            }
            if fault == Fault::Hang {
                // One request timeout (2 s) and a backoff, not the 60 s budget.
                assert!(
                    relayed.finalize_to_end < Duration::from_secs(15),
                    "a hang on {path} cost {:?}",
                    relayed.finalize_to_end
                );
            }
            eprintln!(
                "{fault:?} on {path}: valid after {:?}",
                relayed.finalize_to_end
            );
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_boots_and_takes_orders_while_the_upstream_answers_503() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let dir = crate::harness::tempdir();
    let profiles = bypass_profile(&proxy.directory_url(), &pki, "");
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    register_upstream_accounts(&toml).await;
    proxy.set_always(Match::Any, Some(Fault::Unavailable503));
    let server = TestServer::start_in(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;
    let order = tokio::spawn({
        let account = account.clone();
        async move { relay_issue(&account, &["outage.example.test"], Duration::from_secs(45)).await }
    });
    // The relay keeps retrying (three refused requests here); then the
    // upstream comes back.
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.faults_applied() < 3 {
        assert!(
            Instant::now() < deadline,
            "the outage was not exercised: {} faults in 30 s",
            proxy.faults_applied()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.set_always(Match::Any, None);
    let relayed = order.await.expect("order task");
    relayed.chain();
    assert!(
        !relayed.seen.contains(&OrderStatus::Invalid),
        "{:?}",
        relayed.seen
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stated_refusal_ends_the_order_invalid_after_exactly_one_abandon_with_the_reason_audited()
{
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let server = fault_server(&pki, &proxy).await;
    let account = client::account(&server.directory("default")).await;
    proxy.inject(Match::PathContains(FINALIZE), Fault::Forbidden403);
    let relayed = relay_issue(&account, &["refused.example.test"], Duration::from_secs(30)).await;
    let error = relayed
        .result
        .as_ref()
        .expect_err("a 403 is the CA's decision");
    assert!(error.contains("serverInternal"), "{error}");
    assert!(
        !error.contains("upstream says no"),
        "the client must not see the upstream's words: {error}"
    );
    let store = &server.running().authority().store().clone();
    let failed = the_one_issue_failure(store, &relayed).await;
    assert!(
        failed
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("upstream says no"),
        "{:?}",
        failed
    );
    assert!(failed.actor.starts_with("account:"), "{:?}", failed);
    let mapping = store
        .upstream_order(&relayed.local_id())
        .await
        .expect("mapping")
        .expect("row");
    assert_eq!(mapping.status.as_str(), "invalid");
    assert!(
        mapping
            .error
            .as_deref()
            .unwrap_or("")
            .contains("upstream says no")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_authorization_turned_invalid_ends_the_order_invalid_with_the_cas_reason() {
    let pki = TestPki::new();
    // Pebble validates for real and fetches http-01 from a port where
    // nothing listens: the upstream authorization turns invalid.
    let Some(pebble) = Pebble::start(
        &pki,
        PebbleOptions {
            always_valid: false,
            http_port: harness::free_port(),
            ..PebbleOptions::default()
        },
    ) else {
        return;
    };
    let dir = crate::harness::tempdir();
    let profiles = relay_profile(
        "default",
        &pebble.directory_url(),
        &pki,
        "http01",
        LOCAL_BYPASS,
        "",
    );
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let server = start_relay(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;
    let relayed = relay_issue(
        &account,
        &["unreachable.example.test"],
        Duration::from_secs(60),
    )
    .await;
    assert!(relayed.result.is_err(), "the order must end invalid");
    let failed = the_one_issue_failure(server.running().authority().store(), &relayed).await;
    let detail = failed.detail.as_deref().unwrap_or("");
    assert!(detail.contains("Invalid"), "{detail}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cancels_a_stuck_relay_and_the_order_is_invalid_naming_them() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let server = fault_server(&pki, &proxy).await;
    let account = client::account(&server.directory("default")).await;
    // The upstream is down for good: the relay keeps retrying.
    proxy.set_always(Match::PathContains(NEW_ORDER), Some(Fault::Unavailable503));
    let order = tokio::spawn({
        let account = account.clone();
        async move { relay_issue(&account, &["stuck.example.test"], Duration::from_secs(30)).await }
    });
    let store = server.running().authority().store().clone();
    let job = {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let jobs =
                acme_proxy::admin::ops::list_jobs(&store, Some("signer_relay_issue"), None, 10)
                    .await
                    .expect("jobs");
            if let Some(j) = jobs.into_iter().find(|j| j.attempts >= 2) {
                break j;
            }
            assert!(Instant::now() < deadline, "the relay job never retried");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(
        job.max_attempts, 200,
        "relays ride out long outages by default"
    );
    acme_proxy::admin::ops::cancel_job(&store, &SystemClock, job.id, "operator:alice")
        .await
        .expect("cancel");
    let relayed = order.await.expect("order task");
    assert!(relayed.result.is_err(), "cancelled relay must end invalid");
    let failed = the_one_issue_failure(&store, &relayed).await;
    assert_eq!(failed.actor, "operator:alice");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_relays_survive_repeated_sigkills_each_issued_once_upstream_and_none_left_processing()
{
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    // The proxy only counts: every upstream finalize passes through it.
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let dir = crate::harness::tempdir();
    let data = dir.path().join("data");
    // One address for every start: the client's URLs must stay valid.
    let at = harness::own_addr();
    // Few relays at once and a slow poll, so that kills land mid-flight.
    let profiles = bypass_profile(&proxy.directory_url(), &pki, "")
        .replace("poll_interval = \"100ms\"", "poll_interval = \"300ms\"");
    let toml = server_toml(&data, harness::free_port(), None, &profiles)
        .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{at}\""))
        .replace("[jobs]\n", "[jobs]\nconcurrency = 4\n");
    register_upstream_accounts(&toml).await;
    let config_path = dir.path().join("acme-proxy.toml");
    std::fs::write(&config_path, &toml).expect("config");
    let args = ["serve", "--config", config_path.to_str().expect("utf-8")];
    let (mut child, directory) = harness::spawn_binary(dir.path(), &args, &[]);

    let account = client::account(&directory).await;
    let mut ready = Vec::new();
    for i in 0..50 {
        ready.push(ready_order(&account, &[&format!("crash{i}.example.test")]).await);
    }
    let mut finalizing = tokio::task::JoinSet::new();
    for mut order in ready {
        finalizing.spawn(async move {
            order.finalize().await.expect("finalize");
            assert_ne!(order.state().status, OrderStatus::Invalid);
            order.url().to_owned()
        });
    }
    let urls: Vec<String> = finalizing.join_all().await;
    assert_eq!(urls.len(), 50);

    let database = Config::from_toml(&toml).expect("config").database_url();
    let mut interrupted = Vec::new();
    let mut seen = 0;
    for _ in 0..3 {
        // The process at work has sent ten more requests upstream: the
        // kill lands while it is relaying.
        let deadline = Instant::now() + Duration::from_secs(30);
        while proxy.requests().len() < seen + 10 {
            assert!(
                Instant::now() < deadline,
                "no upstream progress within 30 s of a (re)start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seen = proxy.requests().len();
        drop(child); // SIGKILL
        let store = Store::open(&database, &StoreOptions::default())
            .await
            .expect("open");
        interrupted.push(
            store
                .upstream_orders(Some("processing".parse().expect("a status")), None, 100)
                .await
                .expect("mapping rows")
                .len(),
        );
        store.close().await;
        child = harness::spawn_binary(dir.path(), &args, &[]).0;
    }
    let restarted = Instant::now();
    assert!(
        interrupted[0] > 0,
        "the first kill found no relay in flight; the test proves nothing"
    );

    all_valid(&account, urls.clone(), restarted + Duration::from_secs(90)).await;
    let all_valid_after = restarted.elapsed();
    eprintln!(
        "in flight at each kill: {interrupted:?}; all 50 valid {all_valid_after:?} after the last restart"
    );

    // Each upstream order was finalized exactly once: a re-attempt re-reads
    // the upstream order and never finalizes it again.
    let finalizes: Vec<(String, String, u16)> = proxy
        .requests()
        .into_iter()
        .filter(|(m, p, _)| m == "POST" && p.contains(FINALIZE))
        .collect();
    let accepted = finalizes.iter().filter(|(_, _, s)| *s == 200).count();
    assert_eq!(accepted, 50, "upstream finalizes: {finalizes:?}");
    let mut paths: Vec<&str> = finalizes.iter().map(|(_, p, _)| p.as_str()).collect();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), 50, "an upstream order was finalized twice");

    drop(child);
    let store = Store::open(&database, &StoreOptions::default())
        .await
        .expect("open");
    let rows = store.upstream_orders(None, None, 1000).await.expect("rows");
    assert_eq!(rows.len(), 50, "a relay was lost");
    assert!(
        rows.iter().all(|r| r.status.as_str() == "valid"),
        "{:?}",
        rows.iter().map(|r| &r.status).collect::<Vec<_>>()
    );
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_relay_latency_and_upstream_requests_per_issuance_over_fifty_orders() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let server = fault_server(&pki, &proxy).await;
    let account = client::account(&server.directory("default")).await;
    // Warm the relay's account (the directory is fetched on first use).
    relay_issue(&account, &["warm.example.test"], Duration::from_secs(30))
        .await
        .chain();
    let before = proxy.requests().len();
    let mut streams = tokio::task::JoinSet::new();
    for s in 0..5 {
        let account = account.clone();
        streams.spawn(async move {
            let mut took = Vec::new();
            for i in 0..10 {
                let name = format!("latency{s}-{i}.example.test");
                let relayed = relay_issue(&account, &[&name], Duration::from_secs(30)).await;
                relayed.chain();
                took.push(relayed.finalize_to_end);
            }
            took
        });
    }
    let mut took: Vec<Duration> = streams.join_all().await.into_iter().flatten().collect();
    took.sort();
    let requests = proxy.requests().len() - before;
    let median = took[took.len() / 2];
    let per_issuance = requests as f64 / 50.0;
    eprintln!(
        "bypass relay, 50 orders (5 streams): finalize→valid median {median:?}, p90 {:?}, max {:?}; {per_issuance:.1} upstream requests per issuance",
        took[took.len() * 9 / 10],
        took[took.len() - 1]
    );
    // An issuance is newNonce, newOrder, the order, one authorization, the
    // challenge, polls, finalize, the certificate: a dozen requests, not a
    // retry storm.
    assert!(
        per_issuance <= 16.0,
        "{per_issuance} upstream requests per issuance"
    );
    assert!(median < Duration::from_secs(5), "median {median:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_register_with_external_account_binding_reads_the_key_from_a_file_or_stdin() {
    use base64::Engine;
    let pki = TestPki::new();
    let hmac = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([7u8; 32]);
    let Some(pebble) = Pebble::start(
        &pki,
        PebbleOptions {
            always_valid: true,
            eab: Some(("kid-1".to_owned(), hmac.clone())),
            ..PebbleOptions::default()
        },
    ) else {
        return;
    };
    let dir = crate::harness::tempdir();
    let profiles = bypass_profile(&pebble.directory_url(), &pki, "");
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let config_path = dir.path().join("acme-proxy.toml");
    std::fs::write(&config_path, &toml).expect("config");
    let cli = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(harness::binary())
            .args(args)
            .arg("--config")
            .arg(&config_path)
            .env_remove("ACME_PROXY_CONFIG")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run acme-proxy");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        let out = child.wait_with_output().expect("wait");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    // Without EAB the upstream refuses, and nothing is recorded.
    let (ok, out) = cli(&["upstream", "register"], "");
    assert!(!ok, "registration without EAB must fail: {out}");
    assert!(out.contains("externalAccount"), "{out}");
    std::fs::remove_file(dir.path().join("upstream").join("default.key")).ok();
    // A wrong MAC key is refused too.
    let (ok, out) = cli(
        &[
            "upstream",
            "register",
            "--eab-kid",
            "kid-1",
            "--eab-hmac-key-file",
            "-",
        ],
        &base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([8u8; 32]),
    );
    assert!(!ok, "a wrong EAB key must fail: {out}");
    std::fs::remove_file(dir.path().join("upstream").join("default.key")).ok();
    // The right key, from stdin: registered.
    let (ok, out) = cli(
        &[
            "upstream",
            "register",
            "--eab-kid",
            "kid-1",
            "--eab-hmac-key-file",
            "-",
        ],
        &format!("{hmac}\n"),
    );
    assert!(ok, "EAB registration failed: {out}");
    assert!(out.contains("is registered at"), "{out}");
    assert!(!out.contains(&hmac), "the secret was echoed: {out}");
    // And the server relays with that account.
    let server = TestServer::start_in(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;
    relay_issue(&account, &["eab.example.test"], Duration::from_secs(30))
        .await
        .chain();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_profile_is_not_mounted_waits_without_spending_attempts_and_completes_once_it_is()
 {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let data = crate::harness::tempdir();
    let profiles = bypass_profile(&proxy.directory_url(), &pki, "");
    // One address for all three starts: the client's URLs must stay valid.
    let listen = format!("listen = \"{}\"", harness::own_addr());
    let toml = server_toml(data.path(), harness::free_port(), None, &profiles)
        .replace("listen = \"127.0.0.1:0\"", &listen);
    register_upstream_accounts(&toml).await;

    // The upstream is down while the client finalizes: the order is left
    // processing with its job.
    proxy.set_always(Match::Any, Some(Fault::Unavailable503));
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let account = client::account(&server.directory("default")).await;
    let mut order = ready_order(&account, &["unmounted.example.test"]).await;
    order.finalize().await.expect("finalize");
    assert_eq!(order.state().status, OrderStatus::Processing);
    let order_url = order.url().to_owned();
    let order_id = order_url.rsplit('/').next().expect("id").to_owned();
    server.stop().await;

    // Restarted without the relay profile (another profile instead): its
    // job cannot find its backend and waits.
    let unmounted = server_toml(
        data.path(),
        harness::free_port(),
        None,
        "[profiles.other]\n",
    )
    .replace("listen = \"127.0.0.1:0\"", &listen);
    let server = TestServer::start_in(crate::harness::tempdir(), &unmounted).await;
    let store = server.running().authority().store().clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    let job = loop {
        let jobs = acme_proxy::admin::ops::list_jobs(&store, Some("signer_relay_issue"), None, 10)
            .await
            .expect("jobs");
        let job = jobs
            .into_iter()
            .find(|j| j.key == order_id)
            .expect("the relay job");
        if job
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("not mounted"))
        {
            break job;
        }
        assert!(
            Instant::now() < deadline,
            "never tried without its profile: {job:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        job.status.as_str(),
        "queued",
        "retried, not failed: {job:?}"
    );
    // Tried again and again while unmounted (the backoff is at most 1 s
    // here), without spending its attempts: it waits however long.
    let mut runs = vec![job.run_at.clone()];
    let deadline = Instant::now() + Duration::from_secs(20);
    while runs.len() < 3 {
        let jobs = acme_proxy::admin::ops::list_jobs(&store, Some("signer_relay_issue"), None, 10)
            .await
            .expect("jobs");
        let again = jobs
            .into_iter()
            .find(|j| j.key == order_id)
            .expect("the relay job");
        if again.status.as_str() == "running" {
            // Claimed this instant: the claim counts until it is taken back.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        assert_eq!(again.status.as_str(), "queued", "{again:?}");
        assert_eq!(
            again.attempts, job.attempts,
            "a wait for the profile spent an attempt: {again:?}"
        );
        if runs.last() != Some(&again.run_at) {
            runs.push(again.run_at);
        }
        assert!(Instant::now() < deadline, "never tried again: {runs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let row = store.order(&order_id).await.expect("order").expect("row");
    assert_eq!(row.status.as_str(), "processing");
    server.stop().await;

    // Mounted again and the upstream back: the same order completes.
    proxy.set_always(Match::Any, None);
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let order = account.order(order_url.clone()).await.expect("poll");
        let mut order = order;
        match order.state().status {
            OrderStatus::Valid => break,
            OrderStatus::Invalid => panic!("the order ended invalid: {:?}", order.state().error),
            _ => {}
        }
        assert!(Instant::now() < deadline, "the relay did not complete");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_exhausts_its_attempts_is_abandoned_once_and_never_left_processing() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let dir = crate::harness::tempdir();
    let profiles = bypass_profile(&proxy.directory_url(), &pki, "max_attempts = 3");
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let server = start_relay(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;
    proxy.set_always(Match::PathContains(NEW_ORDER), Some(Fault::Html502));
    let relayed = relay_issue(
        &account,
        &["exhausted.example.test"],
        Duration::from_secs(30),
    )
    .await;
    assert!(relayed.result.is_err(), "the order must end invalid");
    let failed = the_one_issue_failure(server.running().authority().store(), &relayed).await;
    let detail = failed.detail.as_deref().unwrap_or("");
    assert!(detail.contains("gave up after 3 attempts"), "{detail}");
    // One newOrder inside finalize, then one per attempt.
    let new_orders = proxy
        .requests()
        .iter()
        .filter(|(m, p, _)| m == "POST" && p.contains(NEW_ORDER))
        .count();
    assert_eq!(new_orders, 4, "{:?}", proxy.requests());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_issuance_and_an_abandoned_relay_are_notified() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let receiver = harness::Receiver::start().await;
    let dir = crate::harness::tempdir();
    let profiles = format!(
        "{}\n[profiles.default.notify.webhooks.ops]\nurl = \"{}\"\nevents = [\"certificate.issued\", \"relay.abandoned\"]\n",
        bypass_profile(&proxy.directory_url(), &pki, ""),
        receiver.url("/hook")
    );
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let server = start_relay(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;
    let issued = relay_issue(&account, &["told.example.test"], Duration::from_secs(30)).await;
    let (_, _, serial) = leaf_of(issued.chain());
    proxy.inject(Match::PathContains(FINALIZE), Fault::Forbidden403);
    let refused = relay_issue(&account, &["untold.example.test"], Duration::from_secs(30)).await;
    assert!(refused.result.is_err());
    receiver
        .wait_for("both notices", Duration::from_secs(10), |got| {
            got.len() >= 2
        })
        .await;
    let got = receiver.received();
    let notice = |event: &str| {
        got.iter()
            .find(|r| r.body["event"] == event)
            .unwrap_or_else(|| panic!("no {event}: {got:#?}"))
            .body
            .clone()
    };
    let told = notice("certificate.issued");
    assert_eq!(told["order"], issued.local_id());
    assert_eq!(told["serial"], hex::encode(&serial));
    let abandoned = notice("relay.abandoned");
    assert_eq!(abandoned["order"], refused.local_id());
    assert!(
        abandoned["detail"]
            .as_str()
            .is_some_and(|d| d.contains("upstream says no")),
        "{abandoned}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_refusal_at_finalize_reaches_the_client_generically_once_audited_and_the_order_stays_ready()
 {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let server = fault_server(&pki, &proxy).await;
    let account = client::account(&server.directory("default")).await;
    let mut order = ready_order(&account, &["refused-now.example.test"]).await;
    // The upstream refuses the newOrder for our account: not the client's
    // business (unauthorized is about our upstream account), so generic.
    proxy.inject(Match::PathContains(NEW_ORDER), Fault::Forbidden403);
    let err = order.finalize().await.expect_err("refused");
    assert_eq!(client::problem_type(&err), "serverInternal");
    assert!(!err.to_string().contains("upstream says no"), "{err}");
    let local_id = order.url().rsplit('/').next().expect("id").to_owned();
    let store = &server.running().authority().store().clone();
    assert_eq!(
        store
            .order(&local_id)
            .await
            .expect("order")
            .expect("row")
            .status
            .as_str(),
        "ready",
        "a refusal at finalize leaves the order ready"
    );
    let rows = store.audit_for_order(&local_id).await.expect("audit");
    let failed: Vec<_> = rows
        .iter()
        .filter(|r| r.event == "certificate.issue_failed")
        .collect();
    assert_eq!(failed.len(), 1, "one refusal, one row: {rows:#?}");
    assert!(
        failed[0]
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("upstream says no"),
        "{:?}",
        failed[0]
    );
    // And once the upstream accepts, the same order is issued.
    order.finalize().await.expect("finalize again");
    let chain = order
        .poll_certificate(&client::retry())
        .await
        .expect("certificate");
    assert!(chain.contains("BEGIN CERTIFICATE"));
    server.stop().await;
}

/// Issue 7, must-show 1: a certbot issuance, a refused order (a CSR for
/// other names), a revocation and a relay abandon, each read back with
/// `acme-proxy audit list --json` — actor, client address, identifiers and
/// reason — and the Prometheus counters equal to the audit counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_issuance_a_bad_csr_a_revocation_and_a_relay_abandon_are_audited_and_counted_alike()
{
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("certbot") {
        return;
    }
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let at = harness::own_addr();
    let dir = crate::harness::tempdir();
    // "default": the embedded CA, validating for real; "edge": a relay.
    let profiles = format!(
        "[profiles.default]\n\n{}\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
        relay_profile(
            "edge",
            &proxy.directory_url(),
            &pki,
            "bypass",
            LOCAL_BYPASS,
            ""
        )
    );
    let toml = server_toml(dir.path(), at.port(), Some(&dns), &profiles);
    let (_etc, config) = harness::config_file(&toml);
    let server = start_relay(dir, &toml).await;

    // certbot obtains, then revokes (keyCompromise), on "default".
    let home = crate::harness::tempdir();
    let d = home.path().to_path_buf();
    let name = "audited-certbot.example.test";
    let args = clients::certbot_certonly_standalone(&d, &server.directory("default"), at, name);
    let ran = clients::run("certbot", args, d.clone()).await;
    assert!(
        ran.success(),
        "{}\n{}",
        ran.report(),
        clients::certbot_log_tail(&d)
    );
    let cert_path = d.join("conf").join("live").join("t").join("cert.pem");
    let mut args = vec!["revoke".to_owned()];
    args.extend(clients::certbot_common(&d, &server.directory("default")));
    args.extend(
        [
            "--cert-path",
            cert_path.to_str().expect("utf-8"),
            "--reason",
            "keycompromise",
            "--no-delete-after-revoke",
        ]
        .map(str::to_owned),
    );
    let ran = clients::run("certbot", args, d.clone()).await;
    assert!(
        ran.success(),
        "{}\n{}",
        ran.report(),
        clients::certbot_log_tail(&d)
    );

    // A CSR for other names than the order's: badCSR, on "edge".
    let edge = client::account(&server.directory("edge")).await;
    let edge_id = edge.id().rsplit('/').next().expect("id").to_owned();
    let mut order = ready_order(&edge, &["ordered.example.test"]).await;
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params =
        rcgen::CertificateParams::new(vec!["other.example.test".to_owned()]).expect("params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params.serialize_request(&key).expect("CSR");
    let err = order.finalize_csr(csr.der()).await.expect_err("badCSR");
    assert_eq!(client::problem_type(&err), "badCSR");

    // The upstream refuses the relayed finalize: the relay is abandoned.
    proxy.inject(Match::PathContains(FINALIZE), Fault::Forbidden403);
    let relayed = relay_issue(&edge, &["abandoned.example.test"], Duration::from_secs(30)).await;
    assert!(relayed.result.is_err(), "{:?}", relayed.seen);

    let out = harness::run_cli(&config, &["audit", "list", "--json"], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).expect("JSON");
    let find = |event: &str, identifier: &str| {
        rows.iter()
            .find(|r| r["event"] == event && r["identifiers"][0] == identifier)
            .unwrap_or_else(|| panic!("no {event} for {identifier} in {rows:#?}"))
            .clone()
    };
    let issued = find("certificate.issued", name);
    let revoked = find("certificate.revoked", name);
    let refused = find("certificate.issue_failed", "ordered.example.test");
    let abandoned = find("certificate.issue_failed", "abandoned.example.test");
    for row in [&issued, &revoked, &refused, &abandoned] {
        assert_eq!(row["client_ip"], "127.0.0.1", "{row:#}");
        assert!(
            row["actor"]
                .as_str()
                .is_some_and(|a| a.starts_with("account:")),
            "{row:#}"
        );
        assert!(row["request_id"].is_string(), "{row:#}");
    }
    assert_eq!(issued["actor"], revoked["actor"]);
    assert!(
        issued["user_agent"]
            .as_str()
            .is_some_and(|ua| ua.contains("certbot")),
        "{issued:#}"
    );
    assert_eq!(revoked["serial"], issued["serial"]);
    assert_eq!(revoked["detail"], "reason 1");
    assert_eq!(refused["actor"], format!("account:{edge_id}").as_str());
    assert_eq!(refused["outcome"], "refused");
    assert_eq!(refused["problem_type"], "badCSR");
    assert!(
        refused["detail"]
            .as_str()
            .is_some_and(|d| d.contains("other.example.test")),
        "{refused:#}"
    );
    assert_eq!(abandoned["profile"], "edge");
    assert_eq!(abandoned["actor"], format!("account:{edge_id}").as_str());
    assert!(
        abandoned["detail"]
            .as_str()
            .is_some_and(|d| d.contains("upstream says no")),
        "the upstream's reason, for operators: {abandoned:#}"
    );

    // The counters move with the rows they mirror.
    let metrics_url = format!(
        "http://{}/metrics",
        server.running().metrics_addr.expect("metrics listener")
    );
    let (status, _, body) = crate::flow::reqwest_get(&metrics_url).await;
    assert_eq!(status, 200);
    let (_, samples) = crate::metrics::parse(&String::from_utf8(body).expect("UTF-8"));
    let mut expected: std::collections::BTreeMap<String, f64> = Default::default();
    for r in &rows {
        let series = format!(
            "acme_proxy_audit_events_total{{event=\"{}\",outcome=\"{}\",profile=\"{}\"}}",
            r["event"].as_str().unwrap_or(""),
            r["outcome"].as_str().unwrap_or(""),
            r["profile"].as_str().unwrap_or("")
        );
        *expected.entry(series).or_default() += 1.0;
    }
    let exported: std::collections::BTreeMap<String, f64> = samples
        .iter()
        .filter(|(k, v)| k.starts_with("acme_proxy_audit_events_total{") && **v > 0.0)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    assert_eq!(
        exported, expected,
        "the counters and the audit log disagree"
    );
    let sample = |series: &str| samples.get(series).copied().unwrap_or(0.0);
    assert_eq!(
        sample("acme_proxy_certificates_issued_total{profile=\"default\"}"),
        1.0
    );
    assert_eq!(
        sample("acme_proxy_certificate_failures_total{profile=\"edge\",reason=\"badCSR\"}"),
        1.0
    );
    let abandoned_reason = abandoned["problem_type"]
        .as_str()
        .unwrap_or("serverInternal");
    assert_eq!(
        sample(&format!(
            "acme_proxy_certificate_failures_total{{profile=\"edge\",reason=\"{abandoned_reason}\"}}"
        )),
        1.0
    );
    server.stop().await;
}

/// The leaf's lifetime (notAfter − notBefore) in seconds.
fn lifetime_of(chain: &str) -> i64 {
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).expect("chain PEM");
    let cert = pem.parse_x509().expect("leaf parses");
    cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_profile_forwards_the_certificate_profile_the_upstream_advertises_and_answers_the_upstreams_renewal_window()
 {
    // Debian's Pebble predates certificate profiles: the upstream is a
    // second acme-proxy, over TLS with a certificate of the test PKI,
    // offering "classic" (90 days) and "shortlived" (6 days).
    let pki = TestPki::new();
    let (cert, key) = pki.server_cert(&["127.0.0.1"]);
    let upstream = TestServer::start_with_toml(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{{data_dir}}\"\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n\n\
         [profiles.default]\nbypass = true\ndefault_certificate_profile = \"classic\"\n\
         [profiles.default.certificate_profiles.classic]\ndescription = \"90 days\"\n\
         [profiles.default.certificate_profiles.shortlived]\ndescription = \"6 days\"\nvalidity = \"6d\"\n\
         [profiles.default.signer]\ntype = \"local_ca\"\nrenewal_window = [0.1, 0.2]\n",
        cert.display(),
        key.display()
    ))
    .await;
    let dir = crate::harness::tempdir();
    let profiles = format!(
        "{}\n\
         [profiles.edge.certificate_profiles.classic]\ndescription = \"the upstream's default\"\n\
         [profiles.edge.certificate_profiles.shortlived]\ndescription = \"short-lived, from the upstream\"\n\
         [profiles.edge.certificate_profiles.internal]\ndescription = \"ours alone: the upstream does not offer it\"\n\
         [profiles.edge.certificate_profiles.brief]\ndescription = \"what the upstream calls shortlived\"\n",
        relay_profile(
            "edge",
            &upstream.directory("default"),
            &pki,
            "bypass",
            "bypass = true\ndefault_certificate_profile = \"classic\"",
            "upstream_profiles = { brief = \"shortlived\" }"
        )
    );
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let server = start_relay(dir, &toml).await;
    let account = client::account(&server.directory("edge")).await;
    let day = 86400;
    for (profile, name, lifetime) in [
        (Some("shortlived"), "short.example.test", 6 * day),
        (None, "classic.example.test", 90 * day),
        // Forwarded under the upstream's own name for it.
        (Some("brief"), "brief.example.test", 6 * day),
    ] {
        let relayed = relay_issue_in(&account, &[name], profile, Duration::from_secs(30)).await;
        let got = lifetime_of(relayed.chain());
        // The upstream backdates notBefore by an hour.
        assert!(
            (got - lifetime - 3600).abs() <= 5,
            "{profile:?}: a {got} s certificate, wanted {lifetime} s (+1 h backdating)"
        );
        // RFC 9773: our renewalInfo for a relayed certificate is the
        // upstream's window (its [0.1, 0.2] of the lifetime, not our
        // default [0.6, 0.8]).
        let (_, pem) = x509_parser::pem::parse_x509_pem(relayed.chain().as_bytes()).expect("PEM");
        let id = instant_acme::CertificateIdentifier::try_from(
            &rustls::pki_types::CertificateDer::from(pem.contents.clone()),
        )
        .expect("certificate identifier");
        let (ours, _) = account.renewal_info(&id).await.expect("our renewalInfo");
        let upstream_url = format!("{}/profile/default/renewal-info/{id}", upstream.base());
        let resp = crate::upstream::https_request(
            &pki.rustls_client_config(),
            "GET",
            &upstream_url,
            None,
            Vec::new(),
        )
        .await
        .expect("the upstream's renewalInfo");
        assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
        let theirs: serde_json::Value = serde_json::from_slice(&resp.body).expect("JSON");
        let rfc3339 = |t: ::time::OffsetDateTime| {
            t.format(&::time::format_description::well_known::Rfc3339)
                .expect("RFC 3339")
        };
        assert_eq!(
            rfc3339(ours.suggested_window.start),
            theirs["suggestedWindow"]["start"],
            "{profile:?}"
        );
        assert_eq!(
            rfc3339(ours.suggested_window.end),
            theirs["suggestedWindow"]["end"]
        );
    }
    // A profile the upstream does not offer is refused at newOrder rather
    // than silently becoming the upstream's default.
    let e = account
        .new_order(
            &NewOrder::new(&[Identifier::Dns("internal.example.test".into())]).profile("internal"),
        )
        .await
        .err()
        .expect("not offered upstream");
    assert_eq!(client::problem_type(&e), "invalidProfile", "{e}");
    server.stop().await;
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_cert_expiring_and_the_root_page_show_a_local_and_a_relay_profile() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let responder = harness::Responder::start().await;
    let dir = crate::harness::tempdir();
    let profiles = format!(
        "[profiles.local]\nbypass = true\n\n{}",
        relay_profile(
            "up",
            &pebble.directory_url(),
            &pki,
            "bypass",
            LOCAL_BYPASS,
            ""
        )
    );
    let toml = server_toml(dir.path(), responder.port, None, &profiles);
    let server = start_relay(dir, &toml).await;
    // The operator's configuration names the port the server really has.
    let (_etc, config) =
        harness::config_file(&toml.replace("127.0.0.1:0", &server.running().addr.to_string()));
    let cli = |args: &[&str]| harness::run_cli(&config, args, &[("USER", "alice")]);

    let local = client::account(&server.directory("local")).await;
    let local_id = local.id().rsplit('/').next().expect("id").to_owned();
    client::issue(&local, &responder, &["old.example.test"]).await;
    client::issue(&local, &responder, &["old.example.test"]).await; // a renewal
    client::issue(&local, &responder, &["kept.example.test"]).await;
    let relayed = client::account(&server.directory("up")).await;
    relay_issue(&relayed, &["relayed.example.test"], Duration::from_secs(30))
        .await
        .chain();

    // status: every part healthy, in JSON and in text.
    let out = cli(&["status", "--json"]);
    assert_eq!(out.code, 0, "{out:?}");
    let status: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(status["listeners"][0]["answering"], true, "{status:#}");
    assert_eq!(status["configuration_problems"], serde_json::json!([]));
    let (local_p, up_p) = (profile_of(&status, "local"), profile_of(&status, "up"));
    assert_eq!(
        (&local_p["signer"], &local_p["healthy"]),
        (&serde_json::json!("local_ca"), &serde_json::json!(true)),
        "{local_p:#}"
    );
    assert!(local_p["ca_not_after"].is_string(), "{local_p:#}");
    assert_eq!(local_p["directory"], server.directory("local"));
    assert_eq!(
        (
            &up_p["signer"],
            &up_p["healthy"],
            &up_p["upstream_reachable"]
        ),
        (
            &serde_json::json!("relay"),
            &serde_json::json!(true),
            &serde_json::json!(true)
        ),
        "{up_p:#}"
    );
    assert!(
        up_p["upstream_account"]
            .as_str()
            .is_some_and(|a| a.starts_with("https://")),
        "{up_p:#}"
    );
    assert_eq!(status["relay_orders_in_flight"], 0);
    assert!(
        status["last_issuance"]["what"]
            .as_str()
            .is_some_and(|w| w.contains("relayed.example.test")),
        "{status:#}"
    );
    assert!(status["last_failure"].is_null(), "{status:#}");
    let text = cli(&["status"]);
    assert_eq!(text.code, 0, "{text:?}");
    for line in [
        "acme listener",
        "configuration: would start",
        "profile local (local_ca): ok",
        "profile up (relay): ok",
        "answers HTTP 200 OK",
        "relay orders in flight: 0",
    ] {
        assert!(text.stdout.contains(line), "{line:?} in:\n{}", text.stdout);
    }

    // cert expiring: the renewed certificate is left out unless asked for.
    let expiring = |args: &[&str]| -> Vec<serde_json::Value> {
        let mut argv = vec!["cert", "expiring", "--json"];
        argv.extend_from_slice(args);
        let out = cli(&argv);
        assert_eq!(out.code, 0, "{out:?}");
        serde_json::from_str(&out.stdout).expect("JSON")
    };
    let names = |certs: &[serde_json::Value]| -> Vec<String> {
        let mut names: Vec<String> = certs
            .iter()
            .map(|c| format!("{} {}", c["profile"], c["identifiers"][0]))
            .collect();
        names.sort();
        names
    };
    let all = expiring(&["--within", "3650d"]);
    assert_eq!(
        names(&all),
        [
            "\"local\" \"kept.example.test\"",
            "\"local\" \"old.example.test\"",
            "\"up\" \"relayed.example.test\""
        ],
        "{all:#?}"
    );
    let kept = all
        .iter()
        .find(|c| c["identifiers"][0] == "kept.example.test")
        .expect("kept");
    assert_eq!(kept["account"], local_id.as_str());
    assert!(
        kept["days_left"].as_i64().is_some_and(|d| d > 1),
        "{kept:#}"
    );
    assert_eq!(expiring(&["--within", "3650d", "--renewed"]).len(), 4);
    assert_eq!(
        names(&expiring(&["--within", "3650d", "--profile", "up"])).len(),
        1
    );
    assert!(expiring(&["--within", "1h"]).is_empty());
    let table = cli(&["cert", "expiring", "--within", "3650d"]);
    assert_eq!(table.code, 0, "{table:?}");
    assert!(
        table.stdout.starts_with("SERIAL") && table.stdout.contains("kept.example.test"),
        "{table:?}"
    );

    // `/`: both profiles, as JSON and as a page.
    let root = format!("{}/", server.base());
    let json = crate::raw::request_with("GET", &root, &[], Vec::new()).await;
    let listed: serde_json::Value = serde_json::from_slice(&json.body).expect("JSON");
    assert_eq!(
        listed,
        serde_json::json!({"profiles": [
            {"name": "local", "directory": server.directory("local"), "signer": "local_ca"},
            {"name": "up", "directory": server.directory("up"), "signer": "relay"},
        ]})
    );
    let page = crate::raw::request_with("GET", &root, &[("accept", "text/html")], Vec::new()).await;
    let html = String::from_utf8(page.body).expect("UTF-8");
    assert!(
        html.contains("an upstream ACME CA, through the relay")
            && html.contains(&server.directory("up")),
        "{html}"
    );

    // With the upstream gone, status says so and exits 1.
    drop(pebble);
    let out = cli(&["status", "--json"]);
    assert_eq!(out.code, 1, "{out:?}");
    let status: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    let up_p = profile_of(&status, "up");
    assert_eq!(up_p["upstream_reachable"], false, "{up_p:#}");
    assert!(out.stderr.contains("profile up cannot sign"), "{out:?}");
    server.stop().await;
}

fn profile_of(status: &serde_json::Value, name: &str) -> serde_json::Value {
    status["profiles"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("no profile {name}: {status:#}"))
}

/// Reads `count` every 20 ms on a thread of its own until the returned
/// flag is set; the thread ends with the largest count it read.
fn watch_most(
    count: impl Fn() -> usize + Send + 'static,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<usize>,
) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watching = Arc::clone(&stop);
    let watcher = std::thread::spawn(move || {
        let mut most = 0;
        while !watching.load(std::sync::atomic::Ordering::Relaxed) {
            most = most.max(count());
            std::thread::sleep(Duration::from_millis(20));
        }
        most
    });
    (stop, watcher)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_delegated_relay_order_keeps_its_value_served_and_completes() {
    if !harness::require_program("dig") {
        return;
    }
    // Fixed addresses: the corporate DNS forwards to the zone, and the
    // client's order URL must stay valid, across the restart.
    let dns_at = harness::own_addr();
    let listen = format!("listen = \"{}\"", harness::own_addr());
    let Some(bind) = Bind::start_delegating(
        "lab.test",
        "_acme-challenge.r IN CNAME r.lab.test.acme.zone.test.",
        "acme.zone.test",
        dns_at,
    ) else {
        return;
    };
    let pki = TestPki::new();
    let Some(pebble) = pebble_validating_through(&pki, &bind) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let data = crate::harness::tempdir();
    let profile = relay_profile(
        "default",
        &proxy.directory_url(),
        &pki,
        "dns01_delegated",
        LOCAL_BYPASS,
        "",
    );
    let zone = format!(
        "\n[dns_zone]\nzones = [\"acme.zone.test\"]\nlisten = [\"{dns_at}\"]\nnameservers = [\"ns1.lab.test\"]\nttl = \"1s\"\nnegative_ttl = \"1s\"\n"
    );
    let toml = server_toml(
        data.path(),
        harness::free_port(),
        None,
        &format!("{profile}{zone}"),
    )
    .replace("listen = \"127.0.0.1:0\"", &listen)
    .replace(
        "[validation]\n",
        &format!("[validation]\ndns_resolvers = [\"{}\"]\n", bind.addr),
    );
    register_upstream_accounts(&toml).await;

    // The upstream never hears that the challenge is ready: the relay has
    // published its value and waits.
    proxy.set_always(Match::PathContains("chalZ"), Some(Fault::Hang));
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let account = client::account(&server.directory("default")).await;
    let mut order = ready_order(&account, &["r.lab.test"]).await;
    order.finalize().await.expect("finalize answers");
    let target = "r.lab.test.acme.zone.test";
    let deadline = Instant::now() + Duration::from_secs(20);
    while zone_txt(dns_at, target).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the relay published nothing within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let published = zone_txt(dns_at, target);
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.faults_applied() == 0 {
        assert!(
            Instant::now() < deadline,
            "the challenge was never sent upstream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;

    // Back up: the value is served again. The stop cancelled the attempt,
    // which retracts what it published (the relay's dns-01 contract: on
    // every exit path), so it may be gone for a moment; the resumed relay
    // publishes the same value (the same upstream challenge) soon after
    // start-up. Then the upstream hears of it and issues.
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let served = zone_txt(dns_at, target);
        if !served.is_empty() {
            assert_eq!(
                served, published,
                "the resumed relay published another value"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the value was not served again within 20 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.set_always(Match::PathContains("chalZ"), None);
    let deadline = Instant::now() + Duration::from_secs(60);
    let chain = loop {
        let status = order.refresh().await.expect("poll the order").status;
        match status {
            OrderStatus::Valid => {
                break order.certificate().await.expect("download").expect("chain");
            }
            OrderStatus::Invalid => panic!("the order failed: {:?}", order.state().error),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "still {status:?} 60 s after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (issuer, sans, _) = leaf_of(&chain);
    assert_eq!(sans, ["r.lab.test"]);
    assert_eq!(issuer, subject_of(&pebble.intermediate_pem().await));
    // Its value is removed once the upstream has decided.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !zone_txt(dns_at, target).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(zone_txt(dns_at, target).is_empty());
    server.stop().await;
}

/// Finalizes every order at once; their URLs.
async fn finalize_all(ready: Vec<instant_acme::Order>) -> Vec<String> {
    let mut finalizing = tokio::task::JoinSet::new();
    for mut order in ready {
        finalizing.spawn(async move {
            order.finalize().await.expect("finalize");
            order.url().to_owned()
        });
    }
    finalizing.join_all().await
}

/// Polls the orders at `urls` until every one is valid; panics on one
/// that ends invalid, or on any still not valid at `deadline`.
pub(crate) async fn all_valid(account: &Account, urls: Vec<String>, deadline: Instant) {
    let mut pending = urls;
    while !pending.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} orders still not valid at the deadline",
            pending.len()
        );
        let mut still = Vec::new();
        for url in pending {
            let mut order = account.order(url.clone()).await.expect("poll");
            match order.state().status {
                OrderStatus::Valid => {}
                OrderStatus::Invalid => panic!("order {url} ended invalid"),
                _ => still.push(url),
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The authoritative TXT values of `name` in the embedded zone at `at`.
fn zone_txt(at: std::net::SocketAddr, name: &str) -> Vec<String> {
    let out = std::process::Command::new("dig")
        .arg(format!("@{}", at.ip()))
        .args(["-p", &at.port().to_string()])
        .args(["TXT", name, "+short", "+norecurse", "+time=2", "+tries=2"])
        .output()
        .expect("run dig");
    assert!(out.status.success(), "dig {name}: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim_matches('"').to_owned())
        .collect()
}

/// A stand-in for name servers that are slow (what cannot be staged with
/// a real one): every query on its UDP socket is answered NXDOMAIN after
/// `delay`, each on its own, so that lookups asked together end together.
fn slow_nxdomain_server(delay: Duration) -> std::net::SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket.set_nonblocking(true).expect("nonblocking");
    let addr = socket.local_addr().expect("addr");
    let socket = Arc::new(tokio::net::UdpSocket::from_std(socket).expect("tokio socket"));
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let query = buf[..n].to_vec();
            let socket = Arc::clone(&socket);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                // The header and the question, as asked: QR set, RD kept,
                // RA set, RCODE 3; no answer, authority or additional.
                let mut end = 12;
                while end < query.len() && query[end] != 0 {
                    end += 1 + usize::from(query[end]);
                }
                let end = (end + 5).min(query.len());
                let mut answer = query[..end].to_vec();
                answer[2] = 0x80 | (query[2] & 0x01);
                answer[3] = 0x80 | 0x03;
                answer[6..12].fill(0);
                let _ = socket.send_to(&answer, from).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_of_many_names_on_slow_name_servers_has_every_delegation_checked_within_the_timeout()
 {
    // Each lookup takes a second; the validation timeout, which bounds
    // them all together, is five. One after another, four or five names
    // of twelve would be checked and the rest let through unknown.
    let slow = slow_nxdomain_server(Duration::from_secs(1));
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let dir = crate::harness::tempdir();
    let zone = "\n[dns_zone]\nzones = [\"acme.zone.test\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.lab.test\"]\n";
    let toml = server_toml(
        dir.path(),
        harness::free_port(),
        None,
        &format!(
            "{}{zone}",
            relay_profile(
                "default",
                &pebble.directory_url(),
                &pki,
                "dns01_delegated",
                LOCAL_BYPASS,
                "",
            )
        ),
    )
    .replace(
        "[validation]\n",
        &format!("[validation]\ndns_resolvers = [\"{slow}\"]\n"),
    );
    assert!(toml.contains("timeout = \"5s\""), "{toml}");
    register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(dir, &toml).await;
    let account = client::account(&server.directory("default")).await;
    let names: Vec<Identifier> = (0..12)
        .map(|i| Identifier::Dns(format!("n{i}.lab.test")))
        .collect();
    let started = Instant::now();
    let err = account
        .new_order(&NewOrder::new(&names))
        .await
        .err()
        .expect("undelegated names are refused");
    let took = started.elapsed();
    let text = err.to_string();
    for i in 0..12 {
        assert!(
            text.contains(&format!(
                "_acme-challenge.n{i}.lab.test. is not delegated to this server's zone"
            )),
            "n{i} was not checked: {text}"
        );
    }
    assert!(took < Duration::from_secs(5), "newOrder took {took:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns01_delegated_obtains_a_wildcard_through_a_cname_to_our_own_zone_with_no_key_anywhere() {
    if !harness::require_program("dig") {
        return;
    }
    // The server first, with its zone and no relay yet: the corporate DNS
    // must know where the zone answers, and Pebble must know the
    // corporate DNS, before the relay profile can name Pebble.
    let dir = crate::harness::tempdir();
    let zone = "\n[dns_zone]\nzones = [\"acme.zone.test\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.lab.test\"]\nttl = \"5s\"\nnegative_ttl = \"1s\"\n";
    let first = server_toml(
        dir.path(),
        harness::free_port(),
        None,
        &format!("[profiles.default]\nbypass = true\n{zone}"),
    );
    let server = TestServer::start_in(dir, &first).await;
    let at = server.running().dns_addrs[0];

    // The corporate zone holds only the delegation, and its server follows
    // it to ours.
    let Some(bind) = Bind::start_delegating(
        "lab.test",
        "_acme-challenge.x IN CNAME x.lab.test.acme.zone.test.\n_acme-challenge.z IN CNAME z.lab.test.elsewhere.test.",
        "acme.zone.test",
        at,
    ) else {
        return;
    };
    let pki = TestPki::new();
    let Some(pebble) = pebble_validating_through(&pki, &bind) else {
        return;
    };
    let relayed_profile = relay_profile(
        "relayed",
        &pebble.directory_url(),
        &pki,
        "dns01_delegated",
        LOCAL_BYPASS,
        "",
    );
    // newOrder checks the delegation through the corporate DNS.
    let second = format!(
        "{}\n{relayed_profile}",
        first.replace(
            "[validation]\n",
            &format!("[validation]\ndns_resolvers = [\"{}\"]\n", bind.addr)
        )
    );
    assert!(!second.contains("tsig"), "no DNS key is configured");
    register_upstream_accounts(&second).await;
    server
        .running()
        .reload(Config::from_toml(&second).expect("the configuration"))
        .await
        .expect("the relay profile is added by a reload");
    let account = client::account(&server.directory("relayed")).await;

    // A name without the CNAME, and one whose CNAME points elsewhere, are
    // refused at newOrder with the record to ask the DNS team for.
    let err = account
        .new_order(&NewOrder::new(&[
            Identifier::Dns("x.lab.test".to_owned()),
            Identifier::Dns("y.lab.test".to_owned()),
            Identifier::Dns("*.z.lab.test".to_owned()),
        ]))
        .await
        .err()
        .expect("undelegated names are refused");
    let text = err.to_string();
    assert!(
        text.contains("_acme-challenge.y.lab.test. CNAME y.lab.test.acme.zone.test."),
        "{text}"
    );
    assert!(text.contains("z.lab.test.elsewhere.test."), "{text}");
    assert!(
        text.contains("_acme-challenge.z.lab.test. CNAME z.lab.test.acme.zone.test."),
        "{text}"
    );
    assert!(!text.contains("_acme-challenge.x.lab.test"), "{text}");

    // Both values (the wildcard's and the base name's) are in our zone
    // while Pebble looks.
    let target = "x.lab.test.acme.zone.test";
    let (stop, watcher) = watch_most(move || zone_txt(at, target).len());
    let relayed = relay_issue(
        &account,
        &["*.x.lab.test", "x.lab.test"],
        Duration::from_secs(60),
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().expect("watcher");
    let (issuer, mut sans, _) = leaf_of(relayed.chain());
    sans.sort();
    assert_eq!(sans, ["*.x.lab.test", "x.lab.test"]);
    assert_eq!(issuer, subject_of(&pebble.intermediate_pem().await));
    assert_eq!(most, 2, "both values must be served at once");
    // Pebble's only resolver is BIND, which holds no TXT record: the values
    // reached it through the CNAME and the forward to our zone.
    // None left behind.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !zone_txt(at, target).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        zone_txt(at, target).is_empty(),
        "{:?}",
        zone_txt(at, target)
    );

    // A resolver that never answers (the names' servers dropping every
    // query): the lookups of one newOrder share one validation timeout,
    // so that a client's names cannot hold the request (and one of
    // `max_in_flight`) for a timeout each. Unanswered, they refuse
    // nothing: the upstream decides.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("a silent resolver");
    let third = second
        .replace(
            &format!("dns_resolvers = [\"{}\"]", bind.addr),
            &format!("dns_resolvers = [\"{}\"]", silent.local_addr().unwrap()),
        )
        .replace("timeout = \"5s\"", "timeout = \"2s\"");
    assert_ne!(third, second);
    server
        .running()
        .reload(Config::from_toml(&third).expect("the configuration"))
        .await
        .expect("reloaded");
    let names: Vec<Identifier> = (0..4)
        .map(|i| Identifier::Dns(format!("slow{i}.lab.test")))
        .collect();
    let started = Instant::now();
    account
        .new_order(&NewOrder::new(&names))
        .await
        .expect("unanswered lookups refuse nothing");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "newOrder took {:?} for four names with a 2 s timeout",
        started.elapsed()
    );
    drop(silent);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_ten_upstream_orders_a_minute_issues_thirty_finalizes_over_three_minutes_without_an_upstream_429()
 {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    // The upstream's own limit, as Let's Encrypt's: ten new orders a
    // minute, ten at once.
    proxy.limit(Match::PathContains(NEW_ORDER), 10, Duration::from_secs(60));
    let data = crate::harness::tempdir();
    let profiles = bypass_profile(&proxy.directory_url(), &pki, "upstream_orders = \"10/1m\"");
    let toml = server_toml(data.path(), harness::free_port(), None, &profiles);
    register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let account = client::account(&server.directory("default")).await;
    let mut ready = Vec::new();
    for i in 0..30 {
        ready.push(ready_order(&account, &[&format!("budget{i}.example.test")]).await);
    }
    let urls = finalize_all(ready).await;

    all_valid(&account, urls, Instant::now() + Duration::from_secs(280)).await;

    // Not one refusal upstream; thirty orders, one every six seconds.
    let refused: Vec<(String, String, u16)> = proxy
        .requests()
        .into_iter()
        .filter(|(_, _, status)| *status == 429)
        .collect();
    assert!(refused.is_empty(), "upstream 429s: {refused:?}");
    let sent = proxy.forwarded_at(NEW_ORDER);
    assert_eq!(sent.len(), 30, "each order created upstream once");
    let span = sent[sent.len() - 1].duration_since(sent[0]);
    assert!(
        span >= Duration::from_secs(170),
        "thirty orders a minute apart by ten took {span:?}"
    );
    // Never more than ten in a minute (less two seconds: what one
    // request's latency may shift an arrival by).
    for (i, at) in sent.iter().enumerate() {
        let within = sent[i..]
            .iter()
            .take_while(|later| later.duration_since(*at) < Duration::from_secs(58))
            .count();
        assert!(
            within <= 10,
            "{within} upstream orders within 58 s from the {i}th"
        );
    }
    let metrics = server.running().authority().render_metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("acme_proxy_rate_limited_total{limit=\"upstream_orders\"} ")),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_429_with_retry_after_pauses_every_relay_of_the_profile_until_then() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    proxy.inject(
        Match::PathContains(NEW_ORDER),
        Fault::RateLimited429 {
            retry_after_secs: 20,
        },
    );
    let data = crate::harness::tempdir();
    let profiles = bypass_profile(&proxy.directory_url(), &pki, "");
    let toml = server_toml(data.path(), harness::free_port(), None, &profiles);
    register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let account = client::account(&server.directory("default")).await;
    let mut ready = Vec::new();
    for i in 0..4 {
        ready.push(ready_order(&account, &[&format!("pause{i}.example.test")]).await);
    }
    // The first finalize's upstream newOrder meets the 429; the client
    // sees its order processing.
    let mut first = ready.remove(0);
    first.finalize().await.expect("finalize");
    let refused_at = proxy
        .requests_at()
        .into_iter()
        .find(|r| r.3 == 429)
        .expect("the upstream's 429")
        .0;
    let store = server.running().authority().store().clone();
    let now_ms = {
        use acme_proxy::clock::Clock;
        SystemClock.unix_ms()
    };
    let held = store
        .rate_limits("upstream_pause:", now_ms, 10)
        .await
        .expect("rate limits");
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        held[0].key,
        "upstream_pause:profile:default:upstream:primary"
    );
    assert!(held[0].tat >= now_ms + 18_000, "{held:?}");
    // Three more finalizes inside the pause: answered, and not forwarded.
    let mut urls = finalize_all(ready).await;
    urls.push(first.url().to_owned());

    all_valid(&account, urls, Instant::now() + Duration::from_secs(120)).await;

    // Not one request to the upstream, from any job, until the pause
    // ended (half a second less: the proxy logs the 429 before the relay
    // reads it and counts from then).
    let during: Vec<_> = proxy
        .requests_at()
        .into_iter()
        .filter(|(at, ..)| *at > refused_at && *at < refused_at + Duration::from_millis(19_500))
        .collect();
    assert!(during.is_empty(), "requests during the pause: {during:?}");
    assert_eq!(
        proxy.forwarded_at(NEW_ORDER).len(),
        4,
        "each order created upstream once: {:?}",
        proxy.requests()
    );
    let metrics = server.running().authority().render_metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("acme_proxy_rate_limited_total{limit=\"upstream_pause\"} ")),
        "{metrics}"
    );
    server.stop().await;
}

/// Waits until the order at `url` is valid (panics on invalid, or at
/// `deadline`).
async fn ends_valid(account: &Account, url: &str, deadline: Instant) {
    all_valid(account, vec![url.to_owned()], deadline).await;
}

/// Waits until the order at `url` is invalid (panics on valid, or at
/// `deadline`).
async fn ends_invalid(account: &Account, url: &str, deadline: Instant) {
    loop {
        let mut order = account.order(url.to_owned()).await.expect("poll");
        match order.state().status {
            OrderStatus::Invalid => return,
            OrderStatus::Valid => panic!("order {url} ended valid"),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "order {url} not invalid at the deadline"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A relay profile in front of a Pebble whose every validation fails (it
/// fetches http-01 from a port where nothing listens), reached through a
/// fault proxy, with `upstream_failed_validations = budget`; a server
/// and an account. None when Pebble is missing outside CI.
struct FailingUpstream {
    _pebble: Pebble,
    proxy: FaultProxy,
    server: TestServer,
    account: Account,
}

async fn failing_upstream(pki: &TestPki, budget: &str) -> Option<FailingUpstream> {
    let pebble = Pebble::start(
        pki,
        PebbleOptions {
            always_valid: false,
            http_port: harness::free_port(),
            ..PebbleOptions::default()
        },
    )?;
    let proxy = FaultProxy::start(pki, pebble.addr);
    let data = crate::harness::tempdir();
    let profiles = relay_profile(
        "default",
        &proxy.directory_url(),
        pki,
        "http01",
        LOCAL_BYPASS,
        &format!("upstream_failed_validations = \"{budget}\""),
    );
    let toml = server_toml(data.path(), harness::free_port(), None, &profiles);
    let server = start_relay(data, &toml).await;
    let account = client::account(&server.directory("default")).await;
    Some(FailingUpstream {
        _pebble: pebble,
        proxy,
        server,
        account,
    })
}

/// The `upstream_failed_validations` limits that hold something back now.
async fn failed_validation_limits(store: &Store) -> Vec<acme_proxy_store::RateLimitRow> {
    let now_ms = {
        use acme_proxy::clock::Clock;
        SystemClock.unix_ms()
    };
    store
        .rate_limits("upstream_failed_validations:", now_ms, 10)
        .await
        .expect("rate limits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_that_failed_before_the_upstream_answered_its_trigger_is_a_failed_validation()
{
    let pki = TestPki::new();
    let Some(FailingUpstream {
        _pebble,
        proxy,
        server,
        account,
    }) = failing_upstream(&pki, "1/20s").await
    else {
        return;
    };
    // The proxy answers the trigger as a CA whose validation failed
    // before it answered.
    proxy.inject(Match::PathContains("chalZ"), Fault::FailedBeforeAnswer);
    let relayed = relay_issue(&account, &["early.example.test"], Duration::from_secs(30)).await;
    assert!(relayed.result.is_err(), "the order must end invalid");
    assert_eq!(proxy.faults_applied(), 1);
    let store = server.running().authority().store().clone();
    // The authorization's end is reported with the CA's reason, not as a
    // refused request...
    let failed = the_one_issue_failure(&store, &relayed).await;
    let detail = failed.detail.as_deref().unwrap_or("");
    assert!(
        detail.contains("the upstream authorization for early.example.test turned Invalid"),
        "{detail}"
    );
    // ... and counted against the name's budget of failed validations.
    let held = failed_validation_limits(&store).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(
        held[0].key.ends_with(":name:early.example.test"),
        "{held:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_whose_upstream_validations_failed_twice_waits_for_its_window_while_other_names_go()
{
    let pki = TestPki::new();
    let Some(FailingUpstream {
        _pebble,
        proxy,
        server,
        account,
    }) = failing_upstream(&pki, "2/20s").await
    else {
        return;
    };
    let within = Duration::from_secs(30);
    // Two failed validations of one name: its budget is spent.
    for _ in 0..2 {
        let relayed = relay_issue(&account, &["fails.example.test"], within).await;
        assert!(relayed.result.is_err(), "the upstream validation must fail");
    }
    assert_eq!(proxy.forwarded_at(NEW_ORDER).len(), 2);
    let store = server.running().authority().store().clone();
    let held = failed_validation_limits(&store).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        held[0].key,
        "upstream_failed_validations:profile:default:upstream:primary:name:fails.example.test"
    );
    // A third order for it waits in the queue; another name goes upstream
    // (and fails there) meanwhile.
    let mut third = ready_order(&account, &["fails.example.test"]).await;
    third.finalize().await.expect("finalize");
    // The key frees a place when its theoretical arrival time is within
    // the burst less one interval (20 s - 10 s) of now.
    let frees_at_ms = held[0].tat - 10_000;
    let other = relay_issue(&account, &["other.example.test"], within).await;
    assert!(other.result.is_err());
    assert_eq!(
        proxy.forwarded_at(NEW_ORDER).len(),
        3,
        "only the other name's order went upstream: {:?}",
        proxy.requests()
    );
    assert_eq!(
        account
            .order(third.url().to_owned())
            .await
            .expect("poll")
            .state()
            .status,
        OrderStatus::Processing
    );
    // Its window frees (one failure every 10 s), and it goes.
    ends_invalid(&account, third.url(), Instant::now() + within).await;
    assert_eq!(proxy.forwarded_at(NEW_ORDER).len(), 4);
    let went_ms = {
        use acme_proxy::clock::Clock;
        SystemClock.unix_ms()
    };
    assert!(
        went_ms >= frees_at_ms,
        "the held order went {} ms before its window freed",
        frees_at_ms - went_ms
    );
    let metrics = server.running().authority().render_metrics().await;
    assert!(
        metric(
            &metrics,
            "acme_proxy_rate_limited_total{limit=\"upstream_failed_validations\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_upstream_authorizations_in_flight_hold_a_third_order_until_one_settles() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let data = crate::harness::tempdir();
    let profiles = bypass_profile(
        &proxy.directory_url(),
        &pki,
        "upstream_pending_authorizations = 2",
    );
    let toml = server_toml(data.path(), harness::free_port(), None, &profiles);
    register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let account = client::account(&server.directory("default")).await;
    // The upstream's finalize hangs: two orders sent upstream stay in
    // flight with their authorizations.
    proxy.set_always(Match::PathContains(FINALIZE), Some(Fault::Hang));
    let mut ready = Vec::new();
    for i in 0..2 {
        ready.push(ready_order(&account, &[&format!("held{i}.example.test")]).await);
    }
    let mut urls = finalize_all(ready).await;
    assert_eq!(proxy.forwarded_at(NEW_ORDER).len(), 2);
    let mut third = ready_order(&account, &["held2.example.test"]).await;
    third.finalize().await.expect("finalize");
    urls.push(third.url().to_owned());
    // Two hung finalizes later (each a 2 s request timeout), the third
    // order is still not sent upstream.
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy
        .requests()
        .iter()
        .filter(|r| r.1.contains(FINALIZE))
        .count()
        < 3
    {
        assert!(Instant::now() < deadline, "{:?}", proxy.requests());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        proxy.forwarded_at(NEW_ORDER).len(),
        2,
        "the third order went upstream: {:?}",
        proxy.requests()
    );
    // The upstream finalizes again: the two settle, then the third goes.
    proxy.set_always(Match::PathContains(FINALIZE), None);
    all_valid(&account, urls, Instant::now() + Duration::from_secs(60)).await;
    assert_eq!(proxy.forwarded_at(NEW_ORDER).len(), 3);
    let metrics = server.running().authority().render_metrics().await;
    assert!(
        metric(
            &metrics,
            "acme_proxy_rate_limited_total{limit=\"upstream_pending_authorizations\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_answers_a_revocation_503_at_once_and_its_own_probe_closes_it_with_no_relay_waiting()
 {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let data = crate::harness::tempdir();
    let profiles = bypass_profile(
        &proxy.directory_url(),
        &pki,
        "breaker_failures = 2\nbreaker_open_for = \"2s\"",
    );
    let toml = server_toml(data.path(), harness::free_port(), None, &profiles);
    register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let (_etc, config) = harness::config_file(&toml);
    let account = client::account(&server.directory("default")).await;
    let relayed = relay_issue(&account, &["kept.example.test"], Duration::from_secs(30)).await;
    let (_, pem) = x509_parser::pem::parse_x509_pem(relayed.chain().as_bytes()).expect("PEM");
    let der = rustls::pki_types::CertificateDer::from(pem.contents.clone());

    // The upstream goes down; one order meets it (its finalize, then its
    // job): the breaker opens.
    proxy.set_always(Match::Any, Some(Fault::Html502));
    let mut order = ready_order(&account, &["outage.example.test"]).await;
    order.finalize().await.expect("finalize");
    let deadline = Instant::now() + Duration::from_secs(20);
    while upstream_status(&config)["breaker"] != "open" {
        assert!(Instant::now() < deadline, "the breaker never opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The order is given up: no relay waits on the upstream any more.
    let store = server.running().authority().store().clone();
    let order_id = order.url().rsplit('/').next().expect("id").to_owned();
    let job = acme_proxy::admin::ops::list_jobs(&store, Some("signer_relay_issue"), None, 10)
        .await
        .expect("jobs")
        .into_iter()
        .find(|j| j.key == order_id)
        .expect("the relay job");
    acme_proxy::admin::ops::cancel_job(&store, &SystemClock, job.id, "operator:test")
        .await
        .expect("cancelled");
    ends_invalid(
        &account,
        order.url(),
        Instant::now() + Duration::from_secs(20),
    )
    .await;

    // A revocation meanwhile is answered at once, 503, and not sent
    // upstream.
    let started = Instant::now();
    let refused = account
        .revoke(&instant_acme::RevocationRequest {
            certificate: &der,
            reason: None,
        })
        .await
        .expect_err("the upstream is down");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    match &refused {
        instant_acme::Error::Api(p) => assert_eq!(p.status, Some(503), "{p:?}"),
        other => panic!("not a problem document: {other}"),
    }
    assert_eq!(proxy.count("revoke-cert"), 0);

    // The upstream comes back: the breaker's own probe job closes it, with
    // no relay waiting to probe.
    proxy.set_always(Match::Any, None);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = upstream_status(&config);
        if status["breaker"] == "closed" {
            assert_eq!(status["in_flight"], 0, "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "still not closed: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    account
        .revoke(&instant_acme::RevocationRequest {
            certificate: &der,
            reason: None,
        })
        .await
        .expect("revoked once the upstream is back");
    assert_eq!(proxy.count("revoke-cert"), 1);
    server.stop().await;
}

/// `upstream status --json` for the "default" relay profile's preferred
/// upstream.
fn upstream_status(config: &Path) -> serde_json::Value {
    upstream_status_of(config, "primary")
}

/// `upstream status --json` for the "default" relay profile's upstream
/// `upstream`.
fn upstream_status_of(config: &Path, upstream: &str) -> serde_json::Value {
    let out = harness::run_cli(config, &["upstream", "status", "--json"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let shown: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    shown
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|p| p["profile"] == "default" && p["upstream"] == upstream)
        })
        .cloned()
        .unwrap_or_else(|| panic!("no default profile's {upstream} in {shown}"))
}

/// The value of the metric line that starts with `prefix` (name and
/// labels), if there is one.
fn metric(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_stops_answering_opens_its_breaker_and_only_one_probe_at_a_time_asks_until_it_closes()
 {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let data = crate::harness::tempdir();
    let profiles = bypass_profile(
        &proxy.directory_url(),
        &pki,
        "breaker_failures = 3\nbreaker_open_for = \"4s\"",
    );
    let toml = server_toml(data.path(), harness::free_port(), None, &profiles);
    register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let (_etc, config) = harness::config_file(&toml);
    let account = client::account(&server.directory("default")).await;
    // One relay while the upstream is up: the relay's account (and the
    // directory) is known, so that anything but a probe would be a nonce
    // or a POST.
    relay_issue(&account, &["before.example.test"], Duration::from_secs(30))
        .await
        .chain();
    let mut ready = Vec::new();
    for i in 0..3 {
        ready.push(ready_order(&account, &[&format!("breaker{i}.example.test")]).await);
    }
    assert_eq!(upstream_status(&config)["breaker"], "closed");

    // The upstream goes down behind its load balancer: every request gets
    // the balancer's 502 page. Three finalizes meet it.
    proxy.set_always(Match::Any, Some(Fault::Html502));
    let urls = finalize_all(ready).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let opened = loop {
        let status = upstream_status(&config);
        if status["breaker"] == "open" {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the breaker never opened: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let seen_open = Instant::now();
    assert!(opened["failures"].as_i64() >= Some(3), "{opened}");
    assert!(
        opened["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("502")),
        "{opened}"
    );
    assert!(opened["next_probe"].is_string(), "{opened}");
    assert_eq!(opened["in_flight"], 3, "{opened}");

    // Two probes fail while it is down.
    let probes_since = |from: Instant| -> Vec<(Instant, String, String, u16)> {
        proxy
            .requests_at()
            .into_iter()
            .filter(|(at, ..)| *at > from)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while probes_since(seen_open).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no two probes in 20 s: {:?}",
            proxy.requests()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = upstream_status(&config);
    assert_ne!(during["breaker"], "closed", "{during}");
    // The upstream comes back; the next probe closes the breaker.
    proxy.set_always(Match::Any, None);
    let healed = Instant::now();
    all_valid(&account, urls, Instant::now() + Duration::from_secs(60)).await;

    // While it was open, the upstream saw only the probes: GETs of the
    // directory (relays would send a nonce request and POSTs), one at a
    // time, each the breaker's 4 s after the last (less a little: the
    // proxy logs a request before the relay hears).
    let asked: Vec<_> = proxy
        .requests_at()
        .into_iter()
        .filter(|(at, ..)| *at > seen_open && *at < healed)
        .collect();
    assert!(asked.len() >= 2, "{asked:?}");
    for (_, method, path, _) in &asked {
        assert_eq!(
            (method.as_str(), path.as_str()),
            ("GET", "/dir"),
            "{asked:?}"
        );
    }
    for pair in asked.windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= Duration::from_millis(3_800),
            "two probes {:?} apart: {asked:?}",
            pair[1].0 - pair[0].0
        );
    }
    assert_eq!(
        proxy.forwarded_at(NEW_ORDER).len(),
        4,
        "each order created upstream once: {:?}",
        proxy.requests()
    );
    let closed = upstream_status(&config);
    assert_eq!(closed["breaker"], "closed", "{closed}");
    assert_eq!(closed["failures"], 0, "{closed}");
    assert_eq!(closed["in_flight"], 0, "{closed}");
    assert!(closed["next_probe"].is_null(), "{closed}");

    // Each transition counted; the state read from the database.
    let metrics = server.running().authority().render_metrics().await;
    let transitions = |to: &str| {
        metric(
            &metrics,
            &format!(
                "acme_proxy_upstream_breaker_transitions_total{{profile=\"default\",upstream=\"primary\",to=\"{to}\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert!(
        transitions("open") >= 3.0,
        "opened, then after each failed probe:\n{metrics}"
    );
    assert!(transitions("probing") >= 3.0, "{metrics}");
    assert_eq!(transitions("closed"), 1.0, "{metrics}");
    let state = |s: &str| {
        metric(
            &metrics,
            &format!(
                "acme_proxy_upstream_breaker_state{{profile=\"default\",upstream=\"primary\",state=\"{s}\"}}"
            ),
        )
    };
    assert_eq!(
        (state("closed"), state("open")),
        (Some(1.0), Some(0.0)),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_upstream_certificates_a_minute_per_registered_domain_hold_back_a_third_of_that_domain_only()
 {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let data = crate::harness::tempdir();
    let profiles = bypass_profile(
        &proxy.directory_url(),
        &pki,
        "upstream_certificates_per_domain = \"2/1m\"",
    );
    let toml = server_toml(data.path(), harness::free_port(), None, &profiles);
    register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(crate::harness::tempdir(), &toml).await;
    let account = client::account(&server.directory("default")).await;
    // Three orders under example.test (`.test` is not on the Public
    // Suffix List: its last label stands for the suffix), one under
    // other.test.
    let names = [
        "a.pc.example.test",
        "b.pc.example.test",
        "c.pc.example.test",
        "a.pc.other.test",
    ];
    let mut ready = Vec::new();
    for name in names {
        ready.push(ready_order(&account, &[name]).await);
    }
    let started = Instant::now();
    let urls = finalize_all(ready).await;
    // Each domain's places, kept in the database.
    let store = server.running().authority().store().clone();
    let now_ms = {
        use acme_proxy::clock::Clock;
        SystemClock.unix_ms()
    };
    let keys: Vec<String> = store
        .rate_limits("upstream_certificates:", now_ms, 10)
        .await
        .expect("rate limits")
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(
        keys,
        [
            "upstream_certificates:profile:default:upstream:primary:domain:example.test",
            "upstream_certificates:profile:default:upstream:primary:domain:other.test",
        ]
    );
    all_valid(&account, urls, Instant::now() + Duration::from_secs(120)).await;

    // Three sent at once (two of example.test, other.test's); the third of
    // example.test half a minute later, when a place of its domain freed.
    let sent = proxy.forwarded_at(NEW_ORDER);
    assert_eq!(sent.len(), 4, "each order created upstream once");
    let offsets: Vec<Duration> = sent.iter().map(|at| at.duration_since(started)).collect();
    assert!(
        offsets[..3].iter().all(|d| *d < Duration::from_secs(15)),
        "{offsets:?}"
    );
    assert!(
        offsets[3] >= Duration::from_secs(28),
        "the third order of example.test went at {offsets:?}"
    );
    let metrics = server.running().authority().render_metrics().await;
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "acme_proxy_rate_limited_total{limit=\"upstream_certificates_per_domain\"} "
        )),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_orders_go_to_the_fallback_while_the_preferred_upstream_is_down_and_back_once_it_answers()
 {
    let pki = TestPki::new();
    let Some((_pebbles, a, b)) = two_pebbles(&pki) else {
        return;
    };
    let Relaying {
        server,
        config,
        account,
        _dirs,
    } = Relaying::start(&a_then_b(
        &pki,
        &a,
        "breaker_failures = 2\nbreaker_open_for = \"3s\"",
        &b,
    ))
    .await;
    let within = Duration::from_secs(30);

    // Both up: the preferred upstream takes every order.
    for name in ["first.example.test", "second.example.test"] {
        relay_issue(&account, &[name], within).await.chain();
    }
    assert_eq!((a.count(NEW_ORDER), b.count(NEW_ORDER)), (2, 0));

    // A goes down behind its balancer. Three finalizes meet it; once its
    // breaker opens, their orders are made at B, and no client sees an
    // error.
    let mut ready = Vec::new();
    for i in 0..3 {
        ready.push(ready_order(&account, &[&format!("during{i}.example.test")]).await);
    }
    a.set_always(Match::Any, Some(Fault::Html502));
    let urls = finalize_all(ready).await;
    all_valid(
        &account,
        urls.clone(),
        Instant::now() + Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        (a.count(NEW_ORDER), b.count(NEW_ORDER)),
        (2, 3),
        "each order made once, the three at B: A {:?}, B {:?}",
        a.requests(),
        b.requests()
    );
    assert_eq!(b.count(FINALIZE), 3);
    let down = upstream_status_of(&config, "a");
    assert_ne!(down["breaker"], "closed", "{down}");
    assert!(
        down["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("502")),
        "{down}"
    );
    assert_eq!(upstream_status_of(&config, "b")["breaker"], "closed");
    // The mapping says where each went.
    let out = harness::run_cli(&config, &["upstream", "orders", "--json"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let orders: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    let at = |upstream: &str| {
        orders
            .as_array()
            .map(|all| all.iter().filter(|o| o["upstream"] == upstream).count())
            .unwrap_or(0)
    };
    assert_eq!((at("a"), at("b")), (2, 3), "{orders}");

    // A certificate B issued is revoked at B.
    let b_order = account
        .order(urls[0].clone())
        .await
        .expect("poll")
        .certificate()
        .await
        .expect("certificate")
        .expect("a chain");
    let (_, pem) = x509_parser::pem::parse_x509_pem(b_order.as_bytes()).expect("PEM");
    let der = rustls::pki_types::CertificateDer::from(pem.contents.clone());
    account
        .revoke(&instant_acme::RevocationRequest {
            certificate: &der,
            reason: None,
        })
        .await
        .expect("revoked at B while A is down");
    assert_eq!((a.count("revoke-cert"), b.count("revoke-cert")), (0, 1));

    // A answers again: its probe closes its breaker, and new orders go
    // back to it.
    a.set_always(Match::Any, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = upstream_status_of(&config, "a");
        if status["breaker"] == "closed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A's breaker never closed: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    relay_issue(&account, &["after.example.test"], within)
        .await
        .chain();
    assert_eq!((a.count(NEW_ORDER), b.count(NEW_ORDER)), (3, 3));

    // Each of A's transitions is counted under its name.
    let metrics = server.running().authority().render_metrics().await;
    let transitions = |to: &str| {
        metric(
            &metrics,
            &format!(
                "acme_proxy_upstream_breaker_transitions_total{{profile=\"default\",upstream=\"a\",to=\"{to}\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert!(transitions("open") >= 1.0, "{metrics}");
    assert_eq!(transitions("closed"), 1.0, "{metrics}");
    assert!(
        !metrics.contains(
            "acme_proxy_upstream_breaker_transitions_total{profile=\"default\",upstream=\"b\""
        ),
        "B's breaker never moved: {metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_moves_to_the_fallback_past_failover_after_only_if_its_finalize_was_never_sent() {
    let pki = TestPki::new();
    let Some((_pebbles, a, b)) = two_pebbles(&pki) else {
        return;
    };
    let Relaying {
        server,
        config,
        account,
        _dirs,
    } = Relaying::start(&a_then_b(
        &pki,
        &a,
        "breaker_failures = 2\nbreaker_open_for = \"1s\"\nfailover_after = \"2s\"",
        &b,
    ))
    .await;
    let within = Duration::from_secs(30);
    // Up: the relay knows A's directory and account from here on.
    relay_issue(&account, &["first.example.test"], within)
        .await
        .chain();
    assert_eq!((a.count(FINALIZE), b.count(NEW_ORDER)), (1, 0));

    // A takes an order and its finalize, then cannot hand out the
    // certificate and is down: the order waits for A past failover_after.
    a.set_always(Match::PathContains("/dir"), Some(Fault::Html502));
    a.set_always(Match::PathContains("certZ"), Some(Fault::Html502));
    let mut kept = ready_order(&account, &["kept.example.test"]).await;
    kept.finalize().await.expect("finalize");
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.count(FINALIZE) < 2 || upstream_status_of(&config, "a")["breaker"] == "closed" {
        assert!(Instant::now() < deadline, "{:?}", a.requests());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        account
            .order(kept.url().to_owned())
            .await
            .expect("poll")
            .state()
            .status,
        OrderStatus::Processing
    );
    assert_eq!(b.count(NEW_ORDER), 0, "{:?}", b.requests());
    // A comes back: the order ends there, finalized there once.
    a.set_always(Match::PathContains("/dir"), None);
    a.set_always(Match::PathContains("certZ"), None);
    ends_valid(&account, kept.url(), Instant::now() + within).await;
    assert_eq!((a.count(FINALIZE), b.count(FINALIZE)), (2, 0));

    // A takes an order, then is down before its finalize: past
    // failover_after the order moves to B, where it is issued.
    a.set_always(Match::PathContains("/dir"), Some(Fault::Html502));
    a.set_always(Match::PathContains("my-order"), Some(Fault::Html502));
    let moved = relay_issue(&account, &["moved.example.test"], within).await;
    moved.chain();
    assert_eq!(
        (a.count(NEW_ORDER), a.count(FINALIZE)),
        (3, 2),
        "made at A, never finalized there: {:?}",
        a.requests()
    );
    assert_eq!((b.count(NEW_ORDER), b.count(FINALIZE)), (1, 1));
    let store = server.running().authority().store().clone();
    let mapping = store
        .upstream_order(&moved.local_id())
        .await
        .expect("read")
        .expect("the mapping");
    assert_eq!(
        (mapping.upstream.as_deref(), mapping.moved_from.as_deref()),
        (Some("b"), Some("a"))
    );
    let audited = store
        .audit_for_order(&moved.local_id())
        .await
        .expect("audit");
    let row = audited
        .iter()
        .find(|r| r.event == "order.upstream_moved")
        .unwrap_or_else(|| panic!("no move audited: {audited:?}"));
    assert!(
        row.detail
            .as_deref()
            .is_some_and(|d| d.contains("upstream a") && d.contains("502")),
        "{row:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_listed_in_failover_on_passes_the_order_to_the_next_upstream() {
    let pki = TestPki::new();
    let Some((_pebbles, a, b)) = two_pebbles(&pki) else {
        return;
    };
    let Relaying {
        server,
        account,
        _dirs,
        ..
    } = Relaying::start(&a_then_b(
        &pki,
        &a,
        "failover_on = [\"rejectedIdentifier\"]",
        &b,
    ))
    .await;
    // A's policy refuses the name at newOrder; B issues it, and the client
    // sees no error.
    a.set_always(Match::PathContains(NEW_ORDER), Some(Fault::Rejected400));
    let relayed = relay_issue(
        &account,
        &["elsewhere.example.test"],
        Duration::from_secs(30),
    )
    .await;
    relayed.chain();
    assert!(
        a.requests()
            .iter()
            .any(|(m, p, status)| m == "POST" && p.contains(NEW_ORDER) && *status == 400),
        "A refused: {:?}",
        a.requests()
    );
    assert_eq!((a.count(NEW_ORDER), a.count(FINALIZE)), (0, 0));
    assert_eq!((b.count(NEW_ORDER), b.count(FINALIZE)), (1, 1));
    let store = server.running().authority().store().clone();
    let mapping = store
        .upstream_order(&relayed.local_id())
        .await
        .expect("read")
        .expect("the mapping");
    assert_eq!(
        (mapping.upstream.as_deref(), mapping.moved_from.as_deref()),
        (Some("b"), Some("a"))
    );
    let audited = store
        .audit_for_order(&relayed.local_id())
        .await
        .expect("audit");
    let row = audited
        .iter()
        .find(|r| r.event == "order.upstream_moved")
        .unwrap_or_else(|| panic!("no pass audited: {audited:?}"));
    assert_eq!(
        row.problem_type.as_deref(),
        Some("rejectedIdentifier"),
        "{row:?}"
    );
    // B refuses too: B is the last, so the order fails (passed on from A,
    // its refusal comes from the job).
    b.set_always(Match::PathContains(NEW_ORDER), Some(Fault::Rejected400));
    let mut refused = ready_order(&account, &["nowhere.example.test"]).await;
    refused
        .finalize()
        .await
        .expect("finalize: passed on to the job");
    ends_invalid(
        &account,
        refused.url(),
        Instant::now() + Duration::from_secs(30),
    )
    .await;
    assert_eq!(b.count(FINALIZE), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naming_the_preferred_upstream_later_keeps_its_primary_account() {
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, always_valid()) else {
        return;
    };
    let data = crate::harness::tempdir();
    let unnamed = server_toml(
        data.path(),
        harness::free_port(),
        None,
        &bypass_profile(&pebble.directory_url(), &pki, ""),
    );
    register_upstream_accounts(&unnamed).await;
    // The operator names it afterwards, and registers nothing new.
    let named = server_toml(
        data.path(),
        harness::free_port(),
        None,
        &bypass_profile(&pebble.directory_url(), &pki, "name = \"letsencrypt\""),
    );
    let server = TestServer::start_in(crate::harness::tempdir(), &named).await;
    let account = client::account(&server.directory("default")).await;
    relay_issue(&account, &["named.example.test"], Duration::from_secs(30))
        .await
        .chain();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_certificates_renewal_window_comes_from_the_upstream_that_issued_it() {
    // Two upstreams that answer renewal information (RFC 9773), each with
    // its own window: second acme-proxies over TLS, A at [0.1, 0.2] of a
    // certificate's lifetime, B at [0.3, 0.4].
    let pki = TestPki::new();
    let (cert, key) = pki.server_cert(&["127.0.0.1"]);
    let upstream = |window: &str| {
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{{data_dir}}\"\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n\n\
             [profiles.default]\nbypass = true\n\
             [profiles.default.signer]\ntype = \"local_ca\"\nrenewal_window = {window}\n",
            cert.display(),
            key.display()
        )
    };
    let a = TestServer::start_with_toml(&upstream("[0.1, 0.2]")).await;
    let b = TestServer::start_with_toml(&upstream("[0.3, 0.4]")).await;
    let dir = crate::harness::tempdir();
    let profiles = relay_profile(
        "edge",
        &a.directory("default"),
        &pki,
        "bypass",
        "bypass = true",
        &format!(
            "name = \"a\"\nbreaker_failures = 1\nbreaker_open_for = \"1h\"\n\n\
             [[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"{}\"\n\
             trust_anchors = [\"{}\"]\nstrategy = \"bypass\"\npoll_interval = \"100ms\"\n\
             request_timeout = \"2s\"\nattempt_budget = \"60s\"",
            b.directory("default"),
            pki.ca_pem_path().display()
        ),
    );
    let toml = server_toml(dir.path(), harness::free_port(), None, &profiles);
    let server = start_relay(dir, &toml).await;
    let account = client::account(&server.directory("edge")).await;
    let within = Duration::from_secs(30);
    // Our window for a relayed certificate, and the issuer's own.
    let windows = async |chain: &str, issuer: &TestServer| {
        let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).expect("PEM");
        let id = instant_acme::CertificateIdentifier::try_from(
            &rustls::pki_types::CertificateDer::from(pem.contents.clone()),
        )
        .expect("certificate identifier");
        let (ours, _) = account.renewal_info(&id).await.expect("our renewalInfo");
        let resp = crate::upstream::https_request(
            &pki.rustls_client_config(),
            "GET",
            &format!("{}/profile/default/renewal-info/{id}", issuer.base()),
            None,
            Vec::new(),
        )
        .await
        .expect("the issuer's renewalInfo");
        assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
        let theirs: serde_json::Value = serde_json::from_slice(&resp.body).expect("JSON");
        let start = ours
            .suggested_window
            .start
            .format(&::time::format_description::well_known::Rfc3339)
            .expect("RFC 3339");
        (start, theirs["suggestedWindow"]["start"].clone())
    };
    let from_a = relay_issue(&account, &["a.example.test"], within).await;
    let (ours, theirs) = windows(from_a.chain(), &a).await;
    assert_eq!(ours, theirs, "A's certificate: A's window");

    // A goes away: its breaker opens at the first failure, and the next
    // order is issued by B, whose window is the one we answer for it.
    a.stop().await;
    let from_b = relay_issue(&account, &["b.example.test"], within).await;
    let (ours, theirs) = windows(from_b.chain(), &b).await;
    assert_eq!(ours, theirs, "B's certificate: B's window, not A's");
    server.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_orders_go_to_the_fallback_while_every_request_to_the_preferred_upstream_hangs() {
    let pki = TestPki::new();
    let Some((_pebbles, a, b)) = two_pebbles(&pki) else {
        return;
    };
    let Relaying {
        server,
        config,
        account,
        _dirs,
    } = Relaying::start(&a_then_b(
        &pki,
        &a,
        "breaker_failures = 2\nbreaker_open_for = \"30s\"",
        &b,
    ))
    .await;
    relay_issue(&account, &["first.example.test"], Duration::from_secs(30))
        .await
        .chain();
    // Every request to A now hangs: each costs a request_timeout (2 s),
    // two open A's breaker, and the orders complete at B.
    a.set_always(Match::Any, Some(Fault::Hang));
    let mut ready = Vec::new();
    for i in 0..2 {
        ready.push(ready_order(&account, &[&format!("hung{i}.example.test")]).await);
    }
    let urls = finalize_all(ready).await;
    all_valid(&account, urls, Instant::now() + Duration::from_secs(60)).await;
    assert_eq!((a.count(NEW_ORDER), b.count(NEW_ORDER)), (1, 2));
    assert_eq!(b.count(FINALIZE), 2);
    let down = upstream_status_of(&config, "a");
    assert_ne!(down["breaker"], "closed", "{down}");
    assert!(
        down["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("within 2s")),
        "{down}"
    );
    server.stop().await;
}
