//! Exponential backoff with jitter and a cap.

use std::time::Duration;

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
}
