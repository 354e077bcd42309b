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

/// The whole configuration.
#[derive(Clone, Debug, Deserialize)]
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
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Which header carries the forwarded chain.
    pub forwarded_header: ForwardedHeader,
    /// Directory for the database and self-generated CA keys.
    pub data_dir: PathBuf,
    /// `sqlite:PATH`; defaults to `sqlite:{data_dir}/acme-proxy.db`.
    pub database_url: Option<String>,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// Largest request body accepted (RFC 8555 requests are small).
    pub max_body_bytes: usize,
    /// Requests served at once; beyond this, 503 with `Retry-After`.
    pub max_in_flight: usize,
    #[serde(deserialize_with = "duration")]
    pub nonce_lifetime: Duration,
    /// How long a copy of an account (with its parsed key) kept in memory
    /// may verify requests; `0s` reads the account for every request.
    #[serde(deserialize_with = "duration")]
    pub account_cache_ttl: Duration,
    /// Where replay nonces are kept: `memory` (no disk write per request;
    /// a restart refuses old ones) or `database` (shared by replicas).
    pub nonce_store: NonceStore,
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    pub connections: ConnectionsConfig,
    pub validation: ValidationConfig,
    pub jobs: JobsConfig,
    pub notify: NotifyConfig,
    pub metrics: MetricsConfig,
    pub audit: AuditConfig,
    pub profiles: BTreeMap<String, ProfileConfig>,
    /// The `ACME_PROXY_*` variables [`Config::load`] left aside as
    /// Kubernetes service links, for start-up to warn about.
    #[serde(skip)]
    pub ignored_environment: Vec<String>,
}

/// TLS termination on the ACME listener (rustls): the operator's
/// certificate and key, or a self-signed certificate for the public URL's
/// host.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, SEC1 or PKCS#1).
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Generate (once, kept in `{data_dir}/tls/`) a self-signed certificate
    /// for the public URL's host instead.
    #[serde(default)]
    pub self_signed: bool,
    /// How often the files are checked for a change (SIGHUP reloads at once).
    #[serde(default = "default_tls_reload", deserialize_with = "duration")]
    pub reload_interval: Duration,
    /// A connection that has not finished its handshake by then is closed.
    #[serde(default = "default_tls_handshake", deserialize_with = "duration")]
    pub handshake_timeout: Duration,
}

fn default_tls_reload() -> Duration {
    Duration::from_secs(30)
}

fn default_tls_handshake() -> Duration {
    Duration::from_secs(10)
}

/// Where replay nonces live (see `authority/nonces.rs`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NonceStore {
    #[default]
    Memory,
    Database,
}

/// The header a trusted proxy puts the client's address in.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
}

/// The audit trail's upkeep and enrichment.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Rows older than this are deleted (hourly); absent: kept for ever.
    #[serde(deserialize_with = "opt_duration")]
    pub retention: Option<Duration>,
    /// Record the client address's reverse (PTR) name, best-effort.
    pub reverse_names: bool,
    /// The longest a reverse lookup may delay the request it audits.
    #[serde(deserialize_with = "duration")]
    pub reverse_name_timeout: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            retention: None,
            reverse_names: true,
            reverse_name_timeout: Duration::from_millis(300),
        }
    }
}

/// What one client can hold of a listener (ACME, plain or TLS, and
/// metrics): connections, and the time it may take to send a request.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionsConfig {
    /// Connections open at once on one listener; past it, new ones are
    /// closed as soon as they are accepted.
    pub max_open: usize,
    /// Connections open at once from one client address (not counted for
    /// the addresses of `trusted_proxies`, which carry many clients).
    pub max_open_per_client: usize,
    /// Time to send a whole request head, from the connection's start or
    /// the end of the previous request (HTTP/1.1's keep-alive idle time).
    #[serde(deserialize_with = "duration")]
    pub header_read_timeout: Duration,
    /// Time to send a whole request body, once the head has arrived; the
    /// body is read before the request takes one of `max_in_flight`.
    #[serde(deserialize_with = "duration")]
    pub body_read_timeout: Duration,
    /// A connection with no request in progress for this long is closed
    /// (HTTP/2 with a GOAWAY).
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// HTTP/2: how often an idle connection is pinged, and how long the
    /// answer may take before the connection is closed.
    #[serde(deserialize_with = "duration")]
    pub h2_keep_alive_interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub h2_keep_alive_timeout: Duration,
    /// HTTP/2: requests one connection may have open at once.
    pub h2_max_concurrent_streams: u32,
}

impl Default for ConnectionsConfig {
    fn default() -> Self {
        Self {
            max_open: 4096,
            max_open_per_client: 256,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            h2_keep_alive_interval: Duration::from_secs(20),
            h2_keep_alive_timeout: Duration::from_secs(20),
            h2_max_concurrent_streams: 64,
        }
    }
}

/// The Prometheus endpoint.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Where `/metrics` is served, on a listener of its own; absent: off.
    pub listen: Option<SocketAddr>,
}

/// Settings shared by every profile's notifications.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    /// Templates (one file each, named by file name) that add to or replace
    /// the built-in `default.json` and `slack.json`.
    pub templates_dir: Option<PathBuf>,
}

/// A profile's notification destinations.
#[derive(Clone, Debug, Default, Deserialize)]
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
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
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
#[derive(Clone, Debug, Deserialize)]
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
    pub events: Vec<Event>,
    #[serde(default = "default_webhook_timeout", deserialize_with = "duration")]
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

fn default_email_subject() -> String {
    "email_subject.txt".to_owned()
}

fn default_email_body() -> String {
    "email_body.txt".to_owned()
}

/// A notification script, run without a shell in a cleared environment.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptConfig {
    /// Absolute path of the program.
    pub command: PathBuf,
    /// Fixed arguments (no shell expansion).
    #[serde(default)]
    pub args: Vec<String>,
    /// Events given to this script; empty means all.
    #[serde(default)]
    pub events: Vec<Event>,
    #[serde(default = "default_webhook_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
}

/// One webhook: where, how, which body, which events.
#[derive(Clone, Deserialize)]
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
    pub events: Vec<Event>,
    #[serde(default = "default_webhook_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
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
            .finish()
    }
}

fn default_webhook_method() -> String {
    "POST".to_owned()
}

fn default_webhook_template() -> String {
    "default.json".to_owned()
}

fn default_webhook_content_type() -> String {
    "application/json".to_owned()
}

fn default_webhook_timeout() -> Duration {
    Duration::from_secs(10)
}

