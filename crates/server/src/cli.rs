//! The admin CLI: thin formatting over [`crate::ops`].

use std::io::Write;

use acme_proxy_store::{Store, StoreOptions};
use anyhow::Context;
use clap::Subcommand;

use crate::clock::SystemClock;
use crate::config::Config;
use crate::ops::{self, JobView};

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// List jobs, newest first.
    List {
        #[arg(long)]
        kind: Option<String>,
        /// queued, running, retiring, done, failed or cancelled.
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job.
    Show {
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Queue a failed or cancelled job again, or run a queued one now.
    Retry { id: i64 },
    /// Cancel a job: it is stopped (if running) and abandoned, naming you.
    Cancel {
        id: i64,
        /// Who is cancelling; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
}

pub async fn job(config: &Config, command: JobCommand) -> anyhow::Result<()> {
    let url = config.database_url();
    let store = Store::open(&url, &StoreOptions::default())
        .await
        .with_context(|| format!("opening the database {url}"))?;
    let clock = SystemClock;
    let mut out = std::io::stdout().lock();
    match command {
        JobCommand::List {
            kind,
            status,
            limit,
            json,
        } => {
            let jobs = ops::list_jobs(&store, kind.as_deref(), status.as_deref(), limit).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&jobs)?)?;
            } else {
                writeln!(
                    out,
                    "{:>6}  {:<22} {:<10} {:>8}  {:<20}  {:<24} LAST ERROR",
                    "ID", "KIND", "STATUS", "ATTEMPTS", "RUN AT", "KEY"
                )?;
                for j in &jobs {
                    writeln!(
                        out,
                        "{:>6}  {:<22} {:<10} {:>4}/{:<3}  {:<20}  {:<24} {}",
                        j.id,
                        j.kind,
                        j.status,
                        j.attempts,
                        j.max_attempts,
                        j.run_at,
                        j.key,
                        j.last_error.as_deref().unwrap_or("")
                    )?;
                }
            }
        }
        JobCommand::Show { id, json } => {
            let j = ops::show_job(&store, id).await?;
            print_job(&mut out, &j, json)?;
        }
        JobCommand::Retry { id } => {
            let j = ops::retry_job(&store, &clock, id).await?;
            print_job(&mut out, &j, false)?;
        }
        JobCommand::Cancel { id, actor } => {
            let actor = actor.unwrap_or_else(|| {
                format!(
                    "operator:{}",
                    std::env::var("USER").unwrap_or_else(|_| "unknown".to_owned())
                )
            });
            let j = ops::cancel_job(&store, &clock, id, &actor).await?;
            print_job(&mut out, &j, false)?;
            writeln!(
                out,
                "cancellation requested; the runner holding the job (or the next to claim it) stops it and abandons it"
            )?;
        }
    }
    store.close().await;
    Ok(())
}

fn print_job(out: &mut impl Write, j: &JobView, json: bool) -> anyhow::Result<()> {
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(j)?)?;
        return Ok(());
    }
    let v = serde_json::to_value(j)?;
    if let Some(map) = v.as_object() {
        for (k, v) in map {
            let shown = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => "-".to_owned(),
                other => other.to_string(),
            };
            writeln!(out, "{k:>20}: {shown}")?;
        }
    }
    Ok(())
}
