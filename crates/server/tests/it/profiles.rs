//! Certificate profiles (draft-ietf-acme-profiles): advertised in the
//! directory, chosen by newOrder's `profile` (the default when absent),
//! `invalidProfile` for one not offered, each profile's validity, usages and
//! identifier types applied, and the current certbot's `--required-profile`.

use instant_acme::{ChallengeType, Identifier, NewOrder, OrderStatus};
use serde_json::json;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::clients::{certbot_certonly_standalone, run};
use crate::harness::{self, Responder, TestServer, free_port};
use crate::{client, raw};

/// "classic" (the signer's 90 days) by default, "shortlived" (6 days),
/// "tlsclient" (client authentication, DNS names only, no wildcards).
const PROFILES: &str = r#"[profiles.default]
bypass = true
challenges = ["http-01", "dns-01"]
default_certificate_profile = "classic"
[profiles.default.certificate_profiles.classic]
description = "90-day server certificates"
[profiles.default.certificate_profiles.shortlived]
description = "6-day server certificates"
validity = "6d"
[profiles.default.certificate_profiles.tlsclient]
description = "client authentication"
extended_key_usages = ["client_auth"]
key_usages = ["digital_signature"]
identifier_types = ["dns"]
wildcards = false
"#;

const DAY: i64 = 86400;

/// (lifetime in seconds, extKeyUsage: serverAuth, clientAuth) of a chain's leaf.
fn leaf_facts(chain: &str) -> (i64, bool, bool) {
    let der = ::pem::parse_many(chain).expect("PEM")[0]
        .contents()
        .to_vec();
    let (_, cert) = X509Certificate::from_der(&der).expect("leaf parses");
    let lifetime = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    let eku = cert
        .extended_key_usage()
        .expect("EKU parses")
        .expect("EKU present")
        .value;
    (lifetime, eku.server_auth, eku.client_auth)
}

