//! The durable job queue (its contract: docs/design.md, "The job queue"):
//! at-least-once background work that survives crashes, retries what is
//! transient and retires what is not, exactly once.
//!
//! - [`Queue::enqueue`]: (kind, key) is unique among unfinished jobs, so
//!   enqueueing twice queues once (and says so).
//! - [`JobHandler`]: `run` → [`Outcome`]; `abandon` runs once when a job is
//!   retired for good (failed, attempts exhausted, deadline passed, or
//!   cancelled by an operator) — never between retries; `recover` runs at
//!   start-up to re-queue work whose job row was lost.
//! - [`Runner`]: claims due jobs of the kinds it has handlers for, with a
//!   short lease it renews while the attempt runs (the heartbeat). The
//!   lease is separate from the attempt's time budget: a runner that dies
//!   has its jobs reclaimed within one lease, however long the budget.
//!   Every settlement is guarded on the lease owner, so a runner that lost
//!   its lease cannot overwrite a newer claim.
//!
//! Architecture Invariant: the queue knows nothing of ACME. Handlers live
//! with the subsystem whose work they do (the authority's validations, the
//! periodic sweeps) and are registered at assembly.

pub mod backoff;
pub mod periodic;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acme_proxy_store::{Attempts, Enqueued, JobRow, JobStatus, NewJob, Store, StoreError};
use time::OffsetDateTime;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;

pub use backoff::backoff;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::clock::SharedClock;
use crate::config::JobsConfig;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

acme_proxy_protocol::string_enum! {
    /// The kinds of job the server queues: the one list that its handlers,
    /// `job list --kind` and the docs share.
    pub enum JobKind {
        ChallengeValidation = "challenge_validation",
        SignerRelayIssue = "signer_relay_issue",
        FinalizeWatch = "finalize_watch",
        NotifyDelivery = "notify_delivery",
        NonceSweep = "nonce_sweep",
        CrlRefresh = "crl_refresh",
        UpstreamProbe = "upstream_probe",
        JobRetention = "job_retention",
        AuditRetention = "audit_retention",
    }
}

/// A job to queue.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub kind: &'static str,
    /// Identity within the kind: a second enqueue of a live (kind, key) is a no-op.
    pub key: String,
    pub payload: serde_json::Value,
    /// When to run first; `None` is now.
    pub run_at: Option<OffsetDateTime>,
    /// Past this the job is retired (its result could no longer be used).
    pub deadline: Option<OffsetDateTime>,
    /// Overrides the configured maximum number of attempts.
    pub max_attempts: Option<u32>,
    /// Whose work it is, for the per-owner cap of the claim (a validation:
    /// its account), so one owner cannot take every slot of the kind.
    pub fair_key: Option<String>,
}

impl JobSpec {
    pub fn new(kind: &'static str, key: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            kind,
            key: key.into(),
            payload,
            run_at: None,
            deadline: None,
            max_attempts: None,
            fair_key: None,
        }
    }
}

/// How often a held job ([`Outcome::Hold`]) looks again.
const HOLD_EVERY: Duration = Duration::from_secs(30);

/// What one attempt concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Finished.
    Done,
    /// Nobody decided anything (a timeout, a 503): try again after backoff.
    Retry(String),
    /// As `Retry`, but not sooner than this (the other side said when,
    /// e.g. `Retry-After` on a 429), bounded by
    /// [`backoff::MAX_RETRY_AFTER`].
    RetryAfter(Duration, String),
    /// Somebody decided no: retire the job now and run `abandon`.
    Failed(String),
    /// Done for now; run again at this time (periodic work). Attempts reset.
    Reschedule(OffsetDateTime),
    /// Held back before doing anything (a budget spent, a peer's pause):
    /// run again at this time, or at the deadline if that is sooner. The
    /// claim does not count as an attempt.
    Wait(OffsetDateTime),
    /// What the job needs is not configured right now (its profile is not
    /// mounted): tried again every 30 s (the backoff cap, if shorter) with
    /// the reason recorded, without counting an attempt, so that it waits
    /// however long that lasts (up to its deadline) instead of running out
    /// of attempts.
    Hold(String),
}

/// Why a job was retired for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetireReason {
    Failed(String),
    AttemptsExhausted {
        attempts: i64,
        last_error: String,
    },
    DeadlinePassed,
    Cancelled {
        actor: String,
    },
    /// A runner died while abandoning; this is the stored reason, and
    /// `abandon` runs again (handlers' abandon must be idempotent).
    Resumed(String),
}

