//! Assembly: configuration → store → profiles and signers → authority →
//! HTTP listener and background tasks; and graceful shutdown.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use acme_proxy_store::{AuditEvent, AuditOrigin, AuditOutcome, Store};
use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{self, Admission, AppState, Urls};
use crate::authority::{
    Authority, CrlRefresh, FinalizeWatch, Lasting, NonceSweep, Profile, RelayJobs, UpstreamProbes,
    ValidationJobs,
};
use crate::clock::SharedClock;
use crate::config::{Config, SignerConfig};
use crate::generation::{Generation, Generations};
use crate::jobs::periodic::{Retained, Retention};
use crate::jobs::{Queue, Registry, Runner};
use crate::metrics::Metrics;
use crate::notify::{Notifier, NotifyJobs};
use crate::signer::relay::ChallengeBoard;
use crate::signer::relay::{Relay, RelayPool};
use crate::signer::{LocalCa, Signer};
use crate::validators::Validators;

/// How often expired nonces are deleted.
const NONCE_SWEEP_EVERY: Duration = Duration::from_secs(300);
/// How often CRL freshness is checked.
const CRL_CHECK_EVERY: Duration = Duration::from_secs(60);
/// How often finished jobs past retention are deleted.
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// A started server.
#[derive(Debug)]
pub struct Running {
    pub addr: SocketAddr,
    /// Where `/metrics` is served, when `[metrics] listen` is set.
    pub metrics_addr: Option<SocketAddr>,
    /// The web console's URL, when `[admin] listen` is set.
    pub admin_url: Option<String>,
    /// Where the `[dns_zone]` server answers (UDP and TCP on each).
    pub dns_addrs: Vec<SocketAddr>,
    dns: Option<crate::dns_zone::DnsServer>,
    pub base_url: String,
    /// The certificate the ACME listener serves, with `[tls]`.
    pub tls_cert: Option<std::path::PathBuf>,
    pub runner: Arc<Runner>,
    /// The configuration generations: the current one serves.
    pub generations: Generations,
    reloader: Arc<Reloader>,
    shutdown: watch::Sender<bool>,
    http: JoinHandle<()>,
    jobs: JoinHandle<()>,
    /// Held until the server has stopped (SQLite).
    _lock: Option<crate::lock::DatabaseLock>,
}

impl Running {
    /// The authority of the configuration in force (a reload replaces it;
    /// the one it replaced is dropped once nothing started on it runs).
    pub fn authority(&self) -> Arc<Authority> {
        self.generations.authority()
    }

    /// The directory URL of a profile.
    pub fn directory_url(&self, profile: &str) -> String {
        Urls::new(&self.base_url, profile).directory()
    }

    /// Builds a new generation from `config` and makes it current (see
    /// `generation.rs`); requests and job attempts already started finish
    /// on the one they started on. A configuration that does not build,
    /// or that changes what only a restart can, is refused and the current
    /// one keeps serving. Either way the outcome is logged and audited.
    /// Returns the new generation's number.
    pub async fn reload(&self, config: Config) -> Result<u64, Refused> {
        self.reloader.reload(config).await
    }

    /// Where a SIGHUP reads the configuration again (the file the server
    /// was started with, and the environment); without it a SIGHUP only
    /// re-reads the TLS files.
    pub fn reload_from(&self, source: impl Fn() -> Result<Config, String> + Send + Sync + 'static) {
        *self
            .reloader
            .source
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Box::new(source));
    }

    /// Stops accepting connections and claiming jobs, lets in-flight
    /// requests and attempts finish (up to `grace`), releases the leases of
    /// attempts still running, and closes the database.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.shutdown.send(true);
        if tokio::time::timeout(grace + Duration::from_secs(5), self.jobs)
            .await
            .is_err()
        {
            tracing::warn!(
                event = "server.shutdown",
                outcome = "timeout",
                "the job runner did not stop in time"
            );
        }
        if tokio::time::timeout(grace, self.http).await.is_err() {
            tracing::warn!(
                event = "server.shutdown",
                outcome = "timeout",
                "in-flight requests did not finish within the grace period"
            );
        }
        if let Some(dns) = self.dns {
            dns.stop().await;
        }
        self.generations.authority().close().await;
        tracing::info!(event = "server.shutdown", outcome = "success", "stopped");
    }
}

/// The authority and what it stands on, built from a configuration: what
/// `serve` runs, and what operator commands act through (no listener, no
/// job runner: the jobs they queue are run by the server).
#[derive(Debug)]
pub struct Assembled {
    pub authority: Arc<Authority>,
    pub queue: Arc<Queue>,
}

/// Whether start-up may create what is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `serve` and the operator commands: the data directory, the
    /// database, a self-generated CA or TLS certificate are made when
    /// missing.
    Serve,
    /// `config check`: the same steps on what exists, creating and writing
    /// nothing, binding no socket.
    Check,
}

/// Every problem that stops start-up, each saying what to do.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct Refused(pub Vec<String>);

/// What start-up builds from the configuration and the files it names:
/// the one place where a configuration is refused, run by `serve` and, as
/// a dry run, by `config check`, so that both refuse the same ones. Every
/// problem is collected rather than the first alone.
struct Prepared {
    /// In [`Mode::Check`], without the self-generated CAs still to be made.
    signers: BTreeMap<String, Signer>,
    validators: Validators,
    destinations: crate::notify::Destinations,
    /// In [`Mode::Check`], None when the self-signed certificate is still
    /// to be made.
    terminator: Option<Arc<crate::tls::Terminator>>,
    policy: crate::policy::Policy,
}

