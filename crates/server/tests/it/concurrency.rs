//! Races the RFC makes the server win: one nonce used many times at once
//! (§6.5: exactly one use succeeds), and concurrent finalizes of one order
//! (§7.4: exactly one certificate).

use serde_json::json;

use crate::harness::TestServer;
use crate::raw::{self, Acct, Key, b64};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nonce_used_by_100_concurrent_requests_is_accepted_exactly_once() {
    let server = TestServer::start(1, None, "[profiles.default]\nbypass = true\n").await;
    let dir = raw::directory(&server.directory("default")).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let nonce = raw::nonce(&dir).await;
    let protected = json!({"alg": "ES256", "kid": alice.url, "nonce": nonce, "url": alice.url});
    let body = alice.key.sign(&protected, None);
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let url = alice.url.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move { raw::post(&url, &body).await }));
    }
    let mut accepted = 0;
    let mut bad_nonce = 0;
    for t in tasks {
        let r = t.await.unwrap();
        match (r.status, r.problem().as_str()) {
            (200, "") => accepted += 1,
            (400, "badNonce") => bad_nonce += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!((accepted, bad_nonce), (1, 99));
    server.stop().await;
}

/// `body` sent to `url` by `n` requests at once: how many were accepted
/// with `status`, and how many refused `badNonce`.
async fn sent_at_once(url: &str, body: &serde_json::Value, n: usize, status: u16) -> (u32, u32) {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (url, body) = (url.to_owned(), body.clone());
        tasks.push(tokio::spawn(async move { raw::post(&url, &body).await }));
    }
    let (mut accepted, mut bad_nonce) = (0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        match (r.status, r.problem().as_str()) {
            (s, "") if s == status => accepted += 1,
            (400, "badNonce") => bad_nonce += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    (accepted, bad_nonce)
}

/// The requests of an issuance record their nonce with their own first
/// statement on PostgreSQL (`Store::spending_nonce`): a replay must still
/// lose there, write nothing, and be told `badNonce`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nonce_sent_by_40_new_orders_and_40_order_reads_at_once_is_accepted_once_and_makes_one_order()
 {
    let server = TestServer::start(1, None, "[profiles.default]\nbypass = true\n").await;
    let dir = raw::directory(&server.directory("default")).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let new_order = dir["newOrder"].as_str().unwrap();
    let protected = json!({"alg": "ES256", "kid": alice.url, "nonce": raw::nonce(&dir).await, "url": new_order});
    let body = alice.key.sign(
        &protected,
        Some(&json!({"identifiers": [{"type": "dns", "value": "once.example.test"}]})),
    );
    assert_eq!(sent_at_once(new_order, &body, 40, 201).await, (1, 39));
    let list_url = alice.post(&dir, &alice.url, None).await.json()["orders"]
        .as_str()
        .unwrap()
        .to_owned();
    let orders = alice.post(&dir, &list_url, None).await.json()["orders"].clone();
    assert_eq!(orders.as_array().map(Vec::len), Some(1), "{orders}");
    let order_url = orders[0].as_str().unwrap();
    let protected = json!({"alg": "ES256", "kid": alice.url, "nonce": raw::nonce(&dir).await, "url": order_url});
    let body = alice.key.sign(&protected, None);
    assert_eq!(sent_at_once(order_url, &body, 40, 200).await, (1, 39));
    server.stop().await;
}

/// A ready order of `acct` for one name, through the bypass profile.
pub(crate) async fn ready_order(
    dir: &serde_json::Value,
    acct: &Acct,
    name: &str,
) -> (String, String) {
    ready_order_for(
        dir,
        acct,
        &json!({"identifiers": [{"type": "dns", "value": name}]}),
    )
    .await
}

/// A ready order of `acct` for any newOrder payload, through the bypass
/// profile: the first challenge of every authorization is triggered.
pub(crate) async fn ready_order_for(
    dir: &serde_json::Value,
    acct: &Acct,
    new_order: &serde_json::Value,
) -> (String, String) {
    let r = acct
        .post(dir, dir["newOrder"].as_str().unwrap(), Some(new_order))
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let order_url = r.location().unwrap();
    let finalize = r.json()["finalize"].as_str().unwrap().to_owned();
    for authz_url in r.json()["authorizations"].as_array().unwrap() {
        let authz = acct
            .post(dir, authz_url.as_str().unwrap(), None)
            .await
            .json();
        let chall = authz["challenges"][0]["url"].as_str().unwrap().to_owned();
        let r = acct.post(dir, &chall, Some(&json!({}))).await;
        assert_eq!(
            r.json()["status"],
            "valid",
            "bypass makes the challenge valid at once"
        );
    }
    let order = acct.post(dir, &order_url, None).await.json();
    assert_eq!(order["status"], "ready");
    (order_url, finalize)
}

pub(crate) fn csr_for(name: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    b64(params.serialize_request(&key).unwrap().der())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_concurrent_finalizes_of_one_order_produce_exactly_one_certificate() {
    let server = TestServer::start(1, None, "[profiles.default]\nbypass = true\n").await;
    let dir = raw::directory(&server.directory("default")).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    for round in 0..5 {
        let name = format!("race{round}.example.test");
        let (order_url, finalize) = ready_order(&dir, &alice, &name).await;
        // Both requests are signed before either is sent, so they race.
        let mut bodies = Vec::new();
        for _ in 0..2 {
            let protected = json!({"alg": "ES256", "kid": alice.url, "nonce": raw::nonce(&dir).await, "url": finalize});
            bodies.push(
                alice
                    .key
                    .sign(&protected, Some(&json!({"csr": csr_for(&name)}))),
            );
        }
        let (a, b) = tokio::join!(
            raw::post(&finalize, &bodies[0]),
            raw::post(&finalize, &bodies[1])
        );
        let mut outcomes = vec![
            (
                a.status,
                a.json()["status"].as_str().unwrap_or("").to_owned(),
                a.problem(),
            ),
            (
                b.status,
                b.json()["status"].as_str().unwrap_or("").to_owned(),
                b.problem(),
            ),
        ];
        outcomes.sort();
        assert_eq!(
            outcomes,
            vec![
                (200, "valid".to_owned(), String::new()),
                (403, String::new(), "orderNotReady".to_owned())
            ],
            "round {round}"
        );
        let order = alice.post(&dir, &order_url, None).await.json();
        assert_eq!(order["status"], "valid");
        let cert = alice
            .post(&dir, order["certificate"].as_str().unwrap(), None)
            .await;
        assert_eq!(cert.status, 200);
        assert_eq!(
            cert.headers["content-type"],
            "application/pem-certificate-chain"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_bad_csr_leaves_the_order_ready_for_a_good_one() {
    let server = TestServer::start(1, None, "[profiles.default]\nbypass = true\n").await;
    let dir = raw::directory(&server.directory("default")).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let (order_url, finalize) = ready_order(&dir, &alice, "csr.example.test").await;
    let r = alice
        .post(
            &dir,
            &finalize,
            Some(&json!({"csr": csr_for("other.example.test")})),
        )
        .await;
    assert_eq!((r.status, r.problem().as_str()), (400, "badCSR"));
    assert_eq!(
        alice.post(&dir, &order_url, None).await.json()["status"],
        "ready"
    );
    let r = alice
        .post(
            &dir,
            &finalize,
            Some(&json!({"csr": csr_for("csr.example.test")})),
        )
        .await;
    assert_eq!(
        r.json()["status"],
        "valid",
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    server.stop().await;
}