/// The durable job queue (background validation, periodic sweeps).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// Jobs of one kind run at once by this process (each kind —
    /// validation, relay issuance, notification, periodic work — has its
    /// own slots).
    pub concurrency: usize,
    /// Validations of one account running at once (across processes).
    pub validations_per_account: usize,
    /// How often the runner looks for scheduled work when nothing woke it.
    #[serde(deserialize_with = "duration")]
    pub poll_interval: Duration,
    /// How long a claim lasts unless renewed; a dead runner's jobs are
    /// reclaimed after at most this long. Renewed every third of it.
    #[serde(deserialize_with = "duration")]
    pub lease: Duration,
    /// Default time budget of one attempt (handlers may set their own).
    #[serde(deserialize_with = "duration")]
    pub attempt_budget: Duration,
    /// Attempts before a job is retired for good.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt, jittered.
    #[serde(deserialize_with = "duration")]
    pub backoff_base: Duration,
    /// Longest retry delay.
    #[serde(deserialize_with = "duration")]
    pub backoff_cap: Duration,
    /// How long finished jobs are kept for operators to inspect.
    #[serde(deserialize_with = "duration")]
    pub retention: Duration,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            concurrency: 16,
            validations_per_account: 8,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(15),
            attempt_budget: Duration::from_secs(300),
            max_attempts: 10,
            backoff_base: Duration::from_secs(2),
            backoff_cap: Duration::from_secs(600),
            retention: Duration::from_secs(7 * 86400),
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// How challenges are validated (shared by all profiles).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationConfig {
    /// Port http-01 connects to (RFC 8555 §8.3 says 80; tests use another).
    pub http_port: u16,
    /// Port tls-alpn-01 connects to (RFC 8737 says 443; tests use another).
    pub tls_port: u16,
    /// Time allowed for one validation, connection to answer.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// DNS servers (`ip:port`) used to resolve identifiers; empty means the
    /// system's resolver configuration.
    pub dns_resolvers: Vec<SocketAddr>,
    /// The resolver configuration read when `dns_resolvers` is empty; only
    /// its name servers and options are used (never `search`/`domain`).
    pub resolv_conf: PathBuf,
    /// Addresses validation never connects to (resolved addresses, every
    /// redirect hop, `ip` identifiers): by default loopback, link-local
    /// (cloud metadata included), unspecified, multicast and broadcast.
    #[serde(deserialize_with = "addresses_or_networks")]
    pub deny_networks: Vec<ipnet::IpNet>,
    /// Exceptions to `deny_networks`.
    #[serde(deserialize_with = "addresses_or_networks")]
    pub allow_networks: Vec<ipnet::IpNet>,
    /// At finalize, CAA is looked up again for a name validated longer ago
    /// than this (profiles with `caa = true`).
    #[serde(deserialize_with = "duration")]
    pub caa_recheck_after: Duration,
}

/// What `validation.deny_networks` holds unless set: the addresses a
/// validator must never be turned against. Private ranges are not in it:
/// internal hosts are what an internal CA validates.
pub const DEFAULT_DENY_NETWORKS: &[&str] = &[
    // "This network" and the unspecified addresses (RFC 1122 §3.2.1.3, RFC 4291 §2.5.2).
    "0.0.0.0/8",
    "::/128",
    // Loopback (RFC 1122, RFC 4291 §2.5.3).
    "127.0.0.0/8",
    "::1/128",
    // Link-local (RFC 3927, RFC 4291), where cloud metadata services
    // answer (169.254.169.254; fd00:ec2::254 on AWS over IPv6).
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    // Multicast and the limited broadcast address.
    "224.0.0.0/4",
    "ff00::/8",
    "255.255.255.255/32",
];

/// One ACME endpoint.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileConfig {
    /// DANGER, tests only: mark every challenge valid without looking.
    pub bypass: bool,
    /// Challenge types offered, in order.
    pub challenges: Vec<ChallengeType>,
    /// URL of the terms of service; when set, new accounts must agree.
    pub terms_of_service: Option<String>,
    pub website: Option<String>,
    pub caa_identities: Vec<String>,
    /// How long a new order (and its pending authorizations) may take.
    #[serde(deserialize_with = "duration")]
    pub order_lifetime: Duration,
    /// How long a valid authorization stays valid.
    #[serde(deserialize_with = "duration")]
    pub authorization_lifetime: Duration,
    /// Reuse a valid authorization of the same account for the same
    /// identifier in a new order, if it was validated within this window
    /// (and outlives the new order). Absent: never reuse (the default).
    #[serde(deserialize_with = "opt_duration")]
    pub authorization_reuse: Option<Duration>,
    /// Check CAA (RFC 8659, with RFC 8657 parameters) at validation time,
    /// against `caa_identities`.
    pub caa: bool,
    /// Accept `ip` identifiers (RFC 8738).
    pub ip_identifiers: bool,
    /// Identifiers one order may name.
    pub max_identifiers: usize,
    /// Pending authorizations one account may hold at this profile; a
    /// newOrder that would pass it is `rateLimited`.
    pub max_pending_authorizations: usize,
    /// External Account Binding (RFC 8555 §7.3.4) at newAccount: `off`
    /// (bindings are ignored), `optional` (checked when sent) or `required`.
    pub eab: EabMode,
    /// Named kinds of certificate this endpoint offers
    /// (draft-ietf-acme-profiles), advertised in the directory's
    /// `meta.profiles` and chosen by newOrder's `profile`.
    pub certificate_profiles: BTreeMap<String, CertificateProfileConfig>,
    /// The certificate profile of an order that names none; required when
    /// there are several (with one, it is that one).
    pub default_certificate_profile: Option<String>,
    /// RFC 9773: how long clients are told to wait (`Retry-After`) before
    /// asking for a certificate's renewal information again.
    #[serde(deserialize_with = "duration")]
    pub renewal_info_retry_after: Duration,
    pub signer: SignerConfig,
    pub notify: ProfileNotifyConfig,
}

/// One certificate profile (draft-ietf-acme-profiles §3).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateProfileConfig {
    /// Shown to clients in the directory.
    pub description: String,
    /// Lifetime of its certificates (embedded CA only; default: the
    /// signer's `validity`).
    #[serde(default, deserialize_with = "opt_duration")]
    pub validity: Option<Duration>,
    /// keyUsage bits (embedded CA only; default: digitalSignature, plus
    /// keyEncipherment for an RSA key).
    #[serde(default)]
    pub key_usages: Option<Vec<KeyUsage>>,
    /// extKeyUsage purposes (embedded CA only; default: serverAuth).
    #[serde(default)]
    pub extended_key_usages: Option<Vec<ExtendedKeyUsage>>,
    /// Identifier types its certificates may carry: `dns`, `ip` (leaving
    /// `ip` out keeps IP addresses out of its SANs).
    #[serde(
        default = "default_identifier_types",
        deserialize_with = "identifier_types"
    )]
    pub identifier_types: Vec<IdentifierType>,
    /// Whether `*.name` identifiers are allowed.
    #[serde(default = "yes")]
    pub wildcards: bool,
}

