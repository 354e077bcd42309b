//! The client's address behind reverse proxies. The peer is the client
//! unless it is a trusted proxy; then the forwarded chain is walked right
//! to left, skipping trusted proxies, and the first address that is not one
//! is the client. A client cannot pass itself off as someone else by
//! sending the header: what it wrote stays left of what the first trusted
//! proxy appended, and the walk stops before it.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;

use crate::config::ForwardedHeader;

#[derive(Clone, Debug, Default)]
pub struct Forwarding {
    trusted: Vec<IpNet>,
    header: ForwardedHeader,
}

impl Forwarding {
    pub fn new(trusted: Vec<IpNet>, header: ForwardedHeader) -> Self {
        Self { trusted, header }
    }

    pub(crate) fn trusts(&self, ip: IpAddr) -> bool {
        // A dual-stack listener's view of an IPv4 peer, compared as IPv4.
        let ip = ip.to_canonical();
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The address to audit for a request from `peer`.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer.to_canonical();
        if !self.trusts(client) {
            return client;
        }
        for hop in self.chain(headers).into_iter().rev() {
            match hop {
                // An entry we cannot read (`unknown`, an obfuscated name):
                // the hop that forwarded it is as far as we know.
                None => return client,
                Some(ip) => {
                    client = ip.to_canonical();
                    if !self.trusts(client) {
                        return client;
                    }
                }
            }
        }
        client
    }

    /// The forwarded addresses, left (the original client) to right (the
    /// last proxy before the peer), across every line of the header.
    fn chain(&self, headers: &HeaderMap) -> Vec<Option<IpAddr>> {
        let name = match self.header {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        };
        let mut hops = Vec::new();
        for value in headers.get_all(name) {
            // Element by element: a client's unreadable bytes left of a
            // comma must not hide what the proxy appended right of it.
            for element in value.as_bytes().split(|b| *b == b',') {
                let Ok(element) = std::str::from_utf8(element) else {
                    hops.push(None);
                    continue;
                };
                let address = match self.header {
                    ForwardedHeader::XForwardedFor => Some(element.trim()),
                    // RFC 7239 §4: `for=` among `;`-separated pairs.
                    ForwardedHeader::Forwarded => element.split(';').find_map(|pair| {
                        let (k, v) = pair.trim().split_once('=')?;
                        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
                    }),
                };
                hops.push(address.and_then(parse_node));
            }
        }
        hops
    }
}

/// An address as proxies write it: bare, with a port, bracketed IPv6 with
/// or without a port, possibly quoted (RFC 7239 §6).
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim_matches('"');
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = text.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    text.strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .and_then(|t| t.parse().ok())
}

/// The IPv6 prefix one host is commonly given whole: what registrations,
/// new accounts and console logins are counted under, since such a host
/// could otherwise take a new address per attempt.
pub const IPV6_HOST_PREFIX: u8 = 64;

/// What counts as one client wherever clients are counted (open
/// connections, registrations, new accounts, console logins): its IPv4
/// address, or its IPv6 address's network of `ipv6_prefix` bits (at most
/// 128; [`IPV6_HOST_PREFIX`] but where the operator sets the connections'
/// own). An IPv4 client on a dual-stack socket (`::ffff:a.b.c.d`) is
/// counted by its IPv4 address.
pub fn client_network(ip: IpAddr, ipv6_prefix: u8) -> IpNet {
    match ip.to_canonical() {
        IpAddr::V4(v4) => ipnet::Ipv4Net::from(v4).into(),
        IpAddr::V6(v6) => ipnet::Ipv6Net::new(v6, ipv6_prefix)
            .unwrap_or_else(|_| ipnet::Ipv6Net::from(v6))
            .trunc()
            .into(),
    }
}

