//! `acme-proxy db`: backing the database up.

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
