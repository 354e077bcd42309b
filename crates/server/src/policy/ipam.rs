//! The `ipam` check: whether the IP address management system of record
//! gives an identifier to the client's address. One trait, [`Source`],
//! for what a system answers; [`Ipam`] around it for what every system
//! needs (a deadline, a bound on lookups at once, a short cache).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acme_proxy_protocol::types::{Identifier, IdentifierType};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use serde::Deserialize;
use tokio::sync::Semaphore;

use super::Truth;
use crate::config::{Config, IpamCheck, IpamSource};
use crate::egress::{self, Egress, Outbound};

/// Lookups of one check in flight at once: a newOrder of a hundred names,
/// or many clients at once, must not open a connection each to the
/// system of record.
const LOOKUPS_AT_ONCE: usize = 8;
/// Cached answers at most per check; the cache starts over beyond.
const CACHE_MAX: usize = 4096;
/// The most of an answer read: a page of addresses is a few kilobytes.
const ANSWER_CAP: usize = 1 << 20;
/// Addresses asked for per page; a name with more is asked again with
/// the client's address as a filter.
const PAGE: usize = 100;

/// A system of record's answer about one identifier and client address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answer {
    pub owned: bool,
    /// What the system said, for the audit row and `policy explain`.
    pub note: String,
}

/// An IP address management system.
#[async_trait::async_trait]
pub(super) trait Source: Send + Sync + std::fmt::Debug {
    /// Whether `identifier` belongs to `client`; an error when the system
    /// could not be asked or its answer not read (undecided).
    async fn owns(&self, client: IpAddr, identifier: &Identifier) -> Result<Answer, String>;
}

/// A definite answer and when it was found.
type Cached = (bool, String, Instant);

pub(super) struct Ipam {
    source: Box<dyn Source>,
    timeout: Duration,
    cache_for: Duration,
    cache: Mutex<HashMap<(IpAddr, Identifier), Cached>>,
    turns: Semaphore,
}

impl std::fmt::Debug for Ipam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ipam")
            .field("source", &self.source)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Ipam {
    /// The check `key` of `config`, or every reason it cannot be built.
    pub(super) fn build(
        key: &str,
        config: &IpamCheck,
        whole: &Config,
    ) -> Result<Self, Vec<String>> {
        let mut problems = Vec::new();
        if config.timeout < Duration::from_millis(10) || config.timeout > Duration::from_secs(10) {
            problems.push(format!(
                "{key}.timeout must be between 10ms and 10s (a client waits for it); write e.g. timeout = \"2s\""
            ));
        }
        if config.cache_for > Duration::from_secs(600) {
            problems.push(format!(
                "{key}.cache_for must be at most 10m (an address given to another host must not be believed for long); write e.g. cache_for = \"1m\""
            ));
        }
        if config.statuses.is_empty() {
            problems.push(format!(
                "{key}.statuses is empty, so the check could never be true; write e.g. statuses = [\"active\"]"
            ));
        }
        let source = match config.source {
            IpamSource::Netbox => NetBox::build(key, config, whole).map_err(|e| problems.push(e)),
        };
        match source {
            Ok(source) if problems.is_empty() => Ok(Self::with_source(
                Box::new(source),
                config.timeout,
                config.cache_for,
            )),
            _ => Err(problems),
        }
    }

    pub(super) fn with_source(
        source: Box<dyn Source>,
        timeout: Duration,
        cache_for: Duration,
    ) -> Self {
        Self {
            source,
            timeout,
            cache_for,
            cache: Mutex::new(HashMap::new()),
            turns: Semaphore::new(LOOKUPS_AT_ONCE),
        }
    }

    /// The cached answer about `identifier` for `client`, or the system's
    /// within the deadline (waiting for a turn counts against it).
    pub(super) async fn answer(
        &self,
        client: IpAddr,
        identifier: &Identifier,
    ) -> (Truth, Option<String>) {
        let key = (client, identifier.clone());
        if let Some((owned, note, at)) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            && at.elapsed() < self.cache_for
        {
            return (Truth::from_bool(*owned), Some(format!("{note} (cached)")));
        }
        let ask = async {
            let _turn = self.turns.acquire().await.map_err(|e| e.to_string())?;
            self.source.owns(client, identifier).await
        };
        match tokio::time::timeout(self.timeout, ask).await {
            Ok(Ok(answer)) => {
                if !self.cache_for.is_zero() {
                    let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                    if cache.len() >= CACHE_MAX {
                        cache.clear();
                    }
                    cache.insert(key, (answer.owned, answer.note.clone(), Instant::now()));
                }
                (Truth::from_bool(answer.owned), Some(answer.note))
            }
            Ok(Err(why)) => (Truth::Undecided, Some(why)),
            Err(_) => (
                Truth::Undecided,
                Some(format!(
                    "the IPAM system did not answer within {:?}",
                    self.timeout
                )),
            ),
        }
    }
}

