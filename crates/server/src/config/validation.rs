//! The `[validation]` table: how challenges are validated and where validation may connect.

#[allow(unused_imports)]
use super::*;

/// How challenges are validated (shared by all profiles).
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationConfig {
    /// Port http-01 connects to (RFC 8555 §8.3 says 80; tests use another).
    pub http_port: u16,
    /// Port tls-alpn-01 connects to (RFC 8737 says 443; tests use another).
    pub tls_port: u16,
    /// Time allowed for one validation, connection to answer.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
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
    #[schemars(schema_with = "super::reference::networks")]
    pub deny_networks: Vec<ipnet::IpNet>,
    /// Exceptions to `deny_networks`.
    #[serde(deserialize_with = "addresses_or_networks")]
    #[schemars(schema_with = "super::reference::networks")]
    pub allow_networks: Vec<ipnet::IpNet>,
    /// At finalize, CAA is looked up again for a name validated longer ago
    /// than this (profiles with `caa = true`).
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
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
