//! Assembly: configuration → store → profiles and signers → authority →
//! HTTP listener and background tasks; and graceful shutdown.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use acme_proxy_store::Store;
use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{self, AppState, Urls};
use crate::authority::{Authority, CrlRefresh, NonceSweep, Profile, RelayJobs, ValidationJobs};
use crate::clock::SharedClock;
use crate::config::{Config, SignerConfig};
use crate::jobs::periodic::{Retained, Retention};
use crate::jobs::{Queue, Registry, Runner};
use crate::metrics::Metrics;
use crate::notify::{Notifier, NotifyJobs};
use crate::signer::relay::ChallengeBoard;
use crate::signer::{LocalCa, Relay, Signer};
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
    pub base_url: String,
    /// The certificate the ACME listener serves, with `[tls]`.
    pub tls_cert: Option<std::path::PathBuf>,
    pub authority: Arc<Authority>,
    pub runner: Arc<Runner>,
    shutdown: watch::Sender<bool>,
    http: JoinHandle<()>,
    jobs: JoinHandle<()>,
}

impl Running {
    /// The directory URL of a profile.
    pub fn directory_url(&self, profile: &str) -> String {
        Urls::new(&self.base_url, profile).directory()
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
        self.authority.close().await;
        tracing::info!(event = "server.shutdown", outcome = "success", "stopped");
    }
}

/// The authority and what it stands on, built from a configuration: what
/// `serve` runs, and what operator commands act through (no listener, no
/// job runner: the jobs they queue are run by the server).
#[derive(Debug)]
pub struct Assembled {
    pub authority: Arc<Authority>,
    pub notifier: Arc<Notifier>,
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
            SignerConfig::LocalCa(ca) => {
                LocalCa::load_or_create(name, ca, &config.data_dir, clock.now())
                    .map(|ca| Arc::new(ca) as Signer)
                    .map_err(|e| format!("setting up the CA of profile {name}: {e}"))
            }
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
    let validators = Validators::new(&config.validation).map_err(|e| problems.push(e));
    let destinations = Notifier::destinations(config).map_err(|e| problems.push(e));
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
    match (validators, destinations, terminator) {
        (Ok(validators), Ok(destinations), Ok(terminator)) if problems.is_empty() => Ok(Prepared {
            signers,
            validators,
            destinations,
            terminator,
        }),
        _ => Err(Refused(problems)),
    }
}

/// The relay signer of profile `name`, with the upstream account the
/// operator registered (`store` is None when there is no database yet).
async fn relay_signer(
    name: &str,
    relay: &crate::config::RelayConfig,
    config: &Config,
    clock: &SharedClock,
    store: Option<&Store>,
    board: &Arc<ChallengeBoard>,
    metrics: &Arc<Metrics>,
) -> Result<Signer, String> {
    let account = match store {
        Some(store) => store
            .upstream_account(name)
            .await
            .map_err(|e| format!("reading the upstream account of profile {name}: {e}"))?,
        None => None,
    };
    // Registration is an operator's act: start-up never re-registers, and
    // a missing account says what to run.
    let account = account.ok_or_else(|| {
        format!(
            "profile {name} relays to {} but has no upstream account yet; run `acme-proxy upstream register --profile {name}` first",
            relay.directory
        )
    })?;
    if account.directory != relay.directory {
        return Err(format!(
            "profile {name}'s upstream account was registered at {} but the configuration now says {}; run `acme-proxy upstream register --profile {name}` again",
            account.directory, relay.directory
        ));
    }
    let relay = Relay::new(
        name,
        relay,
        &config.data_dir,
        &account,
        Arc::clone(board),
        Arc::clone(clock),
        Arc::clone(metrics),
    )
    .map_err(|e| format!("setting up the relay of profile {name}: {e}"))?;
    Ok(Arc::new(relay))
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
}

