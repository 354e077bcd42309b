//! The job table: enqueue, atomic claims with leases, lease renewal, and
//! settlements guarded on the lease owner. Times are Unix milliseconds.
//!
//! The claim is one statement: on SQLite an `UPDATE … WHERE id IN (SELECT
//! …) RETURNING` under the database write lock, so two runners (even in
//! two processes) never claim one job; on PostgreSQL a function of the
//! schema (migration 0023) that takes an advisory lock and then picks the
//! rows `FOR UPDATE SKIP LOCKED`.

use crate::audit::insert_audit_in;
use crate::db::{Conn, Row, args};
use crate::{NewAuditRow, Result, Store, StoreError, parse_text};

acme_proxy_protocol::string_enum! {
    /// Where a job is in its life: `queued` until claimed, `running` under
    /// a lease, `retiring` while its kind's `abandon` runs, then `done`,
    /// `failed` or `cancelled` for good.
    pub enum JobStatus {
        Queued = "queued",
        Running = "running",
        Retiring = "retiring",
        Done = "done",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRow {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub payload: String,
    pub status: JobStatus,
    pub attempts: i64,
    pub max_attempts: i64,
    pub run_at: i64,
    pub deadline: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<i64>,
    pub last_error: Option<String>,
    pub cancel_requested_by: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

#[derive(Clone, Debug)]
pub struct NewJob<'a> {
    pub kind: &'a str,
    pub key: &'a str,
    pub payload: &'a str,
    pub run_at: i64,
    pub deadline: Option<i64>,
    pub max_attempts: i64,
    /// Whose work this is (a validation: the account's id), for the
    /// per-owner cap of [`Store::claim_jobs`]; `None`: nobody's.
    pub fair_key: Option<&'a str>,
}

/// What `insert_job` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// A new job with this id.
    Queued(i64),
    /// An unfinished job with the same (kind, key) exists; nothing queued.
    AlreadyQueued(i64),
}

impl Enqueued {
    pub fn id(self) -> i64 {
        match self {
            Self::Queued(id) | Self::AlreadyQueued(id) => id,
        }
    }
}

/// Jobs per status, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobCounts {
    pub by_kind_and_status: Vec<(String, String, i64)>,
}

/// Queues a job unless its (kind, key) is live; returns the new id, or no
/// row when it was already queued. The conflict target's condition is the
/// text of the `jobs_live_identity` index's (migration 0007), as is every
/// lookup of a live job's: SQLite matches a partial index by its text.
const INSERT_JOB: &str =
    "INSERT INTO jobs (kind, key, payload, status, attempts, max_attempts, run_at, deadline, created_at, updated_at, fair_key)
     VALUES (?1, ?2, ?3, 'queued', 0, ?4, ?5, ?6, ?7, ?7, ?8)
     ON CONFLICT (kind, key) WHERE (status = 'queued' OR status = 'running' OR status = 'retiring') DO NOTHING
     RETURNING id";

/// [`INSERT_JOB`] for many jobs in one statement on PostgreSQL, each
/// created at its `run_at` as [`insert_jobs_in`] does: the jobs as a JSON
/// array ([`jobs_json`]) in the parameter the macro is given, inserted in
/// its order, only when the CTE `done` (which the statement embedding this
/// defines) says `ok`.
macro_rules! insert_jobs_postgres {
    ($jobs:literal) => {
        concat!(
            "INSERT INTO jobs (kind, key, payload, status, attempts, max_attempts, run_at, deadline, created_at, updated_at, fair_key)
             SELECT x.kind, x.key, x.payload, 'queued', 0, x.max_attempts, x.run_at, x.deadline, x.run_at, x.run_at, x.fair_key
               FROM done, ROWS FROM (jsonb_to_recordset(",
            $jobs,
            "::jsonb) AS (kind text, key text, payload text, max_attempts bigint, run_at bigint,
                                                  deadline bigint, fair_key text))
                    WITH ORDINALITY AS x(kind, key, payload, max_attempts, run_at, deadline, fair_key, n)
              WHERE done.ok
              ORDER BY x.n
             ON CONFLICT (kind, key) WHERE (status = 'queued' OR status = 'running' OR status = 'retiring') DO NOTHING"
        )
    };
}
pub(crate) use insert_jobs_postgres;

