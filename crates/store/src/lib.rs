//! acme-proxy's storage crate: the only code in the workspace that speaks SQL.
//!
//! It owns the schema (embedded, append-only migrations per backend), typed
//! rows, and every multi-row change as one transaction. Status transitions
//! are *guarded* statements (`UPDATE … WHERE status = 'ready'`) whose row
//! count tells the caller whether it won a race; nonce consumption is one
//! `DELETE` whose row count says whether the nonce was fresh.
//!
//! Architecture Invariant: the store never reads the clock. Every function
//! that depends on time takes `now` (Unix seconds) from its caller.
//!
//! Architecture Invariant: every `SELECT` names its columns, and only
//! runtime (not compile-time checked) queries are used, so that a PostgreSQL
//! backend can be added beside SQLite without touching any caller.

mod accounts;
mod admin;
mod audit;
mod certificates;
mod eab;
mod jobs;
mod nonces;
mod orders;
mod relay;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

pub use accounts::{AccountRow, KeyChangeOutcome, NewAccountRow};
pub use admin::DeleteOutcome;
pub use audit::{AuditFilter, AuditRow, NewAuditRow};
pub use certificates::{CertificateRow, CrlRow, NewCertificateRow, RevokeOutcome, RevokedEntry};
pub use eab::{EabRow, NewEab};
pub use jobs::{Enqueued, JobCounts, JobRow, NewJob};
pub use orders::{
    AuthorizationRow, ChallengeRow, InsertOrder, NewAuthorization, NewChallenge, NewOrderRow,
    OrderAuthorization, OrderRow, ProcessingChallenge,
};
pub use relay::{NewUpstreamOrder, UpstreamAccountRow, UpstreamOrderRow};

/// Errors from the store. A caller maps them to `serverInternal`; the detail
/// is for logs only.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
    #[error("unsupported database URL {0:?}: this build supports sqlite:PATH")]
    UnsupportedUrl(String),
    #[error("the store is closed")]
    Closed,
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Handle to the database. Cheap to clone.
///
/// SQLite allows one writer at a time; all writes go through one connection
/// so that concurrent requests queue in-process instead of colliding in
/// `SQLITE_BUSY` retries, while reads use a few read-only connections and
/// see the last committed state (WAL).
///
/// The connections are held behind async mutexes rather than in an
/// `sqlx::Pool`: the pool pings a connection on every acquire and every
/// release, and with SQLite each ping is a round trip to the connection's
/// worker thread — two extra thread hand-offs per statement
/// (docs/performance.md). A connection to a local file does not go stale;
/// a statement whose future is dropped leaves the connection consistent
/// because its worker runs commands in order (an abandoned transaction's
/// rollback is queued before the next user's statements). What the pings
/// would catch — a connection whose worker thread died — [`Store::ping`]
/// (`/health`) checks every connection for, and reopens.
#[derive(Clone, Debug)]
pub struct Store {
    /// `None` once closed.
    writer: Arc<Mutex<Option<SqliteConnection>>>,
    readers: Arc<[Mutex<Option<SqliteConnection>>]>,
    next_reader: Arc<AtomicUsize>,
    /// How to open the writer and a reader again.
    options: Arc<(SqliteConnectOptions, SqliteConnectOptions)>,
}

/// A connection held for one statement or transaction.
type Held<'a> = MappedMutexGuard<'a, SqliteConnection>;

