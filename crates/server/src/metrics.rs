//! Prometheus metrics, exported with the official
//! `prometheus-client` crate at `/metrics` on a listener of their own (off
//! by default).
//!
//! Architecture Invariant: issuance and refusal counters are bumped only by
//! [`Metrics::audited`], from the same audit record that is written, so
//! the audit log and the counters cannot disagree. The one exception is
//! `revocations_refused`, which also counts the revocations refused without
//! a row (signed by no account, for a certificate never issued: anyone can
//! send those, and they must not grow the audit log).

use acme_proxy_protocol::types::{ChallengeStatus, ChallengeType};
use std::sync::Mutex;

use acme_proxy_store::{AuditEvent, AuditOutcome, NewAuditRow, Store};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Admin commands' audit rows read per query when metrics are exported.
const CLI_AUDIT_BATCH: i64 = 1000;

/// Label sets: a few fixed names with their values.
pub type Labels = Vec<(&'static str, String)>;

fn seconds_histogram() -> Histogram {
    // 1 ms to ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Every metric family of the process.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// HTTP requests by profile, route (the path pattern) and status.
    pub requests: Family<Labels, Counter>,
    /// Request latency by route.
    pub request_seconds: Histograms,
    /// Audit records by event, outcome and profile.
    pub audit_events: Family<Labels, Counter>,
    /// Certificates issued by profile.
    pub issued: Family<Labels, Counter>,
    /// Issuance failures and refusals by profile and reason (problem type).
    pub issue_failures: Family<Labels, Counter>,
    /// Refused revocations by profile and reason (problem type): the
    /// audited ones, and those signed by no account for a certificate the
    /// profile never issued, which are counted here only.
    pub revocations_refused: Family<Labels, Counter>,
    /// Challenge validations by type and outcome, and their latency.
    pub validations: Family<Labels, Counter>,
    pub validation_seconds: Histograms,
    /// Relay requests to upstream CAs by profile and class (2xx, 4xx, 5xx,
    /// transport, timeout).
    pub upstream_requests: Family<Labels, Counter>,
    /// Each upstream's circuit breaker: 1 for the state it is in
    /// (`closed`, `open`, `probing`), 0 for the others, by profile and
    /// upstream directory; read from the database, so every replica
    /// shows the same.
    pub upstream_breaker_state: Family<Labels, Gauge>,
    /// Changes of an upstream's breaker this process made, by profile and
    /// the state it went to.
    pub upstream_breaker_transitions: Family<Labels, Counter>,
    /// Outbound connections an `[egress]` proxy refused (`407`, `refused`)
    /// or that could not reach it (`unreachable`), by profile and client
    /// (`relay`, `webhook`).
    pub egress_proxy_failures: Family<Labels, Counter>,
    /// Open connections by listener (`acme`, `metrics`, `dns`: the DNS
    /// zone's TCP connections).
    pub connections_open: Family<Labels, Gauge>,
    /// Connections closed at accept by listener and the bound that refused
    /// them (`max_open`, `max_open_per_client`).
    pub connections_refused: Family<Labels, Counter>,
    /// ACME requests answered 503 at once, by the bound that was full
    /// (`max_in_flight`, `max_buffered_body_bytes`, `body_share`).
    pub requests_shed: Family<Labels, Counter>,
    /// Accepts that failed, by listener (out of file descriptors,
    /// typically).
    pub accept_failures: Family<Labels, Counter>,
    /// Queries the embedded DNS zone answered, by type and response code.
    pub dns_queries: Family<Labels, Counter>,
    /// Requests to the acme-dns API by endpoint (`register`, `update`) and
    /// outcome (`success`, `refused`, `limited`, `failure`).
    pub dns_api_requests: Family<Labels, Counter>,
    /// Requests to the web console by route (its pattern) and status.
    pub admin_requests: Family<Labels, Counter>,
    /// Console logins by outcome (`success`, `refused`, `throttled`).
    pub admin_logins: Family<Labels, Counter>,
    /// `[policy]` decisions by stage, rule (`default` for a profile's
    /// default) and decision (`allow`, `deny`, `warn`, `undecided`).
    pub policy_decisions: Family<Labels, Counter>,
    /// Requests refused by `[rate_limits]`, by limit.
    pub rate_limited: Family<Labels, Counter>,
    /// Refreshed at each scrape from the database.
    pub job_depth: Family<Labels, Gauge>,
    pub db_connections: Family<Labels, Gauge>,
    pub nonces: Gauge,
    /// The last audit row of an admin command counted; None until the
    /// server starts counting them ([`Metrics::count_cli_audit_after`]).
    cli_audit_counted: tokio::sync::Mutex<Option<i64>>,
}

impl Metrics {
    /// `jobs` is the queue's event counter family (enqueued, claimed, done,
    /// retried, abandoned by kind), registered here.
    pub fn new(jobs: Family<Labels, Counter>) -> Self {
        let mut r = Registry::with_prefix("acme_proxy");
        let m = Self {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(seconds_histogram),
            audit_events: Family::default(),
            issued: Family::default(),
            issue_failures: Family::default(),
            revocations_refused: Family::default(),
            validations: Family::default(),
            validation_seconds: Family::new_with_constructor(seconds_histogram),
            upstream_requests: Family::default(),
            upstream_breaker_state: Family::default(),
            upstream_breaker_transitions: Family::default(),
            egress_proxy_failures: Family::default(),
            connections_open: Family::default(),
            connections_refused: Family::default(),
            requests_shed: Family::default(),
            accept_failures: Family::default(),
            dns_queries: Family::default(),
            dns_api_requests: Family::default(),
            admin_requests: Family::default(),
            admin_logins: Family::default(),
            policy_decisions: Family::default(),
            rate_limited: Family::default(),
            job_depth: Family::default(),
            db_connections: Family::default(),
            nonces: Gauge::default(),
            cli_audit_counted: tokio::sync::Mutex::new(None),
            registry: Mutex::new(Registry::default()),
        };
        r.register(
            "http_requests",
            "ACME HTTP requests by profile, route and status",
            m.requests.clone(),
        );
        r.register(
            "http_request_seconds",
            "ACME request latency by route",
            m.request_seconds.clone(),
        );
        r.register(
            "audit_events",
            "Audit records by event, outcome and profile",
            m.audit_events.clone(),
        );
        r.register(
            "certificates_issued",
            "Certificates issued, by profile",
            m.issued.clone(),
        );
        r.register(
            "certificate_failures",
            "Issuances that failed or were refused, by profile and reason",
            m.issue_failures.clone(),
        );
        r.register(
            "revocations_refused",
            "Refused revocations by profile and reason, those not audited included",
            m.revocations_refused.clone(),
        );
        r.register(
            "rate_limited",
            "Requests refused by a rate limit, by limit",
            m.rate_limited.clone(),
        );
        r.register(
            "policy_decisions",
            "Policy decisions by stage, rule and decision",
            m.policy_decisions.clone(),
        );
        r.register(
            "dns_queries",
            "Queries the embedded DNS zone answered, by type and response code",
            m.dns_queries.clone(),
        );
        r.register(
            "dns_api_requests",
            "Requests to the acme-dns API by endpoint and outcome",
            m.dns_api_requests.clone(),
        );
        r.register(
            "admin_http_requests",
            "Web console requests by route and status",
            m.admin_requests.clone(),
        );
        r.register(
            "admin_logins",
            "Web console logins by outcome",
            m.admin_logins.clone(),
        );
        r.register(
            "validations",
            "Challenge validations by type and outcome",
            m.validations.clone(),
        );
        r.register(
            "validation_seconds",
            "Challenge validation latency by type",
            m.validation_seconds.clone(),
        );
        r.register(
            "upstream_requests",
            "Relay requests to upstream CAs by profile and class",
            m.upstream_requests.clone(),
        );
        r.register(
            "upstream_breaker_state",
            "Each upstream's circuit breaker: 1 for its state, by profile and upstream",
            m.upstream_breaker_state.clone(),
        );
        r.register(
            "upstream_breaker_transitions",
            "Circuit breaker changes by profile, upstream and the state entered",
            m.upstream_breaker_transitions.clone(),
        );
        r.register(
            "egress_proxy_failures",
            "Outbound connections the egress proxy refused or that could not reach it, by profile, client and answer",
            m.egress_proxy_failures.clone(),
        );
        r.register(
            "connections_open",
            "Open connections by listener",
            m.connections_open.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed as soon as accepted, by listener and the bound that refused them",
            m.connections_refused.clone(),
        );
        r.register(
            "requests_shed",
            "ACME requests answered 503 at once, by the bound that was full",
            m.requests_shed.clone(),
        );
        r.register(
            "accept_failures",
            "Accepts that failed, by listener (out of file descriptors, typically)",
            m.accept_failures.clone(),
        );
        r.register(
            "jobs",
            "Job queue events by kind and event (enqueued, claimed, done, retried, abandoned)",
            jobs,
        );
        r.register(
            "job_queue_depth",
            "Jobs by kind and status",
            m.job_depth.clone(),
        );
        r.register(
            "db_connections",
            "Database connections by pool and state",
            m.db_connections.clone(),
        );
        r.register(
            "nonces",
            "Replay nonces kept: outstanding ones in memory, or records of used ones in the database",
            m.nonces.clone(),
        );
        if let Ok(mut registry) = m.registry.lock() {
            *registry = r;
        }
        m
    }

    /// Declares a profile's series at zero, so that a family is exported
    /// (and dashboards' rate() queries have a series) before its first event.
    pub fn init_profile(&self, profile: &str, challenges: &[ChallengeType]) {
        let p = || ("profile", profile.to_owned());
        let _ = self.issued.get_or_create(&vec![p()]);
        let _ = self
            .issue_failures
            .get_or_create(&vec![p(), ("reason", "serverInternal".to_owned())]);
        let _ = self.audit_events.get_or_create(&vec![
            ("event", "certificate.issued".to_owned()),
            ("outcome", "success".to_owned()),
            p(),
        ]);
        // A certificate the profile never issued is `malformed` (404).
        let _ = self
            .revocations_refused
            .get_or_create(&vec![p(), ("reason", "malformed".to_owned())]);
        let _ = self
            .upstream_requests
            .get_or_create(&vec![p(), ("class", "2xx".to_owned())]);
        for kind in challenges {
            for outcome in [ChallengeStatus::Valid, ChallengeStatus::Invalid] {
                let _ = self.validations.get_or_create(&vec![
                    ("type", kind.as_str().to_owned()),
                    ("outcome", outcome.as_str().to_owned()),
                ]);
            }
            let _ = self
                .validation_seconds
                .get_or_create(&vec![("type", kind.as_str().to_owned())]);
        }
    }

    /// Bumps the counters that mirror an audit record this process wrote
    /// (with [`Metrics::count_cli_audit`], the only place issuance and
    /// refusal counters move).
    pub fn audited(&self, row: &NewAuditRow<'_>) {
        self.count_audit(
            row.event.as_str(),
            row.outcome.as_str(),
            row.profile.unwrap_or(""),
            row.problem_type,
        );
    }

    fn count_audit(&self, event: &str, outcome: &str, profile: &str, problem: Option<&str>) {
        let profile = profile.to_owned();
        self.audit_events
            .get_or_create(&vec![
                ("event", event.to_owned()),
                ("outcome", outcome.to_owned()),
                ("profile", profile.clone()),
            ])
            .inc();
        match (event.parse().ok(), outcome.parse().ok()) {
            (Some(AuditEvent::CertificateIssued), Some(AuditOutcome::Success)) => {
                self.issued.get_or_create(&vec![("profile", profile)]).inc();
            }
            (Some(AuditEvent::CertificateIssueFailed), _) => {
                let reason = problem.unwrap_or("serverInternal").to_owned();
                self.issue_failures
                    .get_or_create(&vec![("profile", profile), ("reason", reason)])
                    .inc();
            }
            (Some(AuditEvent::CertificateRevokeFailed), Some(AuditOutcome::Refused)) => {
                self.revocation_refused(&profile, problem.unwrap_or("malformed"));
            }
            _ => {}
        }
    }

    /// From now on, counts the audit rows admin commands write (after row
    /// `last`, the newest when the server starts): they run in processes
    /// of their own, which export no metrics, so the server counts their
    /// rows when it next exports its own.
    pub async fn count_cli_audit_after(&self, last: i64) {
        *self.cli_audit_counted.lock().await = Some(last);
    }

    /// Counts the admin commands' audit rows written since the last look.
    async fn count_cli_audit(&self, store: &Store) {
        let mut counted = self.cli_audit_counted.lock().await;
        let Some(mut last) = *counted else {
            return;
        };
        loop {
            let rows = match store.cli_audit_after(last, CLI_AUDIT_BATCH).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(event = "metrics.audit", outcome = "failure", error = %e, "could not read the admin commands' audit rows");
                    break;
                }
            };
            for r in &rows {
                self.count_audit(
                    &r.event,
                    &r.outcome,
                    r.profile.as_deref().unwrap_or(""),
                    r.problem_type.as_deref(),
                );
                last = r.id;
            }
            if rows.len() < CLI_AUDIT_BATCH as usize {
                break;
            }
        }
        *counted = Some(last);
    }

    /// Counts a refused revocation: from [`Metrics::audited`], or, for one
    /// the authority does not audit (signed by no account, for a
    /// certificate the profile never issued), directly.
    pub fn revocation_refused(&self, profile: &str, reason: &str) {
        self.revocations_refused
            .get_or_create(&vec![
                ("profile", profile.to_owned()),
                ("reason", reason.to_owned()),
            ])
            .inc();
    }

    /// Counts a change of the breaker of `profile`'s upstream `upstream`
    /// to `state`.
    pub fn breaker_changed(
        &self,
        profile: &str,
        upstream: &str,
        state: acme_proxy_store::BreakerState,
    ) {
        self.upstream_breaker_transitions
            .get_or_create(&vec![
                ("profile", profile.to_owned()),
                ("upstream", upstream.to_owned()),
                ("to", state.as_str().to_owned()),
            ])
            .inc();
    }

    /// The OpenMetrics text of every family, gauges refreshed from `store`.
    /// `nonces`: outstanding replay nonces, wherever they are kept.
    /// `upstreams`: the name of each relay upstream mounted, by (profile,
    /// directory), whose breakers are shown.
    pub async fn render(
        &self,
        store: &Store,
        nonces: Option<i64>,
        upstreams: &std::collections::BTreeMap<(String, String), String>,
    ) -> String {
        self.count_cli_audit(store).await;
        if let Ok(counts) = store.job_counts().await {
            self.job_depth.clear();
            for (kind, status, n) in counts.by_kind_and_status {
                self.job_depth
                    .get_or_create(&vec![("kind", kind), ("status", status)])
                    .set(n);
            }
        }
        if let Ok(breakers) = store.breakers().await {
            self.upstream_breaker_state.clear();
            for b in breakers {
                let Some(name) = upstreams.get(&(b.profile.clone(), b.directory.clone())) else {
                    continue;
                };
                for &state in acme_proxy_store::BreakerState::ALL {
                    self.upstream_breaker_state
                        .get_or_create(&vec![
                            ("profile", b.profile.clone()),
                            ("upstream", name.clone()),
                            ("state", state.as_str().to_owned()),
                        ])
                        .set(i64::from(b.state == state));
                }
            }
        }
        for (pool, size, idle) in store.pool_stats() {
            self.db_connections
                .get_or_create(&vec![("pool", pool.to_owned()), ("state", "in_use".into())])
                .set(i64::from(size.saturating_sub(idle)));
            self.db_connections
                .get_or_create(&vec![("pool", pool.to_owned()), ("state", "idle".into())])
                .set(i64::from(idle));
        }
        if let Some(n) = nonces {
            self.nonces.set(n);
        }
        let mut out = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        }
        out
    }
}

/// One label pair, for call sites.
pub fn label(name: &'static str, value: impl Into<String>) -> (&'static str, String) {
    (name, value.into())
}
