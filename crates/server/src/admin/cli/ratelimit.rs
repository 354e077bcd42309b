//! `acme-proxy ratelimit`: what `[rate_limits]` is holding back, and
//! starting a key afresh.

use acme_proxy_store::{AuditEvent, AuditOutcome, NewAuditRow};
use clap::Subcommand;

use super::common::{Table, open_reader, open_store, operator_actor};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;

/// Keys listed at most.
const LIST_LIMIT: i64 = 10_000;

#[derive(Debug, Subcommand)]
pub enum RatelimitCommand {
    /// The limited keys (e.g. `new_orders:account:ID`,
    /// `new_accounts:address:ADDR`) and when each is free again; a key not
    /// listed is free.
    Show {
        /// Only keys starting with this.
        #[arg(long, default_value = "")]
        key: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a key afresh (its whole allowance back at once); audited.
    Reset {
        /// The key, as `ratelimit show` prints it.
        key: String,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
}

pub async fn run(config: &Config, command: RatelimitCommand) -> anyhow::Result<()> {
    match command {
        RatelimitCommand::Show { key, json } => {
            let now_ms = SystemClock.unix_ms();
            let store = open_reader(config).await?;
            let rows = store.rate_limits(&key, now_ms, LIST_LIMIT).await;
            store.close().await;
            let rows = rows?;
            // The key is full until `tat - period`, free of all it took at
            // `tat`; what the table shows is when it is wholly free.
            let free_in = |tat: i64| ((tat - now_ms).max(0) + 999) / 1000;
            if json {
                let list: Vec<_> = rows
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "key": r.key,
                            "empty_at": crate::clock::rfc3339(r.tat / 1000),
                            "empty_in_seconds": free_in(r.tat),
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let mut table = Table::new(&["KEY", "EMPTY AT", "IN"]);
                for r in &rows {
                    table.row(vec![
                        r.key.clone(),
                        crate::clock::rfc3339(r.tat / 1000),
                        format!("{}s", free_in(r.tat)),
                    ]);
                }
                table.print()?;
            }
        }
        RatelimitCommand::Reset { key, actor } => {
            let actor = operator_actor(actor);
            let detail = format!("rate limit key {key}");
            let audit = NewAuditRow {
                detail: Some(&detail),
                ..NewAuditRow::new(
                    SystemClock.unix(),
                    AuditEvent::RateLimitReset,
                    AuditOutcome::Success,
                    &actor,
                )
            };
            let store = open_store(config).await?;
            let reset = store
                .reset_rate_limit(&key, SystemClock.unix_ms(), &audit)
                .await;
            store.close().await;
            if !reset? {
                anyhow::bail!(
                    "the key {key} holds nothing back: `acme-proxy ratelimit show` lists those that do"
                );
            }
            println!("reset {key}: its whole allowance is back");
        }
    }
    Ok(())
}
