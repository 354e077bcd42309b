//! `[rate_limits]`: how much one account or one address may ask for,
//! counted in the database (`rate_limits` table) so that a restart does
//! not hand out a fresh allowance. A refusal is `rateLimited` with
//! `Retry-After` and a detail naming the limit and when it frees (RFC 8555
//! §6.6).

use std::net::IpAddr;

use acme_proxy_protocol::ProblemType;
use acme_proxy_store::AccountRow;

use super::{Authority, RequestContext};
use crate::config::Rate;
use crate::error::{AcmeError, AcmeResult};

/// The limits a request can run into, by their name in keys, details and
/// metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Limit {
    NewAccounts,
    NewOrders,
}

impl Limit {
    fn name(self) -> &'static str {
        match self {
            Limit::NewAccounts => "new_accounts_per_address",
            Limit::NewOrders => "new_orders_per_account",
        }
    }
}

/// A place taken, to give back if what it was taken for is not done.
#[derive(Debug)]
pub(super) struct Place {
    key: String,
    interval_ms: i64,
}

impl Authority {
    /// Takes a new order's place for `account`, or refuses. An override
    /// for the account itself comes before one for its EAB credential.
    pub(super) async fn take_new_order_place(
        &self,
        account: &AccountRow,
    ) -> AcmeResult<Option<Place>> {
        let limits = &self.rate_limits;
        let by_account = limits
            .overrides
            .values()
            .find(|o| o.account.as_deref() == Some(account.id.as_str()));
        let by_credential = || {
            limits
                .overrides
                .values()
                .find(|o| o.eab_key_id.is_some() && o.eab_key_id == account.eab_kid)
        };
        let rate = by_account
            .or_else(by_credential)
            .and_then(|o| o.new_orders_per_account)
            .or(limits.new_orders_per_account);
        match rate {
            Some(rate) => {
                let key = format!("new_orders:account:{}", account.id);
                self.take(Limit::NewOrders, &key, rate).await?;
                Ok(Some(Place {
                    key,
                    interval_ms: rate.interval_ms(),
                }))
            }
            None => Ok(None),
        }
    }

    /// Gives `place` back (best effort: a failure leaves one place taken
    /// until it frees by itself).
    pub(super) async fn give_back(&self, place: Option<Place>) {
        let Some(place) = place else { return };
        if let Err(e) = self
            .store
            .give_back_rate_limit(&place.key, place.interval_ms)
            .await
        {
            tracing::warn!(event = "ratelimit.give_back", outcome = "failure", key = %place.key, error = %e, "could not give a rate-limit place back");
        }
    }

    /// Takes a new account's place for the request's client address (an
    /// IPv6 client's /64: one host holds a whole /64), or refuses. A
    /// request without a client address (none reaches the front end
    /// without one) is not limited.
    pub(super) async fn take_new_account_place(&self) -> AcmeResult<()> {
        let Some(rate) = self.rate_limits.new_accounts_per_address else {
            return Ok(());
        };
        let Some(ip) = RequestContext::current()
            .client_ip
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        else {
            return Ok(());
        };
        let who = match ip.to_canonical() {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => ipnet::Ipv6Net::new(v6, 64)
                .map(|n| n.trunc().to_string())
                .unwrap_or_else(|_| v6.to_string()),
        };
        self.take(
            Limit::NewAccounts,
            &format!("new_accounts:address:{who}"),
            rate,
        )
        .await
    }

    async fn take(&self, limit: Limit, key: &str, rate: Rate) -> AcmeResult<()> {
        let now_ms = self.clock.unix_ms();
        let Some(wait_ms) = self
            .store
            .take_rate_limit(key, now_ms, rate.interval_ms(), rate.burst_ms())
            .await?
        else {
            return Ok(());
        };
        self.metrics
            .rate_limited
            .get_or_create(&vec![("limit", limit.name().to_owned())])
            .inc();
        let seconds = u64::try_from(wait_ms.saturating_add(999) / 1000).unwrap_or(1);
        let at = crate::clock::rfc3339(self.clock.unix() + i64::try_from(seconds).unwrap_or(0));
        let mut e = AcmeError::new(
            ProblemType::RateLimited,
            format!(
                "over the rate limit {} ({rate}): the next is allowed at {at}, in {seconds} seconds",
                limit.name()
            ),
        );
        e.retry_after = Some(seconds);
        Err(e)
    }

    /// Forgets rate-limit keys that hold nothing back (with the nonce sweep).
    pub async fn sweep_rate_limits(&self) -> AcmeResult<u64> {
        Ok(self.store.sweep_rate_limits(self.clock.unix_ms()).await?)
    }
}