/// `jobs` as the JSON array [`insert_jobs_postgres`] reads.
pub(crate) fn jobs_json(jobs: &[NewJob<'_>]) -> String {
    #[derive(serde::Serialize)]
    struct Job<'a> {
        kind: &'a str,
        key: &'a str,
        payload: &'a str,
        max_attempts: i64,
        run_at: i64,
        deadline: Option<i64>,
        fair_key: Option<&'a str>,
    }
    let jobs: Vec<Job<'_>> = jobs
        .iter()
        .map(|j| Job {
            kind: j.kind,
            key: j.key,
            payload: j.payload,
            max_attempts: j.max_attempts,
            run_at: j.run_at,
            deadline: j.deadline,
            fair_key: j.fair_key,
        })
        .collect();
    crate::to_json(&jobs)
}

/// [`INSERT_JOB`] on the caller's connection (inside its transaction, if it
/// has one): the job that belongs to a state change commits with it. The
/// new job's id if queued, `None` if a live job of the same (kind, key)
/// already existed.
pub(crate) async fn insert_job_in(
    conn: &mut Conn<'_>,
    job: &NewJob<'_>,
    now_ms: i64,
) -> Result<Option<i64>> {
    conn.scalar(
        INSERT_JOB,
        args![
            job.kind,
            job.key,
            job.payload,
            job.max_attempts,
            job.run_at,
            job.deadline,
            now_ms,
            job.fair_key,
        ],
    )
    .await
}

/// Queues `jobs` inside the caller's transaction (each at its own `run_at`,
/// which is also its creation time): the change a job reports and the job
/// commit together or not at all. A job whose identity is already queued
/// is skipped, as with [`Store::insert_job`].
pub(crate) async fn insert_jobs_in(conn: &mut Conn<'_>, jobs: &[NewJob<'_>]) -> Result<()> {
    for job in jobs {
        insert_job_in(conn, job, job.run_at).await?;
    }
    Ok(())
}

macro_rules! job_columns {
    () => {
        "id, kind, key, payload, status, attempts, max_attempts, run_at, deadline, lease_owner, \
         lease_until, last_error, cancel_requested_by, created_at, updated_at, finished_at"
    };
}

fn job_from_row(row: Row<'_>) -> Result<JobRow> {
    Ok(JobRow {
        id: row.get("id")?,
        kind: row.get("kind")?,
        key: row.get("key")?,
        payload: row.get("payload")?,
        status: parse_text(&row.get::<String>("status")?, "jobs.status")?,
        attempts: row.get("attempts")?,
        max_attempts: row.get("max_attempts")?,
        run_at: row.get("run_at")?,
        deadline: row.get("deadline")?,
        lease_owner: row.get("lease_owner")?,
        lease_until: row.get("lease_until")?,
        last_error: row.get("last_error")?,
        cancel_requested_by: row.get("cancel_requested_by")?,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
        finished_at: row.get("finished_at")?,
    })
}

/// [`Store::claim_jobs`] on PostgreSQL: the advisory lock that serialises
/// claims across replicas, then the claim, in one function (migration
/// 0023) called by one statement.
const CLAIM_JOBS_POSTGRES: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM acme_claim_jobs(?1, ?2, ?3, ?4, ?5)"
);

/// Wake-ups of the job runners when a process on the same database queues
/// work (PostgreSQL's `LISTEN`; see [`Store::job_wakeups`]).
pub struct JobWakeups {
    listener: sqlx::postgres::PgListener,
}

impl std::fmt::Debug for JobWakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobWakeups").finish_non_exhaustive()
    }
}

/// The channel the `jobs_wake_runners` trigger notifies.
const JOBS_CHANNEL: &str = "acme_proxy_jobs";

