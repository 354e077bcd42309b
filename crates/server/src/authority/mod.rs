//! The registration authority: the ACME state machine (RFC 8555 §7).
//!
//! It owns policy (which names, which keys, which contacts) and every status
//! change of accounts, orders, authorizations and challenges, performed
//! through the store's atomic, guarded functions.
//!
//! Architecture Invariant: the authority is the only code that changes an
//! order, authorization or challenge status. It knows nothing of HTTP or
//! JWS: it takes verified inputs and returns rows or an [`AcmeError`].

mod accounts;
mod ari;
mod audit;
pub mod breaker;
mod certificates;
pub mod csr;
mod eab;
mod finalize;
mod known_accounts;
mod maintenance;
mod nonces;
mod operator;
mod orders;
mod policy;
mod rate_limits;
mod recent;
mod recheck;
mod relay;
mod reverse;
mod revocation;
mod validation;

#[cfg(test)]
mod properties;

use std::collections::BTreeMap;
use std::sync::Arc;

use acme_proxy_protocol::Jwk;
use acme_proxy_store::{AccountGuard, AccountRow, Store, StoreError};
use tokio::sync::Mutex;

use crate::clock::SharedClock;
use crate::config::{Config, ProfileConfig};
use crate::error::{AcmeError, AcmeResult};
use crate::jobs::Queue;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::signer::Signer;
use crate::validators::Validators;

pub use ari::Window;
pub use breaker::{UPSTREAM_PROBE_KIND, UpstreamProbes};
pub use finalize::{FINALIZE_WATCH_KIND, FinalizeWatch};
pub use maintenance::{CrlRefresh, NonceSweep};
pub(crate) use rate_limits::upstream_pause_key;
pub use relay::{RELAY_KIND, RelayJobs};
pub use revocation::{RevocationSigner, crl_needs_refresh};
pub use validation::{VALIDATION_KIND, ValidationJobs};

/// Where a request came from, for the audit trail. Filled by the front end; every field is best-effort.
#[derive(Clone, Debug, Default)]
pub struct RequestContext {
    pub client_ip: Option<String>,
    /// Capped by the front end.
    pub user_agent: Option<String>,
    pub request_id: Option<String>,
}

tokio::task_local! {
    static REQUEST: RequestContext;
}

impl RequestContext {
    /// Runs `fut` (one request) with this context readable by the
    /// authority's audit writer, without threading it through every call.
    pub async fn scope<F: std::future::Future>(self, fut: F) -> F::Output {
        REQUEST.scope(self, fut).await
    }

    /// The context of the request being served; empty in background work.
    pub fn current() -> RequestContext {
        REQUEST.try_with(Clone::clone).unwrap_or_default()
    }
}

/// A request's nonce, checked, whose use is to be recorded by
/// [`Authority::spending`] (`None`: it was used when checked).
#[derive(Debug)]
#[must_use = "a checked nonce is spent by Authority::spending"]
pub struct DueNonce(Option<(String, i64)>);

impl DueNonce {
    /// A nonce already used.
    pub fn spent() -> Self {
        Self(None)
    }
}

/// One ACME endpoint: its configuration and its signer.
#[derive(Debug)]
pub struct Profile {
    pub name: String,
    pub config: ProfileConfig,
    pub signer: Signer,
    /// Serialises CRL generation so CRL numbers are never reused and no
    /// revocation is left out of the newest CRL.
    crl_lock: Mutex<()>,
}

impl Profile {
    pub fn new(name: String, config: ProfileConfig, signer: Signer) -> Self {
        Self {
            name,
            config,
            signer,
            crl_lock: Mutex::new(()),
        }
    }
}

/// The state machine shared by every request and background task.
#[derive(Debug)]
pub struct Authority {
    /// Private: the front end asks the authority (`ping`,
    /// `upstream_key_authorization`), never the store.
    store: Store,
    pub clock: SharedClock,
    profiles: BTreeMap<String, Arc<Profile>>,
    pub(crate) validators: Validators,
    /// Where background work goes. Validations are jobs, so the queue's
    /// `jobs.concurrency` bounds how many run at once.
    queue: Arc<Queue>,
    /// The public base URL, for account URLs in CAA `accounturi` checks
    /// (RFC 8657 §3); the front end builds every other URL.
    base_url: String,
    nonce_lifetime: i64,
    /// Replay nonces, in memory or in the store (`nonce_store`).
    nonces: Arc<nonces::Nonces>,
    /// Where events are told (webhooks), as durable jobs.
    pub notifier: Arc<Notifier>,
    pub metrics: Arc<Metrics>,
    /// Reverse names of client addresses, for audit rows.
    reverse: reverse::ReverseNames,
    /// Recently used accounts with their parsed keys (`account_cache_ttl`).
    known_accounts: Arc<known_accounts::KnownAccounts>,
    /// Orders this process just made valid, with their certificates.
    recent: Arc<recent::Recent>,
    /// The acme-dns API, mounted beside the ACME routes when configured.
    pub dns_api: Option<Arc<crate::dns_api::DnsApi>>,
    /// `[policy]`: who may ask for what (`policy.rs`).
    pub policy: Arc<crate::policy::Policy>,
    /// When connection-stage refusals were last audited, per address.
    audited_refusals: policy::AuditedRefusals,
    /// `[rate_limits]`.
    rate_limits: crate::config::RateLimitsConfig,
}