impl RetireReason {
    /// The audit actor of an operator's cancel (`operator:NAME`, or the
    /// actor as given when it already names its kind); None for any other
    /// reason.
    pub fn cancelled_by(&self) -> Option<String> {
        match self {
            Self::Cancelled { actor } if actor.contains(':') => Some(actor.clone()),
            Self::Cancelled { actor } => Some(format!("operator:{actor}")),
            _ => None,
        }
    }
}

impl std::fmt::Display for RetireReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed(e) => write!(f, "failed: {e}"),
            Self::AttemptsExhausted {
                attempts,
                last_error,
            } => {
                write!(f, "gave up after {attempts} attempts: {last_error}")
            }
            Self::DeadlinePassed => write!(f, "deadline passed"),
            Self::Cancelled { actor } => write!(f, "cancelled by {actor}"),
            Self::Resumed(reason) => write!(f, "{reason}"),
        }
    }
}

/// The work of one job kind.
pub trait JobHandler: Send + Sync + 'static {
    fn kind(&self) -> &'static str;

    /// The time budget of one attempt; past it the attempt is cancelled and
    /// counted as a retry. `None` takes the configured default.
    fn budget(&self, _job: &JobRow) -> Option<Duration> {
        None
    }

    fn run<'a>(&'a self, job: &'a JobRow) -> BoxFuture<'a, Outcome>;

    /// Called when the job is retired for good, until it returns `Ok`: on
    /// `Err` (its writes failed: the database is away) the job stays
    /// retiring and is retired again once its lease lapses, so that what
    /// abandon records (an order made invalid, say) is not lost.
    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>>;

    /// Called at start-up: re-queue whatever should be running.
    fn recover<'a>(&'a self, _queue: &'a Queue) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// Hooks for metrics: called on every queue event.
pub trait JobObserver: Send + Sync + std::fmt::Debug {
    fn enqueued(&self, _kind: &str) {}
    fn claimed(&self, _kind: &str, _latency: Duration) {}
    fn done(&self, _kind: &str) {}
    fn retried(&self, _kind: &str) {}
    fn abandoned(&self, _kind: &str) {}
}

/// Counters per (event, kind): the default observer, ready to be exported.
#[derive(Debug, Default)]
pub struct JobCounters {
    counts: Mutex<BTreeMap<(&'static str, String), u64>>,
    claim_latency_ms_total: AtomicU64,
    /// The same counts as a Prometheus family (`acme_proxy_jobs_total`).
    family: Family<crate::metrics::Labels, Counter>,
}

impl JobCounters {
    fn bump(&self, event: &'static str, kind: &str) {
        if let Ok(mut c) = self.counts.lock() {
            *c.entry((event, kind.to_owned())).or_default() += 1;
        }
        self.family
            .get_or_create(&vec![
                ("kind", kind.to_owned()),
                ("event", event.to_owned()),
            ])
            .inc();
    }

    /// The Prometheus family these counts are mirrored in.
    pub fn family(&self) -> Family<crate::metrics::Labels, Counter> {
        self.family.clone()
    }

    /// How many `event`s ("enqueued", "claimed", "done", "retried",
    /// "abandoned") happened for `kind`.
    pub fn get(&self, event: &str, kind: &str) -> u64 {
        self.counts
            .lock()
            .ok()
            .and_then(|c| {
                c.iter()
                    .find(|((e, k), _)| *e == event && k == kind)
                    .map(|(_, v)| *v)
            })
            .unwrap_or(0)
    }

