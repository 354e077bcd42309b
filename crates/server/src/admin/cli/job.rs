//! `acme-proxy job`: inspect and steer the durable job queue.

use std::io::Write;

use acme_proxy_store::JobStatus;
use clap::Subcommand;

use super::common::{
    ListArgs, Table, one_of, open_reader, open_store, operator_actor, print_fields,
};
use crate::admin::ops::{self, JobView};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::jobs::JobKind;

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// List jobs, newest first.
    List {
        /// Only jobs of this kind.
        #[arg(long, value_parser = one_of::<JobKind>())]
        kind: Option<JobKind>,
        /// Only jobs in this state.
        #[arg(long, value_parser = one_of::<JobStatus>())]
        status: Option<JobStatus>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Show one job.
    Show {
        /// The job's id (the first column of `job list`).
        id: i64,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Queue a failed or cancelled job again, or run a queued one now.
    Retry {
        /// The job's id (the first column of `job list`).
        id: i64,
        /// Who is retrying, for the audit trail; defaults to
        /// operator:NAME, the login name.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Cancel a job: it is stopped (if running) and abandoned, naming you.
    Cancel {
        /// The job's id (the first column of `job list`).
        id: i64,
        /// Who is cancelling, for the audit trail; defaults to
        /// operator:NAME, the login name.
        #[arg(long)]
        actor: Option<String>,
    },
}

pub async fn run(config: &Config, command: JobCommand) -> anyhow::Result<()> {
    let store = match command {
        JobCommand::List { .. } | JobCommand::Show { .. } => open_reader(config).await?,
        JobCommand::Retry { .. } | JobCommand::Cancel { .. } => open_store(config).await?,
    };
    let clock = SystemClock;
    let mut out = std::io::stdout().lock();
    match command {
        JobCommand::List { kind, status, list } => {
            let jobs =
                ops::list_jobs(&store, kind.map(JobKind::as_str), status, list.limit).await?;
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
        JobCommand::Retry { id, actor } => {
            let j = ops::retry_job(&store, &clock, id, &operator_actor(actor)).await?;
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
