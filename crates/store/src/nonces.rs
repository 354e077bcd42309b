//! Anti-replay nonces (RFC 8555 §6.5) shared by every process on the
//! database: the key their MACs are made with, and the nonces already used.
//! Issuing one writes nothing; using one is one `INSERT` row, on
//! PostgreSQL most often inside the request's own first statement
//! ([`Store::spending_nonce`]).

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::db::{Arg, args};
use crate::{Backend, Result, Store, StoreError, pg_pool::PgPool, pooled};

tokio::task_local! {
    /// The nonce of the request this task serves, inside
    /// [`Store::spending_nonce`].
    static DUE: Arc<tokio::sync::Mutex<Due>>;
    /// Where the statement that carries it finds other requests' nonce
    /// uses to take along ([`Riders`]), inside [`Store::spending_nonce`].
    static RIDES: Rides;
}

/// The queue of nonce uses waiting to be written, for a statement that
/// carries a request's nonce to take some along.
#[derive(Clone, Debug)]
pub(crate) struct Rides {
    writes: Arc<NonceWrites>,
    pool: PgPool,
}

/// Where the nonce of a request stands. Behind an async lock, so that two
/// statements of one request run at once (a `join!`) cannot both spend it:
/// the second waits for the first's answer.
#[derive(Debug)]
pub(crate) enum Due {
    Pending {
        value: String,
        expires_at: i64,
        /// Counts the request among those whose statement may carry
        /// riders soon, while its nonce is pending and is not being
        /// written alone.
        carrier: Option<Carrier>,
    },
    Spent,
    Replayed,
}

/// How a statement that carries a request's nonce commits: a read's need
/// not wait for its WAL flush (see [`Store::use_nonce`]), a write's must,
/// for the write's sake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Carry {
    Read,
    Write,
}

/// The nonce due in this task, if any, for a statement to carry.
pub(crate) fn due() -> Option<Arc<tokio::sync::Mutex<Due>>> {
    DUE.try_with(Arc::clone).ok()
}

/// Other requests' nonce uses for the statement that carries this task's
/// nonce to write too: none outside [`Store::spending_nonce`] or when none
/// wait.
pub(crate) fn riders() -> Riders {
    RIDES
        .try_with(|rides| Riders {
            uses: rides.writes.take_riders(),
            home: Some(rides.clone()),
        })
        .unwrap_or_default()
}

impl Store {
    /// Runs `work`, a request's operation, with the request's nonce to be
    /// recorded as used (`value`, to be kept until `expires_at`): the
    /// nonce is spent by `work`'s first statement that may carry it, or
    /// else recorded before any other statement of `work` runs, or at the
    /// end when `work` ran none. [`StoreError::NonceReplayed`] (and
    /// `work`'s output dropped) when it was used before.
    ///
    /// Why: on PostgreSQL each nonce's own `INSERT` is a round trip, and a
    /// round trip costs both processes more CPU than most statements' own
    /// work (docs/performance.md). A statement that carries the nonce runs
    /// `INSERT INTO used_nonces` as a `WITH` of its own, with no `ON
    /// CONFLICT`: a replay fails the whole statement on the primary key,
    /// so it writes nothing; a concurrent use of the same nonce waits for
    /// the first and then fails the same way. Statements that do not carry
    /// it (every other read and write, and any inside a transaction) find
    /// it recorded first: nothing is written for a request before its
    /// nonce is known fresh. On SQLite, where a statement is no round
    /// trip, the nonce is recorded before `work` begins.
    ///
    /// Work spawned onto other tasks does not see the nonce: `work` must
    /// do its statements itself.
    pub async fn spending_nonce<F: Future>(
        &self,
        value: &str,
        expires_at: i64,
        work: F,
    ) -> Result<F::Output> {
        let Backend::Postgres(db) = &self.backend else {
            if !self.use_nonce(value, expires_at).await? {
                return Err(StoreError::NonceReplayed);
            }
            return Ok(work.await);
        };
        let due = Arc::new(tokio::sync::Mutex::new(Due::Pending {
            value: value.to_owned(),
            expires_at,
            carrier: Some(Carrier::new(&db.nonces)),
        }));
        let rides = Rides {
            writes: Arc::clone(&db.nonces),
            pool: db.pool.clone(),
        };
        let output = RIDES.scope(rides, DUE.scope(Arc::clone(&due), work)).await;
        self.spend_due_nonce_in(&due).await?;
        Ok(output)
    }

