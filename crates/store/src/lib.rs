//! acme-proxy's storage crate: the only code in the workspace that speaks SQL.
//!
//! It owns the schema (embedded, append-only migrations per backend), typed
//! rows, and every multi-row change as one transaction. Status transitions
//! are *guarded* statements (`UPDATE … WHERE status = 'ready'`) whose row
//! count tells the caller whether it won a race; nonce consumption is one
//! `INSERT` (on PostgreSQL shared by the uses that arrive together) whose
//! rows say whether the nonce was fresh.
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
mod breakers;
mod certificates;
mod copy;
mod db;
mod dns;
mod eab;
mod jobs;
mod nonces;
mod operators;
mod orders;
#[cfg(test)]
mod pg_functions;
mod pg_pool;
mod rate_limits;
mod relay;
mod slot;
#[cfg(test)]
pub(crate) mod test_support;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection as _};

use db::Conn;
use slot::Slot;

pub use accounts::{AccountGuard, AccountRow, AccountSearch, KeyChangeOutcome, NewAccountRow};
pub use admin::{Blocker, DeleteOutcome};
pub use audit::{
    AuditEvent, AuditFilter, AuditOrigin, AuditOutcome, AuditRow, DayCount, NewAuditRow,
};
pub use breakers::{BreakerFailure, BreakerRow, BreakerState};
pub use certificates::{
    CertificateRow, CrlRow, NewCertificateRow, RevokeOutcome, RevokedEntry, RevokedList,
};
pub use copy::TableCopy;
pub use dns::{DnsAccountRow, DnsRecordRow, NewDnsAccount};
pub use eab::{EabRow, NewEab};
pub use jobs::{Attempts, Enqueued, JobCounts, JobRow, JobStatus, JobWakeups, NewJob};
pub use nonces::USED_NONCE_GRACE;
pub use operators::{
    NewOperatorSession, OperatorRow, OperatorSessionRow, OperatorTokenRow, SessionStage,
};
pub use orders::{
    AuthorizationRow, ChallengeRow, InsertOrder, NewAuthorization, NewChallenge, NewOrderRow,
    OrderAuthorizations, OrderRow, OrderSearch, ProcessingChallenge,
};
pub use rate_limits::{RateLimitKey, RateLimitRow, RateLimitTake};
pub use relay::{NewUpstreamOrder, UpstreamAccountRow, UpstreamOrderRow};

/// Errors from the store. A caller maps them to `serverInternal`, the detail
/// being for logs only — except [`StoreError::AccountChanged`], a refusal of
/// the request.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("cannot open or migrate the database: {0}")]
    Open(#[from] sqlx::Error),
    #[error("database error: {0}")]
    Pg(#[source] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
    /// A TEXT column of a closed set (a status, a type) holds a value no
    /// member of the set spells: a row written by something newer or
    /// broken. Refused, never read as some default.
    #[error("column {column} holds {value:?}, which is not one of its values")]
    UnknownValue { column: &'static str, value: String },
    #[error(
        "unsupported database URL {0:?}: write sqlite:PATH (a file) or postgres://USER@HOST/DATABASE"
    )]
    UnsupportedUrl(String),
    #[error("the store is closed")]
    Closed,
    /// The error of a statement written for several callers at once (nonce
    /// uses that arrived together): each of them gets it.
    #[error(transparent)]
    Shared(Arc<StoreError>),
    /// Something only the other engine can do.
    #[error("{0}")]
    NotOnThisEngine(&'static str),
    #[error("cannot make the database file {0} private: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("cannot start the WAL checkpointer thread: {0}")]
    Checkpointer(#[source] std::io::Error),
    /// An [`AccountGuard`] found the account deactivated, deleted or with
    /// another key when the write began; nothing was written.
    #[error("the account is no longer valid with the key that signed this request")]
    AccountChanged,
    /// The replay nonce of the request this task serves (RFC 8555 §6.5)
    /// was used before: found by the statement that carried it, or by its
    /// record written ahead of a statement that did not. Nothing the
    /// statement would have done was written (see [`Store::spending_nonce`]).
    #[error("the replay nonce was used before")]
    NonceReplayed,
    /// The SQLite file this store opened is no longer at its path (removed,
    /// moved or replaced): nothing more is written to it, since a write
    /// would be lost with the unlinked file.
    #[error(
        "the database file {0} was removed, moved or replaced while the server had it open; nothing is written until it is back: move it back, or stop the server, restore the file and start again"
    )]
    FileGone(PathBuf),
}

impl StoreError {
    /// A `UNIQUE` constraint refused the write (someone else's row won).
    pub(crate) fn is_unique_violation(&self) -> bool {
        match self {
            StoreError::Shared(e) => e.is_unique_violation(),
            StoreError::Db(rusqlite::Error::SqliteFailure(e, _)) => {
                e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            }
            StoreError::Pg(sqlx::Error::Database(e)) => e.is_unique_violation(),
            _ => false,
        }
    }

