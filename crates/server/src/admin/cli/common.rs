//! What the commands share: the `--limit`/`--json` of every list and the
//! `--yes`/`--actor` of every change, the confirmation and exit codes, the
//! store or authority a command works on, and the output (aligned tables,
//! `name: value` fields, JSON).

use std::io::Write;

use acme_proxy_store::Store;
use anyhow::Context;

use crate::authority::Authority;
use crate::clock::SystemClock;
use crate::config::Config;

/// What every list takes, after its filters.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// At most this many rows (1 to 100000).
    #[arg(long, default_value_t = 100, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: i64,
    /// One JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A closed set of words a filter takes: clap lists them in `--help`, and
/// refuses any other with the list (exit 2), before anything is opened.
pub trait Closed: std::str::FromStr + Clone + Send + Sync + 'static {
    fn names() -> Vec<&'static str>;
}

macro_rules! closed {
    ($($t:ty),+) => {$(
        impl Closed for $t {
            fn names() -> Vec<&'static str> {
                <$t>::ALL.iter().map(|v| v.as_str()).collect()
            }
        }
    )+};
}

closed!(
    acme_proxy_store::JobStatus,
    acme_proxy_store::AuditEvent,
    acme_proxy_store::AuditOutcome,
    acme_proxy_protocol::types::OrderStatus,
    acme_proxy_protocol::types::AccountStatus,
    crate::jobs::JobKind
);

/// The parser of a [`Closed`] set's words.
pub fn one_of<T: Closed>() -> impl clap::builder::TypedValueParser<Value = T>
where
    <T as std::str::FromStr>::Err: std::error::Error + Send + Sync + 'static,
{
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(T::names()).try_map(|s| s.parse::<T>())
}

/// A moment in the past as `--since` takes it: a duration back from now
/// ("90m", "7d") or an RFC 3339 time; Unix seconds.
pub fn since(text: &str) -> Result<i64, String> {
    use crate::clock::Clock;
    if let Ok(d) = humantime::parse_duration(text) {
        return Ok(SystemClock.unix() - i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2));
    }
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(time::OffsetDateTime::unix_timestamp)
        .map_err(|_| {
            "write a duration back from now (\"90m\", \"7d\") or an RFC 3339 time \
             (\"2026-01-31T12:00:00Z\")"
                .to_owned()
        })
}

/// What every command that changes something takes.
#[derive(Debug, clap::Args)]
pub struct Act {
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
    /// Who is acting, for the audit trail; defaults to operator:NAME, the
    /// login name ($USER, $LOGNAME, else the user's name in /etc/passwd).
    #[arg(long)]
    pub actor: Option<String>,
}

/// A destructive command that was not confirmed: nothing was changed.
/// The binary exits with [`EXIT_NOT_CONFIRMED`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotConfirmed(String);

/// Exit codes of every command (documented in docs/operating/cli.md):
/// 0 done; 1 the operation failed or was refused (nothing found, or it
/// would lose something still needed); 2 bad arguments or configuration;
/// 3 a destructive command not confirmed.
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_CONFIG: i32 = 2;
pub const EXIT_NOT_CONFIRMED: i32 = 3;

/// Asks before a destructive change: `--yes` skips the question; without
/// it, a terminal is asked and anything but "y"/"yes" declines, and no
/// terminal (a script, a pipe) refuses outright rather than guess.
pub(super) fn confirm(yes: bool, what: &str) -> anyhow::Result<()> {
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

/// `operator:NAME` for the audit trail unless `--actor` names someone:
/// the login name from `$USER`, else `$LOGNAME`, else this process's user
/// as `/etc/passwd` names it, else its uid — never a made-up name.
/// (Users only a directory service knows go by their uid.)
pub(super) fn operator_actor(actor: Option<String>) -> String {
    actor.unwrap_or_else(|| format!("operator:{}", operator_name()))
}

fn operator_name() -> String {
    use std::os::unix::fs::MetadataExt;
    for variable in ["USER", "LOGNAME"] {
        if let Ok(name) = std::env::var(variable)
            && !name.trim().is_empty()
        {
            return name;
        }
    }
    // The owner of /proc/self is this process's real user.
    let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
        return format!("pid:{}", std::process::id());
    };
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id = fields.nth(1)?.parse::<u32>().ok()?;
            (id == uid).then(|| name.to_owned())
        })
        .next()
        .unwrap_or_else(|| format!("uid:{uid}"))
}

/// There is no database where the configuration points: the command was
/// run from another directory, or without the server's configuration.
/// Nothing was created; the binary exits with [`EXIT_CONFIG`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NoDatabase(String);

fn no_database(config: &Config) -> NoDatabase {
    let url = config.database_url();
    let place = match acme_proxy_store::sqlite_file(&url) {
        Some(file) => std::path::absolute(&file)
            .unwrap_or(file)
            .display()
            .to_string(),
        None => format!(
            "{} (it has no acme-proxy tables)",
            config.database_url_shown()
        ),
    };
    NoDatabase(format!(
        "no database at {place}: run from the server's directory or pass --config \
         (or ACME_PROXY_CONFIG) with the server's configuration; the server creates \
         its database when it first starts"
    ))
}

/// The database, read-only, for a command that only reads: it creates no
/// file (not even a missing database's) and cannot change anything.
pub(super) async fn open_reader(config: &Config) -> anyhow::Result<Store> {
    Store::open_read_only(&config.database_url(), &config.store_options()?)
        .await
        .with_context(|| format!("opening the database {}", config.database_url_shown()))?
        .ok_or_else(|| no_database(config).into())
}

/// The database, for a command that changes it: it must exist already
/// (a command run from the wrong directory must not start a new one).
pub(super) async fn open_store(config: &Config) -> anyhow::Result<Store> {
    open_reader(config).await?.close().await;
    let mut options = config.store_options()?;
    options.audit_origin = acme_proxy_store::AuditOrigin::Cli;
    Store::open(&config.database_url(), &options)
        .await
        .with_context(|| format!("opening the database {}", config.database_url_shown()))
}

/// The authority as `serve` builds it (signers, notifier, queue), for the
/// commands that change state: they go through the same code, audit rows
/// and notifications as the ACME requests they mirror. Jobs they queue
/// (notifications) are run by the server.
pub(super) async fn operator_authority(
    config: &Config,
) -> anyhow::Result<std::sync::Arc<Authority>> {
    // Before anything (a CA, a directory) is created where it should not
    // be: the database and the data directory must both be there already.
    open_reader(config).await?.close().await;
    if !config.data_dir.is_dir() {
        let dir = std::path::absolute(&config.data_dir).unwrap_or_else(|_| config.data_dir.clone());
        return Err(NoDatabase(format!(
            "no data directory at {}: run from the server's directory or pass --config \
             (or ACME_PROXY_CONFIG) with the server's configuration",
            dir.display()
        ))
        .into());
    }
    let assembled =
        crate::server::assemble(config, std::sync::Arc::new(SystemClock), config.base_url())
            .await?;
    Ok(assembled.authority)
}

/// One `name: value` line per field of `value`, names right-aligned to
/// `width` ("-" for none).
pub(super) fn print_fields(
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

/// A view as `name: value` lines, or as JSON.
pub(super) fn print_view(
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

    #[test]
    fn color_is_only_for_terminals_and_never_with_no_color() {
        use std::ffi::OsStr;
        assert!(color_wanted(true, None));
        assert!(color_wanted(true, Some(OsStr::new(""))));
        assert!(!color_wanted(true, Some(OsStr::new("1"))));
        assert!(!color_wanted(false, None));
    }
}
