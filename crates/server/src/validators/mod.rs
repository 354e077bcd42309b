//! Validators: one module per challenge type (RFC 8555 §8), plus name
//! resolution with explicitly configurable DNS servers.
//!
//! A validator answers one question — did the client publish the right
//! thing? — and returns `Ok(())` or the problem that explains why not. It
//! never touches the store: the authority records the outcome and moves the
//! authorization and orders (Architecture Invariant: one writer per fact).

pub mod caa;
pub mod dns01;
pub mod http01;
pub mod tlsalpn01;

use acme_proxy_protocol::types::ChallengeType;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use acme_proxy_protocol::ProblemType;
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::NetError;
use hickory_resolver::net::runtime::TokioRuntimeProvider;

use crate::config::ValidationConfig;

/// Why a validation failed: the problem type recorded on the challenge and
/// a detail for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    pub kind: ProblemType,
    pub detail: String,
}

impl ValidationError {
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }
}

/// What a validation needs to know.
#[derive(Debug, Clone)]
pub struct ValidationTarget {
    pub identifier: String,
    pub token: String,
    /// `token || '.' || base64url(thumbprint(accountKey))` (RFC 8555 §8.1).
    pub key_authorization: String,
}

/// Where validation may connect (RFC 8555 §10.2: the validation client
/// must not become a way to reach what the requester cannot): an address
/// in `deny` and not in `allow` is never connected to.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    deny: Vec<ipnet::IpNet>,
    allow: Vec<ipnet::IpNet>,
}

impl Egress {
    pub fn new(deny: Vec<ipnet::IpNet>, allow: Vec<ipnet::IpNet>) -> Self {
        Self { deny, allow }
    }

    /// The network of `deny_networks` that refuses `ip`, if one does. An
    /// IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is judged as the
    /// IPv4 address it reaches.
    pub fn refusal(&self, ip: IpAddr) -> Option<ipnet::IpNet> {
        let ip = ip.to_canonical();
        if self.allow.iter().any(|n| n.contains(&ip)) {
            return None;
        }
        self.deny.iter().find(|n| n.contains(&ip)).copied()
    }
}

/// Shared validation machinery: the resolver and the http-01 client settings.
#[derive(Clone)]
pub struct Validators {
    pub(crate) resolver: Arc<TokioResolver>,
    /// Whom the resolver asks, for messages ("10.0.0.53:53", "the servers
    /// of /etc/resolv.conf").
    servers: String,
    pub egress: Egress,
    pub http_port: u16,
    pub tls_port: u16,
    pub timeout: Duration,
    /// How long a CAA lookup made at validation is relied on at finalize.
    pub caa_recheck_after: Duration,
    tls: Arc<rustls::ClientConfig>,
    tls_alpn: Arc<rustls::ClientConfig>,
    /// The zone of `[dns_zone]` that clients' dns-01 may be delegated to:
    /// a failed dns-01 then says where `_acme-challenge` points.
    pub delegation_zone: Option<String>,
}

