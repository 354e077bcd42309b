//! `acme-proxy status`: one look at an installation — whether its
//! listeners answer, whether its configuration would start, each profile's
//! signer (CA expiry, upstream reachability and account, the operator's
//! program), the job queue, relayed orders in flight, and the last
//! issuance and failure. Read-only: it opens the database read-only and
//! asks the upstream CA only for its directory.

use std::time::Duration;

use acme_proxy_store::{AuditEvent, Store};
use serde::Serialize;

use crate::clock::{SharedClock, rfc3339};
use crate::config::{Config, RelayConfig, SignerConfig};

/// How long a listener or an upstream CA is given to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    pub listeners: Vec<ListenerView>,
    pub database: String,
    /// What start-up would refuse; empty when it would start.
    pub configuration_problems: Vec<String>,
    pub profiles: Vec<ProfileView>,
    /// Jobs per kind and status (finished ones included).
    pub jobs: Vec<JobCount>,
    pub relay_orders_in_flight: i64,
    pub oldest_relay_order_since: Option<String>,
    pub last_issuance: Option<Happened>,
    pub last_failure: Option<Happened>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ListenerView {
    /// `acme` or `metrics`.
    pub name: &'static str,
    pub address: String,
    pub answering: bool,
    /// Why not, when it is not.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProfileView {
    pub name: String,
    /// `local_ca`, `relay` or `custom`.
    pub signer: &'static str,
    pub directory: String,
    /// Whether its signer looks able to sign (see `notes`).
    pub healthy: bool,
    /// What was found: the CA's subject and expiry, the upstream's answer
    /// and account, the program.
    pub notes: Vec<String>,
    pub ca_not_after: Option<String>,
    pub upstream_reachable: Option<bool>,
    pub upstream_account: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobCount {
    pub kind: String,
    pub status: String,
    pub count: i64,
}

/// An audit record in brief.
#[derive(Debug, Clone, Serialize)]
pub struct Happened {
    pub at: String,
    pub profile: Option<String>,
    pub what: String,
}

pub async fn status(
    config: &Config,
    store: &Store,
    clock: SharedClock,
) -> Result<StatusView, super::ops::OpsError> {
    let mut listeners = vec![listener("acme", config.listen).await];
    if let Some(addr) = config.metrics.listen {
        listeners.push(listener("metrics", addr).await);
    }
    let configuration_problems = match crate::server::check(config, clock.clone()).await {
        Ok(_) => Vec::new(),
        Err(refused) => refused.0,
    };
    let now = clock.unix();
    let mut profiles = Vec::new();
    for (name, p) in &config.profiles {
        let directory = format!("{}/profile/{name}/directory", config.base_url());
        let view = match &p.signer {
            SignerConfig::LocalCa(ca) => {
                let path = crate::signer::local_ca::ca_cert_path(name, ca, &config.data_dir);
                local_ca(name, directory, &path, now)
            }
            SignerConfig::Relay(relay) => {
                let mut accounts = Vec::new();
                for upstream in relay.upstreams() {
                    accounts.push(
                        store
                            .upstream_account(name, &upstream.name)
                            .await?
                            .map(|row| row.account_url),
                    );
                }
                relay_view(config, name, directory, relay, accounts).await
            }
            SignerConfig::Custom(custom) => {
                let (healthy, note) = program(&custom.command);
                ProfileView {
                    name: name.clone(),
                    signer: "custom",
                    directory,
                    healthy,
                    notes: vec![note],
                    ca_not_after: None,
                    upstream_reachable: None,
                    upstream_account: None,
                }
            }
        };
        profiles.push(view);
    }
    let jobs = store
        .job_counts()
        .await?
        .by_kind_and_status
        .into_iter()
        .map(|(kind, status, count)| JobCount {
            kind,
            status,
            count,
        })
        .collect();
    let (relay_orders_in_flight, oldest) = store.relay_in_flight().await?;
    let last = |event: AuditEvent| async move {
        Ok::<_, super::ops::OpsError>(
            store
                .audit_recent(Some(event.as_str()), 1)
                .await?
                .into_iter()
                .next()
                .map(|r| Happened {
                    at: rfc3339(r.at),
                    profile: r.profile,
                    what: match (r.serial, r.detail) {
                        (_, Some(detail)) if r.outcome != "success" => detail,
                        (Some(serial), _) => format!(
                            "serial {serial} for {}",
                            r.identifiers
                                .iter()
                                .map(|i| i.value.as_str())
                                .collect::<Vec<_>>()
                                .join(",")
                        ),
                        (None, detail) => detail.unwrap_or_default(),
                    },
                }),
        )
    };
    Ok(StatusView {
        listeners,
        database: config.database_url_shown(),
        configuration_problems,
        profiles,
        jobs,
        relay_orders_in_flight,
        oldest_relay_order_since: oldest.map(rfc3339),
        last_issuance: last(AuditEvent::CertificateIssued).await?,
        last_failure: last(AuditEvent::CertificateIssueFailed).await?,
    })
}

/// Whether something accepts TCP connections at `addr` (a wildcard
/// address is tried on loopback).
async fn listener(name: &'static str, addr: std::net::SocketAddr) -> ListenerView {
    let mut target = addr;
    if addr.ip().is_unspecified() {
        target.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let error =
        match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(target)).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("{target}: {e}")),
            Err(_) => Some(format!("{target}: no answer within {PROBE_TIMEOUT:?}")),
        };
    ListenerView {
        name,
        address: addr.to_string(),
        answering: error.is_none(),
        error,
    }
}

