//! Periodic work as self-rescheduling jobs on the same queue: each handler's
//! `recover` queues its one job at start-up (the identity key makes that
//! idempotent across restarts and replicas), and each run ends with
//! `Reschedule`. A failing run logs and reschedules too: periodic work is
//! never retired, so it cannot silently stop.

use std::sync::Arc;
use std::time::Duration;

use acme_proxy_store::JobRow;

use super::{BoxFuture, JobHandler, JobSpec, Outcome, Queue, RetireReason};
use crate::authority::Authority;
use crate::clock::SharedClock;

/// The identity key of every periodic job: one per kind.
pub const PERIODIC_KEY: &str = "periodic";

fn queue_periodic<'a>(queue: &'a Queue, kind: &'static str) -> BoxFuture<'a, Result<(), String>> {
    Box::pin(async move {
        queue
            .enqueue(JobSpec::new(kind, PERIODIC_KEY, serde_json::json!({})))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

fn log_abandon(kind: &'static str, reason: &RetireReason) {
    tracing::warn!(
        event = "job.periodic_retired",
        outcome = "failure",
        kind,
        reason = %reason,
        "periodic job retired; it is queued again at the next start"
    );
}

/// Deletes expired nonces (RFC 8555 §6.5 nonces are single-use and short-lived).
#[derive(Debug)]
pub struct NonceSweep {
    pub authority: Arc<Authority>,
    pub every: Duration,
}

impl JobHandler for NonceSweep {
    fn kind(&self) -> &'static str {
        "nonce_sweep"
    }

    fn run<'a>(&'a self, _job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let clock = &self.authority.clock;
            match self.authority.store.sweep_nonces(clock.unix()).await {
                Ok(n) => tracing::debug!(
                    event = "nonce.sweep",
                    outcome = "success",
                    deleted = n,
                    "expired nonces deleted"
                ),
                Err(e) => {
                    tracing::error!(event = "nonce.sweep", outcome = "failure", error = %e, "nonce sweep failed")
                }
            }
            Outcome::Reschedule(clock.now() + self.every)
        })
    }

    fn abandon<'a>(&'a self, _job: &'a JobRow, reason: &'a RetireReason) -> BoxFuture<'a, ()> {
        log_abandon(self.kind(), reason);
        Box::pin(async {})
    }

    fn recover<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), String>> {
        queue_periodic(queue, self.kind())
    }
}

/// Re-signs CRLs past half their life (RFC 5280 §5: never let nextUpdate pass).
#[derive(Debug)]
pub struct CrlRefresh {
    pub authority: Arc<Authority>,
    pub every: Duration,
}

impl JobHandler for CrlRefresh {
    fn kind(&self) -> &'static str {
        "crl_refresh"
    }

    fn run<'a>(&'a self, _job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            self.authority.refresh_stale_crls().await;
            Outcome::Reschedule(self.authority.clock.now() + self.every)
        })
    }

    fn abandon<'a>(&'a self, _job: &'a JobRow, reason: &'a RetireReason) -> BoxFuture<'a, ()> {
        log_abandon(self.kind(), reason);
        Box::pin(async {})
    }

    fn recover<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), String>> {
        queue_periodic(queue, self.kind())
    }
}

/// Deletes finished jobs older than the configured retention.
#[derive(Debug)]
pub struct JobRetention {
    pub clock: SharedClock,
    pub store: acme_proxy_store::Store,
    pub retention: Duration,
    pub every: Duration,
}

impl JobHandler for JobRetention {
    fn kind(&self) -> &'static str {
        "job_retention"
    }

    fn run<'a>(&'a self, _job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let before = self.clock.unix_ms() - self.retention.as_millis() as i64;
            match self.store.delete_finished_jobs(before).await {
                Ok(n) => tracing::info!(
                    event = "job.retention",
                    outcome = "success",
                    deleted = n,
                    "finished jobs past retention deleted"
                ),
                Err(e) => {
                    tracing::error!(event = "job.retention", outcome = "failure", error = %e, "job retention failed")
                }
            }
            Outcome::Reschedule(self.clock.now() + self.every)
        })
    }

    fn abandon<'a>(&'a self, _job: &'a JobRow, reason: &'a RetireReason) -> BoxFuture<'a, ()> {
        log_abandon(self.kind(), reason);
        Box::pin(async {})
    }

    fn recover<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), String>> {
        queue_periodic(queue, self.kind())
    }
}