impl JobWakeups {
    /// Waits for the next wake-up. A lost connection is one too (what was
    /// queued meanwhile went unheard): the listener reconnects on the next
    /// call, after a pause so that a server that is down is not hammered.
    pub async fn next(&mut self) {
        match self.listener.try_recv().await {
            Ok(Some(_)) => {}
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(event = "jobs.listen_failed", error = %e, "listening for queued jobs failed; polling until it works again");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// What a held job's `last_error` starts with: the mark
/// [`Store::release_held_jobs`] finds it by.
const HELD_PREFIX: &str = "held: ";

/// What a requeued job's attempt count becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempts {
    /// A failed attempt: it counts.
    Keep,
    /// A periodic job's new period, which is not a retry: back to zero.
    Reset,
    /// Held back before it did anything (a budget, a pause): the claim
    /// that counted it is taken back, and without an error of its own the
    /// error of the last attempt that ran stands (what an operator looks
    /// at to see why the job is not done), a held mark excepted.
    Uncount,
}

impl Store {
    /// Queues a job unless an unfinished one with the same (kind, key)
    /// exists (then says so and changes nothing).
    pub async fn insert_job(&self, job: &NewJob<'_>, now: i64) -> Result<Enqueued> {
        let mut conn = self.writer().await?;
        // The live job that refused the insert can finish before it is
        // read (another replica's, on PostgreSQL): then insert again. On
        // SQLite the writer holds both statements together, so the first
        // round decides.
        for _ in 0..3 {
            if let Some(id) = insert_job_in(&mut conn, job, now).await? {
                return Ok(Enqueued::Queued(id));
            }
            let live: Option<i64> = conn.scalar(
                "SELECT id FROM jobs WHERE kind = ?1 AND key = ?2 AND (status = 'queued' OR status = 'running' OR status = 'retiring')",
                args![job.kind, job.key],
            ).await?;
            if let Some(live) = live {
                return Ok(Enqueued::AlreadyQueued(live));
            }
        }
        Err(StoreError::Corrupt(format!(
            "job {} {} neither inserted nor live",
            job.kind, job.key
        )))
    }

    /// Makes a queued job due at `at_ms`, earlier or later than planned
    /// (its producer finished what the job waited for, or was told when to
    /// come back). True if a queued job was found.
    pub async fn schedule_queued_job(
        &self,
        kind: &str,
        key: &str,
        at_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE jobs SET run_at = ?1, updated_at = ?4
             WHERE kind = ?2 AND key = ?3 AND status = 'queued'",
                args![at_ms, kind, key, now_ms],
            )
            .await?
            == 1)
    }

