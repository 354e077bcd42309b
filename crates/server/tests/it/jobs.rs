//! The durable job queue against its contract: exactly-once claims across two processes over one SQLite
//! file, bounded retries with backoff, deadlines, exactly-once `abandon`,
//! identity de-duplication, lease-guarded settlements, survival of
//! panicking and hanging handlers, and graceful shutdown.
//!
//! Every test runs over a real SQLite file in a temporary directory. Tests
//! about time use a [`ManualClock`] and `Runner::run_due`; the others run
//! the real `Runner::run` loop. Every wait is bounded.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acme_proxy::clock::{Clock, ManualClock, SharedClock, SystemClock};
use acme_proxy::config::JobsConfig;
use acme_proxy::jobs::{
    BoxFuture, JobHandler, JobSpec, Outcome, Queue, Registry, RetireReason, Runner,
};
use acme_proxy_store::{Enqueued, JobRow, NewJob, Store, StoreOptions};
use serde_json::json;
use time::OffsetDateTime;
use tokio::sync::watch;

const KIND: &str = "test.scripted";

/// Opens the store of `dir`: `dir/jobs.db`, or on PostgreSQL the database
/// made for `dir` (each call is a separate "process": its own connections
/// to the same database).
async fn open_store(dir: &std::path::Path) -> Store {
    let url = if crate::harness::on_postgres() {
        let named = dir.join("postgres-url");
        match std::fs::read_to_string(&named) {
            Ok(url) => url,
            Err(_) => {
                let url = crate::harness::fresh_postgres_database();
                std::fs::write(&named, &url).expect("remember the database");
                url
            }
        }
    } else {
        format!("sqlite:{}", dir.join("jobs.db").display())
    };
    Store::open(&url, &StoreOptions::default())
        .await
        .expect("open the store")
}

/// A configuration fit for tests: short polls, the rest as given.
fn config(f: impl FnOnce(&mut JobsConfig)) -> JobsConfig {
    let mut c = JobsConfig {
        poll_interval: Duration::from_millis(20),
        ..JobsConfig::default()
    };
    f(&mut c);
    c
}

/// A manual clock at a whole second, so millisecond arithmetic is exact.
fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(
        OffsetDateTime::from_unix_timestamp(1_700_000_000).expect("a valid time"),
    ))
}

fn ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

async fn job(queue: &Queue, id: i64) -> JobRow {
    queue
        .store
        .job(id)
        .await
        .expect("read the job")
        .expect("the job exists")
}

/// A handler that plays a per-key script of outcomes (then `Done`), and
/// records every attempt and every abandon.
struct Scripted {
    kind: &'static str,
    scripts: Mutex<HashMap<String, VecDeque<Outcome>>>,
    calls: Mutex<Vec<String>>,
    abandons: Arc<Mutex<Vec<(String, RetireReason)>>>,
    /// How many more times each key's abandon fails (its writes refused).
    failing_abandons: Mutex<HashMap<String, usize>>,
}

impl Scripted {
    fn new(kind: &'static str) -> Arc<Self> {
        Arc::new(Self {
            kind,
            scripts: Mutex::default(),
            calls: Mutex::default(),
            abandons: Arc::default(),
            failing_abandons: Mutex::default(),
        })
    }

    fn script(&self, key: &str, outcomes: impl IntoIterator<Item = Outcome>) {
        self.scripts
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_default()
            .extend(outcomes);
    }

    fn calls_for(&self, key: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|k| *k == key)
            .count()
    }

    fn total_calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    fn abandons(&self) -> Vec<(String, RetireReason)> {
        self.abandons.lock().unwrap().clone()
    }
}

impl JobHandler for Scripted {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn run<'a>(&'a self, job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            self.calls.lock().unwrap().push(job.key.clone());
            self.scripts
                .lock()
                .unwrap()
                .get_mut(&job.key)
                .and_then(VecDeque::pop_front)
                .unwrap_or(Outcome::Done)
        })
    }

    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.abandons
                .lock()
                .unwrap()
                .push((job.key.clone(), reason.clone()));
            let mut failing = self.failing_abandons.lock().unwrap();
            match failing.get_mut(&job.key) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    Err("the database refused the write (scripted)".to_owned())
                }
                _ => Ok(()),
            }
        })
    }
}

/// One queue over `store` with `clock`, and a runner with `handlers`.
fn runner_with(
    store: Store,
    clock: SharedClock,
    config: JobsConfig,
    handlers: Vec<Arc<dyn JobHandler>>,
) -> (Arc<Queue>, Arc<Runner>) {
    let queue = Arc::new(Queue::new(store, clock, config));
    let mut registry = Registry::default();
    for h in handlers {
        registry.register(h).expect("register the handler");
    }
    let runner = Arc::new(Runner::new(Arc::clone(&queue), registry));
    (queue, runner)
}

/// Polls `check` every 20 ms until it holds, failing after `within`.
async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(within, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "timed out after {within:?} waiting for {what}"
    );
}

// ---------------------------------------------------------------------------
// Exactly once across two processes

/// Runs each job while checking that no other attempt of the same key is
/// in flight anywhere, and records which runner ran it.
struct Exclusive {
    kind: &'static str,
    runner: &'static str,
    live: Arc<Mutex<HashSet<String>>>,
    overlaps: Arc<Mutex<Vec<String>>>,
    runs: Arc<Mutex<HashMap<String, Vec<&'static str>>>>,
}

