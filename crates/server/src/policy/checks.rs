//! The checks a rule can name, built from `[policy.checks.NAME]`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::proto::rr::RData;

use acme_proxy_protocol::types::{Identifier, IdentifierType};
use regex::RegexSet;
use tokio::sync::Semaphore;

use super::{Subject, Truth};
use crate::config::{CheckConfig, Config, Stage};

/// Output kept of a check program: one reason line is all that is read.
const PROGRAM_OUTPUT_CAP: usize = 4096;
/// The longest reason kept from a program.
const REASON_CHARS: usize = 200;

/// Check programs running at once in this process, whichever generation
/// and client started them: a client with a hundred identifiers, or many
/// clients at once, must not start a process each. Four keep a few
/// slow answers from holding everyone up on a two-core machine.
static PROGRAMS: Semaphore = Semaphore::const_new(4);

/// How an identifier check treats a wildcard name, which stands for every
/// name one label below its base: `Every` is true only when every covered
/// name passes, `Any` when some does. The policy picks, per place in a
/// rule, the one that makes the rule stricter, so that `*.lab.test` is
/// neither allowed by a rule meant for some lab names nor let past a rule
/// denying one of them. Other identifiers get the same answer from both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavour {
    Every = 0,
    Any = 1,
}

impl Flavour {
    fn other(self) -> Self {
        match self {
            Flavour::Every => Flavour::Any,
            Flavour::Any => Flavour::Every,
        }
    }
}

/// How long a reverse-name answer (true or false) is reused: a client's
/// requests come in bursts, and its PTR record does not change between
/// them.
const REVERSE_CACHE_FOR: Duration = Duration::from_secs(60);
/// Addresses remembered at most per check; the cache starts over beyond.
const REVERSE_CACHE_MAX: usize = 4096;

#[derive(Debug)]
pub(super) enum Check {
    ClientIp(Vec<ipnet::IpNet>),
    ReverseDns(Box<ReverseDns>),
    Identifiers(Box<IdentifierMatch>),
    Eab {
        key_ids: Vec<String>,
        labels: Vec<String>,
    },
    Path(Vec<String>),
    Program(Program),
    Ipam(Box<super::ipam::Ipam>),
}

#[derive(Debug)]
pub(super) struct IdentifierMatch {
    allow: Vec<Pattern>,
    deny: Vec<Pattern>,
    allow_regex: Option<RegexSet>,
    deny_regex: Option<RegexSet>,
    types: Vec<IdentifierType>,
    wildcards: bool,
}

/// One `allow`/`deny` entry: a DNS glob (lowercase labels, `*` one label)
/// or an address network.
#[derive(Debug)]
enum Pattern {
    Dns(Vec<String>),
    Network(ipnet::IpNet),
}

/// A check's value, its note, and when it was found.
type Answered = (Truth, Option<String>, Instant);

pub(super) struct ReverseDns {
    names: Vec<Vec<String>>,
    forward_confirmed: bool,
    timeout: Duration,
    /// The validators' resolver (`validation.dns_resolvers`); None where
    /// there is none (unit tests), which makes the check undecided.
    resolver: Option<Arc<TokioResolver>>,
    cache: Mutex<HashMap<IpAddr, Answered>>,
}

impl std::fmt::Debug for ReverseDns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReverseDns")
            .field("names", &self.names)
            .field("forward_confirmed", &self.forward_confirmed)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub(super) struct Program {
    command: PathBuf,
    args: Vec<String>,
    timeout: Duration,
}