/// The text a client is counted under where a count is kept by key (the
/// new-account rate limit, acme-dns registrations, console logins): its
/// IPv4 address, or its IPv6 /64 ([`IPV6_HOST_PREFIX`]) in CIDR notation.
pub fn client_key(ip: IpAddr) -> String {
    match client_network(ip, IPV6_HOST_PREFIX) {
        IpNet::V4(v4) => v4.addr().to_string(),
        v6 => v6.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_client_is_its_ipv4_address_or_its_ipv6_network() {
        let net = |s: &str, bits| client_network(s.parse().unwrap(), bits).to_string();
        assert_eq!(net("192.0.2.7", 64), "192.0.2.7/32");
        assert_eq!(net("::ffff:192.0.2.7", 64), "192.0.2.7/32");
        assert_eq!(
            net("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 64),
            "2001:db8:1:2::/64"
        );
        assert_eq!(net("::1", 64), "::/64");
        assert_eq!(
            net("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 128),
            "2001:db8:1:2:aaaa:bbbb:cccc:dddd/128"
        );
        assert_eq!(net("::ffff:192.0.2.7", 128), "192.0.2.7/32");
    }

    #[test]
    fn a_client_is_counted_under_its_ipv4_address_or_its_ipv6_64_however_spelled() {
        let key = |s: &str| client_key(s.parse().unwrap());
        assert_eq!(key("192.0.2.7"), "192.0.2.7");
        assert_eq!(key("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(key("2001:db8:1:2:aaaa::1"), key("2001:db8:1:2:bbbb::7"));
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    }

    fn headers(name: &str, values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn forwarding(trusted: &[&str], header: ForwardedHeader) -> Forwarding {
        Forwarding::new(trusted.iter().map(|t| t.parse().unwrap()).collect(), header)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let f = forwarding(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let h = headers("x-forwarded-for", &["198.51.100.7"]);
        assert_eq!(f.client_ip(ip("192.0.2.1"), &h), ip("192.0.2.1"));
    }

    #[test]
    fn the_chain_is_walked_right_to_left_past_trusted_proxies_only() {
        let f = forwarding(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        // The client spoofed 203.0.113.9; the edge proxy appended what it saw.
        let h = headers(
            "x-forwarded-for",
            &["203.0.113.9, 198.51.100.7", "10.1.1.1"],
        );
        assert_eq!(f.client_ip(ip("10.2.2.2"), &h), ip("198.51.100.7"));
    }

    #[test]
    fn a_chain_of_trusted_proxies_only_ends_at_its_leftmost_address() {
        let f = forwarding(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let h = headers("x-forwarded-for", &["10.9.9.9, 10.1.1.1"]);
        assert_eq!(f.client_ip(ip("10.2.2.2"), &h), ip("10.9.9.9"));
        assert_eq!(
            f.client_ip(ip("10.2.2.2"), &HeaderMap::new()),
            ip("10.2.2.2")
        );
    }

    #[test]
    fn an_unreadable_hop_stops_the_walk_at_the_proxy_that_forwarded_it() {
        let f = forwarding(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let h = headers("x-forwarded-for", &["198.51.100.7, garbage, 10.1.1.1"]);
        assert_eq!(f.client_ip(ip("10.2.2.2"), &h), ip("10.1.1.1"));
    }

    #[test]
    fn unreadable_bytes_a_client_sent_do_not_hide_what_the_proxy_appended() {
        let f = forwarding(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"\xff\xfe, 198.51.100.7").unwrap(),
        );
        assert_eq!(f.client_ip(ip("10.2.2.2"), &h), ip("198.51.100.7"));
    }

    #[test]
    fn rfc_7239_forwarded_for_is_read_with_quotes_ports_and_brackets() {
        let f = forwarding(&["10.0.0.0/8"], ForwardedHeader::Forwarded);
        let h = headers(
            "forwarded",
            &["for=\"[2001:db8::7]:4711\";proto=https, For=10.1.1.1:8080;by=10.0.0.1"],
        );
        assert_eq!(f.client_ip(ip("10.2.2.2"), &h), ip("2001:db8::7"));
        let h = headers("forwarded", &["for=unknown, for=10.1.1.1"]);
        assert_eq!(f.client_ip(ip("10.2.2.2"), &h), ip("10.1.1.1"));
    }

    #[test]
    fn an_ipv4_mapped_peer_is_matched_and_recorded_as_ipv4() {
        let f = forwarding(&["127.0.0.1/32"], ForwardedHeader::XForwardedFor);
        let h = headers("x-forwarded-for", &["198.51.100.7"]);
        assert_eq!(f.client_ip(ip("::ffff:127.0.0.1"), &h), ip("198.51.100.7"));
        assert_eq!(
            f.client_ip(ip("::ffff:192.0.2.1"), &HeaderMap::new()),
            ip("192.0.2.1")
        );
    }
}