    pub fn claim_latency_ms_total(&self) -> u64 {
        self.claim_latency_ms_total.load(Ordering::Relaxed)
    }
}

impl JobObserver for JobCounters {
    fn enqueued(&self, kind: &str) {
        self.bump("enqueued", kind);
    }
    fn claimed(&self, kind: &str, latency: Duration) {
        self.bump("claimed", kind);
        self.claim_latency_ms_total
            .fetch_add(latency.as_millis() as u64, Ordering::Relaxed);
    }
    fn done(&self, kind: &str) {
        self.bump("done", kind);
    }
    fn retried(&self, kind: &str) {
        self.bump("retried", kind);
    }
    fn abandoned(&self, kind: &str) {
        self.bump("abandoned", kind);
    }
}

/// The queue: where work is put. Cheap to share.
#[derive(Debug)]
pub struct Queue {
    pub store: Store,
    pub clock: SharedClock,
    /// The tuning of the current configuration: a reload replaces it, and
    /// each claim and attempt reads it anew (but `concurrency`, whose
    /// slots are made once).
    config: std::sync::RwLock<Arc<JobsConfig>>,
    pub observer: Arc<JobCounters>,
    wake: Notify,
    /// How many times the configuration was replaced: a job held under
    /// one configuration that has been replaced since looks again at once.
    configurations: std::sync::atomic::AtomicU64,
}

impl Queue {
    pub fn new(store: Store, clock: SharedClock, config: JobsConfig) -> Self {
        Self {
            store,
            clock,
            config: std::sync::RwLock::new(Arc::new(config)),
            observer: Arc::new(JobCounters::default()),
            wake: Notify::new(),
            configurations: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A new configuration is in force (called once it serves): an
    /// attempt that started before and is held for what the old one
    /// lacked is made due at once, not at its next look — the release
    /// of held jobs that follows a reload may have run before it ended.
    pub fn configuration_changed(&self) {
        self.configurations
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn configuration(&self) -> u64 {
        self.configurations
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The job tuning now in force.
    pub fn config(&self) -> Arc<JobsConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts a reloaded configuration's tuning in force for the next claim
    /// and attempt.
    pub(crate) fn set_config(&self, config: JobsConfig) {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
    }

    /// Wakes the runner: work was queued by other means (in a store
    /// transaction together with the state it belongs to).
    pub fn wake(&self, kind: &str) {
        self.observer.enqueued(kind);
        self.wake.notify_one();
    }

    /// Wakes the runner to look for due work, counting nothing (a queued
    /// job was made due earlier than planned).
    pub fn nudge(&self) {
        self.wake.notify_one();
    }

    /// Start-up recovery for a handler: queues each of `specs` (a live job
    /// of the same identity is left alone, so this is safe to run any number
    /// of times) and says what it did. `batch` is the limit the caller read
    /// its rows with; reaching it means more remain for the next start.
    pub async fn requeue_lost(
        &self,
        event: &'static str,
        specs: Vec<JobSpec>,
        batch: i64,
    ) -> Result<(), String> {
        let found = specs.len();
        let mut requeued = 0;
        for spec in specs {
            if let Enqueued::Queued(_) = self.enqueue(spec).await.map_err(|e| e.to_string())? {
                requeued += 1;
            }
        }
        if requeued > 0 {
            tracing::warn!(
                event,
                outcome = "success",
                requeued,
                "re-queued work that had no job"
            );
        }
        if found as i64 >= batch {
            tracing::warn!(
                event,
                outcome = "partial",
                batch,
                "more work in flight than one batch; the rest at the next start"
            );
        }
        Ok(())
    }

    /// Queues `spec` unless a job of the same identity is unfinished; wakes
    /// the runner at once.
    pub async fn enqueue(&self, spec: JobSpec) -> Result<Enqueued, StoreError> {
        let now = self.clock.unix_ms();
        let ms = |t: OffsetDateTime| (t.unix_timestamp_nanos() / 1_000_000) as i64;
        let payload = spec.payload.to_string();
        let result = self
            .store
            .insert_job(
                &NewJob {
                    kind: spec.kind,
                    key: &spec.key,
                    payload: &payload,
                    run_at: spec.run_at.map_or(now, ms),
                    deadline: spec.deadline.map(ms),
                    max_attempts: i64::from(
                        spec.max_attempts.unwrap_or(self.config().max_attempts),
                    ),
                    fair_key: spec.fair_key.as_deref(),
                },
                now,
            )
            .await?;
        if let Enqueued::Queued(id) = result {
            self.observer.enqueued(spec.kind);
            tracing::debug!(event = "job.enqueued", outcome = "success", kind = spec.kind, key = %spec.key, id, "job queued");
            self.wake.notify_one();
        }
        Ok(result)
    }
}

/// Handlers by kind; refuses two handlers for one kind.
#[derive(Default)]
pub struct Registry {
    handlers: BTreeMap<&'static str, Arc<dyn JobHandler>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.handlers.keys()).finish()
    }
}

impl Registry {
    pub fn register(&mut self, handler: Arc<dyn JobHandler>) -> Result<(), String> {
        let kind = handler.kind();
        // The first registration stays: refusing must not replace it.
        if self.handlers.contains_key(kind) {
            return Err(format!("two job handlers registered for kind {kind:?}"));
        }
        self.handlers.insert(kind, handler);
        Ok(())
    }

    pub fn kinds(&self) -> Vec<&'static str> {
        self.handlers.keys().copied().collect()
    }

    fn get(&self, kind: &str) -> Option<&Arc<dyn JobHandler>> {
        self.handlers.get(kind)
    }
}

/// Claims and runs jobs.
pub struct Runner {
    queue: Arc<Queue>,
    registry: Arc<Registry>,
    /// Lease owner: unique per runner incarnation.
    owner: String,
    /// Each kind's own `jobs.concurrency` slots: validations, relay
    /// issuance, notifications and periodic work never wait behind one
    /// another.
    slots: HashMap<&'static str, Arc<Semaphore>>,
    held: Arc<Mutex<HashSet<i64>>>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("owner", &self.owner)
            .field("kinds", &self.registry)
            .finish()
    }
}

impl Runner {
    pub fn new(queue: Arc<Queue>, registry: Registry) -> Self {
        let owner = format!("{}:{}", std::process::id(), crate::ids::request_id());
        let slots = registry
            .kinds()
            .into_iter()
            .map(|kind| (kind, Arc::new(Semaphore::new(queue.config().concurrency))))
            .collect();
        Self {
            queue,
            registry: Arc::new(registry),
            owner,
            slots,
            held: Arc::default(),
        }
    }