    /// Claims due jobs (and jobs whose lease ran out) for `owner`, oldest
    /// first within each kind: at most `free[kind]` of each kind listed,
    /// and of the jobs that name a `fair_key`, no more than make
    /// `per_key_cap` running at once for that (kind, key) — those already
    /// running, by any runner, counted; a cancellation or an abandon
    /// (`retiring`) is never held back by the cap. One statement under SQLite's write
    /// lock, so two runners never claim the same job. Each kind is ranked
    /// after the per-key cap is applied: one owner's queued backlog cannot
    /// push another's jobs out of the kind's free slots.
    pub async fn claim_jobs(
        &self,
        owner: &str,
        free: &[(&str, usize)],
        now: i64,
        lease_ms: i64,
        per_key_cap: i64,
    ) -> Result<Vec<JobRow>> {
        let limits: serde_json::Map<String, serde_json::Value> = free
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(kind, n)| ((*kind).to_owned(), serde_json::Value::from(*n)))
            .collect();
        if limits.is_empty() {
            return Ok(Vec::new());
        }
        let limits = serde_json::Value::Object(limits).to_string();
        let args = args![owner, now, lease_ms, limits, per_key_cap];
        let mut conn = self.writer().await?;
        if conn.is_postgres() {
            // Claims are serialised across replicas (one statement each,
            // milliseconds) so that the per-key cap counts every replica's
            // claims; the rows themselves are locked as they are taken.
            return conn.all(CLAIM_JOBS_POSTGRES, args, job_from_row).await;
        }
        conn.all(
            concat!(
                "UPDATE jobs SET
                 status = CASE WHEN status = 'retiring' THEN 'retiring' ELSE 'running' END,
                 attempts = CASE WHEN status = 'retiring' OR cancel_requested_by IS NOT NULL
                                 THEN attempts ELSE attempts + 1 END,
                 lease_owner = ?1, lease_until = ?2 + ?3, updated_at = ?2
             WHERE id IN (
                 SELECT id FROM (
                     SELECT e.id, e.kind,
                            ROW_NUMBER() OVER (PARTITION BY e.kind ORDER BY e.run_at, e.id) AS kind_rank
                     FROM (
                         SELECT j.id, j.kind, j.run_at, j.fair_key, j.status, j.cancel_requested_by,
                                ROW_NUMBER() OVER (PARTITION BY j.kind, j.fair_key ORDER BY j.run_at, j.id) AS key_rank
                         FROM jobs j
                         WHERE j.kind IN (SELECT key FROM json_each(?4))
                           AND ((j.status = 'queued' AND (j.run_at <= ?2 OR j.cancel_requested_by IS NOT NULL))
                                OR (j.status IN ('running', 'retiring') AND j.lease_until <= ?2))
                     ) e
                     -- A cancellation or an abandon is not held back by the cap.
                     WHERE e.fair_key IS NULL OR e.status = 'retiring' OR e.cancel_requested_by IS NOT NULL
                        OR e.key_rank + (SELECT COUNT(*) FROM jobs r
                                         WHERE r.status = 'running' AND r.kind = e.kind
                                           AND r.fair_key = e.fair_key AND r.lease_until > ?2) <= ?5
                 )
                 -- The kind quoted in the path: kinds may hold dots.
                 WHERE kind_rank <= json_extract(?4, '$.\"' || kind || '\"'))
             RETURNING ",
                job_columns!()
            ),
            args,
            job_from_row,
        ).await
    }

    /// Wake-ups for this process's job runner when any process on the
    /// database queues work: `None` on SQLite, where a runner is woken by
    /// its own process and polls for the others'.
    pub async fn job_wakeups(&self) -> Result<Option<JobWakeups>> {
        let Some(pool) = self.postgres_pool() else {
            return Ok(None);
        };
        let mut listener = sqlx::postgres::PgListener::connect_with(pool)
            .await
            .map_err(StoreError::Pg)?;
        listener
            .listen(JOBS_CHANNEL)
            .await
            .map_err(StoreError::Pg)?;
        Ok(Some(JobWakeups { listener }))
    }

    /// Extends a lease (the heartbeat). `None` if `owner` no longer holds
    /// the job; otherwise whether an operator asked to cancel it.
    pub async fn renew_job_lease(
        &self,
        id: i64,
        owner: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<Option<Option<String>>> {
        self.writer()
            .await?
            .one(
                "UPDATE jobs SET lease_until = ?1 + ?2, updated_at = ?1
             WHERE id = ?3 AND lease_owner = ?4 AND status IN ('running', 'retiring')
             RETURNING cancel_requested_by",
                args![now, lease_ms, id, owner],
                |row| row.get::<Option<String>>(0),
            )
            .await
    }

    /// running → done, if `owner` still holds the job. A job that
    /// succeeded keeps no error of an earlier attempt.
    pub async fn finish_job(&self, id: i64, owner: &str, now: i64) -> Result<bool> {
        Ok(self.writer().await?.exec(
            "UPDATE jobs SET status = 'done', finished_at = ?1, updated_at = ?1, lease_owner = NULL, lease_until = NULL, last_error = NULL
             WHERE id = ?2 AND lease_owner = ?3 AND status = 'running'",
            args![now, id, owner],
        ).await? == 1)
    }

    /// running → queued for another attempt at `run_at`, if `owner` still
    /// holds the job, its attempts as `attempts` says.
    pub async fn requeue_job(
        &self,
        id: i64,
        owner: &str,
        now: i64,
        run_at: i64,
        error: Option<&str>,
        attempts: Attempts,
    ) -> Result<bool> {
        let attempts: i64 = match attempts {
            Attempts::Keep => 0,
            Attempts::Reset => 1,
            Attempts::Uncount => 2,
        };
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE jobs SET status = 'queued', run_at = ?1, updated_at = ?3,
                 last_error = CASE WHEN ?4 = 2 AND ?2 IS NULL
                                        AND substr(last_error, 1, length(?7)) <> ?7
                                   THEN last_error ELSE ?2 END,
                 lease_owner = NULL, lease_until = NULL,
                 attempts = CASE ?4 WHEN 1 THEN 0
                                    WHEN 2 THEN (CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END)
                                    ELSE attempts END
             WHERE id = ?5 AND lease_owner = ?6 AND status = 'running'",
                args![run_at, error, now, attempts, id, owner, HELD_PREFIX],
            )
            .await?
            == 1)
    }

    /// running → queued at `run_at`, its claim uncounted, for a job that
    /// waits for the configuration (its profile not mounted, say) rather
    /// than for time to pass. It is marked held, with `reason`, so that a
    /// new configuration can make it due at once
    /// ([`Store::release_held_jobs`]).
    pub async fn hold_job(
        &self,
        id: i64,
        owner: &str,
        now: i64,
        run_at: i64,
        reason: &str,
    ) -> Result<bool> {
        let marked = format!("{HELD_PREFIX}{reason}");
        self.requeue_job(id, owner, now, run_at, Some(&marked), Attempts::Uncount)
            .await
    }

    /// Makes every held job ([`Store::hold_job`]) due at `now`, on every
    /// replica (PostgreSQL's wake-up trigger fires), and says how many:
    /// after a reload what they waited for may be there. One still
    /// waiting is held again, costing one look and no attempt.
    pub async fn release_held_jobs(&self, now: i64) -> Result<u64> {
        // Compared exactly: SQLite's LIKE would ignore ASCII case.
        self.writer()
            .await?
            .exec(
                "UPDATE jobs SET run_at = ?1, updated_at = ?1
                 WHERE status = 'queued' AND run_at > ?1 AND substr(last_error, 1, length(?2)) = ?2",
                args![now, HELD_PREFIX],
            )
            .await
    }

    /// running → retiring with its reason, if `owner` still holds the job.
    /// Exactly one runner wins this, so exactly one runs `abandon`.
    pub async fn begin_retire_job(
        &self,
        id: i64,
        owner: &str,
        now: i64,
        reason: &str,
    ) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE jobs SET status = 'retiring', last_error = ?1, updated_at = ?2
             WHERE id = ?3 AND lease_owner = ?4 AND status = 'running'",
                args![reason, now, id, owner],
            )
            .await?
            == 1)
    }

    /// retiring → failed (or cancelled) once `abandon` has run.
    pub async fn finish_retire_job(
        &self,
        id: i64,
        owner: &str,
        now: i64,
        cancelled: bool,
    ) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE jobs SET status = CASE WHEN ?1 THEN 'cancelled' ELSE 'failed' END,
                 finished_at = ?2, updated_at = ?2, lease_owner = NULL, lease_until = NULL
             WHERE id = ?3 AND lease_owner = ?4 AND status = 'retiring'",
                args![cancelled, now, id, owner],
            )
            .await?
            == 1)
    }

    /// Gives a held job back at shutdown: a running job is queued again
    /// without counting the interrupted attempt; a retiring one becomes
    /// claimable at once.
    pub async fn release_job(&self, id: i64, owner: &str, now: i64) -> Result<bool> {
        Ok(self.writer().await?.exec(
            "UPDATE jobs SET
                 status = CASE WHEN status = 'running' THEN 'queued' ELSE status END,
                 attempts = CASE WHEN status = 'running' AND attempts > 0 THEN attempts - 1 ELSE attempts END,
                 run_at = CASE WHEN status = 'running' THEN ?1 ELSE run_at END,
                 lease_owner = NULL,
                 lease_until = CASE WHEN status = 'running' THEN NULL ELSE ?1 END,
                 updated_at = ?1
             WHERE id = ?2 AND lease_owner = ?3 AND status IN ('running', 'retiring')",
            args![now, id, owner],
        ).await? == 1)
    }

    /// Takes back the attempt a claim counted, when `owner` claimed a job
    /// whose attempt it is still running (its lease had lapsed): the
    /// claim renewed the lease and starts nothing. False if `owner` does
    /// not hold it running.
    pub async fn uncount_claim(&self, id: i64, owner: &str) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE jobs SET attempts = attempts - 1
                 WHERE id = ?1 AND lease_owner = ?2 AND status = 'running' AND attempts > 0
                   AND cancel_requested_by IS NULL",
                args![id, owner],
            )
            .await?
            == 1)
    }

    pub async fn job(&self, id: i64) -> Result<Option<JobRow>> {
        self.reader()
            .await?
            .one(
                concat!("SELECT ", job_columns!(), " FROM jobs WHERE id = ?1"),
                args![id],
                job_from_row,
            )
            .await
    }

    /// The unfinished job of (kind, key), if any.
    pub async fn live_job(&self, kind: &str, key: &str) -> Result<Option<JobRow>> {
        self.reader().await?.one(
            concat!(
                "SELECT ",
                job_columns!(),
                " FROM jobs WHERE kind = ?1 AND key = ?2 AND (status = 'queued' OR status = 'running' OR status = 'retiring')"
            ),
            args![kind, key],
            job_from_row,
        ).await
    }

    /// Jobs, newest first, optionally filtered.
    pub async fn list_jobs(
        &self,
        kind: Option<&str>,
        status: Option<JobStatus>,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<JobRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    job_columns!(),
                    " FROM jobs WHERE (?1 IS NULL OR kind = ?1) AND (?2 IS NULL OR status = ?2)
                   AND (?3 IS NULL OR id < ?3) ORDER BY id DESC LIMIT ?4"
                ),
                args![kind, status.map(JobStatus::as_str), before, limit],
                job_from_row,
            )
            .await
    }

    /// Asks for a queued or running job to be cancelled; the runner holding
    /// it (or the next to claim it) stops it and runs its `abandon`. False
    /// if the job is unknown, finished, or already being retired.
    pub async fn request_job_cancel(
        &self,
        id: i64,
        actor: &str,
        now: i64,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = tx
            .exec(
                "UPDATE jobs SET cancel_requested_by = ?1, updated_at = ?2
             WHERE id = ?3 AND status IN ('queued', 'running')",
                args![actor, now, id],
            )
            .await?
            == 1;
        if changed {
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// An operator's retry: a failed or cancelled job is queued again with
    /// its attempts reset (unless another job of its identity is live); a
    /// queued one is made due now. False otherwise.
    pub async fn retry_job(&self, id: i64, now: i64, audit: &NewAuditRow<'_>) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let result = tx.exec(
            "UPDATE jobs SET status = 'queued', attempts = CASE WHEN status = 'queued' THEN attempts ELSE 0 END,
                 run_at = ?1, finished_at = NULL, updated_at = ?1,
                 -- A queued job keeps a pending cancellation: retry is not undo.
                 cancel_requested_by = CASE WHEN status = 'queued' THEN cancel_requested_by ELSE NULL END
             WHERE id = ?2 AND status IN ('queued', 'failed', 'cancelled')",
            args![now, id],
        ).await;
        let changed = match result {
            Ok(changed) => changed == 1,
            // The partial unique index: a newer job of this identity is
            // live. Nothing was written (the transaction is dropped).
            Err(e) if e.is_unique_violation() => return Ok(false),
            Err(e) => return Err(e),
        };
        if changed {
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Deletes jobs finished before `before`; returns how many.
    pub async fn delete_finished_jobs(&self, before: i64) -> Result<u64> {
        Ok(self
            .writer()
            .await?
            .exec(
                "DELETE FROM jobs WHERE finished_at IS NOT NULL AND finished_at < ?1",
                args![before],
            )
            .await? as u64)
    }

    /// Jobs per (kind, status), for the queue-depth metrics.
    pub async fn job_counts(&self) -> Result<JobCounts> {
        let rows: Vec<(String, String, i64)> = self.reader().await?.all(
            "SELECT kind, status, COUNT(*) FROM jobs GROUP BY kind, status ORDER BY kind, status",
            &[],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        ).await?;
        Ok(JobCounts {
            by_kind_and_status: rows,
        })
    }
}
