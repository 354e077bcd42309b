//! `[rate_limits]`: how much one account or one address may ask for.

#[allow(unused_imports)]
use super::*;

/// Limits kept in the database, so that they hold across restarts (and
/// replicas). Each is written `"N/period"`: N at once, one more every
/// period / N (a smooth limit with bursts of N). Absent: no limit.
#[derive(Clone, Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitsConfig {
    /// New accounts per client address (an IPv6 client: per /64), e.g.
    /// `"10/3h"`.
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub new_accounts_per_address: Option<Rate>,
    /// New orders per account, e.g. `"300/3h"`.
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub new_orders_per_account: Option<Rate>,
    /// Failed validations per account and identifier, e.g. `"5/1h"`: a
    /// place is taken when a challenge fails, and a new order naming an
    /// identifier with no place left is refused until one frees.
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub failed_validations_per_account_and_name: Option<Rate>,
    /// Certificates per registered domain (the name one label below its
    /// public suffix, from the Public Suffix List; an IP address is its
    /// own), e.g. `"50/7d"`: taken at finalize, one place of each
    /// registered domain the certificate names, and checked at newOrder.
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub certificates_per_domain: Option<Rate>,
    /// Certificates for exactly the same set of identifiers, e.g. `"5/7d"`:
    /// taken at finalize and checked at newOrder.
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub duplicate_certificates: Option<Rate>,
    /// Limits that replace the ones above for one account or for the
    /// accounts of one External Account Binding credential.
    pub overrides: BTreeMap<String, RateOverride>,
}

/// An override: whom it is for (`account` or `eab_key_id`) and its limits.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateOverride {
    /// The account's id (the last part of its URL).
    #[serde(default)]
    pub account: Option<String>,
    /// The key id of the credential its accounts registered with.
    #[serde(default)]
    pub eab_key_id: Option<String>,
    /// Replaces `new_orders_per_account` for them.
    #[serde(default)]
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub new_orders_per_account: Option<Rate>,
    /// Replaces the profiles' `max_pending_authorizations` for them.
    #[serde(default)]
    pub pending_authorizations_per_account: Option<usize>,
    /// Replaces `failed_validations_per_account_and_name` for them.
    #[serde(default)]
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub failed_validations_per_account_and_name: Option<Rate>,
    /// Their certificates per registered domain, counted apart from
    /// everyone else's (theirs do not use up the others' places, nor the
    /// others' theirs).
    #[serde(default)]
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub certificates_per_domain: Option<Rate>,
    /// Their duplicate certificates, counted apart from everyone else's.
    #[serde(default)]
    #[schemars(schema_with = "super::reference::opt_rate")]
    pub duplicate_certificates: Option<Rate>,
}

impl RateOverride {
    /// Whether it sets any limit at all.
    pub fn sets_any(&self) -> bool {
        self.new_orders_per_account.is_some()
            || self.pending_authorizations_per_account.is_some()
            || self.failed_validations_per_account_and_name.is_some()
            || self.certificates_per_domain.is_some()
            || self.duplicate_certificates.is_some()
    }
}

/// N per period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub period: Duration,
}

impl Rate {
    /// The time one place takes to free, in milliseconds.
    pub fn interval_ms(&self) -> i64 {
        i64::try_from(self.period.as_millis() / u128::from(self.count.max(1))).unwrap_or(i64::MAX)
    }

    /// How much may be taken at once: all N places.
    pub fn burst_ms(&self) -> i64 {
        self.interval_ms().saturating_mul(i64::from(self.count))
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} per {}",
            self.count,
            humantime::format_duration(self.period)
        )
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let bad = || {
            serde::de::Error::custom(format!(
                "{text:?} is not a rate; write N/period, e.g. \"5/1h\" or \"300/3h\""
            ))
        };
        let (count, period) = text.split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        let period = humantime::parse_duration(period.trim()).map_err(|_| bad())?;
        // A place frees at least every millisecond (the state counts in
        // them); the longest burst is what the state is sized for.
        if count == 0
            || period.as_millis() < u128::from(count)
            || period < Duration::from_secs(1)
            || period > Duration::from_secs(31 * 86400)
        {
            return Err(serde::de::Error::custom(format!(
                "{text:?}: the count must be at least 1 and at most the period in milliseconds, and the period between 1s and 31d"
            )));
        }
        Ok(Rate { count, period })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(text: &str) -> Result<Rate, String> {
        Config::from_toml(&format!(
            "[profiles.default]\n[rate_limits]\nnew_orders_per_account = \"{text}\"\n"
        ))
        .map(|c| c.rate_limits.new_orders_per_account.unwrap())
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_rate_is_a_count_per_period_and_anything_else_says_how_to_write_one() {
        let r = rate("5/1h").unwrap();
        assert_eq!((r.count, r.period), (5, Duration::from_secs(3600)));
        assert_eq!((r.interval_ms(), r.burst_ms()), (720_000, 3_600_000));
        assert_eq!(r.to_string(), "5 per 1h");
        // Rounded down, the burst is still N places, not more.
        let r = rate("7/1s").unwrap();
        assert_eq!((r.interval_ms(), r.burst_ms()), (142, 994));
        for bad in [
            "5", "x/1h", "5/soon", "0/1h", "5/100d", "5/500ms", "2000/1s",
        ] {
            let e = rate(bad).unwrap_err();
            assert!(
                e.contains("write N/period") || e.contains("between 1s and 31d"),
                "{bad}: {e}"
            );
        }
        let e = Config::from_toml(
            "[profiles.default]\n[rate_limits.overrides.x]\nnew_orders_per_account = \"9/1h\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("by account = \"ID\" or by eab_key_id = \"KID\""),
            "{e}"
        );
    }
}
