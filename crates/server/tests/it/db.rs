//! `acme-proxy db`: backing the database up, and copying a SQLite
//! installation into PostgreSQL.

use std::os::unix::fs::PermissionsExt;

use acme_proxy_store::{Store, StoreOptions};
use serde_json::json;

use crate::harness;
use crate::raw::{self, Acct, Key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_backup_copies_a_serving_sqlite_database_owner_only_and_refuses_to_overwrite() {
    // A SQLite file whatever the suite's backend: the copy is SQLite's.
    let dir = harness::tempdir();
    let config = dir.path().join("acme-proxy.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[profiles.default]\nbypass = true\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let (_server, directory) = harness::spawn_binary(
        dir.path(),
        &["serve", "--config", config.to_str().unwrap()],
        &[],
    );
    let directory = raw::directory(&directory).await;
    let acct = Acct::create(&directory, Key::p256()).await;
    let new_order = directory["newOrder"].as_str().unwrap().to_owned();
    let order = json!({"identifiers": [{"type": "dns", "value": "copied.example.test"}]});
    assert_eq!(
        acct.post(&directory, &new_order, Some(&order)).await.status,
        201
    );

    // While the server serves.
    let copy = dir.path().join("copy.db");
    let made = harness::run_cli(&config, &["db", "backup", copy.to_str().unwrap()], &[]);
    assert_eq!(made.code, 0, "{made:?}");
    assert!(made.stdout.contains("copy.db"), "{made:?}");
    let mode = std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the copy holds secrets");
    let copied = Store::open_read_only(
        &format!("sqlite:{}", copy.display()),
        &StoreOptions::default(),
    )
    .await
    .expect("the copy opens")
    .expect("the copy exists");
    let orders = copied
        .list_orders(None, None, None, 10)
        .await
        .expect("orders");
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0].identifiers.len(), 1);
    copied.close().await;

    // Never over an existing file.
    let again = harness::run_cli(&config, &["db", "backup", copy.to_str().unwrap()], &[]);
    assert_ne!(again.code, 0, "{again:?}");
    assert!(again.stderr.contains("exists"), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_backup_of_a_postgres_database_says_to_use_pg_dump() {
    let dir = harness::tempdir();
    let config = dir.path().join("acme-proxy.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\ndatabase_url = \"{}\"\n[profiles.default]\n",
            dir.path().join("data").display(),
            harness::fresh_postgres_database()
        ),
    )
    .unwrap();
    let copy = dir.path().join("copy.db");
    let refused = harness::run_cli(&config, &["db", "backup", copy.to_str().unwrap()], &[]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("pg_dump"), "{refused:?}");
    assert!(!copy.exists());
}