/// NetBox's REST API: `GET /api/ipam/ip-addresses/` filtered by DNS name
/// or address. Every IP address object is there, whether on its own or
/// assigned to a device's or virtual machine's interface.
pub(super) struct NetBox {
    base: String,
    authorization: http::HeaderValue,
    statuses: Vec<String>,
    client: Outbound<Empty<Bytes>>,
}

impl std::fmt::Debug for NetBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetBox")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// One page of `/api/ipam/ip-addresses/`.
#[derive(Debug, Deserialize)]
struct Page {
    count: usize,
    results: Vec<Address>,
}

#[derive(Debug, Deserialize)]
struct Address {
    /// With its prefix length: `10.20.0.5/24`.
    address: String,
    #[serde(default)]
    dns_name: String,
    status: Option<Status>,
}

#[derive(Debug, Deserialize)]
struct Status {
    value: String,
}

impl Address {
    fn host(&self) -> Option<IpAddr> {
        let host = self.address.split('/').next()?;
        host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
    }

    fn status(&self) -> &str {
        self.status.as_ref().map_or("", |s| s.value.as_str())
    }
}

impl NetBox {
    fn build(key: &str, config: &IpamCheck, whole: &Config) -> Result<Self, String> {
        let uri: http::Uri = config.url.parse().map_err(|_| {
            format!(
                "{key}.url {:?} is not a URL; write e.g. url = \"https://netbox.example.internal\"",
                config.url
            )
        })?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(format!(
                "{key}.url {:?} must be an http:// or https:// URL naming a host; write e.g. url = \"https://netbox.example.internal\"",
                config.url
            ));
        }
        if uri.query().is_some() {
            return Err(format!(
                "{key}.url {:?} has a query; write the base URL alone",
                config.url
            ));
        }
        let authorization = read_token(&config.token_file)
            .map_err(|e| format!("{key}.token_file {}: {e}", config.token_file.display()))?;
        let egress = Egress::from_config(&whole.egress).map_err(|e| format!("{key}: {e}"))?;
        let roots = egress::roots(&config.trust_anchors).map_err(|e| format!("{key}: {e}"))?;
        let client = egress::Builder::new(Arc::new(egress), roots)
            .map_err(|e| format!("{key}: {e}"))?
            .build();
        Ok(Self {
            base: config.url.trim_end_matches('/').to_owned(),
            authorization,
            statuses: config.statuses.clone(),
            client,
        })
    }

    /// One page of addresses matching `filter` (a query string).
    async fn page(&self, filter: &str) -> Result<Page, String> {
        let url = format!("{}/api/ipam/ip-addresses/?{filter}&limit={PAGE}", self.base);
        let request = http::Request::get(url)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::AUTHORIZATION, self.authorization.clone())
            .header(http::header::USER_AGENT, "acme-proxy-policy")
            .body(Empty::new())
            .map_err(|e| format!("the NetBox request cannot be built: {e}"))?;
        let response = self.client.request(request).await.map_err(|e| {
            format!(
                "NetBox at {} could not be asked: {}",
                self.base,
                egress::chain(&*e)
            )
        })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), ANSWER_CAP)
            .collect()
            .await
            .map_err(|e| format!("NetBox's answer could not be read: {e}"))?
            .to_bytes();
        if !status.is_success() {
            let why = match status.as_u16() {
                401 | 403 => "its token_file's token was refused, or may not read IP addresses",
                404 => "is the url NetBox's, without /api?",
                _ => "NetBox's own trouble",
            };
            return Err(format!("NetBox answered {status} ({why})"));
        }
        serde_json::from_slice(&body)
            .map_err(|e| format!("NetBox's answer is not an address list: {e}"))
    }

    fn counts(&self, a: &Address) -> bool {
        self.statuses.iter().any(|s| s == a.status())
    }
}