#[allow(clippy::too_many_arguments)]
async fn prepare(
    config: &Config,
    clock: &SharedClock,
    store: Option<&Store>,
    base_url: &str,
    board: &Arc<ChallengeBoard>,
    metrics: &Arc<Metrics>,
    mode: Mode,
    mut plugged: Signers,
) -> Result<Prepared, Refused> {
    let mut problems = Vec::new();
    let mut signers = BTreeMap::new();
    for name in plugged.keys().filter(|n| !config.profiles.contains_key(*n)) {
        problems.push(format!(
            "a signer is plugged in for profile {name}, which the configuration does not have; add [profiles.{name}]"
        ));
    }
    for (name, pc) in &config.profiles {
        // A plugged-in signer replaces the one the configuration describes.
        if let Some(signer) = plugged.remove(name) {
            signers.insert(name.clone(), signer);
            continue;
        }
        let signer = match &pc.signer {
            SignerConfig::LocalCa(ca)
                if mode == Mode::Check
                    && LocalCa::still_to_generate(name, ca, &config.data_dir) =>
            {
                continue;
            }
            SignerConfig::LocalCa(ca) => open_local_ca(name, ca, config, clock).await,
            SignerConfig::Custom(custom) => crate::signer::Custom::new(name, custom)
                .map(|c| Arc::new(c) as Signer)
                .map_err(|e| format!("setting up the custom signer of profile {name}: {e}")),
            SignerConfig::Relay(relay) => {
                relay_signer(name, relay, config, clock, store, board, metrics).await
            }
        };
        match signer {
            Ok(signer) => {
                signers.insert(name.clone(), signer);
            }
            Err(e) => problems.push(e),
        }
    }
    let validators = Validators::new(&config.validation)
        .map(|mut v| {
            v.delegation_zone = config
                .dns_zone
                .as_ref()
                .and_then(crate::dns_zone::publishing_zone);
            v
        })
        .map_err(|e| problems.push(e));
    let destinations = Notifier::destinations(config, metrics).map_err(|e| problems.push(e));
    let terminator = match &config.tls {
        Some(tls)
            if mode == Mode::Check
                && crate::tls::still_to_generate(tls, &config.data_dir, base_url) =>
        {
            Ok(None)
        }
        Some(tls) => crate::tls::Terminator::new(tls, &config.data_dir, base_url, clock.now())
            .map(|t| Some(Arc::new(t)))
            .map_err(|e| problems.push(e)),
        None => Ok(None),
    };
    let policy =
        crate::policy::Policy::build(config, validators.as_ref().ok().map(|v| &v.resolver))
            .map_err(|e| problems.extend(e));
    match (validators, destinations, terminator, policy) {
        (Ok(validators), Ok(destinations), Ok(terminator), Ok(policy)) if problems.is_empty() => {
            Ok(Prepared {
                signers,
                validators,
                destinations,
                terminator,
                policy,
            })
        }
        _ => Err(Refused(problems)),
    }
}

/// The relay signer of profile `name`: each of its upstreams with the
/// account the operator registered there (`store` is None when there is
/// no database yet).
async fn relay_signer(
    name: &str,
    relay: &crate::config::RelayConfig,
    config: &Config,
    clock: &SharedClock,
    store: Option<&Store>,
    board: &Arc<ChallengeBoard>,
    metrics: &Arc<Metrics>,
) -> Result<Signer, String> {
    let mut upstreams = Vec::new();
    for (i, upstream) in relay.upstreams().enumerate() {
        upstreams.push(
            relay_upstream(name, upstream, i == 0, config, clock, store, board, metrics).await?,
        );
    }
    let pool = RelayPool::new(upstreams, relay)
        .map_err(|e| format!("setting up the relay of profile {name}: {e}"))?;
    Ok(Arc::new(pool))
}

