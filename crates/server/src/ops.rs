//! The operators' operation layer: what the admin CLI (and, later, the web
//! admin) can do, as plain functions over the store. Front ends only parse
//! arguments and format results.

use acme_proxy_store::{JobRow, Store, StoreError};
use serde::Serialize;

use crate::clock::{Clock, rfc3339};

/// A job as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub status: String,
    pub attempts: i64,
    pub max_attempts: i64,
    pub run_at: String,
    pub deadline: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<String>,
    pub last_error: Option<String>,
    pub cancel_requested_by: Option<String>,
    pub created_at: String,
    pub finished_at: Option<String>,
    pub payload: serde_json::Value,
}

fn ms(t: i64) -> String {
    rfc3339(t.div_euclid(1000))
}

impl From<JobRow> for JobView {
    fn from(j: JobRow) -> Self {
        Self {
            id: j.id,
            kind: j.kind,
            key: j.key,
            status: j.status,
            attempts: j.attempts,
            max_attempts: j.max_attempts,
            run_at: ms(j.run_at),
            deadline: j.deadline.map(ms),
            lease_owner: j.lease_owner,
            lease_until: j.lease_until.map(ms),
            last_error: j.last_error,
            cancel_requested_by: j.cancel_requested_by,
            created_at: ms(j.created_at),
            finished_at: j.finished_at.map(ms),
            payload: serde_json::from_str(&j.payload)
                .unwrap_or(serde_json::Value::String(j.payload)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("no job with id {0}")]
    NoSuchJob(i64),
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub async fn list_jobs(
    store: &Store,
    kind: Option<&str>,
    status: Option<&str>,
    limit: i64,
) -> Result<Vec<JobView>, OpsError> {
    Ok(store
        .list_jobs(kind, status, limit)
        .await?
        .into_iter()
        .map(JobView::from)
        .collect())
}

pub async fn show_job(store: &Store, id: i64) -> Result<JobView, OpsError> {
    store
        .job(id)
        .await?
        .map(JobView::from)
        .ok_or(OpsError::NoSuchJob(id))
}

/// Queues a failed or cancelled job again (attempts reset), or makes a
/// queued one due now.
pub async fn retry_job(store: &Store, clock: &dyn Clock, id: i64) -> Result<JobView, OpsError> {
    let job = show_job(store, id).await?;
    if !store.retry_job(id, clock.unix_ms()).await? {
        return Err(OpsError::Refused(format!(
            "job {id} is {}; only failed, cancelled or queued jobs can be retried (and not while another job of the same kind and key is live)",
            job.status
        )));
    }
    tracing::info!(event = "job.retry_requested", outcome = "success", id, kind = %job.kind, "operator retried a job");
    show_job(store, id).await
}

/// Asks for a job to be cancelled: the runner that holds it stops the
/// attempt, or the next runner to claim it does, and runs its `abandon`
/// naming `actor`.
pub async fn cancel_job(
    store: &Store,
    clock: &dyn Clock,
    id: i64,
    actor: &str,
) -> Result<JobView, OpsError> {
    let job = show_job(store, id).await?;
    if !store.request_job_cancel(id, actor, clock.unix_ms()).await? {
        return Err(OpsError::Refused(format!(
            "job {id} is {} and cannot be cancelled",
            job.status
        )));
    }
    tracing::info!(event = "job.cancel_requested", outcome = "success", id, kind = %job.kind, actor, "operator cancelled a job");
    show_job(store, id).await
}
