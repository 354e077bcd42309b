//! dns-01 (RFC 8555 §8.4), wildcards (§7.1.3) and authorization reuse,
//! against a real DNS server (pebble-challtestsrv) the test writes to.

use instant_acme::{AuthorizationStatus, ChallengeType, Identifier, NewOrder, OrderStatus};
use serde_json::json;
use x509_parser::prelude::*;

use crate::client;
use crate::harness::{Dns, Responder, TestServer};
use crate::raw::{self, Acct, Key};

const DNS_PROFILE: &str = "[profiles.default]\nchallenges = [\"http-01\", \"dns-01\"]\n";

#[tokio::test]
async fn a_wildcard_and_its_base_name_are_proven_by_dns_01_records_in_a_real_dns_server() {
    let Some(dns) = Dns::start() else { return };
    let server = TestServer::start(1, Some(&dns), DNS_PROFILE).await;
    let account = client::account(&server.directory("default")).await;
    let ids = [
        Identifier::Dns("*.wild.example.test".into()),
        Identifier::Dns("wild.example.test".into()),
    ];
    let mut order = account.new_order(&NewOrder::new(&ids)).await.unwrap();
    let mut authorizations = order.authorizations();
    let mut wildcards = 0;
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.unwrap();
        assert_eq!(authz.status, AuthorizationStatus::Pending);
        // The authorization is for the base name; a wildcard one offers dns-01 only.
        assert_eq!(
            authz.identifier().identifier,
            &Identifier::Dns("wild.example.test".into())
        );
        if authz.identifier().wildcard {
            wildcards += 1;
            assert_eq!(authz.challenges.len(), 1);
            assert_eq!(authz.challenges[0].r#type, ChallengeType::Dns01);
        }
        let mut challenge = authz
            .challenge(ChallengeType::Dns01)
            .expect("dns-01 offered");
        let value = challenge.key_authorization().dns_value();
        dns.add_txt("_acme-challenge.wild.example.test.", &value)
            .await;
        challenge.set_ready().await.unwrap();
    }
    assert_eq!(wildcards, 1);
    assert_eq!(
        order.poll_ready(&client::retry()).await.unwrap(),
        OrderStatus::Ready
    );
    order.finalize().await.unwrap();
    let chain = order.poll_certificate(&client::retry()).await.unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).unwrap();
    let leaf = pem.parse_x509().unwrap();
    let mut sans: Vec<String> = leaf
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|g| match g {
            GeneralName::DNSName(n) => (*n).to_owned(),
            other => panic!("{other:?}"),
        })
        .collect();
    sans.sort();
    assert_eq!(sans, vec!["*.wild.example.test", "wild.example.test"]);
    server.stop().await;
}

#[tokio::test]
async fn dns_01_follows_a_cname_and_refuses_a_wrong_or_missing_record() {
    let Some(dns) = Dns::start() else { return };
    let server = TestServer::start(1, Some(&dns), DNS_PROFILE).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let thumb = acme_proxy_protocol::Jwk::from_value(&acct.key.jwk)
        .unwrap()
        .thumbprint_b64();
    // (name, how the test publishes, expected status, expected problem)
    for (name, setup, want, problem) in [
        ("cname.example.test", "cname", "valid", ""),
        (
            "wrong.example.test",
            "wrong",
            "invalid",
            "incorrectResponse",
        ),
        ("none.example.test", "none", "invalid", "unauthorized"),
    ] {
        let r = acct
            .post(
                &dir,
                dir["newOrder"].as_str().unwrap(),
                Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
            )
            .await;
        let authz = acct
            .post(&dir, r.json()["authorizations"][0].as_str().unwrap(), None)
            .await
            .json();
        let ch = authz["challenges"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "dns-01")
            .unwrap()
            .clone();
        let token = ch["token"].as_str().unwrap();
        let value = acme_proxy::validators::dns01::txt_value(&format!("{token}.{thumb}"));
        match setup {
            "cname" => {
                dns.manage("set-cname", json!({"host": format!("_acme-challenge.{name}."), "target": "delegated.example.test."}))
                    .await;
                dns.add_txt("delegated.example.test.", &value).await;
            }
            "wrong" => {
                dns.add_txt(&format!("_acme-challenge.{name}."), "not-the-digest")
                    .await
            }
            _ => {}
        }
        let settled = acct
            .trigger_and_settle(&dir, ch["url"].as_str().unwrap())
            .await;
        assert_eq!(settled["status"], want, "{name}: {settled}");
        assert_eq!(raw::error_type(&settled), problem, "{name}: {settled}");
    }
    server.stop().await;
}