fn default_identifier_types() -> Vec<IdentifierType> {
    IdentifierType::ALL.to_vec()
}

/// `identifier_types`, each parsed into the closed set, a wrong one
/// refused with the set spelled out (as before it was typed).
fn identifier_types<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IdentifierType>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|t| {
            t.parse().map_err(|_| {
                serde::de::Error::custom(format!(
                    "{t:?} is not an identifier type; write some of {:?}",
                    IdentifierType::ALL
                        .iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                ))
            })
        })
        .collect()
}

fn yes() -> bool {
    true
}

/// keyUsage bits a certificate profile may set (RFC 5280 §4.2.1.3).
#[derive(Clone, Copy, Debug, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KeyUsage {
    DigitalSignature,
    KeyEncipherment,
    KeyAgreement,
    ContentCommitment,
}

/// extKeyUsage purposes a certificate profile may set (RFC 5280 §4.2.1.12).
#[derive(Clone, Copy, Debug, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExtendedKeyUsage {
    ServerAuth,
    ClientAuth,
}

impl ExtendedKeyUsage {
    /// The purposes a certificate carries: its certificate profile's
    /// `extended_key_usages`, or serverAuth when it names none (or the
    /// order has no certificate profile). The one source both the embedded
    /// CA issuing and the check of a custom signer's leaf read.
    pub fn granted(configured: Option<&[Self]>) -> &[Self] {
        configured.unwrap_or(&[Self::ServerAuth])
    }

    /// The purposes a CSR may ask for (RFC 8555 §7.4 leaves what a CA
    /// accepts to it): the profile's own when it names them, otherwise
    /// serverAuth and clientAuth, which cert-manager writes into its CSRs
    /// for TLS certificates. A request is never copied into a certificate
    /// ([`Self::granted`] decides), so this only keeps out purposes no
    /// certificate here could carry.
    pub fn requestable(configured: Option<&[Self]>) -> &[Self] {
        configured.unwrap_or(&[Self::ServerAuth, Self::ClientAuth])
    }

    /// Its name in RFC 5280 §4.2.1.12.
    pub fn rfc5280_name(self) -> &'static str {
        match self {
            Self::ServerAuth => "serverAuth",
            Self::ClientAuth => "clientAuth",
        }
    }
}

impl ProfileConfig {
    /// The certificate profile an order gets: the one it names, or the
    /// default. `Ok(None)` when the endpoint offers none and none was
    /// asked for; `Err` names what was asked and is not offered.
    pub fn certificate_profile<'a>(
        &'a self,
        asked: Option<&'a str>,
    ) -> Result<Option<(&'a str, &'a CertificateProfileConfig)>, String> {
        let name = match (asked, &self.default_certificate_profile) {
            (Some(a), _) => a,
            (None, Some(d)) => d.as_str(),
            (None, None) => match self.certificate_profiles.keys().next() {
                Some(only) if self.certificate_profiles.len() == 1 => only.as_str(),
                _ => return Ok(None),
            },
        };
        self.certificate_profiles
            .get_key_value(name)
            .map(|(k, v)| Some((k.as_str(), v)))
            .ok_or_else(|| name.to_owned())
    }
}

/// Whether a profile asks new accounts for an External Account Binding.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EabMode {
    /// Anyone may register; a binding sent anyway is ignored.
    #[default]
    Off,
    /// A binding is checked when sent (and then limits the account), but
    /// not asked for.
    Optional,
    /// newAccount without a valid binding is refused with
    /// `externalAccountRequired`; the directory says so.
    Required,
}

/// How certificates are produced.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SignerConfig {
    LocalCa(LocalCaConfig),
    Relay(RelayConfig),
    Custom(CustomConfig),
}

/// The custom signer: the operator's program signs, run without a shell, with a cleared environment and a
/// deadline; optional operations for revocation, the CRL and the renewal
/// window are programs of their own.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomConfig {
    /// The issuing program (absolute path): a JSON request on stdin, the
    /// PEM chain (leaf first) on stdout.
    pub command: PathBuf,
    /// Static arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Deadline of one run; the program is killed past it. At most 60 s:
    /// it runs inside the client's finalize request.
    #[serde(default = "default_custom_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    /// The exit status meaning "this CSR cannot be signed": the client gets
    /// badCSR and the order stays ready. Default 65 (EX_DATAERR).
    #[serde(default = "default_bad_csr_exit_code")]
    pub bad_csr_exit_code: i32,
    /// The CA certificate(s) clients should trust (PEM), served at
    /// `ca.pem`; optional.
    pub ca_cert: Option<PathBuf>,
    /// Revocation: a JSON request on stdin, exit 0 once revoked.
    pub revoke: Option<CustomOperation>,
    /// The CRL: its DER on stdout (served at `crl`, cached a minute).
    pub crl: Option<CustomOperation>,
    /// The renewal window of a certificate (RFC 9773): a JSON request on
    /// stdin, `{"start": RFC3339, "end": RFC3339}` on stdout, or nothing
    /// for the default window.
    pub renewal_window: Option<CustomOperation>,
}

/// One optional operation of the custom signer.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomOperation {
    pub command: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
}

fn default_custom_timeout() -> Duration {
    Duration::from_secs(20)
}

fn default_bad_csr_exit_code() -> i32 {
    65
}

/// The custom signer's programs must be absolute paths and its deadline
/// fit inside a client's request.
fn check_custom(name: &str, c: &CustomConfig) -> Result<(), ConfigError> {
    let key = format!("profiles.{name}.signer");
    let mut programs = vec![("command", &c.command)];
    for (op, o) in [
        ("revoke", &c.revoke),
        ("crl", &c.crl),
        ("renewal_window", &c.renewal_window),
    ] {
        if let Some(o) = o {
            programs.push((op, &o.command));
        }
    }
    for (what, path) in programs {
        if !path.is_absolute() {
            return Err(ConfigError::Invalid(format!(
                "{key}.{what}: the program must be an absolute path (no shell runs it), e.g. command = \"/usr/local/bin/acme-sign\""
            )));
        }
    }
    if c.timeout < Duration::from_secs(1) || c.timeout > Duration::from_secs(60) {
        return Err(ConfigError::Invalid(format!(
            "{key}.timeout must be between 1s and 60s (the program runs inside the client's finalize request); write e.g. timeout = \"20s\""
        )));
    }
    if !(1..=255).contains(&c.bad_csr_exit_code) {
        return Err(ConfigError::Invalid(format!(
            "{key}.bad_csr_exit_code must be 1–255; write e.g. bad_csr_exit_code = 65"
        )));
    }
    Ok(())
}