impl JobHandler for Exclusive {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn run<'a>(&'a self, job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            if !self.live.lock().unwrap().insert(job.key.clone()) {
                self.overlaps.lock().unwrap().push(job.key.clone());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.live.lock().unwrap().remove(&job.key);
            self.runs
                .lock()
                .unwrap()
                .entry(job.key.clone())
                .or_default()
                .push(self.runner);
            Outcome::Done
        })
    }

    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            panic!("job {} abandoned: {reason}", job.key);
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_runners_over_one_database_file_run_thousands_of_jobs_each_exactly_once_without_overlap()
 {
    const JOBS: usize = 2000;
    const KIND: &str = "test.exclusive";
    let dir = crate::harness::tempdir();
    let store_a = open_store(dir.path()).await;
    let store_b = open_store(dir.path()).await;
    let live: Arc<Mutex<HashSet<String>>> = Arc::default();
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let runs: Arc<Mutex<HashMap<String, Vec<&'static str>>>> = Arc::default();
    let handler = |runner: &'static str| -> Arc<dyn JobHandler> {
        Arc::new(Exclusive {
            kind: KIND,
            runner,
            live: Arc::clone(&live),
            overlaps: Arc::clone(&overlaps),
            runs: Arc::clone(&runs),
        })
    };
    let cfg = config(|c| c.concurrency = 8);
    let clock: SharedClock = Arc::new(SystemClock);
    let (queue_a, runner_a) =
        runner_with(store_a, Arc::clone(&clock), cfg.clone(), vec![handler("a")]);
    let (_queue_b, runner_b) = runner_with(store_b, clock, cfg, vec![handler("b")]);
    assert_ne!(runner_a.owner(), runner_b.owner());

    let (stop, stop_rx) = watch::channel(false);
    let loop_a = tokio::spawn(Arc::clone(&runner_a).run(stop_rx.clone(), Duration::from_secs(5)));
    let loop_b = tokio::spawn(Arc::clone(&runner_b).run(stop_rx, Duration::from_secs(5)));

    for i in 0..JOBS {
        let queued = queue_a
            .enqueue(JobSpec::new(KIND, format!("job-{i}"), json!({ "i": i })))
            .await
            .expect("enqueue");
        assert!(matches!(queued, Enqueued::Queued(_)), "{queued:?}");
    }

    let store = queue_a.store.clone();
    eventually(Duration::from_secs(120), "every job to be done", || {
        let store = store.clone();
        async move {
            store
                .list_jobs(Some(KIND), Some("done".parse().unwrap()), None, 5000)
                .await
                .expect("list jobs")
                .len()
                == JOBS
        }
    })
    .await;

    stop.send(true).unwrap();
    for (name, handle) in [("a", loop_a), ("b", loop_b)] {
        tokio::time::timeout(Duration::from_secs(10), handle)
            .await
            .unwrap_or_else(|_| panic!("runner {name} did not stop"))
            .unwrap_or_else(|e| panic!("runner {name} died: {e}"));
    }

    let overlaps = overlaps.lock().unwrap().clone();
    assert!(
        overlaps.is_empty(),
        "{} attempts overlapped another attempt of the same job, e.g. {:?}",
        overlaps.len(),
        &overlaps[..overlaps.len().min(10)]
    );
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), JOBS, "every key ran");
    let twice: Vec<_> = runs.iter().filter(|(_, r)| r.len() != 1).collect();
    assert!(
        twice.is_empty(),
        "{} keys did not run exactly once, e.g. {:?}",
        twice.len(),
        &twice[..twice.len().min(10)]
    );
    let by_a = runs.values().filter(|r| r[0] == "a").count();
    let by_b = runs.values().filter(|r| r[0] == "b").count();
    assert!(
        by_a > 0 && by_b > 0,
        "both runners ran jobs (a ran {by_a}, b ran {by_b})"
    );
    let all = store.list_jobs(Some(KIND), None, None, 5000).await.unwrap();
    assert_eq!(all.len(), JOBS);
    assert!(
        all.iter()
            .all(|j| j.status.as_str() == "done" && j.attempts == 1 && j.lease_owner.is_none()),
        "every job done in one attempt with its lease cleared"
    );
}

// ---------------------------------------------------------------------------
// Retries, backoff, deadlines, abandon

#[tokio::test]
async fn retries_back_off_within_bounds_and_exhausted_attempts_abandon_exactly_once() {
    let dir = crate::harness::tempdir();
    let clock = manual_clock();
    let handler = Scripted::new(KIND);
    handler.script(
        "k",
        [
            Outcome::Retry("one".into()),
            Outcome::Retry("two".into()),
            Outcome::Retry("three".into()),
        ],
    );
    let (queue, runner) = runner_with(
        open_store(dir.path()).await,
        clock.clone(),
        config(|c| {
            c.max_attempts = 3;
            c.backoff_base = Duration::from_secs(10);
            c.backoff_cap = Duration::from_secs(3600);
        }),
        vec![handler.clone()],
    );
    let id = queue
        .enqueue(JobSpec::new(KIND, "k", json!({})))
        .await
        .unwrap()
        .id();

    // Attempt 1 → retry after [base/2, base].
    assert_eq!(runner.run_due().await, 1);
    assert_eq!(handler.calls_for("k"), 1);
    let row = job(&queue, id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("queued", 1));
    assert_eq!(row.last_error.as_deref(), Some("one"));
    assert!(row.lease_owner.is_none());
    let delay = row.run_at - clock.unix_ms();
    assert!((5_000..=10_000).contains(&delay), "first delay {delay} ms");

    // Not before its time.
    clock.advance(Duration::from_millis(delay as u64 - 1));
    assert_eq!(runner.run_due().await, 0, "ran before its retry time");
    assert_eq!(handler.calls_for("k"), 1);

    // Attempt 2 at run_at → retry after [2·base/2, 2·base].
    clock.advance(Duration::from_millis(1));
    assert_eq!(runner.run_due().await, 1);
    assert_eq!(handler.calls_for("k"), 2);
    let row = job(&queue, id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("queued", 2));
    let delay = row.run_at - clock.unix_ms();
    assert!(
        (10_000..=20_000).contains(&delay),
        "second delay {delay} ms"
    );
    assert!(handler.abandons().is_empty(), "no abandon between retries");

    // Attempt 3 → attempts exhausted → abandon, once.
    clock.advance(Duration::from_millis(delay as u64));
    assert_eq!(runner.run_due().await, 1);
    assert_eq!(handler.calls_for("k"), 3);
    assert_eq!(
        handler.abandons(),
        vec![(
            "k".to_owned(),
            RetireReason::AttemptsExhausted {
                attempts: 3,
                last_error: "three".into()
            }
        )]
    );
    let row = job(&queue, id).await;
    assert_eq!(row.status.as_str(), "failed");
    assert!(row.finished_at.is_some());
    assert!(row.lease_owner.is_none());

    for _ in 0..3 {
        clock.advance(Duration::from_secs(7200));
        assert_eq!(runner.run_due().await, 0, "a failed job was claimed again");
    }
    assert_eq!(handler.calls_for("k"), 3);
    assert_eq!(handler.abandons().len(), 1, "abandon ran more than once");
    assert_eq!(queue.observer.get("abandoned", KIND), 1);
    assert_eq!(queue.observer.get("retried", KIND), 2);
}