impl Check {
    pub(super) fn build(
        name: &str,
        config: &CheckConfig,
        whole: &Config,
        resolver: Option<&Arc<TokioResolver>>,
    ) -> Result<Self, Vec<String>> {
        let key = format!("policy.checks.{name}");
        let mut problems = Vec::new();
        let check = match config {
            CheckConfig::ClientIp(c) => {
                if c.networks.is_empty() {
                    problems.push(format!(
                        "{key}: networks is empty; write e.g. networks = [\"10.20.0.0/16\"]"
                    ));
                }
                problems.extend(c.networks.iter().filter_map(|n| mapped(&key, n)));
                Check::ClientIp(c.networks.clone())
            }
            CheckConfig::ReverseDns(c) => {
                let mut names = Vec::new();
                for glob in &c.names {
                    match Pattern::parse(glob) {
                        Ok(Pattern::Dns(labels)) => names.push(labels),
                        _ => problems.push(format!(
                            "{key}.names: {glob:?} is not a DNS name glob; write e.g. \"*.lab.example.internal\""
                        )),
                    }
                }
                if c.names.is_empty() {
                    problems.push(format!(
                        "{key}: names is empty; write e.g. names = [\"*.lab.example.internal\"]"
                    ));
                }
                if c.timeout < Duration::from_millis(10) || c.timeout > Duration::from_secs(5) {
                    problems.push(format!(
                        "{key}.timeout must be between 10ms and 5s (a client waits for it); write e.g. timeout = \"1s\""
                    ));
                }
                Check::ReverseDns(Box::new(ReverseDns {
                    names,
                    forward_confirmed: c.forward_confirmed,
                    timeout: c.timeout,
                    resolver: resolver.cloned(),
                    cache: Mutex::new(HashMap::new()),
                }))
            }
            CheckConfig::Identifiers(c) => {
                let mut patterns = |list: &[String], field: &str| -> Vec<Pattern> {
                    list.iter()
                        .filter_map(|p| match Pattern::parse(p) {
                            Ok(p) => Some(p),
                            Err(e) => {
                                problems.push(format!("{key}.{field}: {p:?} {e}"));
                                None
                            }
                        })
                        .collect()
                };
                let allow = patterns(&c.allow, "allow");
                let deny = patterns(&c.deny, "deny");
                let mut regexes = |list: &[String], field: &str| -> Option<RegexSet> {
                    if list.is_empty() {
                        return None;
                    }
                    // Each alone first: `a)|(b` must not escape the
                    // anchors it is put between.
                    for r in list {
                        if let Err(e) = regex::Regex::new(r) {
                            problems.push(format!(
                                "{key}.{field}: {r:?} is not a regular expression this server reads: {e}"
                            ));
                            return None;
                        }
                    }
                    let anchored: Vec<String> =
                        list.iter().map(|r| format!(r"\A(?:{r})\z")).collect();
                    match RegexSet::new(&anchored) {
                        Ok(set) => Some(set),
                        Err(e) => {
                            problems.push(format!(
                                "{key}.{field}: not a regular expression this server reads: {e}"
                            ));
                            None
                        }
                    }
                };
                let allow_regex = regexes(&c.allow_regex, "allow_regex");
                let deny_regex = regexes(&c.deny_regex, "deny_regex");
                if c.types.is_empty() {
                    problems.push(format!(
                        "{key}.types is empty, so the check could never be true; write e.g. types = [\"dns\"]"
                    ));
                }
                Check::Identifiers(Box::new(IdentifierMatch {
                    allow,
                    deny,
                    allow_regex,
                    deny_regex,
                    types: c.types.clone(),
                    wildcards: c.wildcards,
                }))
            }
            CheckConfig::Eab(c) => {
                if c.key_ids.is_empty() && c.labels.is_empty() {
                    problems.push(format!(
                        "{key}: name the credentials by key_ids = [\"…\"] and/or labels = [\"…\"]"
                    ));
                }
                Check::Eab {
                    key_ids: c.key_ids.clone(),
                    labels: c.labels.clone(),
                }
            }
            CheckConfig::Path(c) => {
                for p in &c.profiles {
                    if !whole.profiles.contains_key(p) {
                        problems.push(format!(
                            "{key}.profiles names {p:?}, which is not a profile; the profiles are {}",
                            whole.profiles.keys().cloned().collect::<Vec<_>>().join(", ")
                        ));
                    }
                }
                if c.profiles.is_empty() {
                    problems.push(format!(
                        "{key}: profiles is empty; write e.g. profiles = [\"default\"]"
                    ));
                }
                Check::Path(c.profiles.clone())
            }
            CheckConfig::Program(c) => {
                if !c.command.is_absolute() {
                    problems.push(format!(
                        "{key}.command must be an absolute path (no shell runs it), e.g. command = \"/usr/local/bin/may-issue\""
                    ));
                }
                if c.timeout < Duration::from_millis(10) || c.timeout > Duration::from_secs(10) {
                    problems.push(format!(
                        "{key}.timeout must be between 10ms and 10s (a client waits for it); write e.g. timeout = \"2s\""
                    ));
                }
                Check::Program(Program {
                    command: c.command.clone(),
                    args: c.args.clone(),
                    timeout: c.timeout,
                })
            }
            CheckConfig::Ipam(c) => {
                Check::Ipam(Box::new(super::ipam::Ipam::build(&key, c, whole)?))
            }
        };
        if problems.is_empty() {
            Ok(check)
        } else {
            Err(problems)
        }
    }

