//! Two servers on one database, as two replicas are on PostgreSQL. On
//! SQLite, the single-process engine, the second is refused (`lock.rs`).

use std::collections::HashMap;

use x509_parser::prelude::*;

use crate::harness::{self, TestServer};

/// The second server of a test on the first's database: on PostgreSQL a
/// replica beside it; on SQLite refused while the first serves, so None.
async fn second_server(toml: &str) -> Option<TestServer> {
    if harness::on_postgres() {
        return Some(TestServer::start_in(harness::tempdir(), toml).await);
    }
    let config = acme_proxy::config::Config::from_toml(toml).expect("config");
    let started =
        acme_proxy::server::start(config, std::sync::Arc::new(acme_proxy::clock::SystemClock))
            .await;
    let Err(refused) = started else {
        panic!("a second server on one SQLite database started");
    };
    let refused = format!("{refused:#}");
    assert!(refused.contains("is serving the database"), "{refused}");
    None
}

/// The CRL number of a CRL (DER).
fn crl_number(der: &[u8]) -> u64 {
    let (_, crl) = parse_x509_crl(der).expect("CRL parses");
    let number = crl.crl_number().expect("CRL number");
    u64::try_from(number).expect("a small CRL number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_signing_one_profiles_crl_at_once_never_sign_two_crls_with_one_number_and_serve_the_newest()
 {
    let data = harness::tempdir();
    let toml = TestServer::config_text(data.path(), 1, None, "");
    let first = TestServer::start_in(data, &toml).await;
    // The second reads the CA the first made in the shared data directory.
    let Some(second) = second_server(&toml).await else {
        first.stop().await;
        return;
    };

    let signers: Vec<_> = [&first, &second]
        .iter()
        .flat_map(|server| {
            let authority = std::sync::Arc::clone(&server.running().authority());
            (0..10).map(move |_| {
                let authority = std::sync::Arc::clone(&authority);
                tokio::spawn(async move {
                    let profile = authority.profile("default").expect("profile").clone();
                    authority.refresh_crl(&profile).await.expect("a CRL")
                })
            })
        })
        .collect();
    let mut signed: HashMap<u64, Vec<u8>> = HashMap::new();
    for signer in signers {
        let der = signer.await.expect("task");
        let number = crl_number(&der);
        // What a refresh returns is the CRL stored under its number: one
        // CRL per number, whichever process signed it.
        if let Some(seen) = signed.insert(number, der.clone()) {
            assert_eq!(seen, der, "two different CRLs with number {number}");
        }
    }
    let newest = *signed.keys().max().expect("CRLs");
    assert!(
        newest >= 20,
        "every refresh signed with a number of its own: {newest}"
    );

    // Both serve the newest, whoever signed it.
    for server in [&first, &second] {
        let served = crate::flow::crl_der(server.base()).await;
        assert_eq!(crl_number(&served), newest);
        assert_eq!(served, signed[&newest]);
    }
    second.stop().await;
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nonce_one_server_issued_is_accepted_once_by_another_on_the_same_database() {
    use crate::raw::{self, Key};
    use serde_json::json;

    let data = harness::tempdir();
    // PostgreSQL keeps nonces in the database unless told otherwise.
    let toml = format!(
        "nonce_store = \"database\"\n{}",
        TestServer::config_text(data.path(), 1, None, "")
    );
    let first = TestServer::start_in(data, &toml).await;
    let Some(second) = second_server(&toml).await else {
        first.stop().await;
        return;
    };

    let at_first = raw::directory(&first.directory("default")).await;
    let at_second = raw::directory(&second.directory("default")).await;
    let nonce = raw::nonce(&at_first).await;
    let key = Key::p256();
    let new_account = at_second["newAccount"].as_str().expect("newAccount");
    let body = key.sign(
        &json!({"alg": key.alg(), "jwk": key.jwk, "nonce": nonce, "url": new_account}),
        Some(&json!({"termsOfServiceAgreed": true})),
    );
    let accepted = raw::post(new_account, &body).await;
    assert_eq!(accepted.status, 201, "{:?}", accepted.json());
    // The same request again, at either server: the nonce is spent.
    let replayed = raw::post(new_account, &body).await;
    replayed.assert_refused(400, "badNonce", "a replay at the server that took it");
    let at_first_new_account = at_first["newAccount"].as_str().expect("newAccount");
    let elsewhere = key.sign(
        &json!({"alg": key.alg(), "jwk": key.jwk, "nonce": nonce, "url": at_first_new_account}),
        Some(&json!({"termsOfServiceAgreed": true})),
    );
    raw::post(at_first_new_account, &elsewhere)
        .await
        .assert_refused(400, "badNonce", "a replay at the server that issued it");
    second.stop().await;
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_stamped_before_the_stored_crl_by_a_clock_behind_is_listed_when_the_crl_is_next_served()
 {
    use crate::raw::{self, Acct, Key};
    use crate::resources::{crl_entries, issue, serial};
    use acme_proxy::clock::ManualClock;

    // This server's clock is two minutes ahead of the replica that will
    // revoke: its CRL's thisUpdate is later than that revocation's time.
    let ahead = std::sync::Arc::new(ManualClock::starting_now());
    ahead.advance(std::time::Duration::from_secs(120));
    let data = harness::tempdir();
    let toml = TestServer::config_text(data.path(), 1, None, "[profiles.default]\nbypass = true\n");
    let server = TestServer::start_in_on(data, &toml, Default::default(), ahead).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let issued = issue(&dir, &acct, &["behind.example.test"], &Key::p256()).await;
    let authority = server.running().authority();
    let profile = authority.profile("default").expect("profile").clone();
    let signed = authority.refresh_crl(&profile).await.expect("a CRL");
    assert!(crl_entries(&server).await.is_empty());

    // Another replica, its clock behind, revokes and dies before it can
    // re-sign the CRL: only the revocation is stored.
    let store = authority.store();
    let cert_id = issued.cert_url.rsplit('/').next().expect("an id");
    let cert = store
        .certificate(cert_id)
        .await
        .unwrap()
        .expect("the certificate");
    let revoked = store
        .revoke_certificate(
            "default",
            &cert.serial,
            Some(1),
            acme_proxy::clock::Clock::unix(&acme_proxy::clock::SystemClock),
            &[],
            None,
        )
        .await
        .unwrap();
    assert_eq!(revoked, acme_proxy_store::RevokeOutcome::Revoked);

    // The CRL next served is a new one that lists it.
    let listed = crl_entries(&server).await;
    assert_eq!(
        listed.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>(),
        vec![serial(&issued.leaf)],
        "the CRL still lists {listed:?}"
    );
    let served = crate::flow::crl_der(server.base()).await;
    assert!(crl_number(&served) > crl_number(&signed));
    server.stop().await;
}
