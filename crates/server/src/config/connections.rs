//! The `[connections]` table: bounds on every listener's connections.

#[allow(unused_imports)]
use super::*;

/// What one client can hold of a listener (ACME, plain or TLS, and
/// metrics): connections, and the time it may take to send a request.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionsConfig {
    /// Connections open at once on one listener; past it, new ones are
    /// closed as soon as they are accepted.
    pub max_open: usize,
    /// Connections open at once from one client: an IPv4 address, or an
    /// IPv6 network of `ipv6_client_prefix` bits (not counted for the
    /// addresses of `trusted_proxies`, which carry many clients).
    pub max_open_per_client: usize,
    /// The IPv6 prefix counted as one client by `max_open_per_client`
    /// (and the DNS zone's `tcp_max_open_per_client`), 32 to 128: 64
    /// because one host is commonly given a whole /64 and could take a new
    /// address per connection; 128 where many hosts share a /64 (a LAN
    /// segment with SLAAC addresses) and each should have its own share.
    pub ipv6_client_prefix: u8,
    /// Time to send a whole request head, from the connection's start or
    /// the end of the previous request (HTTP/1.1's keep-alive idle time).
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub header_read_timeout: Duration,
    /// Time to send a whole request body, once the head has arrived (on
    /// the ACME routes, the acme-dns API and the console); an ACME body is
    /// read before the request takes one of `max_in_flight`.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub body_read_timeout: Duration,
    /// A connection with no request in progress for this long is closed
    /// (HTTP/2 with a GOAWAY).
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub idle_timeout: Duration,
    /// HTTP/2: how often an idle connection is pinged, and how long the
    /// answer may take before the connection is closed.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub h2_keep_alive_interval: Duration,
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub h2_keep_alive_timeout: Duration,
    /// HTTP/2: requests one connection may have open at once.
    pub h2_max_concurrent_streams: u32,
}

impl Default for ConnectionsConfig {
    fn default() -> Self {
        Self {
            max_open: 4096,
            max_open_per_client: 256,
            ipv6_client_prefix: crate::api::forwarded::IPV6_HOST_PREFIX,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            h2_keep_alive_interval: Duration::from_secs(20),
            h2_keep_alive_timeout: Duration::from_secs(20),
            h2_max_concurrent_streams: 64,
        }
    }
}