    /// The configuration's `type`.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Check::ClientIp(_) => "client_ip",
            Check::ReverseDns(_) => "reverse_dns",
            Check::Identifiers(_) => "identifiers",
            Check::Eab { .. } => "eab",
            Check::Path(_) => "path",
            Check::Program(_) => "program",
            Check::Ipam(_) => "ipam",
        }
    }

    /// Whether what the check needs is known at `stage`.
    pub(super) fn runs_at(&self, stage: Stage) -> bool {
        match self {
            Check::ClientIp(_) | Check::ReverseDns(_) | Check::Path(_) | Check::Program(_) => true,
            Check::Identifiers(_) | Check::Eab { .. } | Check::Ipam(_) => {
                stage != Stage::Connection
            }
        }
    }

    /// Why not, for the start-up refusal.
    pub(super) fn why_not(&self, stage: Stage) -> &'static str {
        match (self, stage) {
            (Check::Identifiers(_) | Check::Ipam(_), Stage::Connection) => {
                "no identifier is known before a newOrder is read"
            }
            (Check::Eab { .. }, Stage::Connection) => {
                "no account is known before a request is verified"
            }
            _ => "it always runs",
        }
    }

    /// The check's value for `subject`, and a note when there is more to
    /// say than the value.
    pub(super) async fn answer(
        &self,
        stage: Stage,
        s: &Subject<'_>,
        flavour: Flavour,
    ) -> (Truth, Option<String>) {
        match self {
            Check::ClientIp(networks) => match s.client_ip {
                Some(ip) => {
                    let ip = ip.to_canonical();
                    (
                        Truth::from_bool(networks.iter().any(|n| n.contains(&ip))),
                        None,
                    )
                }
                None => (
                    Truth::Undecided,
                    Some("the client's address is not known".into()),
                ),
            },
            Check::ReverseDns(r) => match s.client_ip {
                Some(ip) => r.answer(ip.to_canonical()).await,
                None => (
                    Truth::Undecided,
                    Some("the client's address is not known".into()),
                ),
            },
            Check::Identifiers(m) => match s.identifier {
                Some(id) => (Truth::from_bool(m.matches(id, flavour)), None),
                None => (Truth::Undecided, Some("no identifier was given".into())),
            },
            Check::Eab { key_ids, labels } => {
                let Some((kid, label)) = s.eab else {
                    return (
                        Truth::False,
                        Some("the account has no External Account Binding".into()),
                    );
                };
                (
                    Truth::from_bool(
                        key_ids.iter().any(|k| k == kid)
                            || label.is_some_and(|l| labels.iter().any(|x| x == l)),
                    ),
                    None,
                )
            }
            Check::Path(profiles) => (
                Truth::from_bool(profiles.iter().any(|p| p == s.profile)),
                None,
            ),
            Check::Program(p) => p.ask(stage, s).await,
            Check::Ipam(ipam) => match (s.client_ip, s.identifier) {
                (Some(ip), Some(id)) => ipam.answer(ip.to_canonical(), id).await,
                (None, _) => (
                    Truth::Undecided,
                    Some("the client's address is not known".into()),
                ),
                (_, None) => (Truth::Undecided, Some("no identifier was given".into())),
            },
        }
    }
}