/// Orders `names` with `profile`, validates over http-01 through the
/// responder, finalizes; returns the order's `profile` and the chain.
async fn issue(
    account: &instant_acme::Account,
    responder: &Responder,
    names: &[&str],
    profile: Option<&str>,
) -> (Option<String>, String) {
    let ids: Vec<Identifier> = names.iter().map(|n| Identifier::Dns((*n).into())).collect();
    let mut new_order = NewOrder::new(&ids);
    if let Some(p) = profile {
        new_order = new_order.profile(p);
    }
    let mut order = account.new_order(&new_order).await.expect("new order");
    let echoed = order.state().profile.clone();
    let mut authorizations = order.authorizations();
    while let Some(a) = authorizations.next().await {
        let mut a = a.expect("authorization");
        let mut c = a.challenge(ChallengeType::Http01).expect("http-01");
        responder.publish(&c.token, c.key_authorization().as_str());
        c.set_ready().await.expect("triggered");
    }
    assert_eq!(
        order.poll_ready(&client::retry()).await.expect("ready"),
        OrderStatus::Ready
    );
    order.finalize().await.expect("finalize");
    let chain = order
        .poll_certificate(&client::retry())
        .await
        .expect("chain");
    (echoed, chain)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_are_advertised_chosen_by_name_defaulted_and_applied_and_an_unknown_one_is_invalid()
 {
    let responder = Responder::start().await;
    let server = TestServer::start(responder.port, None, PROFILES).await;
    let dir = raw::directory(&server.directory("default")).await;
    assert_eq!(
        dir["meta"]["profiles"],
        json!({
            "classic": "90-day server certificates",
            "shortlived": "6-day server certificates",
            "tlsclient": "client authentication",
        })
    );
    let account = client::account(&server.directory("default")).await;

    let (echoed, chain) = issue(
        &account,
        &responder,
        &["short.example.test"],
        Some("shortlived"),
    )
    .await;
    assert_eq!(echoed.as_deref(), Some("shortlived"));
    let (lifetime, server_auth, _) = leaf_facts(&chain);
    // The signer backdates notBefore by an hour.
    assert_eq!(lifetime, 6 * DAY + 3600);
    assert!(server_auth);

    let (echoed, chain) = issue(&account, &responder, &["classic.example.test"], None).await;
    assert_eq!(echoed.as_deref(), Some("classic"), "the default, echoed");
    assert_eq!(leaf_facts(&chain).0, 90 * DAY + 3600);

    let (_, chain) = issue(
        &account,
        &responder,
        &["client.example.test"],
        Some("tlsclient"),
    )
    .await;
    let (_, server_auth, client_auth) = leaf_facts(&chain);
    assert!(client_auth && !server_auth, "tlsclient: clientAuth only");

    // Not offered: invalidProfile, naming what is.
    let e = account
        .new_order(&NewOrder::new(&[Identifier::Dns("x.example.test".into())]).profile("longlived"))
        .await
        .err()
        .expect("unknown profile");
    assert_eq!(client::problem_type(&e), "invalidProfile", "{e}");
    assert!(e.to_string().contains("shortlived"), "{e}");
    // What tlsclient does not certify: an IP address, a wildcard.
    for id in [
        Identifier::Ip("192.0.2.7".parse().expect("ip")),
        Identifier::Dns("*.example.test".into()),
    ] {
        let e = account
            .new_order(&NewOrder::new(std::slice::from_ref(&id)).profile("tlsclient"))
            .await
            .err()
            .expect("refused by the profile");
        assert_eq!(
            client::problem_type(&e),
            "rejectedIdentifier",
            "{id:?}: {e}"
        );
        assert!(e.to_string().contains("tlsclient"), "{e}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_without_profiles_refuses_a_named_one_as_invalid_profile() {
    let server = TestServer::start(free_port(), None, "[profiles.default]\nbypass = true\n").await;
    let dir = raw::directory(&server.directory("default")).await;
    assert!(dir["meta"]["profiles"].is_null(), "{dir}");
    let account = client::account(&server.directory("default")).await;
    let e = account
        .new_order(&NewOrder::new(&[Identifier::Dns("x.example.test".into())]).profile("classic"))
        .await
        .err()
        .expect("no profiles here");
    assert_eq!(client::problem_type(&e), "invalidProfile", "{e}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_5_with_required_profile_shortlived_gets_a_short_lived_certificate() {
    let Some(certbot) = harness::certbot5() else {
        return;
    };
    let server = TestServer::start(free_port(), None, PROFILES).await;
    let home = crate::harness::tempdir();
    let d = home.path().to_path_buf();
    let mut args = certbot_certonly_standalone(
        &d,
        &server.directory("default"),
        harness::own_addr(),
        "cb5.example.test",
    );
    args.extend(["--required-profile".to_owned(), "shortlived".to_owned()]);
    let ran = run(certbot.display().to_string(), args, d.clone()).await;
    assert!(ran.success(), "certbot certonly\n{}", ran.report());
    let chain = std::fs::read_to_string(d.join("conf/live/t/cert.pem")).expect("cert.pem");
    assert_eq!(leaf_facts(&chain).0, 6 * DAY + 3600);

    // A profile the server does not offer: certbot fails with our problem.
    let mut args = certbot_certonly_standalone(
        &d,
        &server.directory("default"),
        harness::own_addr(),
        "cb5b.example.test",
    );
    args.extend([
        "--required-profile".to_owned(),
        "longlived".to_owned(),
        "--cert-name".to_owned(),
        "u".to_owned(),
    ]);
    let ran = run(certbot.display().to_string(), args, d.clone()).await;
    assert!(!ran.success(), "{}", ran.report());
    // Our problem's words (the command line alone names "longlived").
    assert!(
        ran.report()
            .contains("is not a certificate profile of this endpoint"),
        "{}",
        ran.report()
    );
    server.stop().await;
}
