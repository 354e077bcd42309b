//! Notifications: certificate issued or revoked,
//! account created or deactivated, challenge failed, relay abandoned —
//! told to the operator's webhooks, mailboxes and scripts, each delivery a
//! durable job so a receiver that is down is retried, not lost.
//!
//! `outbox` prepares the deliveries of one notice (one job per event per
//! subscribed destination) before the change it reports, and the store
//! queues them in that change's transaction: a crash cannot record the
//! change and lose its notification. Nothing else waits for a receiver. Delivery runs in the `notify_delivery` job: transport errors,
//! timeouts, 408, 429 and 5xx are retried with backoff; any other answer
//! and a template that cannot render are permanent and audited.
//!
//! Slack, Mattermost, Teams or Matrix are templates (bodies), not backends.

pub mod email;
pub mod templates;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use acme_proxy_protocol::types::Identifier;
use acme_proxy_store::{AuditEvent, AuditOutcome, JobRow, NewAuditRow, NewJob, Store};
use serde::{Deserialize, Serialize};

use crate::clock::SharedClock;
use crate::config::{Config, EmailConfig, ScriptConfig, WebhookConfig};
use crate::events::Event;
use crate::jobs::{BoxFuture, JobHandler, JobObserver, Outcome, Queue, RetireReason};
use email::Mailer;
use templates::Templates;
use webhook::{Delivery, WebhookClient};

/// The job kind; the key names the event, its subject and the destination.
pub const NOTIFY_KIND: &str = crate::jobs::JobKind::NotifyDelivery.as_str();

/// What happened, as templates see it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Notice {
    pub event: Event,
    pub profile: String,
    /// RFC 3339.
    pub at: String,
    pub account: Option<String>,
    pub order: Option<String>,
    /// The challenge of a `challenge.failed`.
    pub challenge: Option<String>,
    pub serial: Option<String>,
    pub identifiers: Vec<String>,
    /// RFC 3339 notAfter of an issued certificate.
    pub not_after: Option<String>,
    /// A reason, for failures (operator-facing).
    pub detail: Option<String>,
}

impl Notice {
    pub fn new(event: Event, profile: &str, at: i64) -> Self {
        Self {
            event,
            profile: profile.to_owned(),
            at: crate::clock::rfc3339(at),
            account: None,
            order: None,
            challenge: None,
            serial: None,
            identifiers: Vec::new(),
            not_after: None,
            detail: None,
        }
    }

    pub fn identifiers(mut self, ids: &[Identifier]) -> Self {
        self.identifiers = ids.iter().map(|i| i.value.clone()).collect();
        self
    }

    /// What the event is about, for the job's identity: one delivery per
    /// event, subject and destination, however often it is dispatched.
    fn subject(&self) -> &str {
        self.serial
            .as_deref()
            .or(self.challenge.as_deref())
            .or(self.order.as_deref())
            .or(self.account.as_deref())
            .unwrap_or(&self.at)
    }
}

/// The prepared deliveries of one notice (see [`Notifier::outbox`]).
#[derive(Debug, Default)]
pub struct Outbox {
    /// (identity key, payload JSON) per delivery.
    jobs: Vec<(String, String)>,
    now_ms: i64,
    max_attempts: i64,
}

impl Outbox {
    /// The job rows, due now, for the store's transaction.
    pub fn jobs(&self) -> Vec<NewJob<'_>> {
        self.jobs
            .iter()
            .map(|(key, payload)| NewJob {
                kind: NOTIFY_KIND,
                key,
                payload,
                run_at: self.now_ms,
                deadline: None,
                max_attempts: self.max_attempts,
                fair_key: None,
            })
            .collect()
    }
}

/// One configured destination of one profile.
#[derive(Debug)]
struct Destination {
    profile: String,
    /// The webhook's name, `script:NAME` for a script, `email:NAME` for an
    /// email destination.
    name: String,
    target: Target,
}

