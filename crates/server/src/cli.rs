//! The admin CLI: thin formatting over [`crate::ops`].

use std::io::Write;
use std::path::PathBuf;

use acme_proxy_protocol::types::{AccountStatus, OrderStatus};
use acme_proxy_store::{Store, StoreOptions};
use anyhow::Context;
use clap::Subcommand;

use crate::authority::Authority;
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
    let store = open_store(config).await?;
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
                        j.status,
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
        status: Option<OrderStatus>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
}

pub async fn upstream(config: &Config, command: UpstreamCommand) -> anyhow::Result<()> {
    // `upstream register` may be the first command run on a new machine.
    crate::private::create_dir(&config.data_dir)
        .with_context(|| format!("creating the data directory {}", config.data_dir.display()))?;
    let store = open_store(config).await?;
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
            let orders = ops::upstream_orders(&store, status, limit).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&orders)?)?;
            } else {
                let mut table = Table::new(&[
                    "ORDER",
                    "PROFILE",
                    "STATUS",
                    "CREATED",
                    "UPSTREAM ORDER / ERROR",
                ])
                .status_column(2);
                for o in orders {
                    let what = o.error.or(o.upstream_order).unwrap_or_else(|| "-".into());
                    table.row(vec![
                        o.order,
                        o.profile,
                        o.status.to_string(),
                        o.created_at,
                        what,
                    ]);
                }
                table.print()?;
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
        #[arg(long, allow_hyphen_values = true)]
        account: Option<String>,
        #[arg(long, allow_hyphen_values = true)]
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
    let store = open_store(config).await?;
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
                let mut table =
                    Table::new(&["ID", "AT", "EVENT", "OUTCOME", "ACTOR", "CLIENT", "WHAT"])
                        .status_column(3);
                for r in rows {
                    let what = match (&r.problem_type, &r.serial) {
                        (Some(p), _) => format!("{p}: {}", r.detail.as_deref().unwrap_or("")),
                        (None, Some(s)) => format!("serial {s} {}", r.identifiers.join(",")),
                        (None, None) => r.identifiers.join(","),
                    };
                    table.row(vec![
                        r.id.to_string(),
                        r.at,
                        r.event,
                        r.outcome,
                        r.actor,
                        r.client_ip.unwrap_or_else(|| "-".into()),
                        what,
                    ]);
                }
                table.print()?;
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

/// A destructive command that was not confirmed: nothing was changed.
/// The binary exits with [`EXIT_NOT_CONFIRMED`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotConfirmed(String);

/// Exit codes of every command (documented in the README):
/// 0 done; 1 the operation failed or was refused (nothing found, or it
/// would lose something still needed); 2 bad arguments or configuration;
/// 3 a destructive command not confirmed.
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_CONFIG: i32 = 2;
pub const EXIT_NOT_CONFIRMED: i32 = 3;

/// Asks before a destructive change: `--yes` skips the question; without
/// it, a terminal is asked and anything but "y"/"yes" declines, and no
/// terminal (a script, a pipe) refuses outright rather than guess.
fn confirm(yes: bool, what: &str) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(NotConfirmed(format!(
            "refusing to {what} without confirmation: stdin is not a terminal; pass --yes"
        ))
        .into());
    }
    eprint!("{what}? [y/N] ");
    let mut answer = String::new();
    stdin.read_line(&mut answer)?;
    if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
        Ok(())
    } else {
        Err(NotConfirmed("not confirmed; nothing was changed".to_owned()).into())
    }
}

/// `operator:$USER` unless `--actor` names someone.
fn operator_actor(actor: Option<String>) -> String {
    actor.unwrap_or_else(|| {
        format!(
            "operator:{}",
            std::env::var("USER").unwrap_or_else(|_| "unknown".to_owned())
        )
    })
}

async fn open_store(config: &Config) -> anyhow::Result<Store> {
    let url = config.database_url();
    Store::open(&url, &StoreOptions::default())
        .await
        .with_context(|| format!("opening the database {url}"))
}

/// The authority as `serve` builds it (signers, notifier, queue), for the
/// commands that change state: they go through the same code, audit rows
/// and notifications as the ACME requests they mirror. Jobs they queue
/// (notifications) are run by the server.
async fn operator_authority(config: &Config) -> anyhow::Result<std::sync::Arc<Authority>> {
    let assembled =
        crate::server::assemble(config, std::sync::Arc::new(SystemClock), config.base_url())
            .await?;
    Ok(assembled.authority)
}