/// Orders `name` for `acct` and answers http-01; returns the order document.
async fn validated_order(
    dir: &serde_json::Value,
    acct: &Acct,
    responder: &Responder,
    name: &str,
) -> serde_json::Value {
    let r = acct
        .post(
            dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
        )
        .await;
    assert_eq!(r.status, 201);
    let order_url = r.location().unwrap();
    let authz_url = r.json()["authorizations"][0].as_str().unwrap().to_owned();
    let authz = acct.post(dir, &authz_url, None).await.json();
    if authz["status"] == "pending" {
        let ch = &authz["challenges"][0];
        let token = ch["token"].as_str().unwrap();
        let thumb = acme_proxy_protocol::Jwk::from_value(&acct.key.jwk)
            .unwrap()
            .thumbprint_b64();
        responder.publish(token, &format!("{token}.{thumb}"));
        acct.post(dir, ch["url"].as_str().unwrap(), Some(&json!({})))
            .await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while acct.post(dir, &order_url, None).await.json()["status"] == "pending" {
            assert!(std::time::Instant::now() < deadline);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    acct.post(dir, &order_url, None).await.json()
}

async fn reuse_case(reuse: bool) -> (serde_json::Value, serde_json::Value, serde_json::Value) {
    let dns = Dns::start().expect("pebble-challtestsrv");
    let responder = Responder::start().await;
    let profile = if reuse {
        "[profiles.default]\nauthorization_reuse = \"1d\"\n"
    } else {
        "[profiles.default]\n"
    };
    let server = TestServer::start(responder.port, Some(&dns), profile).await;
    let dir = raw::directory(&server.directory("default")).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let bob = Acct::create(&dir, Key::p256()).await;
    let first = validated_order(&dir, &alice, &responder, "reuse.example.test").await;
    assert_eq!(first["status"], "ready");
    let hits = responder.hits();
    // A second order by the same account, and one by another account.
    let r = alice
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "dns", "value": "reuse.example.test"}]})),
        )
        .await;
    let second = r.json();
    let r = bob
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "dns", "value": "reuse.example.test"}]})),
        )
        .await;
    let other = r.json();
    assert_eq!(
        responder.hits(),
        hits,
        "no validation ran for the new orders"
    );
    server.stop().await;
    (first, second, other)
}

#[tokio::test]
async fn a_valid_authorization_is_reused_by_the_same_account_only_when_enabled() {
    if !crate::harness::require_program("pebble-challtestsrv") {
        return;
    }
    let (first, second, other) = reuse_case(true).await;
    assert_eq!(
        second["status"], "ready",
        "reused: the order is ready at once"
    );
    assert_eq!(second["authorizations"], first["authorizations"]);
    assert_eq!(
        other["status"], "pending",
        "another account never reuses it"
    );
    assert_ne!(other["authorizations"], first["authorizations"]);

    let (first, second, _) = reuse_case(false).await;
    assert_eq!(
        second["status"], "pending",
        "disabled: a fresh authorization"
    );
    assert_ne!(second["authorizations"], first["authorizations"]);
}

/// A tls-alpn-01 responder (RFC 8737 §3): answers handshakes that offer
/// `acme-tls/1` with whatever certificate the test put in its slot.
#[derive(Debug, Default)]
pub(crate) struct AlpnSlot(std::sync::Mutex<Option<std::sync::Arc<rustls::sign::CertifiedKey>>>);

impl rustls::server::ResolvesServerCert for AlpnSlot {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<std::sync::Arc<rustls::sign::CertifiedKey>> {
        self.0.lock().unwrap().clone()
    }
}

impl AlpnSlot {
    /// Presents a self-signed certificate for `name` with the
    /// acmeIdentifier extension over SHA-256(`digest_of`).
    pub(crate) fn present(&self, name: &str, digest_of: &str) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let digest = ring::digest::digest(&ring::digest::SHA256, digest_of.as_bytes());
        params
            .custom_extensions
            .push(rcgen::CustomExtension::new_acme_identifier(digest.as_ref()));
        let cert = params.self_signed(&key).unwrap();
        let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let signing = rustls::crypto::ring::sign::any_supported_type(&der).unwrap();
        *self.0.lock().unwrap() = Some(std::sync::Arc::new(rustls::sign::CertifiedKey::new(
            vec![cert.der().clone()],
            signing,
        )));
    }
}

