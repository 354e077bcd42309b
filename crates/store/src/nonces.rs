//! Anti-replay nonces (RFC 8555 §6.5) shared by every process on the
//! database: the key their MACs are made with, and the nonces already used.
//! Issuing one writes nothing; using one is one `INSERT` row.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::db::{Arg, args};
use crate::{Backend, Result, Store, StoreError, pg_pool::PgPool, pooled};

/// The most nonce uses one statement writes; more wait for the next.
const MOST_PER_STATEMENT: usize = 512;

/// How long one statement of nonce records may take. Every use on this
/// process waits behind it, so a connection that died without a word (a
/// failover, a cable) must not hold them for as long as the kernel takes
/// to notice: past this the uses it carries are answered unavailable (503,
/// `Retry-After`) and its connection is closed, not reused.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Nonce uses on PostgreSQL, written as a database's group commit works:
/// a use that arrives while none is being written is written at once, by
/// itself; uses that arrive while a statement is on the wire wait for it
/// and then go together in the next, written by the same task. Nonce
/// records were 7.7 of an issuance's 31 statements, each a round trip and
/// a transaction of its own; at concurrency 16 about 2.3 now share each
/// statement (docs/performance.md). An idle server still writes each use
/// at once, so the wait costs nothing when nothing else waits. The uses
/// waiting are bounded by the requests admitted at once; one whose request
/// went (its client gone) is not written.
#[derive(Debug, Default)]
pub(crate) struct NonceWrites {
    pending: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    uses: Vec<Use>,
    /// A task is writing; it takes what is queued when its statement ends.
    writing: bool,
}

#[derive(Debug)]
struct Use {
    value: String,
    expires_at: i64,
    answer: oneshot::Sender<Result<bool>>,
}

impl NonceWrites {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a use; its answer, once the statement that carries it ends.
    async fn record(self: &Arc<Self>, pool: &PgPool, value: &str, expires_at: i64) -> Result<bool> {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut pending = self.pending();
            pending.uses.push(Use {
                value: value.to_owned(),
                expires_at,
                answer,
            });
            !std::mem::replace(&mut pending.writing, true)
        };
        if start {
            // A task of its own, so that a request dropped mid-statement
            // (its client gone) does not strand the uses that wait on it.
            let writing = Writing {
                writes: Arc::clone(self),
                owns: true,
            };
            tokio::spawn(writing.run(pool.clone()));
        }
        // The sender goes unanswered only with the task, when its runtime
        // shuts down.
        answered.await.unwrap_or(Err(StoreError::Closed))
    }
}

/// The task writing queued uses. Dropped mid-statement (its runtime
/// shutting down, or a panic), it answers the uses still queued (their
/// senders dropped: [`StoreError::Closed`]) and lets the next use start
/// another writer.
struct Writing {
    writes: Arc<NonceWrites>,
    /// Still owns `writing`: not once it cleared the flag itself, after
    /// which another task may own it.
    owns: bool,
}

impl Drop for Writing {
    fn drop(&mut self) {
        if self.owns {
            let stranded = {
                let mut pending = self.writes.pending();
                pending.writing = false;
                std::mem::take(&mut pending.uses)
            };
            drop(stranded);
        }
    }
}

impl Writing {
    async fn run(mut self, pool: PgPool) {
        loop {
            let batch = {
                let mut pending = self.writes.pending();
                // A request dropped while it waited acted on nothing.
                pending.uses.retain(|used| !used.answer.is_closed());
                if pending.uses.is_empty() {
                    // Cleared with the lock held, so that a use queued
                    // after this sees no writer and starts one.
                    pending.writing = false;
                    self.owns = false;
                    return;
                }
                let rest = pending.uses.len().saturating_sub(MOST_PER_STATEMENT);
                let mut batch = std::mem::take(&mut pending.uses);
                pending.uses = batch.split_off(batch.len() - rest);
                batch
            };
            let written = match tokio::time::timeout(WRITE_TIMEOUT, write_uses(&pool, &batch)).await
            {
                Ok(written) => written,
                Err(_) => Err(StoreError::Pg(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the nonce records were not written within {WRITE_TIMEOUT:?}"),
                )))),
            };
            let written = written.map_err(Arc::new);
            answer(batch, written);
        }
    }
}