#[tokio::test]
async fn a_deadline_that_passes_while_a_job_waits_for_its_retry_abandons_it_exactly_once() {
    let dir = crate::harness::tempdir();
    let clock = manual_clock();
    let handler = Scripted::new(KIND);
    handler.script("k", [Outcome::Retry("not yet".into())]);
    let (queue, runner) = runner_with(
        open_store(dir.path()).await,
        clock.clone(),
        config(|c| {
            c.max_attempts = 10;
            c.backoff_base = Duration::from_secs(60);
            c.backoff_cap = Duration::from_secs(3600);
        }),
        vec![handler.clone()],
    );
    let deadline = clock.now() + Duration::from_secs(5);
    let id = queue
        .enqueue(JobSpec {
            deadline: Some(deadline),
            ..JobSpec::new(KIND, "k", json!({}))
        })
        .await
        .unwrap()
        .id();

    assert_eq!(runner.run_due().await, 1);
    let row = job(&queue, id).await;
    assert_eq!(row.status.as_str(), "queued");
    assert_eq!(row.deadline, Some(ms(deadline)));
    assert_eq!(
        row.run_at,
        ms(deadline),
        "the retry waits no longer than the deadline"
    );

    clock.advance(Duration::from_secs(5));
    assert_eq!(runner.run_due().await, 1);
    assert_eq!(
        handler.calls_for("k"),
        1,
        "an attempt ran after the deadline"
    );
    assert_eq!(
        handler.abandons(),
        vec![("k".to_owned(), RetireReason::DeadlinePassed)]
    );
    let row = job(&queue, id).await;
    assert_eq!(row.status.as_str(), "failed");
    assert!(row.lease_owner.is_none());

    clock.advance(Duration::from_secs(3600));
    assert_eq!(runner.run_due().await, 0);
    assert_eq!(handler.abandons().len(), 1);
}

#[tokio::test]
async fn a_huge_retry_after_holds_a_job_back_a_day_without_overflowing_its_run_time() {
    let dir = crate::harness::tempdir();
    let clock = manual_clock();
    let handler = Scripted::new(KIND);
    // What an upstream's or a receiver's `Retry-After` can say.
    let asked = [
        ("max", Duration::from_secs(u64::MAX)),
        ("trillion", Duration::from_secs(1_000_000_000_000)),
        ("huge", Duration::MAX),
    ];
    for (key, after) in asked {
        handler.script(key, [Outcome::RetryAfter(after, "come back later".into())]);
    }
    let (queue, runner) = runner_with(
        open_store(dir.path()).await,
        clock.clone(),
        config(|c| c.max_attempts = 10),
        vec![handler.clone()],
    );
    let mut ids = Vec::new();
    for (key, _) in asked {
        ids.push(
            queue
                .enqueue(JobSpec::new(KIND, key, json!({})))
                .await
                .unwrap()
                .id(),
        );
    }
    assert_eq!(runner.run_due().await, 3);
    for id in ids {
        let row = job(&queue, id).await;
        assert_eq!(row.status.as_str(), "queued", "{row:?}");
        assert_eq!(
            row.run_at - clock.unix_ms(),
            86_400_000,
            "{}: held back exactly a day",
            row.key
        );
    }
    clock.advance(Duration::from_secs(86_400));
    assert_eq!(runner.run_due().await, 3, "each runs again a day later");
}

#[tokio::test]
async fn a_failed_outcome_abandons_exactly_once_and_done_never_does() {
    let dir = crate::harness::tempdir();
    let clock = manual_clock();
    let handler = Scripted::new(KIND);
    let later = clock.now() + Duration::from_secs(3600);
    handler.script("fails", [Outcome::Failed("no".into())]);
    handler.script("done", [Outcome::Done]);
    handler.script("again", [Outcome::Reschedule(later)]);
    let (queue, runner) = runner_with(
        open_store(dir.path()).await,
        clock.clone(),
        config(|c| c.max_attempts = 5),
        vec![handler.clone()],
    );
    let mut ids = HashMap::new();
    for key in ["fails", "done", "again"] {
        let id = queue
            .enqueue(JobSpec::new(KIND, key, json!({})))
            .await
            .unwrap()
            .id();
        ids.insert(key, id);
    }

    assert_eq!(runner.run_due().await, 3);
    assert_eq!(
        handler.abandons(),
        vec![("fails".to_owned(), RetireReason::Failed("no".into()))]
    );
    let failed = job(&queue, ids["fails"]).await;
    assert_eq!(failed.status.as_str(), "failed");
    assert_eq!(failed.attempts, 1, "a refusal is not retried");
    assert!(
        failed.last_error.as_deref().unwrap_or("").contains("no"),
        "{:?}",
        failed.last_error
    );
    let done = job(&queue, ids["done"]).await;
    assert_eq!(done.status.as_str(), "done");
    assert!(done.finished_at.is_some() && done.lease_owner.is_none());
    let again = job(&queue, ids["again"]).await;
    assert_eq!(
        (again.status.as_str(), again.attempts, again.run_at),
        ("queued", 0, ms(later)),
        "a rescheduled job is queued for its new time with its attempts reset"
    );
    assert!(again.lease_owner.is_none());

    // Nothing more happens until the rescheduled time; then only it runs,
    // and nothing is abandoned again.
    clock.advance(Duration::from_secs(3599));
    assert_eq!(runner.run_due().await, 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(runner.run_due().await, 1);
    assert_eq!(
        (
            handler.calls_for("fails"),
            handler.calls_for("done"),
            handler.calls_for("again")
        ),
        (1, 1, 2)
    );
    assert_eq!(job(&queue, ids["again"]).await.status.as_str(), "done");
    assert_eq!(handler.abandons().len(), 1);
}

// ---------------------------------------------------------------------------
// Misbehaving handlers

/// Panics for "boom", hangs for "hang", succeeds for everything else.
struct Unruly {
    calls: Mutex<HashMap<String, usize>>,
    abandons: Mutex<Vec<(String, RetireReason)>>,
}

impl JobHandler for Unruly {
    fn kind(&self) -> &'static str {
        "test.unruly"
    }

    /// Only the hanging job runs on the queue's short budget: a panic
    /// prints its backtrace before it unwinds, which on a loaded machine
    /// (RUST_BACKTRACE=1) can take longer than that, and must still be
    /// reported as a panic.
    fn budget(&self, job: &JobRow) -> Option<Duration> {
        (job.key != "hang").then_some(Duration::from_secs(30))
    }

    fn run<'a>(&'a self, job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            *self
                .calls
                .lock()
                .unwrap()
                .entry(job.key.clone())
                .or_default() += 1;
            match job.key.as_str() {
                "boom" => panic!("boom goes the handler"),
                "hang" => {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    Outcome::Done
                }
                _ => Outcome::Done,
            }
        })
    }

    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.abandons
                .lock()
                .unwrap()
                .push((job.key.clone(), reason.clone()));
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_handler_and_one_that_hangs_past_its_budget_are_retried_while_other_jobs_run() {
    let dir = crate::harness::tempdir();
    let handler = Arc::new(Unruly {
        calls: Mutex::default(),
        abandons: Mutex::default(),
    });
    let (queue, runner) = runner_with(
        open_store(dir.path()).await,
        Arc::new(SystemClock),
        config(|c| {
            c.concurrency = 4;
            // Room for a late renewal on a loaded machine: this test is
            // about budgets and panics, not leases.
            c.lease = Duration::from_secs(3);
            c.attempt_budget = Duration::from_millis(300);
            c.backoff_base = Duration::from_millis(50);
            c.backoff_cap = Duration::from_millis(100);
            c.max_attempts = 3;
        }),
        vec![handler.clone()],
    );
    let (stop, stop_rx) = watch::channel(false);
    let looping = tokio::spawn(Arc::clone(&runner).run(stop_rx, Duration::from_secs(1)));

    // The bad ones first, so they hold slots while the others run.
    let mut ids = HashMap::new();
    let keys: Vec<String> = ["boom", "hang"]
        .into_iter()
        .map(str::to_owned)
        .chain((0..20).map(|i| format!("ok-{i}")))
        .collect();
    for key in &keys {
        let id = queue
            .enqueue(JobSpec::new("test.unruly", key.clone(), json!({})))
            .await
            .unwrap()
            .id();
        ids.insert(key.clone(), id);
    }

    let store = queue.store.clone();
    let ids_ref = &ids;
    eventually(
        Duration::from_secs(30),
        "the good jobs to be done and the bad ones retired",
        || {
            let store = store.clone();
            async move {
                let mut settled = true;
                for (key, id) in ids_ref {
                    let row = store.job(*id).await.unwrap().unwrap();
                    let want = if key.starts_with("ok-") {
                        "done"
                    } else {
                        "failed"
                    };
                    settled &= row.status.as_str() == want;
                }
                settled
            }
        },
    )
    .await;
    assert!(
        !looping.is_finished(),
        "the runner loop died under misbehaving handlers"
    );

    let calls = handler.calls.lock().unwrap().clone();
    for i in 0..20 {
        assert_eq!(calls.get(&format!("ok-{i}")), Some(&1), "ok-{i}");
    }
    for (key, needle) in [("boom", "panicked"), ("hang", "budget")] {
        let row = job(&queue, ids[key]).await;
        assert_eq!(row.attempts, 3, "{key}: {row:?}");
        assert_eq!(calls.get(key), Some(&3), "{key} ran three times");
        let error = row.last_error.unwrap_or_default();
        assert!(error.contains(needle), "{key}: last error {error:?}");
    }
    let abandons = handler.abandons.lock().unwrap().clone();
    assert_eq!(abandons.len(), 2, "{abandons:?}");
    for (key, needle) in [("boom", "panicked"), ("hang", "budget")] {
        let reasons: Vec<_> = abandons.iter().filter(|(k, _)| k == key).collect();
        assert_eq!(reasons.len(), 1, "{key} abandoned once: {abandons:?}");
        match &reasons[0].1 {
            RetireReason::AttemptsExhausted {
                attempts: 3,
                last_error,
            } if last_error.contains(needle) => {}
            other => panic!("{key}: unexpected reason {other:?}"),
        }
    }

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), looping)
        .await
        .expect("the runner stops")
        .expect("the runner did not panic");
}

