//! The one place that reads the wall clock (see `clippy.toml`).
//!
//! Everything else takes time from a [`Clock`], so expiry, CRL refresh and
//! nonce lifetimes can be tested without waiting.

use std::sync::Arc;

use time::OffsetDateTime;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> OffsetDateTime;

    /// Unix seconds, as the store keeps time.
    fn unix(&self) -> i64 {
        self.now().unix_timestamp()
    }
}

/// The system's wall clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // This is the module that may read the clock.
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
}

pub type SharedClock = Arc<dyn Clock>;

/// RFC 3339 rendering for ACME documents (RFC 8555 §7.1 uses RFC 3339).
pub fn rfc3339(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// Parses an RFC 3339 timestamp into Unix seconds.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(OffsetDateTime::unix_timestamp)
}
