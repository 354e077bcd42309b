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

    /// Unix milliseconds, as the job queue keeps time (leases are seconds).
    fn unix_ms(&self) -> i64 {
        unix_ms(self.now())
    }
}

/// Unix milliseconds of a time.
pub fn unix_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// A clock that moves only when told to, for tests of expiry, leases,
/// backoff and deadlines without sleeping.
#[derive(Debug)]
pub struct ManualClock {
    now: std::sync::Mutex<OffsetDateTime>,
}

impl ManualClock {
    pub fn new(start: OffsetDateTime) -> Self {
        Self {
            now: std::sync::Mutex::new(start),
        }
    }

    /// Starts at the system time, so certificates it dates are valid now.
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now())
    }

    pub fn advance(&self, by: std::time::Duration) {
        if let Ok(mut now) = self.now.lock() {
            *now += by;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> OffsetDateTime {
        self.now
            .lock()
            .map(|n| *n)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
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