// ---------------------------------------------------------------------------
// Identity, leases, registry

#[tokio::test]
async fn enqueueing_a_live_identity_twice_queues_once_and_after_it_finishes_it_can_be_queued_again()
{
    let dir = crate::harness::tempdir();
    let clock = manual_clock();
    let handler = Scripted::new(KIND);
    let (queue, runner) = runner_with(
        open_store(dir.path()).await,
        clock.clone(),
        config(|_| {}),
        vec![handler.clone()],
    );

    let first = queue
        .enqueue(JobSpec::new(KIND, "same", json!({"n": 1})))
        .await
        .unwrap();
    let Enqueued::Queued(id) = first else {
        panic!("first enqueue: {first:?}");
    };
    let second = queue
        .enqueue(JobSpec::new(KIND, "same", json!({"n": 2})))
        .await
        .unwrap();
    assert_eq!(second, Enqueued::AlreadyQueued(id));
    // The same key of another kind is another identity.
    let other = queue
        .enqueue(JobSpec::new("test.other-kind", "same", json!({})))
        .await
        .unwrap();
    assert!(matches!(other, Enqueued::Queued(o) if o != id), "{other:?}");

    let rows = queue
        .store
        .list_jobs(Some(KIND), None, None, 100)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].payload, json!({"n": 1}).to_string());

    assert_eq!(runner.run_due().await, 1);
    assert_eq!(handler.calls_for("same"), 1);
    assert_eq!(job(&queue, id).await.status.as_str(), "done");

    let third = queue
        .enqueue(JobSpec::new(KIND, "same", json!({"n": 3})))
        .await
        .unwrap();
    assert!(
        matches!(third, Enqueued::Queued(new) if new != id),
        "a finished identity can be queued again: {third:?}"
    );
    assert_eq!(
        queue
            .store
            .list_jobs(Some(KIND), None, None, 100)
            .await
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn a_claim_fills_each_kind_s_own_slots_and_no_owner_takes_more_than_its_cap() {
    let dir = crate::harness::tempdir();
    let store = open_store(dir.path()).await;
    let t = 1_700_000_000_000_i64;
    let queue = |kind: &'static str, key: String, fair_key: Option<&'static str>, at: i64| {
        let store = store.clone();
        async move {
            store
                .insert_job(
                    &NewJob {
                        kind,
                        key: &key,
                        payload: "{}",
                        run_at: at,
                        deadline: None,
                        max_attempts: 5,
                        fair_key,
                    },
                    at,
                )
                .await
                .unwrap();
        }
    };
    // One owner's backlog queued first, then another owner's job, then
    // work of another kind.
    for i in 0..20 {
        queue("validate", format!("greedy-{i}"), Some("greedy"), t + i).await;
    }
    queue("validate", "polite".into(), Some("polite"), t + 100).await;
    queue("deliver", "hook".into(), None, t + 200).await;
    let claimed = store
        .claim_jobs("r", &[("validate", 4), ("deliver", 4)], t + 1000, 60_000, 2)
        .await
        .unwrap();
    let mut keys: Vec<&str> = claimed.iter().map(|j| j.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["greedy-0", "greedy-1", "hook", "polite"]);
    // With its two running, the greedy owner gets nothing more, however
    // many slots are free.
    let more = store
        .claim_jobs(
            "r",
            &[("validate", 10), ("deliver", 4)],
            t + 2000,
            60_000,
            2,
        )
        .await
        .unwrap();
    assert_eq!(more, vec![]);
    // A kind with no free slot is not claimed at all.
    let none = store
        .claim_jobs("r", &[("validate", 0)], t + 2000, 60_000, 100)
        .await
        .unwrap();
    assert_eq!(none, vec![]);
}

/// Queues one job of [`KIND`] (key `k`, five attempts) due at `t`; its id.
async fn queue_one(store: &Store, t: i64) -> i64 {
    store
        .insert_job(
            &NewJob {
                kind: KIND,
                key: "k",
                payload: "{}",
                run_at: t,
                deadline: None,
                max_attempts: 5,
                fair_key: None,
            },
            t,
        )
        .await
        .unwrap()
        .id()
}

#[tokio::test]
async fn a_job_held_back_before_it_did_anything_keeps_the_error_of_its_last_attempt() {
    let dir = crate::harness::tempdir();
    let store = open_store(dir.path()).await;
    let t = 1_700_000_000_000_i64;
    let id = queue_one(&store, t).await;
    let claim = |at: i64| {
        let store = store.clone();
        async move {
            let claimed = store
                .claim_jobs("a", &[(KIND, 10)], at, 1000, 8)
                .await
                .unwrap();
            assert_eq!(claimed.len(), 1, "claimed at {at}");
        }
    };
    let requeue = |at: i64, error: Option<&'static str>, attempts| {
        let store = store.clone();
        async move {
            assert!(
                store
                    .requeue_job(id, "a", at, at, error, attempts)
                    .await
                    .unwrap()
            );
            let row = store.job(id).await.unwrap().unwrap();
            (row.attempts, row.last_error)
        }
    };
    use acme_proxy_store::Attempts::{Keep, Reset, Uncount};
    // An attempt fails; the next is held back (a breaker open, a budget
    // spent) twice: the failure stays what the job shows.
    claim(t).await;
    const FAILED: &str = "the upstream answered 503";
    let failed = Some(FAILED.to_owned());
    assert_eq!(
        requeue(t + 1, Some(FAILED), Keep).await,
        (1, failed.clone())
    );
    for at in [t + 2, t + 4] {
        claim(at).await;
        assert_eq!(requeue(at + 1, None, Uncount).await, (1, failed.clone()));
    }
    // Held back with a reason of its own: that one.
    claim(t + 6).await;
    assert_eq!(
        requeue(t + 7, Some("paused by the upstream"), Uncount).await,
        (1, Some("paused by the upstream".to_owned()))
    );
    // A held mark does not outlive the hold; a new period clears it all.
    claim(t + 8).await;
    assert!(
        store
            .hold_job(id, "a", t + 9, t + 9, "profile web is not mounted")
            .await
            .unwrap()
    );
    claim(t + 10).await;
    assert_eq!(requeue(t + 11, None, Uncount).await, (1, None));
    claim(t + 12).await;
    assert_eq!(
        requeue(t + 13, Some("x"), Keep).await,
        (2, Some("x".to_owned()))
    );
    claim(t + 14).await;
    assert_eq!(requeue(t + 15, None, Reset).await, (0, None));
}

