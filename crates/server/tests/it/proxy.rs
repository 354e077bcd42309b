//! Out through a corporate proxy (`[egress]`): the relay and webhooks reach
//! the outside through Debian's squid, started per test with its own
//! configuration on an [`harness::own_addr`], with or without Basic
//! authentication, its access log read by the tests.
//!
//! Squid is told (by a hosts file of its own) where [`PEBBLE_NAME`] and
//! [`HOOKS_NAME`] are; this machine's resolver knows neither name. So a
//! relay to `https://pebble.test:PORT/dir` that issues at all has sent
//! every upstream request through squid: there is no other way to reach
//! that name. (Pebble does not log its peers' addresses, so this is the
//! proof that the proxy was its only peer.)
//!
//! Squid logs a `CONNECT` tunnel when it closes, so a test stops the server
//! (closing its pooled connections) before it waits for those lines.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use instant_acme::OrderStatus;

use crate::client;
use crate::clients::{self, Ran};
use crate::harness::{self, ChildGuard, Dns, Receiver, TestServer};
use crate::relay;
use crate::upstream::{PEBBLE_NAME, Pebble, TestPki};

/// A webhook receiver's name, known only to squid.
const HOOKS_NAME: &str = "hooks.test";

/// Who squid lets through.
#[derive(Clone, Copy)]
enum Access<'a> {
    /// Anyone, anywhere.
    Open,
    /// Only this user with this password (Basic).
    Password(&'a str, &'a str),
    /// Anyone, anywhere but this destination name (403).
    Denying(&'a str),
}

/// Debian's squid on an address of this test, forwarding for anyone
/// (loopback only) as its [`Access`] says.
struct Squid {
    addr: SocketAddr,
    dir: tempfile::TempDir,
    child: Option<ChildGuard>,
}