    /// The database cannot be reached or is not taking work right now (a
    /// PostgreSQL server down, restarting or out of connections; a SQLite
    /// file another process keeps locked past `busy_timeout`): a request
    /// may be retried later, and nothing was written.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Shared(e) => e.is_unavailable(),
            StoreError::Pg(e) | StoreError::Open(e) => match e {
                sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::WorkerCrashed => true,
                // Connection exceptions (class 08), the server shutting
                // down or starting (57P01-57P03), too many connections.
                sqlx::Error::Database(e) => e.code().is_some_and(|code| {
                    code.starts_with("08")
                        || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300")
                }),
                _ => false,
            },
            // Busy or locked past busy_timeout by another process; the
            // disk full (SQLite rolls the transaction back whole); the file
            // or its directory not writable.
            StoreError::Db(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy
                    | rusqlite::ErrorCode::DatabaseLocked
                    | rusqlite::ErrorCode::DiskFull
                    | rusqlite::ErrorCode::ReadOnly
            ),
            StoreError::FileGone(_) => true,
            _ => false,
        }
    }

    /// A `UNIQUE` index refused the write: the one on `column` (as SQLite
    /// names it in its message), whose name is `index` (as PostgreSQL
    /// reports it).
    pub(crate) fn is_unique_violation_of(&self, column: &str, index: &str) -> bool {
        self.is_unique_violation()
            && match self {
                StoreError::Shared(e) => e.is_unique_violation_of(column, index),
                StoreError::Db(rusqlite::Error::SqliteFailure(_, Some(message))) => {
                    message.contains(column)
                }
                StoreError::Pg(sqlx::Error::Database(e)) => e.constraint() == Some(index),
                _ => false,
            }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Handle to the database. Cheap to clone.
///
/// SQLite allows one writer at a time; all writes go through one connection
/// (each connection sits in a `Slot`, slot.rs) so that concurrent requests
/// queue in-process instead of colliding in `SQLITE_BUSY` retries. The
/// reads by key that requests make run on that writer too
/// ([`Store::point_reader`]); scans and listings use a few read-only
/// connections. Every read sees the last committed state (WAL).
///
/// Statements run on the calling task's thread (rusqlite), each prepared
/// once per connection and cached. A statement on a local file takes
/// microseconds — less than handing it to another thread and back, which is
/// what sqlx's SQLite driver does for every statement and which measured at
/// 40 % of the server's CPU (docs/performance.md). A statement has run
/// when its await is reached, so nothing waits while a connection is in
/// use (db.rs). On PostgreSQL the same operations run on a sqlx pool.
/// Migrations still run through `sqlx::migrate!` when the
/// store opens. A thread of the store's own checkpoints the WAL (see
/// [`spawn_checkpointer`]).
#[derive(Clone, Debug)]
pub struct Store {
    backend: Backend,
    /// Marked on every audit row this store writes.
    audit_origin: AuditOrigin,
}

/// The engine a store is on.
#[derive(Clone, Debug)]
enum Backend {
    Sqlite(SqliteDb),
    Postgres(PgDb),
}

/// A PostgreSQL database's connections.
#[derive(Clone, Debug)]
struct PgDb {
    /// Where the store's operations run (see `pg_pool.rs`).
    pool: pg_pool::PgPool,
    /// sqlx's pool of one, for what needs a sqlx pool: migrations, the
    /// job runner's `LISTEN` (which keeps its connection) and `db copy`.
    sqlx: sqlx::PgPool,
    /// Nonce uses waiting to be written, and whether a task writes them.
    nonces: Arc<nonces::NonceWrites>,
}

/// A SQLite file's connections.
#[derive(Clone, Debug)]
struct SqliteDb {
    /// `None` once closed.
    writer: Arc<Slot>,
    /// The file the writer opened, checked before every write; `None` for
    /// a read-only store.
    file: Option<Arc<FileIdentity>>,
    readers: Arc<[Slot]>,
    next_reader: Arc<AtomicUsize>,
    /// Dropping the sender (with the last clone, or in [`Store::close`],
    /// which then waits for the thread) stops the checkpointer thread.
    checkpointer: Arc<std::sync::Mutex<Option<Checkpointer>>>,
}

/// Tuning knobs for [`Store::open`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// SQLite: readers in the read pool.
    pub read_connections: u32,
    /// SQLite: how long a writer waits for another process's lock.
    pub busy_timeout: Duration,
    /// PostgreSQL: connections in the pool
    /// ([`default_max_connections`] unless set).
    pub max_connections: u32,
    /// PostgreSQL: how long a statement waits for a connection (the pool's
    /// or a new one) before it fails, so that an unreachable server is
    /// answered in seconds.
    pub acquire_timeout: Duration,
    /// PostgreSQL: the password, when it is not in the URL.
    pub password: Option<String>,
    /// Who the audit rows written through this store come from.
    pub audit_origin: AuditOrigin,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            read_connections: 4,
            busy_timeout: Duration::from_secs(5),
            max_connections: default_max_connections(),
            acquire_timeout: Duration::from_secs(5),
            password: None,
            audit_origin: AuditOrigin::Server,
        }
    }
}

/// PostgreSQL connections kept at most unless configured: twice this
/// host's cores and two more, from 4 to 16.
///
/// Why: each connection is a server process of PostgreSQL's, and more
/// statements in flight than the database has cores only make those
/// processes take turns, each with caches of its own to warm. With the
/// database on this machine's two cores, at concurrency 16 a pool of 16
/// cost PostgreSQL 10 % more CPU per issuance than one of 6, and 5 % of
/// the issuances per second (15 % and 8 % at 64); 4 lost 3.5 % to
/// requests waiting for a connection (docs/performance.md). This host's
/// cores stand in for the database's, which it cannot see: an operator
/// whose database has more sets `database_max_connections`.
pub fn default_max_connections() -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    u32::try_from(2 * cores + 2)
        .unwrap_or(u32::MAX)
        .clamp(4, 16)
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// PostgreSQL's schema starts at SQLite's 0008 (one baseline file); from
/// then on one version is one schema on either engine. sqlx runs them
/// under an advisory lock, so replicas starting together migrate once.
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The file of a `sqlite:` URL; None for any other, and for an in-memory
/// database.
pub fn sqlite_file(url: &str) -> Option<PathBuf> {
    if !url.starts_with("sqlite:") || url.contains(":memory:") || url.contains("mode=memory") {
        return None;
    }
    SqliteConnectOptions::from_str(url)
        .ok()
        .map(|o| o.get_filename().to_path_buf())
}

/// Whether `url` names a PostgreSQL database.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The page size of a database file this store creates: 1 KiB, not
/// SQLite's 4 KiB. A commit writes every page it changed whole into the
/// WAL (a frame each), and the checkpointer copies it again into the
/// file; an issuance changes some thirty pages across the b-trees of its
/// rows and their indexes (docs/performance.md), each by a few dozen
/// octets. Smaller pages make each of those writes, copies and checksums
/// a quarter of the size: measured 2.47 → 2.37 ms of server CPU per
/// issuance and 522 → 571 issuances/s (paired runs; 2 KiB was between,
/// 512 B no better than 1 KiB). The trees are a level or two deeper, and
/// a certificate's PEM spills onto overflow pages; both cost less than
/// they save. An existing file keeps the page size it was made with
/// (SQLite only changes it by rebuilding the file, which WAL mode
/// forbids).
const PAGE_SIZE: u32 = 1024;

/// Statements each connection keeps prepared: every statement of the
/// store fits, so none is ever prepared twice.
const STATEMENT_CACHE: usize = 256;

/// How often the checkpointer thread copies committed pages from the WAL
/// into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);

/// WAL pages past which the checkpointer, once it has copied the WAL,
/// copies what was committed meanwhile with the writer held, so that the
/// next commit starts the WAL over (see [`spawn_checkpointer`]).
///
/// Each start-over costs the writer two short waits: the catch-up holds
/// it through a copy and two syncs, and the commit that starts the WAL
/// over syncs the WAL's new header itself (SQLite does, so that a write
/// reordered after a crash cannot mix two generations of frames), on a
/// runtime thread with the writer held. At 1,000 pages that was every
/// 26 issuances at full load, every request that needed the writer
/// waited each time, and a tenth of the two cores sat idle at concurrency
/// 16 (~7 % since); at 10,000 it is every ~260. The WAL file
/// then keeps some 10 MB between start-overs (with 1 KiB pages), and a
/// checkpoint pass still runs every [`CHECKPOINT_EVERY`], so how much a
/// power loss can take does not change.
const CATCH_UP_PAGES: i64 = 10_000;

/// WAL pages past which the writer checkpoints by itself, inside a commit
/// (SQLite's default is 1,000): only a fallback for when the checkpointer
/// cannot keep up or fails, since that checkpoint holds the writer and a
/// runtime thread for as long as its copying and syncing take.
const WRITER_CHECKPOINT_PAGES: i64 = 20_000;