/// An aligned table for people: a bold header and colored status words on
/// a terminal, plain text when piped or when `NO_COLOR` is set.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    /// The column whose words are colored by meaning.
    status: Option<usize>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
            status: None,
        }
    }

    pub fn status_column(mut self, index: usize) -> Self {
        self.status = Some(index);
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Writes the table; every column but the last is padded to its widest
    /// cell.
    pub fn write(&self, out: &mut impl Write, color: bool) -> std::io::Result<()> {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let line = |out: &mut dyn Write, cells: &[String], header: bool| -> std::io::Result<()> {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let pad = if i + 1 < cells.len() {
                    " ".repeat(widths[i].saturating_sub(cell.chars().count()) + 2)
                } else {
                    String::new()
                };
                let style = match (color, header) {
                    (false, _) => None,
                    (true, true) => Some("1"),
                    (true, false) if Some(i) == self.status => status_color(cell),
                    _ => None,
                };
                match style {
                    Some(code) => text.push_str(&format!("\x1b[{code}m{cell}\x1b[0m{pad}")),
                    None => text.push_str(&format!("{cell}{pad}")),
                }
            }
            writeln!(out, "{}", text.trim_end())
        };
        let headers: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        line(out, &headers, true)?;
        for row in &self.rows {
            line(out, row, false)?;
        }
        Ok(())
    }

    /// Prints to stdout, colored when it is a terminal and `NO_COLOR` is
    /// unset or empty (<https://no-color.org>).
    pub fn print(&self) -> std::io::Result<()> {
        use std::io::IsTerminal;
        let stdout = std::io::stdout();
        let color = color_wanted(
            stdout.is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        );
        self.write(&mut stdout.lock(), color)
    }
}

/// Color only on a terminal, and never when `NO_COLOR` is set non-empty.
pub fn color_wanted(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Green for what went well, red for what did not, yellow for what is
/// under way (SGR color codes).
fn status_color(word: &str) -> Option<&'static str> {
    match word {
        "valid" | "done" | "success" => Some("32"),
        "invalid" | "failed" | "failure" | "refused" | "revoked" | "deactivated" | "cancelled" => {
            Some("31")
        }
        "pending" | "ready" | "processing" | "queued" | "running" | "retiring" => Some("33"),
        _ => None,
    }
}