/// The relay signer: certificates come from an upstream ACME CA, with one
/// upstream account per profile.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// The upstream's directory URL (https).
    pub directory: String,
    /// The upstream account key (PKCS#8 PEM), created 0600 by `acme-proxy
    /// upstream register`; defaults to `{data_dir}/upstream/{profile}.key`.
    pub account_key: Option<PathBuf>,
    /// Contact URLs given at registration (`mailto:ops@example.org`).
    pub contact: Vec<String>,
    /// PEM files of CA certificates trusted for the upstream's TLS, in
    /// addition to the system roots (a private CA, a test CA).
    pub trust_anchors: Vec<PathBuf>,
    /// How the upstream's challenges are answered: `dns01`, `http01` or `bypass`.
    pub strategy: RelayStrategy,
    /// Polling interval when the upstream gives no `Retry-After`.
    #[serde(deserialize_with = "duration")]
    pub poll_interval: Duration,
    /// Time budget of one attempt of the relay job.
    #[serde(deserialize_with = "duration")]
    pub attempt_budget: Duration,
    /// Time budget of one upstream HTTP request (a black-holed request costs
    /// this, then a backoff — not the whole attempt).
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// Attempts of one relay before it is abandoned (the order's expiry
    /// bounds it too). Higher than `[jobs] max_attempts` by default: with
    /// the backoff cap, 200 attempts ride out more than a day of upstream
    /// outage instead of half an hour.
    pub max_attempts: u32,
    /// dns01: wait this long after publishing before telling the upstream.
    #[serde(deserialize_with = "duration")]
    pub propagation_wait: Duration,
    /// dns01: where and how to publish TXT records (RFC 2136 + TSIG).
    pub dns01: Option<Rfc2136Config>,
}

/// How a relay profile answers the upstream's challenges.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RelayStrategy {
    /// RFC 2136 UPDATE of `_acme-challenge` TXT records, signed with TSIG.
    Dns01,
    /// The key authorization served on our own `/.well-known/acme-challenge/`.
    Http01,
    /// The upstream already trusts the account (pre-validated domains).
    #[default]
    Bypass,
}

/// An RFC 2136 primary server that accepts TSIG-signed updates.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rfc2136Config {
    /// `HOST:PORT` of the primary.
    pub server: SocketAddr,
    /// Zones the server is primary for; each name is updated in the
    /// longest zone that contains it.
    pub zones: Vec<String>,
    pub tsig_key_name: String,
    /// `hmac-sha256`, `hmac-sha384` or `hmac-sha512`.
    #[serde(default = "default_tsig_algorithm")]
    pub tsig_algorithm: String,
    /// File holding the base64 secret (as `tsig-keygen` prints it); never
    /// in the configuration itself.
    pub tsig_secret_file: PathBuf,
    /// TTL of the published TXT records.
    #[serde(default = "default_txt_ttl")]
    pub ttl: u32,
}

fn default_tsig_algorithm() -> String {
    "hmac-sha256".to_owned()
}

fn default_txt_ttl() -> u32 {
    60
}

/// The TSIG algorithms accepted for RFC 2136 updates (RFC 8945 §6).
pub const TSIG_ALGORITHMS: [&str; 3] = ["hmac-sha256", "hmac-sha384", "hmac-sha512"];

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            directory: String::new(),
            account_key: None,
            contact: Vec::new(),
            trust_anchors: Vec::new(),
            strategy: RelayStrategy::Bypass,
            poll_interval: Duration::from_secs(1),
            attempt_budget: Duration::from_secs(300),
            request_timeout: Duration::from_secs(10),
            max_attempts: 200,
            propagation_wait: Duration::ZERO,
            dns01: None,
        }
    }
}

impl RelayConfig {
    /// Where the upstream account key of `profile` lives.
    pub fn account_key_path(&self, data_dir: &Path, profile: &str) -> PathBuf {
        self.account_key
            .clone()
            .unwrap_or_else(|| data_dir.join("upstream").join(format!("{profile}.key")))
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalCaConfig {
    /// The operator's CA certificate (PEM). With `ca_key`; both absent means
    /// a self-generated CA in `{data_dir}/ca/{profile}/`.
    pub ca_cert: Option<PathBuf>,
    /// The CA's private key (PKCS#8 PEM).
    pub ca_key: Option<PathBuf>,
    /// Certificates above `ca_cert` (PEM), appended to every chain.
    pub chain: Option<PathBuf>,
    /// Lifetime of issued certificates.
    #[serde(deserialize_with = "duration")]
    pub validity: Duration,
    /// notBefore is set this far in the past to absorb clock skew.
    #[serde(deserialize_with = "duration")]
    pub backdate: Duration,
    /// CRL distribution point URL put in leaves; none by default.
    pub crl_url: Option<String>,
    /// AIA caIssuers URL put in leaves; none by default.
    pub issuer_url: Option<String>,
    /// How long each CRL is valid (nextUpdate − thisUpdate); re-signed at half.
    #[serde(deserialize_with = "duration")]
    pub crl_validity: Duration,
    /// RFC 9773: the renewal window, as fractions of a certificate's
    /// lifetime, within which each certificate gets its own quarter-width
    /// window at a place derived from its serial, so renewals spread out.
    pub renewal_window: [f64; 2],
    /// The CA key in a PKCS#11 token instead of `ca_key` (builds with the
    /// `pkcs11` feature).
    pub pkcs11: Option<Pkcs11Config>,
}

/// Where the embedded CA's key lives in a PKCS#11 token (an HSM, SoftHSM2).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pkcs11Config {
    /// The module (shared library), e.g. /usr/lib/softhsm/libsofthsm2.so.
    pub module: PathBuf,
    /// The token, by label…
    pub token_label: Option<String>,
    /// …or by slot id.
    pub slot: Option<u64>,
    /// The private key object, by label and/or id (hex).
    pub key_label: Option<String>,
    pub key_id: Option<String>,
    /// A file holding the user PIN (never the configuration itself).
    pub pin_file: PathBuf,
    /// How long one signing (a certificate or a CRL) may take, waiting for
    /// an earlier one included; past it the request fails and the server
    /// goes on serving. At most 60 s: it runs inside the client's
    /// finalize request.
    #[serde(default = "default_pkcs11_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
}

fn default_pkcs11_timeout() -> Duration {
    Duration::from_secs(10)
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
            log_format: LogFormat::Text,
            max_body_bytes: 64 * 1024,
            max_in_flight: 1024,
            nonce_lifetime: Duration::from_secs(3600),
            account_cache_ttl: Duration::from_secs(1),
            nonce_store: NonceStore::default(),
            shutdown_grace: Duration::from_secs(10),
            connections: ConnectionsConfig::default(),
            validation: ValidationConfig::default(),
            jobs: JobsConfig::default(),
            notify: NotifyConfig::default(),
            metrics: MetricsConfig::default(),
            audit: AuditConfig::default(),
            profiles,
            ignored_environment: Vec::new(),
        }
    }
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            http_port: 80,
            tls_port: 443,
            timeout: Duration::from_secs(10),
            dns_resolvers: Vec::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            deny_networks: DEFAULT_DENY_NETWORKS
                .iter()
                .filter_map(|n| n.parse().ok())
                .collect(),
            allow_networks: Vec::new(),
            caa_recheck_after: Duration::from_secs(8 * 3600),
        }
    }
}