    /// The queue this runner claims from (its tuning: `Queue::config`).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Runs every handler's `recover` (start-up).
    pub async fn recover(&self) -> Result<(), String> {
        for handler in self.registry.handlers.values() {
            handler
                .recover(&self.queue)
                .await
                .map_err(|e| format!("recovering {} jobs: {e}", handler.kind()))?;
        }
        Ok(())
    }

    /// Each kind's free slots now.
    fn free(&self) -> Vec<(&'static str, usize)> {
        self.slots
            .iter()
            .map(|(kind, slots)| (*kind, slots.available_permits()))
            .collect()
    }

    async fn claim(&self, free: &[(&'static str, usize)]) -> Vec<JobRow> {
        if free.iter().all(|(_, n)| *n == 0) {
            return Vec::new();
        }
        let lease = self.queue.config().lease.as_millis() as i64;
        let now = self.queue.clock.unix_ms();
        let per_key =
            i64::try_from(self.queue.config().validations_per_account).unwrap_or(i64::MAX);
        match self
            .queue
            .store
            .claim_jobs(&self.owner, free, now, lease, per_key)
            .await
        {
            Ok(jobs) => {
                if !jobs.is_empty() {
                    crash_point!("job.claimed");
                }
                for j in &jobs {
                    let waited = Duration::from_millis(now.saturating_sub(j.run_at).max(0) as u64);
                    self.queue.observer.claimed(&j.kind, waited);
                }
                jobs
            }
            Err(e) => {
                tracing::error!(event = "job.claim", outcome = "failure", error = %e, "claiming jobs failed");
                Vec::new()
            }
        }
    }

    /// The slot of a claimed job's kind (claimed within the free slots, so
    /// one is free: only this loop takes them).
    fn slot(&self, kind: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.slots
            .get(kind)
            .and_then(|s| Arc::clone(s).try_acquire_owned().ok())
    }

    /// Claims every due job (up to each kind's free slots) and runs them
    /// to their settlement; returns how many ran. Used by tests with an
    /// injected clock, and by nothing else.
    pub async fn run_due(self: &Arc<Self>) -> usize {
        let jobs = self.claim(&self.free()).await;
        let n = jobs.len();
        let mut set = JoinSet::new();
        for job in jobs {
            let this = Arc::clone(self);
            let permit = self.slot(&job.kind);
            set.spawn(async move {
                this.execute(job).await;
                drop(permit);
            });
        }
        while set.join_next().await.is_some() {}
        n
    }

    /// The claim loop, until `stop` turns true; then waits up to `grace` for
    /// attempts in flight and releases the leases of those still running.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>, grace: Duration) {
        let mut set = JoinSet::new();
        // On PostgreSQL, work queued by another process (a replica, the
        // admin CLI) wakes this runner too, instead of waiting for the
        // next poll.
        let listening = match self.queue.store.job_wakeups().await {
            Ok(Some(mut wakeups)) => {
                let queue = Arc::clone(&self.queue);
                Some(tokio::spawn(async move {
                    loop {
                        wakeups.next().await;
                        queue.nudge();
                    }
                }))
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(event = "jobs.listen_failed", error = %e, "cannot listen for jobs queued by other processes; polling for them");
                None
            }
        };
        loop {
            if *stop.borrow() {
                break;
            }
            while set.try_join_next().is_some() {}
            let free = self.free();
            let jobs = self.claim(&free).await;
            for job in jobs {
                let permit = self.slot(&job.kind);
                // Claimed within the free slots, and only this loop takes
                // them: a job without one would run past its kind's bound.
                debug_assert!(
                    permit.is_some(),
                    "claimed a {} job past its slots",
                    job.kind
                );
                let this = Arc::clone(&self);
                set.spawn(async move {
                    this.execute(job).await;
                    drop(permit);
                });
            }
            // A slot freed (a job finished) is waited for like new work:
            // each kind's due work is claimed as soon as it has room.
            tokio::select! {
                _ = self.queue.wake.notified() => {}
                _ = tokio::time::sleep(self.queue.config().poll_interval) => {}
                changed = stop.changed() => {
                        // A dropped sender means nobody can stop us any more: stop now.
                        if changed.is_err() { break; }
                    }
                _ = set.join_next(), if !set.is_empty() => {}
            }
        }
        if let Some(listening) = listening {
            listening.abort();
        }
        // Graceful shutdown: let attempts finish, then give back what is held.
        let _ =
            tokio::time::timeout(grace, async { while set.join_next().await.is_some() {} }).await;
        set.abort_all();
        let held: Vec<i64> = self
            .held
            .lock()
            .map(|h| h.iter().copied().collect())
            .unwrap_or_default();
        for id in held {
            match self
                .queue
                .store
                .release_job(id, &self.owner, self.queue.clock.unix_ms())
                .await
            {
                Ok(true) => tracing::info!(
                    event = "job.released",
                    outcome = "success",
                    id,
                    "lease released at shutdown"
                ),
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(event = "job.released", outcome = "failure", id, error = %e, "could not release a lease")
                }
            }
        }
    }