/// The checkpointer thread: the sender that keeps it running and the
/// handle to wait for it.
#[derive(Debug)]
struct Checkpointer {
    running: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Store {
    /// Opens (creating if needed) the database at `url` (`sqlite:PATH` or
    /// `sqlite://PATH`) and applies pending migrations.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self> {
        if is_postgres_url(url) {
            let db = postgres_db(url, options, false).await?;
            POSTGRES_MIGRATIONS.run(&db.sqlx).await?;
            return Ok(Self {
                backend: Backend::Postgres(db),
                audit_origin: options.audit_origin,
            });
        }
        if !url.starts_with("sqlite:") {
            return Err(StoreError::UnsupportedUrl(url.to_owned()));
        }
        let migrate = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            // Takes effect only for a file created here (see PAGE_SIZE).
            .page_size(PAGE_SIZE)
            // WAL is a property of the file: set once here, kept by every
            // connection opened after.
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(options.busy_timeout);
        let path = migrate.get_filename().to_path_buf();
        if url.contains(":memory:") || url.contains("mode=memory") {
            // Every connection would open a database of its own.
            return Err(StoreError::UnsupportedUrl(url.to_owned()));
        }
        let mut conn = migrate.connect().await?;
        carry_over_reworded_migrations(&mut conn).await?;
        SQLITE_MIGRATIONS.run(&mut conn).await?;
        conn.close().await?;
        // Before the connections that write rows open: the WAL and shared
        // memory files they create take the database file's mode.
        restrict_to_owner(&path)?;

        let writer = open_connection(&path, false, options.busy_timeout)?;
        let file = FileIdentity::of(&path)?;
        writer.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)?;
        let writer = Arc::new(Slot::new(writer));
        let checkpointer = spawn_checkpointer(
            open_connection(&path, false, options.busy_timeout)?,
            Arc::clone(&writer),
        )?;
        let mut readers = Vec::new();
        for _ in 0..options.read_connections.max(1) {
            readers.push(Slot::new(open_connection(
                &path,
                true,
                options.busy_timeout,
            )?));
        }
        Ok(Self {
            backend: Backend::Sqlite(SqliteDb {
                writer,
                file: Some(Arc::new(file)),
                readers: readers.into(),
                next_reader: Arc::new(AtomicUsize::new(0)),
                checkpointer: Arc::new(std::sync::Mutex::new(Some(checkpointer))),
            }),
            audit_origin: options.audit_origin,
        })
    }

    /// Opens an existing database without the right to change it, for a
    /// dry run of start-up (`config check`): no migration, no checkpointer,
    /// every connection read-only, so a write fails. `Ok(None)` when the
    /// database does not exist yet (start-up would create it empty).
    pub async fn open_read_only(url: &str, options: &StoreOptions) -> Result<Option<Self>> {
        if is_postgres_url(url) {
            let db = postgres_db(url, options, true).await?;
            let migrated: Option<String> =
                sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
                    .fetch_one(&db.sqlx)
                    .await?;
            return Ok(migrated.map(|_| Self {
                backend: Backend::Postgres(db),
                audit_origin: options.audit_origin,
            }));
        }
        if !url.starts_with("sqlite:") || url.contains(":memory:") || url.contains("mode=memory") {
            return Err(StoreError::UnsupportedUrl(url.to_owned()));
        }
        let path = SqliteConnectOptions::from_str(url)?
            .get_filename()
            .to_path_buf();
        if !path.exists() {
            return Ok(None);
        }
        let open = || -> Result<Connection> {
            // A read-only connection to a WAL database creates its -wal and
            // -shm files when they are missing (no server has it open):
            // then open it immutable, which reads the file alone.
            if wal_path(&path).exists() {
                return open_connection(&path, true, options.busy_timeout);
            }
            let uri = format!("file:{}?immutable=1", uri_path(&path));
            let conn = Connection::open_with_flags(
                uri,
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_URI
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            Ok(conn)
        };
        let writer = Arc::new(Slot::new(open()?));
        let readers = vec![Slot::new(open()?)];
        Ok(Some(Self {
            backend: Backend::Sqlite(SqliteDb {
                writer,
                file: None,
                readers: readers.into(),
                next_reader: Arc::new(AtomicUsize::new(0)),
                checkpointer: Arc::new(std::sync::Mutex::new(None)),
            }),
            audit_origin: options.audit_origin,
        }))
    }

    /// The sqlx pool, on PostgreSQL: for `LISTEN` and `db copy`.
    fn postgres_pool(&self) -> Option<&sqlx::PgPool> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(db) => Some(&db.sqlx),
        }
    }

    /// Copies a SQLite database into the new file `dest` (owner-only),
    /// with SQLite's online backup: one consistent snapshot, taken while
    /// the server goes on serving (its writes wait for none of it).
    /// PostgreSQL is backed up with its own tools (`pg_dump`).
    pub async fn backup_to(&self, dest: &Path) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let Backend::Sqlite(db) = &self.backend else {
            return Err(StoreError::NotOnThisEngine(
                "a PostgreSQL database is backed up with pg_dump (see the backups page)",
            ));
        };
        // Made here, owner-only, so that no moment finds the copy (which
        // holds the EAB keys) readable by others; refused if it exists.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dest)
            .map_err(|e| StoreError::Io(dest.to_owned(), e))?;
        let mut copy = Connection::open(dest)?;
        let source = db.readers[0].lock().await?;
        // Every page in one step: one read transaction, one snapshot.
        let backup = rusqlite::backup::Backup::new(&source, &mut copy)?;
        if backup.step(-1)? != rusqlite::backup::StepResult::Done {
            // Busy or locked by another process: to be tried again.
            return Err(StoreError::Db(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                Some("the database was busy during the backup; try again".into()),
            )));
        }
        drop(backup);
        drop(source);
        copy.close().map_err(|(_, e)| StoreError::Db(e))?;
        Ok(())
    }

    /// Whether the database is PostgreSQL (shared by replicas) rather than
    /// a SQLite file.
    pub fn is_postgres(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// The SQLite file's connections, for tests that look inside.
    #[cfg(test)]
    fn sqlite(&self) -> &SqliteDb {
        match &self.backend {
            Backend::Sqlite(db) => db,
            Backend::Postgres(_) => panic!("a SQLite store was expected"),
        }
    }

    /// The writer connection, once it is free (see [`Slot`]).
    async fn writer(&self) -> Result<Conn<'_>> {
        match &self.backend {
            Backend::Sqlite(db) => {
                let conn = db.writer.lock().await?;
                // With the writer held: the file cannot go between this
                // check and the write but by a rename or unlink racing it.
                if let Some(file) = &db.file {
                    file.check()?;
                }
                Ok(Conn::Sqlite(conn))
            }
            Backend::Postgres(db) => {
                self.spend_due_nonce().await?;
                pooled(&db.pool).await
            }
        }
    }

    /// [`Store::writer`] for a request's write that is one statement: on
    /// PostgreSQL its statement carries the request's nonce, when one is
    /// due ([`Store::spending_nonce`]).
    async fn carrying_writer(&self) -> Result<Conn<'_>> {
        match &self.backend {
            Backend::Postgres(db) => carrying(&db.pool, nonces::Carry::Write).await,
            Backend::Sqlite(_) => self.writer().await,
        }
    }

    /// [`Store::point_reader`] for a request's read that is one statement:
    /// on PostgreSQL its statement carries the request's nonce, when one is
    /// due ([`Store::spending_nonce`]).
    async fn carrying_point_reader(&self) -> Result<Conn<'_>> {
        match &self.backend {
            Backend::Postgres(db) => carrying(&db.pool, nonces::Carry::Read).await,
            Backend::Sqlite(_) => self.point_reader().await,
        }
    }

    /// The connection for the reads of a few rows by key that requests
    /// make on every issuance (an account, an order, an authorization with
    /// its challenges, a challenge with its authorization, a certificate):
    /// the writer's. In WAL mode a connection throws its whole page cache
    /// away when it starts a read after another connection committed, so
    /// under steady writes a read-only connection read every page of its
    /// lookup again from the file (41 `pread`s per issuance, 12 since); the
    /// writer's cache survives its own commits. Such a read waits while a
    /// write holds the writer, tens of microseconds each (longer behind the
    /// checkpointer's catch-up, which holds the writer through two syncs).
    /// Scans and listings keep to the read pool ([`Store::reader`]), so
    /// that none holds the writer.
    async fn point_reader(&self) -> Result<Conn<'_>> {
        let db = match &self.backend {
            Backend::Sqlite(db) => db,
            Backend::Postgres(db) => {
                self.spend_due_nonce().await?;
                return pooled(&db.pool).await;
            }
        };
        let conn = db.writer.lock().await?;
        // A transaction left open (a failed ROLLBACK) would show this read
        // rows that were never committed; the next write's `begin` ends it
        // the same way.
        if !conn.is_autocommit() {
            conn.prepare_cached("ROLLBACK")?.execute([])?;
        }
        Ok(Conn::Sqlite(conn))
    }

    /// An idle read connection if there is one, else the next in turn.
    async fn reader(&self) -> Result<Conn<'_>> {
        let db = match &self.backend {
            Backend::Sqlite(db) => db,
            Backend::Postgres(db) => {
                self.spend_due_nonce().await?;
                return pooled(&db.pool).await;
            }
        };
        let start = db.next_reader.fetch_add(1, Ordering::Relaxed);
        let n = db.readers.len();
        for i in 0..n {
            if let Some(conn) = db.readers[(start + i) % n].try_lock() {
                return Ok(Conn::Sqlite(conn?));
            }
        }
        Ok(Conn::Sqlite(db.readers[start % n].lock().await?))
    }

    /// Closes every connection once its statements are done; the store
    /// answers [`StoreError::Closed`] from then on.
    pub async fn close(&self) {
        let db = match &self.backend {
            Backend::Sqlite(db) => db,
            Backend::Postgres(db) => {
                db.pool.close().await;
                db.sqlx.close().await;
                return;
            }
        };
        let checkpointer = db
            .checkpointer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(Checkpointer { running, thread }) = checkpointer {
            // Its connection closed before the writer's, the writer is the
            // last connection: its close checkpoints what is left and
            // removes the WAL, leaving one self-contained file.
            drop(running);
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        for slot in db.readers.iter().chain(std::iter::once(&*db.writer)) {
            if let Some(conn) = slot.take().await {
                let _ = conn.close();
            }
        }
    }

    /// (pool, connections open, of which idle): SQLite's writer and
    /// readers, or PostgreSQL's one pool.
    pub fn pool_stats(&self) -> Vec<(&'static str, u32, u32)> {
        match &self.backend {
            Backend::Sqlite(db) => {
                let idle_readers = db.readers.iter().filter(|r| r.is_idle()).count();
                vec![
                    ("writer", 1, u32::from(db.writer.is_idle())),
                    ("reader", db.readers.len() as u32, idle_readers as u32),
                ]
            }
            Backend::Postgres(db) => {
                let (open, idle) = db.pool.stats();
                vec![("pool", open, idle)]
            }
        }
    }

    /// The liveness probe of `/health`: every connection (waiting for its
    /// turn) reads the schema version from the file.
    pub async fn ping(&self) -> Result<()> {
        let db = match &self.backend {
            Backend::Sqlite(db) => db,
            Backend::Postgres(db) => {
                return pooled(&db.pool)
                    .await?
                    .exec("SELECT 1", &[])
                    .await
                    .map(|_| ());
            }
        };
        for slot in std::iter::once(&*db.writer).chain(db.readers.iter()) {
            let conn = slot.lock().await?;
            conn.query_row("PRAGMA schema_version", [], |_| Ok(()))?;
        }
        Ok(())
    }
}

