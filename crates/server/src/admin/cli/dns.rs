//! `acme-proxy dns`: the records of the embedded DNS zone (`[dns_zone]`).

use acme_proxy_store::{AuditEvent, AuditOutcome, NewAuditRow};
use clap::Subcommand;

use super::common::{Table, open_reader, open_store, operator_actor};
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, DnsZoneConfig};
use crate::dns_zone::{record_name, txt_value};

#[derive(Debug, Subcommand)]
pub enum DnsCommand {
    /// The TXT records the zone serves.
    #[command(subcommand)]
    Txt(TxtCommand),
    /// Accounts of the acme-dns API ([dns_zone.api]).
    #[command(subcommand)]
    Account(AccountCommand),
    /// The CNAME records the corporate DNS needs so that a relay profile
    /// with strategy dns01_delegated can answer dns-01 for these names
    /// (one per name; a wildcard shares its base name's).
    Cname {
        /// DNS names (`*.x.example.org` for a wildcard).
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AccountCommand {
    /// Create an account and print its credentials as JSON (the password
    /// is shown this once); audited.
    Add {
        /// A network (CIDR) or address its updates may come from; repeat
        /// for several (default: anywhere).
        #[arg(long = "allow-from", value_name = "CIDR")]
        allow_from: Vec<String>,
        /// Bind it to this EAB credential: once that is revoked, its
        /// updates are refused.
        #[arg(long, value_name = "KID")]
        eab: Option<String>,
        /// The DNS name it will answer for (and its wildcard, which shares
        /// the name's record): the CNAME the corporate DNS needs is printed
        /// to standard error.
        #[arg(long = "for", value_name = "NAME")]
        names: Vec<String>,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Remove an account and the values at its name; audited.
    Remove {
        /// Its user name (X-Api-User).
        username: String,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// List the accounts (never their passwords).
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum TxtCommand {
    /// Publish a TXT value (every server on the database serves it at
    /// once); audited.
    Add {
        /// Its owner name, inside a zone of [dns_zone].
        name: String,
        /// The value (e.g. a dns-01 key authorization's digest).
        #[arg(allow_hyphen_values = true)]
        value: String,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Remove a TXT value, or every value at the name; audited.
    Remove {
        /// Its owner name.
        name: String,
        /// Only this value (default: every value at the name).
        #[arg(allow_hyphen_values = true)]
        value: Option<String>,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// List the TXT values, by name.
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

async fn account(config: &Config, command: AccountCommand) -> anyhow::Result<()> {
    let zone_config = zone_config(config)?;
    let zone = crate::dns_zone::publishing_zone(zone_config)
        .ok_or_else(|| anyhow::anyhow!("[dns_zone] lists no zone"))?;
    match command {
        AccountCommand::Add {
            allow_from,
            eab,
            names,
            actor,
        } => {
            let networks = allow_from
                .iter()
                .map(|t| {
                    crate::dns_api::network(t).ok_or_else(|| {
                        anyhow::anyhow!("--allow-from {t:?} is not a CIDR or an address; write e.g. --allow-from 10.1.0.0/16")
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            // An account keeps two values: one name and its wildcard.
            let mut base: Option<String> = None;
            for name in &names {
                let b = name
                    .strip_prefix("*.")
                    .unwrap_or(name)
                    .trim_end_matches('.');
                acme_proxy_protocol::names::check_dns_name(b)
                    .map_err(|e| anyhow::anyhow!("--for {name:?}: {e}"))?;
                match &base {
                    Some(seen) if !seen.eq_ignore_ascii_case(b) => anyhow::bail!(
                        "--for {seen} and --for {name}: an account keeps only two values, so it serves one name and its wildcard; make one account per name"
                    ),
                    _ => base = Some(b.to_ascii_lowercase()),
                }
            }
            let actor = operator_actor(actor);
            let store = open_store(config).await?;
            let made = async {
                if let Some(kid) = &eab {
                    match store.eab(kid).await? {
                        Some(row) if row.revoked_at.is_none() => {}
                        Some(_) => anyhow::bail!("the EAB credential {kid} is revoked"),
                        None => anyhow::bail!(
                            "no EAB credential {kid}: `acme-proxy eab list` shows them"
                        ),
                    }
                }
                crate::dns_api::register_account(
                    &store,
                    &zone,
                    &networks,
                    eab.as_deref(),
                    // The operator's own accounts are not limited.
                    None,
                    crate::dns_api::Registrant {
                        actor: &actor,
                        context: None,
                    },
                    SystemClock.unix(),
                    None,
                )
                .await
            }
            .await;
            store.close().await;
            let made = made?;
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "username": made.username,
                    "password": made.password,
                    "fulldomain": made.fulldomain,
                    "subdomain": made.subdomain,
                    "allowfrom": made.allow_from,
                }))?
            );
            if let Some(base) = base {
                eprintln!("_acme-challenge.{base}. CNAME {}.", made.fulldomain);
            }
        }
        AccountCommand::Remove { username, actor } => {
            let actor = operator_actor(actor);
            let detail = format!("account {username}");
            let audit = NewAuditRow {
                detail: Some(&detail),
                ..NewAuditRow::new(
                    SystemClock.unix(),
                    AuditEvent::DnsAccountRemoved,
                    AuditOutcome::Success,
                    &actor,
                )
            };
            let store = open_store(config).await?;
            let removed = store.remove_dns_account(&username, &audit).await;
            store.close().await;
            if !removed? {
                anyhow::bail!(
                    "no acme-dns account {username}: `acme-proxy dns account list` shows them"
                );
            }
            println!("removed the account {username} and the values at its name");
        }
        AccountCommand::List { json } => {
            let store = open_reader(config).await?;
            let rows = store.dns_accounts(LIST_LIMIT).await;
            store.close().await;
            let rows = rows?;
            if json {
                let list: Vec<_> = rows
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "username": r.username,
                            "fulldomain": r.fulldomain(),
                            "allowfrom": r.allow_from,
                            "eab": r.eab_kid,
                            "created_at": crate::clock::rfc3339(r.created_at),
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let mut table =
                    Table::new(&["USERNAME", "FULLDOMAIN", "ALLOW FROM", "EAB", "CREATED"]);
                for r in &rows {
                    table.row(vec![
                        r.username.clone(),
                        r.fulldomain(),
                        if r.allow_from.is_empty() {
                            "anywhere".to_owned()
                        } else {
                            r.allow_from.join(",")
                        },
                        r.eab_kid.clone().unwrap_or_else(|| "-".to_owned()),
                        crate::clock::rfc3339(r.created_at),
                    ]);
                }
                table.print()?;
            }
        }
    }
    Ok(())
}

/// Rows `dns txt list` shows at most.
const LIST_LIMIT: i64 = 10_000;

fn zone_config(config: &Config) -> anyhow::Result<&DnsZoneConfig> {
    config.dns_zone.as_ref().ok_or_else(|| {
        anyhow::anyhow!(
            "no [dns_zone] in the configuration: add one, e.g. [dns_zone] zones = [\"acme.example.org\"], listen = [\"192.0.2.53:53\"], nameservers = [\"ns1.example.org\"]"
        )
    })
}

pub async fn run(config: &Config, command: DnsCommand) -> anyhow::Result<()> {
    let command = match command {
        DnsCommand::Txt(command) => command,
        DnsCommand::Account(command) => return account(config, command).await,
        DnsCommand::Cname { names } => {
            let zone = crate::dns_zone::publishing_zone(zone_config(config)?)
                .ok_or_else(|| anyhow::anyhow!("[dns_zone] lists no zone"))?;
            let mut records = Vec::new();
            for name in &names {
                let base = name.trim_start_matches("*.");
                acme_proxy_protocol::names::check_dns_name(base)
                    .map_err(|e| anyhow::anyhow!("{name:?}: {e}"))?;
                let record = crate::dns_zone::delegation_record(&zone, name);
                if !records.contains(&record) {
                    records.push(record);
                }
            }
            for record in records {
                println!("{record}");
            }
            return Ok(());
        }
    };
    match command {
        TxtCommand::Add { name, value, actor } => {
            let (zone, name) =
                record_name(zone_config(config)?, &name).map_err(anyhow::Error::msg)?;
            let value = txt_value(&value).map_err(anyhow::Error::msg)?;
            let actor = operator_actor(actor);
            let detail = format!("{name} TXT {value:?}");
            let now = SystemClock.unix();
            let audit = NewAuditRow {
                detail: Some(&detail),
                ..NewAuditRow::new(
                    now,
                    AuditEvent::DnsRecordAdded,
                    AuditOutcome::Success,
                    &actor,
                )
            };
            let store = open_store(config).await?;
            let added = store
                .add_dns_txt(&zone, &name, value, now, Some(&audit))
                .await;
            store.close().await;
            if added? {
                println!("added {name} TXT {value:?}");
            } else {
                println!("{name} TXT {value:?} was there already; nothing changed");
            }
        }
        TxtCommand::Remove { name, value, actor } => {
            let (zone, name) =
                record_name(zone_config(config)?, &name).map_err(anyhow::Error::msg)?;
            let actor = operator_actor(actor);
            let detail = match &value {
                Some(v) => format!("{name} TXT {v:?}"),
                None => format!("{name} TXT (every value)"),
            };
            let audit = NewAuditRow {
                detail: Some(&detail),
                ..NewAuditRow::new(
                    SystemClock.unix(),
                    AuditEvent::DnsRecordRemoved,
                    AuditOutcome::Success,
                    &actor,
                )
            };
            let store = open_store(config).await?;
            let removed = store
                .remove_dns_txt(&zone, &name, value.as_deref(), Some(&audit))
                .await;
            store.close().await;
            match removed? {
                0 => anyhow::bail!("no such record: {detail}"),
                n => println!("removed {n} value(s): {detail}"),
            }
        }
        TxtCommand::List { json } => {
            zone_config(config)?;
            let store = open_reader(config).await?;
            let rows = store.dns_records(LIST_LIMIT).await;
            store.close().await;
            let rows = rows?;
            if json {
                let list: Vec<_> = rows
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "name": r.name,
                            "value": r.value,
                            "created_at": crate::clock::rfc3339(r.created_at),
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let mut table = Table::new(&["NAME", "VALUE", "ADDED"]);
                for r in &rows {
                    table.row(vec![
                        r.name.clone(),
                        r.value.clone(),
                        crate::clock::rfc3339(r.created_at),
                    ]);
                }
                table.print()?;
            }
        }
    }
    Ok(())
}