/// Writes the distinct values of `batch` in one statement; the ones that
/// were not used before. In sorted order, so that two processes writing
/// the same replayed values cannot each wait for the other's row.
async fn write_uses(pool: &PgPool, batch: &[Use]) -> Result<HashSet<String>> {
    let mut distinct = BTreeMap::new();
    for used in batch {
        distinct.insert(used.value.as_str(), used.expires_at);
    }
    let (values, expiries): (Vec<&str>, Vec<i64>) = distinct.into_iter().unzip();
    // `synchronous_commit` off for this transaction: see `Store::use_nonce`.
    let fresh = pooled(pool)
        .await?
        .all(
            "INSERT INTO used_nonces (value, expires_at)
             SELECT x.v, x.e
               FROM (SELECT set_config('synchronous_commit', 'off', true)) AS no_wait,
                    unnest(?1::text[], ?2::bigint[]) AS x(v, e)
             ON CONFLICT (value) DO NOTHING
             RETURNING value",
            &[Arg::Texts(&values), Arg::Ints(&expiries)],
            |row| row.get::<String>(0),
        )
        .await?;
    Ok(fresh.into_iter().collect())
}

/// Answers each use of a written batch: a value the statement wrote is
/// fresh for its first use in the batch only; a later one is a replay.
fn answer(batch: Vec<Use>, written: std::result::Result<HashSet<String>, Arc<StoreError>>) {
    match written {
        Ok(mut fresh) => {
            for used in batch {
                let _ = used.answer.send(Ok(fresh.remove(&used.value)));
            }
        }
        Err(e) => {
            for used in batch {
                // A closed store answers as it does everywhere else.
                let e = match &*e {
                    StoreError::Closed => StoreError::Closed,
                    _ => StoreError::Shared(Arc::clone(&e)),
                };
                let _ = used.answer.send(Err(e));
            }
        }
    }
}

/// How long (seconds) the record of a used nonce outlives the nonce's
/// expiry. Replicas judge expiry by their own clocks: one whose clock is
/// behind the sweeper's still accepts a nonce the sweeper thinks expired,
/// and must still find that it was used. Clocks kept by NTP are well
/// within this.
pub const USED_NONCE_GRACE: i64 = 300;

impl Store {
    /// The key nonces are signed with: `candidate` if no process stored one
    /// before, else the stored one (one statement decides, so processes
    /// starting together agree).
    pub async fn nonce_key(&self, candidate: &[u8]) -> Result<Vec<u8>> {
        let mut conn = self.writer().await?;
        conn.exec(
            "INSERT INTO nonce_key (id, key) VALUES (1, ?1) ON CONFLICT (id) DO NOTHING",
            args![candidate],
        )
        .await?;
        conn.one("SELECT key FROM nonce_key WHERE id = 1", &[], |row| {
            row.get(0)
        })
        .await?
        .ok_or_else(|| crate::StoreError::Corrupt("the nonce key is missing".into()))
    }

    /// Records that a nonce was used: true the first time, false for a
    /// replay, even when two uses race (one `INSERT`; whether it wrote the
    /// row is the answer). `expires_at` is when the record may go.
    ///
    /// On PostgreSQL uses that arrive together are written together (see
    /// [`NonceWrites`]), and the record's commit does not wait for its WAL
    /// flush (`synchronous_commit` off for the statement's transaction):
    /// nonce records are most of an issuance's commits. That loses
    /// nothing that matters. WAL is one ordered stream, so the durable
    /// commit of any write the request then makes flushes the record with
    /// it; a crash can take the record only together with that write, or
    /// from a request that wrote nothing, and a replay after it then does
    /// what a retry would.
    pub async fn use_nonce(&self, value: &str, expires_at: i64) -> Result<bool> {
        if let Backend::Postgres(db) = &self.backend {
            return db.nonces.record(&db.pool, value, expires_at).await;
        }
        let mut conn = self.writer().await?;
        Ok(conn
            .exec(
                "INSERT INTO used_nonces (value, expires_at) VALUES (?1, ?2)
                 ON CONFLICT (value) DO NOTHING",
                args![value, expires_at],
            )
            .await?
            == 1)
    }

