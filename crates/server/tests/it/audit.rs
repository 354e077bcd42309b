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
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(
        dir.path(),
        harness::free_port(),
        None,
        "[profiles.default]\nbypass = true\n",
    );
    let (_etc, config) = harness::config_file(&toml);
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

/// The server's configuration with `resolver` as its DNS server, the
/// loopback trusted as a proxy and `extra` appended. (The resolver answers
/// the loopback's own reverse name itself, RFC 6761, so the tests' client
/// says it forwards for a documentation address, RFC 5737.)
fn with_resolver(dir: &std::path::Path, resolver: std::net::SocketAddr, extra: &str) -> String {
    format!(
        "trusted_proxies = [\"127.0.0.1/32\"]\n{}",
        TestServer::config_text(dir, harness::free_port(), None, extra).replacen(
            "timeout = \"5s\"\n",
            &format!("timeout = \"5s\"\ndns_resolvers = [\"{resolver}\"]\n"),
            1,
        )
    )
}

const FORWARDED: (&str, &str) = ("x-forwarded-for", "198.51.100.7");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_reverse_name_is_audited_when_its_dns_has_one() {
    let Some(bind) = harness::Bind::start(
        "100.51.198.in-addr.arpa",
        "7 IN PTR audited-client.example.test.",
    ) else {
        return;
    };
    let dir = crate::harness::tempdir();
    // A generous bound: this test is about the name, not the bound.
    let toml = with_resolver(
        dir.path(),
        bind.addr,
        "\n[audit]\nreverse_name_timeout = \"5s\"\n",
    );
    let server = TestServer::start_in(dir, &toml).await;
    client::account_with_header(&server.directory("default"), FORWARDED).await;
    let rows = server
        .running()
        .authority
        .store
        .audit_recent(Some("account.created"), 1)
        .await
        .expect("audit");
    assert_eq!(rows[0].client_ip.as_deref(), Some("198.51.100.7"));
    assert_eq!(
        rows[0].reverse_name.as_deref(),
        Some("audited-client.example.test"),
        "{}",
        bind.log()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_server_that_never_answers_delays_an_audited_request_by_the_bound_only() {
    // Takes every query and answers none.
    let black_hole = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let dir = crate::harness::tempdir();
    let toml = with_resolver(
        dir.path(),
        black_hole.local_addr().expect("addr"),
        "\n[audit]\nreverse_name_timeout = \"200ms\"\n",
    );
    let server = TestServer::start_in(dir, &toml).await;
    let started = std::time::Instant::now();
    client::account_with_header(&server.directory("default"), FORWARDED).await;
    let elapsed = started.elapsed();
    // Unbounded, the resolver alone would wait its own 5 s timeout (and
    // retry): well past this.
    assert!(
        elapsed < Duration::from_secs(3),
        "newAccount took {elapsed:?} with a silent DNS server"
    );
    let rows = server
        .running()
        .authority
        .store
        .audit_recent(Some("account.created"), 1)
        .await
        .expect("audit");
    assert_eq!(rows.len(), 1, "the row is written without its name");
    assert_eq!(rows[0].reverse_name, None);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_past_the_audit_retention_are_swept_and_newer_ones_kept() {
    use acme_proxy::clock::Clock;
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(
        dir.path(),
        harness::free_port(),
        None,
        "[profiles.default]\n\n[audit]\nretention = \"30d\"\nreverse_names = false\n[jobs]\npoll_interval = \"50ms\"\n",
    );
    // Rows written before the server starts: one 31 days old, one 29.
    let store = acme_proxy_store::Store::open(
        &format!("sqlite:{}", dir.path().join("acme-proxy.db").display()),
        &acme_proxy_store::StoreOptions::default(),
    )
    .await
    .expect("store");
    let now = acme_proxy::clock::SystemClock.unix();
    for (age_days, detail) in [(31, "old"), (29, "recent")] {
        store
            .insert_audit(&acme_proxy_store::NewAuditRow {
                at: now - age_days * 86400,
                event: "certificate.issued",
                outcome: "success",
                actor: "system",
                detail: Some(detail),
                ..Default::default()
            })
            .await
            .expect("insert");
    }
    store.close().await;
    let server = TestServer::start_in(dir, &toml).await;
    let store = server.running().authority.store.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rows = store
            .audit_recent(Some("certificate.issued"), 10)
            .await
            .expect("audit");
        let details: Vec<_> = rows.iter().filter_map(|r| r.detail.clone()).collect();
        if details == ["recent"] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sweep did not run: {details:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}