#[derive(Debug)]
enum Target {
    /// With its own client: each webhook may have its own `egress`.
    Webhook(Box<(WebhookConfig, WebhookClient)>),
    Script(ScriptConfig),
    Email(Box<(EmailConfig, Mailer)>),
}

impl Destination {
    fn events(&self) -> &[Event] {
        match &self.target {
            Target::Webhook(w) => &w.0.events,
            Target::Script(s) => &s.events,
            Target::Email(email) => &email.0.events,
        }
    }

    fn timeout(&self) -> Duration {
        match &self.target {
            Target::Webhook(w) => w.0.timeout,
            Target::Script(s) => s.timeout,
            Target::Email(email) => email.0.timeout,
        }
    }
}

/// A script's exit code meaning "not now, try again later" (sysexits
/// EX_TEMPFAIL); any other non-zero code is a refusal.
pub const SCRIPT_TEMPFAIL: i32 = 75;

/// Output kept from a notification script.
const SCRIPT_OUTPUT_CAP: usize = 64 * 1024;

/// Every profile's destinations and the templates.
#[derive(Debug)]
pub struct Notifier {
    destinations: Vec<Destination>,
    templates: Templates,
    queue: Arc<Queue>,
    store: Store,
    clock: SharedClock,
    metrics: Arc<crate::metrics::Metrics>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Payload {
    profile: String,
    webhook: String,
    notice: Notice,
}

/// What a [`Notifier`] is made of that comes from the configuration alone:
/// built (and refused) before the database is opened.
#[derive(Debug)]
pub struct Destinations {
    destinations: Vec<Destination>,
    templates: Templates,
}

impl Notifier {
    /// Loads and compiles every template the configuration names and sets
    /// up every destination; a template that does not compile stops
    /// start-up with its name and line.
    pub fn destinations(
        config: &Config,
        metrics: &Arc<crate::metrics::Metrics>,
    ) -> Result<Destinations, String> {
        let templates = check_templates(config)?;
        let mut destinations = Vec::new();
        for (profile, p) in &config.profiles {
            for (name, hook) in &p.notify.webhooks {
                let egress = crate::egress::Egress::from_config(config.webhook_egress(hook))
                    .map_err(|e| format!("profiles.{profile}.notify.webhooks.{name}: {e}"))?;
                let client = WebhookClient::new(Arc::new(egress), Arc::clone(metrics), profile)?;
                destinations.push(Destination {
                    profile: profile.clone(),
                    name: name.clone(),
                    target: Target::Webhook(Box::new((hook.clone(), client))),
                });
            }
            for (name, script) in &p.notify.scripts {
                destinations.push(Destination {
                    profile: profile.clone(),
                    name: format!("script:{name}"),
                    target: Target::Script(script.clone()),
                });
            }
            for (name, email) in &p.notify.emails {
                let key = format!("profiles.{profile}.notify.emails.{name}");
                destinations.push(Destination {
                    profile: profile.clone(),
                    name: format!("email:{name}"),
                    target: Target::Email(Box::new((email.clone(), Mailer::new(&key, email)?))),
                });
            }
        }
        Ok(Destinations {
            destinations,
            templates,
        })
    }

    pub fn new(
        destinations: Destinations,
        queue: Arc<Queue>,
        store: Store,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        let Destinations {
            destinations,
            templates,
        } = destinations;
        Self {
            destinations,
            templates,
            clock: Arc::clone(&queue.clock),
            queue,
            store,
            metrics,
        }
    }