    /// Forgets used nonces that expired more than [`USED_NONCE_GRACE`]
    /// seconds before `now` (they are refused for their expiry anyway);
    /// returns how many.
    pub async fn sweep_nonces(&self, now: i64) -> Result<u64> {
        Ok(self
            .writer()
            .await?
            .exec(
                "DELETE FROM used_nonces WHERE expires_at <= ?1",
                args![now.saturating_sub(USED_NONCE_GRACE)],
            )
            .await? as u64)
    }

    /// Records of used nonces (each kept until [`USED_NONCE_GRACE`] past
    /// its expiry), for the CLI and tests.
    pub async fn used_nonce_count(&self) -> Result<i64> {
        Ok(self
            .reader()
            .await?
            .scalar("SELECT COUNT(*) FROM used_nonces", &[])
            .await?
            .unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::StoreError;
    use crate::test_support::{TestDb, on_postgres};

    #[tokio::test]
    async fn the_first_nonce_key_stored_is_the_one_every_process_reads() {
        let (_db, store) = TestDb::open().await;
        assert_eq!(store.nonce_key(b"first").await.unwrap(), b"first");
        assert_eq!(store.nonce_key(b"second").await.unwrap(), b"first");
    }

    #[tokio::test]
    async fn a_nonce_is_used_once_and_its_record_goes_a_grace_after_it_expires() {
        let (_db, store) = TestDb::open().await;
        assert!(store.use_nonce("n", 10).await.unwrap());
        assert!(!store.use_nonce("n", 10).await.unwrap(), "replayed");
        assert!(store.use_nonce("m", 20).await.unwrap());
        assert_eq!(store.sweep_nonces(10).await.unwrap(), 0);
        assert_eq!(
            store
                .sweep_nonces(10 + super::USED_NONCE_GRACE)
                .await
                .unwrap(),
            1
        );
        assert_eq!(store.used_nonce_count().await.unwrap(), 1);
    }

    #[tokio::test]
    async fn nonces_used_at_once_are_each_answered_alone_and_on_postgres_written_together() {
        let (db, store) = TestDb::open().await;
        // Forty nonces, ten of them replayed alongside their first use.
        let values: Vec<String> = (0..40)
            .chain(0..10)
            .map(|i| format!("nonce-{i:02}"))
            .collect();
        let mut uses = tokio::task::JoinSet::new();
        for value in values {
            let store = store.clone();
            uses.spawn(async move { (store.use_nonce(&value, 10).await.unwrap(), value) });
        }
        let mut fresh = std::collections::BTreeMap::<String, u32>::new();
        while let Some(used) = uses.join_next().await {
            let (accepted, value) = used.unwrap();
            *fresh.entry(value).or_default() += u32::from(accepted);
        }
        assert_eq!(fresh.len(), 40);
        assert!(
            fresh.values().all(|n| *n == 1),
            "each nonce accepted exactly once: {fresh:?}"
        );
        assert_eq!(store.used_nonce_count().await.unwrap(), 40);
        assert!(
            !store.use_nonce("nonce-07", 10).await.unwrap(),
            "replayed later"
        );
        if on_postgres() {
            // Each row's xmin is the transaction that wrote it: one per
            // statement. The uses queued while the first was written go
            // together (on this single-threaded runtime, all of them).
            let statements = db
                .scalar("SELECT COUNT(DISTINCT xmin::text) FROM used_nonces")
                .await;
            assert!(
                statements <= 2,
                "forty nonce records written by {statements} statements"
            );
        }
    }

    #[tokio::test]
    async fn every_nonce_use_waiting_on_a_statement_that_fails_gets_its_error() {
        let (db, store) = TestDb::open().await;
        db.exec("DROP TABLE used_nonces").await;
        let mut uses = tokio::task::JoinSet::new();
        for i in 0..3 {
            let store = store.clone();
            uses.spawn(async move { store.use_nonce(&format!("n{i}"), 10).await });
        }
        while let Some(used) = uses.join_next().await {
            let refused = used.unwrap().expect_err("no table to record the use in");
            assert!(
                refused.to_string().contains("used_nonces"),
                "the statement's own error: {refused}"
            );
            assert_eq!(matches!(refused, StoreError::Shared(_)), on_postgres());
        }
        store.close().await;
        assert!(matches!(
            store.use_nonce("n", 10).await,
            Err(StoreError::Closed)
        ));
    }

    #[tokio::test]
    async fn more_uses_at_once_than_one_statement_takes_are_written_by_the_next() {
        let (db, store) = TestDb::open().await;
        let mut uses = tokio::task::JoinSet::new();
        for i in 0..600 {
            let store = store.clone();
            uses.spawn(async move { store.use_nonce(&format!("n{i:03}"), 10).await.unwrap() });
        }
        let mut accepted = 0;
        while let Some(used) = uses.join_next().await {
            accepted += u32::from(used.unwrap());
        }
        assert_eq!(accepted, 600);
        assert_eq!(store.used_nonce_count().await.unwrap(), 600);
        if on_postgres() {
            let statements = db
                .scalar("SELECT COUNT(DISTINCT xmin::text) FROM used_nonces")
                .await;
            assert!(
                (2..=3).contains(&statements),
                "600 records in {statements} statements of at most 512"
            );
        }
    }

    /// Another session's lock on `used_nonces`, held until [`release`]:
    /// a record's statement waits for it.
    async fn hold_used_nonces(db: &TestDb) -> sqlx::PgConnection {
        let mut holder = db.postgres().await;
        sqlx::raw_sql("BEGIN; LOCK TABLE used_nonces IN ACCESS EXCLUSIVE MODE")
            .execute(&mut holder)
            .await
            .unwrap();
        holder
    }

    async fn release(mut holder: sqlx::PgConnection) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut holder)
            .await
            .unwrap();
    }