impl Squid {
    /// Starts squid. None when squid is not installed (and the test
    /// should skip).
    fn start(access: Access) -> Option<Squid> {
        if !harness::require_program("squid") {
            return None;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = harness::tempdir();
        // Squid started as root runs as Debian's `proxy` user: it writes
        // its logs here.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod the squid directory");
        let d = dir.path().display().to_string();
        std::fs::write(
            dir.path().join("hosts"),
            format!(
                "{} {PEBBLE_NAME}\n127.0.0.1 {HOOKS_NAME}\n",
                harness::own_host()
            ),
        )
        .expect("squid's hosts file");
        let access = match access {
            Access::Password(user, password) => {
                let out = Command::new("openssl")
                    .args(["passwd", "-apr1", password])
                    .output()
                    .expect("openssl passwd");
                assert!(out.status.success(), "openssl passwd failed");
                let hash = String::from_utf8(out.stdout).expect("utf-8");
                std::fs::write(
                    dir.path().join("htpasswd"),
                    format!("{user}:{}\n", hash.trim()),
                )
                .expect("htpasswd");
                format!(
                    "auth_param basic program /usr/lib/squid/basic_ncsa_auth {d}/htpasswd\nauth_param basic realm acme-proxy-test\nacl authenticated proxy_auth REQUIRED\nhttp_access allow authenticated\nhttp_access deny all\n"
                )
            }
            Access::Denying(name) => {
                format!(
                    "acl denied dstdomain {name}\nhttp_access deny denied\nhttp_access allow all\n"
                )
            }
            Access::Open => "http_access allow all\n".to_owned(),
        };
        let addr = harness::own_addr();
        std::fs::write(
            dir.path().join("squid.conf"),
            format!(
                "http_port {addr}\nvisible_hostname acme-proxy-test\npid_filename {d}/squid.pid\naccess_log stdio:{d}/access.log\ncache_log {d}/cache.log\ncache_store_log none\ncoredump_dir {d}\ncache deny all\npinger_enable off\nshutdown_lifetime 0 seconds\nhosts_file {d}/hosts\n{access}"
            ),
        )
        .expect("squid.conf");
        let mut squid = Squid {
            addr,
            dir,
            child: None,
        };
        squid.start_again();
        Some(squid)
    }

    /// Starts squid (again, on the same address) and waits until it listens.
    fn start_again(&mut self) {
        let d = self.dir.path();
        let out = std::fs::File::create(d.join("squid.out")).expect("squid.out");
        let child = Command::new("squid")
            .args(["-N", "-f"])
            .arg(d.join("squid.conf"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("squid.out"))
            .stderr(out)
            .spawn()
            .expect("start squid");
        let mut guard = ChildGuard(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = guard.0.try_wait() {
                panic!("squid exited ({status}) at start:\n{}", self.log());
            }
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "squid did not listen on {} within 30 s:\n{}",
                self.addr,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(guard);
    }

    /// Kills squid; its address stays this test's.
    fn stop(&mut self) {
        self.child = None;
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One line per transaction squid finished.
    fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    /// Waits until the access log holds a line containing `what`.
    async fn wait_for_line(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.access_log();
            if log.contains(what) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "squid logged nothing with {what:?} within 30 s:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        let d = self.dir.path();
        format!(
            "{}{}",
            std::fs::read_to_string(d.join("squid.out")).unwrap_or_default(),
            std::fs::read_to_string(d.join("cache.log")).unwrap_or_default()
        )
    }
}

/// The value of the `acme_proxy_egress_proxy_failures_total` series with
/// `answer` in `metrics` (OpenMetrics text), 0 when absent.
fn proxy_failures(metrics: &str, answer: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("acme_proxy_egress_proxy_failures_total{")
                && l.contains(&format!("answer=\"{answer}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits (30 s at most) until `metrics` has counted `at_least` proxy
/// failures with `answer`.
async fn wait_for_proxy_failures(metrics: SocketAddr, answer: &str, at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy_failures(&scrape(metrics).await, answer) < at_least {
        assert!(
            Instant::now() < deadline,
            "fewer than {at_least} proxy failures with answer {answer:?} within 30 s:\n{}",
            scrape(metrics).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn scrape(metrics: SocketAddr) -> String {
    let r = crate::raw::request("GET", &format!("http://{metrics}/metrics"), None, vec![]).await;
    String::from_utf8_lossy(&r.body).into_owned()
}

/// Polls `order` until it is valid (the chain) or `within` has passed.
async fn until_valid(order: &mut instant_acme::Order, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let status = order.refresh().await.expect("poll the order").status;
        match status {
            OrderStatus::Valid => {
                return order.certificate().await.expect("download").expect("chain");
            }
            OrderStatus::Invalid => panic!("the order is invalid: {:?}", order.state().error),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the order is still {status:?} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Squid with `access`, and Pebble skipping validation with a PKI of its
/// own; None when either is not installed (and the test should skip).
fn squid_and_pebble(access: Access) -> Option<(Squid, TestPki, Pebble)> {
    let squid = Squid::start(access)?;
    let pki = TestPki::new();
    let pebble = Pebble::start(&pki, relay::always_valid())?;
    Some((squid, pki, pebble))
}

/// Egress through `squid`, then the relay profiles.
fn through(squid: &Squid, egress: &str, profiles: &str) -> String {
    format!(
        "[egress]\nproxy = \"{}\"\n{egress}\n\n{profiles}",
        squid.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_obtains_a_certificate_from_a_relay_whose_upstream_only_squid_can_reach() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("certbot") {
        return;
    }
    let Some((squid, pki, pebble)) = squid_and_pebble(Access::Open) else {
        return;
    };
    let at = harness::own_addr();
    let dir = harness::tempdir();
    let profiles = relay::bypass_profile(&pebble.directory_url_by_name(), &pki, "");
    let toml = relay::server_toml(
        dir.path(),
        at.port(),
        Some(&dns),
        &through(&squid, "", &profiles),
    );
    let config = acme_proxy::config::Config::from_toml(&toml).expect("config");
    let summary = acme_proxy::admin::ops::describe_profiles(&config).join("\n");
    assert!(
        summary.contains(&format!("via proxy http://{}", squid.addr)),
        "the start-up summary does not say the upstream goes through squid: {summary}"
    );
    relay::register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(dir, &toml).await;

    let home = harness::tempdir();
    let d = home.path().to_path_buf();
    let name = "through-squid.example.test";
    let args = clients::certbot_certonly_standalone(&d, &server.directory("default"), at, name);
    let ran: Ran = clients::run("certbot", args, d.clone()).await;
    assert!(
        ran.success(),
        "certbot through the relay and squid failed\n{}\n{}\n--- squid ---\n{}\n{}",
        ran.report(),
        clients::certbot_log_tail(&d),
        squid.access_log(),
        squid.log()
    );
    let leaf = clients::leaf(&d.join("conf/live/t/cert.pem"), &|| ran.report());
    assert_eq!(leaf.sans, vec![name.to_owned()]);

    server.stop().await;
    let tunnel = format!("CONNECT {PEBBLE_NAME}:{}", pebble.addr.port());
    let log = squid.wait_for_line(&tunnel).await;
    for line in log.lines().filter(|l| l.contains(PEBBLE_NAME)) {
        assert!(
            line.contains("TCP_TUNNEL/200") && line.contains(&tunnel),
            "an upstream request squid did not tunnel: {line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_proxy_credentials_are_logged_and_metered_as_407_the_order_waits_and_issues_once_they_are_right()
 {
    const PASSWORD: &str = "Pr0xy-pa55word";
    const WRONG: &str = "not-the-pa55word";
    let Some((squid, pki, pebble)) = squid_and_pebble(Access::Password("relay", PASSWORD)) else {
        return;
    };
    let home = harness::tempdir();
    let data = home.path().join("data");
    let credentials = home.path().join("proxy-credentials");
    acme_proxy::private::write(&credentials, format!("relay:{PASSWORD}\n").as_bytes())
        .expect("credentials");
    let metrics = harness::own_addr();
    let egress = format!("proxy_credentials_file = \"{}\"", credentials.display());
    let profiles = relay::bypass_profile(&pebble.directory_url_by_name(), &pki, "");
    let toml = relay::server_toml(
        &data,
        harness::free_port(),
        None,
        &format!(
            "[metrics]\nlisten = \"{metrics}\"\n\n{}",
            through(&squid, &egress, &profiles)
        ),
    );
    // The operator registered with the right password; it changed since.
    relay::register_upstream_accounts(&toml).await;
    acme_proxy::private::write(&credentials, format!("relay:{WRONG}\n").as_bytes())
        .expect("credentials");
    let config = home.path().join("acme-proxy.toml");
    std::fs::write(&config, &toml).expect("config");
    let (server, directory) = harness::spawn_binary(
        home.path(),
        &["serve", "--config", config.to_str().expect("utf-8")],
        &[("RUST_LOG", "debug".to_owned())],
    );
    let log = home.path().join("acme-proxy.log");

    let account = client::account(&directory).await;
    let mut order = relay::ready_order(&account, &["behind-auth.example.test"]).await;
    order.finalize().await.expect("finalize answers");
    wait_for_proxy_failures(metrics, "407", 1.0).await;
    let text = std::fs::read_to_string(&log).expect("log");
    let refused = text
        .lines()
        .find(|l| l.contains("egress.proxy_refused"))
        .unwrap_or_else(|| panic!("no egress.proxy_refused line:\n{text}"));
    assert!(
        refused.contains("407") && refused.contains(&squid.addr.to_string()),
        "the refusal line names neither the answer nor the proxy: {refused}"
    );
    squid.wait_for_line("TCP_DENIED/407").await;
    let status = order.refresh().await.expect("poll").status;
    assert!(
        matches!(status, OrderStatus::Processing),
        "the order did not wait for the proxy: {status:?}"
    );

    // The operator puts the right password back and reloads.
    acme_proxy::private::write(&credentials, format!("relay:{PASSWORD}\n").as_bytes())
        .expect("credentials");
    Command::new("kill")
        .args(["-HUP", &server.0.id().to_string()])
        .status()
        .expect("kill -HUP");
    let chain = until_valid(&mut order, Duration::from_secs(60)).await;
    assert!(chain.contains("BEGIN CERTIFICATE"));
    drop(server);

    use base64::Engine as _;
    let text = std::fs::read_to_string(&log).expect("log");
    for secret in [PASSWORD, WRONG] {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("relay:{secret}"));
        for shown in [secret, basic.as_str()] {
            assert!(
                !text.contains(shown),
                "the proxy password appears in the log"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_named_in_no_proxy_never_reaches_squid_and_the_relay_still_issues() {
    let Some((squid, pki, pebble)) = squid_and_pebble(Access::Open) else {
        return;
    };
    // `default` relays to Pebble's address, which no_proxy names;
    // `named` relays to the same Pebble by name, through squid: the
    // control that squid logged the run.
    let host = pebble.addr.ip().to_string();
    let profiles = format!(
        "{}\n{}",
        relay::bypass_profile(&pebble.directory_url(), &pki, ""),
        relay::bypass_profile(&pebble.directory_url_by_name(), &pki, "")
            .replace("[profiles.default", "[profiles.named")
    );
    let egress = format!("loopback = \"proxy\"\nno_proxy = [\"{host}\"]");
    let dir = harness::tempdir();
    let toml = relay::server_toml(
        dir.path(),
        harness::free_port(),
        None,
        &through(&squid, &egress, &profiles),
    );
    let config = acme_proxy::config::Config::from_toml(&toml).expect("config");
    let summary = acme_proxy::admin::ops::describe_profiles(&config).join("\n");
    assert!(
        summary.contains("direct (no_proxy)"),
        "the summary does not show the exception: {summary}"
    );
    relay::register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(dir, &toml).await;
    for profile in ["default", "named"] {
        let account = client::account(&server.directory(profile)).await;
        let mut order = relay::ready_order(&account, &[&format!("{profile}.example.test")]).await;
        order.finalize().await.expect("finalize answers");
        until_valid(&mut order, Duration::from_secs(60)).await;
    }
    server.stop().await;
    let log = squid
        .wait_for_line(&format!("CONNECT {PEBBLE_NAME}:"))
        .await;
    let direct = format!("{host}:{}", pebble.addr.port());
    assert!(
        !log.contains(&direct),
        "squid saw the upstream that no_proxy names:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_from_env_a_webhook_goes_through_squid_and_http01_validation_never_does() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("certbot") {
        return;
    }
    let Some(squid) = Squid::start(Access::Open) else {
        return;
    };
    let receiver = Receiver::start().await;
    let port = receiver
        .url("/")
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .expect("the receiver's port");
    let at = harness::own_addr();
    let home = harness::tempdir();
    let data = home.path().join("data");
    let toml = TestServer::config_text(
        &data,
        at.port(),
        Some(&dns),
        &format!(
            "[jobs]\nbackoff_base = \"100ms\"\nbackoff_cap = \"1s\"\npoll_interval = \"100ms\"\n\n[egress]\nfrom_env = true\n\n[profiles.default]\nchallenges = [\"http-01\"]\n\n[profiles.default.notify.webhooks.ops]\nurl = \"http://{HOOKS_NAME}:{port}/hook\"\nevents = [\"certificate.issued\"]\n"
        ),
    );
    let config = home.path().join("acme-proxy.toml");
    std::fs::write(&config, &toml).expect("config");
    let proxy = squid.url();
    let (server, directory) = harness::spawn_binary(
        home.path(),
        &["serve", "--config", config.to_str().expect("utf-8")],
        &[
            ("HTTP_PROXY", proxy.clone()),
            ("HTTPS_PROXY", proxy.clone()),
            ("http_proxy", proxy.clone()),
            ("https_proxy", proxy),
            ("NO_PROXY", String::new()),
            ("no_proxy", String::new()),
        ],
    );

    let d = home.path().join("certbot");
    let name = "validated-direct.example.test";
    let args = clients::certbot_certonly_standalone(&d, &directory, at, name);
    let ran = clients::run("certbot", args, d.clone()).await;
    assert!(
        ran.success(),
        "certbot failed\n{}\n{}\n--- server ---\n{}",
        ran.report(),
        clients::certbot_log_tail(&d),
        std::fs::read_to_string(home.path().join("acme-proxy.log")).unwrap_or_default()
    );
    receiver
        .wait_for(
            "the certificate.issued webhook",
            Duration::from_secs(30),
            |got| got.iter().any(|r| r.body["event"] == "certificate.issued"),
        )
        .await;
    let log = squid
        .wait_for_line(&format!("POST http://{HOOKS_NAME}:{port}/hook"))
        .await;
    drop(server);
    assert!(
        !log.contains(name),
        "http-01 validation went through the proxy:\n{log}"
    );
    assert!(
        log.lines()
            .filter(|l| l.contains(HOOKS_NAME))
            .all(|l| l.contains("/200 ")),
        "the webhook was not delivered through squid:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_squid_stopped_mid_relay_the_order_waits_and_completes_when_it_returns() {
    let Some((mut squid, pki, pebble)) = squid_and_pebble(Access::Open) else {
        return;
    };
    let dir = harness::tempdir();
    let profiles = relay::bypass_profile(&pebble.directory_url_by_name(), &pki, "");
    let toml = relay::server_toml(
        dir.path(),
        harness::free_port(),
        None,
        &format!(
            "[metrics]\nlisten = \"127.0.0.1:0\"\n\n{}",
            through(&squid, "", &profiles)
        ),
    );
    relay::register_upstream_accounts(&toml).await;
    let server = TestServer::start_in(dir, &toml).await;
    let metrics = server.running().metrics_addr.expect("metrics");
    let account = client::account(&server.directory("default")).await;
    let mut first = relay::ready_order(&account, &["before.example.test"]).await;
    first.finalize().await.expect("finalize answers");
    until_valid(&mut first, Duration::from_secs(60)).await;

    squid.stop();
    let mut order = relay::ready_order(&account, &["during.example.test"]).await;
    order.finalize().await.expect("finalize answers");
    wait_for_proxy_failures(metrics, "unreachable", 2.0).await;
    let status = order.refresh().await.expect("poll").status;
    assert!(
        matches!(status, OrderStatus::Processing),
        "the order did not wait for the proxy: {status:?}"
    );

    squid.start_again();
    until_valid(&mut order, Duration::from_secs(60)).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_denies_the_upstream_is_reported_with_its_403_and_the_order_waits() {
    let Some((denying, pki, pebble)) = squid_and_pebble(Access::Denying(PEBBLE_NAME)) else {
        return;
    };
    let Some(open) = Squid::start(Access::Open) else {
        return;
    };
    let dir = harness::tempdir();
    let profiles = relay::bypass_profile(&pebble.directory_url_by_name(), &pki, "");
    let toml_for = |squid: &Squid| {
        relay::server_toml(
            dir.path(),
            harness::free_port(),
            None,
            &format!(
                "[metrics]\nlisten = \"127.0.0.1:0\"\n\n{}",
                through(squid, "", &profiles)
            ),
        )
    };
    let toml = toml_for(&denying);

    // Registration through the denying proxy says what the proxy answered.
    let config = acme_proxy::config::Config::from_toml(&toml).expect("config");
    acme_proxy::private::create_dir(&config.data_dir).expect("data dir");
    let store = acme_proxy_store::Store::open(
        &config.database_url(),
        &acme_proxy_store::StoreOptions::default(),
    )
    .await
    .expect("open the database");
    let refused = acme_proxy::admin::ops::register_upstream(
        &store,
        &acme_proxy::clock::SystemClock,
        &config,
        Some("default"),
        None,
        None,
    )
    .await
    .expect_err("registration through a proxy that denies the upstream");
    store.close().await;
    let refused = refused.to_string();
    assert!(
        refused.contains("403 Forbidden") && refused.contains(&denying.addr.to_string()),
        "the refusal does not give the proxy's answer: {refused}"
    );

    relay::register_upstream_accounts(&toml_for(&open)).await;
    let server = TestServer::start_in(dir, &toml).await;
    let metrics = server.running().metrics_addr.expect("metrics");
    let account = client::account(&server.directory("default")).await;
    let mut order = relay::ready_order(&account, &["denied.example.test"]).await;
    order.finalize().await.expect("finalize answers");
    wait_for_proxy_failures(metrics, "403", 2.0).await;
    let text = scrape(metrics).await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("acme_proxy_upstream_requests_total{")
                && l.contains("class=\"proxy_refused\"")),
        "the upstream requests are not counted as refused by the proxy:\n{text}"
    );
    let status = order.refresh().await.expect("poll").status;
    assert!(
        matches!(status, OrderStatus::Processing),
        "a proxy's refusal made the order {status:?}"
    );
    denying.wait_for_line("TCP_DENIED/403").await;
    server.stop().await;
}