fn held(guard: MutexGuard<'_, Option<SqliteConnection>>) -> Result<Held<'_>> {
    MutexGuard::try_map(guard, Option::as_mut).map_err(|_| StoreError::Closed)
}

/// Tuning knobs for [`Store::open`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Readers in the read pool.
    pub read_connections: u32,
    /// How long a writer waits for another process's lock.
    pub busy_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            read_connections: 4,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

impl Store {
    /// Opens (creating if needed) the database at `url` (`sqlite:PATH` or
    /// `sqlite://PATH`) and applies pending migrations.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self> {
        if !url.starts_with("sqlite:") {
            return Err(StoreError::UnsupportedUrl(url.to_owned()));
        }
        let base = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // NORMAL in WAL mode survives a process crash (what "never lose
            // an order" is about for a server process); only an OS crash can
            // lose the last commits.
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(options.busy_timeout);
        let mut writer = base.connect().await?;
        SQLITE_MIGRATIONS.run(&mut writer).await?;
        let read_only = base.clone().read_only(true);
        let mut readers = Vec::new();
        for _ in 0..options.read_connections.max(1) {
            readers.push(Mutex::new(Some(read_only.connect().await?)));
        }
        Ok(Self {
            writer: Arc::new(Mutex::new(Some(writer))),
            readers: readers.into(),
            next_reader: Arc::new(AtomicUsize::new(0)),
            options: Arc::new((base, read_only)),
        })
    }

    /// The writer connection, once the statements queued before are done.
    async fn writer(&self) -> Result<Held<'_>> {
        held(self.writer.lock().await)
    }

    /// An idle read connection if there is one, else the next in turn.
    async fn reader(&self) -> Result<Held<'_>> {
        let start = self.next_reader.fetch_add(1, Ordering::Relaxed);
        let n = self.readers.len();
        for i in 0..n {
            if let Ok(conn) = self.readers[(start + i) % n].try_lock() {
                return held(conn);
            }
        }
        held(self.readers[start % n].lock().await)
    }

    /// Closes every connection once its statements are done; the store
    /// answers [`StoreError::Closed`] from then on.
    pub async fn close(&self) {
        for slot in self.readers.iter().chain(std::iter::once(&*self.writer)) {
            if let Some(conn) = slot.lock().await.take() {
                let _ = conn.close().await;
            }
        }
    }

    /// (connections, open, of which idle) for the writer and the readers.
    pub fn pool_stats(&self) -> [(&'static str, u32, u32); 2] {
        let idle_readers = self.readers.iter().filter(|r| r.try_lock().is_ok()).count();
        [
            ("writer", 1, u32::from(self.writer.try_lock().is_ok())),
            ("reader", self.readers.len() as u32, idle_readers as u32),
        ]
    }

    /// The liveness probe of `/health`: every connection answers a ping
    /// (waiting for its turn), and one that does not (its worker thread
    /// is gone) is opened again. Fails if the writer or a reader cannot be.
    pub async fn ping(&self) -> Result<()> {
        let (write, read) = &*self.options;
        let slots = std::iter::once((&*self.writer, write))
            .chain(self.readers.iter().map(|slot| (slot, read)));
        for (slot, options) in slots {
            let mut guard = slot.lock().await;
            let Some(conn) = guard.as_mut() else {
                return Err(StoreError::Closed);
            };
            if let Err(e) = conn.ping().await {
                tracing::warn!(event = "store.reconnect", error = %e, "a database connection stopped answering; opening it again");
                *guard = Some(options.connect().await?);
            }
        }
        Ok(())
    }
}

fn json_vec(s: &str) -> Result<Vec<String>> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("JSON list: {e}")))
}

fn to_json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    // Serialising strings and vectors of strings cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| "[]".to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn every_connection_answers_the_health_ping_and_a_closed_store_refuses_work() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("t.db").display());
        let store = Store::open(&url, &StoreOptions::default()).await.unwrap();
        store.ping().await.unwrap();
        store.insert_nonce("n", 10).await.unwrap();
        assert_eq!(store.nonce_count().await.unwrap(), 1);
        store.close().await;
        assert!(matches!(store.ping().await, Err(StoreError::Closed)));
        assert!(matches!(
            store.insert_nonce("m", 10).await,
            Err(StoreError::Closed)
        ));
        assert!(matches!(store.nonce_count().await, Err(StoreError::Closed)));
    }
}