#[async_trait::async_trait]
impl Source for NetBox {
    async fn owns(&self, client: IpAddr, identifier: &Identifier) -> Result<Answer, String> {
        let client = client.to_canonical();
        match identifier.kind {
            IdentifierType::Dns => {
                let name = &identifier.value;
                // NetBox keeps a dns_name as written, a final dot and all:
                // both spellings are asked for (the values are ORed).
                let named = format!(
                    "dns_name__ie={}&dns_name__ie={}.",
                    query_value(name),
                    query_value(name)
                );
                let first = self.page(&named).await?;
                let page = if first.count > first.results.len()
                    && !first.results.iter().any(|a| a.host() == Some(client))
                {
                    self.page(&format!("{named}&address={client}")).await?
                } else {
                    Page {
                        count: first.count,
                        results: Vec::new(),
                    }
                };
                let mine: Vec<&Address> = first
                    .results
                    .iter()
                    .chain(&page.results)
                    .filter(|a| {
                        a.host() == Some(client)
                            && a.dns_name.trim_end_matches('.').eq_ignore_ascii_case(name)
                    })
                    .collect();
                if let Some(a) = mine.iter().find(|a| self.counts(a)) {
                    return Ok(Answer {
                        owned: true,
                        note: format!("NetBox: {name} is {} ({})", a.address, a.status()),
                    });
                }
                let note = match (mine.first(), first.results.first()) {
                    (Some(a), _) => format!(
                        "NetBox: {name} is {}, whose status {} does not count",
                        a.address,
                        a.status()
                    ),
                    (None, Some(_)) => {
                        let others: Vec<&str> = first
                            .results
                            .iter()
                            .take(3)
                            .map(|a| a.address.as_str())
                            .collect();
                        format!(
                            "NetBox gives {name} to {}, not to {client}",
                            others.join(", ")
                        )
                    }
                    (None, None) => format!("NetBox has no address named {name}"),
                };
                Ok(Answer { owned: false, note })
            }
            IdentifierType::Ip => {
                let Ok(ip) = identifier.value.parse::<IpAddr>() else {
                    return Ok(Answer {
                        owned: false,
                        note: format!("{} is not an address", identifier.value),
                    });
                };
                let ip = ip.to_canonical();
                if ip != client {
                    return Ok(Answer {
                        owned: false,
                        note: format!("{ip} is not the client's address {client}"),
                    });
                }
                let page = self.page(&format!("address={ip}")).await?;
                let mine: Vec<&Address> = page
                    .results
                    .iter()
                    .filter(|a| a.host() == Some(ip))
                    .collect();
                if let Some(a) = mine.iter().find(|a| self.counts(a)) {
                    return Ok(Answer {
                        owned: true,
                        note: format!("NetBox: {} ({})", a.address, a.status()),
                    });
                }
                Ok(match mine.first() {
                    Some(a) => Answer {
                        owned: false,
                        note: format!(
                            "NetBox: {}, whose status {} does not count",
                            a.address,
                            a.status()
                        ),
                    },
                    None => Answer {
                        owned: false,
                        note: format!("NetBox has no address {ip}"),
                    },
                })
            }
        }
    }
}

