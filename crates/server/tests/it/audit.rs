//! The audit trail as operators read it: `acme-proxy audit list|show`
//! against the real database after a real issuance, a refusal and a
//! revocation.

use std::time::Duration;

use instant_acme::{Identifier, NewOrder, OrderStatus};

use crate::client;
use crate::harness::{self, Responder, TestServer};

fn cli(config: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = harness::run_cli(config, args, &[]);
    (out.code == 0, format!("{}{}", out.stdout, out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_list_shows_an_issuance_a_refused_csr_and_a_revocation_with_actor_client_and_reason()
{
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = TestServer::config_text(
        dir.path(),
        harness::free_port(),
        None,
        "[profiles.default]\nbypass = true\n",
    );
    let etc = tempfile::tempdir().expect("tempdir");
    let config = etc.path().join("acme-proxy.toml");
    std::fs::write(&config, &toml).expect("config");
    let server = TestServer::start_in(dir, &toml).await;
    let responder = Responder::start().await;
    let account = client::account(&server.directory("default")).await;
    let account_id = account.id().rsplit('/').next().expect("id").to_owned();

    let (chain, _) = client::issue(&account, &responder, &["audited.example.test"]).await;

    // A CSR for other names is refused (badCSR) and audited.
    let mut order = account
        .new_order(&NewOrder::new(&[Identifier::Dns(
            "refused.example.test".to_owned(),
        )]))
        .await
        .expect("order");
    let mut auths = order.authorizations();
    while let Some(a) = auths.next().await {
        let mut a = a.expect("authz");
        a.challenge(instant_acme::ChallengeType::Http01)
            .expect("http-01")
            .set_ready()
            .await
            .expect("trigger");
    }
    assert_eq!(
        order.poll_ready(&client::retry()).await.expect("ready"),
        OrderStatus::Ready
    );
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["someone-else.example.test".to_owned()])
        .expect("params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params.serialize_request(&key).expect("CSR");
    let err = order.finalize_csr(csr.der()).await.expect_err("badCSR");
    assert_eq!(client::problem_type(&err), "badCSR");

    let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).expect("PEM");
    let der = rustls::pki_types::CertificateDer::from(pem.contents.clone());
    account
        .revoke(&instant_acme::RevocationRequest {
            certificate: &der,
            reason: Some(instant_acme::RevocationReason::Superseded),
        })
        .await
        .expect("revoke");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let (ok, out) = cli(&config, &["audit", "list", "--json"]);
    assert!(ok, "{out}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
    let find = |event: &str| {
        rows.iter()
            .find(|r| r["event"] == event)
            .unwrap_or_else(|| panic!("no {event} in {rows:#?}"))
            .clone()
    };
    let actor = format!("account:{account_id}");
    let issued = find("certificate.issued");
    assert_eq!(issued["actor"], actor.as_str());
    assert_eq!(issued["client_ip"], "127.0.0.1");
    assert_eq!(issued["identifiers"][0], "audited.example.test");
    assert!(issued["serial"].is_string() && issued["request_id"].is_string());
    let refused = find("certificate.issue_failed");
    assert_eq!(refused["outcome"], "refused");
    assert_eq!(refused["problem_type"], "badCSR");
    assert_eq!(refused["identifiers"][0], "refused.example.test");
    assert!(
        refused["detail"]
            .as_str()
            .is_some_and(|d| d.contains("someone-else.example.test")),
        "{refused}"
    );
    let revoked = find("certificate.revoked");
    assert_eq!(revoked["serial"], issued["serial"]);
    assert_eq!(revoked["actor"], actor.as_str());
    assert!(find("account.created")["actor"] == actor.as_str());

    // Filters, and one record shown whole.
    let (ok, out) = cli(
        &config,
        &[
            "audit",
            "list",
            "--event",
            "certificate.issue_failed",
            "--since",
            "1h",
            "--json",
        ],
    );
    assert!(ok, "{out}");
    let only: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
    assert_eq!(only.len(), 1, "{only:#?}");
    let id = refused["id"].as_i64().expect("id").to_string();
    let (ok, out) = cli(&config, &["audit", "show", &id]);
    assert!(
        ok && out.contains("badCSR") && out.contains("127.0.0.1"),
        "{out}"
    );
    let (ok, out) = cli(&config, &["audit", "list", "--since", "yesterday-ish"]);
    assert!(!ok && out.contains("--since"), "{out}");
    server.stop().await;
}
