//! The `[audit]` table: how long audit rows are kept.

#[allow(unused_imports)]
use super::*;

/// The audit trail's upkeep and enrichment.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Rows older than this are deleted (hourly); absent: kept for ever.
    #[serde(deserialize_with = "opt_duration")]
    #[schemars(schema_with = "super::reference::opt_duration")]
    pub retention: Option<Duration>,
    /// Record the client address's reverse (PTR) name, best-effort.
    pub reverse_names: bool,
    /// The longest a reverse lookup may delay the request it audits.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub reverse_name_timeout: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            retention: None,
            reverse_names: true,
            reverse_name_timeout: Duration::from_millis(300),
        }
    }
}