#[tokio::test]
async fn a_stale_runner_cannot_settle_a_job_another_runner_reclaimed() {
    let dir = crate::harness::tempdir();
    let store = open_store(dir.path()).await;
    let t = 1_700_000_000_000_i64;
    let id = queue_one(&store, t).await;

    let a = store
        .claim_jobs("a", &[(KIND, 10)], t, 1000, 8)
        .await
        .unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].attempts, a[0].lease_owner.as_deref()), (1, Some("a")));
    // Still leased to "a": nobody else gets it.
    assert!(
        store
            .claim_jobs("b", &[(KIND, 10)], t + 999, 1000, 8)
            .await
            .unwrap()
            .is_empty()
    );

    // "a" went quiet; its lease ran out and "b" reclaimed the job.
    let b = store
        .claim_jobs("b", &[(KIND, 10)], t + 2000, 1000, 8)
        .await
        .unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(
        (b[0].id, b[0].attempts, b[0].lease_owner.as_deref()),
        (id, 2, Some("b"))
    );

    // "a" comes back and tries every settlement: all refused.
    assert_eq!(
        store
            .renew_job_lease(id, "a", t + 2100, 1000)
            .await
            .unwrap(),
        None
    );
    assert!(!store.finish_job(id, "a", t + 2100).await.unwrap());
    assert!(
        !store
            .requeue_job(
                id,
                "a",
                t + 2100,
                t + 5000,
                Some("late"),
                acme_proxy_store::Attempts::Keep,
            )
            .await
            .unwrap()
    );
    assert!(
        !store
            .begin_retire_job(id, "a", t + 2100, "late")
            .await
            .unwrap()
    );
    assert!(!store.release_job(id, "a", t + 2100).await.unwrap());
    let row = store.job(id).await.unwrap().unwrap();
    assert_eq!(
        (
            row.status.as_str(),
            row.lease_owner.as_deref(),
            row.attempts
        ),
        ("running", Some("b"), 2),
        "the stale runner changed the job: {row:?}"
    );
    assert_eq!(row.last_error, None);

    // Held back before it did anything (a budget, a pause): queued again,
    // its claim not counted as an attempt.
    assert!(
        store
            .requeue_job(
                id,
                "b",
                t + 2200,
                t + 2300,
                None,
                acme_proxy_store::Attempts::Uncount,
            )
            .await
            .unwrap()
    );
    let row = store.job(id).await.unwrap().unwrap();
    assert_eq!(
        (row.status.as_str(), row.attempts, row.run_at),
        ("queued", 1, t + 2300)
    );
    let b = store
        .claim_jobs("b", &[(KIND, 10)], t + 2300, 1000, 8)
        .await
        .unwrap();
    assert_eq!(b[0].attempts, 2);

    // The holder settles.
    assert!(store.finish_job(id, "b", t + 2400).await.unwrap());
    let row = store.job(id).await.unwrap().unwrap();
    assert_eq!(row.status.as_str(), "done");
    assert!(!store.finish_job(id, "b", t + 2500).await.unwrap());
}

#[tokio::test]
async fn releasing_held_jobs_makes_only_those_waiting_for_the_configuration_due() {
    let dir = crate::harness::tempdir();
    let store = open_store(dir.path()).await;
    let t = 1_700_000_000_000_i64;
    for key in ["held", "backing-off"] {
        let new = NewJob {
            kind: KIND,
            key,
            payload: "{}",
            run_at: t,
            deadline: None,
            max_attempts: 5,
            fair_key: None,
        };
        store.insert_job(&new, t).await.unwrap();
    }
    let claimed = store
        .claim_jobs("a", &[(KIND, 10)], t, 1000, 8)
        .await
        .unwrap();
    let id = |key: &str| claimed.iter().find(|j| j.key == key).expect(key).id;
    let (held, backing_off) = (id("held"), id("backing-off"));
    // Both next look half a minute on: one held for its profile, one
    // after a failed attempt.
    let later = t + 30_000;
    assert!(
        store
            .hold_job(held, "a", t + 10, later, "profile web is not mounted")
            .await
            .unwrap()
    );
    assert!(
        store
            .requeue_job(
                backing_off,
                "a",
                t + 10,
                later,
                // Not a hold, however it is spelled.
                Some("Held: the upstream answered 503"),
                acme_proxy_store::Attempts::Keep,
            )
            .await
            .unwrap()
    );
    let row = store.job(held).await.unwrap().unwrap();
    assert_eq!(
        (row.attempts, row.last_error.as_deref()),
        (0, Some("held: profile web is not mounted"))
    );

    assert_eq!(store.release_held_jobs(t + 100).await.unwrap(), 1);
    let run_at = |id| {
        let store = store.clone();
        async move { store.job(id).await.unwrap().unwrap().run_at }
    };
    assert_eq!(
        (run_at(held).await, run_at(backing_off).await),
        (t + 100, later)
    );
    let due = store
        .claim_jobs("a", &[(KIND, 10)], t + 100, 1000, 8)
        .await
        .unwrap();
    assert_eq!(
        due.iter().map(|j| j.id).collect::<Vec<_>>(),
        [held],
        "only the held job is due; the other keeps its backoff"
    );
    // Nothing held is left to release.
    assert_eq!(store.release_held_jobs(t + 200).await.unwrap(), 0);
}

