//! Each profile's `[profiles.P.signer]`: the embedded CA, a custom program or a relay.

#[allow(unused_imports)]
use super::*;

/// How certificates are produced.
// One value per profile, read once per (re)load: a relay's upstreams make
// its variant the largest, and boxing it would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SignerConfig {
    LocalCa(LocalCaConfig),
    Relay(RelayConfig),
    Custom(CustomConfig),
}

/// The custom signer: the operator's program signs, run without a shell, with a cleared environment and a
/// deadline; optional operations for revocation, the CRL and the renewal
/// window are programs of their own.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
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
    #[schemars(schema_with = "super::reference::duration")]
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
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomOperation {
    pub command: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
}

pub(crate) fn default_custom_timeout() -> Duration {
    Duration::from_secs(20)
}

pub(crate) fn default_bad_csr_exit_code() -> i32 {
    65
}

/// The custom signer's programs must be absolute paths and its deadline
/// fit inside a client's request.
pub(crate) fn check_custom(name: &str, c: &CustomConfig) -> Result<(), ConfigError> {
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
/// upstream account per profile and upstream. The table describes the
/// preferred upstream; `[[fallback]]` tables name more, in priority order.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// The upstream's name, as `upstream register --upstream` and
    /// `upstream status` call it; `primary` unless set. A fallback must
    /// have one.
    pub name: String,
    /// The upstream's directory URL (https).
    pub directory: String,
    /// The upstream account key (PKCS#8 PEM), created 0600 by `acme-proxy
    /// upstream register`; defaults to `{data_dir}/upstream/{profile}.key`
    /// (a fallback's: `{data_dir}/upstream/{profile}.{name}.key`).
    pub account_key: Option<PathBuf>,
    /// Contact URLs given at registration (`mailto:ops@example.org`).
    pub contact: Vec<String>,
    /// PEM files of CA certificates trusted for the upstream's TLS, in
    /// addition to the system roots (a private CA, a test CA).
    pub trust_anchors: Vec<PathBuf>,
    /// How the upstream's challenges are answered: `dns01`, `dns01_delegated`
    /// (through `[dns_zone]`), `http01` or `bypass`.
    pub strategy: RelayStrategy,
    /// Polling interval when the upstream gives no `Retry-After`.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub poll_interval: Duration,
    /// Time budget of one attempt of the relay job.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub attempt_budget: Duration,
    /// Time budget of one upstream HTTP request (a black-holed request costs
    /// this, then a backoff — not the whole attempt).
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub request_timeout: Duration,
    /// Attempts of one relay before it is abandoned (the order's expiry
    /// bounds it too). Higher than `[jobs] max_attempts` by default: with
    /// the backoff cap, 200 attempts ride out more than a day of upstream
    /// outage instead of half an hour. Waits for an open breaker, a pause
    /// or a budget are not attempts.
    pub max_attempts: u32,
    /// dns01: wait this long after publishing before telling the upstream.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub propagation_wait: Duration,
    /// dns01: where and how to publish TXT records (RFC 2136 + TSIG).
    pub dns01: Option<Rfc2136Config>,
    /// How this profile reaches its upstream, replacing the global
    /// `[egress]` table as a whole.
    pub egress: Option<EgressConfig>,
    /// At most this many new upstream orders per period, e.g. `"10/1m"`:
    /// sent one every period / N, never in a burst, so that no period holds
    /// more than N. Finalizes past it wait in the queue for their turn.
    /// Counted in the database: every replica shares it. Absent: no budget.
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub upstream_orders: Option<super::Rate>,
    /// At most this many new upstream orders per registered domain (one
    /// label below its public suffix, as the upstream counts certificates)
    /// per period, e.g. `"50/1w"`: N at once, then one more every
    /// period / N. An order takes a place of each domain it names when it
    /// is sent (given back if the upstream answers that it made nothing);
    /// finalizes past it wait in the queue. Absent: no budget.
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub upstream_certificates_per_domain: Option<super::Rate>,
    /// At most this many failed upstream validations of one identifier per
    /// period, e.g. `"5/1h"` (Let's Encrypt's authorization failures per
    /// identifier per account): past it, new orders naming it wait in the
    /// queue until the window frees instead of failing upstream again.
    /// Absent: no budget.
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub upstream_failed_validations: Option<super::Rate>,
    /// At most this many upstream authorizations held by the profile's
    /// relays in flight (one per identifier, from when an order is sent
    /// upstream until it settles), e.g. `300` (Let's Encrypt's pending
    /// authorizations per account): past it, new orders wait in the queue
    /// and look again every 5 s (an order bigger than the budget goes
    /// alone, when none is in flight). Absent: no budget.
    pub upstream_pending_authorizations: Option<u32>,
    /// Requests in a row that find the upstream down (no answer within
    /// `request_timeout`, a 5xx, a page that is not ACME) before its
    /// circuit breaker opens: relays then wait in the queue instead of
    /// asking, and one probe (the directory and a fresh nonce) every
    /// `breaker_open_for` asks whether it is back. Kept in the database:
    /// every job and replica shares it. A 429 or `Retry-After` is not a
    /// failure (it pauses the upstream instead).
    pub breaker_failures: u32,
    /// How long an open breaker holds requests back before the next probe.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub breaker_open_for: Duration,
    /// The upstream's name of each of the profile's certificate profiles
    /// that it calls otherwise (draft-ietf-acme-profiles), e.g.
    /// `{ brief = "shortlived" }`; a profile not listed is asked for by
    /// its own name. Each upstream has its own.
    pub upstream_profiles: BTreeMap<String, String>,
    /// Further upstreams, tried in this order for a new order while the
    /// ones before are down (their breaker open) or paused: each a table
    /// of the keys above with its own `name`, `directory` and account.
    /// An order stays on the upstream that accepted it. `max_attempts`
    /// and `fallback` are the profile's, set here only.
    #[schemars(schema_with = "super::reference::fallbacks")]
    pub fallback: Vec<RelayConfig>,
    /// How long an upstream that accepted an order may be down (its
    /// breaker open) before the order moves to the next upstream that is
    /// up, e.g. `"1h"`: only an order whose finalize was never sent
    /// there, so that no certificate is issued twice. Absent: an order
    /// waits for its upstream however long it is down (until it expires).
    #[serde(deserialize_with = "opt_duration")]
    #[schemars(schema_with = "super::reference::opt_duration")]
    pub failover_after: Option<Duration>,
    /// Refusals another upstream may not share, by ACME problem type, e.g.
    /// `["caa", "rejectedIdentifier"]`: an upstream that refuses a new
    /// order with one of them, or fails it with one before its finalize
    /// was sent, passes it to the next upstream instead of failing it.
    /// Empty: a refusal fails the order (the client hears it).
    #[serde(deserialize_with = "problem_types")]
    #[schemars(schema_with = "super::reference::problem_types")]
    pub failover_on: Vec<acme_proxy_protocol::ProblemType>,
}