    /// Renews the lease of job `id`, last renewed at `renewed`, as
    /// [`Store::renew_job_lease`] does; a renewal that has not answered
    /// by the time the holder must stop (see [`lease_lapsing`]) is an
    /// error, so that a database that hangs cannot keep an attempt
    /// running past its lease.
    async fn renew(&self, id: i64, renewed: Instant) -> Result<Option<Option<String>>, String> {
        let lease = self.queue.config().lease;
        let now = self.queue.clock.unix_ms();
        let renewal =
            self.queue
                .store
                .renew_job_lease(id, &self.owner, now, lease.as_millis() as i64);
        match tokio::time::timeout_at((renewed + lease * 2 / 3).into(), renewal).await {
            Ok(answer) => answer.map_err(|e| e.to_string()),
            Err(_) => Err("the renewal did not answer before the lease was due to lapse".into()),
        }
    }

    /// One claimed job: retire it, or run one attempt under heartbeat and
    /// budget, then settle.
    async fn execute(self: &Arc<Self>, job: JobRow) {
        let Some(handler) = self.registry.get(&job.kind).cloned() else {
            // Never claimed: the claim names only registered kinds.
            return;
        };
        let fresh = self.held.lock().map_or(true, |mut h| h.insert(job.id));
        if !fresh {
            // An attempt of this job is still running here: its lease
            // lapsed (a stall, a clock jump) and this runner's own claim
            // took it again. That claim renewed the lease for the attempt
            // running; a second one would do the job's work twice.
            tracing::warn!(event = "job.claimed_again", outcome = "retry", id = job.id, kind = %job.kind, "a job this runner is still running was claimed again; the running attempt keeps it");
            // The claim counted an attempt that does not run.
            if let Err(e) = self.queue.store.uncount_claim(job.id, &self.owner).await {
                tracing::warn!(event = "job.claimed_again", outcome = "failure", id = job.id, error = %e, "the claim's attempt could not be taken back");
            }
            return;
        }
        // A panic below must not leave the job marked as running here,
        // which would keep this runner from ever running it again. (An
        // abort at shutdown leaves it, for its lease to be given back.)
        let _unheld_on_panic = UnheldOnPanic(&self.held, job.id);
        let span = tracing::info_span!("job", id = job.id, kind = %job.kind, key = %job.key, attempt = job.attempts);
        tracing::Instrument::instrument(self.execute_inner(handler, &job), span).await;
        if let Ok(mut h) = self.held.lock() {
            h.remove(&job.id);
        }
    }