/// A handler that always holds its job, as for a profile not mounted;
/// when `reload` is set, a new configuration comes into force during the
/// attempt (a reload whose release of held jobs ran before it ended).
struct Holds {
    queue: std::sync::OnceLock<Arc<Queue>>,
    reload: std::sync::atomic::AtomicBool,
}

impl JobHandler for Holds {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn run<'a>(&'a self, _job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            if self.reload.swap(false, std::sync::atomic::Ordering::SeqCst) {
                self.queue.get().expect("the queue").configuration_changed();
            }
            Outcome::Hold("profile web is not mounted".into())
        })
    }

    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { panic!("a held job was abandoned: {job:?}, {reason:?}") })
    }
}

#[tokio::test]
async fn a_job_held_under_a_configuration_replaced_during_its_attempt_looks_again_at_once() {
    let dir = crate::harness::tempdir();
    let clock = manual_clock();
    let handler = Arc::new(Holds {
        queue: std::sync::OnceLock::new(),
        reload: std::sync::atomic::AtomicBool::new(false),
    });
    let (queue, runner) = runner_with(
        open_store(dir.path()).await,
        clock.clone(),
        config(|_| {}),
        vec![handler.clone()],
    );
    handler.queue.set(Arc::clone(&queue)).expect("set once");
    let id = queue
        .enqueue(JobSpec::new(KIND, "k", json!({})))
        .await
        .unwrap()
        .id();
    let next_look = || async { job(&queue, id).await.run_at - clock.unix_ms() };

    // Held with nothing changed: it looks again in 30 s.
    assert_eq!(runner.run_due().await, 1);
    assert_eq!(next_look().await, 30_000);
    clock.advance(Duration::from_secs(30));
    // Held while a reload came into force: due at once.
    handler
        .reload
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(runner.run_due().await, 1);
    assert_eq!(next_look().await, 0);
    let row = job(&queue, id).await;
    assert_eq!(
        (row.status.as_str(), row.attempts),
        ("queued", 0),
        "a hold spends no attempt: {row:?}"
    );
    // It looks again under the new configuration, and is held as usual.
    assert_eq!(runner.run_due().await, 1);
    assert_eq!(next_look().await, 30_000);
}

#[tokio::test]
async fn a_registry_refuses_two_handlers_for_one_kind_and_a_runner_never_claims_a_kind_it_has_no_handler_for()
 {
    let dir = crate::harness::tempdir();
    let clock = manual_clock();
    let accepted = Scripted::new(KIND);
    let refused = Scripted::new(KIND);
    let mut registry = Registry::default();
    registry
        .register(accepted.clone())
        .expect("the first handler");
    let err = registry
        .register(refused.clone())
        .expect_err("a second handler for the same kind");
    assert!(err.contains(KIND), "the error names the kind: {err}");
    assert_eq!(registry.kinds(), vec![KIND]);

    let queue = Arc::new(Queue::new(
        open_store(dir.path()).await,
        clock.clone(),
        config(|_| {}),
    ));
    let runner = Arc::new(Runner::new(Arc::clone(&queue), registry));
    let orphan = queue
        .enqueue(JobSpec::new("orphan", "o", json!({})))
        .await
        .unwrap()
        .id();
    let mine = queue
        .enqueue(JobSpec::new(KIND, "m", json!({})))
        .await
        .unwrap()
        .id();

    assert_eq!(
        runner.run_due().await,
        1,
        "only the handled kind is claimed"
    );
    clock.advance(Duration::from_secs(3600));
    assert_eq!(runner.run_due().await, 0);
    let row = job(&queue, orphan).await;
    assert_eq!(
        (
            row.status.as_str(),
            row.attempts,
            row.lease_owner.as_deref()
        ),
        ("queued", 0, None),
        "the orphan was touched: {row:?}"
    );
    assert_eq!(job(&queue, mine).await.status.as_str(), "done");
    assert_eq!(
        accepted.total_calls() + refused.total_calls(),
        1,
        "the handled job ran once"
    );
    assert_eq!(
        (accepted.total_calls(), refused.total_calls()),
        (1, 0),
        "a refused registration must leave the first handler in place"
    );
}

// ---------------------------------------------------------------------------
// Shutdown

/// Runs until told to finish (tests that never tell it: for ever); says
/// when an attempt starts and when its future is dropped (cancelled).
struct Sleeper {
    started: AtomicUsize,
    dropped: Arc<AtomicBool>,
    finish: tokio::sync::Semaphore,
}

impl Sleeper {
    fn new() -> Arc<Self> {
        Arc::new(Sleeper {
            started: AtomicUsize::new(0),
            dropped: Arc::default(),
            finish: tokio::sync::Semaphore::new(0),
        })
    }

    /// Waits (at most 10 s) for the first attempt to start.
    async fn wait_started(self: &Arc<Self>) {
        eventually(Duration::from_secs(10), "the attempt to start", || {
            let this = Arc::clone(self);
            async move { this.started.load(Ordering::SeqCst) == 1 }
        })
        .await;
    }

    /// Waits (at most `within`) for an attempt's future to be dropped.
    async fn wait_dropped(self: &Arc<Self>, within: Duration, what: &str) {
        eventually(within, what, || {
            let dropped = Arc::clone(&self.dropped);
            async move { dropped.load(Ordering::SeqCst) }
        })
        .await;
    }
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl JobHandler for Sleeper {
    fn kind(&self) -> &'static str {
        "test.sleeper"
    }

    fn run<'a>(&'a self, _job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let _guard = SetOnDrop(Arc::clone(&self.dropped));
            self.started.fetch_add(1, Ordering::SeqCst);
            let _go = self.finish.acquire().await.expect("the gate");
            Outcome::Done
        })
    }

    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { panic!("job {} abandoned: {reason}", job.key) })
    }
}

