//! Tests of the store's PostgreSQL functions (migration 0022) under the
//! concurrency they were written for. They run in the suite's PostgreSQL
//! pass (`scripts/test` sets `TEST_DB_BACKEND=postgres` and excludes them
//! from the SQLite one, where one writer at a time rules the race out).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::test_support::{ACCOUNT, GUARD, TestDb, on_postgres};

/// Runs `sql` on `conn`, a connection the test holds (its transaction
/// stays open across calls).
async fn run(conn: &mut sqlx::PgConnection, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_order_whose_two_authorizations_are_validated_at_once_becomes_ready_once_both_commit() {
    assert!(
        on_postgres(),
        "these tests need PostgreSQL: TEST_DB_BACKEND=postgres and TEST_POSTGRES_URL"
    );
    let (db, store) = TestDb::open().await;
    db.exec(&format!(
        "{ACCOUNT}
         INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
             VALUES ('o', 'default', 'acct', 'pending', '[]', 100, 1);
         INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value,
                 status, expires_at, created_at)
             VALUES ('a1', 'default', 'acct', 'dns', 'one.example', 'pending', 100, 1),
                    ('a2', 'default', 'acct', 'dns', 'two.example', 'pending', 100, 1);
         INSERT INTO challenges (id, authz_id, type, token, status)
             VALUES ('ch1', 'a1', 'http-01', 't1', 'pending'),
                    ('ch2', 'a2', 'http-01', 't2', 'pending');
         INSERT INTO order_authorizations (order_id, authz_id, position)
             VALUES ('o', 'a1', 0), ('o', 'a2', 1);"
    ))
    .await;
    // Another process validates the first authorization and has not
    // committed: it saw the second pending, so the order stays pending by
    // its hand, and it holds the order's row.
    let mut other = db.postgres().await;
    run(&mut other, "BEGIN").await;
    run(&mut other, "SELECT acme_validate_authorization('a1', 50)").await;
    let bypass = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .bypass_challenge("ch2", "default", &["http-01"], 1, 50, GUARD)
                .await
        }
    });
    // The second validation waits for the order's row: had it not, it
    // would see the first authorization still pending, and nobody would
    // make the order ready.
    let mut watcher = db.postgres().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND wait_event IN ('transactionid', 'tuple') AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if waiting == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second validation never waited for the first"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!bypass.is_finished());
    run(&mut other, "COMMIT").await;
    let (challenge, authz) = bypass.await.unwrap().unwrap().expect("moved");
    assert_eq!(
        (challenge.status.as_str(), authz.status.as_str()),
        ("valid", "valid")
    );
    assert_eq!(
        store.order("o").await.unwrap().unwrap().status.as_str(),
        "ready"
    );
    store.close().await;
}