/// A connection of the PostgreSQL pool.
async fn pooled(pool: &pg_pool::PgPool) -> Result<Conn<'static>> {
    Ok(Conn::Postgres(pool.get().await?, None))
}

/// A connection of the PostgreSQL pool whose next statement carries the
/// nonce due in this task, if any.
async fn carrying(pool: &pg_pool::PgPool, carry: nonces::Carry) -> Result<Conn<'static>> {
    Ok(Conn::Postgres(pool.get().await?, Some(carry)))
}

/// The pools of a PostgreSQL store; `read_only` for a dry run of
/// start-up, whose every transaction refuses writes. TLS, the password
/// and the rest come from the URL (`sslmode`, `sslrootcert`, …).
/// `max_connections` bounds both together: sqlx's pool has one, the
/// operations' pool the rest (at least one; the configuration asks for two
/// in all).
async fn postgres_db(url: &str, options: &StoreOptions, read_only: bool) -> Result<PgDb> {
    // Every statement at trace level (target `sqlx::query`), so that
    // `RUST_LOG=debug` is the server's story, not its SQL; slow ones stay
    // warnings.
    let mut connect = sqlx::postgres::PgConnectOptions::from_str(url)?
        .application_name("acme-proxy")
        .statement_cache_capacity(STATEMENT_CACHE)
        .log_statements(log::LevelFilter::Trace);
    if read_only {
        connect = connect.options([("default_transaction_read_only", "on")]);
    }
    if let Some(password) = &options.password {
        connect = connect.password(password);
    }
    let sqlx = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(options.acquire_timeout)
        .connect_with(connect.clone())
        .await?;
    let pool = pg_pool::PgPool::new(
        connect,
        options.max_connections.saturating_sub(1).max(1),
        options.acquire_timeout,
    )?;
    Ok(PgDb {
        pool,
        sqlx,
        nonces: Arc::default(),
    })
}

/// Migrations whose comments were reworded after release, with the
/// checksum (SHA-384 of the file, upper-case hex) they were applied with.
/// Their statements are unchanged.
const REWORDED_MIGRATIONS: &[(i64, &str)] = &[
    (
        2,
        "FB4ED7977CD187A6128BF82B2395DCF2C405BEC4F88E9342696E3F7BDC605D8CD6937A490A4FC7DA71AA7BF10338B805",
    ),
    (
        3,
        "E412DBA357302859508423F931DB54F4CDD29D7F5611DE5F952ACC7523C00446E0649B62BC6714589F8DFF5A81F46C94",
    ),
];

