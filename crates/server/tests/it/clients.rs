//! The clients operators actually run, certbot and lego, against the
//! `acme-proxy` binary started as a separate process: each obtains a
//! certificate over http-01 (answered by the client's own standalone server,
//! the name resolved through a real DNS server), renews it, revokes it, and
//! the CRL then lists the revoked serial. Each also obtains one over dns-01,
//! its hooks writing the TXT records into that DNS server (certbot for a
//! wildcard and its base name at once).
//!
//! Every client run has a deadline and is killed when it passes; a failure
//! message carries the client's stdout and stderr (and certbot's log).

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use x509_parser::prelude::*;

use crate::flow::reqwest_get;
use crate::harness::{self, ChildGuard, Dns, TestServer};

/// The longest one client command may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Variables that could send a client's requests to 127.0.0.1 through a
/// proxy of the machine running the tests.
const PROXY_VARS: [&str; 6] = [
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
];

/// One finished (or killed) client command.
pub(crate) struct Ran {
    command: String,
    /// None when the deadline passed and the client was killed.
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
    pub(crate) elapsed: Duration,
}

impl Ran {
    pub(crate) fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    pub(crate) fn report(&self) -> String {
        let status = match self.status {
            Some(s) => s.to_string(),
            None => format!("killed after {CLIENT_TIMEOUT:?}"),
        };
        format!(
            "$ {}\n{status} after {:.1?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// Runs `program` with `args` and the extra environment `env`, its home in
/// `home` (so nothing of the user's is read or written), killed after
/// `CLIENT_TIMEOUT`. Blocking.
fn run_blocking(program: &str, args: &[String], env: &[(String, String)], home: &Path) -> Ran {
    let command = format!("{program} {}", args.join(" "));
    let started = Instant::now();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("NO_PROXY", "127.0.0.1,localhost")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in PROXY_VARS {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        buf
    });
    let deadline = started + CLIENT_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("waiting for {command}: {e}"),
        }
    };
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    Ran {
        command,
        status,
        stdout,
        stderr,
        elapsed: started.elapsed(),
    }
}

/// `run_blocking` off the async runtime's worker threads.
pub(crate) async fn run(program: impl Into<String>, args: Vec<String>, home: PathBuf) -> Ran {
    run_with_env(program, args, Vec::new(), home).await
}

/// `run` with extra environment variables.
pub(crate) async fn run_with_env(
    program: impl Into<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    home: PathBuf,
) -> Ran {
    let program = program.into();
    tokio::task::spawn_blocking(move || run_blocking(&program, &args, &env, &home))
        .await
        .expect("client thread")
}

/// The `acme-proxy` binary serving one default profile.
pub(crate) struct Proxy {
    _child: ChildGuard,
    pub(crate) directory: String,
    base: String,
    data_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// Writes a config whose http-01 validation goes to `http_port` and
    /// whose names resolve through `dns` (`extra` appended to it), then runs
    /// `acme-proxy serve`.
    pub(crate) fn start(dns: &Dns, http_port: u16, extra: &str) -> Proxy {
        let dir = crate::harness::tempdir();
        let data_dir = dir.path().join("data");
        // A client's standalone server may be slower to answer than the
        // in-process responder: give validation more room.
        let text = TestServer::config_text(&data_dir, http_port, Some(dns), extra).replacen(
            "timeout = \"5s\"",
            "timeout = \"10s\"",
            1,
        );
        let config = dir.path().join("acme-proxy.toml");
        std::fs::write(&config, &text).expect("write config");
        let config = config.to_str().expect("utf-8 path").to_owned();
        let (child, directory) =
            harness::spawn_binary(dir.path(), &["serve", "--config", &config], &[]);
        let base = directory
            .strip_suffix("/profile/default/directory")
            .unwrap_or_else(|| panic!("unexpected directory URL {directory}"))
            .to_owned();
        Proxy {
            _child: child,
            directory,
            base,
            data_dir,
            _dir: dir,
        }
    }

