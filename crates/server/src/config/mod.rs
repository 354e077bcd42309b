//! Configuration: a TOML file plus `ACME_PROXY_*` environment overrides
//! (`__` separates nesting levels), every key documented in
//! `acme-proxy.example.toml`.
//!
//! Unknown keys stop start-up with the key's name (`deny_unknown_fields`):
//! a typo must not silently fall back to a default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use acme_proxy_protocol::types::{ChallengeType, IdentifierType};

use crate::events::Event;
use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Deserializer};

mod admin;
mod audit;
mod connections;
mod de;
mod dns_zone;
mod egress;
mod jobs;
mod metrics;
mod notify;
mod policy;
mod profile;
mod rate_limits;
pub mod reference;
pub mod show;
mod signer;
mod tls;
mod validation;

pub use admin::*;
pub use audit::*;
pub use connections::*;
use de::*;
pub use dns_zone::*;
pub use egress::*;
pub use jobs::*;
pub use metrics::*;
pub use notify::*;
pub use policy::*;
pub use profile::*;
pub use rate_limits::*;
pub use signer::*;
pub use tls::*;
pub use validation::*;

/// The whole configuration.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the ACME listener binds.
    pub listen: SocketAddr,
    /// The URL clients reach us at; defaults to `http://{listen}` (or
    /// `https://` with `[tls]`). Never taken from a request's Host header.
    pub public_url: Option<String>,
    /// TLS on the ACME listener; absent: plain HTTP (e.g. behind a proxy).
    pub tls: Option<TlsConfig>,
    /// Reverse proxies (addresses or CIDRs) whose forwarded header is
    /// believed for the client's address; empty: the peer's address is the
    /// client's.
    #[serde(deserialize_with = "addresses_or_networks")]
    #[schemars(schema_with = "reference::networks")]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Which header carries the forwarded chain.
    pub forwarded_header: ForwardedHeader,
    /// Directory for the database and self-generated CA keys. A relative
    /// path written in the configuration file is relative to that file's
    /// directory; the default (and a value from the environment) is
    /// relative to the directory the command runs in.
    pub data_dir: PathBuf,
    /// `sqlite:PATH` or `postgres://USER@HOST/DATABASE`; defaults to
    /// `sqlite:{data_dir}/acme-proxy.db`.
    pub database_url: Option<String>,
    /// PostgreSQL: a file holding the password (its first line), instead
    /// of a password in `database_url`. Owner-only, like every secret.
    pub database_password_file: Option<PathBuf>,
    /// PostgreSQL: connections this server keeps to the database at most,
    /// one of them for the job runner's `LISTEN`; those idle for ten
    /// minutes are closed. Unset: twice this host's cores and two more,
    /// from 4 to 16. More than the database has cores only make its
    /// processes take turns; with the database on a larger machine, about
    /// twice its cores.
    pub database_max_connections: Option<u32>,
    /// PostgreSQL: how long a request waits for one of those connections
    /// before it is answered 503 with `Retry-After`.
    #[serde(deserialize_with = "opt_duration")]
    #[schemars(schema_with = "reference::opt_duration")]
    pub database_acquire_timeout: Option<Duration>,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// Largest request body accepted (RFC 8555 requests are small).
    pub max_body_bytes: usize,
    /// Octets of ACME request bodies held at once, all requests together:
    /// each holds what it has received from its arrival to its answer,
    /// and one client (as `max_open_per_client` counts them) at most the
    /// share `max_open_per_client` is of `connections.max_open` (never
    /// less than `max_body_bytes`). Beyond either, 503 with
    /// `Retry-After`.
    pub max_buffered_body_bytes: usize,
    /// Requests served at once; beyond this, 503 with `Retry-After`.
    pub max_in_flight: usize,
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "reference::duration")]
    pub nonce_lifetime: Duration,
    /// How long a copy of an account (with its parsed key) kept in memory
    /// may verify requests; `0s` reads the account for every request.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "reference::duration")]
    pub account_cache_ttl: Duration,
    /// Where replay nonces are kept: `memory` (no disk write per request;
    /// a restart refuses old ones) or `database` (signed nonces, their use
    /// recorded: shared by replicas). Unset: `memory` on SQLite, `database`
    /// on PostgreSQL.
    pub nonce_store: Option<NonceStore>,
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "reference::duration")]
    pub shutdown_grace: Duration,
    pub connections: ConnectionsConfig,
    pub validation: ValidationConfig,
    pub jobs: JobsConfig,
    pub notify: NotifyConfig,
    pub metrics: MetricsConfig,
    /// The web console for operators.
    pub admin: AdminConfig,
    /// The embedded authoritative DNS server for delegated dns-01;
    /// absent: none.
    pub dns_zone: Option<DnsZoneConfig>,
    pub audit: AuditConfig,
    /// Outbound HTTP(S) of the relay and webhooks: direct or through a proxy.
    pub egress: EgressConfig,
    /// Who may ask for what: named checks and ordered rules over them.
    pub policy: PolicyConfig,
    /// How much one account or one address may ask for.
    pub rate_limits: RateLimitsConfig,
    pub profiles: BTreeMap<String, ProfileConfig>,
    /// The `ACME_PROXY_*` variables [`Config::load`] left aside as
    /// Kubernetes service links, for start-up to warn about.
    #[serde(skip)]
    pub ignored_environment: Vec<String>,
    /// A relative `data_dir` as the file wrote it, before it was made the
    /// file's neighbour: start-up refuses to begin anew there while the
    /// same path from the working directory holds a database.
    #[serde(skip)]
    pub data_dir_as_written: Option<PathBuf>,
}

/// Where replay nonces live (see `authority/nonces.rs`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NonceStore {
    Memory,
    Database,
}

/// The header a trusted proxy puts the client's address in.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Config {
    fn default() -> Self {
        let mut profiles = BTreeMap::new();
        profiles.insert("default".to_owned(), ProfileConfig::default());
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 14000)),
            public_url: None,
            tls: None,
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::default(),
            data_dir: PathBuf::from("acme-proxy-data"),
            database_url: None,
            database_password_file: None,
            database_max_connections: None,
            database_acquire_timeout: None,
            log_format: LogFormat::Text,
            max_body_bytes: 64 * 1024,
            max_buffered_body_bytes: 64 * 1024 * 1024,
            max_in_flight: 1024,
            nonce_lifetime: Duration::from_secs(3600),
            account_cache_ttl: Duration::from_secs(1),
            nonce_store: None,
            shutdown_grace: Duration::from_secs(10),
            connections: ConnectionsConfig::default(),
            validation: ValidationConfig::default(),
            jobs: JobsConfig::default(),
            notify: NotifyConfig::default(),
            metrics: MetricsConfig::default(),
            admin: AdminConfig::default(),
            dns_zone: None,
            audit: AuditConfig::default(),
            egress: EgressConfig::default(),
            policy: PolicyConfig::default(),
            rate_limits: RateLimitsConfig::default(),
            profiles,
            ignored_environment: Vec::new(),
            data_dir_as_written: None,
        }
    }
}

