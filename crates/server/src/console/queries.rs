//! What the console's pages and its JSON API both ask: each query string
//! parsed and bounded once, run through the operation layer, and the
//! reasons one can fail. The pages render the answers; the API sends
//! them as they are.

use acme_proxy_protocol::types::{AccountStatus, OrderStatus};
use acme_proxy_store::{AuditEvent, AuditOutcome, JobStatus, Store};

use crate::admin::ops::{self, OpsError};

/// A search field is cut to this before use (a name is at most 253).
const FIELD_MAX: usize = 256;

/// Why a request got no answer, in words for the operator.
#[derive(Debug)]
pub enum Failure {
    /// The request itself is wrong (400).
    Bad(String),
    /// What it names does not exist (404).
    NotFound(String),
    /// The operation refused, for a reason of the thing's state (409).
    Conflict(String),
    /// The store did not answer (503).
    Unavailable(String),
    /// Something beside the store cannot be reached now (503, with its
    /// own words and Retry-After).
    Later { why: String, retry_after: u64 },
    /// The server cannot do it as configured (500).
    Broken(String),
}

impl Failure {
    /// An operation's error; `missing`, when given, is what to say when
    /// the thing it names does not exist.
    pub fn of(error: OpsError, missing: Option<&str>) -> Self {
        match error {
            e @ (OpsError::NotFound(_) | OpsError::NoSuchJob(_)) => {
                Self::NotFound(missing.map_or_else(|| e.to_string(), str::to_owned))
            }
            OpsError::Refused(why) => Self::Conflict(why),
            OpsError::Unavailable(why) => Self::Unavailable(why),
            OpsError::Later { words, retry_after } => Self::Later {
                why: words,
                retry_after,
            },
            e @ OpsError::Store(_) => Self::Unavailable(e.to_string()),
            OpsError::Failed(why) => Self::Broken(why),
        }
    }
}

impl Failure {
    /// The HTTP status it is answered with, and its words.
    pub fn status_and_words(self) -> (http::StatusCode, String) {
        use http::StatusCode;
        match self {
            Self::Bad(why) => (StatusCode::BAD_REQUEST, why),
            Self::NotFound(why) => (StatusCode::NOT_FOUND, why),
            Self::Conflict(why) => (StatusCode::CONFLICT, why),
            Self::Unavailable(why) | Self::Later { why, .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, why)
            }
            Self::Broken(why) => (StatusCode::INTERNAL_SERVER_ERROR, why),
        }
    }
}

impl From<OpsError> for Failure {
    fn from(error: OpsError) -> Self {
        Self::of(error, None)
    }
}

/// A search field as typed, trimmed and cut to [`FIELD_MAX`] (no marker:
/// what is left is still the start of what was typed).
pub fn field(text: &str) -> String {
    let text = text.trim();
    text[..text.floor_char_boundary(FIELD_MAX)]
        .trim()
        .to_owned()
}

/// `text` as an optional filter: none when empty.
pub fn given(text: &str) -> Option<&str> {
    Some(text).filter(|t| !t.is_empty())
}

