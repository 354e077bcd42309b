//! ACME Renewal Information (RFC 9773): the window instant-acme reads for a
//! certificate of ours, the window moving into the past on revocation, a
//! certificate replaced once (`alreadyReplaced` the second time), and the
//! current certbot (5.x from PyPI) renewing exactly when the window says.

use ::time::OffsetDateTime;
use instant_acme::{
    AuthorizationStatus, CertificateIdentifier, ChallengeType, Identifier, NewOrder, OrderStatus,
    RevocationRequest,
};
use rustls::pki_types::CertificateDer;
use serde_json::json;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::clients::{certbot_certonly_standalone, run};
use crate::harness::{self, Responder, TestServer, free_port};
use crate::{client, raw};

/// The leaf of a PEM chain, DER.
fn leaf_der(chain: &str) -> Vec<u8> {
    ::pem::parse_many(chain).expect("PEM chain")[0]
        .contents()
        .to_vec()
}

fn validity(der: &[u8]) -> (OffsetDateTime, OffsetDateTime) {
    let (_, cert) = X509Certificate::from_der(der).expect("leaf parses");
    (
        cert.validity().not_before.to_datetime(),
        cert.validity().not_after.to_datetime(),
    )
}

#[allow(clippy::disallowed_methods)] // Compared with the server's real clock.
fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instant_acme_reads_a_window_inside_the_validity_then_in_the_past_after_revocation() {
    let responder = Responder::start().await;
    let server = TestServer::start(
        responder.port,
        None,
        "[profiles.default]\nbypass = true\nrenewal_info_retry_after = \"2h\"\n[profiles.default.signer]\ntype = \"local_ca\"\nvalidity = \"30d\"\nrenewal_window = [0.5, 0.9]\n",
    )
    .await;
    let account = client::account(&server.directory("default")).await;
    let mut windows = Vec::new();
    let mut last = None;
    for name in [
        "ari-1.example.test",
        "ari-2.example.test",
        "ari-3.example.test",
    ] {
        let (chain, _) = client::issue(&account, &responder, &[name]).await;
        let der = leaf_der(&chain);
        let id = CertificateIdentifier::try_from(&CertificateDer::from(der.clone()))
            .expect("our leaves carry an AKI");
        let (info, retry) = account.renewal_info(&id).await.expect("renewalInfo");
        let (nb, na) = validity(&der);
        let lifetime: ::time::Duration = na - nb;
        let w = info.suggested_window;
        assert!(w.end > w.start, "{w:?}");
        // Inside the configured half-to-nine-tenths of the lifetime, and a
        // quarter of it wide.
        assert!(
            w.start >= nb + lifetime * 0.5 - ::time::Duration::seconds(1),
            "{w:?}"
        );
        assert!(
            w.end <= nb + lifetime * 0.9 + ::time::Duration::seconds(1),
            "{w:?}"
        );
        assert!(w.start > now(), "a fresh certificate is not due: {w:?}");
        let width = (w.end - w.start).whole_seconds();
        assert!(
            (width - lifetime.whole_seconds() / 10).abs() <= 1,
            "{width}"
        );
        // Retry-After as configured (instant-acme returns what is left of it).
        assert!(
            retry > std::time::Duration::from_secs(7000)
                && retry <= std::time::Duration::from_secs(7200),
            "{retry:?}"
        );
        // Asked again: the same window (deterministic, not random per request).
        let (again, _) = account.renewal_info(&id).await.expect("renewalInfo");
        assert_eq!(again.suggested_window.start, w.start);
        windows.push(w.start);
        last = Some((der, id));
    }
    let distinct: std::collections::BTreeSet<_> = windows.iter().collect();
    assert_eq!(distinct.len(), 3, "each certificate gets its own window");

    // Revoked: the window moves into the past, so clients renew now.
    let (der, id) = last.expect("a certificate");
    account
        .revoke(&RevocationRequest {
            certificate: &CertificateDer::from(der),
            reason: None,
        })
        .await
        .expect("revoked");
    let (info, _) = account.renewal_info(&id).await.expect("renewalInfo");
    assert!(
        info.suggested_window.end < now()
            && info.suggested_window.start < info.suggested_window.end,
        "{:?}",
        info.suggested_window
    );

    // Not ours, or not an identifier at all.
    let dir = raw::directory(&server.directory("default")).await;
    let base = dir["renewalInfo"].as_str().expect("renewalInfo advertised");
    let r = raw::request("GET", &format!("{base}/AAAA.AAAA"), None, vec![]).await;
    assert_eq!(
        (r.status, r.problem().as_str()),
        (404, "malformed"),
        "{r:?}"
    );
    let r = raw::request("GET", &format!("{base}/not-an-id"), None, vec![]).await;
    assert_eq!(
        (r.status, r.problem().as_str()),
        (400, "malformed"),
        "{r:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_is_replaced_once_by_its_own_account_and_the_order_echoes_replaces() {
    let responder = Responder::start().await;
    let server =
        TestServer::start(responder.port, None, "[profiles.default]\nbypass = true\n").await;
    let account = client::account(&server.directory("default")).await;
    let (chain, _) = client::issue(&account, &responder, &["old.example.test"]).await;
    let der = leaf_der(&chain);
    let id = CertificateIdentifier::try_from(&CertificateDer::from(der))
        .expect("id")
        .into_owned();
    let names = [Identifier::Dns("old.example.test".into())];

    // Another account may not claim to replace it.
    let stranger = client::account(&server.directory("default")).await;
    let e = stranger
        .new_order(&NewOrder::new(&names).replaces(id.clone()))
        .await
        .err()
        .expect("another account's certificate");
    assert_eq!(client::problem_type(&e), "unauthorized", "{e}");
    // Nor may an order sharing no name with it.
    let other = [Identifier::Dns("unrelated.example.test".into())];
    let e = account
        .new_order(&NewOrder::new(&other).replaces(id.clone()))
        .await
        .err()
        .expect("no shared identifier");
    assert_eq!(client::problem_type(&e), "malformed", "{e}");

    // The renewal: instant-acme itself checks that the order echoes it.
    let mut order = account
        .new_order(&NewOrder::new(&names).replaces(id.clone()))
        .await
        .expect("the replacing order");
    assert_eq!(order.state().replaces.as_ref(), Some(&id));
    order.refresh().await.expect("order read");
    assert_eq!(
        order.state().replaces.as_ref(),
        Some(&id),
        "on later reads too"
    );

    // A second order replacing the same certificate: 409 alreadyReplaced.
    let e = account
        .new_order(&NewOrder::new(&names).replaces(id.clone()))
        .await
        .err()
        .expect("already replaced");
    assert_eq!(client::problem_type(&e), "alreadyReplaced", "{e}");
    match &e {
        instant_acme::Error::Api(p) => assert_eq!(p.status, Some(409)),
        other => panic!("{other}"),
    }

    // Once the replacing order is invalid (here: its authorization
    // deactivated), the certificate may be replaced again (RFC 9773 §5:
    // "by a different Order that is not invalid").
    let mut authorizations = order.authorizations();
    let mut authz = authorizations
        .next()
        .await
        .expect("one authorization")
        .expect("authorization");
    assert_eq!(authz.status, AuthorizationStatus::Pending);
    authz.deactivate().await.expect("deactivated");
    let status = order.refresh().await.expect("order").status;
    assert_eq!(status, OrderStatus::Invalid);
    let mut again = account
        .new_order(&NewOrder::new(&names).replaces(id.clone()))
        .await
        .expect("replaceable again once the first replacement is invalid");
    let mut authorizations = again.authorizations();
    let mut authz = authorizations.next().await.expect("one").expect("authz");
    let mut challenge = authz.challenge(ChallengeType::Http01).expect("http-01");
    responder.publish(&challenge.token, challenge.key_authorization().as_str());
    challenge.set_ready().await.expect("triggered");
    assert_eq!(
        again.poll_ready(&client::retry()).await.expect("ready"),
        OrderStatus::Ready
    );
    again.finalize().await.expect("finalized");
    again
        .poll_certificate(&client::retry())
        .await
        .expect("issued");

    // A malformed `replaces` is malformed.
    let dir = raw::directory(&server.directory("default")).await;
    let acct = raw::Acct::create(&dir, raw::Key::p256()).await;
    let r = acct
        .post(
            &dir,
            dir["newOrder"].as_str().expect("newOrder"),
            Some(&json!({"identifiers": [{"type": "dns", "value": "x.example.test"}], "replaces": "no-dot"})),
        )
        .await;
    assert_eq!(
        (r.status, r.problem().as_str()),
        (400, "malformed"),
        "{r:?}"
    );
    server.stop().await;
}

/// The serial (hex) of the certificate certbot keeps for lineage `t`.
fn certbot_serial(d: &std::path::Path) -> String {
    let pem = std::fs::read(d.join("conf/live/t/cert.pem")).expect("cert.pem");
    let der = ::pem::parse(pem).expect("PEM").contents().to_vec();
    let (_, cert) = X509Certificate::from_der(&der).expect("parses");
    hex::encode(cert.raw_serial())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_5_asks_renewal_info_and_renews_only_when_the_window_says_so() {
    let Some(certbot) = harness::certbot5() else {
        return;
    };
    let dir = crate::harness::tempdir();
    // Retry-After 1 s, so that certbot asks again on its next run.
    let toml = TestServer::config_text(
        dir.path(),
        free_port(),
        None,
        "[profiles.default]\nbypass = true\nrenewal_info_retry_after = \"1s\"\n",
    );
    let (_etc, config) = harness::config_file(&toml);
    let server = TestServer::start_in(dir, &toml).await;
    let directory = server.directory("default");
    let home = crate::harness::tempdir();
    let d = home.path().to_path_buf();
    // Validation is bypassed: certbot never has to listen here.
    let at = harness::own_addr();
    let ran = run(
        certbot.display().to_string(),
        certbot_certonly_standalone(&d, &directory, at, "ari-certbot.example.test"),
        d.clone(),
    )
    .await;
    assert!(ran.success(), "certbot certonly\n{}", ran.report());
    let first = certbot_serial(&d);

    let renew = || {
        // Without a terminal certbot sleeps up to 8 minutes before a
        // renewal, to spread a fleet's cron jobs; not here.
        let mut args = vec!["renew".to_owned(), "--no-random-sleep-on-renew".to_owned()];
        args.extend(crate::clients::certbot_common(&d, &directory));
        args.extend(crate::clients::certbot_standalone(at));
        run(certbot.display().to_string(), args, d.clone())
    };
    // A fresh 90-day certificate: its window is weeks away, so no renewal.
    let ran = renew().await;
    assert!(ran.success(), "certbot renew\n{}", ran.report());
    assert!(
        ran.report().contains("not yet due for renewal"),
        "{}",
        ran.report()
    );
    assert_eq!(certbot_serial(&d), first, "not renewed");
    // certbot recorded our Retry-After (1 s), which it only does from a
    // renewalInfo answer: an error would have recorded 6 hours.
    let conf = std::fs::read_to_string(d.join("conf/renewal/t.conf")).expect("renewal conf");
    let retry = conf
        .lines()
        .find_map(|l| l.strip_prefix("ari_retry_after = "))
        .unwrap_or_else(|| panic!("no ari_retry_after in\n{conf}"));
    let retry = ::time::PrimitiveDateTime::parse(
        retry,
        ::time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]"),
    )
    .expect("certbot's timestamp");
    // certbot writes local time, to the second: read the clock as it does.
    let local_clock = || {
        let out = std::process::Command::new("date")
            .arg("+%Y-%m-%dT%H:%M:%S")
            .output()
            .expect("date");
        ::time::PrimitiveDateTime::parse(
            String::from_utf8_lossy(&out.stdout).trim(),
            ::time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]"),
        )
        .expect("date's timestamp")
    };
    let local_now = local_clock();
    assert!(
        (retry - local_now).whole_seconds().abs() < 120,
        "ari_retry_after {retry} is not our 1 s Retry-After (now {local_now})"
    );

    // Revoked by the operator: the window is in the past, and the next
    // `certbot renew` renews.
    let orders = harness::run_cli(&config, &["order", "list", "--json"], &[]);
    let orders: serde_json::Value = serde_json::from_str(&orders.stdout).expect("orders");
    let order_id = orders[0]["id"].as_str().expect("order id").to_owned();
    let revoked = harness::run_cli(
        &config,
        &["order", "revoke", &order_id, "--reason", "4", "--yes"],
        &[],
    );
    assert_eq!(revoked.code, 0, "{revoked:?}");
    // certbot asks renewalInfo again only once its recorded Retry-After
    // has passed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while local_clock() <= retry {
        assert!(
            std::time::Instant::now() < deadline,
            "the clock did not pass certbot's ari_retry_after {retry}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let ran = renew().await;
    assert!(
        ran.success(),
        "certbot renew\n{}\n{}",
        ran.report(),
        crate::clients::certbot_log_tail(&d)
    );
    assert!(!ran.report().contains("not yet due"), "{}", ran.report());
    assert_ne!(certbot_serial(&d), first, "renewed after the window moved");
    server.stop().await;
}
