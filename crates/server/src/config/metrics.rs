//! The `[metrics]` table: the Prometheus listener.

#[allow(unused_imports)]
use super::*;

/// The Prometheus endpoint.
#[derive(Clone, Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Where `/metrics` is served, on a listener of its own; absent: off.
    pub listen: Option<SocketAddr>,
}