impl Default for ProfileConfig {
    fn default() -> Self {
        Self {
            bypass: false,
            challenges: vec![ChallengeType::Http01],
            terms_of_service: None,
            website: None,
            caa_identities: Vec::new(),
            order_lifetime: Duration::from_secs(7 * 86400),
            authorization_lifetime: Duration::from_secs(30 * 86400),
            authorization_reuse: None,
            ip_identifiers: true,
            max_identifiers: 100,
            max_pending_authorizations: 300,
            caa: false,
            eab: EabMode::Off,
            certificate_profiles: BTreeMap::new(),
            default_certificate_profile: None,
            renewal_info_retry_after: Duration::from_secs(6 * 3600),
            signer: SignerConfig::LocalCa(LocalCaConfig::default()),
            notify: ProfileNotifyConfig::default(),
        }
    }
}

impl Default for SignerConfig {
    fn default() -> Self {
        Self::LocalCa(LocalCaConfig::default())
    }
}

impl Default for LocalCaConfig {
    fn default() -> Self {
        Self {
            ca_cert: None,
            ca_key: None,
            chain: None,
            validity: Duration::from_secs(90 * 86400),
            backdate: Duration::from_secs(3600),
            crl_url: None,
            issuer_url: None,
            crl_validity: Duration::from_secs(86400),
            renewal_window: [0.6, 0.8],
            pkcs11: None,
        }
    }
}

/// Certificate profiles: names fit for URLs and JSON, a default that
/// exists (and one when there are several), identifier types we issue,
/// and no signing parameters at a relay (the upstream decides those).
fn check_certificate_profiles(name: &str, p: &ProfileConfig) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if p.certificate_profiles.is_empty() {
        if let Some(d) = &p.default_certificate_profile {
            return invalid(format!(
                "profiles.{name}.default_certificate_profile is {d:?} but there are no [profiles.{name}.certificate_profiles.NAME] tables; add one or remove the default"
            ));
        }
        return Ok(());
    }
    for (cp_name, cp) in &p.certificate_profiles {
        let key = format!("profiles.{name}.certificate_profiles.{cp_name}");
        if cp_name.is_empty()
            || cp_name.len() > 64
            || !cp_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return invalid(format!(
                "{key}: a certificate profile name is 1–64 letters, digits, '-', '_' or '.'"
            ));
        }
        if cp.identifier_types.is_empty() {
            return invalid(format!(
                "{key}.identifier_types is empty; write e.g. identifier_types = [\"dns\"]"
            ));
        }
        let signs_here = !matches!(p.signer, SignerConfig::Relay(_));
        if !signs_here
            && (cp.validity.is_some()
                || cp.key_usages.is_some()
                || cp.extended_key_usages.is_some())
        {
            return invalid(format!(
                "{key}: a relay profile forwards the profile's name upstream and the upstream decides validity and usages; remove validity, key_usages and extended_key_usages"
            ));
        }
        if cp.validity.is_some_and(|v| v < Duration::from_secs(60)) {
            return invalid(format!(
                "{key}.validity is shorter than a minute; write e.g. validity = \"7d\""
            ));
        }
        if cp.key_usages.as_ref().is_some_and(Vec::is_empty)
            || cp.extended_key_usages.as_ref().is_some_and(Vec::is_empty)
        {
            return invalid(format!(
                "{key}: key_usages and extended_key_usages, when written, list at least one usage (or leave them out for the defaults)"
            ));
        }
    }
    match &p.default_certificate_profile {
        Some(d) if !p.certificate_profiles.contains_key(d) => invalid(format!(
            "profiles.{name}.default_certificate_profile {d:?} is not one of its certificate profiles ({})",
            p.certificate_profiles
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )),
        None if p.certificate_profiles.len() > 1 => invalid(format!(
            "profiles.{name} has several certificate profiles: say which an order without `profile` gets, e.g. default_certificate_profile = \"{}\"",
            p.certificate_profiles
                .keys()
                .next()
                .map(String::as_str)
                .unwrap_or("classic")
        )),
        _ => Ok(()),
    }
}