    /// Whether a fresh use is accepted; it must be answered within 5 s.
    async fn the_next_use_is_written(store: &crate::Store) -> bool {
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            store.use_nonce("next", 10),
        )
        .await
        .expect("the next use is answered")
        .unwrap()
    }

    #[tokio::test]
    async fn on_postgres_a_writer_dropped_mid_statement_answers_the_uses_queued_behind_it_and_the_next_starts_another()
     {
        if !on_postgres() {
            return;
        }
        let (db, store) = TestDb::open().await;
        let holder = hold_used_nonces(&db).await;
        // The writer is started on a runtime of its own, shut down while
        // its statement waits: the writer task is dropped, as when the
        // server stops or the task panics.
        let other = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let first = other.spawn({
            let store = store.clone();
            async move { store.use_nonce("first", 10).await }
        });
        // Well within WRITE_TIMEOUT, after which the writer would answer
        // by itself.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while db
            .scalar(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()
                   AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO used_nonces%'",
            )
            .await
            == 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the first record never waited on the lock"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // Queued behind the statement, on this runtime.
        let queued = tokio::spawn({
            let store = store.clone();
            async move { store.use_nonce("queued", 10).await }
        });
        let crate::Backend::Postgres(pg) = &store.backend else {
            unreachable!("on PostgreSQL")
        };
        while pg.nonces.pending().uses.is_empty() {
            assert!(std::time::Instant::now() < deadline, "never queued");
            tokio::task::yield_now().await;
        }
        other.shutdown_background();
        assert!(first.await.unwrap_err().is_cancelled());
        let queued = tokio::time::timeout(std::time::Duration::from_secs(5), queued)
            .await
            .expect("the use queued behind the dropped writer is answered")
            .unwrap();
        assert!(matches!(queued, Err(StoreError::Closed)), "{queued:?}");
        release(holder).await;
        // The dropped writer left no one believing it still writes.
        assert!(the_next_use_is_written(&store).await);
    }

    #[tokio::test]
    async fn on_postgres_a_nonce_record_stuck_past_its_time_answers_unavailable_and_the_next_is_written()
     {
        if !on_postgres() {
            return;
        }
        let (db, store) = TestDb::open().await;
        // Another session holds the table: the record's statement waits.
        let holder = hold_used_nonces(&db).await;
        let started = std::time::Instant::now();
        let refused = store.use_nonce("stuck", 10).await.unwrap_err();
        assert!(refused.is_unavailable(), "{refused}");
        assert!(
            started.elapsed() >= super::WRITE_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        release(holder).await;
        // The writer was not stuck with it.
        assert!(the_next_use_is_written(&store).await);
    }
}
