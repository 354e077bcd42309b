//! What the store's tests share: a fresh store (a SQLite file in a
//! directory, or a database of its own on the PostgreSQL server the suite
//! names), and the rows and guard of the account their hand-written rows
//! belong to.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use crate::{
    AccountGuard, AuditEvent, AuditOutcome, NewAuditRow, NewCertificateRow, Store, StoreOptions,
};

/// The account the tests' hand-written rows belong to.
pub(crate) const ACCOUNT: &str =
    "INSERT INTO accounts (id, profile, key_thumbprint, jwk, status, created_at)
             VALUES ('acct', 'default', 'thumb', '{}', 'valid', 1);";

/// A certificate of [`ACCOUNT`]'s for `order_id`.
pub(crate) fn cert_row(
    id: &'static str,
    order_id: &'static str,
    serial: &'static str,
) -> NewCertificateRow<'static> {
    NewCertificateRow {
        id,
        profile: "default",
        order_id,
        account_id: "acct",
        serial,
        chain_pem: "PEM",
        key_thumbprint: None,
        identifiers: &[],
        not_before: 1,
        not_after: 2,
        now: 1,
    }
}

/// The audit row of an issuance for `order_id`.
pub(crate) fn issued_row(order_id: &'static str) -> NewAuditRow<'static> {
    NewAuditRow {
        order_id: Some(order_id),
        ..NewAuditRow::new(
            1,
            AuditEvent::CertificateIssued,
            AuditOutcome::Success,
            "account:acct",
        )
    }
}

/// [`ACCOUNT`] as a request signed with its key carries it.
pub(crate) const GUARD: AccountGuard<'static> = AccountGuard {
    id: "acct",
    key_thumbprint: "thumb",
};

/// A store on a fresh `t.db` in `dir`, and the file's path.
pub(crate) async fn open_in(dir: &Path) -> (std::path::PathBuf, Store) {
    let path = dir.join("t.db");
    let url = format!("sqlite:{}", path.display());
    let store = Store::open(&url, &StoreOptions::default()).await.unwrap();
    (path, store)
}

/// A fresh database for a test that holds on either engine: a SQLite file
/// by default; with `TEST_DB_BACKEND=postgres` (as `scripts/test` sets for
/// its second run) a new database on the PostgreSQL server
/// `TEST_POSTGRES_URL` names, so the store's own tests run on both.
pub(crate) struct TestDb {
    url: String,
    /// The SQLite file's directory, removed on drop.
    _dir: Option<tempfile::TempDir>,
}

/// Whether the tests run on PostgreSQL (`TEST_DB_BACKEND=postgres`).
pub(crate) fn on_postgres() -> bool {
    match std::env::var("TEST_DB_BACKEND").as_deref() {
        Ok("postgres") => true,
        Ok("sqlite") | Err(_) => false,
        Ok(other) => panic!("TEST_DB_BACKEND={other}: write sqlite or postgres"),
    }
}

impl TestDb {
    /// A new, empty database, and a store opened on it.
    pub(crate) async fn open() -> (TestDb, Store) {
        let db = if on_postgres() {
            TestDb {
                url: fresh_postgres_database().await,
                _dir: None,
            }
        } else {
            let dir = tempfile::tempdir().unwrap();
            TestDb {
                url: format!("sqlite:{}", dir.path().join("t.db").display()),
                _dir: Some(dir),
            }
        };
        let store = Store::open(&db.url, &StoreOptions::default())
            .await
            .unwrap();
        (db, store)
    }

    /// Its URL, for a second store on it (another process).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The first column of `sql`'s first row, a count, read on a
    /// connection of its own.
    pub(crate) async fn scalar(&self, sql: &str) -> i64 {
        if crate::is_postgres_url(&self.url) {
            let mut conn = self.postgres().await;
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_one(&mut conn)
                .await
                .unwrap();
            sqlx::Connection::close(conn).await.unwrap();
            n
        } else {
            self.sqlite().query_row(sql, [], |row| row.get(0)).unwrap()
        }
    }

    /// Runs `sql` (statements separated by `;`, text both engines read)
    /// on a connection of its own, as another process would.
    pub(crate) async fn exec(&self, sql: &str) {
        if crate::is_postgres_url(&self.url) {
            let mut conn = self.postgres().await;
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await
                .unwrap();
            sqlx::Connection::close(conn).await.unwrap();
        } else {
            self.sqlite().execute_batch(sql).unwrap();
        }
    }

    /// A PostgreSQL connection of its own to the database.
    pub(crate) async fn postgres(&self) -> sqlx::PgConnection {
        <sqlx::PgConnection as sqlx::Connection>::connect(&self.url)
            .await
            .unwrap()
    }

    /// A SQLite connection of its own to the file.
    fn sqlite(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.url.trim_start_matches("sqlite:")).unwrap()
    }
}

/// A new database on the suite's PostgreSQL server, its URL: named
/// `t_PID_N` like the integration tests' (whose harness drops those of
/// ended processes); one left by an earlier process with this PID is
/// dropped first.
async fn fresh_postgres_database() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};

    use sqlx::Connection as _;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let server = std::env::var("TEST_POSTGRES_URL").expect(
        "TEST_POSTGRES_URL names the PostgreSQL server of the suite (scripts/test starts one)",
    );
    let name = format!(
        "t_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let mut conn = sqlx::PgConnection::connect(&server).await.unwrap();
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    conn.close().await.unwrap();
    let (base, query) = server.split_once('?').unwrap_or((&server, ""));
    let (base, _) = base
        .rsplit_once('/')
        .expect("TEST_POSTGRES_URL is postgres://USER@HOST/DATABASE");
    format!("{base}/{name}?{query}")
}