/// Starts a runner loop over a sleeping job, waits until the attempt runs,
/// stops the loop with `grace`, and returns the queue, the job id and the
/// handler.
async fn shut_down_during_an_attempt(
    dir: &std::path::Path,
    grace: Duration,
) -> (Arc<Queue>, i64, Arc<Sleeper>) {
    let handler = Sleeper::new();
    let (queue, runner) = runner_with(
        open_store(dir).await,
        Arc::new(SystemClock),
        config(|c| {
            c.lease = Duration::from_secs(1);
            c.attempt_budget = Duration::from_secs(7200);
        }),
        vec![handler.clone()],
    );
    let (stop, stop_rx) = watch::channel(false);
    let looping = tokio::spawn(Arc::clone(&runner).run(stop_rx, grace));
    let id = queue
        .enqueue(JobSpec::new("test.sleeper", "zzz", json!({})))
        .await
        .unwrap()
        .id();
    handler.wait_started().await;
    let row = job(&queue, id).await;
    assert_eq!(
        (
            row.status.as_str(),
            row.attempts,
            row.lease_owner.as_deref()
        ),
        ("running", 1, Some(runner.owner()))
    );

    stop.send(true).unwrap();
    tokio::time::timeout(grace + Duration::from_secs(10), looping)
        .await
        .expect("the runner stops within its grace")
        .expect("the runner did not panic");
    (queue, id, handler)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_releases_the_leases_it_holds() {
    let dir = crate::harness::tempdir();
    let (queue, id, handler) =
        shut_down_during_an_attempt(dir.path(), Duration::from_millis(200)).await;
    let row = job(&queue, id).await;
    assert_eq!(row.status.as_str(), "queued", "{row:?}");
    assert_eq!(row.lease_owner, None);
    assert_eq!(row.lease_until, None);
    assert_eq!(row.attempts, 0, "the interrupted attempt is not counted");
    assert!(row.run_at <= SystemClock.unix_ms(), "claimable at once");
    assert_eq!(handler.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_stops_the_attempts_whose_leases_it_gives_back() {
    // A released job may be claimed at once by another runner; an attempt
    // left running here would then overlap with the new one.
    let dir = crate::harness::tempdir();
    let (queue, id, handler) =
        shut_down_during_an_attempt(dir.path(), Duration::from_millis(200)).await;
    assert_eq!(job(&queue, id).await.status.as_str(), "queued");
    handler
        .wait_dropped(
            Duration::from_secs(2),
            "the interrupted attempt to be cancelled after its lease was released",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_job_queued_by_another_process_wakes_the_runner_long_before_its_next_poll() {
    const KIND: &str = "test.woken";
    // PostgreSQL whatever the suite's backend: LISTEN/NOTIFY is its own.
    let url = crate::harness::fresh_postgres_database();
    let open = || async {
        Store::open(&url, &StoreOptions::default())
            .await
            .expect("open the store")
    };
    let (other, runner_store) = (open().await, open().await);
    let handler = Scripted::new(KIND);
    let clock: SharedClock = Arc::new(SystemClock);
    // Polls once a minute: only a wake-up makes it claim sooner.
    let slow = config(|c| c.poll_interval = Duration::from_secs(60));
    let (own_queue, runner) = runner_with(
        runner_store,
        Arc::clone(&clock),
        slow.clone(),
        vec![handler.clone()],
    );
    let (stop, stop_rx) = watch::channel(false);
    let running = tokio::spawn(Arc::clone(&runner).run(stop_rx, Duration::from_secs(5)));
    // A job of its own process first: once it has run, the runner is in
    // its loop, listening.
    own_queue
        .enqueue(JobSpec::new(KIND, "own", json!({})))
        .await
        .expect("enqueue");
    eventually(Duration::from_secs(10), "the runner's own job", || async {
        handler.calls_for("own") == 1
    })
    .await;

    // Queued by another process (its own store, no runner): heard at once.
    let elsewhere = Arc::new(Queue::new(other, clock, slow));
    elsewhere
        .enqueue(JobSpec::new(KIND, "elsewhere", json!({})))
        .await
        .expect("enqueue");
    eventually(
        Duration::from_secs(10),
        "the job queued elsewhere, within seconds of a minute's poll",
        || async { handler.calls_for("elsewhere") == 1 },
    )
    .await;
    stop.send(true).unwrap();
    running.await.expect("the runner stops");
}

// ---------------------------------------------------------------------------
// Leases that lapse under their holder, and abandons that fail

/// An abandon whose writes fail is not the end of the job: it stays
/// retiring, and once its lease lapses it is retired again, until the
/// abandon has done its work (an order made invalid, an audit row).
#[tokio::test]
async fn an_abandon_that_fails_leaves_the_job_retiring_and_is_run_again_once_its_lease_lapses() {
    let dir = crate::harness::tempdir();
    let clock = manual_clock();
    let handler = Scripted::new(KIND);
    handler.script("fails", [Outcome::Failed("no".into())]);
    handler
        .failing_abandons
        .lock()
        .unwrap()
        .insert("fails".to_owned(), 1);
    let lease = Duration::from_secs(30);
    let (queue, runner) = runner_with(
        open_store(dir.path()).await,
        clock.clone(),
        config(|c| c.lease = lease),
        vec![handler.clone()],
    );
    let id = queue
        .enqueue(JobSpec::new(KIND, "fails", json!({})))
        .await
        .unwrap()
        .id();

    assert_eq!(runner.run_due().await, 1);
    assert_eq!(handler.abandons().len(), 1);
    let row = job(&queue, id).await;
    assert_eq!(
        (row.status.as_str(), row.lease_owner.as_deref()),
        ("retiring", Some(runner.owner())),
        "not retired while its abandon failed: {row:?}"
    );
    // Not before its lease lapses: a second abandon at once would only
    // meet the same refusal.
    assert_eq!(runner.run_due().await, 0);
    clock.advance(lease);
    assert_eq!(runner.run_due().await, 1);
    let abandons = handler.abandons();
    assert_eq!(abandons.len(), 2, "{abandons:?}");
    match &abandons[1].1 {
        RetireReason::Resumed(why) if why.contains("no") => {}
        other => panic!("the second abandon's reason: {other:?}"),
    }
    let row = job(&queue, id).await;
    assert_eq!(row.status.as_str(), "failed", "{row:?}");
    assert_eq!(handler.calls_for("fails"), 1, "the job itself ran once");
    // Retired now: nothing more to do.
    clock.advance(lease * 2);
    assert_eq!(runner.run_due().await, 0);
    assert_eq!(handler.abandons().len(), 2);
}

/// A lease can lapse under the runner still running the job (the clock
/// jumps, the process stalls past it), and that runner's own next claim
/// can take the job again, under the same owner. It must not start a
/// second attempt beside the first: the job's work would be done twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_claims_again_a_job_it_is_still_running_does_not_run_it_twice() {
    let dir = crate::harness::tempdir();
    let clock = manual_clock();
    let handler = Sleeper::new();
    let lease = Duration::from_secs(30);
    let (queue, runner) = runner_with(
        open_store(dir.path()).await,
        clock.clone(),
        config(|c| c.lease = lease),
        vec![handler.clone()],
    );
    let id = queue
        .enqueue(JobSpec::new("test.sleeper", "once", json!({})))
        .await
        .unwrap()
        .id();
    let first = tokio::spawn({
        let runner = Arc::clone(&runner);
        async move { runner.run_due().await }
    });
    handler.wait_started().await;
    // The lease lapses by the queue's clock; the heartbeat (every ten
    // seconds of real time here) has not renewed it.
    clock.advance(lease * 2);
    let again = tokio::time::timeout(Duration::from_secs(10), runner.run_due()).await;
    assert_eq!(
        handler.started.load(Ordering::SeqCst),
        1,
        "a second attempt of the job started beside the first"
    );
    assert_eq!(again.expect("the second claim returned at once"), 1);
    let row = job(&queue, id).await;
    assert_eq!(
        (
            row.status.as_str(),
            row.lease_owner.as_deref(),
            row.attempts
        ),
        ("running", Some(runner.owner()), 1),
        "the claim that ran nothing counts no attempt"
    );
    assert!(
        row.lease_until.is_some_and(|until| until > clock.unix_ms()),
        "the claim renewed the lease for the attempt running: {row:?}"
    );
    // The first attempt settles the job as usual.
    handler.finish.add_permits(1);
    assert_eq!(first.await.expect("the first claim"), 1);
    assert_eq!(job(&queue, id).await.status.as_str(), "done");
    assert_eq!(handler.started.load(Ordering::SeqCst), 1);
}

/// Makes the job table of the store at `dir` (see [`open_store`]) refuse
/// every update: lease renewals fail from now on, as they do while the
/// database is away.
fn refuse_job_updates(dir: &std::path::Path) {
    if crate::harness::on_postgres() {
        let url = std::fs::read_to_string(dir.join("postgres-url")).expect("the database");
        crate::harness::psql_scalar(
            &url,
            "CREATE FUNCTION refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'job updates refused by the test'; END $$;
             CREATE TRIGGER refuse_jobs BEFORE UPDATE ON jobs
               FOR EACH ROW EXECUTE FUNCTION refuse_jobs();",
        );
    } else {
        rusqlite::Connection::open(dir.join("jobs.db"))
            .expect("open the database")
            .execute_batch(
                "CREATE TRIGGER refuse_jobs BEFORE UPDATE ON jobs
                 BEGIN SELECT RAISE(ABORT, 'job updates refused by the test'); END;",
            )
            .expect("the trigger");
    }
}

/// Holds a lock on every job row of the PostgreSQL database at `url`
/// until dropped (a psql session in a transaction): a lease renewal then
/// waits, as it does on a database that hangs.
fn lock_job_rows(url: &str) -> crate::harness::ChildGuard {
    use std::io::Write;
    let mut psql = std::process::Command::new("psql")
        .args(["-X", "-q"])
        .arg(url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run psql");
    psql.stdin
        .as_mut()
        .expect("psql's input")
        .write_all(
            b"BEGIN;
SELECT id FROM jobs FOR UPDATE;
",
        )
        .expect("ask psql");
    let held = crate::harness::ChildGuard(psql);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while crate::harness::psql_count(
        url,
        "SELECT COUNT(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
          WHERE c.relname = 'jobs' AND l.mode = 'RowShareLock' AND l.granted",
    ) == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "psql took no lock on the jobs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    held
}

/// How a runner's lease renewals stop working.
enum Renewals {
    /// Refused at once (the database answers with an error).
    Refused,
    /// Never answered while the test holds the rows (on PostgreSQL,
    /// whatever the suite's backend: SQLite's own wait for a lock is
    /// bounded by its busy timeout, on the calling thread).
    Hanging,
}

/// A runner whose lease renewals stop working (as `how` says) stops the
/// attempt before the lease lapses, rather than run on while another
/// runner may take the job and run it too.
async fn an_attempt_is_stopped_before_its_lease_lapses_when_renewals(how: Renewals) {
    let dir = crate::harness::tempdir();
    let handler = Sleeper::new();
    let lease = Duration::from_millis(900);
    let postgres = matches!(how, Renewals::Hanging).then(crate::harness::fresh_postgres_database);
    let store = match &postgres {
        Some(url) => Store::open(url, &StoreOptions::default())
            .await
            .expect("open the store"),
        None => open_store(dir.path()).await,
    };
    let (queue, runner) = runner_with(
        store,
        Arc::new(SystemClock),
        config(|c| {
            c.lease = lease;
            c.attempt_budget = Duration::from_secs(7200);
        }),
        vec![handler.clone()],
    );
    let (stop, stop_rx) = watch::channel(false);
    let looping = tokio::spawn(Arc::clone(&runner).run(stop_rx, Duration::from_millis(100)));
    queue
        .enqueue(JobSpec::new("test.sleeper", "zzz", json!({})))
        .await
        .unwrap();
    handler.wait_started().await;
    // Renewals work so far: the attempt outlives several leases.
    tokio::time::sleep(lease * 3).await;
    assert!(
        !handler.dropped.load(Ordering::SeqCst),
        "stopped while renewing"
    );
    let _locked = match how {
        Renewals::Refused => {
            refuse_job_updates(dir.path());
            None
        }
        Renewals::Hanging => Some(lock_job_rows(postgres.as_deref().expect("PostgreSQL"))),
    };
    let failing_since = std::time::Instant::now();
    handler
        .wait_dropped(
            Duration::from_secs(10),
            "the attempt to be stopped once its lease could not be renewed",
        )
        .await;
    // Two thirds of a lease after the last renewal, which was at most a
    // third of one before the renewals began to fail: within a lease of
    // that (twice that, for a loaded machine).
    assert!(
        failing_since.elapsed() < lease * 2,
        "stopped only after {:?}",
        failing_since.elapsed()
    );
    assert_eq!(handler.started.load(Ordering::SeqCst), 1);
    stop.send(true).unwrap();
    drop(_locked);
    tokio::time::timeout(Duration::from_secs(20), looping)
        .await
        .expect("the runner stops")
        .expect("the runner did not panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_whose_lease_renewals_are_refused_is_stopped_before_the_lease_lapses() {
    an_attempt_is_stopped_before_its_lease_lapses_when_renewals(Renewals::Refused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_an_attempt_whose_lease_renewals_hang_is_stopped_before_the_lease_lapses() {
    an_attempt_is_stopped_before_its_lease_lapses_when_renewals(Renewals::Hanging).await;
}