/// One upstream of relay profile `name` (the `preferred` one: the signer
/// table's).
#[allow(clippy::too_many_arguments)]
async fn relay_upstream(
    name: &str,
    relay: &crate::config::RelayConfig,
    preferred: bool,
    config: &Config,
    clock: &SharedClock,
    store: Option<&Store>,
    board: &Arc<ChallengeBoard>,
    metrics: &Arc<Metrics>,
) -> Result<Relay, String> {
    let upstream = &relay.name;
    let reading =
        |e| format!("reading the account of profile {name} at its upstream {upstream}: {e}");
    let mut account = match store {
        Some(store) => store
            .upstream_account(name, upstream)
            .await
            .map_err(reading)?,
        None => None,
    };
    // The preferred upstream was `primary` before the configuration named
    // it: its account at the same directory is the one.
    if let (None, Some(store), true) = (&account, store, preferred) {
        account = store
            .upstream_account(name, crate::config::PRIMARY_UPSTREAM)
            .await
            .map_err(reading)?
            .filter(|row| row.directory == relay.directory);
    }
    // Registration is an operator's act: start-up never re-registers, and
    // a missing account says what to run.
    let account = account.ok_or_else(|| {
        format!(
            "profile {name} relays to {} (upstream {upstream}) but has no account there yet; run `acme-proxy upstream register --profile {name} --upstream {upstream}` first",
            relay.directory
        )
    })?;
    if account.directory != relay.directory {
        return Err(format!(
            "profile {name}'s account at its upstream {upstream} was registered at {} but the configuration now says {}; run `acme-proxy upstream register --profile {name} --upstream {upstream}` again",
            account.directory, relay.directory
        ));
    }
    let setting_up =
        |e: String| format!("setting up the relay of profile {name} (upstream {upstream}): {e}");
    let egress =
        crate::egress::Egress::from_config(config.relay_egress(relay)).map_err(setting_up)?;
    let http = crate::signer::relay::http::UpstreamHttp::new(
        &relay.trust_anchors,
        relay.request_timeout,
        Arc::new(egress),
        Some((Arc::clone(metrics), name)),
    )
    .map_err(setting_up)?;
    // dns01_delegated publishes in our own zone, through the database.
    let zone = match (store, config.dns_zone.as_ref()) {
        (Some(store), Some(z)) => {
            crate::dns_zone::publishing_zone(z).map(|zone| (store.clone(), zone))
        }
        _ => None,
    };
    let dns = crate::signer::relay::publish::Publisher::for_relay(relay, Arc::clone(clock), zone)
        .map_err(setting_up)?;
    Relay::new(
        name,
        relay,
        http,
        relay.account_key_path(&config.data_dir, name, preferred),
        &account,
        Arc::clone(board),
        dns,
    )
    .map_err(setting_up)
}

/// `config check`: start-up as a dry run. The database is read if it
/// exists, nothing is created or written, no socket is bound; Ok with the
/// effective profiles when `serve` would start, else every problem.
pub async fn check(config: &Config, clock: SharedClock) -> Result<Vec<String>, Refused> {
    preflight(config)?;
    let options = config
        .store_options()
        .map_err(|e| Refused(vec![format!("{e:#}")]))?;
    let store = Store::open_read_only(&config.database_url(), &options)
        .await
        .map_err(|e| {
            Refused(vec![format!(
                "opening the database {}: {e}",
                config.database_url_shown()
            )])
        })?;
    let board = Arc::new(ChallengeBoard::default());
    let metrics = Arc::new(Metrics::new(Default::default()));
    let prepared = prepare(
        config,
        &clock,
        store.as_ref(),
        &config.base_url(),
        &board,
        &metrics,
        Mode::Check,
        Signers::new(),
    )
    .await;
    if let Some(store) = store {
        store.close().await;
    }
    prepared.map(|_| crate::admin::ops::describe_profiles(config))
}

/// The authority and what it stands on, as `serve` and the operator
/// commands build it, with the TLS terminator when `[tls]` is set.
struct Built {
    assembled: Assembled,
    terminator: Option<Arc<crate::tls::Terminator>>,
    lasting: Lasting,
    board: Arc<ChallengeBoard>,
}

/// Opens the store and builds the profiles' signers, the notifier and the
/// authority. `base_url` is the server's public URL.
pub async fn assemble(
    config: &Config,
    clock: SharedClock,
    base_url: String,
) -> anyhow::Result<Assembled> {
    Ok(
        build(config, clock, base_url, Signers::new(), AuditOrigin::Cli)
            .await?
            .assembled,
    )
}

/// `origin`: whether the audit rows written through it are the server's
/// or an admin command's.
async fn build(
    config: &Config,
    clock: SharedClock,
    base_url: String,
    plugged: Signers,
    origin: AuditOrigin,
) -> anyhow::Result<Built> {
    create_private_dir(&config.data_dir)?;
    let mut options = config.store_options()?;
    options.audit_origin = origin;
    let store = Store::open(&config.database_url(), &options)
        .await
        .with_context(|| format!("opening the database {}", config.database_url_shown()))?;

    let board = Arc::new(ChallengeBoard::default());
    let queue = Arc::new(Queue::new(
        store.clone(),
        Arc::clone(&clock),
        config.jobs.clone(),
    ));
    let metrics = Arc::new(Metrics::new(queue.observer.family()));
    let lasting = Lasting::new(Arc::clone(&queue), metrics, config);
    let (authority, terminator) =
        match authority_for(config, &clock, &lasting, &board, &base_url, plugged).await {
            Ok(built) => built,
            Err(refused) => {
                store.close().await;
                return Err(refused.into());
            }
        };
    Ok(Built {
        assembled: Assembled { authority, queue },
        terminator,
        lasting,
        board,
    })
}

