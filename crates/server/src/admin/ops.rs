//! The operators' operation layer: what the admin CLI (and, later, the web
//! admin) can do, as plain functions over the store. Front ends only parse
//! arguments and format results.

use acme_proxy_protocol::types::{AccountStatus, OrderStatus};
use acme_proxy_store::{
    AuditEvent, AuditOutcome, JobRow, JobStatus, Store, StoreError, UpstreamAccountRow,
};
use serde::Serialize;

use crate::authority::Authority;
use crate::clock::{Clock, rfc3339};
use crate::config::{Config, RelayConfig, SignerConfig};
use crate::signer::relay::{Eab, Registered};

/// A job as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub status: JobStatus,
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
    /// What the operation names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The operation refused, for the state of what it names.
    #[error("{0}")]
    Refused(String),
    /// The server could not carry it out now (its database); worth a
    /// retry shortly.
    #[error("{0}")]
    Unavailable(String),
    /// Something the operation needs beside the database cannot be
    /// reached now (an upstream CA whose circuit breaker is open): `words`
    /// say what, and it is worth a retry after `retry_after` seconds.
    #[error("{words}")]
    Later { words: String, retry_after: u64 },
    /// The server could not carry it out (a signer, a bug).
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub async fn list_jobs(
    store: &Store,
    kind: Option<&str>,
    status: Option<JobStatus>,
    limit: i64,
) -> Result<Vec<JobView>, OpsError> {
    Ok(page_jobs(store, kind, status, None, limit).await?.jobs)
}

/// One page of jobs, and where the next one starts.
#[derive(Debug, Clone, Serialize)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    /// The id to pass as `before` for the next (older) page.
    pub next: Option<String>,
}

/// Jobs newest first, of one kind and status when given, `limit` of them
/// older than job `before` when given.
pub async fn page_jobs(
    store: &Store,
    kind: Option<&str>,
    status: Option<JobStatus>,
    before: Option<i64>,
    limit: i64,
) -> Result<JobPage, OpsError> {
    let rows = store
        .list_jobs(kind, status, before, limit.saturating_add(1))
        .await?;
    let (rows, next) = page_of(rows, limit, |j| j.id.to_string());
    Ok(JobPage {
        jobs: rows.into_iter().map(JobView::from).collect(),
        next,
    })
}

pub async fn show_job(store: &Store, id: i64) -> Result<JobView, OpsError> {
    store
        .job(id)
        .await?
        .map(JobView::from)
        .ok_or(OpsError::NoSuchJob(id))
}

/// Queues a failed or cancelled job again (attempts reset), or makes a
/// queued one due now; audited as `actor`.
pub async fn retry_job(
    store: &Store,
    clock: &dyn Clock,
    id: i64,
    actor: &str,
) -> Result<JobView, OpsError> {
    let job = show_job(store, id).await?;
    let detail = format!("job {id} ({} {}) queued again", job.kind, job.key);
    let audit = job_audit(clock, AuditEvent::JobRetryRequested, actor, &detail);
    if !store.retry_job(id, clock.unix_ms(), &audit).await? {
        return Err(OpsError::Refused(format!(
            "job {id} is {}; only failed, cancelled or queued jobs can be retried (and not while another job of the same kind and key is live)",
            job.status
        )));
    }
    tracing::info!(event = "job.retry_requested", outcome = "success", id, kind = %job.kind, actor, "operator retried a job");
    show_job(store, id).await
}

/// Asks for a job to be cancelled: the runner that holds it stops the
/// attempt, or the next runner to claim it does, and runs its `abandon`
/// naming `actor`. The request is audited.
pub async fn cancel_job(
    store: &Store,
    clock: &dyn Clock,
    id: i64,
    actor: &str,
) -> Result<JobView, OpsError> {
    let job = show_job(store, id).await?;
    let detail = format!("job {id} ({} {}) cancellation requested", job.kind, job.key);
    let audit = job_audit(clock, AuditEvent::JobCancelRequested, actor, &detail);
    if !store
        .request_job_cancel(id, actor, clock.unix_ms(), &audit)
        .await?
    {
        return Err(OpsError::Refused(format!(
            "job {id} is {} and cannot be cancelled",
            job.status
        )));
    }
    tracing::info!(event = "job.cancel_requested", outcome = "success", id, kind = %job.kind, actor, "operator cancelled a job");
    show_job(store, id).await
}

fn job_audit<'a>(
    clock: &dyn Clock,
    event: AuditEvent,
    actor: &'a str,
    detail: &'a str,
) -> acme_proxy_store::NewAuditRow<'a> {
    let mut row =
        acme_proxy_store::NewAuditRow::new(clock.unix(), event, AuditOutcome::Success, actor);
    row.detail = Some(detail);
    row
}