/// sqlx refuses to start on a database whose applied migration's
/// checksum differs from the file's: for [`REWORDED_MIGRATIONS`] applied
/// with their old text, the recorded checksum becomes the new file's.
/// Any other difference still stops start-up, as it should.
async fn carry_over_reworded_migrations(conn: &mut sqlx::SqliteConnection) -> Result<()> {
    let recorded: Option<(String,)> = sqlx::query_as(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_optional(&mut *conn)
    .await?;
    if recorded.is_none() {
        return Ok(());
    }
    for (version, old) in REWORDED_MIGRATIONS {
        let Some(now) = SQLITE_MIGRATIONS.iter().find(|m| m.version == *version) else {
            continue;
        };
        sqlx::query(
            "UPDATE _sqlx_migrations SET checksum = ?1 WHERE version = ?2 AND hex(checksum) = ?3",
        )
        .bind(now.checksum.as_ref())
        .bind(version)
        .bind(old)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Makes the database file, and its WAL and shared-memory files if they
/// are there, readable by the owner only: the file holds the EAB MAC keys.
/// SQLite creates it 0644 less the umask (and resets an empty file it is
/// handed to that), and gives the WAL and shared-memory files it creates
/// later the database file's mode. Done once the schema is in, before any
/// row is written.
/// Which file a SQLite store opened (device and inode). In WAL mode
/// SQLite goes on writing to a database file that was unlinked or renamed
/// under it, and all of that is gone at the next start: a write is
/// refused instead once the path no longer names this file, and allowed
/// again if it is moved back. A `stat` costs about a microsecond, next to
/// tens for the smallest write transaction.
#[derive(Debug)]
struct FileIdentity {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl FileIdentity {
    fn of(path: &Path) -> Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|e| StoreError::Io(path.to_owned(), e))?;
        Ok(Self {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    fn check(&self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(&self.path) {
            Ok(meta) if meta.dev() == self.dev && meta.ino() == self.ino => Ok(()),
            _ => Err(StoreError::FileGone(self.path.clone())),
        }
    }
}

fn restrict_to_owner(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        let Ok(meta) = std::fs::metadata(&file) else {
            continue;
        };
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| StoreError::Io(file.clone(), e))?;
        }
    }
    Ok(())
}

/// One connection to the database file, tuned as every connection must be
/// (these settings are per connection in SQLite).
/// The WAL file beside the database at `path`.
fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// `path` for a `file:` URI: every octet but unreserved ones and `/`
/// percent-encoded (RFC 3986 §2.1), so `?`, `#` and `%` stay in the path.
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn open_connection(path: &Path, read_only: bool, busy_timeout: Duration) -> Result<Connection> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
    } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(busy_timeout)?;
    // NORMAL in WAL mode survives a process crash (what "never lose an
    // order" is about for a server process); only an OS crash can lose the
    // last commits.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Starts the thread that, every [`CHECKPOINT_EVERY`] in which another
/// connection committed, copies the WAL's pages into the database file,
/// until the returned sender is dropped.
///
/// A checkpoint writes pages into the database file and, with
/// `synchronous = NORMAL`, syncs both files (the WAL first, so an OS crash
/// mid-checkpoint loses nothing committed and cannot corrupt the file):
/// milliseconds on a real disk, tens of them when the pages are many and
/// scattered. Left to SQLite it runs inside whichever commit crosses 1,000
/// WAL pages, holding the writer — and, since statements run on the
/// runtime's threads, one of those — for that long; every request behind it
/// waits. On its own thread and connection, a `PASSIVE` checkpoint blocks
/// neither the writer nor the readers.
///
/// But the WAL only starts over from its beginning when a writer finds
/// every frame already copied, and under steady writes some commit always
/// lands while a checkpoint copies and syncs: the WAL would grow until the
/// writer's own fallback checkpoint ([`WRITER_CHECKPOINT_PAGES`]) — a
/// stall of ten milliseconds or more about once a second at full load.
/// So
/// once the WAL holds [`CATCH_UP_PAGES`], the thread holds the store's
/// writer (blocking its own thread, never a runtime's, until the writer
/// is free) and checkpoints again: only the frames committed during the
/// first pass are left, a few dozen pages and two short syncs, and the
/// next commit starts the WAL over. (A read transaction that outlives a
/// checkpoint keeps the WAL from starting over; until it ends, each
/// interval repeats the catch-up, which then has nothing to copy.)
fn spawn_checkpointer(conn: Connection, writer: Arc<Slot>) -> Result<Checkpointer> {
    let (running, stopped) = mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("sqlite-ckpt".into())
        .spawn(move || {
            let mut seen = None;
            let mut failing = false;
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY)
            {
                // `data_version` moves when another connection commits:
                // an idle store does no checkpoint work.
                let checkpoint = conn.query_row("PRAGMA data_version", [], |row| row.get::<_, i64>(0))
                    .map_err(StoreError::from)
                    .map(|version| seen.replace(version) != Some(version))
                    .and_then(|committed| {
                        if committed
                            && checkpoint_passive(&conn)? >= CATCH_UP_PAGES
                            && let Ok(_held) = writer.blocking_lock()
                        {
                            checkpoint_passive(&conn)?;
                        }
                        Ok(())
                    });
                // Said once when it starts failing and once when it recovers,
                // not twenty times a second (a full disk must not also
                // fill the log).
                match checkpoint {
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(event = "store.checkpoint_failed", error = %e, "checkpointing the WAL failed; the writer checkpoints past its limit until this recovers");
                    }
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!(event = "store.checkpoint_recovered", "checkpointing the WAL works again");
                    }
                    _ => {}
                }
            }
        })
        .map_err(StoreError::Checkpointer)?;
    Ok(Checkpointer { running, thread })
}

/// A `PASSIVE` checkpoint; the frames in the WAL when it ran.
fn checkpoint_passive(conn: &Connection) -> Result<i64> {
    // The row is (busy, frames in the WAL, frames copied).
    Ok(conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))?)
}

