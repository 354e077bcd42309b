//! The audit trail as operators read it: `acme-proxy audit list|show`
//! against the real database after a real issuance, a refusal and a
//! revocation; the bounds on what a client's request can make it hold (a
//! refused newOrder's identifiers, revocations for certificates never
//! issued); and the start-up warning when rows are kept for ever.

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

    // Until every record asserted below is there.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let rows = loop {
        let (ok, out) = cli(&config, &["audit", "list", "--json"]);
        assert!(ok, "{out}");
        let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
        let all = [
            "certificate.issued",
            "certificate.issue_failed",
            "certificate.revoked",
            "account.created",
        ]
        .iter()
        .all(|event| rows.iter().any(|r| r["event"] == *event));
        if all || std::time::Instant::now() >= deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
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

    // A serial as openssl prints it (upper case, colons) finds the rows.
    let serial = issued["serial"].as_str().expect("serial");
    let openssl_style = serial
        .to_ascii_uppercase()
        .as_bytes()
        .chunks(2)
        .map(|pair| String::from_utf8_lossy(pair).into_owned())
        .collect::<Vec<_>>()
        .join(":");
    let (ok, out) = cli(
        &config,
        &["audit", "list", "--serial", &openssl_style, "--json"],
    );
    assert!(ok, "{out}");
    let by_serial: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
    let events: Vec<&str> = by_serial
        .iter()
        .filter_map(|r| r["event"].as_str())
        .collect();
    assert!(
        events.contains(&"certificate.issued") && events.contains(&"certificate.revoked"),
        "--serial {openssl_style}: {by_serial:#?}"
    );
    let out = harness::run_cli(&config, &["audit", "list", "--serial", "not-hex"], &[]);
    assert_eq!(
        out.code, 2,
        "a serial that is not hex is a usage error: {out:?}"
    );
    assert!(out.stderr.contains("0A:1B:2C"), "{out:?}");
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
        .authority()
        .store()
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
        .authority()
        .store()
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
        &acme_proxy::config::Config::from_toml(&toml)
            .expect("config")
            .database_url(),
        &acme_proxy_store::StoreOptions::default(),
    )
    .await
    .expect("store");
    let now = acme_proxy::clock::SystemClock.unix();
    for (age_days, detail) in [(31, "old"), (29, "recent")] {
        store
            .insert_audit(&acme_proxy_store::NewAuditRow {
                detail: Some(detail),
                ..acme_proxy_store::NewAuditRow::new(
                    now - age_days * 86400,
                    acme_proxy_store::AuditEvent::CertificateIssued,
                    acme_proxy_store::AuditOutcome::Success,
                    "system",
                )
            })
            .await
            .expect("insert");
    }
    store.close().await;
    let server = TestServer::start_in(dir, &toml).await;
    let store = server.running().authority().store().clone();
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

/// The octets an audit row holds: every text column, and the identifiers
/// as the JSON they are stored as.
fn row_octets(row: &acme_proxy_store::AuditRow) -> usize {
    let texts = [
        Some(&row.event),
        Some(&row.outcome),
        row.profile.as_ref(),
        Some(&row.actor),
        row.account_id.as_ref(),
        row.order_id.as_ref(),
        row.serial.as_ref(),
        row.client_ip.as_ref(),
        row.reverse_name.as_ref(),
        row.user_agent.as_ref(),
        row.request_id.as_ref(),
        row.problem_type.as_ref(),
        row.detail.as_ref(),
    ];
    texts.into_iter().flatten().map(String::len).sum::<usize>()
        + serde_json::to_string(&row.identifiers).unwrap().len()
}