fn local_ca(name: &str, directory: String, path: &std::path::Path, now: i64) -> ProfileView {
    let mut view = ProfileView {
        name: name.to_owned(),
        signer: "local_ca",
        directory,
        healthy: false,
        notes: Vec::new(),
        ca_not_after: None,
        upstream_reachable: None,
        upstream_account: None,
    };
    let pem = match std::fs::read(path) {
        Ok(pem) => pem,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            view.notes.push(format!(
                "no CA certificate at {} yet: the server generates it when it first starts",
                path.display()
            ));
            return view;
        }
        Err(e) => {
            view.notes.push(format!(
                "reading the CA certificate {}: {e}",
                path.display()
            ));
            return view;
        }
    };
    match x509_parser::pem::parse_x509_pem(&pem) {
        Ok((_, block)) => match block.parse_x509() {
            Ok(cert) => {
                let not_after = cert.validity().not_after.timestamp();
                let days = (not_after - now).div_euclid(86_400);
                view.healthy = not_after > now;
                view.ca_not_after = Some(rfc3339(not_after));
                view.notes.push(format!(
                    "CA {} expires {} ({})",
                    cert.subject(),
                    rfc3339(not_after),
                    if days >= 0 {
                        format!("in {days} days")
                    } else {
                        "expired".to_owned()
                    }
                ));
            }
            Err(e) => view.notes.push(format!("{}: {e}", path.display())),
        },
        Err(e) => view
            .notes
            .push(format!("{} is not a PEM certificate: {e}", path.display())),
    }
    view
}

/// A relay profile: each upstream reached as the relay would, and its
/// account (`accounts`, one per upstream in order). Healthy when every
/// upstream has an account and one at least answers.
async fn relay_view(
    config: &Config,
    name: &str,
    directory: String,
    relay: &RelayConfig,
    accounts: Vec<Option<String>>,
) -> ProfileView {
    let mut notes = Vec::new();
    let mut reachable = false;
    for (upstream, account) in relay.upstreams().zip(&accounts) {
        let label = &upstream.name;
        match probe(config, upstream).await {
            Ok(status) => {
                notes.push(format!(
                    "upstream {label} at {} answers HTTP {status} ({})",
                    upstream.directory,
                    super::ops::route(config.relay_egress(upstream), &upstream.directory)
                ));
                reachable |= status.is_success();
            }
            Err(e) => notes.push(format!("upstream {label} at {}: {e}", upstream.directory)),
        }
        match account {
            Some(url) => notes.push(format!("upstream {label} account {url}")),
            None => notes.push(format!(
                "no account at upstream {label}: run `acme-proxy upstream register --profile {name} --upstream {label}`"
            )),
        }
    }
    let registered = accounts.iter().all(Option::is_some);
    ProfileView {
        name: name.to_owned(),
        signer: "relay",
        directory,
        healthy: reachable && registered,
        notes,
        ca_not_after: None,
        upstream_reachable: Some(reachable),
        upstream_account: accounts.into_iter().next().flatten(),
    }
}

/// GETs the upstream's directory as the relay would reach it (its trust
/// anchors, its proxy route); its HTTP status, or why there was none.
async fn probe(config: &Config, relay: &RelayConfig) -> Result<http::StatusCode, String> {
    let egress = crate::egress::Egress::from_config(config.relay_egress(relay))?;
    let roots = crate::egress::roots(&relay.trust_anchors)?;
    let client = crate::egress::Builder::new(std::sync::Arc::new(egress), roots)?
        .connect_timeout(PROBE_TIMEOUT)
        .https_only()
        .build::<http_body_util::Empty<bytes::Bytes>>();
    let request = http::Request::get(&relay.directory)
        .body(http_body_util::Empty::new())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(PROBE_TIMEOUT, client.request(request)).await {
        Ok(Ok(response)) => Ok(response.status()),
        Ok(Err(e)) => Err(crate::egress::chain(&*e)),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// Whether the operator's program is there and executable.
fn program(command: &std::path::Path) -> (bool, String) {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(command) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
            (true, format!("program {}", command.display()))
        }
        Ok(_) => (
            false,
            format!("{} is not an executable file", command.display()),
        ),
        Err(e) => (false, format!("{}: {e}", command.display())),
    }
}