    async fn execute_inner(self: &Arc<Self>, handler: Arc<dyn JobHandler>, job: &JobRow) {
        // About when the claim took the lease (its last renewal so far).
        let claimed = Instant::now();
        let now = self.queue.clock.unix_ms();
        if job.status == JobStatus::Retiring {
            let reason = RetireReason::Resumed(job.last_error.clone().unwrap_or_default());
            return self
                .abandon_and_finish(&handler, job, &reason, claimed)
                .await;
        }
        if let Some(actor) = &job.cancel_requested_by {
            return self
                .retire(
                    &handler,
                    job,
                    RetireReason::Cancelled {
                        actor: actor.clone(),
                    },
                    claimed,
                )
                .await;
        }
        if job.deadline.is_some_and(|d| now >= d) {
            return self
                .retire(&handler, job, RetireReason::DeadlinePassed, claimed)
                .await;
        }
        if job.attempts > job.max_attempts {
            let reason = RetireReason::AttemptsExhausted {
                attempts: job.attempts - 1,
                last_error: job.last_error.clone().unwrap_or_default(),
            };
            return self.retire(&handler, job, reason, claimed).await;
        }

        let budget = handler
            .budget(job)
            .unwrap_or(self.queue.config().attempt_budget);
        let configuration = self.queue.configuration();
        let attempt = {
            let handler = Arc::clone(&handler);
            let job = job.clone();
            tokio::spawn(async move { handler.run(&job).await })
        };
        let attempt_abort = attempt.abort_handle();
        // If this task is itself aborted (shutdown), the attempt must not
        // live on detached.
        let _stop_attempt = AbortOnDrop(attempt.abort_handle());
        let lease = self.queue.config().lease;
        let mut renewed = claimed;
        let mut heartbeat = tokio::time::interval(lease / 3);
        heartbeat.tick().await;
        let budget_over = tokio::time::sleep(budget);
        tokio::pin!(attempt, budget_over);
        let outcome = loop {
            tokio::select! {
                result = &mut attempt => {
                    break match result {
                        Ok(outcome) => outcome,
                        Err(e) if e.is_panic() => Outcome::Retry(format!("the handler panicked: {}", panic_message(e))),
                        Err(e) => Outcome::Retry(format!("the attempt was cancelled: {e}")),
                    };
                }
                () = &mut budget_over => {
                    attempt_abort.abort();
                    break Outcome::Retry(format!("the attempt exceeded its budget of {budget:?}"));
                }
                _ = heartbeat.tick() => {
                    let asked = Instant::now();
                    match self.renew(job.id, renewed).await {
                        Ok(Some(None)) => renewed = asked,
                        Ok(Some(Some(actor))) => {
                            attempt_abort.abort();
                            return self.retire(&handler, job, RetireReason::Cancelled { actor }, asked).await;
                        }
                        Ok(None) => {
                            // Another runner holds it now: stop, settle nothing.
                            attempt_abort.abort();
                            tracing::warn!(event = "job.lease_lost", outcome = "failure", "lease lost; attempt stopped");
                            return;
                        }
                        Err(e) if lease_lapsing(renewed, lease) => {
                            // Another runner may take the job once the
                            // lease lapses: stop before, settle nothing.
                            attempt_abort.abort();
                            tracing::warn!(event = "job.lease_lost", outcome = "failure", error = %e, unrenewed_ms = renewed.elapsed().as_millis() as u64, "the lease could not be renewed before it lapses; attempt stopped");
                            return;
                        }
                        Err(e) => {
                            // Keep going: the lease is still ours until it
                            // expires, and the next beat may succeed.
                            tracing::warn!(event = "job.heartbeat", outcome = "failure", error = %e, "lease renewal failed");
                        }
                    }
                }
            }
        };
        crash_point!("job.ran");
        self.settle(&handler, job, outcome, configuration, renewed)
            .await;
        crash_point!("job.settled");
    }