    /// Records the nonce due in this task, if it is still pending, before
    /// a statement that does not carry it; [`StoreError::NonceReplayed`]
    /// when it was used before.
    pub(crate) async fn spend_due_nonce(&self) -> Result<()> {
        match due() {
            Some(due) => self.spend_due_nonce_in(&due).await,
            None => Ok(()),
        }
    }

    /// (A nonce is due only on PostgreSQL.)
    async fn spend_due_nonce_in(&self, due: &tokio::sync::Mutex<Due>) -> Result<()> {
        let Backend::Postgres(db) = &self.backend else {
            return Ok(());
        };
        let mut due = due.lock().await;
        let (value, expires_at) = match &mut *due {
            Due::Spent => return Ok(()),
            Due::Replayed => return Err(StoreError::NonceReplayed),
            Due::Pending {
                value,
                expires_at,
                carrier,
            } => {
                // Written alone now: no use should wait for this request.
                carrier.take();
                (value.clone(), *expires_at)
            }
        };
        let fresh = db.nonces.record(&db.pool, &value, expires_at).await?;
        if fresh {
            *due = Due::Spent;
            Ok(())
        } else {
            *due = Due::Replayed;
            Err(StoreError::NonceReplayed)
        }
    }
}

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
/// a transaction of its own; at concurrency 16 about 2.3 shared each
/// statement (docs/performance.md). While other requests whose statements
/// can take uses along ([`Riders`]) are under way, the first use waits
/// [`RIDE_WAIT`] for one of them before a statement of its own is sent.
/// An idle server still writes each use at once, so the wait costs
/// nothing when nothing else waits. The uses
/// waiting are bounded by the requests admitted at once; one whose request
/// went (its client gone) is not written.
#[derive(Debug, Default)]
pub(crate) struct NonceWrites {
    pending: Mutex<Pending>,
    /// Requests on this process whose nonce is still to be spent, most
    /// often by a statement that can take queued uses along ([`Riders`]).
    carriers: AtomicUsize,
}

/// The most queued nonce uses one request's statement takes along.
const MOST_RIDERS: usize = 32;

/// How long a queued use waits for a request's statement to take it
/// along before a statement of its own writes it, when such statements
/// are coming (see [`Riders`]).
const RIDE_WAIT: Duration = Duration::from_millis(1);

/// One request counted in [`NonceWrites::carriers`] while it lives.
#[derive(Debug)]
pub(crate) struct Carrier(Arc<NonceWrites>);

impl Carrier {
    fn new(writes: &Arc<NonceWrites>) -> Self {
        writes.carriers.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(writes))
    }
}

