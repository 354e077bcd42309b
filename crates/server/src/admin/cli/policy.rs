//! `acme-proxy policy explain`: what `[policy]` decides for a client, with
//! every rule and check it asked, from the real configuration and with
//! the real lookups (a check program runs).

use std::io::Write;
use std::net::IpAddr;

use anyhow::Context;
use clap::Subcommand;

use super::common::open_reader;
use crate::admin::explain::{self, Decision};
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Evaluate the policy for a client: the connection stage, then
    /// newOrder and finalize for each identifier. Exits 1 when something
    /// would be refused or could not be decided.
    Explain {
        /// The profile asked.
        #[arg(long)]
        profile: String,
        /// The client's address, as the server would see it (after
        /// trusted proxies).
        #[arg(long)]
        client_ip: IpAddr,
        /// A DNS name or IP address the client orders (repeatable).
        #[arg(long = "identifier")]
        identifiers: Vec<String>,
        /// The key id of the External Account Binding credential the
        /// account registered with.
        #[arg(long)]
        eab: Option<String>,
        /// The account's id, as a check program would be told it.
        #[arg(long)]
        account: Option<String>,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Something would be refused: the explanation was printed; the binary
/// exits with [`super::common::EXIT_FAILED`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(String);

pub async fn run(config: &Config, command: PolicyCommand) -> anyhow::Result<()> {
    let PolicyCommand::Explain {
        profile,
        client_ip,
        identifiers,
        eab,
        account,
        json,
    } = command;
    if !config.profiles.contains_key(&profile) {
        anyhow::bail!(
            "there is no profile {profile:?}; the profiles are {}",
            config
                .profiles
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let policy = explain::build_policy(config).map_err(crate::server::Refused)?;
    let label = match &eab {
        Some(kid) if policy.wants_eab_label() => {
            let store = open_reader(config).await?;
            let credential = store.eab(kid).await;
            store.close().await;
            credential
                .context("reading the External Account Binding credential")?
                .with_context(|| format!("there is no External Account Binding credential {kid}"))?
                .label
        }
        _ => None,
    };
    let request = explain::ExplainRequest {
        profile,
        client_ip,
        identifiers,
        eab,
        account,
    };
    let explanation = explain::explain(&policy, &request, label).await;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&explanation)?)?;
    } else {
        for line in explain::lines(&explanation) {
            writeln!(out, "{line}")?;
        }
    }
    match explanation.decision {
        Decision::Allowed => Ok(()),
        Decision::Refused => Err(Refused("the policy refuses".into()).into()),
        Decision::Undecided => Err(Refused("the policy could not decide".into()).into()),
    }
}
