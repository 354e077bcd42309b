//! `acme-proxy cert`: issued certificates.

use std::io::Write;

use clap::Subcommand;

use super::common::{ListArgs, Table, open_reader};
use crate::admin::ops;
use crate::clock::SystemClock;
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Certificates that expire soon and have not been renewed, soonest
    /// first, with their profile, account and names.
    Expiring {
        /// How far ahead to look: a duration such as "30d", "72h" or "2w".
        #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
        within: std::time::Duration,
        /// Only certificates of this profile.
        #[arg(long)]
        profile: Option<String>,
        /// Also those a later certificate for the same account and names
        /// has replaced.
        #[arg(long)]
        renewed: bool,
        #[command(flatten)]
        list: ListArgs,
    },
}

pub async fn run(config: &Config, command: CertCommand) -> anyhow::Result<()> {
    let CertCommand::Expiring {
        within,
        profile,
        renewed,
        list,
    } = command;
    let store = open_reader(config).await?;
    let certs = ops::expiring_certificates(
        &store,
        &SystemClock,
        within,
        profile.as_deref(),
        renewed,
        list.limit,
    )
    .await;
    store.close().await;
    let certs = certs?;
    let mut out = std::io::stdout().lock();
    if list.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&certs)?)?;
        return Ok(());
    }
    let mut table = Table::new(&[
        "SERIAL",
        "PROFILE",
        "ACCOUNT",
        "NOT AFTER",
        "DAYS",
        "IDENTIFIERS",
    ]);
    for c in certs {
        table.row(vec![
            c.serial,
            c.profile,
            c.account,
            c.not_after,
            c.days_left.to_string(),
            c.identifiers.join(","),
        ]);
    }
    table.print()?;
    Ok(())
}