    /// The subject of the profile's self-generated CA (DER).
    fn ca_subject(&self) -> (Vec<u8>, String) {
        let path = self.data_dir.join("ca").join("default").join("ca.pem");
        let pem = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).expect("CA PEM");
        let ca = pem.parse_x509().expect("CA parses");
        (ca.subject().as_raw().to_vec(), ca.subject().to_string())
    }

    /// The serials (raw bytes) on the profile's CRL with their reason codes.
    async fn crl(&self) -> Vec<(Vec<u8>, Option<u8>)> {
        let (status, content_type, body) =
            reqwest_get(&format!("{}/profile/default/crl", self.base)).await;
        assert_eq!(status, 200, "GET the CRL");
        assert_eq!(content_type.as_deref(), Some("application/pkix-crl"));
        let (_, crl) = parse_x509_crl(&body).expect("CRL parses");
        crl.iter_revoked_certificates()
            .map(|r| (r.raw_serial().to_vec(), r.reason_code().map(|(_, rc)| rc.0)))
            .collect()
    }
}

/// What the tests check of an issued certificate.
pub(crate) struct Leaf {
    pub(crate) serial: Vec<u8>,
    pub(crate) sans: Vec<String>,
    pub(crate) issuer: Vec<u8>,
    pub(crate) issuer_text: String,
}

/// The first certificate of the PEM file at `path` (a chain's leaf).
pub(crate) fn leaf(path: &Path, context: &dyn Fn() -> String) -> Leaf {
    let pem =
        std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), context()));
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).expect("certificate PEM");
    let cert = pem.parse_x509().expect("certificate parses");
    let sans = cert
        .subject_alternative_name()
        .expect("SAN extension")
        .map(|san| {
            san.value
                .general_names
                .iter()
                .map(|g| match g {
                    GeneralName::DNSName(n) => (*n).to_owned(),
                    other => format!("{other:?}"),
                })
                .collect()
        })
        .unwrap_or_default();
    Leaf {
        serial: cert.raw_serial().to_vec(),
        sans,
        issuer: cert.issuer().as_raw().to_vec(),
        issuer_text: cert.issuer().to_string(),
    }
}

fn assert_issued(leaf: &Leaf, name: &str, ca: &(Vec<u8>, String)) {
    assert_eq!(leaf.sans, vec![name.to_owned()], "SANs of the certificate");
    assert!(
        leaf.issuer == ca.0,
        "issuer {} is not the profile's CA {}",
        leaf.issuer_text,
        ca.1
    );
}

