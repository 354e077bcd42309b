//! `acme-proxy order`: orders and their certificates.

use std::io::Write;

use acme_proxy_protocol::types::OrderStatus;
use clap::Subcommand;

use super::common::{
    Act, ListArgs, Table, confirm, one_of, open_reader, operator_actor, operator_authority,
    print_view,
};
use crate::admin::ops;
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum OrderCommand {
    /// List orders, newest first.
    List {
        /// Only orders of this profile.
        #[arg(long)]
        profile: Option<String>,
        /// Only orders of this account (its id).
        #[arg(long, allow_hyphen_values = true)]
        account: Option<String>,
        /// Only orders in this state.
        #[arg(long, value_parser = one_of::<OrderStatus>())]
        status: Option<OrderStatus>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Show one order with its certificate.
    Show {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        id: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke the certificate of an order (upstream first for a relayed
    /// one; the CRL is re-signed).
    Revoke {
        /// Its id (may start with `-`: ids are base64url).
        #[arg(allow_hyphen_values = true)]
        id: String,
        /// RFC 5280 reason (§5.3.1), by code or name: 0 unspecified (the
        /// default), 1 keyCompromise, 3 affiliationChanged, 4 superseded,
        /// 5 cessationOfOperation.
        #[arg(long, value_parser = reason)]
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

/// A revocation reason a subscriber may give, as its RFC 5280 code or
/// name (any case); anything else is a usage error.
fn reason(text: &str) -> Result<u64, String> {
    const NAMES: [(u64, &str); 5] = ops::REVOCATION_REASONS;
    NAMES
        .iter()
        .find(|(code, name)| text == code.to_string() || text.eq_ignore_ascii_case(name))
        .map(|(code, _)| *code)
        .ok_or_else(|| {
            format!(
                "a certificate's holder may give {}; the other codes of RFC 5280 are for CA events",
                NAMES
                    .iter()
                    .map(|(c, n)| format!("{c} ({n})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

pub async fn run(config: &Config, command: OrderCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        OrderCommand::List {
            profile,
            account,
            status,
            list,
        } => {
            let store = open_reader(config).await?;
            let orders = ops::list_orders(
                &store,
                profile.as_deref(),
                account.as_deref(),
                status,
                list.limit,
            )
            .await;
            store.close().await;
            let orders = orders?;
            if list.json {
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
            let store = open_reader(config).await?;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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
}
