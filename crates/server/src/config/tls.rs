//! The `[tls]` table: TLS on the ACME listener.

#[allow(unused_imports)]
use super::*;

/// TLS termination on the ACME listener (rustls): the operator's
/// certificate and key, or a self-signed certificate for the public URL's
/// host.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
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
    #[schemars(schema_with = "super::reference::duration")]
    pub reload_interval: Duration,
    /// A connection that has not finished its handshake by then is closed.
    #[serde(default = "default_tls_handshake", deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub handshake_timeout: Duration,
}

pub(crate) fn default_tls_reload() -> Duration {
    Duration::from_secs(30)
}

pub(crate) fn default_tls_handshake() -> Duration {
    Duration::from_secs(10)
}