/// What every configuration generation shares (`generation.rs`): a reload
/// keeps the queue, the metrics, the outstanding nonces, the account
/// copies (a change this process makes to an account must reach every
/// copy, whichever generation holds it) and the orders just made valid.
#[derive(Clone, Debug)]
pub struct Lasting {
    pub queue: Arc<Queue>,
    pub metrics: Arc<Metrics>,
    nonces: Arc<nonces::Nonces>,
    known_accounts: Arc<known_accounts::KnownAccounts>,
    recent: Arc<recent::Recent>,
    /// The acme-dns API (`[dns_zone.api]`), whose rate limits outlive a
    /// reload.
    pub dns_api: Option<Arc<crate::dns_api::DnsApi>>,
}

impl Lasting {
    /// The shared parts, with nonces kept as `config` says for this store
    /// and account copies kept for its `account_cache_ttl`.
    pub fn new(queue: Arc<Queue>, metrics: Arc<Metrics>, config: &Config) -> Self {
        let nonces = nonces::Nonces::new(config.nonce_store_for(queue.store.is_postgres()));
        let dns_api = config.dns_zone.as_ref().and_then(|z| {
            let api = z.api.clone()?;
            let zone = crate::dns_zone::publishing_zone(z)?;
            Some(Arc::new(crate::dns_api::DnsApi::new(
                api,
                zone,
                queue.store.clone(),
                Arc::clone(&queue.clock),
                Arc::clone(&metrics),
                config.connections.body_read_timeout,
            )))
        });
        Self {
            dns_api,
            nonces: Arc::new(nonces),
            known_accounts: Arc::new(known_accounts::KnownAccounts::new(config.account_cache_ttl)),
            recent: Arc::default(),
            queue,
            metrics,
        }
    }
}

impl Authority {
    /// The store and clock are the queue's: one of each per process.
    pub fn new(
        profiles: BTreeMap<String, Arc<Profile>>,
        validators: Validators,
        lasting: &Lasting,
        base_url: String,
        config: &Config,
        notifier: Arc<Notifier>,
        policy: crate::policy::Policy,
    ) -> Self {
        let queue = Arc::clone(&lasting.queue);
        Self {
            store: queue.store.clone(),
            clock: Arc::clone(&queue.clock),
            profiles,
            reverse: reverse::ReverseNames::new(
                config
                    .audit
                    .reverse_names
                    .then(|| Arc::clone(&validators.resolver)),
                config.audit.reverse_name_timeout,
            ),
            validators,
            queue,
            base_url,
            nonce_lifetime: config.nonce_lifetime.as_secs() as i64,
            nonces: Arc::clone(&lasting.nonces),
            known_accounts: Arc::clone(&lasting.known_accounts),
            recent: Arc::clone(&lasting.recent),
            notifier,
            metrics: Arc::clone(&lasting.metrics),
            dns_api: lasting.dns_api.clone(),
            policy: Arc::new(policy),
            audited_refusals: policy::AuditedRefusals::default(),
            rate_limits: config.rate_limits.clone(),
        }
    }

    /// The store, for operator commands (which act on rows directly) and
    /// tests. The front end asks the authority instead.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Whether the database answers (`/health`).
    pub async fn ping(&self) -> AcmeResult<()> {
        self.store.ping().await.map_err(AcmeError::internal)
    }

    /// Closes the database: the last act of a process.
    pub async fn close(&self) {
        self.store.close().await;
    }

    /// The key authorization a signer publishes under `token` for an
    /// upstream CA's http-01 fetch (RFC 8555 §8.3), if any signer does.
    pub fn upstream_key_authorization(&self, token: &str) -> Option<String> {
        self.profiles
            .values()
            .find_map(|p| p.signer.key_authorization(token))
    }

    pub fn profile(&self, name: &str) -> Option<&Arc<Profile>> {
        self.profiles.get(name)
    }

    pub fn profiles(&self) -> impl Iterator<Item = &Arc<Profile>> {
        self.profiles.values()
    }

    /// The account URL of `account_id` at `profile`, as clients know it.
    pub fn account_url(&self, profile: &str, account_id: &str) -> String {
        format!("{}/profile/{profile}/acct/{account_id}", self.base_url)
    }

    /// Issues a fresh nonce (RFC 8555 §6.5, §7.2).
    pub async fn new_nonce(&self) -> AcmeResult<String> {
        Ok(self
            .nonces
            .issue(&self.store, self.clock.unix() + self.nonce_lifetime)
            .await?)
    }

    /// Consumes a nonce; `badNonce` unless it was issued, unexpired and
    /// unused (RFC 8555 §6.5.2).
    pub async fn consume_nonce(&self, nonce: &str) -> AcmeResult<()> {
        if self
            .nonces
            .consume(&self.store, nonce, self.clock.unix())
            .await?
        {
            Ok(())
        } else {
            Err(crate::error::bad_nonce())
        }
    }

