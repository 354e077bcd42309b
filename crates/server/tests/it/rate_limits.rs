//! `[rate_limits]`: the sixth order in a window of five refused with
//! `rateLimited` and `Retry-After` (in process and to certbot, which tells
//! its user), across a restart; an override and `ratelimit reset` giving
//! the allowance back; new accounts per address; failed validations per
//! account and name; certificates per registered domain and duplicate
//! certificates (checked at newOrder, taken at finalize); pending
//! authorizations with an override.

use serde_json::json;

use crate::clients::{Proxy, certbot_certonly_standalone, run};
use crate::concurrency::{csr_for, ready_order};
use crate::harness::{self, Dns, TestServer};
use crate::raw::{self, Acct, Key};

const FIVE_AN_HOUR: &str = "[rate_limits]\nnew_orders_per_account = \"5/1h\"\n";

async fn new_order(dir: &serde_json::Value, acct: &Acct, name: &str) -> raw::Resp {
    acct.post(
        dir,
        dir["newOrder"].as_str().unwrap(),
        Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sixth_order_in_a_window_of_five_waits_across_a_restart_until_an_override_or_a_reset() {
    let data = harness::tempdir();
    let base = TestServer::config_text(data.path(), 1, None, "");
    let toml = format!("{base}{FIVE_AN_HOUR}");
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    let mut acct = Acct::create(&dir, Key::p256()).await;
    let id = acct.url.rsplit('/').next().unwrap().to_owned();
    // Each start listens on a port of its own: the account's URL follows.
    let mut base = server.base().to_owned();
    let mut moved = |acct: &mut Acct, server: &TestServer| {
        acct.url = acct.url.replace(&base, server.base());
        base = server.base().to_owned();
    };
    // An order refused for another reason takes no place.
    let r = new_order(&dir, &acct, "not..a.name").await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    for i in 0..5 {
        let r = new_order(&dir, &acct, &format!("n{i}.example.test")).await;
        assert_eq!(
            r.status,
            201,
            "order {i}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let r = new_order(&dir, &acct, "n5.example.test").await;
    r.assert_refused(429, "rateLimited", "the sixth order within the hour");
    // One place frees every 12 minutes.
    let wait: u64 = r
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((700..=720).contains(&wait), "Retry-After {wait}");
    let detail = r.json()["detail"].as_str().unwrap_or("").to_owned();
    assert!(
        detail.starts_with(
            "over the rate limit new_orders_per_account (5 per 1h): the next is allowed at "
        ) && detail.ends_with(&format!(", in {wait} seconds")),
        "{detail}"
    );
    // Another account has its own allowance.
    let other = Acct::create(&dir, Key::p256()).await;
    assert_eq!(new_order(&dir, &other, "o.example.test").await.status, 201);
    server.stop().await;

    // A restart hands out nothing new.
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    moved(&mut acct, &server);
    let dir = raw::directory(&server.directory("default")).await;
    let r = new_order(&dir, &acct, "n6.example.test").await;
    r.assert_refused(429, "rateLimited", "the sixth order after a restart");
    let (_etc, config) = harness::config_file(&toml);
    let key = format!("new_orders:account:{id}");
    let out = harness::run_cli(
        &config,
        &["ratelimit", "show", "--key", "new_orders:", "--json"],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let shown: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    let keys: Vec<&str> = shown
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| k["key"].as_str())
        .collect();
    assert!(keys.contains(&key.as_str()) && keys.len() == 2, "{keys:?}");
    server.stop().await;

    // An override for this account raises its limit.
    let raised = format!(
        "{toml}[rate_limits.overrides.ci]\naccount = \"{id}\"\nnew_orders_per_account = \"100/1h\"\n"
    );
    let server = TestServer::start_in(harness::tempdir(), &raised).await;
    moved(&mut acct, &server);
    let dir = raw::directory(&server.directory("default")).await;
    let r = new_order(&dir, &acct, "n7.example.test").await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    server.stop().await;

    // Without it, full again; `ratelimit reset` gives the allowance back,
    // audited.
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    moved(&mut acct, &server);
    let dir = raw::directory(&server.directory("default")).await;
    new_order(&dir, &acct, "n8.example.test")
        .await
        .assert_refused(429, "rateLimited", "full without the override");
    let out = harness::run_cli(
        &config,
        &["ratelimit", "reset", &key, "--actor", "operator:test"],
        &[],
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    for i in 0..5 {
        let r = new_order(&dir, &acct, &format!("r{i}.example.test")).await;
        assert_eq!(r.status, 201, "after the reset, order {i}");
    }
    let rows = server
        .running()
        .authority()
        .store()
        .audit_recent(Some("ratelimit.reset"), 5)
        .await
        .expect("audit");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].actor, "operator:test");
    assert_eq!(
        rows[0].detail.as_deref(),
        Some(format!("rate limit key {key}").as_str())
    );
    let metrics = server.running().authority().render_metrics().await;
    let line = "acme_proxy_rate_limited_total{limit=\"new_orders_per_account\"} 1";
    assert!(metrics.contains(line), "{line} in\n{metrics}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_past_its_new_accounts_is_refused_and_the_refusal_audited() {
    let server = TestServer::start(
        1,
        None,
        "[profiles.default]\n[rate_limits]\nnew_accounts_per_address = \"2/1h\"\n",
    )
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    Acct::create(&dir, Key::p256()).await;
    let kept = Acct::create(&dir, Key::p256()).await;
    let key = Key::p256();
    let url = dir["newAccount"].as_str().unwrap();
    let protected =
        json!({"alg": key.alg(), "jwk": key.jwk, "nonce": raw::nonce(&dir).await, "url": url});
    let r = raw::post(
        url,
        &key.sign(&protected, Some(&json!({"termsOfServiceAgreed": true}))),
    )
    .await;
    r.assert_refused(429, "rateLimited", "the third new account from 127.0.0.1");
    // An existing account's key is not a new account.
    let protected = json!({"alg": kept.key.alg(), "jwk": kept.key.jwk, "nonce": raw::nonce(&dir).await, "url": url});
    let r = raw::post(
        url,
        &kept
            .key
            .sign(&protected, Some(&json!({"termsOfServiceAgreed": true}))),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let rows = server
        .running()
        .authority()
        .store()
        .audit_recent(Some("account.refused"), 5)
        .await
        .expect("audit");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].problem_type.as_deref(), Some("rateLimited"));
    assert_eq!(rows[0].client_ip.as_deref(), Some("127.0.0.1"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_tells_its_user_when_its_sixth_order_in_a_window_of_five_may_be_tried_again() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    // Debian's certbot 2 crashes on a 429 (its acme library sets an
    // attribute it cannot); certbot 5 reports it.
    let Some(certbot) = harness::certbot5() else {
        return;
    };
    let certbot = certbot.display().to_string();
    let at = harness::own_addr();
    let proxy = Proxy::start(
        &dns,
        at.port(),
        &format!("[profiles.default]\n{FIVE_AN_HOUR}"),
    );
    let home = harness::tempdir();
    let d = home.path().to_path_buf();
    for i in 0..6 {
        let name = format!("limit{i}.example.test");
        let mut args = certbot_certonly_standalone(&d, &proxy.directory, at, &name);
        // A lineage of its own per name.
        let last = args.len() - 1;
        args[last] = format!("t{i}");
        let ran = run(certbot.clone(), args, d.clone()).await;
        if i < 5 {
            assert!(ran.success(), "certbot run {i}\n{}", ran.report());
        } else {
            assert!(
                !ran.success(),
                "the sixth order was issued\n{}",
                ran.report()
            );
            let said = ran.report();
            assert!(
                said.contains(
                    "over the rate limit new_orders_per_account (5 per 1h): the next is allowed at"
                ),
                "certbot tells when to try again\n{said}"
            );
        }
    }
}

/// Asserts that `r`'s problem detail starts with `prefix`.
fn assert_detail_starts(r: &raw::Resp, prefix: &str) {
    let detail = r.json()["detail"].as_str().unwrap_or("").to_owned();
    assert!(detail.starts_with(prefix), "{detail}");
}

/// The metric lines of `authority` that count refusals by `limit`.
async fn refused_by(authority: &acme_proxy::authority::Authority, limit: &str) -> String {
    let metrics = authority.render_metrics().await;
    let prefix = format!("acme_proxy_rate_limited_total{{limit=\"{limit}\"}} ");
    metrics
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or("")
        .to_owned()
}

/// An order for the IP address `ip` whose http-01 challenge fails: the
/// test server validates on port 1, where nothing listens.
async fn failed_validation(dir: &serde_json::Value, acct: &Acct, ip: &str) {
    let r = acct
        .post(
            dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "ip", "value": ip}]})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let authz_url = r.json()["authorizations"][0].as_str().unwrap().to_owned();
    let authz = acct.post(dir, &authz_url, None).await.json();
    let challenge = authz["challenges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "http-01")
        .and_then(|c| c["url"].as_str())
        .expect("an http-01 challenge")
        .to_owned();
    let settled = acct.trigger_and_settle(dir, &challenge).await;
    assert_eq!(settled["status"], "invalid", "{settled}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_failed_validation_too_often_is_refused_for_that_account_only() {
    let server = TestServer::start(
        1,
        None,
        "[profiles.default]\n[rate_limits]\nfailed_validations_per_account_and_name = \"2/1h\"\n",
    )
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    failed_validation(&dir, &acct, "127.0.0.1").await;
    failed_validation(&dir, &acct, "127.0.0.1").await;
    let ip = |value: &str| json!({"identifiers": [{"type": "ip", "value": value}]});
    let r = acct
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&ip("127.0.0.1")),
        )
        .await;
    r.assert_refused(429, "rateLimited", "a third order after two failures");
    assert_detail_starts(
        &r,
        "over the rate limit failed_validations_per_account_and_name (2 per 1h) for 127.0.0.1: the next is allowed at ",
    );
    assert!(r.headers.contains_key("retry-after"));
    // Another name of the same account (this test's own loopback address,
    // which the test server may validate too), and the same name for
    // another account, are not held back.
    let own = harness::own_host().to_string();
    let r = acct
        .post(&dir, dir["newOrder"].as_str().unwrap(), Some(&ip(&own)))
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let other = Acct::create(&dir, Key::p256()).await;
    let r = other
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&ip("127.0.0.1")),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        refused_by(
            &server.running().authority(),
            "failed_validations_per_account_and_name"
        )
        .await,
        "acme_proxy_rate_limited_total{limit=\"failed_validations_per_account_and_name\"} 1"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_per_registered_domain_and_duplicates_are_refused_at_new_order_and_at_finalize()
 {
    let data = harness::tempdir();
    let base = TestServer::config_text(
        data.path(),
        1,
        None,
        "[profiles.default]\nbypass = true\n[rate_limits]\ncertificates_per_domain = \"3/7d\"\nduplicate_certificates = \"2/7d\"\n",
    );
    let server = TestServer::start_in(harness::tempdir(), &base).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let issue = |name: &'static str| {
        let (dir, acct) = (&dir, &acct);
        async move {
            let (_, finalize) = ready_order(dir, acct, name).await;
            acct.post(dir, &finalize, Some(&json!({"csr": csr_for(name)})))
                .await
        }
    };
    // The same name twice: the third is a duplicate too many, refused
    // before its authorizations are made.
    for _ in 0..2 {
        assert_eq!(issue("a.example.com").await.json()["status"], "valid");
    }
    let r = new_order(&dir, &acct, "a.example.com").await;
    r.assert_refused(429, "rateLimited", "a third certificate for one set");
    assert_detail_starts(
        &r,
        "over the rate limit duplicate_certificates (2 per 7days) for this set of identifiers: ",
    );
    // Another name under the same registered domain is the third
    // certificate of example.com; a fourth is refused at newOrder. A name
    // under co.uk counts against its own registered domain.
    assert_eq!(issue("b.example.com").await.json()["status"], "valid");
    let r = new_order(&dir, &acct, "c.example.com").await;
    r.assert_refused(429, "rateLimited", "a fourth certificate of example.com");
    assert_detail_starts(
        &r,
        "over the rate limit certificates_per_domain (3 per 7days) for example.com: ",
    );
    assert_eq!(issue("www.example.co.uk").await.json()["status"], "valid");

    // Four orders of example.org made ready before any is finalized: the
    // places are taken at finalize, so the fourth is refused there and
    // stays ready.
    let mut ready = Vec::new();
    for name in [
        "w.example.org",
        "x.example.org",
        "y.example.org",
        "z.example.org",
    ] {
        ready.push((name, ready_order(&dir, &acct, name).await));
    }
    for (name, (_, finalize)) in &ready[..3] {
        let r = acct
            .post(&dir, finalize, Some(&json!({"csr": csr_for(name)})))
            .await;
        assert_eq!(r.json()["status"], "valid", "{name}");
    }
    let (name, (order_url, finalize)) = &ready[3];
    let r = acct
        .post(&dir, finalize, Some(&json!({"csr": csr_for(name)})))
        .await;
    r.assert_refused(429, "rateLimited", "the fourth finalize of example.org");
    assert_eq!(
        acct.post(&dir, order_url, None).await.json()["status"],
        "ready"
    );

    // An override counts this account's certificates apart: it finalizes,
    // and another account is still held back by the shared count.
    let id = acct.url.rsplit('/').next().unwrap();
    let raised = format!(
        "{base}[rate_limits.overrides.fleet]\naccount = \"{id}\"\ncertificates_per_domain = \"100/7d\"\n"
    );
    server
        .running()
        .reload(acme_proxy::config::Config::from_toml(&raised).expect("config"))
        .await
        .expect("reloaded");
    let r = acct
        .post(&dir, finalize, Some(&json!({"csr": csr_for(name)})))
        .await;
    assert_eq!(
        r.json()["status"],
        "valid",
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let other = Acct::create(&dir, Key::p256()).await;
    new_order(&dir, &other, "v.example.org")
        .await
        .assert_refused(429, "rateLimited", "another account at example.org");
    let authority = &server.running().authority();
    assert_eq!(
        refused_by(authority, "duplicate_certificates").await,
        "acme_proxy_rate_limited_total{limit=\"duplicate_certificates\"} 1"
    );
    assert_eq!(
        refused_by(authority, "certificates_per_domain").await,
        "acme_proxy_rate_limited_total{limit=\"certificates_per_domain\"} 3"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_authorizations_are_bounded_per_account_and_an_override_raises_the_bound() {
    let data = harness::tempdir();
    let base = TestServer::config_text(
        data.path(),
        1,
        None,
        "[profiles.default]\nmax_pending_authorizations = 2\n",
    );
    let server = TestServer::start_in(harness::tempdir(), &base).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    for name in ["p1.example.test", "p2.example.test"] {
        assert_eq!(new_order(&dir, &acct, name).await.status, 201);
    }
    let r = new_order(&dir, &acct, "p3.example.test").await;
    r.assert_refused(429, "rateLimited", "a third pending authorization");
    assert_eq!(
        r.json()["detail"],
        "over the limit pending_authorizations_per_account (2 at this profile): this account has 2 pending authorizations; validate or let expire some before ordering more"
    );
    let id = acct.url.rsplit('/').next().unwrap();
    let raised = format!(
        "{base}[rate_limits.overrides.fleet]\naccount = \"{id}\"\npending_authorizations_per_account = 3\n"
    );
    server
        .running()
        .reload(acme_proxy::config::Config::from_toml(&raised).expect("config"))
        .await
        .expect("reloaded");
    assert_eq!(new_order(&dir, &acct, "p3.example.test").await.status, 201);
    new_order(&dir, &acct, "p4.example.test")
        .await
        .assert_refused(429, "rateLimited", "past the raised bound");
    assert_eq!(
        refused_by(
            &server.running().authority(),
            "pending_authorizations_per_account"
        )
        .await,
        "acme_proxy_rate_limited_total{limit=\"pending_authorizations_per_account\"} 2"
    );
    server.stop().await;
}
