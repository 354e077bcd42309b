//! The acme-dns-compatible API (`[dns_zone.api]`): accounts registered
//! over HTTP and by the operator, updates that land in the embedded zone
//! (read back with dig), what is refused and audited, the rate limits, and
//! certbot with acme-dns's own client library obtaining a name and its
//! wildcard from our CA through a CNAME in a real BIND.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use base64::Engine;
use serde_json::{Value, json};

use crate::clients::{certbot_common, certbot_log_tail, leaf, run_with_env};
use crate::harness::{self, Bind, TestServer, config_file, run_cli};
use crate::raw;

const ZONE: &str = "acme.zone.test";

fn zone_table(api: &str) -> String {
    format!(
        "\n[dns_zone]\nzones = [\"{ZONE}\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.corp.test\"]\nttl = \"1s\"\nnegative_ttl = \"1s\"\n[dns_zone.api]\n{api}"
    )
}

/// A dns-01 value as clients compute it: 43 base64url characters.
fn value(n: u8) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([n; 32])
}

/// What `dig +short` prints for `name`'s records of `qtype` at `at`.
fn dig_short(at: SocketAddr, name: &str, qtype: &str) -> String {
    let out = Command::new("dig")
        .arg(format!("@{}", at.ip()))
        .args(["-p", &at.port().to_string(), "+norec", "+short", "+time=5"])
        .args([name, qtype])
        .output()
        .expect("run dig");
    assert!(out.status.success(), "dig {name} {qtype}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The TXT values the zone serves at `name`, sorted.
fn served(at: SocketAddr, name: &str) -> Vec<String> {
    let mut values: Vec<String> = dig_short(at, name, "TXT")
        .lines()
        .map(|l| l.trim_matches('"').to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    values.sort();
    values
}

async fn register(base: &str, body: &str) -> raw::Resp {
    raw::request(
        "POST",
        &format!("{base}/acme-dns/register"),
        Some("application/json"),
        body.as_bytes().to_vec(),
    )
    .await
}

async fn update(base: &str, user: &str, key: &str, subdomain: &str, txt: &str) -> raw::Resp {
    update_from(
        "127.0.0.1".parse().expect("ip"),
        base,
        user,
        key,
        subdomain,
        txt,
    )
    .await
}

/// [`update`] from the loopback address `from`.
async fn update_from(
    from: std::net::IpAddr,
    base: &str,
    user: &str,
    key: &str,
    subdomain: &str,
    txt: &str,
) -> raw::Resp {
    raw::request_from(
        from,
        "POST",
        &format!("{base}/acme-dns/update"),
        &[
            ("x-api-user", user),
            ("x-api-key", key),
            ("content-type", "application/json"),
        ],
        json!({ "subdomain": subdomain, "txt": txt })
            .to_string()
            .into_bytes(),
    )
    .await
}

/// An account's credentials, as the API or the CLI printed them.
struct Creds {
    username: String,
    password: String,
    subdomain: String,
    fulldomain: String,
}

impl Creds {
    fn from(v: &Value) -> Creds {
        let s = |k: &str| {
            v[k].as_str()
                .unwrap_or_else(|| panic!("{k} in {v}"))
                .to_owned()
        };
        Creds {
            username: s("username"),
            password: s("password"),
            subdomain: s("subdomain"),
            fulldomain: s("fulldomain"),
        }
    }
}

async fn registered(base: &str, body: &str) -> Creds {
    let r = register(base, body).await;
    assert_eq!(r.status, 201, "register {body}: {}", r.problem());
    Creds::from(&r.json())
}

fn error_of(r: &raw::Resp) -> String {
    r.json()["error"].as_str().unwrap_or_default().to_owned()
}

fn audit_rows(config: &Path, event: &str) -> Vec<Value> {
    let out = run_cli(config, &["audit", "list", "--event", event, "--json"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).expect("audit JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_update_only_their_own_name_from_their_own_networks_and_keep_two_values() {
    if !harness::require_program("dig") {
        return;
    }
    let data = harness::tempdir();
    let toml = TestServer::config_text(data.path(), 1, None, &zone_table(""));
    let (_etc, config) = config_file(&toml);
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let base = server.base().to_owned();
    let at = server.running().dns_addrs[0];

    let health = raw::request("GET", &format!("{base}/acme-dns/health"), None, vec![]).await;
    assert_eq!(health.status, 200);

    // Registration: acme-dns's fields, a name under our zone, no body
    // needed.
    let r = register(&base, "").await;
    assert_eq!(r.status, 201, "{}", r.problem());
    let doc = r.json();
    let a = Creds::from(&doc);
    assert_eq!(a.username.len(), 36, "{doc}");
    assert_eq!(a.password.len(), 40, "{doc}");
    assert_eq!(a.fulldomain, format!("{}.{ZONE}", a.subdomain), "{doc}");
    assert_eq!(doc["allowfrom"], json!([]), "{doc}");

    // Updates land in the zone; only the two newest values stay.
    let r = update(&base, &a.username, &a.password, &a.subdomain, &value(1)).await;
    assert_eq!(r.status, 200, "{}", r.problem());
    assert_eq!(r.json(), json!({ "txt": value(1) }));
    assert_eq!(served(at, &a.fulldomain), [value(1)]);
    for n in [2, 3] {
        let r = update(&base, &a.username, &a.password, &a.subdomain, &value(n)).await;
        assert_eq!(r.status, 200, "{}", r.problem());
    }
    let mut newest = vec![value(2), value(3)];
    newest.sort();
    assert_eq!(served(at, &a.fulldomain), newest);

    // Wrong or missing credentials, another account's subdomain, an
    // address outside allowfrom: the same 401, and nothing changes.
    let b = registered(&base, "{}").await;
    let fenced = registered(&base, r#"{"allowfrom": ["192.0.2.0/24"]}"#).await;
    for (user, key, subdomain, why) in [
        (&a.username, "wrong", &a.subdomain, "a wrong key"),
        (&a.username, "", &a.subdomain, "no key"),
        (
            &"0".repeat(36),
            &a.password,
            &a.subdomain,
            "an unknown user",
        ),
        (
            &"not-a-user".to_owned(),
            &a.password,
            &a.subdomain,
            "a malformed user",
        ),
        (
            &b.username,
            &b.password,
            &a.subdomain,
            "another account's subdomain",
        ),
        (
            &fenced.username,
            &fenced.password,
            &fenced.subdomain,
            "an address outside allowfrom",
        ),
    ] {
        let r = update(&base, user, key, subdomain, &value(9)).await;
        assert_eq!(r.status, 401, "{why}: {}", r.problem());
        assert_eq!(error_of(&r), "forbidden", "{why}");
    }
    assert_eq!(served(at, &a.fulldomain), newest);
    assert!(served(at, &fenced.fulldomain).is_empty());

    // An account whose networks include the client may update.
    let local = registered(&base, r#"{"AllowFrom": ["127.0.0.0/8", "::1"]}"#).await;
    let r = update(
        &base,
        &local.username,
        &local.password,
        &local.subdomain,
        &value(4),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.problem());
    assert_eq!(served(at, &local.fulldomain), [value(4)]);

    // Malformed requests: named, and stored nothing.
    let r = update(&base, &a.username, &a.password, &a.subdomain, "short").await;
    assert_eq!((r.status, error_of(&r).as_str()), (400, "bad_txt"));
    let r = register(&base, r#"{"allowfrom": ["lan"]}"#).await;
    assert_eq!(
        (r.status, error_of(&r).as_str()),
        (400, "invalid_allowfrom_cidr")
    );
    let r = register(&base, "not json").await;
    assert_eq!(
        (r.status, error_of(&r).as_str()),
        (400, "malformed_json_payload")
    );
    let r = raw::request(
        "POST",
        &format!("{base}/acme-dns/register"),
        Some("application/json"),
        vec![b' '; 5000],
    )
    .await;
    assert_eq!(r.status, 413);
    assert_eq!(served(at, &a.fulldomain), newest);

    // Every update and every refused update of an account is audited,
    // the account named; the password never is.
    let rows = audit_rows(&config, "dns.record_updated");
    let outcome = |o: &str| rows.iter().filter(|r| r["outcome"] == o).count();
    assert_eq!(outcome("success"), 4, "{rows:?}");
    // Refusals of a user name that is no account are not written (anyone
    // can make them in any amount); the five that name one are.
    assert_eq!(outcome("refused"), 5, "{rows:?}");
    let fenced_row = rows
        .iter()
        .find(|r| r["actor"] == format!("dns-api:{}", fenced.username))
        .expect("the refusal names the account");
    assert!(
        fenced_row["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("outside the account's allowfrom (192.0.2.0/24)"),
        "{fenced_row}"
    );
    assert_eq!(fenced_row["client_ip"], "127.0.0.1", "{fenced_row}");
    let all = format!(
        "{rows:?}{:?}",
        audit_rows(&config, "dns.account_registered")
    );
    assert!(
        !all.contains(&a.password),
        "a password is in the audit trail"
    );
    assert_eq!(audit_rows(&config, "dns.account_registered").len(), 4);

    // Removing an account takes its values with it.
    let out = run_cli(&config, &["dns", "account", "remove", &a.username], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(served(at, &a.fulldomain).is_empty());
    let r = update(&base, &a.username, &a.password, &a.subdomain, &value(5)).await;
    assert_eq!(r.status, 401);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_acme_dns_bodies_take_none_of_the_acme_routes_request_slots() {
    use tokio::io::AsyncWriteExt;
    let data = harness::tempdir();
    let toml = format!(
        "max_in_flight = 2\n{}\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
        TestServer::config_text(data.path(), 1, None, &zone_table(""))
    );
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let at = server.running().addr;
    // Four updates (twice the ACME slots) whose bodies never come.
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut tcp = tokio::net::TcpStream::connect(at).await.expect("connect");
        tcp.write_all(
            b"POST /acme-dns/update HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
        )
        .await
        .expect("send");
        stalled.push(tcp);
    }
    crate::connections::wait_open_connections(&server, 4).await;
    // The ACME API answers all the while (it would shed with 503 if the
    // stalled requests held its slots).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while std::time::Instant::now() < until {
        let (status, _) = crate::connections::new_nonce(&server.directory("default")).await;
        assert_eq!(status, 200, "newNonce while acme-dns bodies stall");
    }
    drop(stalled);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_and_updates_past_their_limits_get_429_with_retry_after_wrong_keys_counted() {
    let data = harness::tempdir();
    let toml = TestServer::config_text(
        data.path(),
        1,
        None,
        &zone_table("registrations_per_hour = 2\nupdates_per_minute = 2\n"),
    );
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let base = server.base().to_owned();
    let a = registered(&base, "").await;
    let b = registered(&base, "").await;
    let r = register(&base, "").await;
    assert_eq!((r.status, error_of(&r).as_str()), (429, "rate_limited"));
    let wait: u64 = r.headers["retry-after"]
        .to_str()
        .expect("text")
        .parse()
        .expect("seconds");
    assert!((1..=3600).contains(&wait), "{wait}");

    for n in [1, 2] {
        let r = update(&base, &a.username, &a.password, &a.subdomain, &value(n)).await;
        assert_eq!(r.status, 200, "{}", r.problem());
    }
    let r = update(&base, &a.username, &a.password, &a.subdomain, &value(3)).await;
    assert_eq!((r.status, error_of(&r).as_str()), (429, "rate_limited"));
    assert!(r.headers.contains_key("retry-after"));
    // Wrong keys count too (each would cost a hash): after two, the
    // right one waits as well.
    let wrong = "x".repeat(40);
    for _ in 0..2 {
        let r = update(&base, &b.username, &wrong, &b.subdomain, &value(1)).await;
        assert_eq!(r.status, 401, "{}", r.problem());
    }
    let r = update(&base, &b.username, &b.password, &b.subdomain, &value(1)).await;
    assert_eq!((r.status, error_of(&r).as_str()), (429, "rate_limited"));
    // Attempts from outside an account's allowfrom count apart: they
    // cannot spend the budget of the client inside.
    let inside: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    let outside: std::net::IpAddr = "127.0.0.3".parse().expect("ip");
    let r = raw::request_from(
        inside,
        "POST",
        &format!("{base}/acme-dns/register"),
        &[("content-type", "application/json")],
        br#"{"allowfrom":["127.0.0.2/32"]}"#.to_vec(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.problem());
    let c = Creds::from(&r.json());
    let mut outsiders = Vec::new();
    for _ in 0..3 {
        let r = update_from(outside, &base, &c.username, &wrong, &c.subdomain, &value(1)).await;
        outsiders.push(r.status);
    }
    assert_eq!(outsiders, [401, 401, 429]);
    let r = update_from(
        inside,
        &base,
        &c.username,
        &c.password,
        &c.subdomain,
        &value(1),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.problem());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_operator_registration_only_the_cli_makes_accounts_and_an_eab_binding_ends_with_it() {
    let data = harness::tempdir();
    let toml = TestServer::config_text(
        data.path(),
        1,
        None,
        &zone_table("registration = \"operator\"\n"),
    );
    let (_etc, config) = config_file(&toml);
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let base = server.base().to_owned();
    let r = register(&base, "").await;
    assert_eq!(
        (r.status, error_of(&r).as_str()),
        (403, "registration_disabled")
    );

    let eab = run_cli(&config, &["eab", "create", "--json"], &[]);
    assert_eq!(eab.code, 0, "{}", eab.stderr);
    let kid = serde_json::from_str::<Value>(&eab.stdout).expect("JSON")["kid"]
        .as_str()
        .expect("kid")
        .to_owned();
    let out = run_cli(
        &config,
        &[
            "dns",
            "account",
            "add",
            "--eab",
            &kid,
            "--for",
            "*.h.lab.test",
            "--for",
            "h.lab.test",
        ],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let creds = Creds::from(&serde_json::from_str(&out.stdout).expect("JSON"));
    // One CNAME for a name and its wildcard, to the account's name; one
    // account per name.
    assert_eq!(
        out.stderr.trim(),
        format!("_acme-challenge.h.lab.test. CNAME {}.", creds.fulldomain)
    );
    let two = run_cli(
        &config,
        &[
            "dns",
            "account",
            "add",
            "--for",
            "h.lab.test",
            "--for",
            "g.lab.test",
        ],
        &[],
    );
    assert_ne!(two.code, 0, "{}", two.stdout);
    assert!(
        two.stderr.contains("one account per name"),
        "{}",
        two.stderr
    );
    let listed = run_cli(&config, &["dns", "account", "list"], &[]);
    assert!(listed.stdout.contains(&creds.username), "{}", listed.stdout);
    assert!(
        !listed.stdout.contains(&creds.password),
        "{}",
        listed.stdout
    );

    let r = update(
        &base,
        &creds.username,
        &creds.password,
        &creds.subdomain,
        &value(1),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.problem());
    let revoked = run_cli(&config, &["eab", "revoke", &kid, "--yes"], &[]);
    assert_eq!(revoked.code, 0, "{}", revoked.stderr);
    let r = update(
        &base,
        &creds.username,
        &creds.password,
        &creds.subdomain,
        &value(2),
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.problem());

    // A revoked or unknown credential cannot be bound.
    for kid in [kid.as_str(), "no-such-kid"] {
        let out = run_cli(&config, &["dns", "account", "add", "--eab", kid], &[]);
        assert_ne!(out.code, 0, "{}", out.stdout);
        assert!(out.stderr.contains(kid), "{}", out.stderr);
    }
    server.stop().await;
}

/// The manual auth hook certbot runs per authorization: it publishes
/// `CERTBOT_VALIDATION` through the acme-dns API with pyacmedns, the
/// acme-dns project's own client library, registering an account for the
/// domain on first use and then stopping with the CNAME to create, as
/// acme-dns clients (lego's provider, acme-dns-certbot) do.
const ACME_DNS_HOOK: &str = r#"
import os, sys
from pyacmedns import Client, Storage

client = Client(os.environ["ACMEDNS_API"])
storage = Storage(os.environ["ACMEDNS_STORAGE"])
domain = os.environ["CERTBOT_DOMAIN"]
account = storage.fetch(domain)
if not account:
    account = client.register_account(None)
    storage.put(domain, account)
    storage.save()
    sys.exit("new acme-dns account; create the CNAME _acme-challenge.%s. CNAME %s. and run again"
             % (domain, account["fulldomain"]))
client.update_txt_record(account, os.environ["CERTBOT_VALIDATION"])
"#;

/// certbot with an acme-dns client against our API and our CA: the first
/// run registers and stops, asking for the CNAME; the DNS team (the test)
/// adds it to BIND; the second run obtains the name and its wildcard over
/// dns-01, both values served at the account's one name, found by our
/// validator through BIND's CNAME and forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acme_dns_client_gets_a_name_and_its_wildcard_from_our_ca_through_one_cname() {
    if !harness::require_program("dig") {
        return;
    }
    let (Some(certbot), Some(python)) = (harness::certbot5(), harness::acme_dns_client()) else {
        return;
    };
    let data = harness::tempdir();
    let first = TestServer::config_text(
        data.path(),
        1,
        None,
        &format!(
            "[profiles.default]\nchallenges = [\"dns-01\"]\n{}",
            zone_table("")
        ),
    );
    let server = TestServer::start_in(harness::tempdir(), &first).await;
    let at = server.running().dns_addrs[0];
    let Some(bind) = Bind::start_delegating_dynamic("lab.test", ZONE, at) else {
        return;
    };
    // The validator resolves through the corporate DNS.
    let second = first.replace(
        "[validation]\n",
        &format!("[validation]\ndns_resolvers = [\"{}\"]\n", bind.addr),
    );
    server
        .running()
        .reload(acme_proxy::config::Config::from_toml(&second).expect("the configuration"))
        .await
        .expect("the resolver is set by a reload");

    let dir = harness::tempdir();
    let d = dir.path().to_path_buf();
    let hook = d.join("acme-dns-hook.py");
    std::fs::write(&hook, ACME_DNS_HOOK).expect("the hook");
    let storage = d.join("acme-dns.json");
    let certbot_run = |storage: &Path| {
        let mut args = vec!["certonly".to_owned()];
        args.extend(certbot_common(&d, &server.directory("default")));
        args.extend(
            [
                "--manual",
                "--preferred-challenges",
                "dns",
                "--manual-auth-hook",
                &format!("{} {}", python.display(), hook.display()),
                "-d",
                "x.lab.test",
                "-d",
                "*.x.lab.test",
                "--cert-name",
                "x",
                // The last run asks again for a lineage that is not due.
                "--force-renewal",
            ]
            .map(str::to_owned),
        );
        let env = vec![
            (
                "ACMEDNS_API".to_owned(),
                format!("{}/acme-dns", server.base()),
            ),
            (
                "ACMEDNS_STORAGE".to_owned(),
                storage.to_str().expect("utf-8 path").to_owned(),
            ),
        ];
        run_with_env(certbot.display().to_string(), args, env, d.clone())
    };

    // First run: the client registers, stores the account and stops with
    // the CNAME to create.
    let ran = certbot_run(&storage).await;
    assert!(
        !ran.success(),
        "certbot cannot finish before the CNAME exists\n{}",
        ran.report()
    );
    let stored: Value = serde_json::from_slice(&std::fs::read(&storage).unwrap_or_else(|e| {
        panic!(
            "the client stored no account ({e})\n{}\n{}",
            ran.report(),
            certbot_log_tail(&d)
        )
    }))
    .expect("the client's storage JSON");
    let fulldomain = stored["x.lab.test"]["fulldomain"]
        .as_str()
        .unwrap_or_else(|| panic!("no account for x.lab.test: {stored}"))
        .to_owned();
    assert!(fulldomain.ends_with(&format!(".{ZONE}")), "{stored}");

    // The DNS team adds the one CNAME; the second run obtains both names.
    bind.update(
        "lab.test",
        &[format!(
            "update add _acme-challenge.x.lab.test. 60 CNAME {fulldomain}."
        )],
    );
    let ran = certbot_run(&storage).await;
    assert!(
        ran.success(),
        "certbot failed\n{}\n{}\n{}",
        ran.report(),
        certbot_log_tail(&d),
        bind.log()
    );
    let cert = d.join("conf").join("live").join("x").join("cert.pem");
    let issued = leaf(&cert, &|| ran.report());
    let mut sans = issued.sans.clone();
    sans.sort();
    assert_eq!(sans, ["*.x.lab.test", "x.lab.test"]);
    // Both authorizations' values, at the account's one name.
    assert_eq!(served(at, &fulldomain).len(), 2);

    // A failed dns-01 says where the name is delegated: nowhere, or to a
    // name of our zone that holds no value.
    bind.update(
        "lab.test",
        &[format!(
            "update add _acme-challenge.z.lab.test. 60 CNAME nobody.{ZONE}."
        )],
    );
    let dir = raw::directory(&server.directory("default")).await;
    let acct = raw::Acct::create(&dir, raw::Key::p256()).await;
    for (name, said) in [
        (
            "y.lab.test",
            format!("no CNAME delegates it to this server's zone {ZONE}"),
        ),
        (
            "z.lab.test",
            format!("delegated by CNAME to nobody.{ZONE}. in this server's zone"),
        ),
    ] {
        let r = acct
            .post(
                &dir,
                dir["newOrder"].as_str().expect("newOrder"),
                Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.problem());
        let authz = acct
            .post(
                &dir,
                r.json()["authorizations"][0].as_str().expect("authz"),
                None,
            )
            .await
            .json();
        let challenge = authz["challenges"]
            .as_array()
            .expect("challenges")
            .iter()
            .find(|c| c["type"] == "dns-01")
            .expect("dns-01 offered")
            .clone();
        let settled = acct
            .trigger_and_settle(&dir, challenge["url"].as_str().expect("url"))
            .await;
        assert_eq!(settled["status"], "invalid", "{name}: {settled}");
        let detail = settled["error"]["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(&said), "{name}: {settled}");
    }

    // Another account's credentials for the first one's subdomain: the
    // client is refused (401) and nothing is published.
    let before = served(at, &fulldomain);
    let other = registered(server.base(), "").await;
    let mut forged = stored.clone();
    forged["x.lab.test"]["username"] = json!(other.username);
    forged["x.lab.test"]["password"] = json!(other.password);
    let forged_path = d.join("forged.json");
    std::fs::write(&forged_path, forged.to_string()).expect("storage file");
    let ran = certbot_run(&forged_path).await;
    assert!(!ran.success(), "{}", ran.report());
    let told = format!("{}{}", ran.report(), certbot_log_tail(&d));
    assert!(told.contains("Response HTTP status: 401"), "{told}");
    assert_eq!(served(at, &fulldomain), before);
    server.stop().await;
}

/// Open registration with no bound on accounts let clients with many
/// addresses (a /48 holds 65,536 /64s, each with its own hourly quota)
/// fill the table without end. Past `max_accounts` a registration is
/// refused before its password is hashed, audited with the reason (once a
/// minute at most), and nothing is written; the operator still adds
/// accounts by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_past_max_accounts_are_refused_and_audited_and_the_operator_still_adds_one() {
    let data = harness::tempdir();
    let toml = TestServer::config_text(data.path(), 1, None, &zone_table("max_accounts = 2\n"));
    let (_etc, config) = config_file(&toml);
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let base = server.base().to_owned();
    registered(&base, "").await;
    registered(&base, "").await;
    // Another address each time: the per-address quota is not what stops it.
    for last in [2, 3] {
        let from: std::net::IpAddr = format!("127.0.0.{last}").parse().expect("ip");
        let r = raw::request_from(
            from,
            "POST",
            &format!("{base}/acme-dns/register"),
            &[("content-type", "application/json")],
            b"{}".to_vec(),
        )
        .await;
        assert_eq!((r.status, error_of(&r).as_str()), (403, "account_limit"));
    }
    let store = server.running().authority().store().clone();
    assert_eq!(store.dns_account_count().await.expect("count"), 2);
    // The first refusal has its row at once; the rest of its minute get
    // one row together when the minute ends (unit-tested in dns_api.rs):
    // a flood of refusals from many addresses must not fill the audit log
    // in the accounts' place.
    let rows = audit_rows(&config, "dns.account_registered");
    let refused: Vec<&Value> = rows.iter().filter(|r| r["outcome"] == "refused").collect();
    assert_eq!(refused.len(), 1, "{rows:?}");
    assert!(
        refused[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("max_accounts (2)")),
        "{rows:?}"
    );
    let out = run_cli(&config, &["dns", "account", "add"], &[]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(store.dns_account_count().await.expect("count"), 3);
    server.stop().await;
}

/// The SOA serial `at` serves for `zone`.
fn soa_serial(at: SocketAddr, zone: &str) -> u32 {
    let text = dig_short(at, zone, "SOA");
    // mname rname serial refresh retry expire minimum
    text.split_whitespace()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no SOA for {zone}: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_moves_the_serial_of_the_accounts_own_zone_after_the_zones_are_reordered() {
    if !harness::require_program("dig") {
        return;
    }
    const OTHER: &str = "other.zone.test";
    let data = harness::tempdir();
    let first = TestServer::config_text(data.path(), 1, None, &zone_table(""));
    let server = TestServer::start_in(harness::tempdir(), &first).await;
    let a = registered(server.base(), "").await;
    assert_eq!(a.fulldomain, format!("{}.{ZONE}", a.subdomain));
    server.stop().await;

    // Restarted with another zone listed first ([dns_zone] takes a
    // restart): new accounts go there, this one stays where it was.
    let second = first.replace(
        &format!("zones = [\"{ZONE}\"]"),
        &format!("zones = [\"{OTHER}\", \"{ZONE}\"]"),
    );
    assert_ne!(first, second);
    let server = TestServer::start_in(harness::tempdir(), &second).await;
    let base = server.base().to_owned();
    let at = server.running().dns_addrs[0];
    let b = registered(&base, "").await;
    assert_eq!(b.fulldomain, format!("{}.{OTHER}", b.subdomain));

    let (own, other) = (soa_serial(at, ZONE), soa_serial(at, OTHER));
    let r = update(&base, &a.username, &a.password, &a.subdomain, &value(1)).await;
    assert_eq!(r.status, 200, "{}", r.problem());
    assert_eq!(served(at, &a.fulldomain), [value(1)]);
    assert_eq!(soa_serial(at, ZONE), own + 1, "the changed zone's serial");
    assert_eq!(soa_serial(at, OTHER), other, "a zone that did not change");
    server.stop().await;
}
