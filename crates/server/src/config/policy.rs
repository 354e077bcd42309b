//! `[policy]`: named checks about a request and ordered rules over them
//! (the engine is `crate::policy`, which also refuses rules that cannot
//! be evaluated; this file is only their syntax).

#[allow(unused_imports)]
use super::*;

/// Who may ask for what: checks, and the rules that combine them.
#[derive(Clone, Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Named questions about a request, each answered true, false or
    /// undecided; rules refer to them by name, at any profile.
    pub checks: BTreeMap<String, CheckConfig>,
    /// In order; the first rule whose `when` is true at a stage decides
    /// there. When none is, the profile's `policy_default` decides.
    pub rules: Vec<RuleConfig>,
}

/// Where in a client's work a rule is asked.
#[derive(
    Clone,
    Copy,
    Debug,
    Deserialize,
    serde::Serialize,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Every request to a profile's ACME URLs but its CRL and CA
    /// certificate, before anything is stored: 403 `unauthorized`.
    Connection,
    /// Each identifier of a newOrder: 403 `rejectedIdentifier`, one
    /// subproblem per refused identifier (RFC 8555 §6.7.1).
    NewOrder,
    /// Each name of the CSR at finalize: `badCSR`.
    Finalize,
}

impl Stage {
    pub const ALL: [Stage; 3] = [Stage::Connection, Stage::NewOrder, Stage::Finalize];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Connection => "connection",
            Stage::NewOrder => "new_order",
            Stage::Finalize => "finalize",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// What a rule (or a profile's default) does with a request. (Not a doc
// comment: the reference takes each key's own.)
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    #[default]
    Allow,
    Deny,
}

// Whether a deny rule refuses, or only records what it would refuse: with
// `Warn` the request goes through, and the would-be refusal is logged,
// audited (`policy.warned`) and counted.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RuleMode {
    #[default]
    Enforce,
    Warn,
}

/// One rule.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Named in refusals, audit rows and metrics.
    pub name: String,
    /// Where it is asked: some of `connection`, `new_order`, `finalize`.
    #[serde(default = "default_rule_stages")]
    pub stages: Vec<Stage>,
    /// A condition over check names: `and`, `or`, `not`, parentheses,
    /// e.g. `"lab_names and not (lab_network or approved)"`.
    pub when: String,
    /// `allow` or `deny`.
    pub then: Effect,
    /// What a refused client is told (and the audit row says).
    #[serde(default)]
    pub message: String,
    /// `enforce`, or `warn`: let the request through, but audit, log and
    /// count what this rule would have refused.
    #[serde(default)]
    pub mode: RuleMode,
}

fn default_rule_stages() -> Vec<Stage> {
    vec![Stage::NewOrder, Stage::Finalize]
}

/// One named check, by `type`.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum CheckConfig {
    /// True when the client's address (after `trusted_proxies`) is in
    /// one of `networks`.
    ClientIp(ClientIpCheck),
    /// True when the client's address has a PTR name matching `names`
    /// that (with `forward_confirmed`) resolves back to the address.
    ReverseDns(ReverseDnsCheck),
    /// True when the identifier (at `new_order` and `finalize`) is of one
    /// of `types`, matches `allow` or `allow_regex` (or both are empty),
    /// and matches neither `deny` nor `deny_regex`.
    Identifiers(IdentifiersCheck),
    /// True when the account registered with an External Account Binding
    /// credential of one of `key_ids` or `labels`.
    Eab(EabCheck),
    /// True when the request is to one of `profiles`.
    Path(PathCheck),
    /// The operator's program decides: a JSON request on stdin; exit 0
    /// true, exit 1 false (its first line of output the reason); any
    /// other end, or the deadline, undecided.
    Program(ProgramCheck),
    /// True when the IP address management system of record gives the
    /// identifier to the client's address: for a DNS name, an address
    /// whose `dns_name` it is equals the client's (an address object on
    /// its own or on a device's or virtual machine's interface); for an IP
    /// identifier, it is the client's own address and is recorded. A
    /// lookup that fails or takes longer than `timeout` is undecided.
    Ipam(IpamCheck),
}

#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientIpCheck {
    /// Addresses or CIDR networks, e.g. `["10.20.0.0/16", "192.0.2.7"]`.
    #[serde(deserialize_with = "addresses_or_networks")]
    #[schemars(schema_with = "reference::networks")]
    pub networks: Vec<ipnet::IpNet>,
}

