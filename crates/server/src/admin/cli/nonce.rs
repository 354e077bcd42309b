//! `acme-proxy nonce`: replay nonces.

use clap::Subcommand;

use super::common::open_store;
use crate::admin::ops;
use crate::clock::SystemClock;
use crate::config::Config;

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
            let result = ops::nonce_cleanup(&store, &SystemClock).await;
            store.close().await;
            let (deleted, left) = result?;
            println!("deleted {deleted} expired used-nonce record(s); {left} unexpired remain");
        }
    }
    Ok(())
}