pub(crate) async fn tls_alpn_responder() -> (u16, std::sync::Arc<AlpnSlot>) {
    let slot = std::sync::Arc::new(AlpnSlot::default());
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(slot.clone());
    config.alpn_protocols = vec![b"acme-tls/1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = acceptor.accept(tcp).await;
            });
        }
    });
    (port, slot)
}

#[tokio::test]
async fn tls_alpn_01_checks_the_acme_identifier_of_the_certificate_presented_over_acme_tls_1() {
    let Some(dns) = Dns::start() else { return };
    let (port, slot) = tls_alpn_responder().await;
    let server = TestServer::start(
        1,
        Some(&dns),
        &format!("tls_port = {port}\n[profiles.default]\nchallenges = [\"tls-alpn-01\"]\n"),
    )
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let thumb = acme_proxy_protocol::Jwk::from_value(&acct.key.jwk)
        .unwrap()
        .thumbprint_b64();
    for (name, right, want, problem) in [
        ("alpn.example.test", true, "valid", ""),
        (
            "alpn-wrong.example.test",
            false,
            "invalid",
            "incorrectResponse",
        ),
    ] {
        let r = acct
            .post(
                &dir,
                dir["newOrder"].as_str().unwrap(),
                Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
            )
            .await;
        let authz = acct
            .post(&dir, r.json()["authorizations"][0].as_str().unwrap(), None)
            .await
            .json();
        let ch = &authz["challenges"][0];
        assert_eq!(ch["type"], "tls-alpn-01");
        let token = ch["token"].as_str().unwrap();
        let ka = if right {
            format!("{token}.{thumb}")
        } else {
            "someone else's".to_owned()
        };
        slot.present(name, &ka);
        let settled = acct
            .trigger_and_settle(&dir, ch["url"].as_str().unwrap())
            .await;
        assert_eq!(settled["status"], want, "{name}: {settled}");
        assert_eq!(raw::error_type(&settled), problem, "{name}: {settled}");
    }
    server.stop().await;
}

#[tokio::test]
async fn an_ip_address_is_certified_via_http_01_and_via_tls_alpn_01_with_an_ip_san() {
    let responder = Responder::start().await;
    let (alpn_port, slot) = tls_alpn_responder().await;
    let server = TestServer::start(
        responder.port,
        None,
        &format!("tls_port = {alpn_port}\n[profiles.default]\nchallenges = [\"http-01\", \"tls-alpn-01\"]\n"),
    )
    .await;
    let account = client::account(&server.directory("default")).await;
    for kind in [ChallengeType::Http01, ChallengeType::TlsAlpn01] {
        let ids = [Identifier::Ip("127.0.0.1".parse().unwrap())];
        let mut order = account.new_order(&NewOrder::new(&ids)).await.unwrap();
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.unwrap();
            // dns-01 cannot prove an address (RFC 8738 §7).
            assert!(
                authz
                    .challenges
                    .iter()
                    .all(|c| c.r#type != ChallengeType::Dns01)
            );
            let mut challenge = authz.challenge(kind.clone()).unwrap();
            let ka = challenge.key_authorization();
            match kind {
                ChallengeType::Http01 => responder.publish(&challenge.token, ka.as_str()),
                _ => slot.present("127.0.0.1", ka.as_str()),
            }
            challenge.set_ready().await.unwrap();
        }
        assert_eq!(
            order.poll_ready(&client::retry()).await.unwrap(),
            OrderStatus::Ready,
            "{kind:?}"
        );
        order.finalize().await.unwrap();
        let chain = order.poll_certificate(&client::retry()).await.unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).unwrap();
        let leaf = pem.parse_x509().unwrap();
        let sans: Vec<String> = leaf
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|g| format!("{g:?}"))
            .collect();
        assert_eq!(
            sans,
            vec!["IPAddress([127, 0, 0, 1])".to_owned()],
            "{kind:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_profile_with_ip_identifiers_off_refuses_them() {
    let server = TestServer::start(
        1,
        None,
        "[profiles.default]\nip_identifiers = false\nbypass = true\n",
    )
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let r = acct
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "ip", "value": "127.0.0.1"}]})),
        )
        .await;
    assert_eq!(
        (r.status, r.problem().as_str()),
        (400, "unsupportedIdentifier")
    );
    server.stop().await;
}

