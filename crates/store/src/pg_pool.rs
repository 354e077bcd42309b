//! The PostgreSQL connections the store's operations run on: a deadpool
//! pool of sqlx connections that hands a connection back as it was left,
//! without a round trip.
//!
//! sqlx's own pool pings every connection it gets back (`return_to_pool`),
//! in a task of its own: one more round trip, and a task, for every store
//! call (docs/performance.md). The ping is there to catch a connection left
//! mid-statement by a dropped future or broken by an error. This pool
//! tracks exactly that instead: a connection is marked in doubt while a
//! statement is on the wire and stays so if the statement's future is
//! dropped or fails other than by the server's refusal; such a connection
//! is closed, not reused. A connection the server dropped while idle fails
//! its next statement, which answers 503 (`is_unavailable`), and is
//! replaced. A transaction dropped without a commit queues its `ROLLBACK`
//! (a `Drop` cannot wait); the connection is then sent it by a task of its
//! own before going back, since until then it holds the transaction's
//! locks. Connections idle for ten minutes are closed, as sqlx's pool
//! does, so that a burst does not keep its sessions open on the server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions as _, Connection as _, Postgres};
use sqlx_core::transaction::TransactionManager as _;

use crate::{Result, StoreError};

/// How long a connection serves before it is closed and replaced, so that
/// a server's memory per session and a changed DNS name or failover
/// target are picked up (sqlx's default too).
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// How long a connection may sit idle before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How often taking a connection looks for idle ones to close.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A connection and whether it can be trusted to be idle and in sync.
#[derive(Debug)]
pub(crate) struct Session {
    conn: PgConnection,
    /// A statement was sent and its end not seen, or it failed in a way
    /// that may have left the connection out of step with the server.
    in_doubt: bool,
    /// A `ROLLBACK` is queued and not yet sent.
    rollback_queued: bool,
    opened: Instant,
}

impl Session {
    /// The connection, for one statement (or `BEGIN`/`COMMIT`): in doubt
    /// until [`Session::settle`] sees how it ended.
    pub(crate) fn start(&mut self) -> &mut PgConnection {
        self.in_doubt = true;
        &mut self.conn
    }

    /// The statement ended: the connection is fine again unless the error
    /// came from elsewhere than the server's answer to it (an I/O error, a
    /// protocol error, a timeout).
    pub(crate) fn settle<T>(&mut self, result: sqlx::Result<T>) -> Result<T> {
        self.in_doubt = matches!(&result, Err(e) if !matches!(e, sqlx::Error::Database(_)));
        // The server answered: a queued rollback went before the statement.
        self.rollback_queued &= self.in_doubt;
        result.map_err(StoreError::Pg)
    }

    /// Queues the rollback of the open transaction, from a `Drop`: sent
    /// before the connection's next statement, or when it is released.
    pub(crate) fn queue_rollback(&mut self) {
        type Manager = <Postgres as sqlx::Database>::TransactionManager;
        if Manager::get_transaction_depth(&self.conn) == 0 {
            return;
        }
        Manager::start_rollback(&mut self.conn);
        self.in_doubt = true;
        self.rollback_queued = true;
    }

    /// Sends a queued rollback and waits for its answer.
    async fn send_rollback(&mut self) {
        let done = self.conn.ping().await;
        let _ = self.settle(done);
    }
}

/// Opens connections, and recycles them only if not in doubt.
#[derive(Debug)]
pub(crate) struct Manager {
    options: PgConnectOptions,
}

impl managed::Manager for Manager {
    type Type = Session;
    type Error = sqlx::Error;

    async fn create(&self) -> sqlx::Result<Session> {
        Ok(Session {
            conn: self.options.connect().await?,
            in_doubt: false,
            rollback_queued: false,
            opened: Instant::now(),
        })
    }

    async fn recycle(&self, session: &mut Session, _: &Metrics) -> RecycleResult<sqlx::Error> {
        if session.in_doubt {
            return Err(RecycleError::message(
                "a statement on it did not end cleanly",
            ));
        }
        if session.opened.elapsed() > MAX_LIFETIME {
            return Err(RecycleError::message("past its lifetime"));
        }
        Ok(())
    }
}

