//! `acme-proxy job`: inspect and steer the durable job queue.

use std::io::Write;

use acme_proxy_store::JobStatus;
use clap::Subcommand;

use super::common::{ListArgs, Table, open_store, operator_actor, print_fields};
use crate::admin::ops::{self, JobView};
use crate::clock::SystemClock;
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// List jobs, newest first.
    #[command(mut_arg("json", |a| a.help("One JSON array instead of a table")))]
    List {
        #[arg(long)]
        kind: Option<String>,
        /// queued, running, retiring, done, failed or cancelled.
        #[arg(long)]
        status: Option<JobStatus>,
        #[command(flatten)]
        list: ListArgs,
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

pub async fn run(config: &Config, command: JobCommand) -> anyhow::Result<()> {
    let store = open_store(config).await?;
    let clock = SystemClock;
    let mut out = std::io::stdout().lock();
    match command {
        JobCommand::List { kind, status, list } => {
            let jobs = ops::list_jobs(&store, kind.as_deref(), status, list.limit).await?;
            if list.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&jobs)?)?;
            } else {
                let mut table = Table::new(&[
                    "ID",
                    "KIND",
                    "STATUS",
                    "ATTEMPTS",
                    "RUN AT",
                    "KEY",
                    "LAST ERROR",
                ])
                .status_column(2);
                for j in jobs {
                    table.row(vec![
                        j.id.to_string(),
                        j.kind,
                        j.status.to_string(),
                        format!("{}/{}", j.attempts, j.max_attempts),
                        j.run_at,
                        j.key,
                        j.last_error.unwrap_or_default(),
                    ]);
                }
                table.print()?;
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
            let actor = operator_actor(actor);
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
    print_fields(out, j, 20)
}