#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReverseDnsCheck {
    /// DNS name globs the PTR name must match (`*` is one label), e.g.
    /// `["*.lab.example.internal"]`.
    pub names: Vec<String>,
    /// Whether the PTR name must resolve (A or AAAA) back to the client's
    /// address: without it, whoever runs the reverse zone of an address
    /// can name it anything.
    #[serde(default = "yes")]
    pub forward_confirmed: bool,
    /// Deadline of the lookups of one client address (at most 5 s); past
    /// it the check is undecided. Answers are reused for a minute.
    #[serde(default = "default_reverse_dns_timeout", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub timeout: Duration,
}

fn default_reverse_dns_timeout() -> Duration {
    Duration::from_secs(1)
}

#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdentifiersCheck {
    /// DNS globs, where `*` is exactly one label (`*.lab.test` matches
    /// `a.lab.test`, not `a.b.lab.test`), and, for IP identifiers,
    /// addresses or CIDR networks.
    #[serde(default)]
    pub allow: Vec<String>,
    /// As `allow`; a match makes the check false.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Regular expressions over the whole identifier (anchored at both
    /// ends), e.g. `"web[0-9]+\\.lab\\.test"`.
    #[serde(default)]
    pub allow_regex: Vec<String>,
    /// As `allow_regex`; a match makes the check false.
    #[serde(default)]
    pub deny_regex: Vec<String>,
    /// The identifier types it can be true for.
    #[serde(
        default = "default_identifier_types",
        deserialize_with = "identifier_types"
    )]
    #[schemars(schema_with = "super::reference::identifier_types")]
    pub types: Vec<IdentifierType>,
    /// Whether a wildcard name (`*.lab.test`) can make it true.
    #[serde(default = "yes")]
    pub wildcards: bool,
}

#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EabCheck {
    /// Credential key ids (`acme-proxy eab list`).
    #[serde(default)]
    pub key_ids: Vec<String>,
    /// Credential labels (`eab create --label`).
    #[serde(default)]
    pub labels: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathCheck {
    /// Profile names.
    pub profiles: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProgramCheck {
    /// The program (absolute path), run without a shell, with a cleared
    /// environment.
    pub command: PathBuf,
    /// Static arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Deadline of one run (at most 10 s: a client waits for it); past
    /// it the program is killed and the check is undecided.
    #[serde(
        default = "default_program_check_timeout",
        deserialize_with = "duration"
    )]
    #[schemars(schema_with = "super::reference::duration")]
    pub timeout: Duration,
}

fn default_program_check_timeout() -> Duration {
    Duration::from_secs(2)
}

#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IpamCheck {
    /// The system of record: `netbox` (its REST API, version 4).
    pub source: IpamSource,
    /// Its base URL, e.g. `https://netbox.example.internal` (the API is
    /// under `/api/`). Reached as `[egress]` says.
    pub url: String,
    /// A file holding the API token, readable by the server's user only
    /// (start-up refuses one open to others). A NetBox v2 token
    /// (`nbt_KEY.TOKEN`) is sent as `Bearer`, a 40-character v1 token as
    /// `Token`. It needs only read access to IP addresses.
    pub token_file: PathBuf,
    /// PEM CA certificates trusted for an https:// `url`, besides the
    /// system's.
    #[serde(default)]
    pub trust_anchors: Vec<PathBuf>,
    /// The address statuses that make an address the client's (NetBox's
    /// status values); a `reserved` or `deprecated` one gives nothing.
    #[serde(default = "default_ipam_statuses")]
    pub statuses: Vec<String>,
    /// Deadline of one lookup (at most 10 s: a client waits for it); past
    /// it the check is undecided.
    #[serde(default = "default_ipam_timeout", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub timeout: Duration,
    /// How long a true or false answer is reused for the same client
    /// address and identifier (at most 10 minutes; `"0s"` asks every
    /// time). An undecided one never is.
    #[serde(default = "default_ipam_cache_for", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub cache_for: Duration,
}

/// The IP address management systems an `ipam` check can ask.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IpamSource {
    /// NetBox's REST API (`/api/ipam/ip-addresses/`).
    Netbox,
}

fn default_ipam_statuses() -> Vec<String> {
    ["active", "dhcp", "slaac"].map(String::from).to_vec()
}

fn default_ipam_timeout() -> Duration {
    Duration::from_secs(2)
}

fn default_ipam_cache_for() -> Duration {
    Duration::from_secs(60)
}