/// The pool.
#[derive(Clone, Debug)]
pub(crate) struct PgPool {
    pool: managed::Pool<Manager>,
    acquire_timeout: Duration,
    idle_timeout: Duration,
    sweep_every: Duration,
    /// When idle connections were last looked for.
    swept: Arc<Mutex<Instant>>,
}

/// A connection of the pool, back in it when dropped (after its queued
/// rollback, if any, is sent).
#[derive(Debug)]
pub(crate) struct Pooled(Option<managed::Object<Manager>>);

impl Pooled {
    /// The connection, until the pool takes it back (only `Drop` does).
    pub(crate) fn session(&mut self) -> Result<&mut Session> {
        self.0.as_deref_mut().ok_or(StoreError::Closed)
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(mut conn) = self.0.take() else {
            return;
        };
        if !conn.rollback_queued {
            return;
        }
        // Without a runtime it goes back in doubt, and is closed.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { conn.send_rollback().await });
        }
    }
}

impl PgPool {
    pub(crate) fn new(
        options: PgConnectOptions,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<PgPool> {
        Self::with_idle_timeout(
            options,
            max_connections,
            acquire_timeout,
            IDLE_TIMEOUT,
            SWEEP_EVERY,
        )
    }

    fn with_idle_timeout(
        options: PgConnectOptions,
        max_connections: u32,
        acquire_timeout: Duration,
        idle_timeout: Duration,
        sweep_every: Duration,
    ) -> Result<PgPool> {
        let pool = managed::Pool::builder(Manager { options })
            .max_size(max_connections.max(1) as usize)
            // The connection used last: its server process is the warmest,
            // and under light load the others sit idle.
            .queue_mode(managed::QueueMode::Lifo)
            .build()
            .map_err(|e| StoreError::Pg(sqlx::Error::Configuration(Box::new(e))))?;
        Ok(PgPool {
            pool,
            acquire_timeout,
            idle_timeout,
            sweep_every,
            swept: Arc::new(Mutex::new(Instant::now())),
        })
    }

    /// Closes, gracefully and in a task of their own, the connections idle
    /// for longer than the idle timeout or open past their lifetime: at
    /// most once per `sweep_every`, by whichever caller comes first.
    fn sweep_idle(&self) {
        let Ok(mut swept) = self.swept.try_lock() else {
            return;
        };
        if swept.elapsed() < self.sweep_every {
            return;
        }
        *swept = Instant::now();
        drop(swept);
        let idle_timeout = self.idle_timeout;
        let stale = self.pool.retain(|session, metrics| {
            metrics.last_used() < idle_timeout && session.opened.elapsed() < MAX_LIFETIME
        });
        if stale.removed.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for session in stale.removed {
                    let _ = session.conn.close().await;
                }
            });
        }
    }

    /// A connection: an idle one, or a new one if fewer than the maximum
    /// are open; waiting at most the acquire timeout, so that a server
    /// that is down or out of connections is answered in seconds.
    pub(crate) async fn get(&self) -> Result<Pooled> {
        self.sweep_idle();
        match tokio::time::timeout(self.acquire_timeout, self.pool.get()).await {
            Err(_) => Err(StoreError::Pg(sqlx::Error::PoolTimedOut)),
            Ok(Ok(conn)) => Ok(Pooled(Some(conn))),
            Ok(Err(managed::PoolError::Backend(e))) => Err(StoreError::Pg(e)),
            // As a closed SQLite store answers.
            Ok(Err(managed::PoolError::Closed)) => Err(StoreError::Closed),
            Ok(Err(e)) => Err(StoreError::Pg(sqlx::Error::Configuration(Box::new(e)))),
        }
    }

    /// (connections open, of which idle).
    pub(crate) fn stats(&self) -> (u32, u32) {
        let status = self.pool.status();
        (status.size as u32, status.available as u32)
    }

    /// Refuses new requests and closes the idle connections gracefully;
    /// one in use is closed when it comes back.
    pub(crate) async fn close(&self) {
        let idle = self.pool.retain(|_, _| false);
        self.pool.close();
        for session in idle.removed {
            let _ = session.conn.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use crate::test_support::{ACCOUNT, TestDb, on_postgres};

    /// These run in the suite's PostgreSQL pass (`scripts/test` sets
    /// `TEST_DB_BACKEND=postgres` and excludes them from the SQLite one).
    fn require_postgres() {
        assert!(
            on_postgres(),
            "pg_pool's tests need PostgreSQL: TEST_DB_BACKEND=postgres and TEST_POSTGRES_URL"
        );
    }

    /// Waits until the pool holds `open` connections, all idle.
    async fn until_idle(store: &crate::Store, open: u32) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.pool_stats() != [("pool", open, open)] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "pool: {:?}",
                store.pool_stats()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_transaction_dropped_without_a_commit_releases_its_row_locks_and_its_connection_is_reused()
     {
        require_postgres();
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        {
            let mut conn = store.writer().await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            tx.exec(
                "UPDATE accounts SET contact = 'mailto:a@example.test' WHERE id = 'acct'",
                &[],
            )
            .await
            .unwrap();
            // Dropped here, as a refused operation drops its transaction.
        }
        // Another session's write of the row is not kept waiting.
        tokio::time::timeout(
            Duration::from_secs(5),
            db.exec("UPDATE accounts SET contact = 'after' WHERE id = 'acct' AND contact = '[]'"),
        )
        .await
        .expect("the dropped transaction still held the account's row lock");
        until_idle(&store, 1).await;
        let contact: Option<Option<String>> = store
            .writer()
            .await
            .unwrap()
            .scalar("SELECT contact FROM accounts WHERE id = 'acct'", &[])
            .await
            .unwrap();
        assert_eq!(
            contact,
            Some(Some("after".to_owned())),
            "the dropped write was rolled back"
        );
        until_idle(&store, 1).await;
        store.close().await;
    }

    #[tokio::test]
    async fn connections_idle_past_the_idle_timeout_are_closed_on_the_server() {
        use std::str::FromStr as _;

        require_postgres();
        let (db, _store) = TestDb::open().await;
        let pool = super::PgPool::with_idle_timeout(
            sqlx::postgres::PgConnectOptions::from_str(db.url())
                .unwrap()
                .application_name("pg_pool idle test"),
            4,
            Duration::from_secs(5),
            Duration::from_millis(300),
            Duration::ZERO,
        )
        .unwrap();
        let sessions = || async {
            db.scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'pg_pool idle test'")
                .await
        };
        // Three at once, then all idle.
        let held = [
            pool.get().await.unwrap(),
            pool.get().await.unwrap(),
            pool.get().await.unwrap(),
        ];
        drop(held);
        assert_eq!(pool.stats(), (3, 3));
        assert_eq!(sessions().await, 3);
        tokio::time::sleep(Duration::from_millis(400)).await;
        // The next taker closes them and opens one.
        let one = pool.get().await.unwrap();
        drop(one);
        assert_eq!(pool.stats(), (1, 1));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while sessions().await != 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} sessions still open",
                sessions().await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pool.close().await;
    }

    #[tokio::test]
    async fn a_statement_cut_off_midway_closes_its_connection_instead_of_handing_it_on() {
        require_postgres();
        let (_db, store) = TestDb::open().await;
        let mut conn = store.writer().await.unwrap();
        let cut = tokio::time::timeout(
            Duration::from_millis(300),
            conn.exec("SELECT pg_sleep(20)", &[]),
        )
        .await;
        assert!(cut.is_err(), "the sleep was cut off");
        drop(conn);
        // Handed on, the connection would first wait out the sleep's
        // answer; a fresh one answers at once.
        tokio::time::timeout(Duration::from_secs(5), store.ping())
            .await
            .expect("the next statement waited for the cut-off one")
            .unwrap();
        until_idle(&store, 1).await;
        store.close().await;
    }
}