/// How a relay profile answers the upstream's challenges.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RelayStrategy {
    /// RFC 2136 UPDATE of `_acme-challenge` TXT records, signed with TSIG.
    Dns01,
    /// The TXT records published in our own `[dns_zone]`, to which each
    /// `_acme-challenge` name is delegated by CNAME (`acme-proxy dns
    /// cname` prints the records); no key anywhere.
    Dns01Delegated,
    /// The key authorization served on our own `/.well-known/acme-challenge/`.
    Http01,
    /// The upstream already trusts the account (pre-validated domains).
    #[default]
    Bypass,
}

/// An RFC 2136 primary server that accepts TSIG-signed updates.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
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

pub(crate) fn default_tsig_algorithm() -> String {
    "hmac-sha256".to_owned()
}

pub(crate) fn default_txt_ttl() -> u32 {
    60
}

/// The TSIG algorithms accepted for RFC 2136 updates (RFC 8945 §6).
pub const TSIG_ALGORITHMS: [&str; 3] = ["hmac-sha256", "hmac-sha384", "hmac-sha512"];

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            name: PRIMARY_UPSTREAM.to_owned(),
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
            egress: None,
            upstream_orders: None,
            upstream_certificates_per_domain: None,
            upstream_failed_validations: None,
            upstream_pending_authorizations: None,
            breaker_failures: 5,
            breaker_open_for: Duration::from_secs(30),
            upstream_profiles: BTreeMap::new(),
            fallback: Vec::new(),
            failover_after: None,
            failover_on: Vec::new(),
        }
    }
}

