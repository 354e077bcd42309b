//! Periodic work as self-rescheduling jobs on the same queue: each handler's
//! `recover` queues its one job at start-up (the identity key makes that
//! idempotent across restarts and replicas), and each run ends with
//! `Reschedule`. A failing run logs and reschedules too, and periodic jobs
//! get an effectively unbounded number of attempts, so only an operator's
//! `job cancel` retires one (until the next start queues it again).
//!
//! This module holds the queue's own housekeeping and the helpers; periodic
//! work of other subsystems lives with them (`authority::maintenance`).

use std::time::Duration;

use acme_proxy_store::JobRow;

use super::{BoxFuture, JobHandler, JobSpec, Outcome, Queue, RetireReason};
use crate::clock::SharedClock;

/// The identity key of every periodic job: one per kind.
pub const PERIODIC_KEY: &str = "periodic";

/// Attempts of a periodic job: enough never to run out.
const PERIODIC_ATTEMPTS: u32 = 1_000_000;

pub fn queue_periodic<'a>(
    queue: &'a Queue,
    kind: &'static str,
) -> BoxFuture<'a, Result<(), String>> {
    Box::pin(async move {
        let mut spec = JobSpec::new(kind, PERIODIC_KEY, serde_json::json!({}));
        // Periodic work must not retire itself after a run of bad luck.
        spec.max_attempts = Some(PERIODIC_ATTEMPTS);
        queue
            .enqueue(spec)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

pub fn log_abandon(kind: &'static str, reason: &RetireReason) {
    tracing::warn!(
        event = "job.periodic_retired",
        outcome = "failure",
        kind,
        reason = %reason,
        "periodic job retired; it is queued again at the next start"
    );
}

/// What a retention sweep deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retained {
    /// Finished jobs older than `jobs.retention` (`job_retention`).
    FinishedJobs,
    /// Audit rows older than `audit.retention` (`audit_retention`; none
    /// while it is unset: by default the audit trail is kept for ever).
    AuditRows,
}

/// Deletes what is older than its retention, every `every`.
#[derive(Debug)]
pub struct Retention {
    pub of: Retained,
    pub clock: SharedClock,
    pub store: acme_proxy_store::Store,
    /// The retention of the current configuration (a reload may change
    /// it); None keeps everything.
    pub retention: tokio::sync::watch::Receiver<Option<Duration>>,
    pub every: Duration,
}

impl JobHandler for Retention {
    fn kind(&self) -> &'static str {
        match self.of {
            Retained::FinishedJobs => super::JobKind::JobRetention.as_str(),
            Retained::AuditRows => super::JobKind::AuditRetention.as_str(),
        }
    }

    fn run<'a>(&'a self, _job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let Some(retention) = *self.retention.borrow() else {
                return Outcome::Reschedule(self.clock.now() + self.every);
            };
            let deleted = match self.of {
                // Job times are milliseconds, audit times seconds.
                Retained::FinishedJobs => {
                    let before = self.clock.unix_ms() - retention.as_millis() as i64;
                    self.store.delete_finished_jobs(before).await
                }
                Retained::AuditRows => {
                    let before = self.clock.unix() - retention.as_secs() as i64;
                    self.store.delete_audit_before(before).await
                }
            };
            match deleted {
                Ok(n) => tracing::info!(
                    event = "retention",
                    outcome = "success",
                    kind = self.kind(),
                    deleted = n,
                    "rows past retention deleted"
                ),
                Err(e) => {
                    tracing::error!(event = "retention", outcome = "failure", kind = self.kind(), error = %e, "retention sweep failed")
                }
            }
            Outcome::Reschedule(self.clock.now() + self.every)
        })
    }

    fn abandon<'a>(
        &'a self,
        _job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        log_abandon(self.kind(), reason);
        Box::pin(async { Ok(()) })
    }

    fn recover<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), String>> {
        queue_periodic(queue, self.kind())
    }
}
