//! What the web console's dashboard shows: issuances and failures per
//! profile per day, why orders failed, what the relay and the job queue
//! hold, what expires soon, and profiles that skip validation.

use acme_proxy_store::{AuditEvent, Store};
use serde::Serialize;

use super::ops::OpsError;
use crate::clock::rfc3339;
use crate::config::Config;

/// Days the chart covers, today included.
pub const DAYS: i64 = 14;

#[derive(Debug, Clone, Serialize)]
pub struct DashboardView {
    /// Each day's date (UTC), oldest first.
    pub days: Vec<String>,
    pub profiles: Vec<ProfileActivity>,
    /// Why orders failed over the period, most frequent first.
    pub failure_reasons: Vec<Reason>,
    pub relay_in_flight: i64,
    /// Since when the oldest relayed order in flight has waited.
    pub oldest_relay_since: Option<String>,
    pub oldest_relay_minutes: Option<i64>,
    /// Jobs waiting or running, per kind.
    pub jobs: Vec<JobDepth>,
    pub expiring_7_days: i64,
    pub expiring_30_days: i64,
    /// Profiles whose challenges are not validated (`bypass = true`).
    pub bypass: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProfileActivity {
    pub name: String,
    /// Per day, as `days`.
    pub issued: Vec<i64>,
    pub failed: Vec<i64>,
    pub issued_total: i64,
    pub failed_total: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Reason {
    pub reason: String,
    pub count: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobDepth {
    pub kind: String,
    pub queued: i64,
    pub running: i64,
}

pub async fn dashboard(
    config: &Config,
    store: &Store,
    now: i64,
) -> Result<DashboardView, OpsError> {
    let today = now.div_euclid(86_400);
    let since = (today - (DAYS - 1)) * 86_400;
    let days = (0..DAYS)
        .map(|d| rfc3339(since + d * 86_400)[..10].to_owned())
        .collect();
    // Every row but a successful issuance is a failure or refusal.
    let counts = store.issuance_outcomes_by_day(since).await?;
    let mut profiles: Vec<ProfileActivity> = config
        .profiles
        .keys()
        .map(|name| ProfileActivity {
            name: name.clone(),
            issued: vec![0; DAYS as usize],
            failed: vec![0; DAYS as usize],
            issued_total: 0,
            failed_total: 0,
        })
        .collect();
    let mut reasons: Vec<Reason> = Vec::new();
    for c in counts {
        let Ok(day) = usize::try_from(c.day) else {
            continue;
        };
        let issued = c.event == AuditEvent::CertificateIssued.as_str() && c.outcome == "success";
        if !issued {
            let reason = c.problem_type.clone().unwrap_or_else(|| c.event.clone());
            match reasons.iter_mut().find(|r| r.reason == reason) {
                Some(r) => r.count += c.count,
                None => reasons.push(Reason {
                    reason,
                    count: c.count,
                }),
            }
        }
        // Rows of a profile no longer configured are left out of the
        // chart (their reasons still count).
        let Some(p) = profiles
            .iter_mut()
            .find(|p| Some(p.name.as_str()) == c.profile.as_deref())
        else {
            continue;
        };
        if day >= p.issued.len() {
            continue;
        }
        if issued {
            p.issued[day] += c.count;
            p.issued_total += c.count;
        } else {
            p.failed[day] += c.count;
            p.failed_total += c.count;
        }
    }
    reasons.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
    let (relay_in_flight, oldest) = store.relay_in_flight().await?;
    let mut jobs: Vec<JobDepth> = Vec::new();
    for (kind, status, count) in store.job_counts().await?.by_kind_and_status {
        let (queued, running) = match status.as_str() {
            "queued" => (count, 0),
            "running" | "retiring" => (0, count),
            _ => continue,
        };
        match jobs.iter_mut().find(|j| j.kind == kind) {
            Some(j) => {
                j.queued += queued;
                j.running += running;
            }
            None => jobs.push(JobDepth {
                kind,
                queued,
                running,
            }),
        }
    }
    jobs.sort_by(|a, b| a.kind.cmp(&b.kind));
    Ok(DashboardView {
        days,
        profiles,
        failure_reasons: reasons,
        relay_in_flight,
        oldest_relay_since: oldest.map(rfc3339),
        oldest_relay_minutes: oldest.map(|t| (now - t).max(0) / 60),
        jobs,
        expiring_7_days: store
            .count_expiring_certificates(now, now + 7 * 86_400)
            .await?,
        expiring_30_days: store
            .count_expiring_certificates(now, now + 30 * 86_400)
            .await?,
        bypass: config
            .profiles
            .iter()
            .filter(|(_, p)| p.bypass)
            .map(|(name, _)| name.clone())
            .collect(),
    })
}
