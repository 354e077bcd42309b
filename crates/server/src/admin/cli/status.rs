//! `acme-proxy status`: the installation at a glance.

use std::io::Write;

use super::common::open_reader;
use crate::admin::status::{StatusView, status};
use crate::config::Config;

/// Something looked wrong: the view was printed; the binary exits with
/// [`super::common::EXIT_FAILED`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unhealthy(String);

pub async fn run(config: &Config, json: bool) -> anyhow::Result<()> {
    let store = open_reader(config).await?;
    let view = status(
        config,
        &store,
        std::sync::Arc::new(crate::clock::SystemClock),
    )
    .await;
    store.close().await;
    let view = view?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&view)?)?;
    } else {
        write_text(&mut out, &view)?;
    }
    let wrong = wrong(&view);
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(Unhealthy(format!("not healthy: {}", wrong.join("; "))).into())
    }
}

/// What needs an operator, one short phrase each.
fn wrong(view: &StatusView) -> Vec<String> {
    let mut wrong: Vec<String> = view
        .listeners
        .iter()
        .filter(|l| !l.answering)
        .map(|l| format!("the {} listener does not answer", l.name))
        .collect();
    if !view.configuration_problems.is_empty() {
        wrong.push("the configuration would not start".into());
    }
    wrong.extend(
        view.profiles
            .iter()
            .filter(|p| !p.healthy)
            .map(|p| format!("profile {} cannot sign", p.name)),
    );
    wrong
}

fn write_text(out: &mut impl Write, view: &StatusView) -> std::io::Result<()> {
    for l in &view.listeners {
        match &l.error {
            None => writeln!(out, "{} listener {}: answering", l.name, l.address)?,
            Some(e) => writeln!(
                out,
                "{} listener {}: not answering ({e})",
                l.name, l.address
            )?,
        }
    }
    writeln!(out, "database: {}", view.database)?;
    if view.configuration_problems.is_empty() {
        writeln!(out, "configuration: would start")?;
    } else {
        writeln!(out, "configuration: would not start:")?;
        for p in &view.configuration_problems {
            writeln!(out, "  {p}")?;
        }
    }
    for p in &view.profiles {
        writeln!(
            out,
            "profile {} ({}): {}",
            p.name,
            p.signer,
            if p.healthy { "ok" } else { "NOT OK" }
        )?;
        writeln!(out, "  directory: {}", p.directory)?;
        for note in &p.notes {
            writeln!(out, "  {note}")?;
        }
    }
    let live: Vec<_> = view
        .jobs
        .iter()
        .filter(|j| {
            matches!(
                j.status.as_str(),
                "queued" | "running" | "retiring" | "failed"
            )
        })
        .collect();
    if live.is_empty() {
        writeln!(out, "jobs: none queued, running or failed")?;
    } else {
        writeln!(out, "jobs:")?;
        for j in live {
            writeln!(out, "  {} {}: {}", j.kind, j.status, j.count)?;
        }
    }
    match &view.oldest_relay_order_since {
        Some(since) => writeln!(
            out,
            "relay orders in flight: {} (oldest since {since})",
            view.relay_orders_in_flight
        )?,
        None => writeln!(out, "relay orders in flight: 0")?,
    }
    for (label, happened) in [
        ("last issuance", &view.last_issuance),
        ("last failure", &view.last_failure),
    ] {
        match happened {
            Some(h) => writeln!(
                out,
                "{label}: {} {} {}",
                h.at,
                h.profile.as_deref().unwrap_or("-"),
                h.what
            )?,
            None => writeln!(out, "{label}: none")?,
        }
    }
    Ok(())
}