impl Pattern {
    fn parse(text: &str) -> Result<Self, String> {
        let net = text
            .parse::<ipnet::IpNet>()
            .ok()
            .or_else(|| text.parse::<IpAddr>().ok().map(ipnet::IpNet::from));
        if let Some(net) = net {
            return match mapped("", &net) {
                Some(_) => Err("is an IPv4 network written as IPv6; write it as IPv4".into()),
                None => Ok(Pattern::Network(net)),
            };
        }
        let lower = text.to_ascii_lowercase();
        let labels: Vec<String> = lower.split('.').map(str::to_owned).collect();
        let label_ok = |l: &str| {
            l == "*"
                || (!l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        };
        if text.len() > 253 || !labels.iter().all(|l| label_ok(l)) {
            return Err(
                "is neither a DNS name glob (labels of letters, digits and '-', or a whole-label '*') nor an address or network"
                    .into(),
            );
        }
        Ok(Pattern::Dns(labels))
    }

    fn matches(&self, id: &Identifier, flavour: Flavour) -> bool {
        match (self, id.kind) {
            (Pattern::Dns(labels), IdentifierType::Dns) => glob_labels(labels, &id.value, flavour),
            (Pattern::Network(net), IdentifierType::Ip) => id
                .value
                .parse::<IpAddr>()
                .is_ok_and(|ip| net.contains(&ip.to_canonical())),
            _ => false,
        }
    }
}

/// True when `name` has as many labels as `pattern` and each equals its
/// pattern label (ASCII case-insensitively) or the pattern label is `*`:
/// one label, never several, so `*.lab.test` is not `a.b.lab.test`. A
/// wildcard name's `*` matches a pattern's `*`, and with [`Flavour::Any`]
/// any pattern label too (some name it covers is that label).
pub(crate) fn glob_labels(pattern: &[String], name: &str, flavour: Flavour) -> bool {
    let mut labels = name.split('.');
    for (i, p) in pattern.iter().enumerate() {
        match labels.next() {
            Some(l) if p == "*" || p.eq_ignore_ascii_case(l) => {}
            Some("*") if i == 0 && flavour == Flavour::Any => {}
            _ => return false,
        }
    }
    labels.next().is_none()
}

/// The problem with an IPv4 network written as IPv6 (`::ffff:10.0.0.0/104`),
/// which would never match: client addresses and IP identifiers are
/// compared in their IPv4 form.
fn mapped(key: &str, net: &ipnet::IpNet) -> Option<String> {
    match net {
        ipnet::IpNet::V6(v6) if v6.addr().to_ipv4_mapped().is_some() && v6.prefix_len() >= 96 => {
            Some(format!(
                "{key}: {net} is an IPv4 network written as IPv6; write it as IPv4, e.g. {}",
                ipnet::Ipv4Net::new(
                    v6.addr()
                        .to_ipv4_mapped()
                        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
                    v6.prefix_len() - 96
                )
                .map_or_else(|_| "10.0.0.0/8".to_owned(), |n| n.to_string())
            ))
        }
        _ => None,
    }
}

impl IdentifierMatch {
    /// Whether `id` passes: for a wildcard name, every name it covers
    /// ([`Flavour::Every`]) or some ([`Flavour::Any`]). So a deny entry
    /// refuses a wildcard with `Every` as soon as it could cover a denied
    /// name. Regular expressions see a wildcard name as written (`*.` and
    /// all).
    fn matches(&self, id: &Identifier, flavour: Flavour) -> bool {
        if !self.types.contains(&id.kind) {
            return false;
        }
        if !self.wildcards && id.value.starts_with("*.") {
            return false;
        }
        let allowed = (self.allow.is_empty() && self.allow_regex.is_none())
            || self.allow.iter().any(|p| p.matches(id, flavour))
            || self
                .allow_regex
                .as_ref()
                .is_some_and(|r| r.is_match(&id.value));
        let denied = self.deny.iter().any(|p| p.matches(id, flavour.other()))
            || self
                .deny_regex
                .as_ref()
                .is_some_and(|r| r.is_match(&id.value));
        allowed && !denied
    }
}

impl Program {
    /// Runs the program with the subject on stdin: exit 0 true, exit 1
    /// false with its first line of output as the reason, anything else
    /// undecided.
    async fn ask(&self, stage: Stage, s: &Subject<'_>) -> (Truth, Option<String>) {
        let input = serde_json::json!({
            "stage": stage.as_str(),
            "profile": s.profile,
            "client_ip": s.client_ip.map(|ip| ip.to_canonical().to_string()),
            "account": s.account,
            "eab_key_id": s.eab.map(|(kid, _)| kid),
            "eab_label": s.eab.and_then(|(_, label)| label),
            "identifier": s.identifier.map(|id| serde_json::json!({
                "type": id.kind.as_str(),
                "value": id.value,
            })),
        });
        // One line, so that a shell script can `read` it.
        let input = format!("{input}\n").into_bytes();
        // Waiting for a turn counts against the same deadline.
        let started = tokio::time::Instant::now();
        let Ok(Ok(_turn)) = tokio::time::timeout(self.timeout, PROGRAMS.acquire()).await else {
            return (
                Truth::Undecided,
                Some("too many check programs were running to start it in time".into()),
            );
        };
        let left = self.timeout.saturating_sub(started.elapsed());
        match crate::operator_program::run(
            &self.command,
            &self.args,
            &input,
            left,
            PROGRAM_OUTPUT_CAP,
        )
        .await
        {
            Ok(done) => match done.status.code() {
                Some(0) => (Truth::True, None),
                Some(1) => {
                    let reason: String = String::from_utf8_lossy(&done.stdout)
                        .lines()
                        .next()
                        .unwrap_or("")
                        .chars()
                        .take(REASON_CHARS)
                        .collect();
                    (Truth::False, Some(reason).filter(|r| !r.is_empty()))
                }
                code => (
                    Truth::Undecided,
                    Some(match code {
                        Some(c) => match done.first_error_line() {
                            line if line.is_empty() => format!("the program exited with {c}"),
                            line => format!("the program exited with {c}: {line}"),
                        },
                        None => "the program was killed by a signal".to_owned(),
                    }),
                ),
            },
            Err(e) => (Truth::Undecided, Some(format!("the program {e}"))),
        }
    }
}

impl ReverseDns {
    /// The cached answer for `ip`, or the lookups within the deadline. An
    /// undecided answer is not kept: the next request asks again.
    async fn answer(&self, ip: IpAddr) -> (Truth, Option<String>) {
        if let Some((truth, note, at)) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip)
            && at.elapsed() < REVERSE_CACHE_FOR
        {
            return (*truth, note.clone());
        }
        let (truth, note) = match tokio::time::timeout(self.timeout, self.look_up(ip)).await {
            Ok(answer) => answer,
            Err(_) => (
                Truth::Undecided,
                Some(format!("no DNS answer within {:?}", self.timeout)),
            ),
        };
        if truth != Truth::Undecided {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() >= REVERSE_CACHE_MAX {
                cache.clear();
            }
            cache.insert(ip, (truth, note.clone(), Instant::now()));
        }
        (truth, note)
    }