/// The authority of one configuration generation over what every
/// generation shares: its profiles and signers, validators and notifier
/// (and the TLS terminator `[tls]` asks for, used at start only).
async fn authority_for(
    config: &Config,
    clock: &SharedClock,
    lasting: &Lasting,
    board: &Arc<ChallengeBoard>,
    base_url: &str,
    plugged: Signers,
) -> Result<(Arc<Authority>, Option<Arc<crate::tls::Terminator>>), Refused> {
    let store = lasting.queue.store.clone();
    let Prepared {
        mut signers,
        validators,
        destinations,
        terminator,
        policy,
    } = prepare(
        config,
        clock,
        Some(&store),
        base_url,
        board,
        &lasting.metrics,
        Mode::Serve,
        plugged,
    )
    .await?;
    let mut profiles = BTreeMap::new();
    for (name, pc) in &config.profiles {
        let Some(signer) = signers.remove(name) else {
            return Err(Refused(vec![format!("profile {name} has no signer")]));
        };
        if pc.bypass {
            tracing::warn!(
                event = "config.bypass",
                outcome = "warning",
                profile = %name,
                "DANGER: validation bypass is ON for this profile: every challenge is accepted without a check. Use only in tests."
            );
        }
        lasting.metrics.init_profile(name, &pc.challenges);
        profiles.insert(
            name.clone(),
            Arc::new(Profile::new(name.clone(), pc.clone(), signer)),
        );
    }
    let notifier = Arc::new(Notifier::new(
        destinations,
        Arc::clone(&lasting.queue),
        store,
        Arc::clone(&lasting.metrics),
    ));
    let authority = Arc::new(Authority::new(
        profiles,
        validators,
        lasting,
        base_url.to_owned(),
        config,
        notifier,
        policy,
    ));
    Ok((authority, terminator))
}

/// The routes of a generation: the ACME API over `authority`, with the
/// request limits `config` sets.
fn routes_for(
    config: &Config,
    authority: Arc<Authority>,
    base_url: &str,
    admission: &Arc<Admission>,
) -> axum::Router {
    api::router(Arc::new(AppState::new(
        authority,
        base_url.to_owned(),
        config.max_body_bytes,
        config.connections.body_read_timeout,
        Arc::clone(admission),
        api::BodyShare::of(config),
        api::forwarded::Forwarding::new(config.trusted_proxies.clone(), config.forwarded_header),
    )))
}

/// What a reload needs besides the new configuration, and what applies
/// it.
struct Reloader {
    generations: Generations,
    lasting: Lasting,
    board: Arc<ChallengeBoard>,
    clock: SharedClock,
    base_url: String,
    /// Signers a program embedding the server plugged in: kept by every
    /// generation that still has their profile.
    plugged: Signers,
    job_retention: watch::Sender<Option<Duration>>,
    audit_retention: watch::Sender<Option<Duration>>,
    /// The ACME routes' `max_in_flight` slots and body budget, shared by
    /// every generation.
    admission: Arc<Admission>,
    /// One reload at a time.
    busy: tokio::sync::Mutex<()>,
    /// Where a SIGHUP reads the configuration again.
    #[allow(clippy::type_complexity)]
    source: std::sync::Mutex<Option<Box<dyn Fn() -> Result<Config, String> + Send + Sync>>>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("generations", &self.generations)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    async fn reload(&self, config: Config) -> Result<u64, Refused> {
        let _one = self.busy.lock().await;
        let current = self.generations.current();
        let outcome = self.build(&current, config).await;
        let authority = self.generations.authority();
        match outcome {
            Ok(next) => {
                let number = next.number;
                let profiles: Vec<String> = next.config.profiles.keys().cloned().collect();
                // Job tuning and retention first: the generation's jobs
                // then run under its own settings.
                self.lasting.queue.set_config(next.config.jobs.clone());
                self.job_retention
                    .send_replace(Some(next.config.jobs.retention));
                self.audit_retention
                    .send_replace(next.config.audit.retention);
                self.admission.set_limits(
                    next.config.max_in_flight,
                    next.config.max_buffered_body_bytes,
                );
                // In force before it is announced: whoever reads the log
                // line (an operator, a script after `systemctl reload`)
                // and then asks is answered by the new generation.
                self.generations.replace(next);
                tracing::info!(event = "config.reload", outcome = "success", generation = number, profiles = %profiles.join(","), "configuration reloaded");
                authority
                    .audit_server(
                        AuditEvent::ConfigReload,
                        AuditOutcome::Success,
                        RELOAD_ACTOR,
                        &format!(
                            "generation {number} in force: profiles {}",
                            profiles.join(", ")
                        ),
                    )
                    .await;
                self.lasting.queue.configuration_changed();
                self.release_held_jobs(&self.generations.authority()).await;
                Ok(number)
            }
            Err(refused) => {
                let reason = refused.0.join("; ");
                tracing::error!(event = "config.reload", outcome = "refused", generation = current.number, reason = %reason, "configuration not reloaded; the previous one keeps serving");
                authority
                    .audit_server(
                        AuditEvent::ConfigReload,
                        AuditOutcome::Refused,
                        RELOAD_ACTOR,
                        &format!("generation {} keeps serving: {reason}", current.number),
                    )
                    .await;
                Err(refused)
            }
        }
    }

    /// Jobs held for what the configuration lacked (a profile not
    /// mounted) look again now rather than at their next look, up to
    /// half a minute away: the new one may have it.
    async fn release_held_jobs(&self, authority: &Authority) {
        match authority
            .store()
            .release_held_jobs(authority.clock.unix_ms())
            .await
        {
            Ok(0) => {}
            Ok(released) => {
                tracing::info!(
                    event = "jobs.released",
                    released,
                    "held jobs look again under the new configuration"
                );
                self.lasting.queue.nudge();
            }
            // They look again at their time anyway.
            Err(e) => {
                tracing::warn!(event = "jobs.released", error = %e, "held jobs could not be made due; they look again at their time")
            }
        }
    }

