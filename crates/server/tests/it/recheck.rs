//! Finalize looks again (RFC 8555 §7.4): an order's authorizations must
//! still be valid when it is finalized, and CAA is looked up again for a
//! name validated longer ago than `validation.caa_recheck_after` (RFC 8659).
//! The server runs on a clock the test moves.

use std::sync::Arc;
use std::time::Duration;

use acme_proxy::clock::ManualClock;
use acme_proxy::config::Config;
use serde_json::{Value, json};

use crate::concurrency::csr_for;
use crate::harness::{Dns, Responder, TestServer};
use crate::raw::{self, Acct, Key};
use crate::recovery::pending_challenge;

/// An order for `name` made ready by http-01; its URL.
async fn ready_order(dir: &Value, acct: &Acct, responder: &Responder, name: &str) -> String {
    let (chall, order_url) = pending_challenge(dir, acct, responder, name).await;
    let settled = acct.trigger_and_settle(dir, &chall).await;
    assert_eq!(settled["status"], "valid", "{settled}");
    let order = acct.post(dir, &order_url, None).await.json();
    assert_eq!(order["status"], "ready", "{order}");
    order_url
}

/// Finalizes the order at `order_url` with a CSR for `name`: status and
/// document.
async fn finalize(dir: &Value, acct: &Acct, order_url: &str, name: &str) -> (u16, Value) {
    let order = acct.post(dir, order_url, None).await.json();
    let r = acct
        .post(
            dir,
            order["finalize"].as_str().unwrap(),
            Some(&json!({"csr": csr_for(name)})),
        )
        .await;
    assert!(r.headers.contains_key("replay-nonce"));
    (r.status, r.json())
}

/// A server on a clock the test moves, with its DNS server, http-01
/// responder and one account.
struct OnItsClock {
    dns: Dns,
    responder: Responder,
    clock: Arc<ManualClock>,
    server: acme_proxy::server::Running,
    dir: Value,
    acct: Acct,
    _data: tempfile::TempDir,
}

impl OnItsClock {
    /// `profile`: the `[profiles.default]` table.
    async fn start(profile: &str) -> Option<Self> {
        let dns = Dns::start()?;
        let responder = Responder::start().await;
        let data = crate::harness::tempdir();
        let toml = TestServer::config_text(data.path(), responder.port, Some(&dns), profile);
        let config = Config::from_toml(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let clock = Arc::new(ManualClock::starting_now());
        let server = acme_proxy::server::start(config, Arc::clone(&clock) as _)
            .await
            .expect("server starts");
        let dir = raw::directory(&server.directory_url("default")).await;
        let acct = Acct::create(&dir, Key::p256()).await;
        Some(Self {
            dns,
            responder,
            clock,
            server,
            dir,
            acct,
            _data: data,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalize_refuses_an_order_whose_authorization_expired_after_it_was_ready() {
    let Some(t) = OnItsClock::start(
        "[profiles.default]\norder_lifetime = \"1d\"\nauthorization_lifetime = \"1h\"\n",
    )
    .await
    else {
        return;
    };
    let (dir, acct) = (&t.dir, &t.acct);
    let order_url = ready_order(dir, acct, &t.responder, "lapsed.example.test").await;

    t.clock.advance(Duration::from_secs(2 * 3600));
    let (status, doc) = finalize(dir, acct, &order_url, "lapsed.example.test").await;
    assert_eq!(status, 403, "{doc}");
    assert_eq!(doc["type"], "urn:ietf:params:acme:error:orderNotReady");
    assert!(doc["detail"].as_str().unwrap().contains("expired"), "{doc}");
    let order = acct.post(dir, &order_url, None).await.json();
    assert!(order["certificate"].is_null(), "{order}");
    t.server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalize_looks_up_caa_again_for_a_name_validated_longer_ago_than_the_recheck_age() {
    let Some(t) = OnItsClock::start(
        "[profiles.default]\ncaa = true\ncaa_identities = [\"ca.example.test\"]\n",
    )
    .await
    else {
        return;
    };
    let (dir, acct, responder, dns, clock) = (&t.dir, &t.acct, &t.responder, &t.dns, &t.clock);
    // Both validated while the names have no CAA record.
    let recent = ready_order(dir, acct, responder, "recent.caa.test").await;
    let old = ready_order(dir, acct, responder, "old.caa.test").await;
    // Then another CA is named in both names' CAA records.
    for host in ["recent.caa.test.", "old.caa.test."] {
        dns.manage(
            "add-caa",
            json!({"host": host, "policies": [{"tag": "issue", "value": "other.example"}]}),
        )
        .await;
    }
    // Within the default 8 hours the lookup made at validation stands.
    clock.advance(Duration::from_secs(3600));
    let (status, doc) = finalize(dir, acct, &recent, "recent.caa.test").await;
    assert_eq!(status, 200, "{doc}");
    // Past them it is made again, and refuses.
    clock.advance(Duration::from_secs(8 * 3600));
    let (status, doc) = finalize(dir, acct, &old, "old.caa.test").await;
    assert_eq!(status, 400, "{doc}");
    assert_eq!(doc["type"], "urn:ietf:params:acme:error:caa", "{doc}");
    assert!(
        doc["detail"]
            .as_str()
            .unwrap()
            .contains("CAA checked again"),
        "{doc}"
    );
    t.server.shutdown(Duration::from_secs(5)).await;
}