    /// Records `outcome` of an attempt that started under `configuration`
    /// (see [`Queue::configuration_changed`]) and whose lease was last
    /// renewed at `renewed`.
    async fn settle(
        self: &Arc<Self>,
        handler: &Arc<dyn JobHandler>,
        job: &JobRow,
        outcome: Outcome,
        configuration: u64,
        renewed: Instant,
    ) {
        let store = &self.queue.store;
        let now = self.queue.clock.unix_ms();
        let settled = match &outcome {
            Outcome::Done => {
                self.queue.observer.done(&job.kind);
                store.finish_job(job.id, &self.owner, now).await
            }
            Outcome::Reschedule(at) => {
                let at = (at.unix_timestamp_nanos() / 1_000_000) as i64;
                store
                    .requeue_job(job.id, &self.owner, now, at, None, Attempts::Reset)
                    .await
            }
            Outcome::Wait(at) => {
                let mut at = (at.unix_timestamp_nanos() / 1_000_000) as i64;
                // Past the deadline the job is retired: wait no longer.
                if let Some(deadline) = job.deadline {
                    at = at.min(deadline);
                }
                store
                    .requeue_job(job.id, &self.owner, now, at, None, Attempts::Uncount)
                    .await
            }
            Outcome::Hold(reason) => {
                // Its attempts do not grow, so neither would its backoff:
                // a held job looks again every [`HOLD_EVERY`] (or the
                // backoff cap, if shorter), so that hundreds of them
                // waiting for a profile do not keep the queue busy.
                // Held under a configuration replaced meanwhile: look
                // again under the new one now.
                let delay = if self.queue.configuration() == configuration {
                    HOLD_EVERY.min(self.queue.config().backoff_cap)
                } else {
                    Duration::ZERO
                };
                let mut next = backoff::later(now, delay);
                if let Some(deadline) = job.deadline {
                    next = next.min(deadline);
                }
                tracing::debug!(event = "job.hold", outcome = "retry", reason = %reason, delay_ms = delay.as_millis() as u64, "the job waits for its configuration; not counted as an attempt");
                store.hold_job(job.id, &self.owner, now, next, reason).await
            }
            Outcome::Failed(reason) => {
                return self
                    .retire(handler, job, RetireReason::Failed(reason.clone()), renewed)
                    .await;
            }
            Outcome::Retry(reason) | Outcome::RetryAfter(_, reason) => {
                if job.attempts >= job.max_attempts {
                    let reason = RetireReason::AttemptsExhausted {
                        attempts: job.attempts,
                        last_error: reason.clone(),
                    };
                    return self.retire(handler, job, reason, renewed).await;
                }
                let cfg = self.queue.config();
                let mut delay = backoff(job.attempts, cfg.backoff_base, cfg.backoff_cap, jitter());
                if let Outcome::RetryAfter(at_least, _) = &outcome {
                    // A peer's number, bounded: it must neither hold the
                    // job for ever nor overflow its run time.
                    delay = delay.max(backoff::retry_after(*at_least));
                }
                let mut next = backoff::later(now, delay);
                // Waiting past the deadline is pointless: come back at the
                // deadline, to be retired then.
                if let Some(deadline) = job.deadline {
                    next = next.min(deadline);
                }
                self.queue.observer.retried(&job.kind);
                tracing::info!(event = "job.retry", outcome = "retry", reason = %reason, delay_ms = delay.as_millis() as u64, "attempt failed; will retry");
                store
                    .requeue_job(job.id, &self.owner, now, next, Some(reason), Attempts::Keep)
                    .await
            }
        };
        match settled {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                event = "job.settle",
                outcome = "stale",
                "the lease was lost before settling; another runner owns the job"
            ),
            Err(e) => {
                tracing::error!(event = "job.settle", outcome = "failure", error = %e, "settling failed; the lease will expire and the job run again")
            }
        }
    }

    /// Retires a job: the one runner that moves it to `retiring` runs
    /// `abandon`, then marks it failed or cancelled.
    async fn retire(
        self: &Arc<Self>,
        handler: &Arc<dyn JobHandler>,
        job: &JobRow,
        reason: RetireReason,
        renewed: Instant,
    ) {
        let now = self.queue.clock.unix_ms();
        match self
            .queue
            .store
            .begin_retire_job(job.id, &self.owner, now, &reason.to_string())
            .await
        {
            Ok(true) => {
                self.abandon_and_finish(handler, job, &reason, renewed)
                    .await
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(event = "job.retire", outcome = "failure", error = %e, "could not retire the job; it will be reclaimed")
            }
        }
    }