    /// The next generation, built completely, or why not.
    async fn build(&self, current: &Generation, config: Config) -> Result<Generation, Refused> {
        let restart = needs_restart(&current.config, &config);
        if !restart.is_empty() {
            return Err(Refused(restart));
        }
        preflight(&config)?;
        let plugged: Signers = self
            .plugged
            .iter()
            .filter(|(name, _)| config.profiles.contains_key(*name))
            .map(|(name, signer)| (name.clone(), Arc::clone(signer)))
            .collect();
        let (authority, _terminator) = authority_for(
            &config,
            &self.clock,
            &self.lasting,
            &self.board,
            &self.base_url,
            plugged,
        )
        .await?;
        Ok(Generation {
            number: current.number + 1,
            router: routes_for(
                &config,
                Arc::clone(&authority),
                &self.base_url,
                &self.admission,
            ),
            authority,
            config: Arc::new(config),
        })
    }
}

/// The actor of a reload's audit row.
const RELOAD_ACTOR: &str = "system:reload";

/// What differs between `old` and `new` that only a restart can apply,
/// each saying so: the sockets, the database, the data directory, the TLS
/// and connection settings the listener was made with, and what every
/// generation shares (nonces, account copies, job slots).
fn needs_restart(old: &Config, new: &Config) -> Vec<String> {
    // Debug text stands in for equality: these settings are plain data.
    let same =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
    let mut changed = Vec::new();
    let mut check = |name: &str, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
        if !same(a, b) {
            changed.push(format!(
                "{name} changed from {a:?} to {b:?}, which only a restart applies; put the old value back to reload the rest"
            ));
        }
    };
    check("listen", &old.listen, &new.listen);
    check("public_url", &old.public_url, &new.public_url);
    check(
        "database_url",
        &old.database_url_shown(),
        &new.database_url_shown(),
    );
    check(
        "trusted_proxies",
        &old.trusted_proxies,
        &new.trusted_proxies,
    );
    check(
        "database_password_file",
        &old.database_password_file,
        &new.database_password_file,
    );
    check("data_dir", &old.data_dir, &new.data_dir);
    check(
        "database_max_connections",
        &old.database_max_connections,
        &new.database_max_connections,
    );
    check(
        "database_acquire_timeout",
        &old.database_acquire_timeout,
        &new.database_acquire_timeout,
    );
    check("[tls]", &old.tls, &new.tls);
    check("[connections]", &old.connections, &new.connections);
    check("[metrics] listen", &old.metrics.listen, &new.metrics.listen);
    check("[admin]", &old.admin, &new.admin);
    check("[dns_zone]", &old.dns_zone, &new.dns_zone);
    check("log_format", &old.log_format, &new.log_format);
    check("nonce_store", &old.nonce_store, &new.nonce_store);
    check(
        "account_cache_ttl",
        &old.account_cache_ttl,
        &new.account_cache_ttl,
    );
    check("shutdown_grace", &old.shutdown_grace, &new.shutdown_grace);
    check(
        "[jobs] concurrency",
        &old.jobs.concurrency,
        &new.jobs.concurrency,
    );
    // The shown URL hides its password: a change of the password alone
    // would pass the check of database_url and be ignored.
    if old.database_url_shown() == new.database_url_shown()
        && old.database_url() != new.database_url()
    {
        changed.push(
            "the password in database_url changed, which only a restart applies; put the old one back to reload the rest".to_owned(),
        );
    }
    changed
}

/// Loads (or makes) profile `name`'s embedded CA. A key in a token is
/// opened by calls into its PKCS#11 module (a session, a login, a test
/// signature) that may never return when the token stops answering: they
/// run on a thread of their own and are given up after twice the token's
/// `timeout`, so that start-up or a reload is refused with the reason
/// instead of waiting for ever (and every later SIGHUP behind it). A call
/// given up is left to return on its thread; its key is dropped then.
async fn open_local_ca(
    name: &str,
    ca: &crate::config::LocalCaConfig,
    config: &Config,
    clock: &SharedClock,
) -> Result<Signer, String> {
    let now = clock.now();
    let what = format!("setting up the CA of profile {name}");
    let Some(limit) = ca.pkcs11.as_ref().map(|token| token.timeout * 2) else {
        return LocalCa::load_or_create(name, ca, &config.data_dir, now)
            .map(|ca| Arc::new(ca) as Signer)
            .map_err(|e| format!("{what}: {e}"));
    };
    let (owned, ca, data_dir) = (name.to_owned(), ca.clone(), config.data_dir.clone());
    // A thread of its own, not the runtime's blocking pool: a runtime
    // waits for its blocking tasks when it is dropped, so a call stuck in
    // the module would keep the process from exiting.
    let (opened, opening) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("pkcs11-open".into())
        .spawn(move || {
            let _ = opened.send(LocalCa::load_or_create(&owned, &ca, &data_dir, now));
        })
        .map_err(|e| format!("{what}: starting the thread that opens the token's key: {e}"))?;
    match tokio::time::timeout(limit, opening).await {
        Ok(Ok(opened)) => opened
            .map(|ca| Arc::new(ca) as Signer)
            .map_err(|e| format!("{what}: {e}")),
        Ok(Err(e)) => Err(format!("{what}: opening the token's key: {e}")),
        Err(_) => Err(format!(
            "{what}: the token did not answer within {} (twice [profiles.{name}.signer.pkcs11] timeout) while its key was opened",
            humantime::format_duration(limit)
        )),
    }
}