/// Configuration problems found at start-up, each saying what to write.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {}", loading_error(.0))]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {0}")]
    Invalid(String),
    /// Several mistakes, each saying what to write.
    #[error("configuration: {} problems:\n  - {}", .0.len(), .0.join("\n  - "))]
    Problems(Vec<String>),
}

/// A value that does not load, as the operator wrote it: the key as in
/// the file (figment's own message prefixes its profile, `default.`, which
/// reads like the profile named default), or the variable as typed
/// (`ACME_PROXY_JOBS__LEASE`, where figment names only the upper-cased
/// key); then what
/// is wrong, and in which file.
fn loading_error(e: &figment::Error) -> String {
    let metadata = e.metadata.as_ref();
    let from_env = metadata.is_some_and(|m| m.name.contains("environment"));
    let mut text = if e.path.is_empty() {
        e.kind.to_string()
    } else if from_env {
        let keys: Vec<String> = e.path.iter().map(|k| k.to_ascii_uppercase()).collect();
        format!("the variable ACME_PROXY_{}: {}", keys.join("__"), e.kind)
    } else {
        format!("{}: {}", e.path.join("."), e.kind)
    };
    if let Some(file) = metadata
        .and_then(|m| m.source.as_ref())
        .and_then(|s| s.file_path())
    {
        text.push_str(&format!(" (in {})", file.display()));
    }
    text
}

/// What one check refused, without the `configuration:` prefix that the
/// whole list gets once.
fn reason(e: ConfigError) -> String {
    match e {
        ConfigError::Invalid(reason) => reason,
        ConfigError::Problems(reasons) => reasons.join("; "),
        ConfigError::Load(e) => loading_error(&e),
    }
}

/// Whether `key` (an `ACME_PROXY_*` variable without its prefix) is one of
/// the service links Kubernetes puts into every pod of a namespace that has
/// a Service named `acme-proxy`: `ACME_PROXY_SERVICE_HOST`,
/// `ACME_PROXY_SERVICE_PORT[_NAME]`, `ACME_PROXY_PORT` and
/// `ACME_PROXY_PORT_<port>_<proto>[_PROTO|_PORT|_ADDR]`. No configuration
/// key is named `port` or `service…`, so these are never settings; refusing
/// them as unknown keys would stop the server in exactly the namespace
/// where it is deployed.
fn is_service_link(key: &str) -> bool {
    let key = key.to_ascii_uppercase();
    key == "SERVICE_HOST"
        || key == "SERVICE_PORT"
        || key.starts_with("SERVICE_PORT_")
        || key == "PORT"
        || key.starts_with("PORT_")
}

impl Config {
    /// The outbound policy of one upstream of a relay signer: its own `egress` table, else
    /// the global one.
    pub fn relay_egress<'a>(&'a self, relay: &'a RelayConfig) -> &'a EgressConfig {
        relay.egress.as_ref().unwrap_or(&self.egress)
    }

    /// The outbound policy of a webhook: its own `egress` table, else the
    /// global one.
    pub fn webhook_egress<'a>(&'a self, hook: &'a WebhookConfig) -> &'a EgressConfig {
        hook.egress.as_ref().unwrap_or(&self.egress)
    }

    /// Every `ipam` check's `token_file` (secrets: start-up refuses them
    /// open to others).
    pub fn policy_token_files(&self) -> Vec<PathBuf> {
        self.policy
            .checks
            .values()
            .filter_map(|c| match c {
                CheckConfig::Ipam(i) => Some(i.token_file.clone()),
                _ => None,
            })
            .collect()
    }

    /// Every `proxy_credentials_file` the configuration names (secrets:
    /// start-up refuses them open to others).
    pub fn egress_credentials_files(&self) -> Vec<PathBuf> {
        let mut tables = vec![&self.egress];
        for p in self.profiles.values() {
            if let SignerConfig::Relay(r) = &p.signer {
                tables.extend(r.upstreams().filter_map(|u| u.egress.as_ref()));
            }
            tables.extend(p.notify.webhooks.values().filter_map(|w| w.egress.as_ref()));
        }
        let mut files: Vec<PathBuf> = tables
            .into_iter()
            .filter_map(|e| e.proxy_credentials_file.clone())
            .collect();
        files.sort();
        files.dedup();
        files
    }