#[derive(Debug, Subcommand)]
pub enum EabCommand {
    /// Mint an External Account Binding credential (RFC 8555 §7.3.4). Its
    /// HMAC key is printed once; give it, with the key id, to whoever may
    /// register (certbot --eab-kid/--eab-hmac-key, lego --eab --kid/--hmac).
    Create {
        /// Usable only at this profile (default: any profile).
        #[arg(long)]
        profile: Option<String>,
        /// A note for operators: who or what it is for.
        #[arg(long)]
        label: Option<String>,
        /// A name glob the credential's accounts may order (`*` stands for
        /// any run of characters: `*.lab.test`); repeat for several.
        /// Default: any name.
        #[arg(long = "name", value_name = "GLOB")]
        names: Vec<String>,
        #[arg(long)]
        json: bool,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// List credentials, newest first (never their HMAC keys).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a credential: no more registrations with it, and no new
    /// orders from the accounts registered with it.
    Revoke {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        kid: String,
        #[command(flatten)]
        act: Act,
    },
}

pub async fn eab(config: &Config, command: EabCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        EabCommand::Create {
            profile,
            label,
            names,
            json,
            actor,
        } => {
            let authority = operator_authority(config).await?;
            let names = (!names.is_empty()).then_some(names);
            let view = ops::create_eab(
                &authority,
                label.as_deref(),
                profile.as_deref(),
                names.as_deref(),
                &operator_actor(actor),
            )
            .await;
            authority.close().await;
            let view = view?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&view)?)?;
            } else {
                print_fields(&mut out, &view, 16)?;
                writeln!(
                    out,
                    "the HMAC key is shown this once; it cannot be read back later"
                )?;
            }
        }
        EabCommand::List { json } => {
            let store = open_store(config).await?;
            let list = ops::list_eab(&store).await;
            store.close().await;
            let list = list?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
                return Ok(());
            }
            let mut table = Table::new(&[
                "KID", "STATUS", "PROFILE", "LABEL", "NAMES", "ACCOUNTS", "CREATED",
            ])
            .status_column(1);
            for e in list {
                table.row(vec![
                    e.kid,
                    e.status.to_owned(),
                    e.profile.unwrap_or_else(|| "*".to_owned()),
                    e.label.unwrap_or_default(),
                    e.names
                        .map(|n| n.join(","))
                        .unwrap_or_else(|| "*".to_owned()),
                    e.accounts.to_string(),
                    e.created_at,
                ]);
            }
            table.print()?;
        }
        EabCommand::Revoke { kid, act } => {
            confirm(
                act.yes,
                &format!("revoke external account credential {kid}"),
            )?;
            let authority = operator_authority(config).await?;
            let view = ops::revoke_eab(&authority, &kid, &operator_actor(act.actor)).await;
            authority.close().await;
            print_view(&mut out, &view?, false)?;
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum AccountCommand {
    /// List ACME accounts, newest first.
    List {
        #[arg(long)]
        profile: Option<String>,
        /// valid, deactivated or revoked.
        #[arg(long)]
        status: Option<AccountStatus>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// Show one account, with its order and certificate counts.
    Show {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Deactivate an account (RFC 8555 §7.3.6): its authorizations are
    /// deactivated and its unfinished orders invalid; it can do nothing more.
    Deactivate {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        id: String,
        #[command(flatten)]
        act: Act,
    },
    /// Delete an account and its orders, authorizations and expired
    /// certificates. Refused while one of its certificates has not expired
    /// or one of its orders is in flight. The audit trail keeps its rows.
    Delete {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        id: String,
        #[command(flatten)]
        act: Act,
    },
}

/// What every command that changes something takes.
#[derive(Debug, clap::Args)]
pub struct Act {
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
    /// Who is acting; defaults to operator:$USER.
    #[arg(long)]
    actor: Option<String>,
}

pub async fn account(config: &Config, command: AccountCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        AccountCommand::List {
            profile,
            status,
            limit,
            json,
        } => {
            let store = open_store(config).await?;
            let accounts = ops::list_accounts(&store, profile.as_deref(), status, limit).await?;
            store.close().await;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&accounts)?)?;
                return Ok(());
            }
            let mut table =
                Table::new(&["ID", "PROFILE", "STATUS", "CREATED", "CONTACT"]).status_column(2);
            for a in accounts {
                table.row(vec![
                    a.id,
                    a.profile,
                    a.status.to_string(),
                    a.created_at,
                    a.contact.join(","),
                ]);
            }
            table.print()?;
        }
        AccountCommand::Show { id, json } => {
            let store = open_store(config).await?;
            let view = ops::show_account(&store, &id).await;
            store.close().await;
            print_view(&mut out, &view?, json)?;
        }
        AccountCommand::Deactivate { id, act } => {
            confirm(act.yes, &format!("deactivate account {id}"))?;
            let authority = operator_authority(config).await?;
            let view = ops::deactivate_account(&authority, &id, &operator_actor(act.actor)).await;
            authority.close().await;
            print_view(&mut out, &view?, false)?;
        }
        AccountCommand::Delete { id, act } => {
            confirm(
                act.yes,
                &format!("delete account {id} with all its orders and expired certificates"),
            )?;
            let authority = operator_authority(config).await?;
            let done = ops::delete_account(&authority, &id, &operator_actor(act.actor)).await;
            authority.close().await;
            done?;
            writeln!(out, "account {id} deleted")?;
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum OrderCommand {
    /// List orders, newest first.
    List {
        #[arg(long)]
        profile: Option<String>,
        #[arg(long, allow_hyphen_values = true)]
        account: Option<String>,
        /// pending, ready, processing, valid or invalid.
        #[arg(long)]
        status: Option<OrderStatus>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// Show one order with its certificate.
    Show {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Revoke the certificate of an order (upstream first for a relayed
    /// one; the CRL is re-signed).
    Revoke {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        id: String,
        /// RFC 5280 reason code: 0, 1, 3, 4 or 5 (default 0).
        #[arg(long)]
        reason: Option<u64>,
        #[command(flatten)]
        act: Act,
    },
    /// Delete an order with its expired certificate and the authorizations
    /// no other order uses. Refused while its certificate has not expired or
    /// it is in flight.
    Delete {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        id: String,
        #[command(flatten)]
        act: Act,
    },
}

pub async fn order(config: &Config, command: OrderCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        OrderCommand::List {
            profile,
            account,
            status,
            limit,
            json,
        } => {
            let store = open_store(config).await?;
            let orders = ops::list_orders(
                &store,
                profile.as_deref(),
                account.as_deref(),
                status,
                limit,
            )
            .await;
            store.close().await;
            let orders = orders?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&orders)?)?;
                return Ok(());
            }
            let mut table = Table::new(&[
                "ID",
                "PROFILE",
                "ACCOUNT",
                "STATUS",
                "CREATED",
                "IDENTIFIERS",
            ])
            .status_column(3);
            for o in orders {
                table.row(vec![
                    o.id,
                    o.profile,
                    o.account,
                    o.status.to_string(),
                    o.created_at,
                    o.identifiers.join(","),
                ]);
            }
            table.print()?;
        }
        OrderCommand::Show { id, json } => {
            let store = open_store(config).await?;
            let view = ops::show_order(&store, &id).await;
            store.close().await;
            print_view(&mut out, &view?, json)?;
        }
        OrderCommand::Revoke { id, reason, act } => {
            confirm(act.yes, &format!("revoke the certificate of order {id}"))?;
            let authority = operator_authority(config).await?;
            let view = ops::revoke_order(&authority, &id, reason, &operator_actor(act.actor)).await;
            authority.close().await;
            print_view(&mut out, &view?, false)?;
        }
        OrderCommand::Delete { id, act } => {
            confirm(act.yes, &format!("delete order {id}"))?;
            let authority = operator_authority(config).await?;
            let done = ops::delete_order(&authority, &id, &operator_actor(act.actor)).await;
            authority.close().await;
            done?;
            writeln!(out, "order {id} deleted")?;
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum NonceCommand {
    /// Delete expired nonces now (the server also does every 5 minutes).
    Cleanup,
}

pub async fn nonce(config: &Config, command: NonceCommand) -> anyhow::Result<()> {
    match command {
        NonceCommand::Cleanup => {
            let store = open_store(config).await?;
            let result = ops::nonce_cleanup(&store, &SystemClock).await;
            store.close().await;
            let (deleted, left) = result?;
            println!("deleted {deleted} expired nonce(s); {left} unexpired remain");
        }
    }
    Ok(())
}

/// A view as `name: value` lines, or as JSON.
fn print_view(
    out: &mut impl Write,
    view: &impl serde::Serialize,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(view)?)?;
        return Ok(());
    }
    print_fields(out, view, 16)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn table() -> Table {
        let mut t = Table::new(&["ID", "STATUS", "WHAT"]).status_column(1);
        t.row(vec!["1".into(), "valid".into(), "a.example".into()]);
        t.row(vec!["1234".into(), "invalid".into(), "b.example".into()]);
        t
    }

    #[test]
    fn a_table_is_aligned_on_its_widest_cells() {
        let mut out = Vec::new();
        table().write(&mut out, false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ID    STATUS   WHAT\n1     valid    a.example\n1234  invalid  b.example\n"
        );
    }

    #[test]
    fn a_colored_table_colors_the_header_and_status_words_only() {
        let mut out = Vec::new();
        table().write(&mut out, true).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("\x1b[1mID\x1b[0m"), "{text:?}");
        assert!(text.contains("\x1b[32mvalid\x1b[0m"), "{text:?}");
        assert!(text.contains("\x1b[31minvalid\x1b[0m"), "{text:?}");
        assert!(!text.contains("\x1b[32ma.example"), "{text:?}");
    }

    #[derive(Debug, clap::Parser)]
    struct Orders {
        #[command(subcommand)]
        command: OrderCommand,
    }

    #[test]
    fn an_order_id_that_starts_with_a_dash_is_taken_as_the_id_wherever_the_options_are() {
        // Ids stored before ids stopped starting with `-` are still in use.
        use clap::Parser;
        for argv in [
            &["o", "revoke", "-kQ2x", "--reason", "4", "--yes"][..],
            &["o", "revoke", "--yes", "-kQ2x", "--reason", "4"][..],
        ] {
            let parsed = Orders::try_parse_from(argv).unwrap();
            match parsed.command {
                OrderCommand::Revoke { id, reason, act } => {
                    assert_eq!(id, "-kQ2x");
                    assert_eq!(reason, Some(4));
                    assert!(act.yes);
                }
                other => panic!("{other:?}"),
            }
        }
        let parsed = Orders::try_parse_from(["o", "show", "--json", "--x"]).unwrap();
        assert!(matches!(parsed.command, OrderCommand::Show { id, json: true } if id == "--x"));
        let parsed = Orders::try_parse_from(["o", "list", "--account", "-kQ2x"]).unwrap();
        assert!(
            matches!(parsed.command, OrderCommand::List { account: Some(a), .. } if a == "-kQ2x")
        );
    }

    #[test]
    fn color_is_only_for_terminals_and_never_with_no_color() {
        use std::ffi::OsStr;
        assert!(color_wanted(true, None));
        assert!(color_wanted(true, Some(OsStr::new(""))));
        assert!(!color_wanted(true, Some(OsStr::new("1"))));
        assert!(!color_wanted(false, None));
    }
}