    /// The PTR names of `ip` that match, and (when asked) the first of
    /// them whose A or AAAA records include `ip`.
    async fn look_up(&self, ip: IpAddr) -> (Truth, Option<String>) {
        let Some(resolver) = &self.resolver else {
            return (Truth::Undecided, Some("no DNS resolver".into()));
        };
        let names: Vec<String> = match resolver.reverse_lookup(ip).await {
            Ok(lookup) => lookup
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::PTR(ptr) => {
                        Some(ptr.0.to_ascii().trim_end_matches('.').to_ascii_lowercase())
                    }
                    _ => None,
                })
                .collect(),
            Err(e) if e.is_nx_domain() || e.is_no_records_found() => {
                return (Truth::False, Some("no PTR record".into()));
            }
            Err(e) => {
                return (
                    Truth::Undecided,
                    Some(format!("the PTR lookup failed: {e}")),
                );
            }
        };
        let matching: Vec<&String> = names
            .iter()
            .filter(|n| self.names.iter().any(|g| glob_labels(g, n, Flavour::Every)))
            .collect();
        let Some(first) = matching.first() else {
            return (
                Truth::False,
                Some(format!("PTR {}", names.first().map_or("", String::as_str))),
            );
        };
        if !self.forward_confirmed {
            return (Truth::True, Some(format!("PTR {first}")));
        }
        let mut failed = None;
        for name in &matching {
            match resolver.lookup_ip(name.as_str()).await {
                Ok(found) if found.iter().any(|a| a.to_canonical() == ip) => {
                    return (Truth::True, Some(format!("PTR {name}, confirmed")));
                }
                Ok(_) => {}
                Err(e) if e.is_nx_domain() || e.is_no_records_found() => {}
                Err(e) => failed = Some(format!("resolving {name} failed: {e}")),
            }
        }
        match failed {
            Some(why) => (Truth::Undecided, Some(why)),
            None => (
                Truth::False,
                Some(format!("PTR {first} does not resolve to {ip}")),
            ),
        }
    }
}