/// `text`, read from `column`, as the closed set's member it names.
pub(crate) fn parse_text<T: FromStr>(text: &str, column: &'static str) -> Result<T> {
    text.parse().map_err(|_| StoreError::UnknownValue {
        column,
        value: text.to_owned(),
    })
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
    use crate::test_support::{ACCOUNT, TestDb, issued_row, open_in};

    #[test]
    fn the_default_pool_is_twice_the_hosts_cores_and_two_from_4_to_16() {
        let cores = u32::try_from(std::thread::available_parallelism().unwrap().get()).unwrap();
        let pool = StoreOptions::default().max_connections;
        assert_eq!(pool, (2 * cores + 2).clamp(4, 16), "{cores} cores");
    }

    #[tokio::test]
    async fn a_read_only_store_reads_what_is_there_refuses_writes_and_creates_no_database() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("t.db").display());
        assert!(
            Store::open_read_only(&url, &StoreOptions::default())
                .await
                .unwrap()
                .is_none()
        );
        assert!(!dir.path().join("t.db").exists(), "nothing created");

        let (_, store) = open_in(dir.path()).await;
        let row = UpstreamAccountRow {
            profile: "edge".into(),
            upstream: "primary".into(),
            directory: "https://ca.example/dir".into(),
            account_url: "https://ca.example/acct/1".into(),
            key_thumbprint: "thumb".into(),
            created_at: 1,
        };
        store.save_upstream_account(&row).await.unwrap();
        store.close().await;

        let ro = Store::open_read_only(&url, &StoreOptions::default())
            .await
            .unwrap()
            .unwrap();
        let read = ro
            .upstream_account("edge", "primary")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.key_thumbprint, "thumb");
        let refused = ro
            .save_upstream_account(&UpstreamAccountRow {
                profile: "other".into(),
                ..row
            })
            .await;
        assert!(refused.is_err(), "a read-only store cannot write");
        ro.close().await;
        for suffix in ["-wal", "-shm"] {
            assert!(
                !dir.path().join(format!("t.db{suffix}")).exists(),
                "reading made no {suffix} file"
            );
        }
    }

    #[tokio::test]
    async fn a_database_migrated_before_two_migrations_comments_were_reworded_still_opens() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = open_in(dir.path()).await;
        store.close().await;
        // As a database migrated by an earlier release records them.
        let conn = Connection::open(&path).unwrap();
        for (version, old) in REWORDED_MIGRATIONS {
            conn.execute(
                "UPDATE _sqlx_migrations SET checksum = unhex(?1) WHERE version = ?2",
                rusqlite::params![old, version],
            )
            .unwrap();
        }
        drop(conn);
        let url = format!("sqlite:{}", path.display());
        let store = Store::open(&url, &StoreOptions::default()).await.unwrap();
        store.ping().await.unwrap();
        store.close().await;
        // Another difference still stops it.
        let conn = Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE _sqlx_migrations SET checksum = x'00' WHERE version = 2",
            [],
        )
        .unwrap();
        drop(conn);
        assert!(Store::open(&url, &StoreOptions::default()).await.is_err());
    }

    #[tokio::test]
    async fn a_database_at_its_max_page_count_refuses_writes_as_unavailable_and_keeps_none_of_them()
    {
        let dir = tempfile::tempdir().unwrap();
        let (_path, store) = open_in(dir.path()).await;
        let count = || async {
            store
                .sqlite()
                .writer
                .lock()
                .await
                .unwrap()
                .query_row("SELECT count(*) FROM audit_log", [], |r| r.get::<_, i64>(0))
                .unwrap()
        };
        // The file may not grow by a single page more.
        {
            let writer = store.sqlite().writer.lock().await.unwrap();
            let pages: i64 = writer
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .unwrap();
            writer.pragma_update(None, "max_page_count", pages).unwrap();
        }
        let mut stored = count().await;
        let mut refused = None;
        for _ in 0..10_000 {
            match store.insert_audit(&issued_row("o")).await {
                Ok(()) => stored += 1,
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let refused = refused.expect("10,000 rows fitted in a database that may not grow");
        assert!(refused.is_unavailable(), "{refused:?}");
        assert!(
            refused.to_string().contains("database or disk is full"),
            "{refused}"
        );
        assert_eq!(count().await, stored, "the refused row was kept");
        store
            .sqlite()
            .writer
            .lock()
            .await
            .unwrap()
            .pragma_update(None, "max_page_count", 1_000_000)
            .unwrap();
        store.insert_audit(&issued_row("o")).await.unwrap();
        assert_eq!(count().await, stored + 1);
        store.close().await;
    }

    #[tokio::test]
    async fn no_write_goes_to_a_database_file_moved_away_and_writes_resume_once_it_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = open_in(dir.path()).await;
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch(ACCOUNT).unwrap();
        drop(raw);
        let away = dir.path().join("elsewhere.db");
        std::fs::rename(&path, &away).unwrap();
        let refused = store
            .deactivate_account("acct", &[], None)
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, StoreError::FileGone(p) if *p == path),
            "{refused:?}"
        );
        assert!(refused.is_unavailable());
        // A new file at the path is not the one this store opened.
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(
            store.deactivate_account("acct", &[], None).await,
            Err(StoreError::FileGone(_))
        ));
        std::fs::rename(&away, &path).unwrap();
        // True: the account was still valid, none of the refused writes
        // reached the file.
        assert!(store.deactivate_account("acct", &[], None).await.unwrap());
        store.close().await;
    }

    #[tokio::test]
    async fn the_database_its_wal_and_its_shared_memory_file_are_readable_by_the_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = open_in(dir.path()).await;
        store.use_nonce("n", 10).await.unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let file = PathBuf::from(format!("{}{suffix}", path.display()));
            let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", file.display());
        }
        store.close().await;
    }

    #[tokio::test]
    async fn every_connection_answers_the_health_ping_and_a_closed_store_refuses_work() {
        let (_db, store) = TestDb::open().await;
        store.ping().await.unwrap();
        store.use_nonce("n", 10).await.unwrap();
        assert_eq!(store.used_nonce_count().await.unwrap(), 1);
        store.close().await;
        assert!(matches!(store.ping().await, Err(StoreError::Closed)));
        assert!(matches!(
            store.use_nonce("m", 10).await,
            Err(StoreError::Closed)
        ));
        assert!(matches!(
            store.used_nonce_count().await,
            Err(StoreError::Closed)
        ));
    }

    #[tokio::test]
    async fn under_steady_writes_the_wal_starts_over_long_before_the_writers_own_checkpoint() {
        // Beside the test binary, on the disk the build is on: in a tmpfs
        // `/tmp` a sync costs nothing, checkpoints finish between commits
        // and the WAL starts over by itself, so the test would prove
        // nothing there.
        let exe = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
        let (_, store) = open_in(dir.path()).await;
        // Steady commits, 0.1 ms apart: one always lands while a
        // checkpoint copies and syncs (two syncs take longer than that), so
        // without the catch-up pass under the writer the WAL only starts
        // over at the writer's own limit and grows to at least that many
        // frames. 24,000 commits write more frames than the limit (two or
        // three each); the catch-up keeps it to about [`CATCH_UP_PAGES`],
        // with room for syncs that take most of a second on a busy disk.
        for i in 0..24_000 {
            store.use_nonce(&format!("{i:0>40}"), 10).await.unwrap();
            std::thread::sleep(Duration::from_micros(100));
        }
        let wal = std::fs::metadata(dir.path().join("t.db-wal"))
            .unwrap()
            .len();
        let frame = 24 + u64::from(PAGE_SIZE);
        assert!(
            wal < WRITER_CHECKPOINT_PAGES as u64 * frame,
            "the WAL grew to {wal} bytes ({} frames)",
            wal / frame
        );
        store.close().await;
    }

    #[tokio::test]
    async fn a_file_made_before_migration_7_keeps_its_rows_and_its_status_rules_without_a_temporary_btree_per_write()
     {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        // The file as the sixth migration left it, with rows in it.
        let mut conn = SqliteConnectOptions::from_str(&format!("sqlite:{}", path.display()))
            .unwrap()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .connect()
            .await
            .unwrap();
        SQLITE_MIGRATIONS.run_to(6, &mut conn).await.unwrap();
        conn.close().await.unwrap();
        let raw = Connection::open(&path).unwrap();
        raw.execute_batch(&format!(
            "{ACCOUNT}
             INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at, authorization_ids)
                 VALUES ('ord', 'default', 'acct', 'pending', '[]', 2, 1, '[\"az\"]');
             INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value, status, expires_at, created_at)
                 VALUES ('az', 'default', 'acct', 'dns', 'a.test', 'pending', 2, 1);
             INSERT INTO order_authorizations (order_id, authz_id, position) VALUES ('ord', 'az', 0);
             INSERT INTO challenges (id, authz_id, type, token, status) VALUES ('ch', 'az', 'http-01', 't', 'pending');"
        ))
        .unwrap();
        drop(raw);

        let store = Store::open(
            &format!("sqlite:{}", path.display()),
            &StoreOptions::default(),
        )
        .await
        .unwrap();
        let order = store.order("ord").await.unwrap().unwrap();
        assert_eq!(
            (order.status.as_str(), order.authorization_ids),
            ("pending", vec!["az".to_owned()])
        );
        store.close().await;

        let raw = Connection::open(&path).unwrap();
        // Every status check and transition rule is compiled without a
        // temporary b-tree (each of these had one before the migration).
        for sql in [
            "INSERT INTO accounts (id, profile, key_thumbprint, jwk, status, created_at) VALUES (?1, 'default', ?2, '{}', 'valid', 1)",
            "UPDATE accounts SET status = 'deactivated' WHERE id = ?1",
            "INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at) VALUES (?1, 'default', 'acct', 'pending', '[]', 2, 1)",
            "UPDATE orders SET status = 'valid', certificate_id = ?2 WHERE id = ?1 AND status = 'processing'",
            "INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value, status, expires_at, created_at) VALUES (?1, 'default', 'acct', 'dns', 'a.test', 'pending', 2, 1)",
            "UPDATE authorizations SET status = 'valid' WHERE id = ?1",
            "INSERT INTO challenges (id, authz_id, type, token, status) VALUES (?1, 'az', 'http-01', 't', 'pending')",
            "UPDATE challenges SET status = 'valid' WHERE id = ?1",
            "INSERT INTO jobs (kind, key, payload, status, attempts, max_attempts, run_at, created_at, updated_at) VALUES ('k', ?1, '{}', 'queued', 0, 1, 1, 1, 1)",
            "UPDATE upstream_orders SET status = 'valid' WHERE order_id = ?1",
        ] {
            let mut stmt = raw.prepare(&format!("EXPLAIN {sql}")).unwrap();
            let ops: Vec<String> = stmt
                .query_map(
                    rusqlite::params_from_iter(["x"; 2].iter().take(stmt.parameter_count())),
                    |r| r.get(1),
                )
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert!(!ops.iter().any(|op| op == "OpenEphemeral"), "{sql}");
        }
        // The lookup of a live job still finds the partial index rebuilt
        // with the new condition's text.
        let plan: Vec<String> = raw
            .prepare(
                "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE kind = 'k' AND key = 'j'
                 AND (status = 'queued' OR status = 'running' OR status = 'retiring')",
            )
            .unwrap()
            .query_map([], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let plan = plan.join("; ");
        assert!(plan.contains("jobs_live_identity"), "{plan}");

        // The rules still refuse what they refused.
        let refused = |sql: &str, why: &str| {
            let e = raw.execute_batch(sql).unwrap_err().to_string();
            assert!(e.contains(why), "{sql}: {e}");
        };
        for (table, row) in [
            (
                "accounts",
                "(id, profile, key_thumbprint, jwk, status, created_at) VALUES ('a2', 'default', 't2', '{}', 'pending', 1)",
            ),
            (
                "orders",
                "(id, profile, account_id, status, identifiers, expires_at, created_at) VALUES ('o2', 'default', 'acct', 'expired', '[]', 2, 1)",
            ),
            (
                "authorizations",
                "(id, profile, account_id, identifier_type, identifier_value, status, expires_at, created_at) VALUES ('az2', 'default', 'acct', 'dns', 'b.test', 'ready', 2, 1)",
            ),
            (
                "challenges",
                "(id, authz_id, type, token, status) VALUES ('ch2', 'az', 'http-01', 't', 'ready')",
            ),
            (
                "jobs",
                "(kind, key, payload, status, attempts, max_attempts, run_at, created_at, updated_at) VALUES ('k', 'j', '{}', 'waiting', 0, 1, 1, 1, 1)",
            ),
            (
                "upstream_orders",
                "(order_id, profile, account_id, csr_der, status, created_at, updated_at) VALUES ('ord', 'default', 'acct', x'00', 'pending', 1, 1)",
            ),
        ] {
            refused(
                &format!("INSERT INTO {table} {row}"),
                "CHECK constraint failed",
            );
        }
        refused(
            "UPDATE orders SET status = 'processing' WHERE id = 'ord'",
            "illegal order status transition",
        );
        refused(
            "UPDATE authorizations SET status = 'revoked' WHERE id = 'az'",
            "illegal authorization status transition",
        );
        raw.execute_batch(
            "UPDATE challenges SET status = 'processing' WHERE id = 'ch';
             UPDATE challenges SET status = 'valid' WHERE id = 'ch';
             UPDATE authorizations SET status = 'valid' WHERE id = 'az';
             UPDATE authorizations SET status = 'expired' WHERE id = 'az';
             UPDATE orders SET status = 'ready' WHERE id = 'ord';
             UPDATE orders SET status = 'processing' WHERE id = 'ord';
             UPDATE orders SET status = 'ready' WHERE id = 'ord';",
        )
        .unwrap();
        refused(
            "UPDATE challenges SET status = 'pending' WHERE id = 'ch'",
            "illegal challenge status transition",
        );
        refused(
            "UPDATE authorizations SET status = 'valid' WHERE id = 'az'",
            "illegal authorization status transition",
        );
        refused(
            "UPDATE orders SET status = 'pending' WHERE id = 'ord'",
            "illegal order status transition",
        );
        // Ready → valid is a finalize completing in its own transaction:
        // allowed, but only with the order's certificate.
        refused(
            "UPDATE orders SET status = 'valid' WHERE id = 'ord'",
            "an order cannot be valid without its certificate",
        );
    }

    #[tokio::test]
    async fn a_status_the_store_does_not_know_fails_the_read_naming_its_column_and_value() {
        let (db, store) = TestDb::open().await;
        // Rows as a newer release or a hand edit could leave them: the
        // CHECK constraints are switched off (SQLite: on this one
        // connection; PostgreSQL: dropped) so that the values are stored
        // at all.
        let unchecked = if crate::test_support::on_postgres() {
            "ALTER TABLE accounts DROP CONSTRAINT accounts_status_check;
             ALTER TABLE orders DROP CONSTRAINT orders_status_check;
             ALTER TABLE authorizations DROP CONSTRAINT authorizations_status_check;
             ALTER TABLE challenges DROP CONSTRAINT challenges_status_check;
             ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;"
        } else {
            "PRAGMA ignore_check_constraints = ON;"
        };
        db.exec(&format!(
            "{unchecked}
             INSERT INTO accounts (id, profile, key_thumbprint, jwk, status, created_at)
                 VALUES ('acct', 'default', 'thumb', '{{}}', 'suspended', 1);
             INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('ord', 'default', 'acct', 'on-hold', '[]', 2, 1);
             INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value, status, expires_at, created_at)
                 VALUES ('az', 'default', 'acct', 'dns', 'a.test', 'VALID', 2, 1);
             INSERT INTO challenges (id, authz_id, type, token, status) VALUES ('ch', 'az', 'http-01', 't', 'done');
             INSERT INTO jobs (id, kind, key, payload, status, attempts, max_attempts, run_at, created_at, updated_at)
                 VALUES (7, 'k', 'key', '{{}}', 'paused', 0, 1, 1, 1, 1);"
        ))
        .await;

        let unknown = |r: std::result::Result<(), StoreError>| match r {
            Err(StoreError::UnknownValue { column, value }) => (column, value),
            other => panic!("read as {other:?}, not refused"),
        };
        assert_eq!(
            unknown(store.account("acct").await.map(drop)),
            ("accounts.status", "suspended".to_owned())
        );
        assert_eq!(
            unknown(store.order("ord").await.map(drop)),
            ("orders.status", "on-hold".to_owned())
        );
        assert_eq!(
            unknown(store.authorization_with_challenges("az").await.map(drop)),
            ("authorizations.status", "VALID".to_owned())
        );
        assert_eq!(
            unknown(store.challenge("ch").await.map(drop)),
            ("challenges.status", "done".to_owned())
        );
        assert_eq!(
            unknown(store.job(7).await.map(drop)),
            ("jobs.status", "paused".to_owned())
        );
        // The message names both, for the operator reading the log.
        let e = store.account("acct").await.unwrap_err().to_string();
        assert!(
            e.contains("accounts.status") && e.contains("\"suspended\""),
            "{e}"
        );
        store.close().await;
    }

    #[tokio::test]
    async fn a_new_file_gets_1_kib_pages_and_an_existing_file_keeps_its_own() {
        let page_size = |path: &Path| -> i64 {
            Connection::open(path)
                .unwrap()
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let (new_path, store) = open_in(dir.path()).await;
        store.close().await;
        assert_eq!(page_size(&new_path), i64::from(PAGE_SIZE));

        // A file made with SQLite's default page size keeps it when the
        // store opens it (and migrates it).
        let old = tempfile::tempdir().unwrap();
        let old_path = old.path().join("t.db");
        Connection::open(&old_path)
            .unwrap()
            .execute_batch("PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; CREATE TABLE before_the_store (x);")
            .unwrap();
        let store = Store::open(
            &format!("sqlite:{}", old_path.display()),
            &StoreOptions::default(),
        )
        .await
        .unwrap();
        store.close().await;
        assert_eq!(page_size(&old_path), 4096);
    }

    #[tokio::test]
    async fn a_transaction_left_open_on_the_writer_does_not_block_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = open_in(dir.path()).await;
        // What a failed ROLLBACK would leave behind.
        store
            .sqlite()
            .writer
            .lock()
            .await
            .unwrap()
            .execute_batch("BEGIN")
            .unwrap();
        let (row, inserted) = store
            .insert_account(
                &NewAccountRow {
                    id: "acct",
                    profile: "default",
                    key_thumbprint: "thumb",
                    jwk: "{}",
                    contact: &[],
                    tos_agreed: true,
                    eab_kid: None,
                    now: 1,
                },
                &[],
            )
            .await
            .unwrap();
        assert!(inserted);
        assert!(store.sqlite().writer.lock().await.unwrap().is_autocommit());
        // Committed, not swallowed by the stale transaction: a read-only
        // connection sees it.
        assert_eq!(
            store.account_by_key("default", "thumb").await.unwrap(),
            Some(row)
        );
        store.close().await;
    }

    #[tokio::test]
    async fn a_read_by_key_on_the_writer_sees_what_another_process_committed_after_its_own_writes()
    {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = open_in(dir.path()).await;
        let other = Connection::open(&path).unwrap();
        other
            .execute_batch(&format!(
                "{ACCOUNT}
                 INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                     VALUES ('o', 'default', 'acct', 'pending', '[]', 2, 1);"
            ))
            .unwrap();
        // The writer reads the order and writes, so its page cache holds
        // the order's pages as of its own commit…
        assert_eq!(
            store.order("o").await.unwrap().unwrap().status.as_str(),
            "pending"
        );
        store.insert_audit(&issued_row("o")).await.unwrap();
        assert_eq!(
            store.order("o").await.unwrap().unwrap().status.as_str(),
            "pending"
        );
        // …and another process (the admin CLI) changes it: the next read
        // by key must not answer from that cache.
        other
            .execute("UPDATE orders SET status = 'invalid' WHERE id = 'o'", [])
            .unwrap();
        assert_eq!(
            store.order("o").await.unwrap().unwrap().status.as_str(),
            "invalid"
        );
        // The same for an authorization read with its challenges.
        other
            .execute_batch(
                "INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value, wildcard, status, expires_at, created_at)
                     VALUES ('a', 'default', 'acct', 'dns', 'example.org', 0, 'pending', 2, 1);",
            )
            .unwrap();
        let authz_status = async |store: &Store| {
            let (authz, _) = store
                .authorization_with_challenges("a")
                .await
                .unwrap()
                .unwrap();
            authz.status
        };
        assert_eq!(authz_status(&store).await.as_str(), "pending");
        other
            .execute(
                "UPDATE authorizations SET status = 'deactivated' WHERE id = 'a'",
                [],
            )
            .unwrap();
        assert_eq!(authz_status(&store).await.as_str(), "deactivated");
        other
            .execute(
                "UPDATE accounts SET status = 'deactivated' WHERE id = 'acct'",
                [],
            )
            .unwrap();
        assert_eq!(
            store
                .account("acct")
                .await
                .unwrap()
                .unwrap()
                .status
                .as_str(),
            "deactivated"
        );
        store.close().await;
    }

    #[tokio::test]
    async fn committed_pages_reach_the_database_file_without_waiting_for_the_writer_to_checkpoint()
    {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = open_in(dir.path()).await;
        let size = || std::fs::metadata(&path).unwrap().len();
        let before = size();
        // ~2,000 commits write a few thousand WAL frames: below the
        // writer's own checkpoint limit, so only the checkpointer can move
        // the new pages into the file.
        const { assert!(3 * 2_000 < WRITER_CHECKPOINT_PAGES) };
        for i in 0..2_000 {
            let nonce = format!("{i:0>40}");
            store.use_nonce(&nonce, 10).await.unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while size() <= before && std::time::Instant::now() < deadline {
            tokio::time::sleep(CHECKPOINT_EVERY).await;
        }
        assert!(
            size() > before,
            "the database file is still {before} bytes: nothing was checkpointed"
        );
        store.close().await;
    }
}