/// The CRL number and revoked serials of a profile's CRL (DER).
fn crl_contents(der: &[u8]) -> (u64, std::collections::BTreeSet<Vec<u8>>) {
    use x509_parser::prelude::*;
    let (_, crl) = parse_x509_crl(der).expect("CRL parses");
    let number = u64::try_from(crl.crl_number().expect("CRL number")).expect("small");
    let serials = crl
        .iter_revoked_certificates()
        .map(|r| r.raw_serial().to_vec())
        .collect();
    (number, serials)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_copy_moves_a_sqlite_installation_to_postgres_which_serves_the_same_orders_crl_and_accounts()
 {
    use instant_acme::{Identifier, NewOrder, OrderStatus, RevocationReason, RevocationRequest};
    use rustls::pki_types::CertificateDer;

    const ORDERS: usize = 2000;
    const REVOKED: usize = 40;
    // The data directory (the CA) outlives both servers.
    let home = harness::tempdir();
    let data = home.path().join("data");
    let profile = "[profiles.default]\nbypass = true\n";
    // One address for both servers: the clients' URLs stay valid.
    let sqlite_toml = format!(
        "listen = \"{}\"\ndata_dir = \"{}\"\n{profile}",
        harness::own_addr(),
        data.display()
    );
    let server = harness::TestServer::start_in(harness::tempdir(), &sqlite_toml).await;
    let directory = server.directory("default");
    let accounts = [
        crate::client::account(&directory).await,
        crate::client::account(&directory).await,
        crate::client::account(&directory).await,
        crate::client::account(&directory).await,
    ];
    let mut issuing = tokio::task::JoinSet::new();
    let mut issued: Vec<(usize, String, String)> = Vec::new();
    for i in 0..ORDERS {
        let a = i % accounts.len();
        let account = accounts[a].clone();
        issuing.spawn(async move {
            let id = Identifier::Dns(format!("moved{i}.example.test"));
            let mut order = account
                .new_order(&NewOrder::new(&[id]))
                .await
                .expect("new order");
            let mut auths = order.authorizations();
            while let Some(authz) = auths.next().await {
                let mut authz = authz.expect("authorization");
                let kind = authz.challenges[0].r#type.clone();
                authz
                    .challenge(kind)
                    .expect("a challenge")
                    .set_ready()
                    .await
                    .expect("ready");
            }
            order
                .poll_ready(&crate::client::retry())
                .await
                .expect("ready");
            order.finalize().await.expect("finalize");
            let chain = order
                .poll_certificate(&crate::client::retry())
                .await
                .expect("certificate");
            (a, order.url().to_owned(), chain)
        });
        while issuing.len() >= 8 {
            issued.push(issuing.join_next().await.expect("a task").expect("issued"));
        }
    }
    issued.extend(issuing.join_all().await);
    for (a, _, chain) in issued.iter().take(REVOKED) {
        let der = first_der(chain);
        accounts[*a]
            .revoke(&RevocationRequest {
                certificate: &CertificateDer::from(der),
                reason: Some(RevocationReason::KeyCompromise),
            })
            .await
            .expect("revoked");
    }
    let (number_before, revoked_before) = crl_contents(&crate::flow::crl_der(server.base()).await);
    assert_eq!(revoked_before.len(), REVOKED);
    server.stop().await;

    // The new configuration: PostgreSQL, its password in a file.
    let database = harness::fresh_postgres_database();
    let (url, password) = crate::postgres::without_password(&database);
    let secret = home.path().join("database-password");
    std::fs::write(&secret, format!("{password}\n")).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let pg_toml = format!(
        "database_url = \"{url}\"\ndatabase_password_file = \"{}\"\n{sqlite_toml}",
        secret.display()
    );
    let config = home.path().join("acme-proxy.toml");
    std::fs::write(&config, &pg_toml).unwrap();
    let from = format!("sqlite:{}", data.join("acme-proxy.db").display());

    let with_password = harness::run_cli(
        &config,
        &[
            "db",
            "copy",
            "--from",
            &from,
            "--to",
            &format!("postgres://u:{password}@h/d"),
        ],
        &[],
    );
    assert_ne!(with_password.code, 0, "{with_password:?}");
    assert!(
        with_password.stderr.contains("database_password_file"),
        "{with_password:?}"
    );

    let copied = harness::run_cli(&config, &["db", "copy", "--from", &from], &[]);
    assert_eq!(copied.code, 0, "{copied:?}");
    assert!(
        copied.stdout.contains("every count and digest matches"),
        "{copied:?}"
    );
    assert!(!copied.stdout.contains(&password), "{copied:?}");
    let rows = |table: &str| -> u64 {
        copied
            .stdout
            .lines()
            .find_map(|l| {
                let mut words = l.split_whitespace();
                (words.next() == Some(table)).then(|| words.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no line for {table}: {copied:?}"))
    };
    assert_eq!(rows("orders"), ORDERS as u64);
    assert_eq!(rows("certificates"), ORDERS as u64);
    assert_eq!(rows("accounts"), accounts.len() as u64);
    assert!(rows("audit_log") >= (ORDERS + REVOKED) as u64, "{copied:?}");
    eprintln!("{}", copied.stdout);

    // The copy left the planner statistics of what it wrote.
    assert_eq!(
        harness::psql_scalar(
            &database,
            "SELECT reltuples::bigint FROM pg_class WHERE relname = 'orders'"
        ),
        ORDERS.to_string()
    );

    // Copying again is refused: the target is no longer empty.
    let again = harness::run_cli(&config, &["db", "copy", "--from", &from], &[]);
    assert_ne!(again.code, 0, "{again:?}");
    assert!(again.stderr.contains("not empty"), "{again:?}");

    // A server on the copy: the same orders and certificates…
    let server = harness::TestServer::start_in(harness::tempdir(), &pg_toml).await;
    for (a, url, chain) in issued.iter().step_by(97) {
        let mut order = accounts[*a]
            .order(url.clone())
            .await
            .expect("the same order");
        assert_eq!(
            order.refresh().await.expect("refresh").status,
            OrderStatus::Valid
        );
        let served = order
            .certificate()
            .await
            .expect("download")
            .expect("a chain");
        assert_eq!(&served, chain, "{url}");
    }
    // …the same CRL, its numbers going on from the copied ones…
    let (number_after, revoked_after) = crl_contents(&crate::flow::crl_der(server.base()).await);
    assert_eq!(revoked_after, revoked_before);
    assert!(number_after >= number_before);
    let (a, _, chain) = &issued[REVOKED];
    accounts[*a]
        .revoke(&RevocationRequest {
            certificate: &CertificateDer::from(first_der(chain)),
            reason: None,
        })
        .await
        .expect("revoked on PostgreSQL");
    let (number_next, revoked_next) = crl_contents(&crate::flow::crl_der(server.base()).await);
    assert!(
        number_next > number_after,
        "{number_next} after {number_after}"
    );
    assert_eq!(revoked_next.len(), REVOKED + 1);
    // …and the same accounts, by their keys.
    for account in &accounts {
        let mut order = account
            .new_order(&NewOrder::new(&[Identifier::Dns(
                "after.example.test".into(),
            )]))
            .await
            .expect("an account of the SQLite installation orders on PostgreSQL");
        assert_eq!(order.state().status, OrderStatus::Pending);
    }
    server.stop().await;
}

/// The first certificate (DER) of a PEM chain.
fn first_der(chain: &str) -> Vec<u8> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).expect("PEM");
    pem.contents
}
