//! Exponential backoff with jitter and a cap, and the bound on what a
//! peer's `Retry-After` may ask of a job.

use std::time::Duration;

/// The longest a peer's `Retry-After` (RFC 9110 §10.2.3: any number of
/// seconds) may hold a job back: one day. An upstream CA or a webhook
/// receiver asking for longer is asked again after a day (a job whose
/// deadline comes first — a relay's order expiring — is retired then).
/// Unbounded, 18446744073709551615 seconds does not fit the job table's
/// Unix milliseconds.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// A peer's `Retry-After` as a wait of at most [`MAX_RETRY_AFTER`].
pub fn retry_after(asked: Duration) -> Duration {
    asked.min(MAX_RETRY_AFTER)
}

/// The Unix-millisecond time `delay` after `now_ms`: saturating, never
/// overflowing, however long the delay.
pub fn later(now_ms: i64, delay: Duration) -> i64 {
    now_ms.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX))
}

/// The wait after failed attempt number `attempt` (1-based): the
/// exponential step `base · 2^(attempt−1)`, capped at `cap`, then jittered
/// into its upper half by `unit` ∈ [0, 1) so that jobs that failed together
/// do not retry together ("equal jitter"). Always within
/// `[step/2, step]` where `step = min(cap, base · 2^(attempt−1))`.
pub fn backoff(attempt: i64, base: Duration, cap: Duration, unit: f64) -> Duration {
    let exp = attempt.clamp(1, 63) - 1;
    let step = base
        .checked_mul(1u32.checked_shl(exp as u32).unwrap_or(u32::MAX))
        .unwrap_or(cap)
        .min(cap);
    let unit = unit.clamp(0.0, 1.0);
    step / 2 + step.mul_f64(unit / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_its_bounds_until_the_cap() {
        let base = Duration::from_secs(2);
        let cap = Duration::from_secs(60);
        let mut last_step = Duration::ZERO;
        for attempt in 1..=40 {
            let step = (base * 2u32.saturating_pow(attempt as u32 - 1)).min(cap);
            let low = backoff(attempt, base, cap, 0.0);
            let high = backoff(attempt, base, cap, 0.999_999);
            assert_eq!(low, step / 2, "attempt {attempt}");
            assert!(
                high <= step && high > step.mul_f64(0.99),
                "attempt {attempt}: {high:?} vs {step:?}"
            );
            assert!(step >= last_step, "never shrinks");
            last_step = step;
        }
        assert_eq!(backoff(3, base, cap, 0.0), Duration::from_secs(4));
        assert_eq!(backoff(100, base, cap, 0.5), Duration::from_secs(45));
    }

    #[test]
    fn a_huge_retry_after_waits_a_day_and_no_run_time_overflows() {
        let now = 1_700_000_000_000;
        let day = 86_400_000;
        for secs in [u64::MAX, 1_000_000_000_000, 86_401] {
            let asked = Duration::from_secs(secs);
            assert_eq!(retry_after(asked), MAX_RETRY_AFTER, "{secs} s");
            assert_eq!(later(now, retry_after(asked)), now + day, "{secs} s");
        }
        assert_eq!(retry_after(Duration::from_secs(7)), Duration::from_secs(7));
        assert_eq!(later(now, Duration::from_secs(7)), now + 7_000);
        // Saturating, even unbounded.
        assert_eq!(later(now, Duration::from_secs(u64::MAX)), i64::MAX);
        assert_eq!(later(i64::MAX - 1, Duration::from_secs(1)), i64::MAX);
        assert_eq!(later(now, Duration::MAX), i64::MAX);
    }
}
