//! `acme-proxy db`: the database itself.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Subcommand;

use super::common::open_store;
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
}

pub async fn run(config: &Config, command: DbCommand) -> anyhow::Result<()> {
    match command {
        DbCommand::Backup { file } => {
            let store = open_store(config).await?;
            let result = store.backup_to(&file).await;
            store.close().await;
            result.with_context(|| format!("backing up to {}", file.display()))?;
            println!(
                "copied {} to {}",
                config.database_url_shown(),
                file.display()
            );
        }
    }
    Ok(())
}
