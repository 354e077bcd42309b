//! `acme-proxy account`: ACME accounts.

use std::io::Write;

use acme_proxy_protocol::types::AccountStatus;
use clap::Subcommand;

use super::common::{
    Act, ListArgs, Table, confirm, one_of, open_reader, operator_actor, operator_authority,
    print_view,
};
use crate::admin::ops;
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum AccountCommand {
    /// List ACME accounts, newest first.
    List {
        /// Only accounts of this profile.
        #[arg(long)]
        profile: Option<String>,
        /// Only accounts in this state.
        #[arg(long, value_parser = one_of::<AccountStatus>())]
        status: Option<AccountStatus>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Show one account, with its order and certificate counts.
    Show {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        id: String,
        /// As JSON.
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

pub async fn run(config: &Config, command: AccountCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        AccountCommand::List {
            profile,
            status,
            list,
        } => {
            let store = open_reader(config).await?;
            let accounts =
                ops::list_accounts(&store, profile.as_deref(), status, list.limit).await?;
            store.close().await;
            if list.json {
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
            let store = open_reader(config).await?;
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
