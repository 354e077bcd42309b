//! The `[admin]` table: the web console's listener, logins and sessions.

#[allow(unused_imports)]
use super::*;

/// The web console (and its JSON API) for operators, on a listener of its
/// own; off unless `listen` is set.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Where the console listens; absent: no console. A loopback address
    /// unless `[admin.tls]` is set (passwords and session cookies must not
    /// cross a network in clear).
    pub listen: Option<SocketAddr>,
    /// TLS on the console's listener, with the same keys as `[tls]` (a
    /// self-signed certificate is made for the public URL's host).
    pub tls: Option<TlsConfig>,
    /// Every operator must enrol a TOTP authenticator: one who has not is
    /// sent to enrolment after the password and sees nothing else.
    pub require_totp: bool,
    /// A session unused this long ends.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "reference::duration")]
    pub session_idle: Duration,
    /// A session ends this long after its login, however busy.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "reference::duration")]
    pub session_lifetime: Duration,
    /// Reverse proxies in front of the console whose forwarded header
    /// (`forwarded_header`) is believed for who logs in: the address
    /// throttled, audited and shown in `admin session list`. Apart from
    /// the top-level `trusted_proxies`, which are the ACME listener's: a
    /// proxy trusted there does not get to name the console's clients.
    /// Empty: the peer is the client.
    #[serde(deserialize_with = "addresses_or_networks")]
    #[schemars(schema_with = "reference::networks")]
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: None,
            tls: None,
            require_totp: false,
            session_idle: Duration::from_secs(30 * 60),
            session_lifetime: Duration::from_secs(12 * 3600),
            trusted_proxies: Vec::new(),
        }
    }
}

impl AdminConfig {
    /// What is wrong with the table, given the other listeners' addresses;
    /// each problem says what to write instead.
    pub(super) fn problems(&self, acme: SocketAddr, metrics: Option<SocketAddr>) -> Vec<String> {
        let mut problems = Vec::new();
        let Some(at) = self.listen else {
            return problems;
        };
        if !at.ip().is_loopback() && self.tls.is_none() {
            problems.push(format!(
                "admin.listen {at} is not a loopback address and the console has no TLS: passwords and session cookies would cross the network in clear; add [admin.tls] (cert = \"…\", key = \"…\", or self_signed = true), or listen on loopback, e.g. listen = \"127.0.0.1:{}\"",
                at.port()
            ));
        }
        for (name, other) in [
            ("the ACME listener", Some(acme)),
            ("metrics.listen", metrics),
        ] {
            if let Some(other) = other
                && at.port() != 0
                && at.port() == other.port()
                && (at.ip() == other.ip()
                    || at.ip().is_unspecified()
                    || other.ip().is_unspecified())
            {
                problems.push(format!(
                    "admin.listen {at} is {name}'s address ({other}); give the console a port of its own, e.g. listen = \"127.0.0.1:9443\" under [admin]"
                ));
            }
        }
        if self.session_idle.is_zero() || self.session_idle > self.session_lifetime {
            problems.push(format!(
                "admin.session_idle is {}, which must be more than 0s and at most admin.session_lifetime ({}); e.g. session_idle = \"30m\"",
                humantime::format_duration(self.session_idle),
                humantime::format_duration(self.session_lifetime)
            ));
        }
        if self.session_lifetime > Duration::from_secs(7 * 86_400) {
            problems.push(format!(
                "admin.session_lifetime is {}, more than the 7 days a console session may last; e.g. session_lifetime = \"12h\"",
                humantime::format_duration(self.session_lifetime)
            ));
        }
        problems
    }
}
