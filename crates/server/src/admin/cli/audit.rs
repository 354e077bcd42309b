//! `acme-proxy audit`: the audit trail.

use std::io::Write;

use acme_proxy_store::{AuditEvent, AuditOutcome};
use clap::Subcommand;

use super::common::{ListArgs, Table, one_of, open_reader, print_fields};
use crate::admin::ops;
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// List audit records, newest first.
    List {
        /// Only records of this profile.
        #[arg(long)]
        profile: Option<String>,
        /// Only records about this account (its id).
        #[arg(long, allow_hyphen_values = true)]
        account: Option<String>,
        /// Only records about this order (its id).
        #[arg(long, allow_hyphen_values = true)]
        order: Option<String>,
        /// Certificate serial in hex, any case, with or without colons (as
        /// `openssl x509 -serial` or a browser shows it).
        #[arg(long, value_parser = serial)]
        serial: Option<String>,
        /// Only records of this event.
        #[arg(long, value_parser = one_of::<AuditEvent>())]
        event: Option<AuditEvent>,
        /// Only records with this outcome: refused is a client's mistake or
        /// policy, failure the server's own.
        #[arg(long, value_parser = one_of::<AuditOutcome>())]
        outcome: Option<AuditOutcome>,
        /// Only records this recent: a duration ("1h", "7d") or an RFC 3339 time.
        #[arg(long, value_parser = super::common::since, value_name = "DURATION|TIME")]
        since: Option<i64>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Show one audit record.
    Show {
        /// The record's id (the first column of `audit list`).
        id: i64,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A serial as the store keeps it (lowercase hex, no separators), from
/// any of the ways tools print one; anything else is a usage error.
fn serial(text: &str) -> Result<String, String> {
    let hex: String = text.chars().filter(|c| *c != ':').collect();
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(
            "write the serial in hex, with or without colons, e.g. 0A:1B:2C or 0a1b2c".into(),
        );
    }
    Ok(hex.to_ascii_lowercase())
}

pub async fn run(config: &Config, command: AuditCommand) -> anyhow::Result<()> {
    let store = open_reader(config).await?;
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
            list,
        } => {
            let filter = acme_proxy_store::AuditFilter {
                profile: profile.as_deref(),
                account: account.as_deref(),
                order: order.as_deref(),
                serial: serial.as_deref(),
                event,
                outcome,
                since,
                before: None,
            };
            let rows = ops::list_audit(&store, &filter, list.limit).await?;
            if list.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
            } else {
                let mut table =
                    Table::new(&["ID", "AT", "EVENT", "OUTCOME", "ACTOR", "CLIENT", "WHAT"])
                        .status_column(3);
                for r in rows {
                    let what = match (&r.problem_type, &r.serial) {
                        (Some(p), _) => format!("{p}: {}", r.detail.as_deref().unwrap_or("")),
                        (None, Some(s)) => format!("serial {s} {}", r.identifiers.join(",")),
                        // An operator's change to something else than a
                        // certificate (a DNS record, a reload): its detail.
                        (None, None) if r.identifiers.is_empty() => {
                            r.detail.clone().unwrap_or_default()
                        }
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
