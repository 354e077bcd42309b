//! What `[policy]` decides for a client, every rule and check it asked:
//! the evaluation behind `acme-proxy policy explain` and the console's
//! policy page, from the real configuration and with the real lookups (a
//! check program runs).

use std::net::IpAddr;

use acme_proxy_protocol::types::{Identifier, IdentifierType};
use serde::Serialize;

use crate::config::{Config, Stage};
use crate::policy::{Evaluation, Policy, Subject, Verdict};

/// Who asks, as the server would see them.
#[derive(Clone, Debug)]
pub struct ExplainRequest {
    pub profile: String,
    /// After trusted proxies.
    pub client_ip: IpAddr,
    /// DNS names or IP addresses, as ordered.
    pub identifiers: Vec<String>,
    /// The key id of the account's External Account Binding credential.
    pub eab: Option<String>,
    pub account: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Explanation {
    pub profile: String,
    pub client_ip: IpAddr,
    pub account: Option<String>,
    pub eab_key_id: Option<String>,
    pub eab_label: Option<String>,
    pub evaluations: Vec<Explained>,
    pub decision: Decision,
}

/// What the server would answer, all stages together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allowed,
    Refused,
    Undecided,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Refused => "refused",
            Self::Undecided => "undecided",
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Explained {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identifier: Option<Identifier>,
    #[serde(flatten)]
    pub evaluation: Evaluation,
}

/// The policy as the server builds it, with the server's resolver (for
/// `reverse_dns` checks); the problems of a configuration it refuses.
pub fn build_policy(config: &Config) -> Result<Policy, Vec<String>> {
    let validators = crate::validators::Validators::new(&config.validation)
        .map_err(|e| vec![format!("configuration: {e}")])?;
    Policy::build(config, Some(&validators.resolver)).map_err(|problems| {
        problems
            .into_iter()
            .map(|p| format!("configuration: {p}"))
            .collect()
    })
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

/// Evaluates as the server asks: the connection before any account is
/// known, then each identifier with the account; finalize only for what
/// newOrder let through. `eab_label` is the credential's label, when the
/// policy reads labels.
pub async fn explain(
    policy: &Policy,
    request: &ExplainRequest,
    eab_label: Option<String>,
) -> Explanation {
    let identifiers: Vec<Identifier> = request.identifiers.iter().map(|i| identifier(i)).collect();
    let connection = Subject {
        profile: &request.profile,
        client_ip: Some(request.client_ip),
        ..Subject::default()
    };
    let signed = Subject {
        account: request.account.as_deref(),
        eab: request
            .eab
            .as_deref()
            .map(|kid| (kid, eab_label.as_deref())),
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
    Explanation {
        profile: request.profile.clone(),
        client_ip: request.client_ip,
        account: request.account.clone(),
        eab_key_id: request.eab.clone(),
        eab_label,
        evaluations,
        decision,
    }
}

/// One line per stage (and identifier) with its verdict, then the rules'
/// and checks' values, as `policy explain` prints them.
pub fn lines(x: &Explanation) -> Vec<String> {
    let mut out = vec![format!(
        "profile {}, client {}, EAB {}",
        x.profile,
        x.client_ip,
        match (&x.eab_key_id, &x.eab_label) {
            (Some(kid), Some(label)) => format!("{kid} ({label})"),
            (Some(kid), None) => kid.clone(),
            _ => "none".to_owned(),
        }
    )];
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
        out.push(format!("{about}: {verdict} (rule {})", ev.rule_name()));
        for r in &ev.rules {
            out.push(format!("  rule  {} = {}", r.rule, r.value.as_str()));
        }
        for c in &ev.checks {
            match &c.note {
                Some(note) => out.push(format!(
                    "  check {} = {} ({note})",
                    c.check,
                    c.value.as_str()
                )),
                None => out.push(format!("  check {} = {}", c.check, c.value.as_str())),
            }
        }
    }
    out.push(format!("decision: {}", x.decision.as_str()));
    out
}