    /// Checks a nonce as [`Authority::consume_nonce`] does, leaving the
    /// record of its use in the database (the `database` nonce store) to
    /// the request's work: see [`Authority::spending`].
    pub async fn check_nonce(&self, nonce: &str) -> AcmeResult<DueNonce> {
        match self
            .nonces
            .check(&self.store, nonce, self.clock.unix())
            .await?
        {
            Some(nonces::Checked::Spent) => Ok(DueNonce::spent()),
            Some(nonces::Checked::Due { name, expires_at }) => {
                Ok(DueNonce(Some((name, expires_at))))
            }
            None => Err(crate::error::bad_nonce()),
        }
    }

    /// Runs a request's `work` with its nonce's use still to be recorded:
    /// on PostgreSQL the record goes with the work's first statement when
    /// that statement can carry it (one round trip fewer), and in any case
    /// before anything is written (`Store::spending_nonce`). `badNonce`,
    /// whatever `work` answered, when the nonce was used before.
    pub async fn spending<T>(
        &self,
        nonce: DueNonce,
        work: impl std::future::Future<Output = AcmeResult<T>>,
    ) -> AcmeResult<T> {
        match nonce.0 {
            None => work.await,
            Some((name, expires_at)) => self
                .store
                .spending_nonce(&name, expires_at, work)
                .await
                .map_err(AcmeError::from)?,
        }
    }

    /// Forgets expired nonces (the `nonce_sweep` job); returns how many.
    pub async fn sweep_nonces(&self) -> AcmeResult<u64> {
        Ok(self.nonces.sweep(&self.store, self.clock.unix()).await?)
    }

    /// The OpenMetrics text, with the outstanding nonces wherever they live.
    pub async fn render_metrics(&self) -> String {
        let nonces = self.nonces.count(&self.store).await.ok();
        // Breakers of the relay upstreams mounted now: a row of a profile
        // since removed, or of a directory since changed, says nothing.
        let upstreams: std::collections::BTreeMap<(String, String), String> = self
            .profiles()
            .filter_map(|p| Some((p, p.signer.issuance().deferred()?)))
            .flat_map(|(p, relay)| {
                relay.upstreams().into_iter().map(|u| {
                    (
                        (p.name.clone(), u.directory().to_owned()),
                        u.name().to_owned(),
                    )
                })
            })
            .collect();
        self.metrics.render(&self.store, nonces, &upstreams).await
    }

    /// The account a `kid` names, which must be of this profile, and its
    /// key. With `may_use_copy`, a copy of the account made less than
    /// `account_cache_ttl` ago answers (see `known_accounts`): for a
    /// POST-as-GET, or a request whose writes carry an [`AccountGuard`].
    /// Otherwise the account is read, and the copy renewed.
    pub async fn account_for_kid(
        &self,
        profile: &Profile,
        account_id: &str,
        may_use_copy: bool,
    ) -> AcmeResult<(AccountRow, Jwk)> {
        let now_ms = self.clock.unix_ms();
        let known = if may_use_copy {
            self.known_accounts.get(account_id, now_ms)
        } else {
            None
        };
        let (account, key) = match known {
            Some(known) => known,
            None => {
                let generation = self.known_accounts.generation();
                let Some(account) = self.store.account(account_id).await? else {
                    return Err(no_such_account());
                };
                let key = serde_json::from_str(&account.jwk)
                    .map_err(|e| e.to_string())
                    .and_then(|value| Jwk::from_value(&value).map_err(|e| e.to_string()))
                    .map_err(|e| {
                        AcmeError::internal(format!("stored JWK of {}: {e}", account.id))
                    })?;
                self.known_accounts.put(&account, &key, now_ms, generation);
                (account, key)
            }
        };
        if account.profile != profile.name {
            return Err(no_such_account());
        }
        Ok((account, key))
    }

    /// Forgets the in-memory copy of an account this process changed.
    fn account_changed(&self, account_id: &str) {
        self.known_accounts.forget(account_id);
    }

    /// The error of a write guarded by `account` ([`guard`]). When the
    /// store found the account changed (another process deactivated,
    /// deleted or rekeyed it since the copy that verified the request was
    /// made), the copy is forgotten and the request refused as the changed
    /// account's would have been (RFC 8555 §7.3.6).
    fn guarded_write_error(&self, account: &AccountRow, e: StoreError) -> AcmeError {
        match e {
            StoreError::AccountChanged => {
                self.account_changed(&account.id);
                e.into()
            }
            e => e.into(),
        }
    }
}

/// What a write made for a request signed by `account` carries, for the
/// store to check that the account is still valid with that key.
pub(crate) fn guard(account: &AccountRow) -> AccountGuard<'_> {
    AccountGuard {
        id: &account.id,
        key_thumbprint: &account.key_thumbprint,
    }
}

fn no_such_account() -> AcmeError {
    AcmeError::new(
        acme_proxy_protocol::ProblemType::AccountDoesNotExist,
        "no account with this key identifier exists at this profile",
    )
}