/// Signers plugged in by a program that embeds the server, by profile name.
pub type Signers = BTreeMap<String, Signer>;

/// Builds everything and starts serving.
pub async fn start(config: Config, clock: SharedClock) -> anyhow::Result<Running> {
    start_with(config, clock, Signers::new()).await
}

/// [`start`], with the profiles named in `plugged` signed by the signer
/// given there instead of the one their configuration describes (which is
/// then not built): the hook for a signer backend outside this crate. The
/// authority asks it what it asks every signer ([`crate::signer::SignerBackend`]).
pub async fn start_with(
    config: Config,
    clock: SharedClock,
    plugged: Signers,
) -> anyhow::Result<Running> {
    // Bound before anything needs the public URL (account URLs in CAA
    // accounturi checks); requests wait until the router is served below.
    // Before a new data directory would be made beside the real one.
    refuse_moved_data_dir(&config).map_err(|e| Refused(vec![e]))?;
    create_private_dir(&config.data_dir)?;
    // First: a second server must not even look at files the first is
    // making (or open, create and migrate the database).
    let lock = crate::lock::acquire(&config.database_url())?;
    preflight(&config)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let addr = listener.local_addr()?;
    // With port 0 the real port is known only now.
    let base_url = config.base_url_at(addr);
    let kept_plugged: Signers = plugged
        .iter()
        .map(|(name, signer)| (name.clone(), Arc::clone(signer)))
        .collect();
    let Built {
        assembled: Assembled {
            authority, queue, ..
        },
        terminator,
        lasting,
        board,
    } = build(
        &config,
        Arc::clone(&clock),
        base_url.clone(),
        plugged,
        AuditOrigin::Server,
    )
    .await?;
    let store = authority.store().clone();
    // Admin commands' audit rows from now on are counted in the metrics.
    authority
        .metrics
        .count_cli_audit_after(store.last_audit_id().await?)
        .await;
    authority.refresh_stale_crls().await;
    let admission = Admission::new(config.max_in_flight, config.max_buffered_body_bytes);
    let generations = Generations::new(Generation {
        number: 1,
        router: routes_for(&config, Arc::clone(&authority), &base_url, &admission),
        authority: Arc::clone(&authority),
        config: Arc::new(config.clone()),
    });
    let (job_retention, job_retention_now) = watch::channel(Some(config.jobs.retention));
    let (audit_retention, audit_retention_now) = watch::channel(config.audit.retention);
    let reloader = Arc::new(Reloader {
        generations: generations.clone(),
        lasting,
        board,
        clock: Arc::clone(&clock),
        base_url: base_url.clone(),
        plugged: kept_plugged,
        job_retention,
        audit_retention,
        admission,
        busy: tokio::sync::Mutex::new(()),
        source: std::sync::Mutex::new(None),
    });

    let mut registry = Registry::default();
    registry
        .register(Arc::new(ValidationJobs {
            generations: generations.clone(),
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(RelayJobs {
            generations: generations.clone(),
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(UpstreamProbes {
            generations: generations.clone(),
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(FinalizeWatch {
            generations: generations.clone(),
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(NotifyJobs {
            generations: generations.clone(),
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(NonceSweep {
            generations: generations.clone(),
            every: NONCE_SWEEP_EVERY,
            sessions: config
                .admin
                .listen
                .map(|_| (config.admin.session_idle, config.admin.session_lifetime)),
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(CrlRefresh {
            generations: generations.clone(),
            every: CRL_CHECK_EVERY,
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(Retention {
            of: Retained::FinishedJobs,
            clock: Arc::clone(&clock),
            store: store.clone(),
            retention: job_retention_now,
            every: RETENTION_EVERY,
        }))
        .map_err(anyhow::Error::msg)?;
    if config.audit.retention.is_none() {
        // Keeping every row is a legitimate compliance choice, so there is
        // no default; but the log grows with every refusal, so say so once.
        tracing::warn!(
            event = "config.audit_retention",
            outcome = "warning",
            "audit.retention is not set: audit rows are kept for ever and the database grows with every issuance and refusal; to delete older rows, write [audit] retention = \"400d\" (at least a day)"
        );
    }
    // Registered whatever the setting: a reload may set it.
    registry
        .register(Arc::new(Retention {
            of: Retained::AuditRows,
            clock: Arc::clone(&clock),
            store: store.clone(),
            retention: audit_retention_now,
            every: RETENTION_EVERY,
        }))
        .map_err(anyhow::Error::msg)?;
    let runner = Arc::new(Runner::new(Arc::clone(&queue), registry));
    runner.recover().await.map_err(anyhow::Error::msg)?;

    // Bound before anything is spawned: a [dns_zone] address that cannot
    // be bound stops start-up with nothing left running.
    let dns = match &config.dns_zone {
        Some(zone) => {
            let answers = crate::dns_zone::Authority::new(
                zone,
                authority.store().clone(),
                Arc::clone(&authority.metrics),
            )
            .map_err(anyhow::Error::msg)?;
            let dns = crate::dns_zone::DnsServer::start(
                zone,
                config.connections.ipv6_client_prefix,
                answers,
            )
            .await
            .map_err(anyhow::Error::msg)?;
            for at in &dns.addresses {
                tracing::info!(event = "dns.started", outcome = "success", %at, zones = %zone.zones.join(","), "the DNS zone answers");
            }
            Some(dns)
        }
        None => None,
    };

    let (shutdown, stop) = watch::channel(false);
    let stop_metrics = stop.clone();
    let stop_admin = stop.clone();
    let jobs = tokio::spawn(Arc::clone(&runner).run(stop.clone(), config.shutdown_grace));
    let exempt = config.trusted_proxies.clone();
    // Registered now: a SIGHUP from here on reloads, never kills
    // (`systemctl reload` sends one through the unit's ExecReload).
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("listening for SIGHUP")?;
    let tls = match &terminator {
        Some(terminator) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(
                terminator.server_config().map_err(anyhow::Error::msg)?,
            );
            // The files are also re-read when they change.
            tokio::spawn(Arc::clone(terminator).watch(None, stop.clone()));
            Some(crate::listener::Tls {
                acceptor,
                handshake_timeout: terminator.handshake_timeout,
            })
        }
        None => None,
    };
    let hangup_stop = stop.clone();
    let settings = crate::listener::Listener {
        name: "acme",
        tls,
        limits: config.connections.clone(),
        exempt: exempt.clone(),
        metrics: Arc::clone(&authority.metrics),
    };
    let http = tokio::spawn(crate::listener::serve(
        listener,
        settings,
        crate::listener::Routes::Current(generations.clone()),
        stop,
    ));

    let metrics_addr = match config.metrics.listen {
        Some(at) => Some(
            serve_metrics(
                at,
                generations.clone(),
                crate::listener::Listener {
                    name: "metrics",
                    tls: None,
                    limits: config.connections.clone(),
                    exempt,
                    metrics: Arc::clone(&authority.metrics),
                },
                stop_metrics,
            )
            .await?,
        ),
        None => None,
    };
    let (admin_url, admin_terminator) = match config.admin.listen {
        Some(at) => {
            let (url, terminator) = serve_console(
                &config,
                at,
                &base_url,
                &clock,
                generations.clone(),
                crate::listener::Listener {
                    name: "admin",
                    tls: None,
                    limits: config.connections.clone(),
                    // The console's own proxies carry many clients too.
                    exempt: config
                        .trusted_proxies
                        .iter()
                        .chain(&config.admin.trusted_proxies)
                        .copied()
                        .collect(),
                    metrics: Arc::clone(&authority.metrics),
                },
                stop_admin,
            )
            .await?;
            (Some(url), terminator)
        }
        None => (None, None),
    };
    // SIGHUP re-reads every listener's certificate files, the console's
    // too, and then the configuration.
    tokio::spawn(on_hangup(
        hangup,
        Arc::clone(&reloader),
        terminator
            .iter()
            .chain(&admin_terminator)
            .cloned()
            .collect(),
        hangup_stop,
    ));
    tracing::info!(event = "server.started", outcome = "success", %addr, base_url = %base_url, "listening");
    Ok(Running {
        addr,
        admin_url,
        tls_cert: terminator.as_ref().map(|t| t.cert_path().to_owned()),
        metrics_addr,
        dns_addrs: dns
            .as_ref()
            .map(|d| d.addresses.clone())
            .unwrap_or_default(),
        dns,
        base_url,
        runner,
        generations,
        reloader,
        shutdown,
        http,
        jobs,
        _lock: lock,
    })
}

/// On each SIGHUP: the TLS files read again, then the configuration (when
/// the server knows where from), each outcome logged.
async fn on_hangup(
    mut hangup: tokio::signal::unix::Signal,
    reloader: Arc<Reloader>,
    terminators: Vec<Arc<crate::tls::Terminator>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            Some(()) = hangup.recv() => {}
            () = crate::listener::stopped(&mut stop) => return,
        }
        for terminator in &terminators {
            terminator.reload_logged("SIGHUP");
        }
        let loaded = {
            let source = reloader.source.lock().unwrap_or_else(|p| p.into_inner());
            source.as_ref().map(|load| load())
        };
        match loaded {
            Some(Ok(config)) => {
                // Logged and audited by the reload, applied or refused.
                let _ = reloader.reload(config).await;
            }
            Some(Err(e)) => {
                let current = reloader.generations.current();
                let reason = format!("the configuration does not load: {e}");
                tracing::error!(event = "config.reload", outcome = "refused", generation = current.number, reason = %reason, "configuration not reloaded; the previous one keeps serving");
                current
                    .authority
                    .audit_server(
                        AuditEvent::ConfigReload,
                        AuditOutcome::Refused,
                        RELOAD_ACTOR,
                        &format!("generation {} keeps serving: {reason}", current.number),
                    )
                    .await;
            }
            None if terminators.is_empty() => tracing::info!(
                event = "server.reload",
                outcome = "nothing",
                "SIGHUP: nothing to reload (no configuration source, no TLS files)"
            ),
            None => {}
        }
    }
}

/// `/metrics` on a listener of its own, so that scraping never competes
/// with ACME admission control and can be firewalled separately.
async fn serve_metrics(
    at: SocketAddr,
    generations: Generations,
    settings: crate::listener::Listener,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(at)
        .await
        .with_context(|| format!("binding the metrics listener {at}"))?;
    let addr = listener.local_addr()?;
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let authority = generations.authority();
            async move {
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    authority.render_metrics().await,
                )
            }
        }),
    );
    tokio::spawn(crate::listener::serve(
        listener,
        settings,
        crate::listener::Routes::Fixed(router),
        stop,
    ));
    tracing::info!(event = "metrics.started", outcome = "success", %addr, "serving /metrics");
    Ok(addr)
}

/// The web console on its own listener, with TLS when `[admin.tls]` is
/// set (its files watched like the ACME listener's, and re-read on
/// SIGHUP through the terminator returned); its URL.
async fn serve_console(
    config: &Config,
    at: SocketAddr,
    base_url: &str,
    clock: &SharedClock,
    generations: Generations,
    mut settings: crate::listener::Listener,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<(String, Option<Arc<crate::tls::Terminator>>)> {
    let mut reloaded = None;
    if let Some(tls) = &config.admin.tls {
        let terminator = Arc::new(
            crate::tls::Terminator::new(tls, &config.data_dir, base_url, clock.now())
                .map_err(|e| anyhow::anyhow!("[admin.tls]: {e}"))?,
        );
        settings.tls = Some(crate::listener::Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(
                terminator.server_config().map_err(anyhow::Error::msg)?,
            ),
            handshake_timeout: terminator.handshake_timeout,
        });
        tokio::spawn(Arc::clone(&terminator).watch(None, stop.clone()));
        reloaded = Some(terminator);
    }
    let https = settings.tls.is_some();
    let console = crate::console::Console::new(generations, config.admin.clone(), https).await?;
    let addr = crate::console::serve(console, at, settings, stop).await?;
    Ok((
        format!("{}://{addr}/", if https { "https" } else { "http" }),
        reloaded,
    ))
}

fn create_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    crate::private::create_dir(dir)
        .with_context(|| format!("creating the data directory {}", dir.display()))
}

/// What `serve` and `config check` refuse before the database is opened
/// (which would close its mode): a data directory whose secrets others can
/// read.
fn preflight(config: &Config) -> Result<(), Refused> {
    refuse_moved_data_dir(config).map_err(|e| Refused(vec![e]))?;
    refuse_read_only_database(config).map_err(|e| Refused(vec![e]))?;
    refuse_open_secrets(config).map_err(|e| Refused(vec![e]))
}

/// A SQLite database this process may not write (a read-only file, or a
/// file system mounted read-only) would be opened read-only and fail its
/// first migration with SQLite's own words: refused here, saying what to
/// change. Opening for writing writes nothing.
fn refuse_read_only_database(config: &Config) -> Result<(), String> {
    for file in crate::private::database_files(&config.database_url()) {
        let opened = std::fs::OpenOptions::new().write(true).open(&file);
        match opened {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
                ) =>
            {
                return Err(format!(
                    "the database file {} cannot be written by this user ({e}): make it writable by the server's user (chmod u+w, or chown it to that user), or remount its file system read-write",
                    file.display()
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A relative `data_dir` in a file is the file's neighbour; it used to be
/// the working directory's. Where the file's neighbour holds no database
/// yet and the working directory's does, starting would begin a new
/// installation (a new CA, no accounts) beside the real one: refused,
/// saying what to write.
pub(crate) fn refuse_moved_data_dir(config: &Config) -> Result<(), String> {
    let Some(written) = &config.data_dir_as_written else {
        return Ok(());
    };
    let database = |dir: &std::path::Path| dir.join("acme-proxy.db");
    if config.database_url.is_none()
        && !database(&config.data_dir).exists()
        && database(written).exists()
    {
        let found = std::path::absolute(written).unwrap_or_else(|_| written.clone());
        return Err(format!(
            "data_dir = {written:?} is relative to the configuration file's directory ({}), where there is no database yet, but {} holds one: write data_dir = {:?} to keep serving it",
            config.data_dir.display(),
            found.display(),
            found.display().to_string()
        ));
    }
    Ok(())
}

/// Refuses to serve from a data directory whose secrets others can read.
fn refuse_open_secrets(config: &Config) -> Result<(), String> {
    let secrets: Vec<std::path::PathBuf> = config
        .profiles
        .iter()
        .flat_map(|(name, p)| match &p.signer {
            SignerConfig::Relay(r) => r
                .upstreams()
                .enumerate()
                .map(|(i, u)| u.account_key_path(&config.data_dir, name, i == 0))
                .collect(),
            _ => Vec::new(),
        })
        .chain(config.database_password_file.clone())
        .chain(config.egress_credentials_files())
        .chain(config.policy_token_files())
        .collect();
    crate::private::refuse_open(&config.data_dir, &config.database_url(), &secrets)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::needs_restart;
    use crate::config::Config;

    #[test]
    fn a_new_password_in_the_database_url_needs_a_restart_and_is_not_shown() {
        let url = |password: &str| {
            Config::from_toml(&format!(
                "database_url = \"postgres://acme:{password}@db.internal/acme\"\n"
            ))
            .unwrap()
        };
        assert!(needs_restart(&url("old-secret"), &url("old-secret")).is_empty());
        let changed = needs_restart(&url("old-secret"), &url("new-secret")).join("\n");
        assert!(changed.contains("password in database_url"), "{changed}");
        assert!(
            !changed.contains("secret"),
            "a password in the message: {changed}"
        );
    }
}
