//! Fair work: one account's validations that hang (hosts that accept and
//! never answer) hold at most `jobs.validations_per_account` validation
//! slots, and each kind of job has slots of its own, so another account's
//! issuance and the webhooks it triggers are not held up behind them.

use std::time::Duration;

use serde_json::json;

use crate::clients::{certbot_common, certbot_log_tail, run};
use crate::harness::{self, Dns, Receiver, Responder, TestServer};
use crate::raw::{self, Acct, Key};

/// certbot obtaining `name` over http-01 with its own server on
/// 127.0.0.2:`port`, its state in a directory of its own; how long it took.
async fn certbot(directory: &str, port: u16, name: &str) -> Duration {
    let home = harness::tempdir();
    let d = home.path().to_path_buf();
    let mut args = vec!["certonly".to_owned()];
    args.extend(certbot_common(&d, directory));
    args.extend(
        [
            "--standalone",
            "--http-01-port",
            &port.to_string(),
            "--http-01-address",
            "127.0.0.2",
            "-d",
            name,
            "--cert-name",
            "t",
        ]
        .map(str::to_owned),
    );
    let ran = run("certbot", args, d.clone()).await;
    assert!(
        ran.success(),
        "certbot failed\n{}\n{}",
        ran.report(),
        certbot_log_tail(&d)
    );
    ran.elapsed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_accounts_hanging_validations_delay_neither_another_accounts_certbot_nor_a_webhook() {
    let Some(dns) = Dns::start() else { return };
    if !harness::require_program("certbot") {
        return;
    }
    // The hosts of the first account: they accept and never answer, so
    // each of its validations holds a slot for validation.timeout (30 s,
    // longer than the test).
    let hung = Responder::start().await;
    hung.hang_next(usize::MAX);
    let port = hung.port;
    // The other account's host is certbot's own server, on 127.0.0.2.
    dns.add_a("patient.example.test.", "127.0.0.2").await;
    dns.add_a("again.example.test.", "127.0.0.2").await;
    let hooks = Receiver::start().await;
    let data = harness::tempdir();
    let toml = TestServer::config_text(
        data.path(),
        port,
        Some(&dns),
        &format!(
            "[jobs]\npoll_interval = \"50ms\"\n[profiles.default]\n[profiles.default.notify.webhooks.ops]\nurl = \"{}\"\nevents = [\"certificate.issued\"]\n",
            hooks.url("/hook")
        ),
    )
    .replacen(
        &crate::harness::allow_networks_line(),
        "allow_networks = [\"127.0.0.1\", \"127.0.0.2\"]",
        1,
    )
    .replacen("timeout = \"5s\"", "timeout = \"30s\"", 1);
    assert!(toml.contains("timeout = \"30s\""), "{toml}");
    let server = TestServer::start_in(data, &toml).await;
    let directory = server.directory("default");

    // How long certbot takes with nothing else going on.
    let quiet = certbot(&directory, port, "patient.example.test").await;
    hooks
        .wait_for(
            "the first issuance's webhook",
            Duration::from_secs(5),
            |got| got.len() == 1,
        )
        .await;

    // The first account orders 40 names and triggers every challenge.
    let dir = raw::directory(&directory).await;
    let greedy = Acct::create(&dir, Key::p256()).await;
    let identifiers: Vec<serde_json::Value> = (0..40)
        .map(|i| json!({"type": "dns", "value": format!("hung-{i}.example.test")}))
        .collect();
    let r = greedy
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({ "identifiers": identifiers })),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json());
    for authz in r.json()["authorizations"].as_array().unwrap() {
        let authz = greedy
            .post(&dir, authz.as_str().unwrap(), None)
            .await
            .json();
        let ch = authz["challenges"][0]["url"].as_str().unwrap().to_owned();
        let t = greedy.post(&dir, &ch, Some(&json!({}))).await;
        assert_eq!(t.json()["status"], "processing");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while hung.hits() < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "the validations never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Meanwhile the other account's certbot takes no longer than before,
    // and the webhook of its issuance arrives as it finishes.
    let busy = certbot(&directory, port, "again.example.test").await;
    assert!(
        busy < quiet + Duration::from_secs(1),
        "certbot took {busy:?} beside the hanging validations, {quiet:?} without"
    );
    hooks
        .wait_for(
            "the second issuance's webhook",
            Duration::from_secs(1),
            |got| got.len() == 2,
        )
        .await;
    // The first account never had more than its share in flight: its
    // hosts were asked no more than validations_per_account at once.
    assert_eq!(hung.hits(), 8, "the first account's validations in flight");
    server.stop().await;
}

#[tokio::test]
async fn an_account_past_its_pending_authorizations_is_rate_limited_and_a_long_order_rejected() {
    let server = TestServer::start(
        1,
        None,
        "[profiles.default]\nmax_identifiers = 3\nmax_pending_authorizations = 4\n",
    )
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    let order = |n: usize, prefix: &str| {
        let ids: Vec<serde_json::Value> = (0..n)
            .map(|i| json!({"type": "dns", "value": format!("{prefix}-{i}.example.test")}))
            .collect();
        json!({ "identifiers": ids })
    };
    let busy = Acct::create(&dir, Key::p256()).await;
    let new_order = dir["newOrder"].as_str().unwrap();
    let r = busy.post(&dir, new_order, Some(&order(4, "long"))).await;
    assert_eq!(r.status, 400, "{}", r.json());
    assert_eq!(
        r.json()["type"],
        "urn:ietf:params:acme:error:rejectedIdentifier"
    );
    assert!(r.headers.contains_key("replay-nonce"));
    let r = busy.post(&dir, new_order, Some(&order(3, "first"))).await;
    assert_eq!(r.status, 201, "{}", r.json());
    // 3 pending + 2 more would pass 4.
    let r = busy.post(&dir, new_order, Some(&order(2, "second"))).await;
    assert_eq!(r.status, 429, "{}", r.json());
    assert_eq!(r.json()["type"], "urn:ietf:params:acme:error:rateLimited");
    assert!(r.headers.contains_key("retry-after"));
    assert!(r.headers.contains_key("replay-nonce"));
    let r = busy.post(&dir, new_order, Some(&order(1, "third"))).await;
    assert_eq!(r.status, 201, "one more fits: {}", r.json());
    // Another account has its own allowance.
    let other = Acct::create(&dir, Key::p256()).await;
    let r = other.post(&dir, new_order, Some(&order(3, "other"))).await;
    assert_eq!(r.status, 201, "{}", r.json());
    server.stop().await;
}
