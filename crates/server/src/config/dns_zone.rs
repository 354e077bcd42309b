//! The `[dns_zone]` table: the embedded authoritative DNS server for
//! delegated dns-01 challenges.

#[allow(unused_imports)]
use super::*;

/// An authoritative DNS server for zones that hold only challenge records
/// (TXT), to which the corporate DNS delegates `_acme-challenge` names by
/// CNAME; absent: none runs.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DnsZoneConfig {
    /// The zones it is authoritative for, e.g. `["acme.example.org"]`;
    /// every other name is REFUSED.
    pub zones: Vec<String>,
    /// Where it answers, over UDP and TCP on each address, e.g.
    /// `["192.0.2.53:53"]`. Port 0 picks one port free for both.
    pub listen: Vec<SocketAddr>,
    /// The zones' name servers (their NS records; the first is the SOA's
    /// primary), as the parent zone's delegation names them.
    pub nameservers: Vec<String>,
    /// The SOA's mailbox of the person responsible, as a name:
    /// `hostmaster.example.org` is hostmaster@example.org (RFC 1035 §3.3.13).
    #[serde(default = "default_dns_hostmaster")]
    pub hostmaster: String,
    /// TTL of the TXT, NS and SOA records. Short: a value is published for
    /// one validation.
    #[serde(default = "default_dns_ttl", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub ttl: Duration,
    /// How long resolvers may remember that a name or a type does not exist
    /// (the SOA's minimum, RFC 2308). Short: a value published after a
    /// resolver asked must be seen soon.
    #[serde(default = "default_dns_negative_ttl", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub negative_ttl: Duration,
    /// A TCP connection that sends no whole query for this long (counted
    /// from its start or its previous answer, however the query trickles
    /// in) is closed, as is one that takes no answer for this long.
    #[serde(default = "default_dns_tcp_idle", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub tcp_idle_timeout: Duration,
    /// TCP connections open at once, over every `listen` address; past it,
    /// a new one is closed as soon as it is accepted (UDP is not limited).
    #[serde(default = "default_dns_tcp_max_open")]
    pub tcp_max_open: usize,
    /// TCP connections open at once from one client (an IPv4 address, or
    /// an IPv6 network of `[connections] ipv6_client_prefix` bits); past
    /// it, as `tcp_max_open`.
    #[serde(default = "default_dns_tcp_max_open_per_client")]
    pub tcp_max_open_per_client: usize,
    /// An acme-dns-compatible HTTP API on the ACME listener, under
    /// `/acme-dns` (`POST /acme-dns/register`, `POST /acme-dns/update`),
    /// through which clients that speak it (lego's `acme-dns` provider,
    /// certbot's acme-dns hooks) publish their own dns-01 values in the
    /// first zone; absent: none.
    #[serde(default)]
    pub api: Option<DnsApiConfig>,
}

/// The `[dns_zone.api]` table.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DnsApiConfig {
    /// Who creates accounts: `open` (anyone allowed by `register_from`,
    /// through `POST /acme-dns/register`, as acme-dns does) or `operator`
    /// (only `acme-proxy dns account add`).
    #[serde(default)]
    pub registration: DnsRegistration,
    /// Client addresses (or CIDRs) that may register through the API;
    /// empty: any client that reaches the listener.
    #[serde(default, deserialize_with = "addresses_or_networks")]
    #[schemars(schema_with = "super::reference::networks")]
    pub register_from: Vec<ipnet::IpNet>,
    /// Registrations per client address (per /64 for IPv6) per hour; past
    /// it, 429.
    #[serde(default = "default_dns_registrations_per_hour")]
    pub registrations_per_hour: u32,
    /// Updates per account per minute, those with a wrong key included;
    /// past it, 429.
    #[serde(default = "default_dns_updates_per_minute")]
    pub updates_per_minute: u32,
    /// Accounts in all, those the operator adds with `acme-proxy dns
    /// account add` included (which it never refuses); at it, `POST
    /// /acme-dns/register` answers 403 `account_limit`.
    #[serde(default = "default_dns_max_accounts")]
    pub max_accounts: u64,
}

