//! The `[jobs]` table: the durable job queue.

#[allow(unused_imports)]
use super::*;

/// The durable job queue (background validation, periodic sweeps).
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// Jobs of one kind run at once by this process (each kind —
    /// validation, relay issuance, notification, periodic work — has its
    /// own slots).
    pub concurrency: usize,
    /// Validations of one account running at once (across processes).
    pub validations_per_account: usize,
    /// How often the runner looks for scheduled work when nothing woke it.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub poll_interval: Duration,
    /// How long a claim lasts unless renewed; a dead runner's jobs are
    /// reclaimed after at most this long. Renewed every third of it.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub lease: Duration,
    /// Default time budget of one attempt (handlers may set their own).
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub attempt_budget: Duration,
    /// Attempts before a job is retired for good.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt, jittered.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub backoff_base: Duration,
    /// Longest retry delay.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub backoff_cap: Duration,
    /// How long finished jobs are kept for operators to inspect.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub retention: Duration,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            concurrency: 16,
            validations_per_account: 8,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(15),
            attempt_budget: Duration::from_secs(300),
            max_attempts: 10,
            backoff_base: Duration::from_secs(2),
            backoff_cap: Duration::from_secs(600),
            retention: Duration::from_secs(7 * 86400),
        }
    }
}
