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
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

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
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Handle to the database. Cheap to clone.
///
/// SQLite allows one writer at a time; all writes go through a pool of one
/// connection so that concurrent requests queue in-process instead of
/// colliding in `SQLITE_BUSY` retries, while reads use a separate pool and
/// see the last committed state (WAL).
#[derive(Clone, Debug)]
pub struct Store {
    writer: SqlitePool,
    reader: SqlitePool,
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
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .connect_with(base.clone())
            .await?;
        SQLITE_MIGRATIONS.run(&writer).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(options.read_connections.max(1))
            .connect_with(base.read_only(true))
            .await?;
        Ok(Self { writer, reader })
    }

    /// Closes both pools, waiting for in-flight statements.
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }

    /// (pool, connections open, of which idle) for each pool.
    pub fn pool_stats(&self) -> [(&'static str, u32, u32); 2] {
        [
            ("writer", self.writer.size(), self.writer.num_idle() as u32),
            ("reader", self.reader.size(), self.reader.num_idle() as u32),
        ]
    }

    /// A cheap liveness probe for `/health`.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
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