/// The preferred upstream's name when the signer table gives none.
pub const PRIMARY_UPSTREAM: &str = "primary";

impl RelayConfig {
    /// The upstreams in priority order: this table, then its fallbacks.
    pub fn upstreams(&self) -> impl Iterator<Item = &RelayConfig> {
        std::iter::once(self).chain(&self.fallback)
    }

    /// The upstream named `name`, if any.
    pub fn upstream(&self, name: &str) -> Option<&RelayConfig> {
        self.upstreams().find(|u| u.name == name)
    }

    /// This upstream's name of the certificate profile `local`.
    pub fn upstream_profile<'a>(&'a self, local: &'a str) -> &'a str {
        self.upstream_profiles
            .get(local)
            .map_or(local, String::as_str)
    }

    /// Where the account key of this upstream of `profile` lives (absent
    /// `account_key`): the `preferred` upstream's is the file a profile of
    /// one upstream always had, a fallback's is named after it too.
    pub fn account_key_path(&self, data_dir: &Path, profile: &str, preferred: bool) -> PathBuf {
        self.account_key.clone().unwrap_or_else(|| {
            let file = if preferred {
                format!("{profile}.key")
            } else {
                format!("{profile}.{}.key", self.name)
            };
            data_dir.join("upstream").join(file)
        })
    }
}

#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
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
    #[schemars(schema_with = "super::reference::duration")]
    pub validity: Duration,
    /// notBefore is set this far in the past to absorb clock skew.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub backdate: Duration,
    /// CRL distribution point URL put in leaves; none by default.
    pub crl_url: Option<String>,
    /// AIA caIssuers URL put in leaves; none by default.
    pub issuer_url: Option<String>,
    /// How long each CRL is valid (nextUpdate − thisUpdate); re-signed at half.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
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
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
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
    /// finalize request. Opening the key (at start-up and at each reload:
    /// a session, a login, a test signature) may take twice it; past that
    /// the start or the reload is refused.
    #[serde(default = "default_pkcs11_timeout", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub timeout: Duration,
}

