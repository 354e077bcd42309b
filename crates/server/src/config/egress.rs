//! The `[egress]` table: how the server's own outbound HTTP(S) — the
//! relay's upstream CA, webhooks — leaves the network, directly or through
//! an HTTP proxy. Global, and replaced as a whole by an `egress` table in
//! a relay signer or a webhook.

#[allow(unused_imports)]
use super::*;

/// Outbound HTTP(S) of the relay and of webhooks. Challenge validation,
/// DNS, RFC 2136 updates and e-mail never go through a proxy.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// The HTTP proxy to go through, `http://HOST:PORT`: `CONNECT` for
    /// https:// destinations, forwarding for http:// ones. Unset: direct.
    pub proxy: Option<String>,
    /// A file whose first line is `USER:PASSWORD`, sent to `proxy` as
    /// Basic `Proxy-Authorization`. Owner-only, like every secret.
    pub proxy_credentials_file: Option<PathBuf>,
    /// Destinations never sent to the proxy: host names (each with its
    /// subdomains; a leading dot means the same), addresses, CIDRs, or
    /// `"*"` for all.
    pub no_proxy: Vec<String>,
    /// Take the proxy from `https_proxy`, `http_proxy`, `all_proxy` and
    /// `no_proxy` (lower case first, then upper case) instead of `proxy`
    /// and `no_proxy`. Off by default, so that a stray variable does not
    /// change where the relay connects.
    pub from_env: bool,
    /// Where loopback destinations go.
    pub loopback: LoopbackRoute,
}

/// Where connections to loopback destinations (127.0.0.0/8, ::1,
/// `localhost`) go: `direct`, since a proxy elsewhere cannot reach this
/// host's loopback, or `proxy`, for a proxy on this host that must see
/// every connection.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LoopbackRoute {
    /// Never through the proxy: a proxy elsewhere cannot reach this
    /// host's loopback.
    #[default]
    Direct,
    /// Through the proxy like any other destination.
    Proxy,
}

/// Refuses what start-up cannot use, saying what to write; `key` is where
/// the table is (`egress`, `profiles.P.signer.egress`, …).
pub(crate) fn check_egress(key: &str, e: &EgressConfig) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if e.from_env && (e.proxy.is_some() || !e.no_proxy.is_empty()) {
        return invalid(format!(
            "{key}: from_env takes the proxy and no_proxy from the environment; remove proxy and no_proxy, or from_env"
        ));
    }
    if let Some(proxy) = &e.proxy
        && let Err(why) = crate::egress::check_proxy_url(proxy)
    {
        return invalid(format!("{key}.proxy: {why}"));
    }
    if e.proxy_credentials_file.is_some() && e.proxy.is_none() {
        return invalid(format!(
            "{key}.proxy_credentials_file is set without proxy; write proxy = \"http://proxy.example.internal:3128\""
        ));
    }
    if let Some(file) = &e.proxy_credentials_file
        && !file.is_absolute()
    {
        return invalid(format!(
            "{key}.proxy_credentials_file must be an absolute path, e.g. \"/etc/acme-proxy/proxy-credentials\""
        ));
    }
    for entry in &e.no_proxy {
        if entry.trim().is_empty() || entry.contains(',') || entry.contains(char::is_whitespace) {
            return invalid(format!(
                "{key}.no_proxy: {entry:?} is not one host, domain, address or CIDR; write one per list item, e.g. no_proxy = [\".corp.example\", \"10.0.0.0/8\"]"
            ));
        }
    }
    Ok(())
}