impl Drop for Carrier {
    fn drop(&mut self) {
        self.0.carriers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Queued nonce uses that a request's statement writes along with its own
/// nonce, so that they cost no round trip of their own. Why: the two
/// requests of an issuance answered from memory have no statement to carry
/// their nonces, and writing them alone was 1.4 of an issuance's 7.4
/// statements at 16 (docs/performance.md).
///
/// The statement inserts them as it inserts its own nonce, with no `ON
/// CONFLICT`, so a replayed one fails the whole statement. Which of its
/// nonces was replayed it cannot say; and any failure takes the riders'
/// records with it. So when a statement with riders fails, the riders go
/// back to the queue, to be written alone (which answers each one
/// exactly), and the statement runs again without them: it writes what it
/// would have written had it never taken them. A statement's future
/// dropped mid-flight gives its riders back too; if the statement had
/// committed, their second write finds them used and their requests get
/// `badNonce`, which clients answer by retrying with the fresh nonce.
#[derive(Debug, Default)]
pub(crate) struct Riders {
    uses: Vec<Use>,
    home: Option<Rides>,
}

impl Riders {
    pub(crate) fn is_empty(&self) -> bool {
        self.uses.is_empty()
    }

    /// The values and expiries to bind.
    pub(crate) fn columns(&self) -> (Vec<String>, Vec<i64>) {
        self.uses
            .iter()
            .map(|used| (used.value.clone(), used.expires_at))
            .unzip()
    }

    /// Their statement committed: each was fresh.
    pub(crate) fn written(mut self) {
        for used in std::mem::take(&mut self.uses) {
            let _ = used.answer.send(Ok(true));
        }
    }
}

impl Drop for Riders {
    fn drop(&mut self) {
        if let Some(home) = &self.home
            && !self.uses.is_empty()
        {
            home.writes
                .give_back(&home.pool, std::mem::take(&mut self.uses));
        }
    }
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
            // Statements of requests under way may take it along first.
            let wait = if self.carriers.load(Ordering::Relaxed) > 0 {
                RIDE_WAIT
            } else {
                Duration::ZERO
            };
            self.start_writing(pool, wait);
        }
        // The sender goes unanswered only with the task, when its runtime
        // shuts down.
        answered.await.unwrap_or(Err(StoreError::Closed))
    }
}