/// `value` for a query string: what is not a letter, digit or one of
/// `-._~*:` percent-encoded (`policy explain` passes identifiers as typed).
fn query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~*:".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The token of `path`'s first line as an `Authorization` value, marked
/// sensitive so that no log shows it: `Bearer` for a v2 token
/// (`nbt_KEY.TOKEN`), `Token` for a v1 one.
fn read_token(path: &std::path::Path) -> Result<http::HeaderValue, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot be read: {e}"))?;
    let token = text.lines().next().unwrap_or_default().trim();
    if token.is_empty() {
        return Err("is empty; write the NetBox API token on its first line".into());
    }
    let scheme = if token.starts_with("nbt_") {
        "Bearer"
    } else {
        "Token"
    };
    let mut value = http::HeaderValue::from_str(&format!("{scheme} {token}"))
        .map_err(|_| "holds characters a token cannot have".to_owned())?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A system of record for the wrapper's tests: answers from a list in
    /// turn (the last one again), counting how often it was asked, after
    /// `delay`.
    #[derive(Debug)]
    struct Scripted {
        answers: Vec<Result<bool, String>>,
        asked: Arc<AtomicUsize>,
        delay: Duration,
    }

    #[async_trait::async_trait]
    impl Source for Scripted {
        async fn owns(&self, _: IpAddr, id: &Identifier) -> Result<Answer, String> {
            let n = self.asked.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            let answer = self.answers[n.min(self.answers.len() - 1)].clone()?;
            Ok(Answer {
                owned: answer,
                note: format!("{} asked {}", id.value, n + 1),
            })
        }
    }

    fn ipam(
        answers: Vec<Result<bool, String>>,
        delay: Duration,
        cache_for: Duration,
    ) -> (Ipam, Arc<AtomicUsize>) {
        let asked = Arc::new(AtomicUsize::new(0));
        let source = Scripted {
            answers,
            asked: Arc::clone(&asked),
            delay,
        };
        (
            Ipam::with_source(Box::new(source), Duration::from_millis(200), cache_for),
            asked,
        )
    }

    fn host(name: &str) -> Identifier {
        Identifier {
            kind: IdentifierType::Dns,
            value: name.to_owned(),
        }
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 20, 0, 5));

    #[tokio::test]
    async fn a_definite_answer_is_reused_for_the_same_client_and_name_only() {
        let (ipam, asked) = ipam(
            vec![Ok(true), Ok(false)],
            Duration::ZERO,
            Duration::from_secs(60),
        );
        let first = ipam.answer(CLIENT, &host("host1.lab.test")).await;
        assert_eq!(first, (Truth::True, Some("host1.lab.test asked 1".into())));
        let again = ipam.answer(CLIENT, &host("host1.lab.test")).await;
        assert_eq!(
            again,
            (Truth::True, Some("host1.lab.test asked 1 (cached)".into()))
        );
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        let other = ipam.answer(CLIENT, &host("host2.lab.test")).await;
        assert_eq!(other.0, Truth::False);
        let elsewhere = ipam
            .answer("10.20.0.6".parse().unwrap(), &host("host1.lab.test"))
            .await;
        assert_eq!(elsewhere.0, Truth::False);
        assert_eq!(asked.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn cache_for_zero_asks_every_time() {
        let (ipam, asked) = ipam(vec![Ok(true), Ok(false)], Duration::ZERO, Duration::ZERO);
        assert_eq!(
            ipam.answer(CLIENT, &host("a.lab.test")).await.0,
            Truth::True
        );
        assert_eq!(
            ipam.answer(CLIENT, &host("a.lab.test")).await.0,
            Truth::False
        );
        assert_eq!(asked.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_lookup_is_undecided_and_never_kept() {
        let (ipam, asked) = ipam(
            vec![Err("NetBox answered 502".into()), Ok(true)],
            Duration::ZERO,
            Duration::from_secs(60),
        );
        assert_eq!(
            ipam.answer(CLIENT, &host("a.lab.test")).await,
            (Truth::Undecided, Some("NetBox answered 502".into()))
        );
        assert_eq!(
            ipam.answer(CLIENT, &host("a.lab.test")).await.0,
            Truth::True
        );
        assert_eq!(asked.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_lookup_past_its_deadline_is_undecided() {
        let (ipam, _) = ipam(
            vec![Ok(true)],
            Duration::from_secs(5),
            Duration::from_secs(60),
        );
        let started = Instant::now();
        let (truth, note) = ipam.answer(CLIENT, &host("a.lab.test")).await;
        assert_eq!(truth, Truth::Undecided);
        assert_eq!(
            note.as_deref(),
            Some("the IPAM system did not answer within 200ms")
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn query_values_are_percent_encoded_beyond_names_and_addresses() {
        assert_eq!(query_value("*.host1.lab.test"), "*.host1.lab.test");
        assert_eq!(query_value("2001:db8::1"), "2001:db8::1");
        assert_eq!(query_value("a&limit=1 #"), "a%26limit%3D1%20%23");
    }

    #[test]
    fn a_v2_token_is_a_bearer_token_and_an_older_one_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "nbt_abc123.s3cret\n").unwrap();
        let v = read_token(&file).unwrap();
        assert_eq!(v.to_str().unwrap(), "Bearer nbt_abc123.s3cret");
        assert!(v.is_sensitive());
        std::fs::write(&file, "0123456789abcdef0123456789abcdef01234567").unwrap();
        assert_eq!(
            read_token(&file).unwrap().to_str().unwrap(),
            "Token 0123456789abcdef0123456789abcdef01234567"
        );
        std::fs::write(&file, "\n").unwrap();
        assert!(read_token(&file).unwrap_err().contains("is empty"));
    }
}
