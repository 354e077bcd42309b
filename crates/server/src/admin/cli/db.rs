//! `acme-proxy db`: the database itself.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Subcommand;

use acme_proxy_store::{Store, StoreOptions};

use super::common::open_reader;
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum DbCommand {
    /// Copy the SQLite database into a new file, owner-only, as one
    /// consistent snapshot, while the server goes on serving. (PostgreSQL:
    /// use pg_dump.)
    Backup {
        /// The copy to make; refused if it exists.
        file: PathBuf,
    },
    /// Copy every row of a SQLite database into an empty PostgreSQL
    /// database (the configured one unless --to names another), as one
    /// snapshot in one transaction, then check each table's row count and
    /// digest at both ends. Nothing is committed unless all match.
    Copy {
        /// The SQLite database to copy, `sqlite:PATH`; it may be serving
        /// (the copy is a snapshot), though a move stops it first.
        #[arg(long, value_name = "sqlite:PATH", value_parser = sqlite_url)]
        from: String,
        /// The PostgreSQL database to fill, which must be empty; default:
        /// `database_url`. Its password comes from
        /// `database_password_file`, never from the command line.
        #[arg(long, value_name = "postgres://USER@HOST/DATABASE")]
        to: Option<String>,
    },
}

/// `--from` names a SQLite database; anything else is a usage error.
fn sqlite_url(text: &str) -> Result<String, String> {
    if text.starts_with("sqlite:") {
        Ok(text.to_owned())
    } else {
        Err("write sqlite:PATH (db copy copies a SQLite database)".to_owned())
    }
}

pub async fn run(config: &Config, command: DbCommand) -> anyhow::Result<()> {
    match command {
        DbCommand::Backup { file } => {
            if acme_proxy_store::is_postgres_url(&config.database_url()) {
                anyhow::bail!(
                    "a PostgreSQL database is backed up with pg_dump (see the backups page)"
                );
            }
            let store = open_reader(config).await?;
            let result = store.backup_to(&file).await;
            store.close().await;
            result.with_context(|| format!("backing up to {}", file.display()))?;
            println!(
                "copied {} to {}",
                config.database_url_shown(),
                file.display()
            );
        }
        DbCommand::Copy { from, to } => copy(config, &from, to.as_deref()).await?,
    }
    Ok(())
}

async fn copy(config: &Config, from: &str, to: Option<&str>) -> anyhow::Result<()> {
    let to = to.map_or_else(|| config.database_url(), str::to_owned);
    if crate::config::redact_password(&to) != to {
        anyhow::bail!(
            "--to carries a password, which every user of this machine can read on a command line: \
             write it in an owner-only file named by database_password_file instead"
        );
    }
    let path = from.trim_start_matches("sqlite:").trim_start_matches("//");
    if !std::path::Path::new(path).is_file() {
        anyhow::bail!("--from {from:?}: there is no such file");
    }
    let source = Store::open(from, &StoreOptions::default())
        .await
        .with_context(|| format!("opening {from}"))?;
    let target = Store::open(&to, &config.store_options()?)
        .await
        .with_context(|| format!("opening {}", crate::config::redact_password(&to)))?;
    let started = std::time::Instant::now();
    let result = source.copy_into(&target).await;
    source.close().await;
    target.close().await;
    let copied = result.context("copying")?;
    let width = copied.iter().map(|t| t.table.len()).max().unwrap_or(5);
    println!(
        "{:width$}  {:>9}  digest (SHA-256 of the rows, at both ends)",
        "table", "rows"
    );
    for t in &copied {
        println!("{:width$}  {:>9}  {}", t.table, t.rows, t.digest);
    }
    println!(
        "copied {} rows of {} tables from {from} to {} in {:.1?}; every count and digest matches",
        copied.iter().map(|t| t.rows).sum::<u64>(),
        copied.len(),
        crate::config::redact_password(&to),
        started.elapsed()
    );
    Ok(())
}