/// A relay profile's upstream account as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamAccountView {
    pub profile: String,
    /// The upstream's name in the profile (`primary` unless named).
    pub upstream: String,
    pub directory: String,
    /// None until `acme-proxy upstream register` has run.
    pub account_url: Option<String>,
    pub key_thumbprint: Option<String>,
    pub key_file: String,
    pub registered_at: Option<String>,
}

/// The relay profile a command is about: the one named, or the only one.
pub fn relay_profile<'a>(
    config: &'a Config,
    profile: Option<&str>,
) -> Result<(&'a str, &'a RelayConfig), OpsError> {
    let relays: Vec<(&str, &RelayConfig)> = config
        .profiles
        .iter()
        .filter_map(|(name, p)| match &p.signer {
            SignerConfig::Relay(r) => Some((name.as_str(), r)),
            _ => None,
        })
        .collect();
    match profile {
        Some(want) => relays
            .into_iter()
            .find(|(name, _)| *name == want)
            .ok_or_else(|| {
                OpsError::Refused(format!(
                    "profile {want:?} is not a relay profile of this configuration"
                ))
            }),
        None if relays.len() == 1 => Ok(relays[0]),
        None if relays.is_empty() => Err(OpsError::Refused(
            "this configuration has no relay profile (a [profiles.NAME.signer] with type = \"relay\")".into(),
        )),
        None => Err(OpsError::Refused(format!(
            "several relay profiles ({}); name one with --profile",
            relays.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The upstream of relay profile `name` a command is about: the one
/// named, or the preferred one; and whether it is the preferred one.
pub fn relay_upstream<'a>(
    name: &str,
    relay: &'a RelayConfig,
    upstream: Option<&str>,
) -> Result<(&'a RelayConfig, bool), OpsError> {
    match upstream {
        None => Ok((relay, true)),
        Some(want) => relay
            .upstreams()
            .enumerate()
            .find(|(_, u)| u.name == want)
            .map(|(i, u)| (u, i == 0))
            .ok_or_else(|| {
                OpsError::Refused(format!(
                    "profile {name:?} has no upstream {want:?}; it has {}",
                    relay
                        .upstreams()
                        .map(|u| u.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }),
    }
}

/// Registers the account of a relay profile at one of its upstreams (the
/// preferred one unless named) and records its URL (the key stays in its
/// 0600 file).
pub async fn register_upstream(
    store: &Store,
    clock: &dyn Clock,
    config: &Config,
    profile: Option<&str>,
    upstream: Option<&str>,
    eab: Option<&Eab>,
) -> Result<(UpstreamAccountView, Registered), OpsError> {
    let (name, relay) = relay_profile(config, profile)?;
    let (upstream, preferred) = relay_upstream(name, relay, upstream)?;
    let egress = crate::egress::Egress::from_config(config.relay_egress(upstream))
        .map_err(OpsError::Refused)?;
    let registered = crate::signer::relay::register(
        upstream,
        upstream.account_key_path(&config.data_dir, name, preferred),
        std::sync::Arc::new(egress),
        eab,
    )
    .await
    .map_err(OpsError::Refused)?;
    store
        .save_upstream_account(&UpstreamAccountRow {
            profile: name.to_owned(),
            upstream: upstream.name.clone(),
            directory: upstream.directory.clone(),
            account_url: registered.account_url.clone(),
            key_thumbprint: registered.key_thumbprint.clone(),
            created_at: clock.unix(),
        })
        .await?;
    tracing::info!(event = "upstream.registered", outcome = "success", profile = %name, upstream = %upstream.name, account = %registered.account_url, "upstream account registered");
    let view = upstream_accounts(Some(store), config, Some(name))
        .await?
        .into_iter()
        .find(|v| v.upstream == upstream.name)
        .ok_or_else(|| OpsError::Refused("the account vanished after registration".into()))?;
    Ok((view, registered))
}

/// The upstream accounts of the relay profiles (one, or all).
/// `store` None: no database yet, so no profile is registered.
pub async fn upstream_accounts(
    store: Option<&Store>,
    config: &Config,
    profile: Option<&str>,
) -> Result<Vec<UpstreamAccountView>, OpsError> {
    let mut views = Vec::new();
    for (name, p) in &config.profiles {
        let SignerConfig::Relay(relay) = &p.signer else {
            continue;
        };
        if profile.is_some_and(|want| want != name) {
            continue;
        }
        for (i, upstream) in relay.upstreams().enumerate() {
            let row = match store {
                Some(store) => store.upstream_account(name, &upstream.name).await?,
                None => None,
            };
            views.push(UpstreamAccountView {
                profile: name.clone(),
                upstream: upstream.name.clone(),
                directory: upstream.directory.clone(),
                account_url: row.as_ref().map(|r| r.account_url.clone()),
                key_thumbprint: row.as_ref().map(|r| r.key_thumbprint.clone()),
                key_file: upstream
                    .account_key_path(&config.data_dir, name, i == 0)
                    .display()
                    .to_string(),
                registered_at: row.map(|r| rfc3339(r.created_at)),
            });
        }
    }
    if let Some(want) = profile
        && views.is_empty()
    {
        return Err(OpsError::Refused(format!(
            "profile {want:?} is not a relay profile of this configuration"
        )));
    }
    Ok(views)
}

/// A relay profile's upstream as operators see it: its circuit breaker,
/// its pause, and the relays waiting on it.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamStatusView {
    pub profile: String,
    /// The upstream's name in the profile, in priority order.
    pub upstream: String,
    pub directory: String,
    /// `closed`, `open` or `probing`.
    pub breaker: String,
    /// When the breaker entered that state (an open one: when it opened);
    /// None before the upstream ever failed.
    pub since: Option<String>,
    /// Requests in a row that found the upstream down.
    pub failures: i64,
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
    /// An open breaker's next probe (a probing one's: when its claim lapses).
    pub next_probe: Option<String>,
    /// Until when the upstream asked to be left alone (`Retry-After`).
    pub paused_until: Option<String>,
    /// Relayed orders still processing that it accepted (the preferred
    /// upstream's count includes those not sent anywhere yet).
    pub in_flight: i64,
}

/// The upstream of each relay profile (one, or all): breaker, pause,
/// relays in flight.
pub async fn upstream_status(
    store: &Store,
    clock: &dyn Clock,
    config: &Config,
    profile: Option<&str>,
) -> Result<Vec<UpstreamStatusView>, OpsError> {
    let now_ms = clock.unix_ms();
    let mut views = Vec::new();
    for (name, p) in &config.profiles {
        let SignerConfig::Relay(relay) = &p.signer else {
            continue;
        };
        if profile.is_some_and(|want| want != name) {
            continue;
        }
        let in_flight = store.relays_in_flight(name).await?;
        for (i, upstream) in relay.upstreams().enumerate() {
            let breaker = store.breaker(name, &upstream.directory).await?;
            let paused = store
                .rate_limit_tat(&crate::authority::upstream_pause_key(name, &upstream.name))
                .await?
                .filter(|until| *until > now_ms);
            let at = |ms: i64| rfc3339(ms.div_euclid(1000));
            views.push(UpstreamStatusView {
                profile: name.clone(),
                upstream: upstream.name.clone(),
                directory: upstream.directory.clone(),
                breaker: breaker
                    .as_ref()
                    .map_or("closed", |b| b.state.as_str())
                    .to_owned(),
                since: breaker.as_ref().map(|b| at(b.since)),
                failures: breaker.as_ref().map_or(0, |b| b.failures),
                last_error: breaker.as_ref().and_then(|b| b.last_error.clone()),
                last_error_at: breaker.as_ref().and_then(|b| b.last_error_at).map(at),
                next_probe: breaker
                    .as_ref()
                    .filter(|b| b.state != acme_proxy_store::BreakerState::Closed)
                    .map(|b| at(b.retry_at)),
                paused_until: paused.map(at),
                in_flight: in_flight
                    .iter()
                    .filter(|(u, _)| match u {
                        Some(u) => *u == upstream.name,
                        None => i == 0,
                    })
                    .map(|(_, n)| n)
                    .sum(),
            });
        }
    }
    if let Some(want) = profile
        && views.is_empty()
    {
        return Err(OpsError::Refused(format!(
            "profile {want:?} is not a relay profile of this configuration"
        )));
    }
    Ok(views)
}

/// A relayed order as operators see it: local order ↔ upstream order.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamOrderView {
    pub order: String,
    pub profile: String,
    pub account: String,
    pub status: OrderStatus,
    /// The upstream that accepted it (None: none yet, or the profile's
    /// preferred one before upstreams had names).
    pub upstream: Option<String>,
    pub upstream_order: Option<String>,
    pub certificate_url: Option<String>,
    pub error: Option<String>,
    pub client_ip: Option<String>,
    pub request_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// `created_at` in seconds: where the next page starts.
    #[serde(skip)]
    created: i64,
}

pub async fn upstream_orders(
    store: &Store,
    status: Option<OrderStatus>,
    before: Option<(i64, &str)>,
    limit: i64,
) -> Result<Vec<UpstreamOrderView>, OpsError> {
    Ok(store
        .upstream_orders(status, before, limit)
        .await?
        .into_iter()
        .map(|m| UpstreamOrderView {
            order: m.order_id,
            profile: m.profile,
            account: m.account_id,
            status: m.status,
            upstream: m.upstream,
            upstream_order: m.upstream_url,
            certificate_url: m.certificate_url,
            error: m.error,
            client_ip: m.client_ip,
            request_id: m.request_id,
            created_at: rfc3339(m.created_at),
            updated_at: rfc3339(m.updated_at),
            created: m.created_at,
        })
        .collect())
}

/// A relayed order in the relay queue, with its live relay job (the
/// attempts and last error of its current try) when it has one.
#[derive(Debug, Clone, Serialize)]
pub struct RelayQueueRow {
    pub order: UpstreamOrderView,
    pub job: Option<JobView>,
}

/// One page of the relay queue, and where the next one starts.
#[derive(Debug, Clone, Serialize)]
pub struct RelayPage {
    pub rows: Vec<RelayQueueRow>,
    pub next: Option<String>,
}

/// Relayed orders, newest first (of one status when given), each with its
/// live relay job; `limit` of them older than the cursor `before`.
pub async fn relay_queue(
    store: &Store,
    status: Option<OrderStatus>,
    before: Option<(i64, &str)>,
    limit: i64,
) -> Result<RelayPage, OpsError> {
    let orders = upstream_orders(store, status, before, limit.saturating_add(1)).await?;
    let (orders, next) = page_of(orders, limit, |o| cursor(o.created, &o.order));
    let mut rows = Vec::with_capacity(orders.len());
    for order in orders {
        let job = store
            .live_job(crate::authority::RELAY_KIND, &order.order)
            .await?
            .map(JobView::from);
        rows.push(RelayQueueRow { order, job });
    }
    Ok(RelayPage { rows, next })
}

/// An audit record as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct AuditView {
    pub id: i64,
    pub at: String,
    pub event: String,
    pub outcome: String,
    pub profile: Option<String>,
    pub actor: String,
    pub account: Option<String>,
    pub order: Option<String>,
    pub serial: Option<String>,
    pub identifiers: Vec<String>,
    pub client_ip: Option<String>,
    pub reverse_name: Option<String>,
    pub user_agent: Option<String>,
    pub request_id: Option<String>,
    pub problem_type: Option<String>,
    pub detail: Option<String>,
}

impl From<acme_proxy_store::AuditRow> for AuditView {
    fn from(r: acme_proxy_store::AuditRow) -> Self {
        Self {
            id: r.id,
            at: rfc3339(r.at),
            event: r.event,
            outcome: r.outcome,
            profile: r.profile,
            actor: r.actor,
            account: r.account_id,
            order: r.order_id,
            serial: r.serial,
            identifiers: r.identifiers.into_iter().map(|i| i.value).collect(),
            client_ip: r.client_ip,
            reverse_name: r.reverse_name,
            user_agent: r.user_agent,
            request_id: r.request_id,
            problem_type: r.problem_type,
            detail: r.detail,
        }
    }
}

pub async fn list_audit(
    store: &Store,
    filter: &acme_proxy_store::AuditFilter<'_>,
    limit: i64,
) -> Result<Vec<AuditView>, OpsError> {
    Ok(store
        .audit_list(filter, limit)
        .await?
        .into_iter()
        .map(AuditView::from)
        .collect())
}

pub async fn show_audit(store: &Store, id: i64) -> Result<AuditView, OpsError> {
    store
        .audit_row(id)
        .await?
        .map(AuditView::from)
        .ok_or_else(|| OpsError::NotFound(format!("no audit record with id {id}")))
}

/// An ACME account as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct AccountView {
    pub id: String,
    pub profile: String,
    pub status: AccountStatus,
    pub contact: Vec<String>,
    pub key_thumbprint: String,
    pub tos_agreed: bool,
    pub created_at: String,
    /// The External Account Binding credential it registered with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_account: Option<String>,
    /// Counts, in `show` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orders: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificates: Option<i64>,
}

impl From<acme_proxy_store::AccountRow> for AccountView {
    fn from(a: acme_proxy_store::AccountRow) -> Self {
        Self {
            id: a.id,
            profile: a.profile,
            status: a.status,
            contact: a.contact,
            key_thumbprint: a.key_thumbprint,
            tos_agreed: a.tos_agreed,
            created_at: rfc3339(a.created_at),
            external_account: a.eab_kid,
            orders: None,
            certificates: None,
        }
    }
}

/// An order as operators see it, with its certificate once issued.
#[derive(Debug, Clone, Serialize)]
pub struct OrderView {
    pub id: String,
    pub profile: String,
    pub account: String,
    pub status: OrderStatus,
    pub identifiers: Vec<String>,
    pub created_at: String,
    pub expires: String,
    /// The problem of an invalid order: type and detail.
    pub error: Option<String>,
    pub certificate: Option<CertificateView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CertificateView {
    pub id: String,
    pub serial: String,
    pub not_before: String,
    pub not_after: String,
    pub revoked_at: Option<String>,
    pub revocation_reason: Option<i64>,
}

impl From<acme_proxy_store::CertificateRow> for CertificateView {
    fn from(c: acme_proxy_store::CertificateRow) -> Self {
        Self {
            id: c.id,
            serial: c.serial,
            not_before: rfc3339(c.not_before),
            not_after: rfc3339(c.not_after),
            revoked_at: c.revoked_at.map(rfc3339),
            revocation_reason: c.revocation_reason,
        }
    }
}

async fn order_view(
    store: &Store,
    o: acme_proxy_store::OrderRow,
    with_certificate: bool,
) -> Result<OrderView, OpsError> {
    let certificate = match (&o.certificate_id, with_certificate) {
        (Some(id), true) => store.certificate(id).await?.map(CertificateView::from),
        _ => None,
    };
    Ok(OrderView {
        id: o.id,
        profile: o.profile,
        account: o.account_id,
        status: o.status,
        identifiers: o.identifiers.into_iter().map(|i| i.value).collect(),
        created_at: rfc3339(o.created_at),
        expires: rfc3339(o.expires_at),
        error: o
            .error
            .map(|p| format!("{}: {}", p.kind, p.detail.unwrap_or_default())),
        certificate,
    })
}

/// An operation the authority refused, in the operator's words.
/// The authority's refusal in operators' terms: what is missing, what
/// the state refuses, and what failed on the server's side, told apart by
/// its HTTP status.
fn refused(e: crate::error::AcmeError) -> OpsError {
    let status = e.http_status();
    let retry_after = e.retry_after;
    let database = e.detail == crate::error::DATABASE_UNAVAILABLE;
    let words = match e.internal {
        Some(internal) => format!("{} ({internal})", e.detail),
        None => e.detail,
    };
    if status == 503 && !database {
        return OpsError::Later {
            words,
            retry_after: retry_after.unwrap_or(5),
        };
    }
    match status {
        404 => OpsError::NotFound(words),
        503 => OpsError::Unavailable(words),
        500.. => OpsError::Failed(words),
        _ => OpsError::Refused(words),
    }
}

pub async fn list_accounts(
    store: &Store,
    profile: Option<&str>,
    status: Option<AccountStatus>,
    limit: i64,
) -> Result<Vec<AccountView>, OpsError> {
    Ok(store
        .list_accounts(profile, status, limit)
        .await?
        .into_iter()
        .map(AccountView::from)
        .collect())
}

/// One page of an account search, and where the next one starts.
#[derive(Debug, Clone, Serialize)]
pub struct AccountPage {
    pub accounts: Vec<AccountView>,
    pub next: Option<String>,
}

pub async fn search_accounts(
    store: &Store,
    search: &acme_proxy_store::AccountSearch<'_>,
    limit: i64,
) -> Result<AccountPage, OpsError> {
    let rows = store
        .search_accounts(search, limit.saturating_add(1))
        .await?;
    let (rows, next) = page_of(rows, limit, |a| cursor(a.created_at, &a.id));
    Ok(AccountPage {
        accounts: rows.into_iter().map(AccountView::from).collect(),
        next,
    })
}

pub async fn show_account(store: &Store, id: &str) -> Result<AccountView, OpsError> {
    let account = store
        .account(id)
        .await?
        .ok_or_else(|| OpsError::NotFound(format!("no account {id}")))?;
    let (orders, certificates) = store.account_counts(id).await?;
    let mut view = AccountView::from(account);
    view.orders = Some(orders);
    view.certificates = Some(certificates);
    Ok(view)
}

pub async fn deactivate_account(
    authority: &Authority,
    id: &str,
    actor: &str,
) -> Result<AccountView, OpsError> {
    authority
        .operator_deactivate_account(id, actor)
        .await
        .map(AccountView::from)
        .map_err(refused)
}

/// An External Account Binding credential as operators see it (never its
/// HMAC key, which is shown once, by `create`).
#[derive(Debug, Clone, Serialize)]
pub struct EabView {
    pub kid: String,
    pub label: Option<String>,
    /// The one profile it may be used at; none: any.
    pub profile: Option<String>,
    /// Name globs its accounts may order; none: any name.
    pub names: Option<Vec<String>>,
    pub status: &'static str,
    pub accounts: i64,
    pub created_at: String,
    pub revoked_at: Option<String>,
    /// Only in `create`'s answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hmac_key: Option<String>,
}

impl From<acme_proxy_store::EabRow> for EabView {
    fn from(e: acme_proxy_store::EabRow) -> Self {
        Self {
            kid: e.kid,
            label: e.label,
            profile: e.profile,
            names: e.names,
            status: if e.revoked_at.is_some() {
                "revoked"
            } else {
                "valid"
            },
            accounts: e.accounts,
            created_at: rfc3339(e.created_at),
            revoked_at: e.revoked_at.map(rfc3339),
            hmac_key: None,
        }
    }
}

pub async fn create_eab(
    authority: &Authority,
    label: Option<&str>,
    profile: Option<&str>,
    names: Option<&[String]>,
    actor: &str,
) -> Result<EabView, OpsError> {
    let minted = authority
        .operator_create_eab(label, profile, names, actor)
        .await
        .map_err(refused)?;
    let mut view = EabView::from(minted.row);
    view.hmac_key = Some(minted.hmac_key_b64);
    Ok(view)
}

/// One page of EAB credentials, and where the next one starts.
#[derive(Debug, Clone, Serialize)]
pub struct EabPage {
    pub credentials: Vec<EabView>,
    pub next: Option<String>,
}

/// Credentials newest first, `limit` of them older than the cursor
/// `before`.
pub async fn list_eab(
    store: &Store,
    before: Option<(i64, &str)>,
    limit: i64,
) -> Result<EabPage, OpsError> {
    let rows = store.list_eab(before, limit.saturating_add(1)).await?;
    let (rows, next) = page_of(rows, limit, |e| cursor(e.created_at, &e.kid));
    Ok(EabPage {
        credentials: rows.into_iter().map(EabView::from).collect(),
        next,
    })
}

pub async fn revoke_eab(
    authority: &Authority,
    kid: &str,
    actor: &str,
) -> Result<EabView, OpsError> {
    authority
        .operator_revoke_eab(kid, actor)
        .await
        .map(EabView::from)
        .map_err(refused)
}

pub async fn delete_account(authority: &Authority, id: &str, actor: &str) -> Result<(), OpsError> {
    authority
        .operator_delete_account(id, actor)
        .await
        .map_err(refused)
}

pub async fn list_orders(
    store: &Store,
    profile: Option<&str>,
    account: Option<&str>,
    status: Option<OrderStatus>,
    limit: i64,
) -> Result<Vec<OrderView>, OpsError> {
    let mut views = Vec::new();
    for o in store.list_orders(profile, account, status, limit).await? {
        views.push(order_view(store, o, false).await?);
    }
    Ok(views)
}

pub async fn show_order(store: &Store, id: &str) -> Result<OrderView, OpsError> {
    let order = store
        .order(id)
        .await?
        .ok_or_else(|| OpsError::NotFound(format!("no order {id}")))?;
    order_view(store, order, true).await
}

/// The revocation reasons a certificate's holder (or an operator on
/// their behalf) may give, RFC 5280 §5.3.1 code and name; the others are
/// for CA events.
pub const REVOCATION_REASONS: [(u64, &str); 5] = [
    (0, "unspecified"),
    (1, "keyCompromise"),
    (3, "affiliationChanged"),
    (4, "superseded"),
    (5, "cessationOfOperation"),
];

/// One page of an order search, and where the next one starts.
#[derive(Debug, Clone, Serialize)]
pub struct OrderPage {
    pub orders: Vec<OrderView>,
    /// The cursor of the next (older) page, when there may be one.
    pub next: Option<String>,
}

/// A page of `rows` fetched one past `limit`: the page, and the cursor
/// of its last row when there are more (so `next` is none exactly on the
/// last page).
pub fn page_of<T>(
    mut rows: Vec<T>,
    limit: i64,
    cursor_of: impl Fn(&T) -> String,
) -> (Vec<T>, Option<String>) {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if rows.len() <= limit {
        return (rows, None);
    }
    rows.truncate(limit);
    let next = rows.last().map(cursor_of);
    (rows, next)
}

/// A page cursor: the last row's creation time and id.
fn cursor(created_at: i64, id: &str) -> String {
    format!("{created_at}.{id}")
}

/// A cursor back into (created_at, id); none for anything else.
pub fn parse_cursor(cursor: &str) -> Option<(i64, &str)> {
    let (at, id) = cursor.split_once('.')?;
    Some((at.parse().ok()?, id))
}

/// Orders matching `search`, newest first, `limit` to a page, each with
/// its certificate's serial when it has one.
pub async fn search_orders(
    store: &Store,
    search: &acme_proxy_store::OrderSearch<'_>,
    limit: i64,
) -> Result<OrderPage, OpsError> {
    let rows = store.search_orders(search, limit.saturating_add(1)).await?;
    let (rows, next) = page_of(rows, limit, |o| cursor(o.created_at, &o.id));
    let mut orders = Vec::with_capacity(rows.len());
    for o in rows {
        orders.push(order_view(store, o, false).await?);
    }
    Ok(OrderPage { orders, next })
}

/// The PEM chain of an order's certificate, and its serial.
pub async fn order_chain(store: &Store, id: &str) -> Result<(String, String), OpsError> {
    let order = store
        .order(id)
        .await?
        .ok_or_else(|| OpsError::NotFound(format!("no order {id}")))?;
    let certificate = match &order.certificate_id {
        Some(cid) => store.certificate(cid).await?,
        None => None,
    }
    .ok_or_else(|| OpsError::NotFound(format!("order {id} has no certificate")))?;
    Ok((certificate.serial, certificate.chain_pem))
}

pub async fn revoke_order(
    authority: &Authority,
    id: &str,
    reason: Option<u64>,
    actor: &str,
) -> Result<CertificateView, OpsError> {
    authority
        .operator_revoke_order(id, reason, actor)
        .await
        .map(CertificateView::from)
        .map_err(refused)
}

pub async fn delete_order(authority: &Authority, id: &str, actor: &str) -> Result<(), OpsError> {
    authority
        .operator_delete_order(id, actor)
        .await
        .map_err(refused)
}

/// Deletes the records of used nonces that expired more than
/// `USED_NONCE_GRACE` ago (the server also does every few minutes);
/// returns how many were deleted and how many remain.
pub async fn nonce_cleanup(store: &Store, clock: &dyn Clock) -> Result<(u64, i64), OpsError> {
    let deleted = store.sweep_nonces(clock.unix()).await?;
    Ok((deleted, store.used_nonce_count().await?))
}

/// The certbot command line that gets a certificate from `profile` with
/// this configuration: its challenge (standalone http-01 on the port the
/// server validates, else manual dns-01), always an e-mail, the terms'
/// agreement when the profile has terms (certbot asks for both on a
/// terminal and stops without one), and the binding when the profile
/// requires one.
pub fn certbot_hint(config: &Config, profile: &str, directory: &str) -> String {
    use acme_proxy_protocol::types::ChallengeType;
    let mut line = format!("certbot certonly --server {directory}");
    let Some(p) = config.profiles.get(profile) else {
        return line;
    };
    if p.challenges.contains(&ChallengeType::Http01) {
        line.push_str(" --standalone");
        if config.validation.http_port != 80 {
            line.push_str(&format!(" --http-01-port {}", config.validation.http_port));
        }
    } else if p.challenges.contains(&ChallengeType::Dns01) {
        line.push_str(" --manual --preferred-challenges dns");
    }
    if p.terms_of_service.is_some() {
        line.push_str(" --agree-tos");
    }
    line.push_str(" -m admin@example.internal");
    if p.eab == crate::config::EabMode::Required {
        line.push_str(" --eab-kid KID --eab-hmac-key KEY");
    }
    line.push_str(" -d host.example.internal");
    if p.eab == crate::config::EabMode::Required {
        line.push_str(" (KID and KEY from `acme-proxy eab create`)");
    }
    line
}

/// How `url` is reached under `egress` ("via proxy …", "direct …").
pub(crate) fn route(egress: &crate::config::EgressConfig, url: &str) -> String {
    match crate::egress::Egress::from_config(egress) {
        Ok(e) => e.describe(url),
        Err(e) => format!("egress unusable: {e}"),
    }
}

/// One line per profile saying how it issues and how its upstream and
/// webhooks are reached: what operators see at start-up and from
/// `acme-proxy config check`.
pub fn describe_profiles(config: &Config) -> Vec<String> {
    config
        .profiles
        .iter()
        .map(|(name, p)| {
            let signer = match &p.signer {
                SignerConfig::LocalCa(ca) => match &ca.ca_cert {
                    Some(cert) => format!("embedded CA {}", cert.display()),
                    None => "embedded CA (self-generated)".to_owned(),
                },
                SignerConfig::Relay(r) => r
                    .upstreams()
                    .enumerate()
                    .map(|(i, u)| {
                        format!(
                            "{} {}{} ({} strategy, {})",
                            if i == 0 { "relay to" } else { "then" },
                            u.directory,
                            if r.fallback.is_empty() {
                                String::new()
                            } else {
                                format!(" [{}]", u.name)
                            },
                            format!("{:?}", u.strategy).to_lowercase(),
                            route(config.relay_egress(u), &u.directory)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                SignerConfig::Custom(c) => format!("custom signer {}", c.command.display()),
            };
            let mut line = format!(
                "{name}: {signer}; challenges {}",
                p.challenges
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if !p.notify.webhooks.is_empty() {
                line.push_str(&format!(
                    "; webhooks {}",
                    p.notify
                        .webhooks
                        .iter()
                        .map(|(name, hook)| format!(
                            "{name} ({})",
                            route(config.webhook_egress(hook), &hook.url)
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if p.bypass {
                line.push_str("; WARNING: validation bypass is ON (tests only)");
            }
            line
        })
        .collect()
}

/// A certificate that expires soon, as `cert expiring` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct ExpiringView {
    pub serial: String,
    pub profile: String,
    pub account: String,
    pub order: String,
    pub identifiers: Vec<String>,
    pub not_after: String,
    /// Whole days left (0 on its last day).
    pub days_left: i64,
}

/// Unrevoked certificates that expire within `within` from now, soonest
/// first; without `renewed`, only those nothing has replaced yet.
pub async fn expiring_certificates(
    store: &Store,
    clock: &dyn Clock,
    within: std::time::Duration,
    profile: Option<&str>,
    renewed: bool,
    limit: i64,
) -> Result<Vec<ExpiringView>, OpsError> {
    let now = clock.unix();
    let until = now.saturating_add(i64::try_from(within.as_secs()).unwrap_or(i64::MAX));
    Ok(store
        .expiring_certificates(now, until, profile, renewed, limit)
        .await?
        .into_iter()
        .map(|c| ExpiringView {
            days_left: (c.not_after - now).div_euclid(86_400),
            serial: c.serial,
            profile: c.profile,
            account: c.account_id,
            order: c.order_id,
            identifiers: c.identifiers.into_iter().map(|i| i.value).collect(),
            not_after: rfc3339(c.not_after),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_upstream_that_is_down_is_told_apart_from_the_database_with_its_own_wait() {
        use acme_proxy_protocol::problem::ProblemType;

        let mut upstream = crate::error::AcmeError::new(
            ProblemType::ServerInternal,
            "the upstream CA that issued this certificate cannot be reached; try again later",
        )
        .with_status(503);
        upstream.retry_after = Some(42);
        match refused(upstream) {
            OpsError::Later { words, retry_after } => {
                assert!(words.starts_with("the upstream CA"), "{words}");
                assert_eq!(retry_after, 42);
            }
            other => panic!("{other:?}"),
        }
        let database = crate::error::AcmeError::new(
            ProblemType::ServerInternal,
            crate::error::DATABASE_UNAVAILABLE,
        )
        .with_status(503);
        assert!(
            matches!(refused(database), OpsError::Unavailable(_)),
            "the database"
        );
    }

    fn hint(toml: &str) -> String {
        let config = Config::from_toml(toml).unwrap();
        certbot_hint(&config, "p", "http://acme/profile/p/directory")
    }

    #[test]
    fn the_certbot_hint_follows_the_port_terms_binding_and_challenges_of_the_profile() {
        assert_eq!(
            hint("[profiles.p]\n"),
            "certbot certonly --server http://acme/profile/p/directory --standalone -m admin@example.internal -d host.example.internal"
        );
        let hinted = hint("[validation]\nhttp_port = 5002\n[profiles.p]\n");
        assert!(
            hinted.contains("--standalone --http-01-port 5002 "),
            "{hinted}"
        );
        let hinted = hint("[profiles.p]\nterms_of_service = \"https://acme/tos\"\n");
        assert!(hinted.contains(" --agree-tos -m "), "{hinted}");
        let hinted = hint("[profiles.p]\neab = \"required\"\n");
        assert!(
            hinted.contains("--eab-kid KID --eab-hmac-key KEY")
                && hinted.ends_with("(KID and KEY from `acme-proxy eab create`)"),
            "{hinted}"
        );
        let hinted = hint("[profiles.p]\nchallenges = [\"dns-01\"]\n");
        assert!(
            hinted.contains("--manual --preferred-challenges dns")
                && !hinted.contains("--standalone"),
            "{hinted}"
        );
    }
}
