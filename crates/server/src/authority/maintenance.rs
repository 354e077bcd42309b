//! Periodic maintenance of the authority's data, as self-rescheduling jobs
//! (see `jobs::periodic`): the expired-nonce sweep (with the rate-limit
//! keys that hold nothing back and the console's stale sessions) and CRL
//! re-signing.

use std::time::Duration;

use acme_proxy_store::JobRow;

use crate::generation::Generations;
use crate::jobs::periodic::{log_abandon, queue_periodic};
use crate::jobs::{BoxFuture, JobHandler, Outcome, Queue, RetireReason};

/// Deletes expired nonces (RFC 8555 §6.5 nonces are single-use and short-lived).
#[derive(Debug)]
pub struct NonceSweep {
    pub generations: Generations,
    pub every: Duration,
    /// The console's session limits (idle, lifetime) as this process's
    /// console applies them (`[admin]` is read at start-up only); none
    /// where no console runs. The sweep is one job for all replicas, run
    /// by whichever claims it: one without a console deletes no session
    /// by limits it does not apply (replicas serving the console should
    /// agree on them).
    pub sessions: Option<(Duration, Duration)>,
}

impl JobHandler for NonceSweep {
    fn kind(&self) -> &'static str {
        crate::jobs::JobKind::NonceSweep.as_str()
    }

    fn run<'a>(&'a self, _job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let authority = self.generations.authority();
            let clock = &authority.clock;
            match authority.sweep_nonces().await {
                Ok(n) => tracing::debug!(
                    event = "nonce.sweep",
                    outcome = "success",
                    deleted = n,
                    "expired nonces deleted"
                ),
                Err(e) => {
                    tracing::error!(event = "nonce.sweep", outcome = "failure", error = ?e.internal, "nonce sweep failed")
                }
            }
            // One row per client address and account would otherwise
            // stay for ever.
            if let Err(e) = authority.sweep_rate_limits().await {
                tracing::error!(event = "ratelimit.sweep", outcome = "failure", error = ?e.internal, "rate-limit sweep failed");
            }
            // Console sessions past their idle time or lifetime are
            // refused when used, and only then deleted: deleted here too,
            // so that `admin session list` shows live ones, and a limit
            // raised later does not bring an abandoned one back.
            let now = clock.unix();
            let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if let Some((idle, lifetime)) = self.sessions
                && let Err(e) = authority
                    .store()
                    .delete_stale_operator_sessions(
                        now.saturating_sub(secs(idle)),
                        now.saturating_sub(secs(lifetime)),
                    )
                    .await
            {
                tracing::error!(event = "operator.session_sweep", outcome = "failure", error = %e, "stale console sessions could not be deleted");
            }
            Outcome::Reschedule(clock.now() + self.every)
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

/// Re-signs CRLs past half their life (RFC 5280 §5: never let nextUpdate pass).
#[derive(Debug)]
pub struct CrlRefresh {
    pub generations: Generations,
    pub every: Duration,
}

impl JobHandler for CrlRefresh {
    fn kind(&self) -> &'static str {
        crate::jobs::JobKind::CrlRefresh.as_str()
    }

    fn run<'a>(&'a self, _job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let authority = self.generations.authority();
            authority.refresh_stale_crls().await;
            Outcome::Reschedule(authority.clock.now() + self.every)
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