    /// Loads the file (if any) and the environment, then checks the result.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let figment = Self::sources(file)?;
        // A relative data_dir written in a file is the file's neighbour,
        // wherever the command runs (the default, and one from the
        // environment, stay relative to the working directory) — unless
        // the file is systemd's private copy in the service's credentials
        // directory, which is no place for state: the unit's working
        // directory is.
        let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
        let data_dir_file = figment
            .find_metadata("data_dir")
            .and_then(|m| m.source.as_ref())
            .and_then(|source| source.file_path())
            .and_then(Path::parent)
            .filter(|dir| credentials.as_deref().is_none_or(|c| !dir.starts_with(c)))
            .map(Path::to_path_buf);
        let mut config = Self::from_figment(figment)?;
        if let Some(dir) = data_dir_file
            && config.data_dir.is_relative()
        {
            config.data_dir_as_written = Some(config.data_dir.clone());
            config.data_dir = dir.join(&config.data_dir);
        }
        config.ignored_environment = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| k.strip_prefix("ACME_PROXY_").is_some_and(is_service_link))
            .collect();
        config.ignored_environment.sort();
        Ok(config)
    }

    /// The file (if any) and the `ACME_PROXY_*` environment, merged, with
    /// where each value came from.
    fn sources(file: Option<&Path>) -> Result<Figment, ConfigError> {
        let mut figment = Figment::new();
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid(format!(
                    "the configuration file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file(file));
        }
        Ok(figment.merge(
            Env::prefixed("ACME_PROXY_")
                .filter(|key| !is_service_link(key.as_str()))
                .split("__")
                // ACME_PROXY_CONFIG names the file; it is not a key.
                .ignore(&["config"]),
        ))
    }

    /// Parses a configuration from TOML text alone (tests, `check`).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_figment(Figment::new().merge(Toml::string(text)))
    }

    fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        let config: Config = figment.extract().map_err(Box::new)?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        // Every mistake at once, not the first: an operator fixes a file
        // in one round.
        let mut problems: Vec<String> = Vec::new();
        if self.profiles.is_empty() {
            problems.push(
                "no profiles: add at least one [profiles.NAME] table, e.g. [profiles.default]"
                    .into(),
            );
        }
        for (name, profile) in &self.profiles {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            {
                problems.push(format!(
                    "profile name {name:?} must be lowercase letters, digits, '-' or '_' (it is part of URLs)"
                ));
            }
            if profile.caa && profile.caa_identities.is_empty() {
                problems.push(format!(
                    "profiles.{name}.caa is on but caa_identities is empty: write the issuer domain names CAA records must name, e.g. caa_identities = [\"acme.example.internal\"]"
                ));
            }
            if profile.challenges.is_empty() {
                problems.push(format!(
                    "profiles.{name}.challenges is empty; write challenges = [\"http-01\"]"
                ));
            }
            // Each type once, in the order written (the order offered).
            let mut once: Vec<&str> = Vec::new();
            let mut twice = None;
            for kind in profile.challenges.iter().map(|c| c.as_str()) {
                if once.contains(&kind) {
                    twice = twice.or(Some(kind));
                } else {
                    once.push(kind);
                }
            }
            if let Some(twice) = twice {
                problems.push(format!(
                    "profiles.{name}.challenges names {twice} more than once; write each type once: challenges = [{}]",
                    once.iter().map(|t| format!("\"{t}\"")).collect::<Vec<_>>().join(", ")
                ));
            }
            for (hook_name, hook) in &profile.notify.webhooks {
                check_webhook(name, hook_name, hook).unwrap_or_else(|e| problems.push(reason(e)));
                if let Some(egress) = &hook.egress {
                    check_egress(
                        &format!("profiles.{name}.notify.webhooks.{hook_name}.egress"),
                        egress,
                    )
                    .unwrap_or_else(|e| problems.push(reason(e)));
                }
            }
            for (script_name, script) in &profile.notify.scripts {
                let key = format!("profiles.{name}.notify.scripts.{script_name}");
                if !script.command.is_absolute() {
                    problems.push(format!(
                        "{key}.command must be an absolute path (no shell runs it), e.g. command = \"/usr/local/bin/notify-pki\""
                    ));
                }
            }
            for (email_name, email) in &profile.notify.emails {
                check_email(name, email_name, email).unwrap_or_else(|e| problems.push(reason(e)));
            }
            check_certificate_profiles(name, profile).unwrap_or_else(|e| problems.push(reason(e)));
            let ca = match &profile.signer {
                SignerConfig::LocalCa(ca) => ca,
                SignerConfig::Relay(relay) => {
                    check_relay(name, relay).unwrap_or_else(|e| problems.push(reason(e)));
                    for (i, upstream) in relay.upstreams().enumerate() {
                        if let Some(egress) = &upstream.egress {
                            check_egress(&format!("{}.egress", upstream_key(name, i)), egress)
                                .unwrap_or_else(|e| problems.push(reason(e)));
                        }
                        for local in upstream.upstream_profiles.keys() {
                            if !profile.certificate_profiles.contains_key(local) {
                                problems.push(format!(
                                    "{}.upstream_profiles names {local:?}, which is not a certificate profile of profile {name}: add [profiles.{name}.certificate_profiles.{local}] or remove it",
                                    upstream_key(name, i)
                                ));
                            }
                        }
                    }
                    continue;
                }
                SignerConfig::Custom(custom) => {
                    check_custom(name, custom).unwrap_or_else(|e| problems.push(reason(e)));
                    continue;
                }
            };
            let [from, to] = ca.renewal_window;
            if !(0.0..1.0).contains(&from) || !(from..=1.0).contains(&to) || to - from < 0.01 {
                problems.push(format!(
                    "profiles.{name}.signer.renewal_window must be two fractions of the lifetime, 0 ≤ start < end ≤ 1, at least 0.01 apart; write e.g. renewal_window = [0.6, 0.8]"
                ));
            }
            if let Some(p11) = &ca.pkcs11 {
                let key = format!("profiles.{name}.signer.pkcs11");
                if ca.ca_cert.is_none() || ca.ca_key.is_some() {
                    problems.push(format!(
                        "{key}: the key is in the token, so write ca_cert (the CA certificate of that key) and no ca_key"
                    ));
                }
                if p11.token_label.is_some() == p11.slot.is_some() {
                    problems.push(format!(
                        "{key}: name the token by token_label = \"…\" or by slot = N (one of them)"
                    ));
                }
                if p11.key_label.is_none() && p11.key_id.is_none() {
                    problems.push(format!(
                        "{key}: name the key by key_label = \"…\" and/or key_id = \"hex\""
                    ));
                }
                if p11
                    .key_id
                    .as_deref()
                    .is_some_and(|h| hex::decode(h).is_err())
                {
                    problems.push(format!("{key}.key_id must be hex, e.g. key_id = \"01\""));
                }
                if !p11.module.is_absolute() || !p11.pin_file.is_absolute() {
                    problems.push(format!("{key}: module and pin_file must be absolute paths"));
                }
                if p11.timeout < Duration::from_secs(1) || p11.timeout > Duration::from_secs(60) {
                    problems.push(format!(
                        "{key}.timeout must be between 1s and 60s (a signing runs inside the client's finalize request); write e.g. timeout = \"10s\""
                    ));
                }
            } else if ca.ca_cert.is_some() != ca.ca_key.is_some() {
                problems.push(format!(
                    "profiles.{name}.signer: set both ca_cert and ca_key (the operator's CA), or neither (a self-generated CA)"
                ));
            }
            if ca.chain.is_some() && ca.ca_cert.is_none() {
                problems.push(format!(
                    "profiles.{name}.signer.chain needs ca_cert and ca_key: a self-generated CA has no chain above it"
                ));
            }
            if ca.validity < Duration::from_secs(60) {
                problems.push(format!(
                    "profiles.{name}.signer.validity is shorter than a minute; write e.g. validity = \"90d\""
                ));
            }
        }
        check_egress("egress", &self.egress).unwrap_or_else(|e| problems.push(reason(e)));
        let mut targets = std::collections::BTreeSet::new();
        for (name, o) in &self.rate_limits.overrides {
            if o.account.is_some() == o.eab_key_id.is_some() {
                problems.push(format!(
                    "rate_limits.overrides.{name}: name whom it is for, by account = \"ID\" or by eab_key_id = \"KID\" (one of them)"
                ));
            } else if !targets.insert((o.account.clone(), o.eab_key_id.clone())) {
                problems.push(format!(
                    "rate_limits.overrides.{name}: another override is for the same account or credential; merge them"
                ));
            }
            if o.pending_authorizations_per_account == Some(0) {
                problems.push(format!(
                    "rate_limits.overrides.{name}.pending_authorizations_per_account must be at least 1; write e.g. pending_authorizations_per_account = 1000"
                ));
            }
            if !o.sets_any() {
                problems.push(format!(
                    "rate_limits.overrides.{name} sets no limit; write e.g. new_orders_per_account = \"1000/3h\""
                ));
            }
        }
        // Every URL handed out starts with public_url, else with the listen
        // address, and no client can reach 0.0.0.0 or ::.
        // (A self-signed certificate's own check says more about this.)
        if self.listen.ip().is_unspecified()
            && self.public_url.is_none()
            && !self.tls.as_ref().is_some_and(|t| t.self_signed)
        {
            problems.push(format!(
                "listen is {}, an address no client can reach, and public_url is not set, so every URL handed out would name it; set public_url to what clients use, e.g. public_url = \"{}://acme.example.internal:{}\"",
                self.listen,
                if self.tls.is_some() { "https" } else { "http" },
                self.listen.port()
            ));
        }
        if let Some(metrics) = self.metrics.listen
            && metrics.port() != 0
            && metrics.port() == self.listen.port()
            && (metrics.ip() == self.listen.ip()
                || metrics.ip().is_unspecified()
                || self.listen.ip().is_unspecified())
        {
            problems.push(format!(
                "metrics.listen {metrics} is the ACME listener's address ({}); give metrics a port of its own, e.g. listen = \"127.0.0.1:9464\" under [metrics]",
                self.listen
            ));
        }
        problems.extend(self.admin.problems(self.listen, self.metrics.listen));
        if let Some(url) = &self.database_url
            && !url.starts_with("sqlite:")
            && !acme_proxy_store::is_postgres_url(url)
        {
            problems.push(format!(
                "database_url {:?} is not a database this build opens; write sqlite:PATH (a file) or postgres://USER@HOST/DATABASE",
                url.split_once("://").map_or(url.as_str(), |(scheme, _)| scheme)
            ));
        }
        if let Some(url) = &self.public_url
            && (!(url.starts_with("http://") || url.starts_with("https://")) || url.ends_with('/'))
        {
            problems.push(format!(
                "public_url {url:?} must start with http:// or https:// and have no trailing slash, e.g. \"https://acme.example.internal\""
            ));
        }
        if let Some(tls) = &self.tls {
            match (&tls.cert, &tls.key, tls.self_signed) {
                (Some(_), Some(_), false) | (None, None, true) => {}
                _ => {
                    problems.push(
                        "[tls]: write cert and key (PEM files), or self_signed = true, not both"
                            .into(),
                    );
                }
            }
            if tls.handshake_timeout < Duration::from_millis(100)
                || tls.reload_interval < Duration::from_secs(1)
            {
                problems.push(
                    "[tls]: handshake_timeout must be at least 100ms and reload_interval at least 1s; write e.g. handshake_timeout = \"10s\", reload_interval = \"30s\"".into());
            }
            if tls.self_signed && self.public_url.is_none() && self.listen.ip().is_unspecified() {
                problems.push(format!(
                    "[tls] self_signed needs a name clients use, and listen is {}: set public_url = \"https://acme.example.internal:{}\"",
                    self.listen,
                    self.listen.port()
                ));
            }
            if let Some(url) = &self.public_url
                && url.starts_with("http://")
            {
                problems.push(format!(
                    "public_url {url:?} is http:// but [tls] serves https://; write public_url = \"https://…\""
                ));
            }
        }
        if let Some(zone) = &self.dns_zone {
            problems.extend(zone.problems());
        }
        for (name, profile) in &self.profiles {
            let SignerConfig::Relay(relay) = &profile.signer else {
                continue;
            };
            for (i, upstream) in relay.upstreams().enumerate() {
                if upstream.strategy != RelayStrategy::Dns01Delegated || self.dns_zone.is_some() {
                    continue;
                }
                problems.push(format!(
                    "{}.strategy is \"dns01_delegated\" but there is no [dns_zone] to publish in: add one, e.g. [dns_zone] zones = [\"acme.example.org\"], listen = [\"192.0.2.53:53\"], nameservers = [\"ns1.example.org\"]",
                    upstream_key(name, i)
                ));
            }
        }
        if self.audit.reverse_name_timeout > Duration::from_secs(5) {
            problems.push(
                "audit.reverse_name_timeout is over 5s, and it delays the requests it audits; write e.g. reverse_name_timeout = \"300ms\" (or reverse_names = false)".into());
        }
        if self
            .audit
            .retention
            .is_some_and(|r| r < Duration::from_secs(86400))
        {
            problems.push(
                "audit.retention is shorter than a day; write e.g. retention = \"400d\" (or leave it out to keep every row)".into());
        }
        let at_least = |key: &str, d: Duration, min: Duration, example: &str| {
            if d < min {
                Err(ConfigError::Invalid(format!(
                    "{key} is shorter than {min:?}, which would make the server refuse its own work; write e.g. {key} = \"{example}\""
                )))
            } else {
                Ok(())
            }
        };
        at_least(
            "nonce_lifetime",
            self.nonce_lifetime,
            Duration::from_secs(10),
            "1h",
        )
        .unwrap_or_else(|e| problems.push(reason(e)));
        at_least(
            "validation.timeout",
            self.validation.timeout,
            Duration::from_secs(1),
            "10s",
        )
        .unwrap_or_else(|e| problems.push(reason(e)));
        let j = &self.jobs;
        at_least(
            "jobs.poll_interval",
            j.poll_interval,
            Duration::from_millis(10),
            "1s",
        )
        .unwrap_or_else(|e| problems.push(reason(e)));
        at_least("jobs.lease", j.lease, Duration::from_millis(300), "15s")
            .unwrap_or_else(|e| problems.push(reason(e)));
        at_least(
            "jobs.attempt_budget",
            j.attempt_budget,
            Duration::from_millis(10),
            "5m",
        )
        .unwrap_or_else(|e| problems.push(reason(e)));
        at_least(
            "jobs.backoff_base",
            j.backoff_base,
            Duration::from_millis(1),
            "2s",
        )
        .unwrap_or_else(|e| problems.push(reason(e)));
        at_least("jobs.backoff_cap", j.backoff_cap, j.backoff_base, "10m")
            .unwrap_or_else(|e| problems.push(reason(e)));
        at_least("jobs.retention", j.retention, Duration::from_secs(60), "7d")
            .unwrap_or_else(|e| problems.push(reason(e)));
        if j.concurrency == 0 || j.max_attempts == 0 {
            problems.push(
                "jobs.concurrency and jobs.max_attempts must be at least 1; write e.g. concurrency = 16 and max_attempts = 10 under [jobs]".into());
        }
        for (name, p) in &self.profiles {
            if p.max_identifiers == 0 || p.max_pending_authorizations == 0 {
                problems.push(format!(
                    "profiles.{name}.max_identifiers and profiles.{name}.max_pending_authorizations must be at least 1; write e.g. max_identifiers = 100 and max_pending_authorizations = 300"
                ));
            }
            at_least(
                &format!("profiles.{name}.order_lifetime"),
                p.order_lifetime,
                Duration::from_secs(60),
                "7d",
            )
            .unwrap_or_else(|e| problems.push(reason(e)));
            at_least(
                &format!("profiles.{name}.authorization_lifetime"),
                p.authorization_lifetime,
                Duration::from_secs(60),
                "30d",
            )
            .unwrap_or_else(|e| problems.push(reason(e)));
            match &p.signer {
                SignerConfig::LocalCa(ca) => at_least(
                    &format!("profiles.{name}.signer.crl_validity"),
                    ca.crl_validity,
                    Duration::from_secs(3600),
                    "1d",
                )
                .unwrap_or_else(|e| problems.push(reason(e))),
                SignerConfig::Custom(_) => {}
                SignerConfig::Relay(relay) => {
                    for (i, r) in relay.upstreams().enumerate() {
                        let key = upstream_key(name, i);
                        at_least(
                            &format!("{key}.request_timeout"),
                            r.request_timeout,
                            Duration::from_millis(100),
                            "10s",
                        )
                        .unwrap_or_else(|e| problems.push(reason(e)));
                        at_least(
                            &format!("{key}.attempt_budget"),
                            r.attempt_budget,
                            r.request_timeout * 2,
                            "5m",
                        )
                        .unwrap_or_else(|e| problems.push(reason(e)));
                        at_least(
                            &format!("{key}.poll_interval"),
                            r.poll_interval,
                            Duration::from_millis(10),
                            "1s",
                        )
                        .unwrap_or_else(|e| problems.push(reason(e)));
                        if r.upstream_pending_authorizations == Some(0) {
                            problems.push(format!(
                            "{key}.upstream_pending_authorizations must be at least 1 (or absent: no budget); write e.g. upstream_pending_authorizations = 300"
                        ));
                        }
                        if r.breaker_failures == 0 {
                            problems.push(format!(
                            "{key}.breaker_failures must be at least 1 (failures in a row that open the upstream's breaker); write e.g. breaker_failures = 5"
                        ));
                        }
                        if r.breaker_open_for < Duration::from_secs(1)
                            || r.breaker_open_for > Duration::from_secs(3600)
                        {
                            problems.push(format!(
                            "{key}.breaker_open_for must be between 1s and 1h (how long an open breaker waits before probing the upstream); write e.g. breaker_open_for = \"30s\""
                        ));
                        }
                    }
                }
            }
        }
        if self.max_in_flight == 0 {
            problems.push("max_in_flight must be at least 1".into());
        }
        if self.max_buffered_body_bytes < self.max_body_bytes {
            problems.push(format!(
                "max_buffered_body_bytes ({}) is below max_body_bytes ({}): no request of the largest size could be read; write e.g. max_buffered_body_bytes = {}",
                self.max_buffered_body_bytes,
                self.max_body_bytes,
                self.max_body_bytes.saturating_mul(16).max(64 * 1024 * 1024)
            ));
        }
        let postgres = acme_proxy_store::is_postgres_url(&self.database_url());
        for (key, set) in [
            (
                "database_max_connections",
                self.database_max_connections.is_some(),
            ),
            (
                "database_acquire_timeout",
                self.database_acquire_timeout.is_some(),
            ),
        ] {
            if set && !postgres {
                problems.push(format!(
                    "{key} applies to a PostgreSQL database_url only; remove it (SQLite's connections are the server's own)"
                ));
            }
        }
        if self.database_max_connections == Some(0) {
            problems.push(
                "database_max_connections must be at least 1; write e.g. database_max_connections = 16".into());
        }
        // One connection is the job runner's LISTEN: with one in all, the
        // requests would need a second past the stated bound.
        if self.database_max_connections == Some(1) {
            problems.push(
                "database_max_connections = 1 leaves no connection beside the job runner's LISTEN; write at least 2, e.g. database_max_connections = 16".into());
        }
        if self.jobs.validations_per_account == 0 {
            problems.push(
                "jobs.validations_per_account must be at least 1; write e.g. validations_per_account = 8".into());
        }
        let c = &self.connections;
        if c.max_open == 0 || c.max_open_per_client == 0 || c.h2_max_concurrent_streams == 0 {
            problems.push(
                "connections.max_open, connections.max_open_per_client and connections.h2_max_concurrent_streams must be at least 1; write e.g. max_open_per_client = 64".into());
        }
        if !(32..=128).contains(&c.ipv6_client_prefix) {
            problems.push(format!(
                "connections.ipv6_client_prefix is {}: it must be 32 to 128; write ipv6_client_prefix = 64 (a host per /64) or 128 (a host per address)",
                c.ipv6_client_prefix
            ));
        }
        for (key, value) in [
            ("header_read_timeout", c.header_read_timeout),
            ("body_read_timeout", c.body_read_timeout),
            ("idle_timeout", c.idle_timeout),
            ("h2_keep_alive_interval", c.h2_keep_alive_interval),
            ("h2_keep_alive_timeout", c.h2_keep_alive_timeout),
        ] {
            at_least(
                &format!("connections.{key}"),
                value,
                Duration::from_millis(100),
                "10s",
            )
            .unwrap_or_else(|e| problems.push(reason(e)));
        }
        // A copy older than a minute would let another process's change to
        // an account (the admin CLI's deactivation) go unseen by reads for
        // longer than an operator expects.
        if self.account_cache_ttl > Duration::from_secs(60) {
            problems.push(format!(
                "account_cache_ttl is {:?}, longer than a minute; write e.g. account_cache_ttl = \"1s\" (or \"0s\" to read the account for every request)",
                self.account_cache_ttl
            ));
        }
        match problems.len() {
            0 => Ok(()),
            1 => Err(ConfigError::Invalid(problems.remove(0))),
            _ => Err(ConfigError::Problems(problems)),
        }
    }

    /// The base URL of every ACME URL we hand out.
    pub fn base_url(&self) -> String {
        self.base_url_at(self.listen)
    }

    /// The base URL when the listener is bound at `addr` (with port 0 the
    /// real port is known only after binding).
    pub fn base_url_at(&self, addr: SocketAddr) -> String {
        match &self.public_url {
            Some(url) => url.clone(),
            None if self.tls.is_some() => format!("https://{addr}"),
            None => format!("http://{addr}"),
        }
    }

    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.clone(),
            None => format!("sqlite:{}", self.data_dir.join("acme-proxy.db").display()),
        }
    }

    /// Where replay nonces are kept on a database that is PostgreSQL or
    /// not: as configured, else in the database on PostgreSQL (where
    /// replicas may share it) and in memory on SQLite.
    pub fn nonce_store_for(&self, postgres: bool) -> NonceStore {
        self.nonce_store.unwrap_or(if postgres {
            NonceStore::Database
        } else {
            NonceStore::Memory
        })
    }

    /// [`Config::database_url`] as it may be shown (logs, `config check`):
    /// a password in it written `***`.
    pub fn database_url_shown(&self) -> String {
        redact_password(&self.database_url())
    }

    /// How the store opens the database: the password from
    /// `database_password_file`, when there is one.
    pub fn store_options(&self) -> anyhow::Result<acme_proxy_store::StoreOptions> {
        use anyhow::Context as _;
        let mut options = acme_proxy_store::StoreOptions::default();
        if let Some(n) = self.database_max_connections {
            options.max_connections = n;
        }
        if let Some(wait) = self.database_acquire_timeout {
            options.acquire_timeout = wait;
        }
        if let Some(file) = &self.database_password_file {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading database_password_file {}", file.display()))?;
            options.password = Some(text.lines().next().unwrap_or_default().to_owned());
        }
        Ok(options)
    }
}

