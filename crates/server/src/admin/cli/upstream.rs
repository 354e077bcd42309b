//! `acme-proxy upstream`: the relay profiles' upstream accounts and relayed
//! orders.

use std::io::Write;
use std::path::PathBuf;

use acme_proxy_protocol::types::OrderStatus;
use anyhow::Context;
use clap::Subcommand;

use acme_proxy_store::Store;

use super::common::{ListArgs, NoDatabase, Table, one_of, open_reader};
use crate::admin::ops;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::signer::relay::Eab;

#[derive(Debug, Subcommand)]
pub enum UpstreamCommand {
    /// Register the account of a relay profile at one of its upstreams
    /// (creating its key file, 0600, if missing) and record it. Run once
    /// per relay profile and upstream.
    Register {
        /// The relay profile (optional when there is only one).
        #[arg(long)]
        profile: Option<String>,
        /// The upstream, by its name in the profile (default: the
        /// preferred one, the signer table's).
        #[arg(long)]
        upstream: Option<String>,
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
        /// Only this relay profile.
        #[arg(long)]
        profile: Option<String>,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show each relay profile's upstreams, in priority order: each one's
    /// circuit breaker (closed,
    /// open or probing, since when, failures in a row, the last error,
    /// the next probe), its pause, and the relays in flight.
    Status {
        /// Only this relay profile.
        #[arg(long)]
        profile: Option<String>,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// List relayed orders (local order ↔ upstream order), newest first.
    Orders {
        /// Only relayed orders in this state (processing, valid or invalid).
        #[arg(long, value_parser = one_of::<OrderStatus>())]
        status: Option<OrderStatus>,
        #[command(flatten)]
        list: ListArgs,
    },
}

pub async fn run(config: &Config, command: UpstreamCommand) -> anyhow::Result<()> {
    let store = match &command {
        UpstreamCommand::Register { profile, .. } => {
            // May be the first command run on a new machine, so it may
            // create the data directory and the database, but only for a
            // configuration that has the relay profile it names.
            ops::relay_profile(config, profile.as_deref())?;
            crate::server::refuse_moved_data_dir(config)
                .map_err(|e| crate::server::Refused(vec![e]))?;
            crate::private::create_dir(&config.data_dir).with_context(|| {
                format!("creating the data directory {}", config.data_dir.display())
            })?;
            Store::open(&config.database_url(), &config.store_options()?)
                .await
                .with_context(|| format!("opening the database {}", config.database_url_shown()))?
        }
        UpstreamCommand::Show { profile, json } => {
            // Before anything has run, nothing is registered: say so and
            // what to run, rather than that there is no database.
            let store = match open_reader(config).await {
                Ok(store) => Some(store),
                Err(e) if e.is::<NoDatabase>() => None,
                Err(e) => return Err(e),
            };
            let views = ops::upstream_accounts(store.as_ref(), config, profile.as_deref()).await;
            if let Some(store) = store {
                store.close().await;
            }
            return show(&views?, *json);
        }
        UpstreamCommand::Orders { .. } | UpstreamCommand::Status { .. } => {
            open_reader(config).await?
        }
    };
    let mut out = std::io::stdout().lock();
    match command {
        UpstreamCommand::Register {
            profile,
            upstream,
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
                upstream.as_deref(),
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
                "profile {} is registered at its upstream {} ({}) as {}",
                view.profile,
                view.upstream,
                view.directory,
                view.account_url.as_deref().unwrap_or("-")
            )?;
        }
        UpstreamCommand::Show { .. } => {}
        UpstreamCommand::Status { profile, json } => {
            let views =
                ops::upstream_status(&store, &SystemClock, config, profile.as_deref()).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&views)?)?;
            } else {
                let mut table = Table::new(&[
                    "PROFILE",
                    "UPSTREAM",
                    "BREAKER",
                    "SINCE",
                    "FAILURES",
                    "NEXT PROBE",
                    "PAUSED UNTIL",
                    "IN FLIGHT",
                    "LAST ERROR",
                ]);
                for v in views {
                    let dash = |s: Option<String>| s.unwrap_or_else(|| "-".into());
                    table.row(vec![
                        v.profile,
                        v.upstream,
                        v.breaker,
                        dash(v.since),
                        v.failures.to_string(),
                        dash(v.next_probe),
                        dash(v.paused_until),
                        v.in_flight.to_string(),
                        dash(v.last_error),
                    ]);
                }
                table.print()?;
            }
        }
        UpstreamCommand::Orders { status, list } => {
            let orders = ops::upstream_orders(&store, status, None, list.limit).await?;
            if list.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&orders)?)?;
            } else {
                let mut table = Table::new(&[
                    "ORDER",
                    "PROFILE",
                    "STATUS",
                    "UPSTREAM",
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
                        o.upstream.unwrap_or_else(|| "-".into()),
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

/// The relay profiles' upstream accounts, for people or as JSON.
fn show(views: &[ops::UpstreamAccountView], json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&views)?)?;
    } else {
        for v in views {
            writeln!(out, "{}", v.profile)?;
            writeln!(out, "  upstream:    {}", v.upstream)?;
            writeln!(out, "  directory:   {}", v.directory)?;
            match &v.account_url {
                Some(url) => writeln!(out, "  account:     {url}")?,
                None => writeln!(
                    out,
                    "  account:     not registered; run `acme-proxy upstream register --profile {} --upstream {}`",
                    v.profile, v.upstream
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