/// A webhook that could never be delivered is refused at start-up.
fn check_webhook(profile: &str, name: &str, w: &WebhookConfig) -> Result<(), ConfigError> {
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
fn check_email(profile: &str, name: &str, e: &EmailConfig) -> Result<(), ConfigError> {
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

/// The relay settings that must agree with each other.
fn check_relay(name: &str, r: &RelayConfig) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if r.directory.is_empty() {
        return invalid(format!(
            "profiles.{name}.signer.directory is missing: write the upstream CA's directory URL, e.g. directory = \"https://acme-v02.api.letsencrypt.org/directory\""
        ));
    }
    if !r.directory.starts_with("https://") {
        return invalid(format!(
            "profiles.{name}.signer.directory {:?} must be an https:// URL (RFC 8555 §6.1)",
            r.directory
        ));
    }
    match (r.strategy, &r.dns01) {
        (RelayStrategy::Dns01, None) => {
            return invalid(format!(
                "profiles.{name}.signer.strategy is \"dns01\" but [profiles.{name}.signer.dns01] is missing: write server, zones, tsig_key_name and tsig_secret_file there"
            ));
        }
        (RelayStrategy::Http01 | RelayStrategy::Bypass, Some(_)) => {
            return invalid(format!(
                "profiles.{name}.signer.dns01 is set but strategy is not \"dns01\": remove the section or write strategy = \"dns01\""
            ));
        }
        _ => {}
    }
    if r.max_attempts == 0 {
        return invalid(format!(
            "profiles.{name}.signer.max_attempts must be at least 1; write e.g. max_attempts = 200"
        ));
    }
    if let Some(d) = &r.dns01 {
        if !TSIG_ALGORITHMS.contains(&d.tsig_algorithm.as_str()) {
            return invalid(format!(
                "profiles.{name}.signer.dns01.tsig_algorithm {:?} is not supported; write one of {TSIG_ALGORITHMS:?}",
                d.tsig_algorithm
            ));
        }
        if d.zones.is_empty() {
            return invalid(format!(
                "profiles.{name}.signer.dns01.zones is empty: write the zones the server is primary for, e.g. zones = [\"example.org\"]"
            ));
        }
    }
    Ok(())
}

/// Configuration problems found at start-up, each saying what to write.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {0}")]
    Invalid(String),
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
    /// Loads the file (if any) and the environment, then checks the result.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
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
        figment = figment.merge(
            Env::prefixed("ACME_PROXY_")
                .filter(|key| !is_service_link(key.as_str()))
                .split("__")
                // ACME_PROXY_CONFIG names the file; it is not a key.
                .ignore(&["config"]),
        );
        let mut config = Self::from_figment(figment)?;
        config.ignored_environment = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| k.strip_prefix("ACME_PROXY_").is_some_and(is_service_link))
            .collect();
        config.ignored_environment.sort();
        Ok(config)
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
        if self.profiles.is_empty() {
            return Err(ConfigError::Invalid(
                "no profiles: add at least one [profiles.NAME] table, e.g. [profiles.default]"
                    .into(),
            ));
        }
        for (name, profile) in &self.profiles {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            {
                return Err(ConfigError::Invalid(format!(
                    "profile name {name:?} must be lowercase letters, digits, '-' or '_' (it is part of URLs)"
                )));
            }
            if profile.caa && profile.caa_identities.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "profiles.{name}.caa is on but caa_identities is empty: write the issuer domain names CAA records must name, e.g. caa_identities = [\"acme.example.internal\"]"
                )));
            }
            if profile.challenges.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "profiles.{name}.challenges is empty; write challenges = [\"http-01\"]"
                )));
            }
            for (hook_name, hook) in &profile.notify.webhooks {
                check_webhook(name, hook_name, hook)?;
            }
            for (script_name, script) in &profile.notify.scripts {
                let key = format!("profiles.{name}.notify.scripts.{script_name}");
                if !script.command.is_absolute() {
                    return Err(ConfigError::Invalid(format!(
                        "{key}.command must be an absolute path (no shell runs it), e.g. command = \"/usr/local/bin/notify-pki\""
                    )));
                }
            }
            for (email_name, email) in &profile.notify.emails {
                check_email(name, email_name, email)?;
            }
            check_certificate_profiles(name, profile)?;
            let ca = match &profile.signer {
                SignerConfig::LocalCa(ca) => ca,
                SignerConfig::Relay(relay) => {
                    check_relay(name, relay)?;
                    continue;
                }
                SignerConfig::Custom(custom) => {
                    check_custom(name, custom)?;
                    continue;
                }
            };
            let [from, to] = ca.renewal_window;
            if !(0.0..1.0).contains(&from) || !(from..=1.0).contains(&to) || to - from < 0.01 {
                return Err(ConfigError::Invalid(format!(
                    "profiles.{name}.signer.renewal_window must be two fractions of the lifetime, 0 ≤ start < end ≤ 1, at least 0.01 apart; write e.g. renewal_window = [0.6, 0.8]"
                )));
            }
            if let Some(p11) = &ca.pkcs11 {
                let key = format!("profiles.{name}.signer.pkcs11");
                if ca.ca_cert.is_none() || ca.ca_key.is_some() {
                    return Err(ConfigError::Invalid(format!(
                        "{key}: the key is in the token, so write ca_cert (the CA certificate of that key) and no ca_key"
                    )));
                }
                if p11.token_label.is_some() == p11.slot.is_some() {
                    return Err(ConfigError::Invalid(format!(
                        "{key}: name the token by token_label = \"…\" or by slot = N (one of them)"
                    )));
                }
                if p11.key_label.is_none() && p11.key_id.is_none() {
                    return Err(ConfigError::Invalid(format!(
                        "{key}: name the key by key_label = \"…\" and/or key_id = \"hex\""
                    )));
                }
                if p11
                    .key_id
                    .as_deref()
                    .is_some_and(|h| hex::decode(h).is_err())
                {
                    return Err(ConfigError::Invalid(format!(
                        "{key}.key_id must be hex, e.g. key_id = \"01\""
                    )));
                }
                if !p11.module.is_absolute() || !p11.pin_file.is_absolute() {
                    return Err(ConfigError::Invalid(format!(
                        "{key}: module and pin_file must be absolute paths"
                    )));
                }
                if p11.timeout < Duration::from_secs(1) || p11.timeout > Duration::from_secs(60) {
                    return Err(ConfigError::Invalid(format!(
                        "{key}.timeout must be between 1s and 60s (a signing runs inside the client's finalize request); write e.g. timeout = \"10s\""
                    )));
                }
            } else if ca.ca_cert.is_some() != ca.ca_key.is_some() {
                return Err(ConfigError::Invalid(format!(
                    "profiles.{name}.signer: set both ca_cert and ca_key (the operator's CA), or neither (a self-generated CA)"
                )));
            }
            if ca.chain.is_some() && ca.ca_cert.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "profiles.{name}.signer.chain needs ca_cert and ca_key: a self-generated CA has no chain above it"
                )));
            }
            if ca.validity < Duration::from_secs(60) {
                return Err(ConfigError::Invalid(format!(
                    "profiles.{name}.signer.validity is shorter than a minute; write e.g. validity = \"90d\""
                )));
            }
        }
        if let Some(url) = &self.public_url
            && (!(url.starts_with("http://") || url.starts_with("https://")) || url.ends_with('/'))
        {
            return Err(ConfigError::Invalid(format!(
                "public_url {url:?} must start with http:// or https:// and have no trailing slash, e.g. \"https://acme.example.internal\""
            )));
        }
        if let Some(tls) = &self.tls {
            match (&tls.cert, &tls.key, tls.self_signed) {
                (Some(_), Some(_), false) | (None, None, true) => {}
                _ => {
                    return Err(ConfigError::Invalid(
                        "[tls]: write cert and key (PEM files), or self_signed = true, not both"
                            .into(),
                    ));
                }
            }
            if tls.handshake_timeout < Duration::from_millis(100)
                || tls.reload_interval < Duration::from_secs(1)
            {
                return Err(ConfigError::Invalid(
                    "[tls]: handshake_timeout must be at least 100ms and reload_interval at least 1s; write e.g. handshake_timeout = \"10s\", reload_interval = \"30s\"".into(),
                ));
            }
            if tls.self_signed && self.public_url.is_none() && self.listen.ip().is_unspecified() {
                return Err(ConfigError::Invalid(format!(
                    "[tls] self_signed needs a name clients use, and listen is {}: set public_url = \"https://acme.example.internal:{}\"",
                    self.listen,
                    self.listen.port()
                )));
            }
            if let Some(url) = &self.public_url
                && url.starts_with("http://")
            {
                return Err(ConfigError::Invalid(format!(
                    "public_url {url:?} is http:// but [tls] serves https://; write public_url = \"https://…\""
                )));
            }
        }
        if self.audit.reverse_name_timeout > Duration::from_secs(5) {
            return Err(ConfigError::Invalid(
                "audit.reverse_name_timeout is over 5s, and it delays the requests it audits; write e.g. reverse_name_timeout = \"300ms\" (or reverse_names = false)".into(),
            ));
        }
        if self
            .audit
            .retention
            .is_some_and(|r| r < Duration::from_secs(86400))
        {
            return Err(ConfigError::Invalid(
                "audit.retention is shorter than a day; write e.g. retention = \"400d\" (or leave it out to keep every row)".into(),
            ));
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
        )?;
        at_least(
            "validation.timeout",
            self.validation.timeout,
            Duration::from_secs(1),
            "10s",
        )?;
        let j = &self.jobs;
        at_least(
            "jobs.poll_interval",
            j.poll_interval,
            Duration::from_millis(10),
            "1s",
        )?;
        at_least("jobs.lease", j.lease, Duration::from_millis(300), "15s")?;
        at_least(
            "jobs.attempt_budget",
            j.attempt_budget,
            Duration::from_millis(10),
            "5m",
        )?;
        at_least(
            "jobs.backoff_base",
            j.backoff_base,
            Duration::from_millis(1),
            "2s",
        )?;
        at_least("jobs.backoff_cap", j.backoff_cap, j.backoff_base, "10m")?;
        at_least("jobs.retention", j.retention, Duration::from_secs(60), "7d")?;
        if j.concurrency == 0 || j.max_attempts == 0 {
            return Err(ConfigError::Invalid(
                "jobs.concurrency and jobs.max_attempts must be at least 1; write e.g. concurrency = 16 and max_attempts = 10 under [jobs]".into(),
            ));
        }
        for (name, p) in &self.profiles {
            if p.max_identifiers == 0 || p.max_pending_authorizations == 0 {
                return Err(ConfigError::Invalid(format!(
                    "profiles.{name}.max_identifiers and profiles.{name}.max_pending_authorizations must be at least 1; write e.g. max_identifiers = 100 and max_pending_authorizations = 300"
                )));
            }
            at_least(
                &format!("profiles.{name}.order_lifetime"),
                p.order_lifetime,
                Duration::from_secs(60),
                "7d",
            )?;
            at_least(
                &format!("profiles.{name}.authorization_lifetime"),
                p.authorization_lifetime,
                Duration::from_secs(60),
                "30d",
            )?;
            match &p.signer {
                SignerConfig::LocalCa(ca) => at_least(
                    &format!("profiles.{name}.signer.crl_validity"),
                    ca.crl_validity,
                    Duration::from_secs(3600),
                    "1d",
                )?,
                SignerConfig::Custom(_) => {}
                SignerConfig::Relay(r) => {
                    at_least(
                        &format!("profiles.{name}.signer.request_timeout"),
                        r.request_timeout,
                        Duration::from_millis(100),
                        "10s",
                    )?;
                    at_least(
                        &format!("profiles.{name}.signer.attempt_budget"),
                        r.attempt_budget,
                        r.request_timeout * 2,
                        "5m",
                    )?;
                    at_least(
                        &format!("profiles.{name}.signer.poll_interval"),
                        r.poll_interval,
                        Duration::from_millis(10),
                        "1s",
                    )?;
                }
            }
        }
        if self.max_in_flight == 0 {
            return Err(ConfigError::Invalid(
                "max_in_flight must be at least 1".into(),
            ));
        }
        if self.jobs.validations_per_account == 0 {
            return Err(ConfigError::Invalid(
                "jobs.validations_per_account must be at least 1; write e.g. validations_per_account = 8".into(),
            ));
        }
        let c = &self.connections;
        if c.max_open == 0 || c.max_open_per_client == 0 || c.h2_max_concurrent_streams == 0 {
            return Err(ConfigError::Invalid(
                "connections.max_open, connections.max_open_per_client and connections.h2_max_concurrent_streams must be at least 1; write e.g. max_open_per_client = 64".into(),
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
            )?;
        }
        // A copy older than a minute would let another process's change to
        // an account (the admin CLI's deactivation) go unseen by reads for
        // longer than an operator expects.
        if self.account_cache_ttl > Duration::from_secs(60) {
            return Err(ConfigError::Invalid(format!(
                "account_cache_ttl is {:?}, longer than a minute; write e.g. account_cache_ttl = \"1s\" (or \"0s\" to read the account for every request)",
                self.account_cache_ttl
            )));
        }
        Ok(())
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
}

