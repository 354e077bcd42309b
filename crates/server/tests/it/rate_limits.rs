//! `[rate_limits]`: the sixth order in a window of five refused with
//! `rateLimited` and `Retry-After` (in process and to certbot, which tells
//! its user), across a restart; an override and `ratelimit reset` giving
//! the allowance back; new accounts per address.

use serde_json::json;

use crate::clients::{Proxy, certbot_certonly_standalone, run};
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
        .authority
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
    let metrics = server.running().authority.render_metrics().await;
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
        .authority
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