#[tokio::test]
async fn a_challenge_post_answers_at_once_even_when_the_host_never_answers_and_the_authorization_later_fails_with_connection()
 {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let server = TestServer::start(responder.port, Some(&dns), "").await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let r = acct
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "dns", "value": "silent.example.test"}]})),
        )
        .await;
    let authz_url = r.json()["authorizations"][0].as_str().unwrap().to_owned();
    let authz = acct.post(&dir, &authz_url, None).await.json();
    let ch = authz["challenges"][0]["url"].as_str().unwrap().to_owned();
    let r = acct.post(&dir, &authz_url, None).await;
    assert_eq!(
        r.headers["retry-after"], "1",
        "a pending authorization carries Retry-After"
    );
    responder.hang_next(1);
    let started = std::time::Instant::now();
    let r = acct.post(&dir, &ch, Some(&json!({}))).await;
    let answered = started.elapsed();
    assert_eq!(r.json()["status"], "processing");
    // The validation timeout of the test server is 5 s: an answer within 3 s
    // (slack for a loaded CI machine) cannot have waited for the validation.
    assert!(
        answered < std::time::Duration::from_secs(3),
        "the trigger took {answered:?}"
    );
    let r = acct.post(&dir, &authz_url, None).await;
    assert_eq!(
        r.headers["retry-after"], "1",
        "a pending authorization being validated says when to come back"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let authz = loop {
        let a = acct.post(&dir, &authz_url, None).await.json();
        if a["status"] != "pending" {
            break a;
        }
        assert!(std::time::Instant::now() < deadline, "never settled: {a}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(authz["status"], "invalid");
    assert_eq!(
        authz["challenges"][0]["error"]["type"], "urn:ietf:params:acme:error:connection",
        "{authz}"
    );
    server.stop().await;
}

/// (name, host of the CAA records, (tag, value) policies, expected status)
type CaaCase = (
    &'static str,
    &'static str,
    Vec<(&'static str, String)>,
    &'static str,
);

#[tokio::test]
async fn caa_records_in_a_real_dns_server_give_the_expected_verdicts() {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let server = TestServer::start(
        responder.port,
        Some(&dns),
        "[profiles.default]\ncaa = true\ncaa_identities = [\"ca.example.test\"]\n",
    )
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let other = Acct::create(&dir, Key::p256()).await;
    // (name, CAA host, policies, expected status)
    let cases: Vec<CaaCase> = vec![
        ("none.caa.test", "", vec![], "valid"),
        (
            "us.caa.test",
            "us.caa.test",
            vec![("issue", "ca.example.test".into())],
            "valid",
        ),
        (
            "them.caa.test",
            "them.caa.test",
            vec![("issue", "other.example".into())],
            "invalid",
        ),
        (
            "wildonly.caa.test",
            "wildonly.caa.test",
            vec![
                ("issuewild", "ca.example.test".into()),
                ("issue", "other.example".into()),
            ],
            "invalid",
        ),
        // Only issuewild (naming someone else): a plain name is not
        // restricted by it (RFC 8659 §4.3), so issuance is permitted.
        (
            "wildonly2.caa.test",
            "wildonly2.caa.test",
            vec![("issuewild", "other.example".into())],
            "valid",
        ),
        (
            "acct.caa.test",
            "acct.caa.test",
            vec![(
                "issue",
                format!("ca.example.test; accounturi={}", other.url),
            )],
            "invalid",
        ),
        (
            "myacct.caa.test",
            "myacct.caa.test",
            vec![("issue", format!("ca.example.test; accounturi={}", acct.url))],
            "valid",
        ),
        (
            "method.caa.test",
            "method.caa.test",
            vec![("issue", "ca.example.test; validationmethods=dns-01".into())],
            "invalid",
        ),
        (
            "host.parent.caa.test",
            "parent.caa.test",
            vec![("issue", "other.example".into())],
            "invalid",
        ),
        (
            "host.parentok.caa.test",
            "parentok.caa.test",
            vec![("issue", "ca.example.test".into())],
            "valid",
        ),
    ];
    for (name, host, policies, want) in cases {
        if !host.is_empty() {
            let policies: Vec<serde_json::Value> = policies
                .iter()
                .map(|(t, v)| json!({"tag": t, "value": v}))
                .collect();
            dns.manage(
                "add-caa",
                json!({"host": format!("{host}."), "policies": policies}),
            )
            .await;
        }
        let settled = validate_http_01(&dir, &acct, &responder, name).await;
        assert_eq!(settled["status"], want, "{name}: {settled}");
        if want == "invalid" {
            assert_eq!(
                settled["error"]["type"], "urn:ietf:params:acme:error:caa",
                "{name}: {settled}"
            );
            assert!(
                settled["error"]["detail"].as_str().unwrap().contains("CAA"),
                "{name}: {settled}"
            );
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn an_unknown_critical_caa_property_in_a_real_zone_forbids_issuance() {
    // pebble-challtestsrv cannot set CAA flags; BIND serves a real zone.
    let Some(bind) = crate::harness::Bind::start(
        "crit.caa.test",
        "host IN A 127.0.0.1\nhost IN CAA 0 issue \"ca.example.test\"\nhost IN CAA 128 tbs \"unknown\"\nplain IN A 127.0.0.1\nplain IN CAA 0 issue \"ca.example.test\"\nplain IN CAA 0 tbs \"unknown\"",
    ) else {
        return;
    };
    let responder = Responder::start().await;
    let dir_tmp = crate::harness::tempdir();
    let toml = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[validation]\nhttp_port = {}\ntimeout = \"5s\"\nallow_networks = [\"127.0.0.1\"]\ndns_resolvers = [\"{}\"]\n[profiles.default]\ncaa = true\ncaa_identities = [\"ca.example.test\"]\n",
        dir_tmp.path().display(),
        responder.port,
        bind.addr
    );
    let server = TestServer::start_with_toml(&toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    for (name, want) in [
        ("host.crit.caa.test", "invalid"),
        ("plain.crit.caa.test", "valid"),
    ] {
        let settled = validate_http_01(&dir, &acct, &responder, name).await;
        assert_eq!(settled["status"], want, "{name}: {settled}");
        if want == "invalid" {
            assert_eq!(
                settled["error"]["type"], "urn:ietf:params:acme:error:caa",
                "{settled}"
            );
            assert!(
                settled["error"]["detail"]
                    .as_str()
                    .unwrap()
                    .contains("critical"),
                "{settled}"
            );
        }
    }
    server.stop().await;
}

/// Orders `name`, answers its http-01 challenge on `responder`, triggers it
/// and returns the challenge once validation has settled.
async fn validate_http_01(
    dir: &serde_json::Value,
    acct: &Acct,
    responder: &Responder,
    name: &str,
) -> serde_json::Value {
    let (chall, _) = crate::recovery::pending_challenge(dir, acct, responder, name).await;
    acct.trigger_and_settle(dir, &chall).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_for_a_name_without_dns_records_shows_a_sentence_naming_the_server_asked() {
    if !crate::harness::require_program("certbot") {
        return;
    }
    // BIND serves the zone for real: the name asked for is not in it.
    let Some(bind) = crate::harness::Bind::start("nodns.test", "present IN A 127.0.0.1") else {
        return;
    };
    let at = crate::harness::own_addr();
    let dir = crate::harness::tempdir();
    let toml = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n{}\n[validation]\nhttp_port = {}\ntimeout = \"5s\"\n{}\ndns_resolvers = [\"{}\"]\n[profiles.default]\nchallenges = [\"http-01\"]\n",
        dir.path().display(),
        crate::harness::database_url_line(dir.path()),
        at.port(),
        crate::harness::allow_networks_line(),
        bind.addr
    );
    let server = TestServer::start_in(dir, &toml).await;
    let home = crate::harness::tempdir();
    let d = home.path().to_path_buf();
    let name = "missing.nodns.test";
    let args =
        crate::clients::certbot_certonly_standalone(&d, &server.directory("default"), at, name);
    let ran = crate::clients::run("certbot", args, d.clone()).await;
    assert!(
        !ran.success(),
        "certbot got a certificate for a name DNS does not know"
    );
    // Debian's certbot 2.1 may hide the problem behind its own error
    // display; its log keeps the server's answer.
    let log = std::fs::read_to_string(d.join("logs").join("letsencrypt.log")).unwrap_or_default();
    let sentence = format!(
        "{name} does not exist in DNS ({} answered NXDOMAIN to the AAAA or A query)",
        bind.addr
    );
    assert!(
        log.contains(&sentence) || ran.report().contains(&sentence),
        "certbot shows no sentence {sentence:?}:\n{}\n{}",
        ran.report(),
        crate::clients::certbot_log_tail(&d)
    );
    assert!(
        !log.contains("Query {") && !log.contains("query_type"),
        "a debug print reached the client:\n{}",
        crate::clients::certbot_log_tail(&d)
    );
    server.stop().await;
}