/// Opens the store and builds the profiles' signers, the notifier and the
/// authority. `base_url` is the server's public URL.
pub async fn assemble(
    config: &Config,
    clock: SharedClock,
    base_url: String,
) -> anyhow::Result<Assembled> {
    Ok(build(config, clock, base_url, Signers::new())
        .await?
        .assembled)
}

async fn build(
    config: &Config,
    clock: SharedClock,
    base_url: String,
    plugged: Signers,
) -> anyhow::Result<Built> {
    create_private_dir(&config.data_dir)?;
    let store = Store::open(&config.database_url(), &config.store_options()?)
        .await
        .with_context(|| format!("opening the database {}", config.database_url_shown()))?;

    let board = Arc::new(ChallengeBoard::default());
    let queue = Arc::new(Queue::new(
        store.clone(),
        Arc::clone(&clock),
        config.jobs.clone(),
    ));
    let metrics = Arc::new(Metrics::new(queue.observer.family()));
    let prepared = prepare(
        config,
        &clock,
        Some(&store),
        &base_url,
        &board,
        &metrics,
        Mode::Serve,
        plugged,
    )
    .await;
    let Prepared {
        mut signers,
        validators,
        destinations,
        terminator,
    } = match prepared {
        Ok(prepared) => prepared,
        Err(refused) => {
            store.close().await;
            return Err(refused.into());
        }
    };
    let mut profiles = BTreeMap::new();
    for (name, pc) in &config.profiles {
        let Some(signer) = signers.remove(name) else {
            anyhow::bail!("profile {name} has no signer");
        };
        if pc.bypass {
            tracing::warn!(
                event = "config.bypass",
                outcome = "warning",
                profile = %name,
                "DANGER: validation bypass is ON for this profile: every challenge is accepted without a check. Use only in tests."
            );
        }
        metrics.init_profile(name, &pc.challenges);
        profiles.insert(
            name.clone(),
            Arc::new(Profile::new(name.clone(), pc.clone(), signer)),
        );
    }
    let notifier = Arc::new(Notifier::new(
        destinations,
        Arc::clone(&queue),
        store.clone(),
        Arc::clone(&metrics),
    ));
    let authority = Arc::new(Authority::new(
        profiles,
        validators,
        Arc::clone(&queue),
        base_url,
        config,
        Arc::clone(&notifier),
        metrics,
    ));
    Ok(Built {
        assembled: Assembled {
            authority,
            notifier,
            queue,
        },
        terminator,
    })
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
    preflight(&config)?;
    create_private_dir(&config.data_dir)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let addr = listener.local_addr()?;
    // With port 0 the real port is known only now.
    let base_url = config.base_url_at(addr);
    let Built {
        assembled:
            Assembled {
                authority,
                notifier,
                queue,
            },
        terminator,
    } = build(&config, Arc::clone(&clock), base_url.clone(), plugged).await?;
    let store = authority.store().clone();
    authority.refresh_stale_crls().await;

    let mut registry = Registry::default();
    registry
        .register(Arc::new(ValidationJobs {
            authority: Arc::clone(&authority),
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(RelayJobs {
            authority: Arc::clone(&authority),
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(NotifyJobs { notifier }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(NonceSweep {
            authority: Arc::clone(&authority),
            every: NONCE_SWEEP_EVERY,
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(CrlRefresh {
            authority: Arc::clone(&authority),
            every: CRL_CHECK_EVERY,
        }))
        .map_err(anyhow::Error::msg)?;
    registry
        .register(Arc::new(Retention {
            of: Retained::FinishedJobs,
            clock: Arc::clone(&clock),
            store: store.clone(),
            retention: config.jobs.retention,
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
    if let Some(retention) = config.audit.retention {
        registry
            .register(Arc::new(Retention {
                of: Retained::AuditRows,
                clock: Arc::clone(&clock),
                store: store.clone(),
                retention,
                every: RETENTION_EVERY,
            }))
            .map_err(anyhow::Error::msg)?;
    }
    let runner = Arc::new(Runner::new(Arc::clone(&queue), registry));
    runner.recover().await.map_err(anyhow::Error::msg)?;

    let app = Arc::new(AppState::new(
        Arc::clone(&authority),
        base_url.clone(),
        config.max_body_bytes,
        config.connections.body_read_timeout,
        config.max_in_flight,
        api::forwarded::Forwarding::new(config.trusted_proxies.clone(), config.forwarded_header),
    ));
    let (shutdown, stop) = watch::channel(false);
    let stop_metrics = stop.clone();
    let jobs = tokio::spawn(Arc::clone(&runner).run(stop.clone(), config.shutdown_grace));
    let router = api::router(app);
    let exempt = config.trusted_proxies.clone();
    let tls = match &terminator {
        Some(terminator) => {
            // Registered now: a SIGHUP from here on reloads, never kills.
            let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .context("listening for SIGHUP")?;
            let acceptor = tokio_rustls::TlsAcceptor::from(
                terminator.server_config().map_err(anyhow::Error::msg)?,
            );
            tokio::spawn(Arc::clone(terminator).watch(Some(hangup), stop.clone()));
            Some(crate::listener::Tls {
                acceptor,
                handshake_timeout: terminator.handshake_timeout,
            })
        }
        None => {
            // `systemctl reload` (the unit's ExecReload) sends SIGHUP, whose
            // default action ends the process: take it, and say there is
            // nothing to re-read without TLS files.
            let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .context("listening for SIGHUP")?;
            let mut stopped = stop.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        Some(()) = hangup.recv() => tracing::info!(
                            event = "server.reload",
                            outcome = "nothing",
                            "SIGHUP: nothing to reload (no TLS files); other settings need a restart"
                        ),
                        () = crate::listener::stopped(&mut stopped) => break,
                    }
                }
            });
            None
        }
    };
    let settings = crate::listener::Listener {
        name: "acme",
        tls,
        limits: config.connections.clone(),
        exempt: exempt.clone(),
        metrics: Arc::clone(&authority.metrics),
    };
    let http = tokio::spawn(crate::listener::serve(listener, settings, router, stop));

    let metrics_addr = match config.metrics.listen {
        Some(at) => Some(
            serve_metrics(
                at,
                Arc::clone(&authority),
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
    tracing::info!(event = "server.started", outcome = "success", %addr, base_url = %base_url, "listening");
    Ok(Running {
        addr,
        tls_cert: terminator.as_ref().map(|t| t.cert_path().to_owned()),
        metrics_addr,
        base_url,
        authority,
        runner,
        shutdown,
        http,
        jobs,
    })
}

/// `/metrics` on a listener of its own, so that scraping never competes
/// with ACME admission control and can be firewalled separately.
async fn serve_metrics(
    at: SocketAddr,
    authority: Arc<Authority>,
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
            let authority = Arc::clone(&authority);
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
    tokio::spawn(crate::listener::serve(listener, settings, router, stop));
    tracing::info!(event = "metrics.started", outcome = "success", %addr, "serving /metrics");
    Ok(addr)
}

fn create_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    crate::private::create_dir(dir)
        .with_context(|| format!("creating the data directory {}", dir.display()))
}

/// What `serve` and `config check` refuse before the database is opened
/// (which would close its mode): a data directory whose secrets others can
/// read.
fn preflight(config: &Config) -> Result<(), Refused> {
    refuse_open_secrets(config).map_err(|e| Refused(vec![e]))
}

/// Refuses to serve from a data directory whose secrets others can read.
fn refuse_open_secrets(config: &Config) -> Result<(), String> {
    let secrets: Vec<std::path::PathBuf> = config
        .profiles
        .iter()
        .filter_map(|(name, p)| match &p.signer {
            SignerConfig::Relay(r) => Some(r.account_key_path(&config.data_dir, name)),
            _ => None,
        })
        .chain(config.database_password_file.clone())
        .collect();
    crate::private::refuse_open(&config.data_dir, &config.database_url(), &secrets)
}
