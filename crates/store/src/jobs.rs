//! The job table: enqueue, atomic claims with leases, lease renewal, and
//! settlements guarded on the lease owner (SYSTEM.md "The job queue
//! contract"). Times are Unix milliseconds.
//!
//! The claim is one `UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING`: on
//! SQLite the statement runs under the database write lock, so two runners
//! (even in two processes) never claim one job; on PostgreSQL the inner
//! `SELECT` becomes `FOR UPDATE SKIP LOCKED`.

use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::{Result, Store};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRow {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub payload: String,
    pub status: String,
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
/// row when it was already queued.
const INSERT_JOB: &str =
    "INSERT INTO jobs (kind, key, payload, status, attempts, max_attempts, run_at, deadline, created_at, updated_at)
     VALUES ($1, $2, $3, 'queued', 0, $4, $5, $6, $7, $7)
     ON CONFLICT (kind, key) WHERE status IN ('queued', 'running', 'retiring') DO NOTHING
     RETURNING id";

/// [`INSERT_JOB`] inside the caller's transaction (or on a pool): the job
/// that belongs to a state change commits with it. True if queued, false if
/// a live job of the same (kind, key) already existed.
pub(crate) async fn insert_job_in<'e, E>(
    executor: E,
    job: &NewJob<'_>,
    now_ms: i64,
) -> Result<Option<i64>>
where
    E: sqlx::Executor<'e, Database = sqlx::Sqlite>,
{
    Ok(sqlx::query_scalar(INSERT_JOB)
        .bind(job.kind)
        .bind(job.key)
        .bind(job.payload)
        .bind(job.max_attempts)
        .bind(job.run_at)
        .bind(job.deadline)
        .bind(now_ms)
        .fetch_optional(executor)
        .await?)
}

