//! Where a relay's dns-01 answers go: the corporate primary by RFC 2136
//! (`dns01`), or our own `[dns_zone]` through the database, to which the
//! corporate `_acme-challenge` names are delegated by CNAME
//! (`dns01_delegated`).

use super::classify::RelayError;
use super::rfc2136::Rfc2136;
use crate::clock::SharedClock;

/// A place to publish the upstream's dns-01 TXT values.
pub enum Publisher {
    /// RFC 2136 updates, signed with TSIG, to the zone's primary.
    Rfc2136(Rfc2136),
    /// The records of our own zone: every replica serves them at once, and
    /// no key is held anywhere.
    Zone {
        store: acme_proxy_store::Store,
        /// The zone the values go in (the first of `[dns_zone]`).
        zone: String,
        clock: SharedClock,
    },
}

impl Publisher {
    /// Where a relay with `config` publishes: RFC 2136 for `dns01`, `zone`
    /// (the database and the zone's name) for `dns01_delegated`, nowhere
    /// for the other strategies.
    pub fn for_relay(
        config: &crate::config::RelayConfig,
        clock: SharedClock,
        zone: Option<(acme_proxy_store::Store, String)>,
    ) -> Result<Option<Publisher>, String> {
        use crate::config::RelayStrategy;
        Ok(match (config.strategy, &config.dns01, zone) {
            (RelayStrategy::Dns01, Some(d), _) => Some(Publisher::Rfc2136(Rfc2136::new(
                d,
                config.request_timeout,
                clock,
            )?)),
            (RelayStrategy::Dns01Delegated, _, Some((store, zone))) => {
                Some(Publisher::Zone { store, zone, clock })
            }
            (RelayStrategy::Dns01Delegated, _, None) => {
                return Err("strategy dns01_delegated needs a [dns_zone] to publish in".into());
            }
            _ => None,
        })
    }

    /// The name `identifier`'s value is published at (RFC 8555 §8.4: a
    /// wildcard's is its base name's).
    pub fn record_name(&self, identifier: &str) -> String {
        match self {
            Publisher::Rfc2136(_) => format!(
                "_acme-challenge.{}.",
                identifier.trim_start_matches("*.").trim_end_matches('.')
            ),
            Publisher::Zone { zone, .. } => crate::dns_zone::delegation_target(zone, identifier),
        }
    }

    /// Adds `value` at `name` beside whatever is there (a wildcard and its
    /// base name share one name).
    pub async fn add_txt(&self, name: &str, value: &str) -> Result<(), RelayError> {
        match self {
            Publisher::Rfc2136(dns) => dns.add_txt(name, value).await,
            Publisher::Zone { store, zone, clock } => store
                .add_dns_txt(zone, name, value, clock.unix(), None)
                .await
                .map(|_| ())
                .map_err(|e| {
                    RelayError::retryable(format!("publishing {name} in [dns_zone]: {e}"))
                }),
        }
    }

    /// Removes `value` at `name`, and only it.
    pub async fn delete_txt(&self, name: &str, value: &str) -> Result<(), RelayError> {
        match self {
            Publisher::Rfc2136(dns) => dns.delete_txt(name, value).await,
            Publisher::Zone { store, zone, .. } => store
                .remove_dns_txt(zone, name, Some(value), None)
                .await
                .map(|_| ())
                .map_err(|e| {
                    RelayError::retryable(format!("removing {name} from [dns_zone]: {e}"))
                }),
        }
    }
}
