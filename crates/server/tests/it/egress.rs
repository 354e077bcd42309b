//! Validation cannot be turned against the network (RFC 8555 §10.2): the
//! addresses of `validation.deny_networks` are never connected to, first
//! hop or redirect, redirects to address literals are not followed, `ip`
//! identifiers in those networks are refused at newOrder, what answers is
//! never relayed to the client, and names are always looked up as absolute
//! names, whatever search list the resolver configuration has.

use std::net::{IpAddr, Ipv4Addr};

use serde_json::{Value, json};

use crate::challenges::tls_alpn_responder;
use crate::harness::{Dns, Responder, TestServer};
use crate::raw::{self, Acct, Key};

/// A new order for `name`; its first challenge of `kind` and that
/// challenge's key authorization.
async fn challenge_of(dir: &Value, acct: &Acct, name: &str, kind: &str) -> (Value, String) {
    let r = acct
        .post(
            dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
        )
        .await;
    assert_eq!(r.status, 201, "{name}: {}", r.json());
    let authz = acct
        .post(dir, r.json()["authorizations"][0].as_str().unwrap(), None)
        .await
        .json();
    let ch = authz["challenges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .unwrap_or_else(|| panic!("{kind} offered: {authz}"))
        .clone();
    let thumb = acme_proxy_protocol::Jwk::from_value(&acct.key.jwk)
        .unwrap()
        .thumbprint_b64();
    let ka = format!("{}.{thumb}", ch["token"].as_str().unwrap());
    (ch, ka)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_01_reaches_no_loopback_or_metadata_address_by_redirect_or_name_and_relays_nothing_that_answered()
 {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    // An internal service on another loopback address, on the http-01
    // port: it would answer every challenge right, so a validation that
    // reached it would succeed.
    let internal =
        Responder::start_at(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), responder.port).await;
    dns.add_a("loopback.example.test.", "127.0.0.2").await;
    dns.add_a("direct.example.test.", "127.0.0.2").await;
    let server = TestServer::start(responder.port, Some(&dns), "").await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let port = responder.port;

    // (identifier, where the responder redirects, problem, words the detail must have)
    let cases = [
        (
            "r1.example.test",
            Some(format!("http://127.0.0.2:{port}")),
            "unauthorized",
            vec!["HTTP 302", "IP address"],
        ),
        (
            "r2.example.test",
            Some(format!("http://169.254.169.254:{port}")),
            "unauthorized",
            vec!["HTTP 302", "IP address"],
        ),
        (
            "r3.example.test",
            Some(format!("http://[::1]:{port}")),
            "unauthorized",
            vec!["HTTP 302", "IP address"],
        ),
        (
            "r4.example.test",
            Some(format!("http://loopback.example.test:{port}")),
            "connection",
            vec![
                "HTTP 302",
                "loopback.example.test",
                "127.0.0.2",
                "deny_networks",
            ],
        ),
        (
            "direct.example.test",
            None,
            "connection",
            vec!["direct.example.test", "127.0.0.2", "deny_networks"],
        ),
    ];
    for (name, redirect, problem, words) in cases {
        let (ch, ka) = challenge_of(&dir, &acct, name, "http-01").await;
        let token = ch["token"].as_str().unwrap();
        internal.publish(token, &ka);
        if let Some(to) = redirect {
            responder.redirect(token, &format!("{to}/.well-known/acme-challenge/{token}"));
        }
        let settled = acct
            .trigger_and_settle(&dir, ch["url"].as_str().unwrap())
            .await;
        assert_eq!(settled["status"], "invalid", "{name}: {settled}");
        assert_eq!(raw::error_type(&settled), problem, "{name}: {settled}");
        let detail = settled["error"]["detail"].as_str().unwrap();
        for word in words {
            assert!(detail.contains(word), "{name}: {word:?} not in {detail:?}");
        }
    }
    assert_eq!(internal.hits(), 0, "the internal service got a request");

    // An address identifier in a refused network is refused at newOrder.
    let r = acct
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "ip", "value": "127.0.0.2"}]})),
        )
        .await;
    assert_eq!(r.status, 400);
    let doc = r.json();
    assert_eq!(
        doc["type"], "urn:ietf:params:acme:error:rejectedIdentifier",
        "{doc}"
    );
    assert!(doc.to_string().contains("deny_networks"), "{doc}");

    // A wrong answer is described by its length, never quoted.
    let (ch, _) = challenge_of(&dir, &acct, "chatty.example.test", "http-01").await;
    responder.publish(
        ch["token"].as_str().unwrap(),
        "SECRET-FROM-AN-INTERNAL-SERVICE",
    );
    let settled = acct
        .trigger_and_settle(&dir, ch["url"].as_str().unwrap())
        .await;
    assert_eq!(raw::error_type(&settled), "incorrectResponse", "{settled}");
    let detail = settled["error"]["detail"].as_str().unwrap();
    assert!(!detail.contains("SECRET"), "{detail}");
    assert!(detail.contains("31 octets"), "{detail}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_a_name_at_an_allowed_address_still_validates() {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    // 127.0.0.3 stands for an internal host: allowed by allow_networks
    // here, as a private range is by default (this machine can only serve
    // tests on loopback addresses).
    let host = Responder::start_at(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)), responder.port).await;
    dns.add_a("moved.example.test.", "127.0.0.3").await;
    let dir_path = crate::harness::tempdir();
    let toml = TestServer::config_text(dir_path.path(), responder.port, Some(&dns), "").replacen(
        &crate::harness::allow_networks_line(),
        "allow_networks = [\"127.0.0.1\", \"127.0.0.3\"]",
        1,
    );
    let server = TestServer::start_in(dir_path, &toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let (ch, ka) = challenge_of(&dir, &acct, "old.example.test", "http-01").await;
    let token = ch["token"].as_str().unwrap();
    host.publish(token, &ka);
    responder.redirect(
        token,
        &format!(
            "http://moved.example.test:{}/.well-known/acme-challenge/{token}",
            responder.port
        ),
    );
    let settled = acct
        .trigger_and_settle(&dir, ch["url"].as_str().unwrap())
        .await;
    assert_eq!(settled["status"], "valid", "{settled}");
    assert_eq!(host.hits(), 1);
    server.stop().await;
}

