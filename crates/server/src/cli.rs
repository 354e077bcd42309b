//! The admin CLI: thin formatting over [`crate::ops`].

use std::io::Write;
use std::path::PathBuf;

use acme_proxy_store::{Store, StoreOptions};
use anyhow::Context;
use clap::Subcommand;

use crate::clock::SystemClock;
use crate::config::Config;
use crate::ops::{self, JobView};
use crate::signer::relay::Eab;

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
    print_fields(out, j, 20)
}

/// One `name: value` line per field of `value`, names right-aligned to
/// `width` ("-" for none).
fn print_fields(
    out: &mut impl Write,
    value: &impl serde::Serialize,
    width: usize,
) -> anyhow::Result<()> {
    if let Some(map) = serde_json::to_value(value)?.as_object() {
        for (k, v) in map {
            let shown = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => "-".to_owned(),
                other => other.to_string(),
            };
            writeln!(out, "{k:>width$}: {shown}")?;
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum UpstreamCommand {
    /// Register the upstream account of a relay profile (creating its key
    /// file, 0600, if missing) and record it. Run once per relay profile.
    Register {
        /// The relay profile (optional when there is only one).
        #[arg(long)]
        profile: Option<String>,
        /// External account binding key id given by the upstream CA.
        #[arg(long, requires = "eab_hmac_key_file")]
        eab_kid: Option<String>,
        /// File holding the EAB HMAC key (base64url), or `-` for stdin;
        /// never on the command line.
        #[arg(long, requires = "eab_kid")]
        eab_hmac_key_file: Option<PathBuf>,
    },
    /// Show the relay profiles' upstream accounts.
    Show {
        #[arg(long)]
        profile: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List relayed orders (local order ↔ upstream order), newest first.
    Orders {
        /// processing, valid or invalid.
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
}

pub async fn upstream(config: &Config, command: UpstreamCommand) -> anyhow::Result<()> {
    let url = config.database_url();
    if let Some(dir) = Some(&config.data_dir)
        && !dir.exists()
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the data directory {}", dir.display()))?;
    }
    let store = Store::open(&url, &StoreOptions::default())
        .await
        .with_context(|| format!("opening the database {url}"))?;
    let mut out = std::io::stdout().lock();
    match command {
        UpstreamCommand::Register {
            profile,
            eab_kid,
            eab_hmac_key_file,
        } => {
            let eab = match (eab_kid, eab_hmac_key_file) {
                (Some(kid), Some(file)) => Some(read_eab(kid, &file)?),
                _ => None,
            };
            let (view, registered) = ops::register_upstream(
                &store,
                &SystemClock,
                config,
                profile.as_deref(),
                eab.as_ref(),
            )
            .await?;
            if registered.key_created {
                writeln!(
                    out,
                    "created the upstream account key {} (0600)",
                    registered.key_path.display()
                )?;
            }
            writeln!(
                out,
                "profile {} is registered at {} as {}",
                view.profile,
                view.directory,
                view.account_url.as_deref().unwrap_or("-")
            )?;
        }
        UpstreamCommand::Show { profile, json } => {
            let views = ops::upstream_accounts(&store, config, profile.as_deref()).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&views)?)?;
            } else {
                for v in &views {
                    writeln!(out, "{}", v.profile)?;
                    writeln!(out, "  directory:   {}", v.directory)?;
                    match &v.account_url {
                        Some(url) => writeln!(out, "  account:     {url}")?,
                        None => writeln!(
                            out,
                            "  account:     not registered; run `acme-proxy upstream register --profile {}`",
                            v.profile
                        )?,
                    }
                    writeln!(
                        out,
                        "  thumbprint:  {}",
                        v.key_thumbprint.as_deref().unwrap_or("-")
                    )?;
                    writeln!(out, "  key file:    {}", v.key_file)?;
                }
            }
        }
        UpstreamCommand::Orders {
            status,
            limit,
            json,
        } => {
            let orders = ops::upstream_orders(&store, status.as_deref(), limit).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&orders)?)?;
            } else {
                writeln!(
                    out,
                    "{:<24} {:<12} {:<10} {:<20}  UPSTREAM ORDER / ERROR",
                    "ORDER", "PROFILE", "STATUS", "CREATED"
                )?;
                for o in &orders {
                    writeln!(
                        out,
                        "{:<24} {:<12} {:<10} {:<20}  {}",
                        o.order,
                        o.profile,
                        o.status,
                        o.created_at,
                        o.error
                            .as_deref()
                            .or(o.upstream_order.as_deref())
                            .unwrap_or("-")
                    )?;
                }
            }
        }
    }
    store.close().await;
    Ok(())
}

