//! A finalize of an order this process created moments before signs
//! without reading the order (`authority/recent.rs`): the names it signs
//! for are those of its copy, and the write that stores the certificate
//! checks what may have changed. The tests change the order's names behind
//! the server's back to show which finalize read the order and which did
//! not.

use serde_json::{Value, json};

use crate::concurrency::{csr_for, ready_order};
use crate::harness::{TestServer, change_behind};
use crate::raw::{self, Acct, Key};

/// The id of the order at `order_url` (its last path segment).
fn order_id(order_url: &str) -> &str {
    order_url.rsplit('/').next().unwrap()
}

/// Gives the order at `order_url` another name in the database.
fn rename_behind(server: &TestServer, order_url: &str, name: &str) {
    change_behind(
        server,
        &format!(
            "UPDATE orders SET identifiers = '[{{\"type\":\"dns\",\"value\":\"{name}\"}}]' WHERE id = '{}'",
            order_id(order_url)
        ),
    );
}

/// Finalizes at `finalize_url` with a CSR for `name`: status and document.
async fn finalize(dir: &Value, acct: &Acct, finalize_url: &str, name: &str) -> (u16, Value) {
    let r = acct
        .post(dir, finalize_url, Some(&json!({"csr": csr_for(name)})))
        .await;
    (r.status, r.json())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalize_signs_an_order_this_process_created_from_its_copy_and_a_copy_serves_once() {
    let server = TestServer::start(1, None, "[profiles.default]\nbypass = true\n").await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;

    // Renamed in the database once ready: the finalize signs for the
    // names of the copy kept at newOrder, without reading the order.
    let (order_url, finalize_url) = ready_order(&dir, &acct, "kept.example.test").await;
    rename_behind(&server, &order_url, "elsewhere.example.test");
    let (status, doc) = finalize(&dir, &acct, &finalize_url, "kept.example.test").await;
    assert_eq!(
        (status, doc["status"].as_str()),
        (200, Some("valid")),
        "{doc}"
    );
    let cert = acct
        .post(&dir, doc["certificate"].as_str().unwrap(), None)
        .await;
    assert_eq!(cert.status, 200);
    assert!(
        String::from_utf8_lossy(&cert.body).contains("BEGIN CERTIFICATE"),
        "the certificate is stored and served"
    );

    // A finalize before the order is ready takes the copy, signs, and is
    // refused by the write; the answer is what a read of the order says.
    let r = acct
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "dns", "value": "early.example.test"}]})),
        )
        .await;
    assert_eq!(r.status, 201);
    let (early_url, early) = (r.location().unwrap(), r.json());
    let finalize_url = early["finalize"].as_str().unwrap();
    let (status, doc) = finalize(&dir, &acct, finalize_url, "early.example.test").await;
    assert_eq!(status, 403, "{doc}");
    assert_eq!(
        doc["type"], "urn:ietf:params:acme:error:orderNotReady",
        "{doc}"
    );
    assert!(
        doc["detail"]
            .as_str()
            .unwrap()
            .contains("pending, not ready"),
        "{doc}"
    );
    // Made ready and renamed: the copy was taken, so this finalize reads
    // the order, whose names the CSR no longer matches.
    let authz_url = early["authorizations"][0].as_str().unwrap();
    let authz = acct.post(&dir, authz_url, None).await.json();
    let chall = authz["challenges"][0]["url"].as_str().unwrap();
    assert_eq!(
        acct.post(&dir, chall, Some(&json!({}))).await.json()["status"],
        "valid"
    );
    rename_behind(&server, &early_url, "elsewhere.example.test");
    let (status, doc) = finalize(&dir, &acct, finalize_url, "early.example.test").await;
    assert_eq!(status, 400, "{doc}");
    assert_eq!(doc["type"], "urn:ietf:params:acme:error:badCSR", "{doc}");
    let order = acct.post(&dir, &early_url, None).await.json();
    assert_eq!(order["status"], "ready", "{order}");
    assert!(order["certificate"].is_null(), "{order}");
    server.stop().await;
}