/// Kubernetes writes `search <ns>.svc.cluster.local …` and `ndots:5`: a
/// resolver that honoured them would first ask for the identifier with a
/// suffix appended, a name another tenant may own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_never_asks_for_a_search_suffixed_name_whatever_the_resolver_configuration_says()
{
    // Port 53, since a resolver configuration cannot name another, on a
    // loopback address of this test's own.
    let ip = Ipv4Addr::new(127, 53, (std::process::id() % 250) as u8 + 1, 53);
    let Some(dns) = Dns::start_at(ip, 53) else {
        return;
    };
    let responder = Responder::start().await;
    let (alpn_port, slot) = tls_alpn_responder().await;
    let data = crate::harness::tempdir();
    let resolv_conf = data.path().join("resolv.conf");
    std::fs::write(
        &resolv_conf,
        format!("nameserver {ip}\nsearch tenant.example.test\noptions ndots:5\n"),
    )
    .unwrap();
    let toml = TestServer::config_text(data.path(), responder.port, None, "")
        .replacen(
            &crate::harness::allow_networks_line(),
            &format!(
                "allow_networks = [\"127.0.0.1\"]\ntls_port = {alpn_port}\nresolv_conf = \"{}\"",
                resolv_conf.display()
            ),
            1,
        )
        .replacen(
            "[profiles.default]",
            "[profiles.default]\nchallenges = [\"http-01\", \"tls-alpn-01\"]",
            1,
        );
    assert!(toml.contains("tls-alpn-01"), "{toml}");
    let server = TestServer::start_in(data, &toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    for (name, kind) in [
        ("web.example.test", "http-01"),
        ("alpn.example.test", "tls-alpn-01"),
    ] {
        let (ch, ka) = challenge_of(&dir, &acct, name, kind).await;
        match kind {
            "http-01" => responder.publish(ch["token"].as_str().unwrap(), &ka),
            _ => slot.present(name, &ka),
        }
        let settled = acct
            .trigger_and_settle(&dir, ch["url"].as_str().unwrap())
            .await;
        assert_eq!(settled["status"], "valid", "{name}: {settled}");
        assert!(
            !dns.questions_for(name).await.is_empty(),
            "{name} was looked up at the configured server"
        );
        assert_eq!(
            dns.questions_for(&format!("{name}.tenant.example.test"))
                .await,
            Vec::<Value>::new(),
            "{name} was looked up with the search suffix"
        );
    }
    server.stop().await;
}
