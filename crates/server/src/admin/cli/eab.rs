//! `acme-proxy eab`: External Account Binding credentials.

use std::io::Write;

use clap::Subcommand;

use super::common::{
    Act, Table, confirm, open_reader, operator_actor, operator_authority, print_fields, print_view,
};
use crate::admin::ops;
use crate::config::Config;

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
        /// As JSON.
        #[arg(long)]
        json: bool,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// List credentials, newest first (never their HMAC keys).
    List {
        /// As JSON.
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

pub async fn run(config: &Config, command: EabCommand) -> anyhow::Result<()> {
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
            let store = open_reader(config).await?;
            // Every credential: there are few, and scripts read them all.
            let list = ops::list_eab(&store, None, i64::MAX).await;
            store.close().await;
            let list = list?.credentials;
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