/// What docs/operating/audit.md documents as the most a refusal's audit row holds:
/// 10 identifiers of at most 253 octets plus a marker each, and a detail
/// of two 1024-octet parts with their markers, with room to spare.
const REFUSAL_ROW_OCTETS: usize = 8 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_new_order_with_many_and_huge_identifiers_writes_a_bounded_audit_row_that_keeps_their_count()
 {
    use crate::raw::{self, Acct, Key};
    use serde_json::json;
    // A body large enough for the request; the bound must not rest on it.
    let data = crate::harness::tempdir();
    let toml = format!(
        "max_body_bytes = 524288\n{}",
        TestServer::config_text(
            data.path(),
            1,
            None,
            "[profiles.default]\nbypass = true\n\n[audit]\nreverse_names = false\n",
        )
    );
    let server = TestServer::start_in(data, &toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    // Valid names of 248 octets (labels of at most 63), and one of 45 000.
    let name = |n: usize| {
        let label = "a".repeat(58);
        format!(
            "h{n:03}{}.{label}.{label}.{label}.example.test",
            &label[..54]
        )
    };
    assert_eq!(name(0).len(), 248);
    let huge = "y".repeat(45_000);
    let order = |count: usize| {
        let mut ids: Vec<serde_json::Value> = (0..count)
            .map(|n| json!({"type": "dns", "value": name(n)}))
            .collect();
        ids.push(json!({"type": "dns", "value": huge}));
        json!({ "identifiers": ids })
    };
    let store = &server.running().authority().store().clone();
    // 101 identifiers: refused as too many, before any is looked at; 100
    // with the huge one: refused for it, the problem detail quoting it.
    for (count, problem) in [(100, "rejectedIdentifier"), (99, "rejectedIdentifier")] {
        let r = alice
            .post(&dir, dir["newOrder"].as_str().unwrap(), Some(&order(count)))
            .await;
        r.assert_refused(400, problem, &format!("{} identifiers", count + 1));
        let rows = store
            .audit_recent(Some("order.refused"), 1)
            .await
            .expect("audit");
        let row = &rows[0];
        let size = row_octets(row);
        assert!(
            size < REFUSAL_ROW_OCTETS,
            "{} identifiers: a row of {size} octets: {row:?}",
            count + 1
        );
        assert_eq!(row.identifiers.len(), 10, "the first ten are kept");
        assert_eq!(row.identifiers[0].value, name(0));
        let detail = row.detail.as_deref().unwrap_or("");
        assert!(
            detail.contains(&format!(
                "{} identifiers; the first 10 are recorded",
                count + 1
            )),
            "{detail}"
        );
    }
    // The huge identifier the problem detail quotes is cut, with the
    // detail's length.
    let rows = store
        .audit_recent(Some("order.refused"), 1)
        .await
        .expect("audit");
    let detail = rows[0].detail.as_deref().unwrap_or("");
    assert!(
        detail.starts_with("\"yyy") && detail.contains(" octets); 100 identifiers"),
        "{detail}"
    );
    server.stop().await;
}

/// A revokeCert request signed with `key` as a `jwk` (§7.6: the
/// certificate's key, it claims) for `der`.
async fn revoke_by_key(
    dir: &serde_json::Value,
    key: &crate::raw::Key,
    der: &[u8],
) -> crate::raw::Resp {
    let url = dir["revokeCert"].as_str().unwrap();
    let protected = serde_json::json!({"alg": key.alg(), "jwk": key.jwk, "nonce": crate::raw::nonce(dir).await, "url": url});
    let payload = serde_json::json!({"certificate": crate::raw::b64(der)});
    crate::raw::post(url, &key.sign(&protected, Some(&payload))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocations_signed_by_no_account_for_certificates_never_issued_are_counted_not_audited() {
    use crate::raw::{self, Acct, Key};
    let server = TestServer::start(
        1,
        None,
        "[profiles.default]\nbypass = true\n\n[audit]\nreverse_names = false\n",
    )
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    let authority = &server.running().authority();
    let refused = |reason: &str| {
        authority
            .metrics
            .revocations_refused
            .get_or_create(&vec![
                ("profile", "default".to_owned()),
                ("reason", reason.to_owned()),
            ])
            .get()
    };
    let revoke_failed = || async {
        authority
            .store()
            .audit_recent(Some("certificate.revoke_failed"), 100)
            .await
            .expect("audit")
    };
    // Self-signed certificates, each revoked by a request signed with its
    // own key: what anyone can mint, as many as they like.
    const N: u64 = 5;
    let mut strangers = Vec::new();
    for n in 0..N {
        let key = Key::p256();
        let pair = rcgen::KeyPair::try_from(key.pkcs8()).unwrap();
        let cert = rcgen::CertificateParams::new(vec![format!("stranger{n}.example.test")])
            .unwrap()
            .self_signed(&pair)
            .unwrap();
        strangers.push((key, cert.der().to_vec()));
    }
    let before = refused("malformed");
    for (key, der) in &strangers {
        let r = revoke_by_key(&dir, key, der).await;
        r.assert_refused(404, "malformed", "a certificate this server never issued");
    }
    assert_eq!(refused("malformed"), before + N, "each one counted");
    assert!(
        revoke_failed().await.is_empty(),
        "not one audit row: {:?}",
        revoke_failed().await
    );

    // An account asking the same is audited, and counted.
    let alice = Acct::create(&dir, Key::p256()).await;
    let r = alice
        .post(
            &dir,
            dir["revokeCert"].as_str().unwrap(),
            Some(&serde_json::json!({"certificate": raw::b64(&strangers[0].1)})),
        )
        .await;
    r.assert_refused(404, "malformed", "an account's revocation of a stranger");
    let rows = revoke_failed().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].actor.starts_with("account:"), "{:?}", rows[0]);
    assert_eq!(refused("malformed"), before + N + 1);

    // A request signed by a key that is not the certificate's, for a
    // certificate this server did issue, keeps its row too.
    let name = "issued.example.test";
    let (order_url, finalize) = crate::concurrency::ready_order(&dir, &alice, name).await;
    let csr = crate::concurrency::csr_for(name);
    let leaf = crate::resources::finalize_and_download(&dir, &alice, order_url, &finalize, csr)
        .await
        .leaf;
    let r = revoke_by_key(&dir, &Key::p256(), &leaf).await;
    r.assert_refused(403, "unauthorized", "another key than the certificate's");
    let rows = revoke_failed().await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows[0].actor.starts_with("certificate-key:"),
        "{:?}",
        rows[0]
    );
    assert_eq!(refused("unauthorized"), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_for_a_payload_that_does_not_parse_or_decode_are_audited_like_any_refusal()
{
    use crate::raw::{self, Acct, Key};
    use serde_json::json;
    let server = TestServer::start(
        1,
        None,
        "[profiles.default]\nbypass = true\n\n[audit]\nreverse_names = false\n",
    )
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    let store = server.running().authority().store().clone();
    let last = |event: &'static str| {
        let store = store.clone();
        async move {
            store
                .audit_recent(Some(event), 10)
                .await
                .expect("audit")
                .into_iter()
                .next()
        }
    };
    let alice = Acct::create(&dir, Key::p256()).await;
    let account = alice.url.rsplit('/').next().unwrap().to_owned();

    // newOrder whose identifiers are not a list.
    let r = alice
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": "padded.example.test"})),
        )
        .await;
    r.assert_refused(400, "malformed", "identifiers that are not a list");
    let row = last("order.refused").await.expect("an order.refused row");
    assert_eq!(
        (
            row.outcome.as_str(),
            row.account_id.as_deref(),
            row.problem_type.as_deref()
        ),
        ("refused", Some(account.as_str()), Some("malformed")),
        "{row:?}"
    );

    // finalize with a padded CSR (RFC 8555 §6.1): the order's names kept.
    let name = "padded.example.test";
    let (order_url, finalize) = crate::concurrency::ready_order(&dir, &alice, name).await;
    let padded_csr = format!("{}==", crate::concurrency::csr_for(name));
    let r = alice
        .post(&dir, &finalize, Some(&json!({"csr": padded_csr})))
        .await;
    r.assert_refused(400, "malformed", "a padded CSR");
    let row = last("certificate.issue_failed")
        .await
        .expect("a certificate.issue_failed row");
    let order_id = order_url.rsplit('/').next().unwrap();
    assert_eq!(
        (
            row.order_id.as_deref(),
            row.problem_type.as_deref(),
            row.identifiers.first().map(|i| i.value.as_str())
        ),
        (Some(order_id), Some("malformed"), Some(name)),
        "{row:?}"
    );
    // The order is still ready: a good CSR gets its certificate.
    let csr = crate::concurrency::csr_for(name);
    let leaf =
        crate::resources::finalize_and_download(&dir, &alice, order_url.clone(), &finalize, csr)
            .await
            .leaf;

    // revokeCert with a padded certificate, signed by the account.
    let padded_cert = format!("{}=", raw::b64(&leaf));
    let r = alice
        .post(
            &dir,
            dir["revokeCert"].as_str().unwrap(),
            Some(&json!({"certificate": padded_cert})),
        )
        .await;
    r.assert_refused(400, "malformed", "a padded certificate");
    let rows = store
        .audit_recent(Some("certificate.revoke_failed"), 10)
        .await
        .expect("audit");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].actor.as_str(), rows[0].problem_type.as_deref()),
        (format!("account:{account}").as_str(), Some("malformed")),
        "{:?}",
        rows[0]
    );
    // Signed by a key alone (anyone's), it is counted, not audited.
    let url = dir["revokeCert"].as_str().unwrap();
    let key = Key::p256();
    let protected =
        json!({"alg": key.alg(), "jwk": key.jwk, "nonce": raw::nonce(&dir).await, "url": url});
    raw::post(
        url,
        &key.sign(&protected, Some(&json!({"certificate": padded_cert}))),
    )
    .await
    .assert_refused(400, "malformed", "a padded certificate, signed by a key");
    let rows = store
        .audit_recent(Some("certificate.revoke_failed"), 10)
        .await
        .expect("audit");
    assert_eq!(rows.len(), 1, "{rows:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_warns_at_start_up_when_no_audit_retention_is_set_and_not_when_one_is() {
    let warning = "config.audit_retention";
    for (retention, warned) in [(None, true), (Some("400d"), false)] {
        let cwd = crate::harness::tempdir();
        let mut env = vec![("ACME_PROXY_LISTEN", "127.0.0.1:0".to_owned())];
        if let Some(r) = retention {
            env.push(("ACME_PROXY_AUDIT__RETENTION", r.to_owned()));
        }
        // The directory URL is printed once start-up (and its warnings)
        // is over.
        let (_server, _) = harness::spawn_binary(cwd.path(), &["serve"], &env);
        let log = std::fs::read_to_string(cwd.path().join("acme-proxy.log")).unwrap();
        assert_eq!(
            log.contains(warning),
            warned,
            "retention {retention:?}:\n{log}"
        );
        if warned {
            assert!(
                log.contains("[audit] retention = "),
                "says what to write: {log}"
            );
        }
    }
}
