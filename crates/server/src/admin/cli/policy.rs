//! `acme-proxy policy explain`: what `[policy]` decides for a client, with
//! every rule and check it asked, from the real configuration and with
//! the real lookups (a check program runs).

use std::io::Write;
use std::net::IpAddr;

use acme_proxy_protocol::types::{Identifier, IdentifierType};
use anyhow::Context;
use clap::Subcommand;
use serde::Serialize;

use super::common::open_reader;
use crate::config::{Config, Stage};
use crate::policy::{Evaluation, Policy, Subject, Verdict};

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

#[derive(Debug, Serialize)]
struct Explanation {
    profile: String,
    client_ip: IpAddr,
    account: Option<String>,
    eab_key_id: Option<String>,
    eab_label: Option<String>,
    evaluations: Vec<Explained>,
    decision: Decision,
}

/// What the server would answer, all stages together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Decision {
    Allowed,
    Refused,
    Undecided,
}

#[derive(Debug, Serialize)]
struct Explained {
    #[serde(skip_serializing_if = "Option::is_none")]
    identifier: Option<Identifier>,
    #[serde(flatten)]
    evaluation: Evaluation,
}

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
    // The server's resolver, for `reverse_dns` checks.
    let validators = crate::validators::Validators::new(&config.validation)
        .map_err(|e| crate::server::Refused(vec![format!("configuration: {e}")]))?;
    let policy = Policy::build(config, Some(&validators.resolver)).map_err(|problems| {
        crate::server::Refused(
            problems
                .into_iter()
                .map(|p| format!("configuration: {p}"))
                .collect(),
        )
    })?;
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
    let identifiers: Vec<Identifier> = identifiers.iter().map(|i| identifier(i)).collect();
    // As the server asks: the connection before any account is known,
    // then each identifier with the account; finalize only for what
    // newOrder let through.
    let connection = Subject {
        profile: &profile,
        client_ip: Some(client_ip),
        ..Subject::default()
    };
    let signed = Subject {
        account: account.as_deref(),
        eab: eab.as_deref().map(|kid| (kid, label.as_deref())),
        ..connection.clone()
    };
    let mut evaluations = vec![Explained {
        identifier: None,
        evaluation: policy.evaluate(Stage::Connection, &connection).await,
    }];
    if evaluations[0].evaluation.verdict == Verdict::Allow {
        let mut at_finalize = Vec::new();
        for id in &identifiers {
            let about = signed.clone().with_identifier(Some(id));
            let e = policy.evaluate(Stage::NewOrder, &about).await;
            if e.verdict == Verdict::Allow {
                at_finalize.push(id);
            }
            evaluations.push(Explained {
                identifier: Some(id.clone()),
                evaluation: e,
            });
        }
        for id in at_finalize {
            let about = signed.clone().with_identifier(Some(id));
            evaluations.push(Explained {
                identifier: Some(id.clone()),
                evaluation: policy.evaluate(Stage::Finalize, &about).await,
            });
        }
    }
    let verdicts = || evaluations.iter().map(|e| e.evaluation.verdict);
    let decision = if verdicts().any(|v| v == Verdict::Undecided) {
        Decision::Undecided
    } else if verdicts().any(|v| v == Verdict::Deny) {
        Decision::Refused
    } else {
        Decision::Allowed
    };
    let explanation = Explanation {
        profile: profile.clone(),
        client_ip,
        account: account.clone(),
        eab_key_id: eab.clone(),
        eab_label: label.clone(),
        evaluations,
        decision,
    };
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&explanation)?)?;
    } else {
        write_text(&mut out, &explanation)?;
    }
    match decision {
        Decision::Allowed => Ok(()),
        Decision::Refused => Err(Refused("the policy refuses".into()).into()),
        Decision::Undecided => Err(Refused("the policy could not decide".into()).into()),
    }
}

/// A DNS name (lowercased, as newOrder keeps it) or an IP address.
fn identifier(text: &str) -> Identifier {
    match text.parse::<IpAddr>() {
        Ok(ip) => Identifier {
            kind: IdentifierType::Ip,
            value: ip.to_string(),
        },
        Err(_) => Identifier {
            kind: IdentifierType::Dns,
            value: text.to_ascii_lowercase(),
        },
    }
}

fn write_text(out: &mut impl Write, x: &Explanation) -> std::io::Result<()> {
    writeln!(
        out,
        "profile {}, client {}, EAB {}",
        x.profile,
        x.client_ip,
        match (&x.eab_key_id, &x.eab_label) {
            (Some(kid), Some(label)) => format!("{kid} ({label})"),
            (Some(kid), None) => kid.clone(),
            _ => "none".to_owned(),
        }
    )?;
    for e in &x.evaluations {
        let ev = &e.evaluation;
        let about = match &e.identifier {
            Some(id) => format!("{} {}", ev.stage, id.value),
            None => ev.stage.to_string(),
        };
        let verdict = match (ev.verdict, &ev.warned) {
            (Verdict::Allow, Some(w)) => {
                format!(
                    "allow (rule {} in warn mode would deny: {})",
                    w.rule, w.message
                )
            }
            (Verdict::Allow, None) => "allow".to_owned(),
            (Verdict::Deny, _) => format!("deny: {}", ev.message),
            (Verdict::Undecided, _) => format!("undecided: {}", ev.message),
        };
        writeln!(out, "{about}: {verdict} (rule {})", ev.rule_name())?;
        for r in &ev.rules {
            writeln!(out, "  rule  {} = {}", r.rule, r.value.as_str())?;
        }
        for c in &ev.checks {
            match &c.note {
                Some(note) => writeln!(out, "  check {} = {} ({note})", c.check, c.value.as_str())?,
                None => writeln!(out, "  check {} = {}", c.check, c.value.as_str())?,
            }
        }
    }
    let decision = match x.decision {
        Decision::Allowed => "allowed",
        Decision::Refused => "refused",
        Decision::Undecided => "undecided",
    };
    writeln!(out, "decision: {decision}")
}