    /// The deliveries of `notice`: one per destination of its profile that
    /// subscribed to its event, each identified by
    /// `profile/destination/event/subject`, for the store to queue in the
    /// transaction that records what the notice reports.
    pub fn outbox(&self, notice: &Notice) -> Outbox {
        let mut jobs = Vec::new();
        for d in &self.destinations {
            if d.profile != notice.profile
                || !(d.events().is_empty() || d.events().contains(&notice.event))
            {
                continue;
            }
            let key = format!(
                "{}/{}/{}/{}",
                d.profile,
                d.name,
                notice.event,
                notice.subject()
            );
            let payload = Payload {
                profile: d.profile.clone(),
                webhook: d.name.clone(),
                notice: notice.clone(),
            };
            match serde_json::to_string(&payload) {
                Ok(payload) => jobs.push((key, payload)),
                Err(e) => {
                    tracing::error!(event = "notify.dispatch", outcome = "failure", error = %e, "could not encode a notification");
                }
            }
        }
        Outbox {
            jobs,
            now_ms: self.clock.unix_ms(),
            max_attempts: i64::from(self.queue.config().max_attempts),
        }
    }

    /// After the transaction that queued `outbox` committed: counts the
    /// deliveries and wakes the runner.
    pub fn posted(&self, outbox: &Outbox) {
        for _ in &outbox.jobs {
            self.queue.observer.enqueued(NOTIFY_KIND);
        }
        if !outbox.jobs.is_empty() {
            self.queue.nudge();
        }
    }

    fn destination(&self, profile: &str, name: &str) -> Option<&Destination> {
        self.destinations
            .iter()
            .find(|d| d.profile == profile && d.name == name)
    }

    /// Sends one delivery; the job outcome follows whose answer it was.
    async fn deliver(&self, job: &JobRow) -> Outcome {
        let payload: Payload = match serde_json::from_str(&job.payload) {
            Ok(p) => p,
            Err(e) => return Outcome::Failed(format!("unreadable payload: {e}")),
        };
        // A webhook removed from the configuration since: nothing to do.
        let Some(d) = self.destination(&payload.profile, &payload.webhook) else {
            return Outcome::Failed(format!(
                "webhook {} of profile {} is no longer configured",
                payload.webhook, payload.profile
            ));
        };
        let render = |name: &str| {
            self.templates
                .render(name, &payload.notice)
                .map_err(|e| Outcome::Failed(format!("template {name}: {e}")))
        };
        let delivery = match &d.target {
            Target::Script(script) => return run_script(&d.name, script, &payload.notice).await,
            Target::Webhook(hook) => match render(&hook.0.template) {
                Ok(body) => hook.1.send(&hook.0, body).await,
                Err(failed) => return failed,
            },
            Target::Email(email) => {
                let (email, mailer) = &**email;
                match (
                    render(&email.subject_template),
                    render(&email.body_template),
                ) {
                    (Ok(subject), Ok(body)) => mailer.send(&subject, body).await,
                    (Err(failed), _) | (_, Err(failed)) => return failed,
                }
            }
        };
        match delivery {
            Delivery::Delivered(status) => {
                tracing::info!(event = "notify.delivered", outcome = "success", webhook = %d.name, notice = %payload.notice.event, status, "notification delivered");
                // Delivered, not yet settled: the one place a crash sends
                // a notification twice (at least once, documented).
                crash_point!("notify.delivered");
                Outcome::Done
            }
            Delivery::Later { reason, after } => match after {
                Some(after) => Outcome::RetryAfter(after, reason),
                None => Outcome::Retry(reason),
            },
            Delivery::Refused(reason) => Outcome::Failed(reason),
        }
    }
}

/// A script destination: the notice as JSON on stdin, hardened execution.
/// Exit 0 is delivered, [`SCRIPT_TEMPFAIL`] (and a timeout or a failure to
/// start) is retried, any other code is a refusal whose first stderr line
/// is kept for the audit row.
async fn run_script(name: &str, script: &ScriptConfig, notice: &Notice) -> Outcome {
    let input = match serde_json::to_vec(notice) {
        Ok(v) => v,
        Err(e) => return Outcome::Failed(format!("encoding the notice: {e}")),
    };
    match crate::operator_program::run(
        &script.command,
        &script.args,
        &input,
        script.timeout,
        SCRIPT_OUTPUT_CAP,
    )
    .await
    {
        Ok(done) if done.status.success() => {
            tracing::info!(event = "notify.delivered", outcome = "success", destination = %name, notice = %notice.event, "notification script succeeded");
            Outcome::Done
        }
        Ok(done) if done.status.code() == Some(SCRIPT_TEMPFAIL) => Outcome::Retry(format!(
            "{name} asked to retry (exit {SCRIPT_TEMPFAIL}): {}",
            done.first_error_line()
        )),
        Ok(done) => Outcome::Failed(format!(
            "{name} failed ({}): {}",
            done.status,
            done.first_error_line()
        )),
        Err(e) => Outcome::Retry(format!("{name}: {e}")),
    }
}

/// Loads the templates and renders every one a webhook names with a sample
/// notice: what start-up and `acme-proxy config check` refuse.
pub fn check_templates(config: &Config) -> Result<Templates, String> {
    let templates = Templates::load(config.notify.templates_dir.as_deref())?;
    for (profile, p) in &config.profiles {
        for (name, hook) in &p.notify.webhooks {
            templates
                .check(&hook.template)
                .map_err(|e| format!("profiles.{profile}.notify.webhooks.{name}.template: {e}"))?;
        }
        for (name, email) in &p.notify.emails {
            for (field, template) in [
                ("subject_template", &email.subject_template),
                ("body_template", &email.body_template),
            ] {
                templates
                    .check(template)
                    .map_err(|e| format!("profiles.{profile}.notify.emails.{name}.{field}: {e}"))?;
            }
        }
    }
    Ok(templates)
}

/// The handler of [`NOTIFY_KIND`] jobs.
#[derive(Debug)]
pub struct NotifyJobs {
    /// The current generation's notifier delivers: its targets are the
    /// configuration's at the time of the attempt.
    pub generations: crate::generation::Generations,
}

impl JobHandler for NotifyJobs {
    fn kind(&self) -> &'static str {
        NOTIFY_KIND
    }

