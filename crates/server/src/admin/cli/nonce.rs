//! `acme-proxy nonce`: replay nonces.

use clap::Subcommand;

use super::common::open_store;
use crate::admin::ops;
use crate::clock::SystemClock;
use crate::config::{Config, NonceStore};

#[derive(Debug, Subcommand)]
pub enum NonceCommand {
    /// Delete the records of used nonces that have expired
    /// (`nonce_store = "database"`; the server also does every 5 minutes).
    Cleanup,
}

pub async fn run(config: &Config, command: NonceCommand) -> anyhow::Result<()> {
    match command {
        NonceCommand::Cleanup => {
            let store = open_store(config).await?;
            let postgres = store.is_postgres();
            let result = ops::nonce_cleanup(&store, &SystemClock).await;
            store.close().await;
            let (deleted, left) = result?;
            match config.nonce_store_for(postgres) {
                NonceStore::Database => println!(
                    "deleted {deleted} expired used-nonce record(s); {left} unexpired remain"
                ),
                // The live nonces are in the serving process, out of this
                // command's sight: counting the table would be a claim
                // about them that is not true.
                NonceStore::Memory => println!(
                    "deleted {deleted} expired used-nonce record(s); the server keeps its nonces in its own memory (nonce_store = \"memory\"), which this command does not see"
                ),
            }
        }
    }
    Ok(())
}