impl NonceWrites {
    /// A task of its own, so that a request dropped mid-statement (its
    /// client gone) does not strand the uses that wait on it.
    fn start_writing(self: &Arc<Self>, pool: &PgPool, wait: Duration) {
        let writing = Writing {
            writes: Arc::clone(self),
            owns: true,
        };
        // Riders given back from a `Drop` may find no runtime (one shut
        // down): the writer, dropped unstarted, answers what is queued.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(writing.run(pool.clone(), wait))),
            Err(_) => drop(writing),
        }
    }

    /// Queued uses for a statement to take along, each value once (a
    /// value twice would fail the statement on itself).
    fn take_riders(&self) -> Vec<Use> {
        let mut pending = self.pending();
        if pending.uses.is_empty() {
            return Vec::new();
        }
        let mut taken = HashSet::new();
        let (uses, rest): (Vec<Use>, Vec<Use>) = std::mem::take(&mut pending.uses)
            .into_iter()
            .filter(|used| !used.answer.is_closed())
            .partition(|used| taken.len() < MOST_RIDERS && taken.insert(used.value.clone()));
        pending.uses = rest;
        drop(pending);
        // In one order everywhere, as the uses written alone are, so that
        // two statements taking the same replayed values cannot each wait
        // for the other's row.
        let mut uses = uses;
        uses.sort_by(|a, b| a.value.cmp(&b.value));
        uses
    }

    /// Queues again uses a statement took and did not write.
    fn give_back(self: &Arc<Self>, pool: &PgPool, uses: Vec<Use>) {
        let start = {
            let mut pending = self.pending();
            pending.uses.splice(0..0, uses);
            !std::mem::replace(&mut pending.writing, true)
        };
        if start {
            self.start_writing(pool, Duration::ZERO);
        }
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
    async fn run(mut self, pool: PgPool, wait: Duration) {
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
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
    use crate::test_support::{ACCOUNT, GUARD, TestDb, cert_row, issued_row, on_postgres};

    /// A new order of [`ACCOUNT`]'s for one name, `id` its order's id
    /// and the prefix of its authorization's and challenge's.
    fn new_order(id: &str) -> crate::NewOrderRow {
        let name = acme_proxy_protocol::types::Identifier {
            kind: "dns".parse().unwrap(),
            value: format!("{id}.example"),
        };
        crate::NewOrderRow {
            id: id.to_owned(),
            profile: "default".to_owned(),
            account_id: "acct".to_owned(),
            identifiers: vec![name.clone()],
            not_before: None,
            not_after: None,
            expires_at: 100,
            now: 1,
            authorizations: vec![crate::NewAuthorization {
                id: format!("{id}-az"),
                identifier: name,
                wildcard: false,
                expires_at: 90,
                challenges: vec![crate::NewChallenge {
                    id: format!("{id}-ch"),
                    kind: "http-01".parse().unwrap(),
                    token: format!("{id}-token"),
                }],
            }],
            reuse_validated_since: None,
            certificate_profile: None,
            replaces: None,
            max_pending_authorizations: i64::MAX,
        }
    }

    async fn orders(db: &TestDb) -> i64 {
        db.scalar("SELECT COUNT(*) FROM orders").await
    }

    /// On PostgreSQL, whether the record of nonce `value` was written by
    /// the transaction that wrote `row_sql`'s row (its `xmin`).
    async fn written_together(db: &TestDb, value: &str, row_sql: &str) -> bool {
        db.scalar(&format!(
            "SELECT COUNT(*) FROM used_nonces WHERE value = '{value}'
                AND xmin::text = ({row_sql})::text"
        ))
        .await
            == 1
    }

    #[tokio::test]
    async fn a_new_order_carries_its_requests_nonce_and_a_replay_of_it_writes_nothing() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        let first = store
            .spending_nonce("n1", 10, store.insert_order(&new_order("o1"), GUARD))
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(first, crate::InsertOrder::Inserted(_)));
        if on_postgres() {
            assert!(
                written_together(&db, "n1", "SELECT xmin FROM orders WHERE id = 'o1'").await,
                "the order's statement recorded the nonce"
            );
        }
        let replayed = store
            .spending_nonce("n1", 10, store.insert_order(&new_order("o2"), GUARD))
            .await;
        assert!(
            matches!(replayed, Err(StoreError::NonceReplayed)),
            "{replayed:?}"
        );
        assert_eq!(orders(&db).await, 1, "the replay wrote no order");
        assert_eq!(store.used_nonce_count().await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_ready_orders_completion_carries_its_requests_nonce_and_a_replay_stores_nothing() {
        let (db, store) = TestDb::open().await;
        db.exec(&format!(
            "{ACCOUNT}
             INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('ready', 'default', 'acct', 'ready', '[]', 10, 1);"
        ))
        .await;
        store
            .spending_nonce("f1", 10, store.order("ready"))
            .await
            .unwrap()
            .unwrap();
        let audit = issued_row("ready");
        let (c1, c2) = (cert_row("c1", "ready", "c1"), cert_row("c2", "ready", "c2"));
        let complete = |nonce: &'static str, cert| {
            store.spending_nonce(
                nonce,
                10,
                store.complete_ready_order(cert, &audit, &[], GUARD),
            )
        };
        let replayed = complete("f1", &c1).await;
        assert!(
            matches!(replayed, Err(StoreError::NonceReplayed)),
            "{replayed:?}"
        );
        assert!(store.certificate("c1").await.unwrap().is_none());
        assert_eq!(
            store.order("ready").await.unwrap().unwrap().status.as_str(),
            "ready"
        );
        assert!(complete("f2", &c2).await.unwrap().unwrap());
        if on_postgres() {
            assert!(
                written_together(&db, "f2", "SELECT xmin FROM certificates WHERE id = 'c2'").await,
                "the completion's statement recorded the nonce"
            );
        }
    }

    #[tokio::test]
    async fn reads_and_the_bypass_carry_their_requests_nonce_and_are_refused_when_it_was_used() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        store.insert_order(&new_order("o1"), GUARD).await.unwrap();
        let read = store
            .spending_nonce("r1", 10, store.order("o1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.map(|o| o.id).as_deref(), Some("o1"));
        let with = store
            .spending_nonce("r2", 10, store.order_with_authorizations("o1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(with.map(|(_, a)| a.len()), Some(1));
        for replayed in [
            store
                .spending_nonce("r1", 10, store.order("o1"))
                .await
                .map(|_| ()),
            store
                .spending_nonce("r2", 10, store.authorization_with_challenges("o1-az"))
                .await
                .map(|_| ()),
        ] {
            assert!(
                matches!(replayed, Err(StoreError::NonceReplayed)),
                "{replayed:?}"
            );
        }
        // The bypass's one statement: spent with it, and a replay moves
        // nothing.
        let bypass = |nonce: &'static str| {
            store.spending_nonce(
                nonce,
                10,
                store.bypass_challenge("o1-ch", "default", &["http-01"], 2, 50, GUARD),
            )
        };
        assert!(matches!(bypass("r1").await, Err(StoreError::NonceReplayed)));
        assert_eq!(
            db.scalar("SELECT COUNT(*) FROM challenges WHERE status = 'pending'")
                .await,
            1,
            "the replayed bypass moved nothing"
        );
        let (ch, _) = bypass("b1").await.unwrap().unwrap().unwrap();
        assert_eq!(
            ch.status,
            acme_proxy_protocol::types::ChallengeStatus::Valid
        );
        if on_postgres() {
            assert!(
                written_together(&db, "b1", "SELECT xmin FROM challenges WHERE id = 'o1-ch'").await,
                "the bypass's statement recorded the nonce"
            );
        }
        assert_eq!(store.used_nonce_count().await.unwrap(), 3);
    }

    #[tokio::test]
    async fn a_write_that_cannot_carry_the_nonce_runs_only_once_it_is_recorded_fresh() {
        let (db, store) = TestDb::open().await;
        let (first, second) = (
            crate::test_support::issued_row("first"),
            crate::test_support::issued_row("second"),
        );
        store
            .spending_nonce("w", 10, store.insert_audit(&first))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(store.used_nonce_count().await.unwrap(), 1);
        if on_postgres() {
            assert!(
                !written_together(&db, "w", "SELECT xmin FROM audit_log").await,
                "recorded by a statement of its own"
            );
        }
        let replayed = store
            .spending_nonce("w", 10, store.insert_audit(&second))
            .await;
        assert!(
            matches!(replayed, Err(StoreError::NonceReplayed)),
            "{replayed:?}"
        );
        // The audit write itself was refused, not only the answer.
        assert_eq!(db.scalar("SELECT COUNT(*) FROM audit_log").await, 1);
        // Work with no statement at all: recorded at its end.
        store.spending_nonce("idle", 10, async {}).await.unwrap();
        assert!(matches!(
            store.spending_nonce("idle", 10, async {}).await,
            Err(StoreError::NonceReplayed)
        ));
    }

    #[tokio::test]
    async fn a_carrying_statement_that_fails_leaves_the_nonce_to_be_recorded_after_it() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        let stale = crate::AccountGuard {
            id: "acct",
            key_thumbprint: "another key",
        };
        let refused = store
            .spending_nonce("f", 10, store.insert_order(&new_order("o1"), stale))
            .await
            .unwrap();
        assert!(
            matches!(refused, Err(StoreError::AccountChanged)),
            "{refused:?}"
        );
        assert_eq!(orders(&db).await, 0);
        assert_eq!(store.used_nonce_count().await.unwrap(), 1, "recorded after");
        assert!(matches!(
            store
                .spending_nonce("f", 10, store.insert_order(&new_order("o1"), GUARD))
                .await,
            Err(StoreError::NonceReplayed)
        ));
        assert_eq!(orders(&db).await, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_nonce_carried_by_many_new_orders_at_once_makes_exactly_one() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        let mut tries = tokio::task::JoinSet::new();
        for i in 0..20 {
            let store = store.clone();
            tries.spawn(async move {
                let order = new_order(&format!("o{i}"));
                store
                    .spending_nonce("same", 10, store.insert_order(&order, GUARD))
                    .await
            });
        }
        let (mut made, mut replayed) = (0, 0);
        while let Some(tried) = tries.join_next().await {
            match tried.unwrap() {
                Ok(Ok(crate::InsertOrder::Inserted(_))) => made += 1,
                Err(StoreError::NonceReplayed) => replayed += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((made, replayed), (1, 19));
        assert_eq!(orders(&db).await, 1);
    }

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

    /// On PostgreSQL: `rider` used while a record's statement waits on
    /// `used_nonces`, so that it queues; then a new order (`order`,
    /// carrying nonce `carrier`) that takes it along; then the lock let go.
    /// The rider's answer and the order's.
    async fn a_rider_on_a_new_order(
        db: &TestDb,
        store: &crate::Store,
        rider: &'static str,
        carrier: &'static str,
        order: &'static str,
    ) -> (crate::Result<bool>, crate::Result<crate::InsertOrder>) {
        let crate::Backend::Postgres(pg) = &store.backend else {
            unreachable!("on PostgreSQL")
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let holder = hold_used_nonces(db).await;
        let first = tokio::spawn({
            let store = store.clone();
            async move { store.use_nonce(&format!("first-{order}"), 10).await }
        });
        while !pg.nonces.pending().writing || !pg.nonces.pending().uses.is_empty() {
            assert!(std::time::Instant::now() < deadline, "no writer took it");
            tokio::task::yield_now().await;
        }
        let queued = tokio::spawn({
            let store = store.clone();
            async move { store.use_nonce(rider, 10).await }
        });
        while pg.nonces.pending().uses.is_empty() {
            assert!(std::time::Instant::now() < deadline, "never queued");
            tokio::task::yield_now().await;
        }
        let carrying = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .spending_nonce(carrier, 10, store.insert_order(&new_order(order), GUARD))
                    .await
            }
        });
        // Taken off the queue by the order's statement, not the writer's:
        // the writer is still inside its statement.
        while !pg.nonces.pending().uses.is_empty() {
            assert!(std::time::Instant::now() < deadline, "never taken along");
            tokio::task::yield_now().await;
        }
        release(holder).await;
        assert!(first.await.unwrap().unwrap());
        let carried = carrying.await.unwrap().map(|inserted| inserted.unwrap());
        (queued.await.unwrap(), carried)
    }

    #[tokio::test]
    async fn on_postgres_a_queued_nonce_use_is_written_by_another_requests_statement() {
        if !on_postgres() {
            return;
        }
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        let (rider, order) = a_rider_on_a_new_order(&db, &store, "rider", "carrier", "o1").await;
        assert!(rider.unwrap(), "the rider was fresh");
        assert!(
            matches!(order, Ok(crate::InsertOrder::Inserted(_))),
            "{order:?}"
        );
        let order_xmin = "SELECT xmin FROM orders WHERE id = 'o1'";
        assert!(written_together(&db, "rider", order_xmin).await);
        assert!(written_together(&db, "carrier", order_xmin).await);
        // Used once only, whichever way it was written.
        assert!(!store.use_nonce("rider", 10).await.unwrap());
    }

    #[tokio::test]
    async fn on_postgres_a_replayed_rider_is_refused_alone_and_the_statement_that_took_it_runs_again()
     {
        if !on_postgres() {
            return;
        }
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        assert!(store.use_nonce("old", 10).await.unwrap());
        let (rider, order) = a_rider_on_a_new_order(&db, &store, "old", "carrier", "o1").await;
        assert!(!rider.unwrap(), "the replayed rider is refused");
        assert!(
            matches!(order, Ok(crate::InsertOrder::Inserted(_))),
            "{order:?}"
        );
        assert!(
            written_together(&db, "carrier", "SELECT xmin FROM orders WHERE id = 'o1'").await,
            "run again, the order's statement still carried its own nonce"
        );
        assert_eq!(orders(&db).await, 1);
        // used: old, first-o1, carrier.
        assert_eq!(store.used_nonce_count().await.unwrap(), 3);
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