    fn budget(&self, job: &JobRow) -> Option<Duration> {
        let payload: Payload = serde_json::from_str(&job.payload).ok()?;
        let notifier = Arc::clone(&self.generations.authority().notifier);
        let d = notifier.destination(&payload.profile, &payload.webhook)?;
        Some(d.timeout() + Duration::from_secs(5))
    }

    fn run<'a>(&'a self, job: &'a JobRow) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let notifier = Arc::clone(&self.generations.authority().notifier);
            notifier.deliver(job).await
        })
    }

    /// A notification given up on is audited: the operator learns what was
    /// not told.
    fn abandon<'a>(
        &'a self,
        job: &'a JobRow,
        reason: &'a RetireReason,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let n = &Arc::clone(&self.generations.authority().notifier);
            let payload: Option<Payload> = serde_json::from_str(&job.payload).ok();
            let detail = match &payload {
                Some(p) => format!("{} to {}: {reason}", p.notice.event, p.webhook),
                None => reason.to_string(),
            };
            // An operator's cancel is theirs; anything else the system's.
            let actor = reason.cancelled_by().unwrap_or_else(|| "system".to_owned());
            let audit = NewAuditRow {
                profile: payload.as_ref().map(|p| p.profile.as_str()),
                account_id: payload.as_ref().and_then(|p| p.notice.account.as_deref()),
                order_id: payload.as_ref().and_then(|p| p.notice.order.as_deref()),
                serial: payload.as_ref().and_then(|p| p.notice.serial.as_deref()),
                detail: Some(&detail),
                ..NewAuditRow::new(
                    n.clock.unix(),
                    AuditEvent::NotificationFailed,
                    AuditOutcome::Failure,
                    &actor,
                )
            };
            if let Err(e) = n.store.insert_audit(&audit).await {
                return Err(format!("auditing the notification given up: {e}"));
            }
            n.metrics.audited(&audit);
            tracing::warn!(event = "notify.abandoned", outcome = "failure", reason = %detail, "notification given up");
            Ok(())
        })
    }
}