/// Reads an EAB HMAC key (base64url, as CAs hand it out) from a file or
/// stdin: a secret never travels in argv, where `ps` shows it.
fn read_eab(kid: String, file: &std::path::Path) -> anyhow::Result<Eab> {
    use base64::Engine;
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the EAB key from stdin")?
    } else {
        std::fs::read_to_string(file)
            .with_context(|| format!("reading the EAB key file {}", file.display()))?
    };
    let trimmed = text.trim().trim_end_matches('=');
    let hmac_key = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(trimmed)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed))
        .context("the EAB key is not base64url")?;
    Ok(Eab { kid, hmac_key })
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// List audit records, newest first.
    List {
        #[arg(long)]
        profile: Option<String>,
        #[arg(long)]
        account: Option<String>,
        #[arg(long)]
        order: Option<String>,
        /// Certificate serial, lowercase hex.
        #[arg(long)]
        serial: Option<String>,
        /// e.g. certificate.issued, certificate.issue_failed, order.refused.
        #[arg(long)]
        event: Option<String>,
        /// success, refused or failure.
        #[arg(long)]
        outcome: Option<String>,
        /// Only records this recent: a duration ("1h", "7d") or an RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// Show one audit record.
    Show {
        id: i64,
        #[arg(long)]
        json: bool,
    },
}

pub async fn audit(config: &Config, command: AuditCommand) -> anyhow::Result<()> {
    use crate::clock::Clock;
    let url = config.database_url();
    let store = Store::open(&url, &StoreOptions::default())
        .await
        .with_context(|| format!("opening the database {url}"))?;
    let mut out = std::io::stdout().lock();
    match command {
        AuditCommand::List {
            profile,
            account,
            order,
            serial,
            event,
            outcome,
            since,
            limit,
            json,
        } => {
            let since = match since.as_deref() {
                None => None,
                Some(s) => Some(match humantime::parse_duration(s) {
                    Ok(d) => SystemClock.unix() - d.as_secs() as i64,
                    Err(_) => time::OffsetDateTime::parse(
                        s,
                        &time::format_description::well_known::Rfc3339,
                    )
                    .with_context(|| {
                        format!("--since {s:?}: write a duration (\"1h\") or an RFC 3339 time")
                    })?
                    .unix_timestamp(),
                }),
            };
            let filter = acme_proxy_store::AuditFilter {
                profile: profile.as_deref(),
                account: account.as_deref(),
                order: order.as_deref(),
                serial: serial.as_deref(),
                event: event.as_deref(),
                outcome: outcome.as_deref(),
                since,
            };
            let rows = ops::list_audit(&store, &filter, limit).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
            } else {
                writeln!(
                    out,
                    "{:>6}  {:<20}  {:<26} {:<8} {:<30} {:<15} WHAT",
                    "ID", "AT", "EVENT", "OUTCOME", "ACTOR", "CLIENT"
                )?;
                for r in &rows {
                    let what = match (&r.problem_type, &r.serial) {
                        (Some(p), _) => format!("{p}: {}", r.detail.as_deref().unwrap_or("")),
                        (None, Some(s)) => format!("serial {s} {}", r.identifiers.join(",")),
                        (None, None) => r.identifiers.join(","),
                    };
                    writeln!(
                        out,
                        "{:>6}  {:<20}  {:<26} {:<8} {:<30} {:<15} {}",
                        r.id,
                        r.at,
                        r.event,
                        r.outcome,
                        r.actor,
                        r.client_ip.as_deref().unwrap_or("-"),
                        what
                    )?;
                }
            }
        }
        AuditCommand::Show { id, json } => {
            let r = ops::show_audit(&store, id).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
            } else {
                print_fields(&mut out, &r, 14)?;
            }
        }
    }
    store.close().await;
    Ok(())
}