/// Queues `jobs` inside the caller's transaction (each at its own `run_at`,
/// which is also its creation time): the change a job reports and the job
/// commit together or not at all. A job whose identity is already queued
/// is skipped, as with [`Store::insert_job`].
pub(crate) async fn insert_jobs_in(
    conn: &mut sqlx::SqliteConnection,
    jobs: &[NewJob<'_>],
) -> Result<()> {
    for job in jobs {
        insert_job_in(&mut *conn, job, job.run_at).await?;
    }
    Ok(())
}

macro_rules! job_columns {
    () => {
        "id, kind, key, payload, status, attempts, max_attempts, run_at, deadline, lease_owner, \
         lease_until, last_error, cancel_requested_by, created_at, updated_at, finished_at"
    };
}

fn job_from_row(row: &SqliteRow) -> Result<JobRow> {
    Ok(JobRow {
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        key: row.try_get("key")?,
        payload: row.try_get("payload")?,
        status: row.try_get("status")?,
        attempts: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        run_at: row.try_get("run_at")?,
        deadline: row.try_get("deadline")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_until: row.try_get("lease_until")?,
        last_error: row.try_get("last_error")?,
        cancel_requested_by: row.try_get("cancel_requested_by")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}

impl Store {
    /// Queues a job unless an unfinished one with the same (kind, key)
    /// exists (then says so and changes nothing).
    pub async fn insert_job(&self, job: &NewJob<'_>, now: i64) -> Result<Enqueued> {
        let inserted = insert_job_in(&mut *self.writer().await?, job, now).await?;
        if let Some(id) = inserted {
            return Ok(Enqueued::Queued(id));
        }
        let live: i64 = sqlx::query_scalar(
            "SELECT id FROM jobs WHERE kind = $1 AND key = $2 AND status IN ('queued', 'running', 'retiring')",
        )
        .bind(job.kind)
        .bind(job.key)
        .fetch_one(&mut *self.writer().await?)
        .await?;
        Ok(Enqueued::AlreadyQueued(live))
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
        Ok(sqlx::query(
            "UPDATE jobs SET run_at = $1, updated_at = $4
             WHERE kind = $2 AND key = $3 AND status = 'queued'",
        )
        .bind(at_ms)
        .bind(kind)
        .bind(key)
        .bind(now_ms)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
    }

    /// Claims up to `limit` jobs of `kinds` for `owner`: queued jobs that are
    /// due (or whose cancellation was requested), and jobs whose lease ran
    /// out (their runner died). A queued or reclaimed running job counts
    /// one more attempt; a reclaimed `retiring` job stays retiring so that
    /// its abandon runs again.
    pub async fn claim_jobs(
        &self,
        owner: &str,
        kinds: &[&str],
        now: i64,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<JobRow>> {
        let kinds = serde_json::to_string(kinds).unwrap_or_else(|_| "[]".to_owned());
        let rows = sqlx::query(concat!(
            "UPDATE jobs SET
                 status = CASE WHEN status = 'retiring' THEN 'retiring' ELSE 'running' END,
                 attempts = CASE WHEN status = 'retiring' OR cancel_requested_by IS NOT NULL
                                 THEN attempts ELSE attempts + 1 END,
                 lease_owner = $1, lease_until = $2 + $3, updated_at = $2
             WHERE id IN (
                 SELECT id FROM jobs
                 WHERE kind IN (SELECT value FROM json_each($4))
                   AND ((status = 'queued' AND (run_at <= $2 OR cancel_requested_by IS NOT NULL))
                        OR (status IN ('running', 'retiring') AND lease_until <= $2))
                 ORDER BY run_at, id
                 LIMIT $5)
             RETURNING ",
            job_columns!()
        ))
        .bind(owner)
        .bind(now)
        .bind(lease_ms)
        .bind(kinds)
        .bind(limit)
        .fetch_all(&mut *self.writer().await?)
        .await?;
        rows.iter().map(job_from_row).collect()
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
        let row: Option<(Option<String>,)> = sqlx::query_as(
            "UPDATE jobs SET lease_until = $1 + $2, updated_at = $1
             WHERE id = $3 AND lease_owner = $4 AND status IN ('running', 'retiring')
             RETURNING cancel_requested_by",
        )
        .bind(now)
        .bind(lease_ms)
        .bind(id)
        .bind(owner)
        .fetch_optional(&mut *self.writer().await?)
        .await?;
        Ok(row.map(|(c,)| c))
    }

    /// running → done, if `owner` still holds the job.
    pub async fn finish_job(&self, id: i64, owner: &str, now: i64) -> Result<bool> {
        Ok(sqlx::query(
            "UPDATE jobs SET status = 'done', finished_at = $1, updated_at = $1, lease_owner = NULL, lease_until = NULL
             WHERE id = $2 AND lease_owner = $3 AND status = 'running'",
        )
        .bind(now)
        .bind(id)
        .bind(owner)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
    }

    /// running → queued for another attempt at `run_at`, if `owner` still
    /// holds the job. `reset_attempts` is for periodic jobs rescheduling
    /// themselves (a new period is not a retry).
    pub async fn requeue_job(
        &self,
        id: i64,
        owner: &str,
        now: i64,
        run_at: i64,
        error: Option<&str>,
        reset_attempts: bool,
    ) -> Result<bool> {
        Ok(sqlx::query(
            "UPDATE jobs SET status = 'queued', run_at = $1, last_error = $2, updated_at = $3,
                 lease_owner = NULL, lease_until = NULL,
                 attempts = CASE WHEN $4 THEN 0 ELSE attempts END
             WHERE id = $5 AND lease_owner = $6 AND status = 'running'",
        )
        .bind(run_at)
        .bind(error)
        .bind(now)
        .bind(reset_attempts)
        .bind(id)
        .bind(owner)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
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
        Ok(sqlx::query(
            "UPDATE jobs SET status = 'retiring', last_error = $1, updated_at = $2
             WHERE id = $3 AND lease_owner = $4 AND status = 'running'",
        )
        .bind(reason)
        .bind(now)
        .bind(id)
        .bind(owner)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
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
        Ok(sqlx::query(
            "UPDATE jobs SET status = CASE WHEN $1 THEN 'cancelled' ELSE 'failed' END,
                 finished_at = $2, updated_at = $2, lease_owner = NULL, lease_until = NULL
             WHERE id = $3 AND lease_owner = $4 AND status = 'retiring'",
        )
        .bind(cancelled)
        .bind(now)
        .bind(id)
        .bind(owner)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
    }

    /// Gives a held job back at shutdown: a running job is queued again
    /// without counting the interrupted attempt; a retiring one becomes
    /// claimable at once.
    pub async fn release_job(&self, id: i64, owner: &str, now: i64) -> Result<bool> {
        Ok(sqlx::query(
            "UPDATE jobs SET
                 status = CASE WHEN status = 'running' THEN 'queued' ELSE status END,
                 attempts = CASE WHEN status = 'running' AND attempts > 0 THEN attempts - 1 ELSE attempts END,
                 run_at = CASE WHEN status = 'running' THEN $1 ELSE run_at END,
                 lease_owner = NULL,
                 lease_until = CASE WHEN status = 'running' THEN NULL ELSE $1 END,
                 updated_at = $1
             WHERE id = $2 AND lease_owner = $3 AND status IN ('running', 'retiring')",
        )
        .bind(now)
        .bind(id)
        .bind(owner)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
    }

    pub async fn job(&self, id: i64) -> Result<Option<JobRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// The unfinished job of (kind, key), if any.
    pub async fn live_job(&self, kind: &str, key: &str) -> Result<Option<JobRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE kind = $1 AND key = $2 AND status IN ('queued', 'running', 'retiring')"
        ))
        .bind(kind)
        .bind(key)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// Jobs, newest first, optionally filtered.
    pub async fn list_jobs(
        &self,
        kind: Option<&str>,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<JobRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE ($1 IS NULL OR kind = $1) AND ($2 IS NULL OR status = $2) ORDER BY id DESC LIMIT $3"
        ))
        .bind(kind)
        .bind(status)
        .bind(limit)
        .fetch_all(&mut *self.reader().await?)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// Asks for a queued or running job to be cancelled; the runner holding
    /// it (or the next to claim it) stops it and runs its `abandon`. False
    /// if the job is unknown, finished, or already being retired.
    pub async fn request_job_cancel(&self, id: i64, actor: &str, now: i64) -> Result<bool> {
        Ok(sqlx::query(
            "UPDATE jobs SET cancel_requested_by = $1, updated_at = $2
             WHERE id = $3 AND status IN ('queued', 'running')",
        )
        .bind(actor)
        .bind(now)
        .bind(id)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
    }

    /// An operator's retry: a failed or cancelled job is queued again with
    /// its attempts reset (unless another job of its identity is live); a
    /// queued one is made due now. False otherwise.
    pub async fn retry_job(&self, id: i64, now: i64) -> Result<bool> {
        let result = sqlx::query(
            "UPDATE jobs SET status = 'queued', attempts = CASE WHEN status = 'queued' THEN attempts ELSE 0 END,
                 run_at = $1, finished_at = NULL, updated_at = $1,
                 -- A queued job keeps a pending cancellation: retry is not undo.
                 cancel_requested_by = CASE WHEN status = 'queued' THEN cancel_requested_by ELSE NULL END
             WHERE id = $2 AND status IN ('queued', 'failed', 'cancelled')",
        )
        .bind(now)
        .bind(id)
        .execute(&mut *self.writer().await?)
        .await;
        match result {
            Ok(r) => Ok(r.rows_affected() == 1),
            // The partial unique index: a newer job of this identity is live.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes jobs finished before `before`; returns how many.
    pub async fn delete_finished_jobs(&self, before: i64) -> Result<u64> {
        Ok(
            sqlx::query("DELETE FROM jobs WHERE finished_at IS NOT NULL AND finished_at < $1")
                .bind(before)
                .execute(&mut *self.writer().await?)
                .await?
                .rows_affected(),
        )
    }

    /// Jobs per (kind, status), for the queue-depth metrics.
    pub async fn job_counts(&self) -> Result<JobCounts> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT kind, status, COUNT(*) FROM jobs GROUP BY kind, status ORDER BY kind, status",
        )
        .fetch_all(&mut *self.reader().await?)
        .await?;
        Ok(JobCounts {
            by_kind_and_status: rows,
        })
    }
}