/// "10.0.0.0/8" or a bare "10.1.2.3" (a network of one address).
fn addresses_or_networks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|s| {
            s.parse::<ipnet::IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    serde::de::Error::custom(format!(
                        "{s:?} is not an address or a CIDR network; write e.g. \"10.0.0.0/8\" or \"192.0.2.10\""
                    ))
                })
        })
        .collect()
}

/// As [`duration`], for optional keys.
fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// Deserialises "90d", "1h 30m", "10s" (humantime) into a Duration.
fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "{s:?} is not a duration ({e}); write e.g. \"90d\", \"12h\" or \"30s\""
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Every key, as a dotted path; a new key must be added here and to
    /// `acme-proxy.example.toml`, which this test checks against.
    const EVERY_KEY: &[&str] = &[
        "listen",
        "public_url",
        "trusted_proxies",
        "forwarded_header",
        "tls.cert",
        "tls.key",
        "tls.self_signed",
        "tls.reload_interval",
        "tls.handshake_timeout",
        "data_dir",
        "database_url",
        "log_format",
        "max_body_bytes",
        "max_in_flight",
        "nonce_lifetime",
        "nonce_store",
        "account_cache_ttl",
        "shutdown_grace",
        "connections.max_open",
        "connections.max_open_per_client",
        "connections.header_read_timeout",
        "connections.body_read_timeout",
        "connections.idle_timeout",
        "connections.h2_keep_alive_interval",
        "connections.h2_keep_alive_timeout",
        "connections.h2_max_concurrent_streams",
        "validation.http_port",
        "validation.tls_port",
        "validation.timeout",
        "validation.dns_resolvers",
        "validation.resolv_conf",
        "validation.deny_networks",
        "validation.allow_networks",
        "validation.caa_recheck_after",
        "jobs.concurrency",
        "jobs.validations_per_account",
        "jobs.poll_interval",
        "jobs.lease",
        "jobs.attempt_budget",
        "jobs.max_attempts",
        "jobs.backoff_base",
        "jobs.backoff_cap",
        "jobs.retention",
        "profiles.default.bypass",
        "profiles.default.challenges",
        "profiles.default.terms_of_service",
        "profiles.default.website",
        "profiles.default.caa_identities",
        "profiles.default.order_lifetime",
        "profiles.default.authorization_lifetime",
        "profiles.default.caa",
        "profiles.default.ip_identifiers",
        "profiles.default.max_identifiers",
        "profiles.default.max_pending_authorizations",
        "profiles.default.authorization_reuse",
        "profiles.default.signer.type",
        "profiles.default.signer.ca_cert",
        "profiles.default.signer.ca_key",
        "profiles.default.signer.chain",
        "profiles.default.signer.validity",
        "profiles.default.signer.backdate",
        "profiles.default.signer.crl_url",
        "profiles.default.signer.issuer_url",
        "profiles.default.signer.crl_validity",
        "profiles.default.signer.renewal_window",
        "profiles.default.signer.pkcs11.module",
        "profiles.default.signer.pkcs11.token_label",
        "profiles.default.signer.pkcs11.slot",
        "profiles.default.signer.pkcs11.key_label",
        "profiles.default.signer.pkcs11.key_id",
        "profiles.default.signer.pkcs11.pin_file",
        "profiles.default.signer.pkcs11.timeout",
        "profiles.default.eab",
        "profiles.default.renewal_info_retry_after",
        "profiles.default.default_certificate_profile",
        "profiles.default.certificate_profiles.classic.description",
        "profiles.default.certificate_profiles.shortlived.validity",
        "profiles.default.certificate_profiles.tlsclient.key_usages",
        "profiles.default.certificate_profiles.tlsclient.extended_key_usages",
        "profiles.default.certificate_profiles.tlsclient.identifier_types",
        "profiles.default.certificate_profiles.tlsclient.wildcards",
        "profiles.legacy.signer.command",
        "profiles.legacy.signer.args",
        "profiles.legacy.signer.timeout",
        "profiles.legacy.signer.bad_csr_exit_code",
        "profiles.legacy.signer.ca_cert",
        "profiles.legacy.signer.revoke.command",
        "profiles.legacy.signer.crl.command",
        "profiles.legacy.signer.renewal_window.command",
        "notify.templates_dir",
        "metrics.listen",
        "audit.retention",
        "audit.reverse_names",
        "audit.reverse_name_timeout",
        "profiles.default.notify.webhooks.ops.url",
        "profiles.default.notify.webhooks.ops.method",
        "profiles.default.notify.webhooks.ops.headers",
        "profiles.default.notify.webhooks.ops.template",
        "profiles.default.notify.webhooks.ops.content_type",
        "profiles.default.notify.webhooks.ops.events",
        "profiles.default.notify.webhooks.ops.timeout",
        "profiles.default.notify.scripts.ticket.command",
        "profiles.default.notify.scripts.ticket.args",
        "profiles.default.notify.scripts.ticket.events",
        "profiles.default.notify.scripts.ticket.timeout",
        "profiles.default.notify.emails.pki.host",
        "profiles.default.notify.emails.pki.port",
        "profiles.default.notify.emails.pki.tls",
        "profiles.default.notify.emails.pki.trust_anchors",
        "profiles.default.notify.emails.pki.username",
        "profiles.default.notify.emails.pki.password_file",
        "profiles.default.notify.emails.pki.from",
        "profiles.default.notify.emails.pki.to",
        "profiles.default.notify.emails.pki.subject_template",
        "profiles.default.notify.emails.pki.body_template",
        "profiles.default.notify.emails.pki.events",
        "profiles.default.notify.emails.pki.timeout",
        "profiles.edge.signer.type",
        "profiles.edge.signer.directory",
        "profiles.edge.signer.account_key",
        "profiles.edge.signer.contact",
        "profiles.edge.signer.trust_anchors",
        "profiles.edge.signer.strategy",
        "profiles.edge.signer.poll_interval",
        "profiles.edge.signer.attempt_budget",
        "profiles.edge.signer.request_timeout",
        "profiles.edge.signer.propagation_wait",
        "profiles.edge.signer.max_attempts",
        "profiles.edge.signer.dns01.server",
        "profiles.edge.signer.dns01.zones",
        "profiles.edge.signer.dns01.tsig_key_name",
        "profiles.edge.signer.dns01.tsig_algorithm",
        "profiles.edge.signer.dns01.tsig_secret_file",
        "profiles.edge.signer.dns01.ttl",
    ];

    #[test]
    fn the_example_configuration_parses_and_documents_every_key() {
        let text = include_str!("../../../acme-proxy.example.toml");
        Config::from_toml(text).unwrap();
        // Keys shown commented out count as documented: strip the comment
        // markers and parse again, keeping the tables in place.
        // The commented-out example profiles at the end are not parsed.
        let documented = text
            .split("\n# [profiles.staging]\n")
            .next()
            .unwrap_or(text);
        let uncommented: String = documented
            .lines()
            .map(|l| {
                let t = l.trim_start();
                let is_key = |rest: &str| {
                    rest.split_once(" = ").is_some_and(|(k, _)| {
                        !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    })
                };
                // The commented-out relay profile's tables count too.
                let is_table = |rest: &str| {
                    rest.starts_with("[profiles.edge")
                        || rest.starts_with("[profiles.legacy")
                        || rest.starts_with("[profiles.default.certificate_profiles")
                        || rest.starts_with("[profiles.default.signer.pkcs11")
                        || rest.starts_with("[profiles.default.notify")
                        || rest.starts_with("[notify]")
                        || rest.starts_with("[metrics]")
                        || rest.starts_with("[tls]")
                        || rest.starts_with("[audit]")
                };
                match t.strip_prefix("# ") {
                    Some(rest) if is_key(rest) || is_table(rest) => rest,
                    _ => l,
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let value: figment::value::Value = Figment::from(Toml::string(&uncommented))
            .extract()
            .unwrap_or_else(|e| panic!("{e}"));
        for key in EVERY_KEY {
            assert!(
                value.find_ref(key).is_some(),
                "{key} is not documented in acme-proxy.example.toml"
            );
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
        let ok = Config::from_toml(
            "[profiles.edge.signer]\ntype = \"relay\"\ndirectory = \"https://ca.example/dir\"\nstrategy = \"http01\"",
        )
        .unwrap();
        let SignerConfig::Relay(r) = &ok.profiles["edge"].signer else {
            panic!("not a relay")
        };
        assert_eq!(r.strategy, RelayStrategy::Http01);
        assert_eq!(
            r.account_key_path(Path::new("/d"), "edge"),
            PathBuf::from("/d/upstream/edge.key")
        );
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
}