/// `url` with the password of its user information (`user:PASSWORD@`) and
/// of a `password=` parameter written `***`.
pub fn redact_password(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = out.find("://") {
        let authority_start = scheme_end + 3;
        let authority_end = out[authority_start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| authority_start + i);
        if let Some(at) = out[authority_start..authority_end].rfind('@') {
            let userinfo = authority_start..authority_start + at;
            if let Some(colon) = out[userinfo.clone()].find(':') {
                out.replace_range(userinfo.start + colon + 1..userinfo.end, "***");
            }
        }
    }
    if let Some(query_start) = out.find('?') {
        let (base, query) = out.split_at(query_start + 1);
        let query: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        out = format!("{base}{}", query.join("&"));
    }
    out
}

/// Where upstream `index` of relay profile `name` is configured: the
/// signer table, then its `[[fallback]]` tables.
pub(crate) fn upstream_key(name: &str, index: usize) -> String {
    match index {
        0 => format!("profiles.{name}.signer"),
        i => format!("profiles.{name}.signer.fallback[{}]", i - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_a_database_url_is_shown_as_stars_wherever_it_is_written() {
        for (url, shown) in [
            (
                "postgres://acme:s3cr%40t@db.example:5432/acme?sslmode=verify-full",
                "postgres://acme:***@db.example:5432/acme?sslmode=verify-full",
            ),
            (
                "postgresql://acme@db.example/acme?password=s3cret&sslmode=require",
                "postgresql://acme@db.example/acme?password=***&sslmode=require",
            ),
            (
                "postgres://acme@db/acme?host=/run/postgresql",
                "postgres://acme@db/acme?host=/run/postgresql",
            ),
            (
                "sqlite:/var/lib/acme-proxy/a@b:c.db",
                "sqlite:/var/lib/acme-proxy/a@b:c.db",
            ),
        ] {
            assert_eq!(redact_password(url), shown, "{url}");
        }
    }

    #[test]
    fn kubernetes_service_links_are_told_apart_from_misspelt_keys() {
        for link in [
            "PORT",
            "PORT_14000_TCP",
            "PORT_14000_TCP_PROTO",
            "PORT_14000_TCP_PORT",
            "PORT_14000_TCP_ADDR",
            "SERVICE_HOST",
            "SERVICE_PORT",
            "SERVICE_PORT_ACME",
            "service_host",
        ] {
            assert!(is_service_link(link), "{link}");
        }
        for key in [
            "LISTEN",
            "LISTN",
            "PORTS",
            "SERVICE",
            "PROFILES__DEFAULT__BYPASS",
        ] {
            assert!(!is_service_link(key), "{key}");
        }
    }

    #[test]
    fn certificate_profiles_that_cannot_work_are_refused_saying_what_to_write() {
        let err = |body: &str| {
            Config::from_toml(&format!("[profiles.p]\n{body}"))
                .unwrap_err()
                .to_string()
        };
        let cp = |name: &str, extra: &str| {
            format!("[profiles.p.certificate_profiles.{name}]\ndescription = \"d\"\n{extra}\n")
        };
        let e = err(&format!("{}{}", cp("a", ""), cp("b", "")));
        assert!(e.contains("default_certificate_profile = \"a\""), "{e}");
        let e = err(&format!(
            "default_certificate_profile = \"c\"\n{}",
            cp("a", "")
        ));
        assert!(e.contains("not one of its certificate profiles (a)"), "{e}");
        let e = err("default_certificate_profile = \"c\"\n");
        assert!(
            e.contains("no [profiles.p.certificate_profiles.NAME]"),
            "{e}"
        );
        let e = err(&cp("a", "identifier_types = [\"email\"]"));
        assert!(e.contains("\"email\" is not an identifier type"), "{e}");
        let e = err(&cp("a", "validity = \"1s\""));
        assert!(e.contains("validity is shorter than a minute"), "{e}");
        let e = err(&format!(
            "{}[profiles.p.signer]\ntype = \"relay\"\ndirectory = \"https://ca.test/dir\"\n",
            cp("a", "validity = \"6d\"")
        ));
        assert!(e.contains("the upstream decides validity"), "{e}");
        let e = err("[profiles.p.signer]\ntype = \"local_ca\"\nrenewal_window = [0.9, 0.5]");
        assert!(e.contains("renewal_window = [0.6, 0.8]"), "{e}");
        // One profile needs no default: it is the default.
        let c = Config::from_toml(&format!("[profiles.p]\n{}", cp("only", ""))).unwrap();
        let p = &c.profiles["p"];
        assert_eq!(
            p.certificate_profile(None).unwrap().map(|c| c.0),
            Some("only")
        );
        assert_eq!(p.certificate_profile(Some("other")).unwrap_err(), "other");
    }

    #[test]
    fn an_empty_file_gives_one_default_profile_on_loopback() {
        let c = Config::from_toml("").unwrap();
        assert!(c.listen.ip().is_loopback());
        assert_eq!(c.profiles.keys().collect::<Vec<_>>(), vec!["default"]);
        assert_eq!(c.base_url(), "http://127.0.0.1:14000");
    }

    #[test]
    fn an_unknown_key_stops_start_up_with_its_name() {
        let err = Config::from_toml("listne = \"127.0.0.1:1\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("listne"), "{err}");
        let err = Config::from_toml("[profiles.a]\nbypas = true")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bypas"), "{err}");
    }

    #[test]
    fn an_account_cache_ttl_past_a_minute_is_refused_with_an_example() {
        let err = Config::from_toml("account_cache_ttl = \"5m\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("account_cache_ttl") && err.contains("write e.g."),
            "{err}"
        );
        let ok = Config::from_toml("account_cache_ttl = \"0s\"").unwrap();
        assert_eq!(ok.account_cache_ttl, Duration::ZERO);
    }

    #[test]
    fn a_body_budget_below_the_largest_body_is_refused_with_an_example() {
        let err = Config::from_toml("max_body_bytes = 4096\nmax_buffered_body_bytes = 4095")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("max_buffered_body_bytes (4095) is below max_body_bytes (4096)")
                && err.contains("write e.g. max_buffered_body_bytes = 67108864"),
            "{err}"
        );
        Config::from_toml("max_body_bytes = 4096\nmax_buffered_body_bytes = 4096").unwrap();
    }

    #[test]
    fn a_bad_duration_says_what_to_write() {
        let err = Config::from_toml("nonce_lifetime = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("write e.g."), "{err}");
    }

    #[test]
    fn a_zero_lifetime_is_refused_with_an_example() {
        let err = Config::from_toml("nonce_lifetime = \"0s\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nonce_lifetime") && err.contains("write e.g."),
            "{err}"
        );
        let err =
            Config::from_toml("[profiles.a.signer]\ntype = \"local_ca\"\ncrl_validity = \"1s\"")
                .unwrap_err()
                .to_string();
        assert!(err.contains("profiles.a.signer.crl_validity"), "{err}");
    }

    #[test]
    fn five_independent_mistakes_are_all_reported_each_saying_what_to_write() {
        let text = "listen = \"0.0.0.0:14000\"\ndatabase_url = \"mysql://acme:s3cret@db/acme\"\n[metrics]\nlisten = \"127.0.0.1:14000\"\n[egress]\nproxy = \"socks5://proxy.corp:1080\"\n[profiles.default]\nchallenges = []\n";
        let Err(ConfigError::Problems(problems)) = Config::from_toml(text) else {
            panic!("not refused with every problem");
        };
        assert_eq!(problems.len(), 5, "{problems:#?}");
        for (key, says) in [
            (
                "listen is 0.0.0.0:14000",
                "public_url = \"http://acme.example.internal:14000\"",
            ),
            ("metrics.listen 127.0.0.1:14000", "a port of its own"),
            ("database_url \"mysql\"", "postgres://USER@HOST/DATABASE"),
            ("egress.proxy", "SOCKS proxies are not supported"),
            (
                "profiles.default.challenges is empty",
                "challenges = [\"http-01\"]",
            ),
        ] {
            assert!(
                problems.iter().any(|p| p.contains(key) && p.contains(says)),
                "no problem names {key:?} with {says:?}: {problems:#?}"
            );
        }
        assert!(
            !problems.iter().any(|p| p.contains("s3cret")),
            "{problems:#?}"
        );
        // One mistake reads as before, without a count.
        let one = Config::from_toml("[profiles.default]\nchallenges = []\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            one,
            "configuration: profiles.default.challenges is empty; write challenges = [\"http-01\"]"
        );
    }

    #[test]
    fn a_challenge_type_named_twice_is_refused_saying_what_to_write() {
        let e = Config::from_toml(
            "[profiles.web]\nchallenges = [\"dns-01\", \"http-01\", \"dns-01\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "configuration: profiles.web.challenges names dns-01 more than once; write each type once: challenges = [\"dns-01\", \"http-01\"]"
        );
    }

    #[test]
    fn a_value_that_does_not_load_is_named_as_written_without_figments_profile() {
        let e = Config::from_toml("[jobs]\nlease = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("configuration: jobs.lease: "), "{e}");
        assert!(!e.contains("default."), "{e}");
        let e = Config::from_toml("listen = 5\n").unwrap_err().to_string();
        assert!(e.starts_with("configuration: listen: invalid type"), "{e}");
    }

    #[test]
    fn an_unspecified_listen_address_is_fine_with_a_public_url_and_a_metrics_port_of_its_own() {
        Config::from_toml(
            "listen = \"0.0.0.0:14000\"\npublic_url = \"http://acme.example.internal:14000\"\n[metrics]\nlisten = \"0.0.0.0:9464\"\n",
        )
        .unwrap();
        Config::from_toml(
            "listen = \"127.0.0.1:14000\"\n[metrics]\nlisten = \"127.0.0.2:14000\"\n",
        )
        .unwrap();
        for clash in ["127.0.0.1:14000", "0.0.0.0:14000"] {
            let e = Config::from_toml(&format!("[metrics]\nlisten = \"{clash}\"\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("a port of its own"), "{clash}: {e}");
        }
    }

    #[test]
    fn the_example_configuration_parses_and_documents_every_key() {
        Config::from_toml(reference::EXAMPLE).unwrap();
        // Keys shown commented out count as documented.
        let documented: toml::Table = reference::uncommented(reference::EXAMPLE)
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        let keys = reference::keys();
        assert!(keys.len() > 100, "{} keys", keys.len());
        for key in keys {
            assert!(
                reference::find(&documented, &key.path).is_some(),
                "{} is not documented in acme-proxy.example.toml",
                key.path
            );
        }
    }

    /// docs/configuration-reference.md is what the types and the example
    /// file generate; after changing either, regenerate it with
    /// `acme-proxy generate config-reference > docs/configuration-reference.md`.
    #[test]
    fn the_configuration_reference_page_is_generated_from_the_types() {
        let committed = include_str!("../../../../docs/configuration-reference.md");
        let generated = reference::markdown();
        assert!(
            committed == generated,
            "docs/configuration-reference.md is stale: run `acme-proxy generate config-reference > docs/configuration-reference.md`"
        );
        for key in [
            "tls.cert",
            "profiles.<name>.signer.directory",
            "validation.deny_networks",
        ] {
            assert!(generated.contains(&format!("### `{key}`")), "{key}");
        }
    }

    #[test]
    fn a_token_signing_deadline_defaults_to_ten_seconds_and_must_fit_in_a_request() {
        let token = |extra: &str| {
            Config::from_toml(&format!(
                "[profiles.default.signer]\ntype = \"local_ca\"\nca_cert = \"/etc/ca.pem\"\n[profiles.default.signer.pkcs11]\nmodule = \"/usr/lib/p11.so\"\ntoken_label = \"ca\"\nkey_label = \"k\"\npin_file = \"/etc/pin\"\n{extra}"
            ))
        };
        let config = token("").unwrap();
        let SignerConfig::LocalCa(ca) = &config.profiles["default"].signer else {
            panic!("local_ca");
        };
        assert_eq!(
            ca.pkcs11.as_ref().map(|p| p.timeout),
            Some(Duration::from_secs(10))
        );
        for bad in ["500ms", "2m"] {
            let err = token(&format!("timeout = \"{bad}\""))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("profiles.default.signer.pkcs11.timeout must be between 1s and 60s"),
                "{err}"
            );
        }
    }

    #[test]
    fn relay_settings_that_cannot_work_are_refused_saying_what_to_write() {
        let relay = |body: &str| {
            Config::from_toml(&format!("[profiles.edge.signer]\ntype = \"relay\"\n{body}"))
                .unwrap_err()
                .to_string()
        };
        let err = relay("");
        assert!(err.contains("profiles.edge.signer.directory"), "{err}");
        let err = relay("directory = \"http://ca.example/dir\"");
        assert!(err.contains("https://"), "{err}");
        let err = relay("directory = \"https://ca.example/dir\"\nstrategy = \"dns01\"");
        assert!(err.contains("[profiles.edge.signer.dns01]"), "{err}");
        let err = relay(
            "directory = \"https://ca.example/dir\"\nstrategy = \"dns01\"\n[profiles.edge.signer.dns01]\nserver = \"127.0.0.1:53\"\nzones = [\"a.test\"]\ntsig_key_name = \"k\"\ntsig_algorithm = \"hmac-md5\"\ntsig_secret_file = \"s\"",
        );
        assert!(err.contains("hmac-sha256"), "{err}");
        let err = relay("directory = \"https://ca.example/dir\"\nstrategy = \"tls-alpn\"");
        assert!(err.contains("tls-alpn") && err.contains("dns01"), "{err}");
        let err = relay(
            "directory = \"https://ca.example/dir\"\nrequest_timeout = \"10s\"\nattempt_budget = \"15s\"",
        );
        assert!(err.contains("attempt_budget"), "{err}");
        let err =
            relay("directory = \"https://ca.example/dir\"\nupstream_pending_authorizations = 0");
        assert!(
            err.contains("upstream_pending_authorizations = 300"),
            "{err}"
        );
        let err = relay("directory = \"https://ca.example/dir\"\nbreaker_failures = 0");
        assert!(err.contains("breaker_failures = 5"), "{err}");
        for open_for in ["500ms", "2h"] {
            let err = relay(&format!(
                "directory = \"https://ca.example/dir\"\nbreaker_open_for = \"{open_for}\""
            ));
            assert!(err.contains("breaker_open_for = \"30s\""), "{err}");
        }
        let ok = Config::from_toml(
            "[profiles.edge.signer]\ntype = \"relay\"\ndirectory = \"https://ca.example/dir\"\nstrategy = \"http01\"",
        )
        .unwrap();
        let SignerConfig::Relay(r) = &ok.profiles["edge"].signer else {
            panic!("not a relay")
        };
        assert_eq!(r.strategy, RelayStrategy::Http01);
        assert_eq!(
            r.account_key_path(Path::new("/d"), "edge", true),
            PathBuf::from("/d/upstream/edge.key")
        );
    }

    #[test]
    fn a_relay_with_fallbacks_names_each_upstream_once_and_keeps_the_profiles_keys_on_the_signer_table()
     {
        let relay = |fallbacks: &str| {
            Config::from_toml(&format!(
                "[profiles.edge.signer]\ntype = \"relay\"\ndirectory = \"https://a.example/dir\"\nmax_attempts = 7\n{fallbacks}"
            ))
        };
        let ok = relay(
            "[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"https://b.example/dir\"\nrequest_timeout = \"3s\"",
        )
        .unwrap();
        let SignerConfig::Relay(r) = &ok.profiles["edge"].signer else {
            panic!("not a relay")
        };
        let names: Vec<&str> = r.upstreams().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["primary", "b"]);
        assert_eq!(r.fallback[0].request_timeout, Duration::from_secs(3));
        assert_eq!(r.max_attempts, 7);
        assert_eq!(
            r.fallback[0].account_key_path(Path::new("/d"), "edge", false),
            PathBuf::from("/d/upstream/edge.b.key")
        );
        for (fallback, says) in [
            (
                "[[profiles.edge.signer.fallback]]\ndirectory = \"https://b.example/dir\"",
                "fallback[0].name is missing",
            ),
            (
                "[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"https://b.example/dir\"\n[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"https://c.example/dir\"",
                "names another upstream",
            ),
            (
                "[[profiles.edge.signer.fallback]]\nname = \"b c\"\ndirectory = \"https://b.example/dir\"",
                "must be letters, digits",
            ),
            (
                "[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"https://b.example/dir\"\nmax_attempts = 3",
                "set it on [profiles.edge.signer]",
            ),
            (
                "[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"http://b.example/dir\"",
                "fallback[0].directory",
            ),
            (
                "[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"https://b.example/dir\"\nbreaker_failures = 0",
                "fallback[0].breaker_failures",
            ),
            (
                "[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"https://a.example/dir\"",
                "has the directory or account_key of upstream \"primary\"",
            ),
            (
                "failover_after = \"1h\"",
                "failover_after or failover_on is set but the profile has no",
            ),
            (
                "failover_on = [\"caa\", \"notAProblem\"]\n[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"https://b.example/dir\"",
                "\"notAProblem\" is not an ACME problem type",
            ),
            (
                "failover_after = \"0s\"\n[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"https://b.example/dir\"",
                "failover_after must be at least 1s",
            ),
            (
                "[[profiles.edge.signer.fallback]]\nname = \"b\"\ndirectory = \"https://b.example/dir\"\nfailover_after = \"1h\"",
                "failover_after and failover_on are the profile's",
            ),
        ] {
            let err = relay(fallback).unwrap_err().to_string();
            assert!(err.contains(says), "{fallback}: {err}");
        }
    }

    #[test]
    fn a_zero_lease_or_concurrency_for_jobs_is_refused() {
        let err = Config::from_toml("[jobs]\nlease = \"0s\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("jobs.lease"), "{err}");
        let err = Config::from_toml("[jobs]\nconcurrency = 0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("jobs.concurrency"), "{err}");
        let err = Config::from_toml("[jobs]\nmax_attempts = 0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_attempts"), "{err}");
    }

    #[test]
    fn an_ipv6_client_prefix_outside_32_to_128_is_refused_saying_what_to_write() {
        for bits in [0, 31, 129] {
            let err = Config::from_toml(&format!("[connections]\nipv6_client_prefix = {bits}"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("connections.ipv6_client_prefix is") && err.contains("write"),
                "{err}"
            );
        }
        for bits in [32, 64, 128] {
            let config =
                Config::from_toml(&format!("[connections]\nipv6_client_prefix = {bits}")).unwrap();
            assert_eq!(config.connections.ipv6_client_prefix, bits);
        }
    }

    #[test]
    fn half_an_operator_ca_is_refused() {
        let err =
            Config::from_toml("[profiles.a.signer]\ntype = \"local_ca\"\nca_cert = \"x.pem\"")
                .unwrap_err()
                .to_string();
        assert!(err.contains("both ca_cert and ca_key"), "{err}");
    }

    #[test]
    fn trusted_proxies_take_bare_addresses_and_networks_and_name_a_bad_one() {
        let c = Config::from_toml("trusted_proxies = [\"10.0.0.0/8\", \"192.0.2.10\", \"::1\"]")
            .unwrap();
        let shown: Vec<String> = c.trusted_proxies.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.0/8", "192.0.2.10/32", "::1/128"]);
        let err = Config::from_toml("trusted_proxies = [\"proxy.example\"]")
            .unwrap_err()
            .to_string();
        assert!(err.contains("proxy.example"), "{err}");
    }

    #[test]
    fn a_self_signed_certificate_for_a_wildcard_listener_needs_a_public_url() {
        let err = Config::from_toml("listen = \"0.0.0.0:8443\"\n[tls]\nself_signed = true")
            .unwrap_err()
            .to_string();
        assert!(err.contains("public_url"), "{err}");
        Config::from_toml(
            "listen = \"0.0.0.0:8443\"\npublic_url = \"https://acme.example.test:8443\"\n[tls]\nself_signed = true",
        )
        .unwrap();
    }

    #[test]
    fn the_postgresql_pool_settings_are_refused_with_sqlite_and_zero_connections_with_postgres() {
        let sqlite = Config::from_toml("database_max_connections = 4\n[profiles.default]\n")
            .unwrap_err()
            .to_string();
        assert!(sqlite.contains("PostgreSQL database_url only"), "{sqlite}");
        let sqlite = Config::from_toml("database_acquire_timeout = \"2s\"\n[profiles.default]\n")
            .unwrap_err()
            .to_string();
        assert!(sqlite.contains("database_acquire_timeout"), "{sqlite}");
        let zero = Config::from_toml(
            "database_url = \"postgres://u@h/d\"\ndatabase_max_connections = 0\n[profiles.default]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(zero.contains("at least 1"), "{zero}");
        let one = Config::from_toml(
            "database_url = \"postgres://u@h/d\"\ndatabase_max_connections = 1\n[profiles.default]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(one.contains("at least 2"), "{one}");
        let set = Config::from_toml(
            "database_url = \"postgres://u@h/d\"\ndatabase_max_connections = 3\ndatabase_acquire_timeout = \"2s\"\n[profiles.default]\n",
        )
        .unwrap();
        let options = set.store_options().unwrap();
        assert_eq!(options.max_connections, 3);
        assert_eq!(options.acquire_timeout, Duration::from_secs(2));
    }
}