impl std::fmt::Debug for Validators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validators")
            .field("http_port", &self.http_port)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Validators {
    pub fn new(config: &ValidationConfig) -> Result<Self, String> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = if config.dns_resolvers.is_empty() {
            let path = &config.resolv_conf;
            let text = std::fs::read(path)
                .map_err(|e| format!("reading validation.resolv_conf {}: {e}", path.display()))?;
            let (system, options) = hickory_resolver::system_conf::parse_resolv_conf(text)
                .map_err(|e| format!("reading validation.resolv_conf {}: {e}", path.display()))?;
            // The name servers only: a search list or a domain would make a
            // short name mean something the requester did not ask for.
            let (_, _, servers) = system.into_parts();
            let mut builder = TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), servers),
                provider,
            );
            *builder.options_mut() = options;
            builder
        } else {
            let mut rc = ResolverConfig::default();
            for server in &config.dns_resolvers {
                let mut udp = ConnectionConfig::udp();
                udp.port = server.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = server.port();
                rc.add_name_server(NameServerConfig::new(server.ip(), true, vec![udp, tcp]));
            }
            let mut builder = TokioResolver::builder_with_config(rc, provider);
            // Servers named in the configuration are the only source of
            // answers: /etc/hosts must not override what they say.
            builder.options_mut().use_hosts_file = hickory_resolver::config::ResolveHosts::Never;
            builder
        };
        // No caching: a client that fixes its DNS and retries must be seen
        // at once, and a negative answer must not outlive the attempt.
        builder.options_mut().cache_size = 0;
        builder.options_mut().timeout = config.timeout.min(Duration::from_secs(5));
        let resolver = builder
            .build()
            .map_err(|e| format!("building the DNS resolver: {e}"))?;
        let servers = if config.dns_resolvers.is_empty() {
            format!("the servers of {}", config.resolv_conf.display())
        } else {
            config
                .dns_resolvers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        Ok(Self {
            resolver: Arc::new(resolver),
            servers,
            egress: Egress::new(config.deny_networks.clone(), config.allow_networks.clone()),
            http_port: config.http_port,
            tls_port: config.tls_port,
            tls_alpn: Arc::new(
                http01::danger_unverified_tls_config(tlsalpn01::ACME_TLS_1)
                    .map_err(|e| format!("building the TLS client: {e}"))?,
            ),
            timeout: config.timeout,
            caa_recheck_after: config.caa_recheck_after,
            tls: Arc::new(
                http01::danger_unverified_tls_config(b"http/1.1")
                    .map_err(|e| format!("building the TLS client: {e}"))?,
            ),
            delegation_zone: None,
        })
    }

    /// Resolves a name to addresses, IPv6 first then IPv4 (as Boulder does),
    /// mapping failures to the `dns` problem.
    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, ValidationError> {
        if let Ok(ip) = name.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        // Always the absolute name: never completed with a search list,
        // whatever the resolver configuration says about ndots.
        let absolute = if name.ends_with('.') {
            name.to_owned()
        } else {
            format!("{name}.")
        };
        let lookup = self.resolver.lookup_ip(absolute).await.map_err(|e| {
            ValidationError::new(ProblemType::Dns, self.dns_failure("AAAA or A", name, &e))
        })?;
        let mut addrs: Vec<IpAddr> = lookup.iter().collect();
        if addrs.is_empty() {
            return Err(ValidationError::new(
                ProblemType::Dns,
                format!("no A or AAAA records found for {name}"),
            ));
        }
        addrs.sort_by_key(|a| a.is_ipv4());
        Ok(addrs)
    }

    /// Why a lookup of `name`'s `kind` records failed, as a sentence for the
    /// problem detail a client prints (RFC 8555 §6.7: for humans): what was
    /// asked, of whom, what came back — never the resolver's debug text.
    pub(crate) fn dns_failure(&self, kind: &str, name: &str, e: &NetError) -> String {
        let name = name.trim_end_matches('.');
        let servers = &self.servers;
        if e.is_nx_domain() {
            format!(
                "{name} does not exist in DNS ({servers} answered NXDOMAIN to the {kind} query)"
            )
        } else if e.is_no_records_found() {
            format!("no {kind} record for {name} at {servers}")
        } else if matches!(e, NetError::Timeout) {
            format!("no answer from {servers} for the {kind} record of {name} in time")
        } else {
            format!("asking {servers} for the {kind} record of {name} failed: {e}")
        }
    }

    /// The addresses of `name` that validation may connect to, IPv6 first;
    /// a `connection` problem naming the refused addresses and why when
    /// there is none.
    pub async fn reachable(&self, name: &str) -> Result<Vec<IpAddr>, ValidationError> {
        let addrs = self.resolve(name).await?;
        let mut refused = Vec::new();
        let allowed: Vec<IpAddr> = addrs
            .into_iter()
            .filter(|ip| match self.egress.refusal(*ip) {
                Some(net) => {
                    refused.push(format!("{ip} (in {net})"));
                    false
                }
                None => true,
            })
            .collect();
        if allowed.is_empty() {
            return Err(ValidationError::new(
                ProblemType::Connection,
                format!(
                    "validation does not connect to {name} at {}: validation.deny_networks refuses it",
                    refused.join(", ")
                ),
            ));
        }
        Ok(allowed)
    }

    /// Validates one challenge of type `kind`.
    pub async fn validate(
        &self,
        kind: ChallengeType,
        target: &ValidationTarget,
    ) -> Result<(), ValidationError> {
        let work = async {
            match kind {
                ChallengeType::Http01 => http01::validate(self, target).await,
                ChallengeType::Dns01 => dns01::validate(self, target).await,
                ChallengeType::TlsAlpn01 => tlsalpn01::validate(self, target).await,
            }
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(ValidationError::new(
                ProblemType::Connection,
                format!(
                    "validation of {} did not complete within {:?}",
                    target.identifier, self.timeout
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(allow: &[&str]) -> Egress {
        Egress::new(
            crate::config::DEFAULT_DENY_NETWORKS
                .iter()
                .map(|n| n.parse().unwrap())
                .collect(),
            allow.iter().map(|n| n.parse().unwrap()).collect(),
        )
    }

    #[test]
    fn the_default_list_refuses_loopback_link_local_and_metadata_and_allows_private_ranges() {
        let e = egress(&[]);
        for refused in [
            "127.0.0.2",
            "::1",
            "169.254.169.254",
            "fd00:ec2::254",
            "fe80::1",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "ff02::1",
            "255.255.255.255",
            // An IPv4 address written as IPv6 is the IPv4 address.
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(e.refusal(refused.parse().unwrap()).is_some(), "{refused}");
        }
        for allowed in [
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "fd12::1",
            "192.0.2.1",
        ] {
            assert_eq!(e.refusal(allowed.parse().unwrap()), None, "{allowed}");
        }
    }

    #[test]
    fn allow_networks_makes_exceptions_to_the_refused_ones() {
        let e = egress(&["127.0.0.1/32"]);
        assert_eq!(e.refusal("127.0.0.1".parse().unwrap()), None);
        assert_eq!(e.refusal("::ffff:127.0.0.1".parse().unwrap()), None);
        assert!(e.refusal("127.0.0.2".parse().unwrap()).is_some());
    }
}