/// Who creates accounts of the acme-dns API.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DnsRegistration {
    /// Anyone allowed by `register_from`, through the API.
    #[default]
    Open,
    /// Only the operator, with `acme-proxy dns account add`.
    Operator,
}

pub(crate) fn default_dns_registrations_per_hour() -> u32 {
    20
}

pub(crate) fn default_dns_updates_per_minute() -> u32 {
    30
}

pub(crate) fn default_dns_max_accounts() -> u64 {
    10_000
}

pub(crate) fn default_dns_hostmaster() -> String {
    "hostmaster.invalid".into()
}

pub(crate) fn default_dns_ttl() -> Duration {
    Duration::from_secs(60)
}

pub(crate) fn default_dns_negative_ttl() -> Duration {
    Duration::from_secs(30)
}

pub(crate) fn default_dns_tcp_idle() -> Duration {
    Duration::from_secs(10)
}

/// BIND's `tcp-clients` default: DNS over TCP carries only answers too
/// large for UDP, which the zone's challenge records rarely are.
pub(crate) fn default_dns_tcp_max_open() -> usize {
    150
}

pub(crate) fn default_dns_tcp_max_open_per_client() -> usize {
    16
}

impl DnsZoneConfig {
    /// What is wrong with it, each with what to write instead.
    pub(crate) fn problems(&self) -> Vec<String> {
        use acme_proxy_protocol::names::check_dns_name;
        let mut problems = Vec::new();
        if self.zones.is_empty() {
            problems.push(
                "[dns_zone] zones is empty: write the delegated zone, e.g. zones = [\"acme.example.org\"]".into(),
            );
        }
        for zone in &self.zones {
            if check_dns_name(zone).is_err() || zone.starts_with("*.") {
                problems.push(format!(
                    "[dns_zone] zone {zone:?} is not a DNS name; write e.g. zones = [\"acme.example.org\"] (no final dot)"
                ));
            }
        }
        for (i, a) in self.zones.iter().enumerate() {
            for b in &self.zones[i + 1..] {
                let (a, b) = (a.to_ascii_lowercase(), b.to_ascii_lowercase());
                if a == b || a.ends_with(&format!(".{b}")) || b.ends_with(&format!(".{a}")) {
                    problems.push(format!(
                        "[dns_zone] zones {a:?} and {b:?} overlap; list each zone once, none inside another"
                    ));
                }
            }
        }
        if self.listen.is_empty() {
            problems.push(
                "[dns_zone] listen is empty: write where it answers, e.g. listen = [\"192.0.2.53:53\"]".into(),
            );
        }
        if self.nameservers.is_empty() {
            problems.push(
                "[dns_zone] nameservers is empty: write the names the parent zone delegates to, e.g. nameservers = [\"ns1.example.org\"]".into(),
            );
        }
        for ns in self
            .nameservers
            .iter()
            .chain(std::iter::once(&self.hostmaster))
        {
            if check_dns_name(ns).is_err() || ns.starts_with("*.") {
                problems.push(format!(
                    "[dns_zone] {ns:?} is not a DNS name; write e.g. nameservers = [\"ns1.example.org\"], hostmaster = \"hostmaster.example.org\""
                ));
            }
        }
        if self.ttl < Duration::from_secs(1)
            || self.ttl > Duration::from_secs(86400)
            || self.negative_ttl < Duration::from_secs(1)
            || self.negative_ttl > Duration::from_secs(86400)
        {
            problems.push(
                "[dns_zone] ttl and negative_ttl must be between 1s and 1d; write e.g. ttl = \"60s\", negative_ttl = \"30s\"".into(),
            );
        }
        if self.tcp_idle_timeout < Duration::from_secs(1)
            || self.tcp_idle_timeout > Duration::from_secs(120)
        {
            problems.push(
                "[dns_zone] tcp_idle_timeout must be between 1s and 2m; write e.g. tcp_idle_timeout = \"10s\"".into(),
            );
        }
        if self.tcp_max_open == 0 || self.tcp_max_open_per_client == 0 {
            problems.push(
                "[dns_zone] tcp_max_open and tcp_max_open_per_client must be at least 1; write e.g. tcp_max_open = 150, tcp_max_open_per_client = 16".into(),
            );
        }
        if let Some(api) = &self.api
            && (api.registrations_per_hour == 0 || api.updates_per_minute == 0)
        {
            problems.push(
                "[dns_zone.api] registrations_per_hour and updates_per_minute must be at least 1; write e.g. updates_per_minute = 30 (registration = \"operator\" stops registration through the API)".into(),
            );
        }
        if let Some(api) = &self.api
            && api.max_accounts == 0
        {
            problems.push(
                "[dns_zone.api] max_accounts must be at least 1; write e.g. max_accounts = 10000 (registration = \"operator\" stops registration through the API)".into(),
            );
        }
        for ns in &self.nameservers {
            let ns = ns.to_ascii_lowercase();
            if let Some(zone) = self.zones.iter().find(|z| {
                let z = z.to_ascii_lowercase();
                ns == z || ns.ends_with(&format!(".{z}"))
            }) {
                problems.push(format!(
                    "[dns_zone] name server {ns:?} is inside the zone {zone:?}, which serves only TXT records (no address for it); name a server outside the zone, e.g. nameservers = [\"ns1.example.org\"]"
                ));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::config::Config;

    fn refused(table: &str) -> String {
        Config::from_toml(&format!("[profiles.default]\n[dns_zone]\n{table}"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_dns_zone_with_a_mistake_stops_start_up_saying_what_to_write() {
        let good = "zones = [\"acme.example.org\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.example.org\"]\n";
        let config = Config::from_toml(&format!("[profiles.default]\n[dns_zone]\n{good}")).unwrap();
        let zone = config.dns_zone.unwrap();
        assert_eq!(zone.ttl, std::time::Duration::from_secs(60));
        assert!(zone.problems().is_empty());

        for (table, said) in [
            (
                "zones = []\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.example.org\"]\n",
                "zones is empty",
            ),
            (
                "zones = [\"acme.example.org.\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.example.org\"]\n",
                "is not a DNS name",
            ),
            (
                "zones = [\"example.org\", \"acme.example.org\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.example.org\"]\n",
                "overlap",
            ),
            (
                "zones = [\"acme.example.org\"]\nlisten = []\nnameservers = [\"ns1.example.org\"]\n",
                "listen is empty",
            ),
            (
                "zones = [\"acme.example.org\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = []\n",
                "nameservers is empty",
            ),
            (
                "zones = [\"acme.example.org\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.example.org\"]\nhostmaster = \"me@example.org\"\n",
                "is not a DNS name",
            ),
            (&format!("{good}ttl = \"0s\"\n"), "between 1s and 1d"),
            (&format!("{good}nameserver = \"x\"\n"), "nameserver"),
            (
                "zones = [\"acme.example.org\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.acme.example.org\"]\n",
                "inside the zone",
            ),
            (
                &format!("{good}[dns_zone.api]\nupdates_per_minute = 0\n"),
                "at least 1",
            ),
            (
                &format!("{good}[dns_zone.api]\nregistration = \"closed\"\n"),
                "operator",
            ),
            (
                &format!("{good}[dns_zone.api]\nregister_from = [\"lan\"]\n"),
                "lan",
            ),
        ] {
            let e = refused(table);
            assert!(e.contains(said), "{table}: {e}");
        }
    }

    #[test]
    fn a_relay_that_publishes_in_the_zone_needs_the_zone() {
        let relay = "[profiles.edge]\n[profiles.edge.signer]\ntype = \"relay\"\ndirectory = \"https://upstream.example/dir\"\nstrategy = \"dns01_delegated\"\n";
        let e = Config::from_toml(relay).unwrap_err().to_string();
        assert!(e.contains("there is no [dns_zone] to publish in"), "{e}");
        let with_zone = format!(
            "{relay}[dns_zone]\nzones = [\"acme.example.org\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.example.org\"]\n"
        );
        Config::from_toml(&with_zone).unwrap();
    }
}