    /// Runs `abandon` under the lease last renewed at `renewed`, then
    /// marks the job retired.
    async fn abandon_and_finish(
        self: &Arc<Self>,
        handler: &Arc<dyn JobHandler>,
        job: &JobRow,
        reason: &RetireReason,
        renewed: Instant,
    ) {
        let abandon = {
            let handler = Arc::clone(handler);
            let job = job.clone();
            let reason = reason.clone();
            tokio::spawn(async move { handler.abandon(&job, &reason).await })
        };
        let _stop_abandon = AbortOnDrop(abandon.abort_handle());
        // The lease is renewed while abandon runs, as during an attempt, so
        // a slow abandon is not reclaimed and run twice at once.
        let budget = handler
            .budget(job)
            .unwrap_or(self.queue.config().attempt_budget);
        let lease = self.queue.config().lease;
        let mut renewed = renewed;
        let mut heartbeat = tokio::time::interval(lease / 3);
        heartbeat.tick().await;
        let over = tokio::time::sleep(budget);
        tokio::pin!(abandon, over);
        // Not retired unless abandon did its work: the job stays retiring
        // and is taken again (here or elsewhere) once its lease lapses.
        let again = "the job stays retiring and is retired again once its lease lapses";
        loop {
            tokio::select! {
                result = &mut abandon => {
                    match result {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::error!(event = "job.abandon", outcome = "failure", error = %e, "abandon failed; {again}");
                            return;
                        }
                        // A panic would only come again: retired as it is.
                        Err(e) => tracing::error!(event = "job.abandon", outcome = "failure", error = %e, "abandon panicked"),
                    }
                    break;
                }
                () = &mut over => {
                    tracing::error!(event = "job.abandon", outcome = "failure", "abandon exceeded the attempt budget; {again}");
                    return;
                }
                _ = heartbeat.tick() => {
                    let asked = Instant::now();
                    match self.renew(job.id, renewed).await {
                        Ok(Some(_)) => renewed = asked,
                        Ok(None) => {
                            tracing::warn!(event = "job.lease_lost", outcome = "failure", "lease lost during abandon");
                            return;
                        }
                        Err(e) if lease_lapsing(renewed, lease) => {
                            tracing::warn!(event = "job.lease_lost", outcome = "failure", error = %e, "the lease could not be renewed before it lapses; abandon stopped");
                            return;
                        }
                        Err(e) => tracing::warn!(event = "job.heartbeat", outcome = "failure", error = %e, "lease renewal failed"),
                    }
                }
            }
        }
        tracing::warn!(event = "job.abandoned", outcome = "failure", reason = %reason, "job retired for good");
        self.queue.observer.abandoned(&job.kind);
        let cancelled = matches!(reason, RetireReason::Cancelled { .. })
            || job.cancel_requested_by.is_some() && matches!(reason, RetireReason::Resumed(_));
        let now = self.queue.clock.unix_ms();
        if let Err(e) = self
            .queue
            .store
            .finish_retire_job(job.id, &self.owner, now, cancelled)
            .await
        {
            tracing::error!(event = "job.retire", outcome = "failure", error = %e, "could not mark the job retired");
        }
    }
}

/// Whether a holder whose lease was last renewed at `renewed` (asked
/// then) must stop rather than wait for another beat: with beats every
/// third of a lease, this is the second renewal in a row that failed,
/// about two thirds of a lease after the last one, leaving a third for the
/// stop to take effect before another runner may claim the job.
fn lease_lapsing(renewed: Instant, lease: Duration) -> bool {
    renewed.elapsed() >= lease / 2
}

/// Takes job `.1` off the runner's `held` set if dropped while panicking.
struct UnheldOnPanic<'a>(&'a Mutex<HashSet<i64>>, i64);

impl Drop for UnheldOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Ok(mut held) = self.0.lock()
        {
            held.remove(&self.1);
        }
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic".to_owned()),
        Err(e) => e.to_string(),
    }
}

/// A uniform number in [0, 1) from the OS random source.
fn jitter() -> f64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 4];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0)
}

/// Jobs by kind and status: the queue-depth gauge for the metrics endpoint.
pub async fn depth(store: &Store) -> Result<HashMap<(String, String), i64>, StoreError> {
    Ok(store
        .job_counts()
        .await?
        .by_kind_and_status
        .into_iter()
        .map(|(k, s, n)| ((k, s), n))
        .collect())
}