/// A serial as stored: lower-case hex without colons or spaces.
fn serial(text: &str) -> String {
    field(text)
        .chars()
        .filter(|c| *c != ':' && !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase()
}

/// A page cursor as given: empty (the first page), or one a page gave.
fn cursor(text: &str) -> Result<String, Failure> {
    let text = field(text);
    if text.is_empty() || ops::parse_cursor(&text).is_some() {
        Ok(text)
    } else {
        Err(Failure::Bad("That is not a page cursor.".to_owned()))
    }
}

/// A page cursor that is a row's id: empty (the first page) or a number.
fn id_cursor(text: &str) -> Result<Option<i64>, Failure> {
    given(&field(text))
        .map(str::parse::<i64>)
        .transpose()
        .map_err(|_| Failure::Bad("That is not a page cursor.".to_owned()))
}

fn status<T: std::str::FromStr>(text: &str, what: &str) -> Result<Option<T>, Failure> {
    given(text)
        .map(str::parse::<T>)
        .transpose()
        .map_err(|_| Failure::Bad(format!("That is not {what}.")))
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct OrderQuery {
    pub name: String,
    pub serial: String,
    pub account: String,
    pub profile: String,
    pub status: String,
    pub before: String,
}

/// An order search as parsed: the fields as they were used (shown back
/// in the form).
#[derive(Debug, serde::Serialize)]
pub struct OrderFilter {
    pub name: String,
    pub serial: String,
    pub account: String,
    pub profile: String,
    pub status: String,
    #[serde(skip)]
    parsed_status: Option<OrderStatus>,
    #[serde(skip)]
    before: String,
}

impl OrderQuery {
    pub fn filter(&self) -> Result<OrderFilter, Failure> {
        // A name as stored: lower case, no wildcard label, no final dot.
        let name = field(&self.name).to_ascii_lowercase();
        let status_text = field(&self.status);
        Ok(OrderFilter {
            name: name
                .trim_start_matches("*.")
                .trim_end_matches('.')
                .to_owned(),
            serial: serial(&self.serial),
            account: field(&self.account),
            profile: field(&self.profile),
            parsed_status: status(
                &status_text,
                "an order status (pending, ready, processing, valid, invalid)",
            )?,
            status: status_text,
            before: cursor(&self.before)?,
        })
    }
}

impl OrderFilter {
    pub async fn run(&self, store: &Store, limit: i64) -> Result<ops::OrderPage, Failure> {
        let search = acme_proxy_store::OrderSearch {
            name: given(&self.name),
            serial: given(&self.serial),
            account: given(&self.account),
            profile: given(&self.profile),
            status: self.parsed_status,
            before: ops::parse_cursor(&self.before),
        };
        Ok(ops::search_orders(store, &search, limit).await?)
    }
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct AccountQuery {
    pub id: String,
    pub contact: String,
    pub profile: String,
    pub status: String,
    pub before: String,
}

#[derive(Debug, serde::Serialize)]
pub struct AccountFilter {
    pub id: String,
    pub contact: String,
    pub profile: String,
    pub status: String,
    #[serde(skip)]
    parsed_status: Option<AccountStatus>,
    #[serde(skip)]
    before: String,
}

impl AccountQuery {
    pub fn filter(&self) -> Result<AccountFilter, Failure> {
        let status_text = field(&self.status);
        Ok(AccountFilter {
            id: field(&self.id),
            contact: field(&self.contact),
            profile: field(&self.profile),
            parsed_status: status(
                &status_text,
                "an account status (valid, deactivated, revoked)",
            )?,
            status: status_text,
            before: cursor(&self.before)?,
        })
    }
}

impl AccountFilter {
    pub async fn run(&self, store: &Store, limit: i64) -> Result<ops::AccountPage, Failure> {
        let search = acme_proxy_store::AccountSearch {
            id: given(&self.id),
            contact: given(&self.contact),
            profile: given(&self.profile),
            status: self.parsed_status,
            before: ops::parse_cursor(&self.before),
        };
        Ok(ops::search_accounts(store, &search, limit).await?)
    }
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct AuditQuery {
    pub event: String,
    pub outcome: String,
    pub profile: String,
    pub account: String,
    pub order: String,
    pub serial: String,
    pub before: String,
}

#[derive(Debug, serde::Serialize)]
pub struct AuditFilter {
    pub event: String,
    pub outcome: String,
    pub profile: String,
    pub account: String,
    pub order: String,
    pub serial: String,
    #[serde(skip)]
    parsed: (Option<AuditEvent>, Option<AuditOutcome>, Option<i64>),
}

/// One page of audit rows, and where the next one starts.
#[derive(Debug, serde::Serialize)]
pub struct AuditPage {
    pub rows: Vec<ops::AuditView>,
    pub next: Option<String>,
}

impl AuditQuery {
    pub fn filter(&self) -> Result<AuditFilter, Failure> {
        let (event, outcome) = (field(&self.event), field(&self.outcome));
        let before = id_cursor(&self.before)?;
        Ok(AuditFilter {
            parsed: (
                status(&event, "an audit event")?,
                status(&outcome, "an outcome (success, refused, failure)")?,
                before,
            ),
            event,
            outcome,
            profile: field(&self.profile),
            account: field(&self.account),
            order: field(&self.order),
            serial: serial(&self.serial),
        })
    }
}

impl AuditFilter {
    pub async fn run(&self, store: &Store, limit: i64) -> Result<AuditPage, Failure> {
        let filter = acme_proxy_store::AuditFilter {
            profile: given(&self.profile),
            account: given(&self.account),
            order: given(&self.order),
            serial: given(&self.serial),
            event: self.parsed.0,
            outcome: self.parsed.1,
            since: None,
            before: self.parsed.2,
        };
        let rows = ops::list_audit(store, &filter, limit.saturating_add(1)).await?;
        let (rows, next) = ops::page_of(rows, limit, |r| r.id.to_string());
        Ok(AuditPage { rows, next })
    }
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct RelayQuery {
    pub status: String,
    pub before: String,
}

impl RelayQuery {
    /// The status shown: `processing` (in flight) unless another, or
    /// `any`, is asked for.
    pub fn status(&self) -> Result<Option<OrderStatus>, Failure> {
        match field(&self.status).as_str() {
            "" => Ok(Some(OrderStatus::Processing)),
            "any" => Ok(None),
            other => other
                .parse()
                .map(Some)
                .map_err(|_| Failure::Bad("That is not an order status.".to_owned())),
        }
    }

    pub async fn run(&self, store: &Store, limit: i64) -> Result<ops::RelayPage, Failure> {
        let before = cursor(&self.before)?;
        Ok(ops::relay_queue(store, self.status()?, ops::parse_cursor(&before), limit).await?)
    }
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct JobQuery {
    pub kind: String,
    pub status: String,
    pub before: String,
}

impl JobQuery {
    pub async fn run(&self, store: &Store, limit: i64) -> Result<ops::JobPage, Failure> {
        let (kind, status_text) = (field(&self.kind), field(&self.status));
        let parsed = status::<JobStatus>(&status_text, "a job status")?;
        let before = id_cursor(&self.before)?;
        Ok(ops::page_jobs(store, given(&kind), parsed, before, limit).await?)
    }
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct EabQuery {
    pub before: String,
}

impl EabQuery {
    pub async fn run(&self, store: &Store, limit: i64) -> Result<ops::EabPage, Failure> {
        let before = cursor(&self.before)?;
        Ok(ops::list_eab(store, ops::parse_cursor(&before), limit).await?)
    }
}

/// A new EAB credential's settings, from the page's form or the API.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct MintForm {
    pub label: String,
    pub profile: String,
    /// Name globs, one per line or separated by commas or spaces.
    pub names: String,
}

impl MintForm {
    /// Mints the credential as `actor`; its HMAC key is on this answer
    /// only.
    pub async fn mint(
        &self,
        authority: &crate::authority::Authority,
        actor: &str,
    ) -> Result<ops::EabView, Failure> {
        let names = split_list(&self.names, 16 * 1024, MAX_NAMES, "Names")?;
        mint(authority, &self.label, &self.profile, names, actor).await
    }
}

/// Name globs one credential may carry.
pub const MAX_NAMES: usize = 1000;

/// Mints a credential as `actor` with `names` (none: any name).
pub async fn mint(
    authority: &crate::authority::Authority,
    label: &str,
    profile: &str,
    names: Vec<String>,
    actor: &str,
) -> Result<ops::EabView, Failure> {
    let (label, profile) = (field(label), field(profile));
    ops::create_eab(
        authority,
        given(&label),
        given(&profile),
        (!names.is_empty()).then_some(names.as_slice()),
        actor,
    )
    .await
    .map_err(|e| match Failure::from(e) {
        // The credential's settings were refused: the request was wrong.
        Failure::Conflict(why) => Failure::Bad(why),
        other => other,
    })
}

/// Items of a list typed into one field, separated by commas or white
/// space. Refused, not cut, past `bytes` or `count` items: a list cut
/// short would be checked or stored as something other than what was
/// typed. `what` names the list in the refusal.
pub fn split_list(
    text: &str,
    bytes: usize,
    count: usize,
    what: &str,
) -> Result<Vec<String>, Failure> {
    let too_many = || {
        Failure::Bad(format!(
            "{what}: at most {count}, in at most {bytes} bytes."
        ))
    };
    if text.len() > bytes {
        return Err(too_many());
    }
    let items: Vec<String> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    if items.len() > count {
        return Err(too_many());
    }
    Ok(items)
}

/// Whether `reason` is one RFC 5280 §5.3.1 reason code operators may give.
pub fn check_reason(reason: u64) -> Result<(), Failure> {
    if ops::REVOCATION_REASONS
        .iter()
        .any(|(code, _)| *code == reason)
    {
        Ok(())
    } else {
        Err(Failure::Bad("That is not a revocation reason.".to_owned()))
    }
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct ExplainQuery {
    pub profile: String,
    pub client_ip: String,
    pub identifiers: String,
    pub eab: String,
    pub account: String,
}

/// What `[policy]` decides, line by line, and the decision.
#[derive(Debug, serde::Serialize)]
pub struct Explained {
    pub decision: String,
    pub explanation: Vec<String>,
}

impl ExplainQuery {
    /// `policy explain` over the configuration in force, with the real
    /// lookups.
    pub async fn explain(
        &self,
        config: &crate::config::Config,
        store: &Store,
    ) -> Result<Explained, Failure> {
        let profile = field(&self.profile);
        if !config.profiles.contains_key(&profile) {
            return Err(Failure::Bad("Choose one of the profiles.".to_owned()));
        }
        let Ok(ip) = field(&self.client_ip).parse::<std::net::IpAddr>() else {
            return Err(Failure::Bad(
                "The client's address is not an IP address.".to_owned(),
            ));
        };
        let request = crate::admin::explain::ExplainRequest {
            profile,
            client_ip: ip,
            identifiers: split_list(&self.identifiers, 16 * 1024, 100, "Identifiers")?,
            eab: given(&field(&self.eab)).map(str::to_owned),
            account: given(&field(&self.account)).map(str::to_owned),
        };
        let policy = crate::admin::explain::build_policy(config)
            .map_err(|problems| Failure::Broken(problems.join("; ")))?;
        let label = match &request.eab {
            Some(kid) if policy.wants_eab_label() => match store.eab(kid).await {
                Ok(Some(credential)) => credential.label,
                Ok(None) => {
                    return Err(Failure::Bad(format!(
                        "There is no External Account Binding credential {kid}."
                    )));
                }
                Err(e) => return Err(Failure::Unavailable(e.to_string())),
            },
            _ => None,
        };
        let explanation = crate::admin::explain::explain(&policy, &request, label).await;
        Ok(Explained {
            decision: explanation.decision.as_str().to_owned(),
            explanation: crate::admin::explain::lines(&explanation),
        })
    }
}

/// A profile as operators see it: its directory and its settings.
#[derive(Debug, serde::Serialize)]
pub struct ProfileView {
    pub name: String,
    pub directory: String,
    pub summary: String,
    pub eab: String,
    pub bypass: bool,
    pub order_lifetime: String,
    pub authorization_lifetime: String,
    pub max_identifiers: usize,
    pub policy_default: String,
}

/// Every profile of the configuration in force.
pub fn profiles(config: &crate::config::Config) -> Vec<ProfileView> {
    let base = config.base_url();
    config
        .profiles
        .iter()
        .zip(ops::describe_profiles(config))
        .map(|((name, p), summary)| ProfileView {
            name: name.clone(),
            directory: format!("{base}/profile/{name}/directory"),
            summary,
            eab: format!("{:?}", p.eab).to_lowercase(),
            bypass: p.bypass,
            order_lifetime: humantime::format_duration(p.order_lifetime).to_string(),
            authorization_lifetime: humantime::format_duration(p.authorization_lifetime)
                .to_string(),
            max_identifiers: p.max_identifiers,
            policy_default: format!("{:?}", p.policy_default).to_lowercase(),
        })
        .collect()
}
