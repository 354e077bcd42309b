//! What only PostgreSQL has: a password, kept out of the URL and out of
//! every line the server prints. (The whole suite also runs on PostgreSQL:
//! `TEST_DB_BACKEND=postgres`, see harness.rs.)

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::json;

use crate::harness::{self, PgCluster, TestServer, binary};
use crate::raw::{self, Acct, Key};

/// `url` with the password of its user information taken out, and that
/// password.
pub(crate) fn without_password(url: &str) -> (String, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (userinfo, host) = rest.split_once('@').expect("user information");
    let (user, password) = userinfo
        .split_once(':')
        .expect("TEST_POSTGRES_URL carries the test cluster's password");
    (format!("{scheme}://{user}@{host}"), password.to_owned())
}

/// The text of a configuration with its data in `data_dir`, on the
/// database at `url`, `extra` at its top level.
fn config_text(data_dir: &Path, url: &str, extra: &str) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ndatabase_url = \"{url}\"\n{extra}\n[profiles.default]\nbypass = true\n",
        data_dir.display()
    )
}

/// A configuration file in `data` on the database at `url`, `extra` at
/// its top level.
fn config(data: &Path, url: &str, extra: &str) -> std::path::PathBuf {
    let path = data.join("acme-proxy.toml");
    std::fs::write(&path, config_text(&data.join("data"), url, extra)).expect("config");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_from_an_owner_only_file_opens_postgres_and_no_output_shows_it() {
    let (url, password) = without_password(&harness::fresh_postgres_database());
    let dir = harness::tempdir();
    let secret = dir.path().join("database-password");
    std::fs::write(&secret, format!("{password}\n")).expect("password file");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = config(
        dir.path(),
        &url,
        &format!("database_password_file = \"{}\"", secret.display()),
    );

    let checked = harness::run_cli(&config, &["config", "check"], &[]);
    assert_eq!(checked.code, 0, "{checked:?}");
    assert!(
        checked.stdout.contains(&format!("database {url}")),
        "{checked:?}"
    );

    let (server, directory) = harness::spawn_binary(
        dir.path(),
        &["serve", "--config", config.to_str().expect("utf-8")],
        &[],
    );
    let account = crate::client::account(&directory).await;
    let mut order = account
        .new_order(&instant_acme::NewOrder::new(&[
            instant_acme::Identifier::Dns("pg.example.test".into()),
        ]))
        .await
        .expect("an order, stored in PostgreSQL");
    assert_eq!(order.state().status, instant_acme::OrderStatus::Pending);
    drop(server);
    let log = std::fs::read_to_string(dir.path().join("acme-proxy.log")).expect("log");
    assert!(log.contains("ca.generated"), "the server ran:\n{log}");
    for (what, text) in [("config check", &checked.stdout), ("serve's log", &log)] {
        assert!(!text.contains(&password), "{what} shows the password");
    }

    // Readable by others: refused before the database is opened, saying
    // how to close it.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = std::process::Command::new(binary())
        .args(["serve", "--config", config.to_str().expect("utf-8")])
        .env_remove("ACME_PROXY_CONFIG")
        .output()
        .expect("run acme-proxy");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("chmod 600 '{}'", secret.display())),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_url_is_shown_as_stars_and_a_wrong_one_stops_start_up_saying_so() {
    let with = harness::fresh_postgres_database();
    let (url, password) = without_password(&with);
    let dir = harness::tempdir();

    let config_with = config(dir.path(), &with, "");
    let checked = harness::run_cli(&config_with, &["config", "check"], &[]);
    assert_eq!(checked.code, 0, "{checked:?}");
    assert!(!checked.stdout.contains(&password), "{checked:?}");
    let shown = url.replacen("postgres@", "postgres:***@", 1);
    assert!(checked.stdout.contains(&shown), "{checked:?}");

    let wrong = url.replacen("postgres@", "postgres:not-the-password@", 1);
    let config_wrong = config(dir.path(), &wrong, "");
    let refused = harness::run_cli(&config_wrong, &["config", "check"], &[]);
    assert_ne!(refused.code, 0, "{refused:?}");
    let said = format!("{}{}", refused.stdout, refused.stderr);
    assert!(said.contains("password authentication failed"), "{said}");
    assert!(!said.contains("not-the-password"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_postgres_is_down_requests_get_503_with_retry_after_and_service_returns_with_it() {
    let pg = PgCluster::start();
    let data = harness::tempdir();
    let toml = config_text(data.path(), &pg.url(), "");
    let server = TestServer::start_in(data, &toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let new_order = dir["newOrder"].as_str().expect("newOrder").to_owned();
    let order = json!({"identifiers": [{"type": "dns", "value": "outage.example.test"}]});
    assert_eq!(acct.post(&dir, &new_order, Some(&order)).await.status, 201);

    pg.stop();
    let refused = acct.post(&dir, &new_order, Some(&order)).await;
    assert_eq!(refused.status, 503, "{}", refused.json());
    assert_eq!(
        refused
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("5")
    );
    assert_eq!(
        refused.json()["type"],
        "urn:ietf:params:acme:error:serverInternal"
    );
    let health = crate::flow::reqwest_get(&format!("{}/health", server.base())).await;
    assert_eq!(
        health.0, 503,
        "/health tells a balancer to send requests elsewhere"
    );

    // Back: served again as soon as the pool reconnects, with what was
    // written before the outage.
    pg.start_again();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let r = acct.post(&dir, &new_order, Some(&order)).await;
        if r.status == 201 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not served 20 s after PostgreSQL came back: {} {}",
            r.status,
            r.json()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let account = acct.post(&dir, &acct.url, None).await.json();
    let orders_url = account["orders"]
        .as_str()
        .expect("the orders URL")
        .to_owned();
    let orders = acct.post(&dir, &orders_url, None).await;
    assert_eq!(orders.json()["orders"].as_array().map(Vec::len), Some(2));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_seconds_without_postgres_under_load_answer_503_with_retry_after_and_leave_nothing_half_done()
 {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    let pg = PgCluster::start();
    let data = harness::tempdir();
    let toml = config_text(data.path(), &pg.url(), "");
    let server = TestServer::start_in(data, &toml).await;
    let directory = server.directory("default");

    // Load: eight clients issuing in a loop, each failure waited out.
    let stop = Arc::new(AtomicBool::new(false));
    let issued = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for c in 0..8 {
        let account = crate::client::account(&directory).await;
        let (stop, issued) = (Arc::clone(&stop), Arc::clone(&issued));
        clients.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let name = format!("load{c}-{i}.example.test");
                let done = async {
                    let id = instant_acme::Identifier::Dns(name);
                    let mut order = account
                        .new_order(&instant_acme::NewOrder::new(&[id]))
                        .await?;
                    let mut auths = order.authorizations();
                    while let Some(authz) = auths.next().await {
                        let mut authz = authz?;
                        let kind = authz.challenges[0].r#type.clone();
                        if let Some(mut ch) = authz.challenge(kind) {
                            ch.set_ready().await?;
                        }
                    }
                    order.poll_ready(&crate::client::retry()).await?;
                    order.finalize().await?;
                    order.poll_certificate(&crate::client::retry()).await?;
                    Ok::<_, instant_acme::Error>(())
                }
                .await;
                match done {
                    Ok(()) => {
                        issued.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }));
    }
    // A probe that records what a client is told, every 100 ms.
    let dir = raw::directory(&directory).await;
    let probe_acct = Acct::create(&dir, Key::p256()).await;
    let new_order = dir["newOrder"].as_str().expect("newOrder").to_owned();
    let order = json!({"identifiers": [{"type": "dns", "value": "probe.example.test"}]});
    let wait_for = |n: usize| {
        let issued = Arc::clone(&issued);
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while issued.load(Ordering::SeqCst) < n {
                assert!(
                    Instant::now() < deadline,
                    "fewer than {n} issuances in 30 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for(20).await;
    pg.stop();
    let down = Instant::now();
    let mut during = Vec::new();
    while down.elapsed() < Duration::from_secs(10) {
        let r = probe_acct.post(&dir, &new_order, Some(&order)).await;
        let retry_after = r
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        during.push((r.status, retry_after));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pg.start_again();
    let back = Instant::now();
    let before_return = issued.load(Ordering::SeqCst);
    wait_for(before_return + 20).await;
    let full_service = back.elapsed();
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("client task");
    }

    // During the outage: 503, Retry-After: 5, and nothing else.
    assert!(during.len() >= 50, "{} probes", during.len());
    for (status, retry_after) in &during {
        assert_eq!(
            (*status, retry_after.as_deref()),
            (503, Some("5")),
            "a request while PostgreSQL was down"
        );
    }
    assert!(
        full_service < Duration::from_secs(10),
        "twenty issuances took {full_service:?} after PostgreSQL returned"
    );
    eprintln!(
        "{} probes answered 503 + Retry-After during the outage; 20 issuances {full_service:?} after its end; {} issued in all",
        during.len(),
        issued.load(Ordering::SeqCst)
    );

    // Nothing half-done: every valid order has its certificate, no order
    // is left processing, no job is left running, and each ready or valid
    // order's authorizations are valid.
    let psql = |sql: &str| harness::psql_scalar(&pg.url(), sql);
    assert_eq!(
        psql(
            "SELECT COUNT(*) FROM orders o WHERE o.status = 'valid' AND NOT EXISTS (SELECT 1 FROM certificates c WHERE c.order_id = o.id)"
        ),
        "0"
    );
    assert_eq!(
        psql("SELECT COUNT(*) FROM orders WHERE status = 'processing'"),
        "0"
    );
    assert_eq!(
        psql(
            "SELECT COUNT(*) FROM orders o JOIN order_authorizations oa ON oa.order_id = o.id JOIN authorizations a ON a.id = oa.authz_id WHERE o.status IN ('ready', 'valid') AND a.status <> 'valid'"
        ),
        "0"
    );
    assert_eq!(
        psql(
            "SELECT COUNT(*) FROM certificates c JOIN orders o ON o.id = c.order_id WHERE o.status <> 'valid'"
        ),
        "0",
        "a certificate whose order is not valid"
    );
    server.stop().await;
    assert_eq!(
        psql("SELECT COUNT(*) FROM jobs WHERE status IN ('running', 'retiring')"),
        "0",
        "a job left running"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_postgres_follows_sslmode_and_verifies_the_servers_certificate() {
    let pki = crate::upstream::TestPki::new();
    let (cert, key) = pki.server_cert(&["localhost", "127.0.0.1"]);
    let (pg, port) = PgCluster::start_tls(&cert, &key);
    let data = harness::tempdir();
    let at = |query: &str| format!("postgres://postgres@localhost:{port}/postgres?{query}");
    let ca = pki.ca_pem_path();

    // verify-full against the cluster's CA: served, over TLS.
    let verified = at(&format!("sslmode=verify-full&sslrootcert={}", ca.display()));
    let toml = config_text(data.path(), &verified, "");
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    assert!(acct.url.contains("/acct/"), "an account over TLS");
    // The server's sessions, as PostgreSQL sees them: every one over TLS.
    let counts = harness::psql_scalar(
        &format!("postgres://postgres@localhost:{port}/postgres?sslmode=require"),
        "SELECT COUNT(*) FILTER (WHERE s.ssl), COUNT(*) FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'acme-proxy'",
    );
    let (tls, all) = counts.split_once('|').expect("two counts");
    assert!(
        all != "0" && tls == all,
        "acme-proxy's sessions over TLS: {counts}"
    );
    server.stop().await;

    let check = |url: String| {
        let config = config(data.path(), &url, "");
        harness::run_cli(&config, &["config", "check"], &[])
    };
    // Without TLS: the cluster refuses (pg_hba.conf: hostnossl reject).
    let plain = check(at("sslmode=disable"));
    assert_ne!(plain.code, 0, "{plain:?}");
    assert!(plain.stderr.contains("no encryption"), "{plain:?}");
    // verify-full against another CA: the certificate is refused.
    let other = crate::upstream::TestPki::new();
    let wrong = check(at(&format!(
        "sslmode=verify-full&sslrootcert={}",
        other.ca_pem_path().display()
    )));
    assert_ne!(wrong.code, 0, "{wrong:?}");
    assert!(
        wrong.stderr.to_lowercase().contains("certificate"),
        "{wrong:?}"
    );
    drop(pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_deletion_waits_for_a_finalize_in_progress_and_then_refuses() {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use acme_proxy_store::{DeleteOutcome, Store, StoreOptions};

    let url = harness::fresh_postgres_database();
    let store = Store::open(&url, &StoreOptions::default())
        .await
        .expect("open");
    let psql = |sql: &str| {
        harness::psql_scalar(&url, sql);
    };
    psql(
        "INSERT INTO accounts (id, profile, key_thumbprint, jwk, status, created_at) VALUES ('acct', 'default', 'thumb', '{}', 'valid', 1);
         INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at) VALUES ('o1', 'default', 'acct', 'ready', '[]', 9999999999, 1);
         INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at) VALUES ('o2', 'default', 'acct', 'ready', '[]', 9999999999, 1);",
    );
    // Another session starts finalizing each order and has not committed.
    for (order, delete_account) in [("o1", false), ("o2", true)] {
        // Only the order under test is busy (the first one's finalize
        // gave up, say).
        psql("UPDATE orders SET status = 'ready' WHERE status = 'processing'");
        let mut finalize = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
            .arg(&url)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("psql");
        let mut input = finalize.stdin.take().expect("stdin");
        writeln!(
            input,
            "BEGIN; UPDATE orders SET status = 'processing' WHERE id = '{order}';"
        )
        .expect("write");
        // Its update holds the row (it has a transaction id and is idle
        // in its transaction) before the deletion starts.
        let count = |sql: &str| harness::psql_count(&url, sql);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while count(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_xid IS NOT NULL AND state = 'idle in transaction'",
        ) == 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the finalizing session never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let deleting = {
            let store = store.clone();
            tokio::spawn(async move {
                if delete_account {
                    store.delete_account("acct", 1, None).await
                } else {
                    store.delete_order(order, 1, None).await
                }
            })
        };
        // The deletion waits for the finalize's row lock (rather than
        // reading past it); only then does the finalize commit.
        while count(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        ) == 0
        {
            assert!(
                !deleting.is_finished(),
                "deleting while {order} was being finalized did not wait for its lock"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "the deletion never reached the database"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        writeln!(input, "COMMIT;").expect("write");
        drop(input);
        assert!(finalize.wait().expect("psql").success());
        let outcome = deleting.await.expect("task").expect("deletion");
        assert!(
            matches!(
                &outcome,
                DeleteOutcome::Refused(acme_proxy_store::Blocker::InFlight { .. })
            ),
            "deleting {} while {order} was being finalized: {outcome:?}",
            if delete_account {
                "the account"
            } else {
                "the order"
            }
        );
    }
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_max_connections_bounds_the_sessions_a_server_opens() {
    let url = harness::fresh_postgres_database();
    let data = harness::tempdir();
    let toml = config_text(data.path(), &url, "database_max_connections = 2");
    let server = TestServer::start_in(data, &toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    // Sixteen registrations at once: each needs the database.
    let registering: Vec<_> = (0..16)
        .map(|_| {
            let dir = dir.clone();
            tokio::spawn(async move { Acct::create(&dir, Key::p256()).await })
        })
        .collect();
    for r in registering {
        r.await.expect("registered");
    }
    let sessions = harness::psql_count(
        &url,
        "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'acme-proxy' AND datname = current_database()",
    );
    assert!(
        (1..=2).contains(&sessions),
        "{sessions} sessions with database_max_connections = 2"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn using_a_nonce_does_not_wait_for_a_wal_flush_and_an_ordinary_write_still_does() {
    use std::time::{Duration, Instant};

    use acme_proxy_store::{NewAuditRow, Store, StoreOptions};

    let pg = PgCluster::start_durable();
    let psql = |sql: &str| harness::psql_count(&pg.url(), sql);
    // The WAL syncs PostgreSQL has issued, once the store's sessions have
    // ended (a session reports its counts when it exits) and the count
    // has stopped moving.
    let syncs = || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while psql(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        ) > 0
        {
            assert!(
                Instant::now() < deadline,
                "the store's sessions did not end"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut last = psql("SELECT wal_sync FROM pg_stat_wal");
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = psql("SELECT wal_sync FROM pg_stat_wal");
            if now == last {
                return now;
            }
            assert!(Instant::now() < deadline, "the WAL sync count kept moving");
            last = now;
        }
    };
    let (url, options) = (pg.url(), StoreOptions::default());
    let open = || Store::open(&url, &options);
    // Forty ordinary writes: each commit waits for its sync.
    let store = open().await.expect("open");
    store.close().await;
    let before = syncs();
    let store = open().await.expect("open");
    for i in 0..40 {
        store
            .insert_audit(&NewAuditRow::new(
                i,
                acme_proxy_store::AuditEvent::CertificateIssued,
                acme_proxy_store::AuditOutcome::Success,
                "system",
            ))
            .await
            .expect("audit");
    }
    store.close().await;
    let ordinary = syncs() - before;
    assert!(
        ordinary >= 40,
        "{ordinary} WAL syncs for 40 ordinary commits"
    );
    // Forty nonces used: their records are flushed by the WAL writer in
    // the background (or by the next ordinary commit), not one sync each.
    let before = syncs();
    let store = open().await.expect("open");
    for i in 0..40 {
        assert!(
            store
                .use_nonce(&format!("nonce-{i}"), 9_999_999_999)
                .await
                .expect("use")
        );
    }
    // Each is still used once.
    assert!(
        !store
            .use_nonce("nonce-0", 9_999_999_999)
            .await
            .expect("use")
    );
    store.close().await;
    let nonces = syncs() - before;
    assert!(nonces <= 20, "{nonces} WAL syncs for 41 nonce uses");
    // Forty reads that each carry their request's nonce in their own
    // statement (`Store::spending_nonce`): no sync each either.
    let before = syncs();
    let store = open().await.expect("open");
    let read = |nonce: String| {
        let store = store.clone();
        async move {
            store
                .spending_nonce(&nonce, 9_999_999_999, store.order("none"))
                .await
        }
    };
    for i in 0..40 {
        let found = read(format!("read-{i}")).await.expect("fresh");
        assert!(found.expect("read").is_none());
    }
    assert!(matches!(
        read("read-0".to_owned()).await,
        Err(acme_proxy_store::StoreError::NonceReplayed)
    ));
    store.close().await;
    let reads = syncs() - before;
    assert!(
        reads <= 20,
        "{reads} WAL syncs for 41 reads carrying a nonce"
    );
}