/// `lego … --http … -d NAME run`: obtain `name` from `directory` over
/// http-01 with lego's own server on `port`, its state in `home`.
pub(crate) fn lego_http_run(
    directory: &str,
    home: &Path,
    at: SocketAddr,
    name: &str,
) -> Vec<String> {
    [
        "--server",
        directory,
        "--email",
        "admin@example.test",
        "--accept-tos",
        "--path",
        home.to_str().expect("utf-8 path"),
        "--key-type",
        "ec256",
        "--http",
        "--http.port",
        &at.to_string(),
        "-d",
        name,
        "run",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The options isolating certbot in `d` and pointing it at `directory`.
pub(crate) fn certbot_common(d: &Path, directory: &str) -> Vec<String> {
    let p = |sub: &str| d.join(sub).display().to_string();
    [
        "--config-dir",
        &p("conf"),
        "--work-dir",
        &p("work"),
        "--logs-dir",
        &p("logs"),
        "--non-interactive",
        "--agree-tos",
        "-m",
        "admin@example.test",
        "--server",
        directory,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// `certbot certonly` for `name` from `directory`, answered by certbot's
/// own http-01 server on `at`, the lineage named `t`.
pub(crate) fn certbot_certonly_standalone(
    d: &Path,
    directory: &str,
    at: SocketAddr,
    name: &str,
) -> Vec<String> {
    let mut args = vec!["certonly".to_owned()];
    args.extend(certbot_common(d, directory));
    args.extend(certbot_standalone(at));
    args.extend(["-d", name, "--cert-name", "t"].map(str::to_owned));
    args
}

/// certbot's own http-01 server on `at` (an [`harness::own_addr`], where
/// the test's DNS sends every name).
pub(crate) fn certbot_standalone(at: SocketAddr) -> Vec<String> {
    [
        "--standalone",
        "--http-01-port",
        &at.port().to_string(),
        "--http-01-address",
        &at.ip().to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The profile of the dns-01 tests.
const DNS_PROFILE: &str = "[profiles.default]\nchallenges = [\"http-01\", \"dns-01\"]\n";

/// Writes the executable shell script `dir/name`: `body` runs after a
/// `post ENDPOINT JSON` function that POSTs JSON to the management API of
/// `dns` (through python3, or curl without it) and fails on any error.
fn dns_hook(dir: &Path, name: &str, dns: &Dns, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = format!(
        r#"#!/bin/sh
set -eu
post() {{
    url="http://{management}/$1"
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import sys, urllib.request
req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers={{"Content-Type": "application/json"}}, method="POST")
urllib.request.urlopen(req, timeout=10).read()' "$url" "$2"
    else
        curl -fsS -m 10 -X POST -H 'Content-Type: application/json' -d "$2" "$url"
    fi
}}
{body}
"#,
        management = dns.management,
    );
    let path = dir.join(name);
    std::fs::write(&path, script).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// The last lines of certbot's log, which hold the ACME exchanges.
pub(crate) fn certbot_log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("logs").join("letsencrypt.log"))
        .unwrap_or_else(|e| format!("(no certbot log: {e})"));
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(150);
    lines[from..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_obtains_renews_and_revokes_a_certificate_over_http_01() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("certbot") {
        return;
    }
    let at = harness::own_addr();
    let proxy = Proxy::start(&dns, at.port(), "");
    let dir = crate::harness::tempdir();
    let d = dir.path().to_path_buf();
    let name = "certbot.example.test";

    let common = |d: &Path| certbot_common(d, &proxy.directory);
    let standalone = certbot_standalone(at);
    let check = |ran: &Ran, what: &str| {
        assert!(
            ran.success(),
            "certbot {what} failed\n{}\n--- letsencrypt.log (tail) ---\n{}",
            ran.report(),
            certbot_log_tail(&d)
        );
        eprintln!("certbot {what}: {:.1?}", ran.elapsed);
    };
    let cert_path = d.join("conf").join("live").join("t").join("cert.pem");
    let ca = proxy.ca_subject();

    // Obtain.
    let mut args = vec!["certonly".to_owned()];
    args.extend(common(&d));
    args.extend(standalone.iter().cloned());
    args.extend(["-d", name, "--cert-name", "t"].map(str::to_owned));
    let ran = run("certbot", args, d.clone()).await;
    check(&ran, "certonly");
    let first = leaf(&cert_path, &|| ran.report());
    assert_issued(&first, name, &ca);

    // Renew: the standalone settings come from the renewal configuration
    // certbot wrote at issuance.
    let renewal = std::fs::read_to_string(d.join("conf").join("renewal").join("t.conf"))
        .expect("renewal configuration");
    assert!(
        renewal.contains("authenticator = standalone")
            && renewal.contains(&format!("http01_port = {}", at.port())),
        "certbot stored the standalone settings:\n{renewal}"
    );
    let mut args = vec!["renew".to_owned()];
    args.extend(common(&d));
    if !renewal.contains("http01_address") {
        // Not stored by every certbot version: give it again.
        args.extend(["--http-01-address".to_owned(), at.ip().to_string()]);
    }
    // Without this, a renewal with no terminal on stdin first sleeps up to
    // eight minutes.
    args.push("--no-random-sleep-on-renew".to_owned());
    args.extend(["--force-renewal", "--cert-name", "t"].map(str::to_owned));
    let ran = run("certbot", args, d.clone()).await;
    check(&ran, "renew");
    let second = leaf(&cert_path, &|| ran.report());
    assert_issued(&second, name, &ca);
    assert_ne!(first.serial, second.serial, "renewal issued a new serial");

    // Revoke the current certificate with the account key.
    let mut args = vec!["revoke".to_owned()];
    args.extend(common(&d));
    args.extend(
        [
            "--cert-path",
            cert_path.to_str().expect("utf-8 path"),
            "--reason",
            "keycompromise",
            "--no-delete-after-revoke",
        ]
        .map(str::to_owned),
    );
    let ran = run("certbot", args, d.clone()).await;
    check(&ran, "revoke");

    let crl = proxy.crl().await;
    let entry = crl.iter().find(|(serial, _)| *serial == second.serial);
    assert!(
        entry.is_some(),
        "the CRL lists the revoked serial {}: {crl:?}",
        hex::encode(&second.serial)
    );
    assert_eq!(
        entry.and_then(|(_, reason)| *reason),
        Some(1),
        "keyCompromise is recorded"
    );
    assert!(
        !crl.iter().any(|(serial, _)| *serial == first.serial),
        "the superseded, unrevoked certificate is not on the CRL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_obtains_a_certificate_over_https_trusting_the_servers_self_signed_certificate() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("certbot") {
        return;
    }
    let at = harness::own_addr();
    let proxy = Proxy::start(&dns, at.port(), "[tls]\nself_signed = true\n");
    assert!(
        proxy.directory.starts_with("https://127.0.0.1:"),
        "{}",
        proxy.directory
    );
    // What `serve` printed to trust: the self-signed certificate it made.
    let tls_cert = proxy.data_dir.join("tls").join("self-signed-127.0.0.1.pem");
    assert!(tls_cert.is_file(), "{}", tls_cert.display());
    let dir = crate::harness::tempdir();
    let d = dir.path().to_path_buf();
    let name = "https.example.test";
    let args = certbot_certonly_standalone(&d, &proxy.directory, at, name);
    // certbot (python-requests) trusts what this bundle holds.
    let env = vec![(
        "REQUESTS_CA_BUNDLE".to_owned(),
        tls_cert.display().to_string(),
    )];
    let ran = run_with_env("certbot", args, env, d.clone()).await;
    assert!(
        ran.success(),
        "certbot over https failed\n{}\n--- letsencrypt.log (tail) ---\n{}",
        ran.report(),
        certbot_log_tail(&d)
    );
    let cert_path = d.join("conf").join("live").join("t").join("cert.pem");
    assert_issued(
        &leaf(&cert_path, &|| ran.report()),
        name,
        &proxy.ca_subject(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lego_obtains_renews_and_revokes_a_certificate_over_http_01() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("lego") {
        return;
    }
    let at = harness::own_addr();
    let proxy = Proxy::start(&dns, at.port(), "");
    let dir = crate::harness::tempdir();
    let d = dir.path().to_path_buf();
    let name = "lego.example.test";

    let base: Vec<String> = [
        "--server",
        &proxy.directory,
        "--email",
        "admin@example.test",
        "--accept-tos",
        "--path",
        d.to_str().expect("utf-8 path"),
        "--key-type",
        "ec256",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let http: Vec<String> = ["--http", "--http.port", &at.to_string()]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let check = |ran: &Ran, what: &str| {
        assert!(ran.success(), "lego {what} failed\n{}", ran.report());
        eprintln!("lego {what}: {:.1?}", ran.elapsed);
    };
    let cert_path = d.join("certificates").join(format!("{name}.crt"));
    let ca = proxy.ca_subject();

    // Obtain (registering the account on the way).
    let mut args = base.clone();
    args.extend(http.iter().cloned());
    args.extend(["-d", name, "run"].map(str::to_owned));
    let ran = run("lego", args, d.clone()).await;
    check(&ran, "run");
    let first = leaf(&cert_path, &|| ran.report());
    assert_issued(&first, name, &ca);

    // Renew now: any remaining lifetime is under 36500 days.
    let mut args = base.clone();
    args.extend(http.iter().cloned());
    args.extend(["-d", name, "renew", "--days", "36500", "--no-random-sleep"].map(str::to_owned));
    let ran = run("lego", args, d.clone()).await;
    check(&ran, "renew");
    let second = leaf(&cert_path, &|| ran.report());
    assert_issued(&second, name, &ca);
    assert_ne!(first.serial, second.serial, "renewal issued a new serial");

    // Revoke the current certificate (lego signs with the account key).
    let mut args = base.clone();
    args.extend(["-d", name, "revoke", "--reason", "4"].map(str::to_owned));
    let ran = run("lego", args, d.clone()).await;
    check(&ran, "revoke");

    let crl = proxy.crl().await;
    let entry = crl.iter().find(|(serial, _)| *serial == second.serial);
    assert!(
        entry.is_some(),
        "the CRL lists the revoked serial {}: {crl:?}",
        hex::encode(&second.serial)
    );
    assert_eq!(
        entry.and_then(|(_, reason)| *reason),
        Some(4),
        "superseded is recorded"
    );
    assert!(
        !crl.iter().any(|(serial, _)| *serial == first.serial),
        "the earlier, unrevoked certificate is not on the CRL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lego_obtains_a_certificate_over_dns_01_with_its_exec_provider_writing_to_a_real_dns_server()
 {
    let Some(dns) = Dns::start() else { return };
    if !harness::require_program("lego") {
        return;
    }
    // No http-01 here: the port is never used.
    let proxy = Proxy::start(&dns, 1, DNS_PROFILE);
    let dir = crate::harness::tempdir();
    let d = dir.path().to_path_buf();
    let name = "lego-dns.example.test";

    // lego calls `script present|cleanup FQDN VALUE`, FQDN with its
    // trailing dot.
    let script = dns_hook(
        &d,
        "exec-provider.sh",
        &dns,
        r#"case "$1" in
    present) post set-txt "{\"host\": \"$2\", \"value\": \"$3\"}" ;;
    cleanup) post clear-txt "{\"host\": \"$2\"}" ;;
    *) echo "unexpected call: $*" >&2; exit 2 ;;
esac"#,
    );
    let path = d.join("lego");
    let args: Vec<String> = [
        "--server",
        &proxy.directory,
        "--email",
        "admin@example.test",
        "--accept-tos",
        "--path",
        path.to_str().expect("utf-8 path"),
        "--key-type",
        "ec256",
        "--dns",
        "exec",
        "--dns.resolvers",
        &dns.addr.to_string(),
        "--dns.disable-cp",
        "-d",
        name,
        "run",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let env: Vec<(String, String)> = [
        ("EXEC_PATH", script.to_str().expect("utf-8 path")),
        // Seconds: the record is in place when the script returns.
        ("EXEC_PROPAGATION_TIMEOUT", "10"),
        ("EXEC_POLLING_INTERVAL", "1"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let ran = run_with_env("lego", args, env, d.clone()).await;
    assert!(ran.success(), "lego run failed\n{}", ran.report());
    eprintln!("lego run (dns-01): {:.1?}", ran.elapsed);

    let cert_path = path.join("certificates").join(format!("{name}.crt"));
    let issued = leaf(&cert_path, &|| ran.report());
    assert_issued(&issued, name, &proxy.ca_subject());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_obtains_a_wildcard_and_its_base_name_over_dns_01_with_manual_hooks() {
    let Some(dns) = Dns::start() else { return };
    if !harness::require_program("certbot") {
        return;
    }
    // No http-01 here: the port is never used.
    let proxy = Proxy::start(&dns, 1, DNS_PROFILE);
    let dir = crate::harness::tempdir();
    let d = dir.path().to_path_buf();
    let wildcard = "*.certbot-wild.example.test";
    let base = "certbot-wild.example.test";

    // Both authorizations put their value at the same name: challtestsrv
    // keeps every value set for it, and the cleanup (which certbot runs
    // once all authorizations are done) clears them all.
    let hooks = d.join("hooks");
    std::fs::create_dir(&hooks).expect("hooks directory");
    let auth = dns_hook(
        &hooks,
        "auth.sh",
        &dns,
        r#"post set-txt "{\"host\": \"_acme-challenge.$CERTBOT_DOMAIN.\", \"value\": \"$CERTBOT_VALIDATION\"}""#,
    );
    let cleanup = dns_hook(
        &hooks,
        "cleanup.sh",
        &dns,
        r#"post clear-txt "{\"host\": \"_acme-challenge.$CERTBOT_DOMAIN.\"}""#,
    );

    let mut args = vec!["certonly".to_owned()];
    args.extend(certbot_common(&d, &proxy.directory));
    args.extend(
        [
            "--manual",
            "--preferred-challenges",
            "dns",
            "--manual-auth-hook",
            auth.to_str().expect("utf-8 path"),
            "--manual-cleanup-hook",
            cleanup.to_str().expect("utf-8 path"),
            "-d",
            wildcard,
            "-d",
            base,
            "--cert-name",
            "w",
        ]
        .map(str::to_owned),
    );
    let ran = run("certbot", args, d.clone()).await;
    assert!(
        ran.success(),
        "certbot certonly failed\n{}\n--- letsencrypt.log (tail) ---\n{}",
        ran.report(),
        certbot_log_tail(&d)
    );
    eprintln!("certbot certonly (dns-01, wildcard): {:.1?}", ran.elapsed);

    let cert_path = d.join("conf").join("live").join("w").join("cert.pem");
    let issued = leaf(&cert_path, &|| ran.report());
    let mut sans = issued.sans.clone();
    sans.sort();
    assert_eq!(
        sans,
        vec![wildcard.to_owned(), base.to_owned()],
        "SANs of the certificate"
    );
    let ca = proxy.ca_subject();
    assert!(
        issued.issuer == ca.0,
        "issuer {} is not the profile's CA {}",
        issued.issuer_text,
        ca.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lego_obtains_a_certificate_over_tls_alpn_01_with_its_own_tls_server() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("lego") {
        return;
    }
    let at = harness::own_addr();
    // tls_port lands in [validation]; only tls-alpn-01 is offered.
    let proxy = Proxy::start(
        &dns,
        1,
        &format!(
            "tls_port = {}\n[profiles.default]\nchallenges = [\"tls-alpn-01\"]\n",
            at.port()
        ),
    );
    let dir = crate::harness::tempdir();
    let d = dir.path().to_path_buf();
    let name = "lego-tls.example.test";
    let args: Vec<String> = [
        "--server",
        &proxy.directory,
        "--email",
        "admin@example.test",
        "--accept-tos",
        "--path",
        d.to_str().expect("utf-8 path"),
        "--key-type",
        "ec256",
        "--tls",
        "--tls.port",
        &at.to_string(),
        "-d",
        name,
        "run",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let ran = run("lego", args, d.clone()).await;
    assert!(ran.success(), "lego run failed\n{}", ran.report());
    eprintln!("lego run (tls-alpn-01): {:.1?}", ran.elapsed);
    let cert_path = d.join("certificates").join(format!("{name}.crt"));
    let issued = leaf(&cert_path, &|| ran.report());
    assert_issued(&issued, name, &proxy.ca_subject());
}