pub(crate) fn default_pkcs11_timeout() -> Duration {
    Duration::from_secs(10)
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

/// The relay settings that must agree with each other, of every upstream:
/// names unique, a fallback's own, and the profile's keys only on the
/// signer table.
pub(crate) fn check_relay(name: &str, r: &RelayConfig) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    let mut seen: Vec<&str> = Vec::new();
    for (i, u) in r.upstreams().enumerate() {
        let key = if i == 0 {
            format!("profiles.{name}.signer")
        } else {
            format!("profiles.{name}.signer.fallback[{}]", i - 1)
        };
        if u.name.is_empty()
            || !u
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return invalid(format!(
                "{key}.name {:?} must be letters, digits, - or _ (it names the upstream's account and key file); write e.g. name = \"zerossl\"",
                u.name
            ));
        }
        if i > 0 && u.name == PRIMARY_UPSTREAM {
            return invalid(format!(
                "{key}.name is missing (or \"{PRIMARY_UPSTREAM}\", the signer table's default): a fallback needs a name of its own, e.g. name = \"zerossl\""
            ));
        }
        if seen.contains(&u.name.as_str()) {
            return invalid(format!(
                "{key}.name {:?} names another upstream of the profile already; give each its own",
                u.name
            ));
        }
        seen.push(&u.name);
        if let Some(other) = r.upstreams().take(i).find(|o| {
            o.directory == u.directory
                || (o.account_key.is_some() && o.account_key == u.account_key)
        }) {
            return invalid(format!(
                "{key}: upstream {:?} has the directory or account_key of upstream {:?} already (one CA account, one breaker): list it once",
                u.name, other.name
            ));
        }
        if i > 0 {
            if !u.fallback.is_empty() {
                return invalid(format!(
                    "{key}.fallback: fallbacks are listed on the signer table only, as [[profiles.{name}.signer.fallback]]"
                ));
            }
            if u.max_attempts != RelayConfig::default().max_attempts {
                return invalid(format!(
                    "{key}.max_attempts is the profile's (a relay's attempts, whichever upstream): set it on [profiles.{name}.signer]"
                ));
            }
            if u.failover_after.is_some() || !u.failover_on.is_empty() {
                return invalid(format!(
                    "{key}: failover_after and failover_on are the profile's (when an order leaves any upstream): set them on [profiles.{name}.signer]"
                ));
            }
        }
        check_upstream(&key, u)?;
    }
    if (r.failover_after.is_some() || !r.failover_on.is_empty()) && r.fallback.is_empty() {
        return invalid(format!(
            "profiles.{name}.signer.failover_after or failover_on is set but the profile has no [[profiles.{name}.signer.fallback]] to move orders to: add one, or remove them"
        ));
    }
    if r.failover_after.is_some_and(|d| d < Duration::from_secs(1)) {
        return invalid(format!(
            "profiles.{name}.signer.failover_after must be at least 1s (how long an order's upstream is down before the order moves); write e.g. failover_after = \"1h\""
        ));
    }
    Ok(())
}

/// The settings of one upstream (the signer table or a `[[fallback]]`,
/// at `key`) that must agree with each other.
fn check_upstream(key: &str, r: &RelayConfig) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if r.directory.is_empty() {
        return invalid(format!(
            "{key}.directory is missing: write the upstream CA's directory URL, e.g. directory = \"https://acme-v02.api.letsencrypt.org/directory\""
        ));
    }
    if !r.directory.starts_with("https://") {
        return invalid(format!(
            "{key}.directory {:?} must be an https:// URL (RFC 8555 §6.1)",
            r.directory
        ));
    }
    match (r.strategy, &r.dns01) {
        (RelayStrategy::Dns01, None) => {
            return invalid(format!(
                "{key}.strategy is \"dns01\" but [{key}.dns01] is missing: write server, zones, tsig_key_name and tsig_secret_file there"
            ));
        }
        (
            RelayStrategy::Http01 | RelayStrategy::Bypass | RelayStrategy::Dns01Delegated,
            Some(_),
        ) => {
            return invalid(format!(
                "{key}.dns01 is set but strategy is not \"dns01\": remove the section or write strategy = \"dns01\""
            ));
        }
        _ => {}
    }
    if r.max_attempts == 0 {
        return invalid(format!(
            "{key}.max_attempts must be at least 1; write e.g. max_attempts = 200"
        ));
    }
    if let Some(d) = &r.dns01 {
        if !TSIG_ALGORITHMS.contains(&d.tsig_algorithm.as_str()) {
            return invalid(format!(
                "{key}.dns01.tsig_algorithm {:?} is not supported; write one of {TSIG_ALGORITHMS:?}",
                d.tsig_algorithm
            ));
        }
        if d.zones.is_empty() {
            return invalid(format!(
                "{key}.dns01.zones is empty: write the zones the server is primary for, e.g. zones = [\"example.org\"]"
            ));
        }
    }
    Ok(())
}
