//! The `[notify]` table and each profile's `[profiles.P.notify]`: webhooks, scripts and emails.

#[allow(unused_imports)]
use super::*;

/// Settings shared by every profile's notifications.
#[derive(Clone, Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    /// Templates (one file each, named by file name) that add to or replace
    /// the built-in `default.json` and `slack.json`.
    pub templates_dir: Option<PathBuf>,
}

/// A profile's notification destinations.
#[derive(Clone, Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileNotifyConfig {
    /// Webhooks by name.
    pub webhooks: BTreeMap<String, WebhookConfig>,
    /// Scripts by name: the notice as JSON on stdin.
    pub scripts: BTreeMap<String, ScriptConfig>,
    /// Email recipients by name: one message per event over SMTP.
    pub emails: BTreeMap<String, EmailConfig>,
}

/// How the SMTP connection is protected.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// Plain connection upgraded with STARTTLS, which must succeed (port 587).
    #[default]
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
    /// No encryption: only for a relay on the same host or network.
    None,
}

/// One email destination: the SMTP server, the envelope and the templates.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    /// SMTP server host name (also the name its TLS certificate must carry).
    pub host: String,
    /// Defaults to 587 (starttls), 465 (tls) or 25 (none).
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub tls: SmtpTls,
    /// Extra CA certificates (PEM) trusted for the SMTP server's TLS, beside
    /// the system roots.
    #[serde(default)]
    pub trust_anchors: Option<PathBuf>,
    /// SMTP AUTH user; the password is read from `password_file`.
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// e.g. "acme-proxy <pki@example.org>".
    pub from: String,
    pub to: Vec<String>,
    /// Template names (built-in `email_subject.txt` and `email_body.txt`,
    /// or files of `notify.templates_dir`).
    #[serde(default = "default_email_subject")]
    pub subject_template: String,
    #[serde(default = "default_email_body")]
    pub body_template: String,
    /// Events mailed here; empty means all.
    #[serde(default)]
    #[schemars(schema_with = "super::reference::events")]
    pub events: Vec<Event>,
    #[serde(default = "default_webhook_timeout", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub timeout: Duration,
}

impl EmailConfig {
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(match self.tls {
            SmtpTls::Starttls => 587,
            SmtpTls::Tls => 465,
            SmtpTls::None => 25,
        })
    }
}

pub(crate) fn default_email_subject() -> String {
    "email_subject.txt".to_owned()
}

pub(crate) fn default_email_body() -> String {
    "email_body.txt".to_owned()
}

/// A notification script, run without a shell in a cleared environment.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptConfig {
    /// Absolute path of the program.
    pub command: PathBuf,
    /// Fixed arguments (no shell expansion).
    #[serde(default)]
    pub args: Vec<String>,
    /// Events given to this script; empty means all.
    #[serde(default)]
    #[schemars(schema_with = "super::reference::events")]
    pub events: Vec<Event>,
    #[serde(default = "default_webhook_timeout", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub timeout: Duration,
}

/// One webhook: where, how, which body, which events.
#[derive(Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub url: String,
    #[serde(default = "default_webhook_method")]
    pub method: String,
    /// Extra headers (e.g. `Authorization`); values are secrets, never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The body template's name.
    #[serde(default = "default_webhook_template")]
    pub template: String,
    #[serde(default = "default_webhook_content_type")]
    pub content_type: String,
    /// Events delivered here; empty means all.
    #[serde(default)]
    #[schemars(schema_with = "super::reference::events")]
    pub events: Vec<Event>,
    #[serde(default = "default_webhook_timeout", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub timeout: Duration,
    /// How this webhook is reached, replacing the global `[egress]` table
    /// as a whole.
    #[serde(default)]
    pub egress: Option<EgressConfig>,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values carry tokens; the URL may too (Slack's does), so
        // only its origin is shown.
        let origin: String = self.url.split('/').take(3).collect::<Vec<_>>().join("/");
        // Without any user:token@ part.
        let origin = match origin.split_once("://") {
            Some((scheme, rest)) => {
                format!("{scheme}://{}", rest.rsplit('@').next().unwrap_or(rest))
            }
            None => origin,
        };
        f.debug_struct("WebhookConfig")
            .field("url", &format!("{origin}/…"))
            .field("method", &self.method)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("template", &self.template)
            .field("events", &self.events)
            .field("timeout", &self.timeout)
            .field("egress", &self.egress)
            .finish()
    }
}

pub(crate) fn default_webhook_method() -> String {
    "POST".to_owned()
}

pub(crate) fn default_webhook_template() -> String {
    "default.json".to_owned()
}

pub(crate) fn default_webhook_content_type() -> String {
    "application/json".to_owned()
}

pub(crate) fn default_webhook_timeout() -> Duration {
    Duration::from_secs(10)
}

/// A webhook that could never be delivered is refused at start-up.
pub(crate) fn check_webhook(
    profile: &str,
    name: &str,
    w: &WebhookConfig,
) -> Result<(), ConfigError> {
    let key = format!("profiles.{profile}.notify.webhooks.{name}");
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if !(w.url.starts_with("https://") || w.url.starts_with("http://"))
        || w.url.parse::<http::Uri>().is_err()
    {
        return invalid(format!(
            "{key}.url must be an http:// or https:// URL, e.g. url = \"https://chat.example.org/hooks/…\""
        ));
    }
    if !["POST", "PUT"].contains(&w.method.as_str()) {
        return invalid(format!(
            "{key}.method {:?}: write \"POST\" or \"PUT\"",
            w.method
        ));
    }
    for header in w.headers.keys() {
        if header.parse::<http::HeaderName>().is_err() {
            return invalid(format!("{key}.headers: {header:?} is not a header name"));
        }
    }
    if w.timeout < Duration::from_millis(100) {
        return invalid(format!(
            "{key}.timeout is too short; write e.g. timeout = \"10s\""
        ));
    }
    Ok(())
}

/// An email destination that could never send is refused at start-up
/// (the addresses are parsed again, strictly, when the notifier is built).
pub(crate) fn check_email(profile: &str, name: &str, e: &EmailConfig) -> Result<(), ConfigError> {
    let key = format!("profiles.{profile}.notify.emails.{name}");
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if e.host.is_empty() {
        return invalid(format!(
            "{key}.host is empty; write the SMTP server, e.g. host = \"smtp.example.org\""
        ));
    }
    if e.to.is_empty() {
        return invalid(format!(
            "{key}.to is empty; write at least one recipient, e.g. to = [\"pki-team@example.org\"]"
        ));
    }
    if e.username.is_some() != e.password_file.is_some() {
        return invalid(format!(
            "{key}: set both username and password_file (SMTP AUTH), or neither"
        ));
    }
    if e.username.is_some() && e.tls == SmtpTls::None {
        return invalid(format!(
            "{key}: SMTP AUTH would send the password in clear; write tls = \"starttls\" or \"tls\""
        ));
    }
    if e.timeout < Duration::from_millis(100) {
        return invalid(format!(
            "{key}.timeout is too short; write e.g. timeout = \"10s\""
        ));
    }
    Ok(())
}
