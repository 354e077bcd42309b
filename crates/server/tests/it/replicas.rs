//! Three `acme-proxy` processes on one PostgreSQL database behind HAProxy
//! (Debian's `haproxy`, round robin, health-checked on `/health`), as an
//! operator runs replicas: certbot and lego through the balancer, a nonce
//! of one replica used at another, and relays that survive a replica
//! SIGKILLed mid-flight.
//!
//! These tests need PostgreSQL whatever the suite's backend: a SQLite file
//! is one machine's. Each replica is the binary in a directory of its own
//! (its log there) with a configuration of its own (its `listen`), all
//! sharing the data directory (the profile's CA) and the database.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use instant_acme::OrderStatus;
use serde_json::json;

use crate::clients::{self, Ran};
use crate::harness::{self, ChildGuard, Dns, TestServer};
use crate::raw::{self, Key};
use crate::relay;
use crate::upstream::{FaultProxy, Pebble, TestPki};

/// The replicas behind the balancer.
const REPLICAS: usize = 3;

/// Replicas of one configuration behind one HAProxy.
struct Replicas {
    dir: tempfile::TempDir,
    /// The configuration every replica shares, but for its `listen`.
    toml: String,
    addrs: Vec<SocketAddr>,
    children: Vec<Option<ChildGuard>>,
    /// Where HAProxy listens: the `public_url` of every replica.
    front: SocketAddr,
    _haproxy: ChildGuard,
}

impl Replicas {
    /// Starts `REPLICAS` replicas of `toml` (a test configuration whose
    /// `listen` is 127.0.0.1:0, on a [`shared_database`]), one after the
    /// other or all at once, and HAProxy in front of them.
    fn start(toml: &str, together: bool) -> Replicas {
        assert!(
            harness::require_program("haproxy"),
            "haproxy is not installed (scripts/test installs Debian's)"
        );
        let dir = harness::tempdir();
        let front = harness::own_addr();
        let toml = toml.replacen(
            "listen = \"127.0.0.1:0\"",
            &format!("public_url = \"http://{front}\"\nlisten = \"LISTEN\""),
            1,
        );
        assert!(toml.contains("LISTEN"), "a test configuration:\n{toml}");
        assert!(toml.contains("database_url = \"postgres"), "{toml}");
        let addrs: Vec<SocketAddr> = (0..REPLICAS).map(|_| harness::own_addr()).collect();
        let mut replicas = Replicas {
            _haproxy: start_haproxy(dir.path(), front, &addrs),
            dir,
            toml,
            addrs,
            children: (0..REPLICAS).map(|_| None).collect(),
            front,
        };
        if together {
            // All at once, migrations included: they take turns under
            // PostgreSQL's advisory lock.
            let spawned: Vec<ChildGuard> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..REPLICAS)
                    .map(|i| {
                        let replicas = &replicas;
                        s.spawn(move || replicas.spawn(i))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a replica started"))
                    .collect()
            });
            for (i, child) in spawned.into_iter().enumerate() {
                replicas.children[i] = Some(child);
            }
        } else {
            for i in 0..REPLICAS {
                replicas.children[i] = Some(replicas.spawn(i));
            }
        }
        replicas.wait_all_up();
        replicas
    }

    /// Runs replica `i` and waits until it serves.
    fn spawn(&self, i: usize) -> ChildGuard {
        let home = self.dir.path().join(format!("r{i}"));
        std::fs::create_dir_all(&home).expect("replica directory");
        let config = home.join("acme-proxy.toml");
        std::fs::write(
            &config,
            self.toml.replacen("LISTEN", &self.addrs[i].to_string(), 1),
        )
        .expect("write config");
        let config = config.to_str().expect("utf-8 path").to_owned();
        harness::spawn_binary(&home, &["serve", "--config", &config], &[]).0
    }

    /// The process id of replica `i`, which names its job leases.
    fn pid(&self, i: usize) -> u32 {
        self.children[i].as_ref().expect("replica running").0.id()
    }

    /// SIGKILLs replica `i`.
    fn kill(&mut self, i: usize) {
        drop(self.children[i].take().expect("replica running")); // SIGKILL, reaped
    }

    fn restart(&mut self, i: usize) {
        assert!(self.children[i].is_none(), "replica {i} is running");
        self.children[i] = Some(self.spawn(i));
    }

    /// The directory URL of the default profile through the balancer.
    fn directory(&self) -> String {
        format!("http://{}/profile/default/directory", self.front)
    }

    /// The base URL of replica `i` itself, past the balancer.
    fn replica_base(&self, i: usize) -> String {
        format!("http://{}", self.addrs[i])
    }

    /// Waits until HAProxy's health checks found every replica up, seen
    /// through the balancer: each replica answers one request in turn.
    fn wait_all_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let served = self.servers_in_log().len();
            if served == REPLICAS {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "HAProxy did not send to every replica within 20 s:\n{}",
                self.haproxy_log()
            );
            let _ = http_get(self.front, "/health");
        }
    }

    /// HAProxy's log: one line per request, naming the replica that
    /// served it (`replicas/r1`).
    fn haproxy_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.log")).unwrap_or_default()
    }

    /// The replicas that served at least one request through the balancer.
    fn servers_in_log(&self) -> BTreeSet<String> {
        self.haproxy_log()
            .lines()
            .filter_map(served_by)
            .map(str::to_owned)
            .collect()
    }

    /// The database every replica shares.
    fn database_url(&self) -> String {
        acme_proxy::config::Config::from_toml(&self.toml.replacen("LISTEN", "127.0.0.1:0", 1))
            .expect("config")
            .database_url()
    }
}

/// The replica that served the request a line of HAProxy's log records
/// (`ADDR [DATE] acme replicas/r1 …`); None for any other line, such as a
/// health check's `Server replicas/r0 is DOWN`, which served nothing.
fn served_by(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace().skip(2);
    (words.next() == Some("acme"))
        .then(|| words.next())
        .flatten()
        .filter(|server| server.starts_with("replicas/r"))
}

/// `toml` on a PostgreSQL database of its own: the suite's own on the
/// PostgreSQL run, a new one on the SQLite run.
fn shared_database(toml: String) -> String {
    if toml.contains("database_url") {
        toml
    } else {
        format!(
            "database_url = \"{}\"\n{toml}",
            harness::fresh_postgres_database()
        )
    }
}

/// Starts HAProxy on `front` in front of `replicas`: round robin, each
/// checked with `GET /health` every 200 ms, a request that cannot connect
/// to one retried on another, one log line per request on stdout (into
/// `dir/haproxy.log`). A check's answer may take 5 s: with the default
/// (the 200 ms interval) a loaded machine's database ping can miss it
/// twice, and with every replica marked down HAProxy answers 503; a killed
/// replica still refuses the connection at once.
fn start_haproxy(dir: &Path, front: SocketAddr, replicas: &[SocketAddr]) -> ChildGuard {
    let servers: String = replicas
        .iter()
        .enumerate()
        .map(|(i, addr)| format!("    server r{i} {addr} check\n"))
        .collect();
    harness::start_haproxy(
        dir,
        front,
        "replicas",
        &format!(
            "    balance roundrobin\n    retries 3\n    option redispatch\n    \
             option httpchk GET /health\n    http-check expect status 200\n    \
             timeout check 5s\n    default-server inter 200ms fall 2 rise 1\n{servers}"
        ),
    )
}

/// A plain HTTP/1.0 GET of `path` at `addr` (blocking); the status, or
/// None when nothing answered.
fn http_get(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nonce_from_one_replica_is_accepted_once_at_another_behind_the_balancer() {
    let data = harness::tempdir();
    let toml = shared_database(TestServer::config_text(data.path(), 1, None, ""));
    let replicas = Replicas::start(&toml, false);

    // Fetched from replica 0 itself, used at replica 1 itself.
    let nonce_at = |i: usize| {
        let base = replicas.replica_base(i);
        async move {
            let r = raw::request(
                "HEAD",
                &format!("{base}/profile/default/new-nonce"),
                None,
                Vec::new(),
            )
            .await;
            r.nonce().expect("Replay-Nonce")
        }
    };
    let nonce = nonce_at(0).await;
    // The JWS names the URL clients know (the balancer's), wherever the
    // request lands.
    let fetched = raw::request("GET", &replicas.directory(), None, Vec::new()).await;
    assert_eq!(
        fetched.status,
        200,
        "the directory through the balancer: {}\nHAProxy:\n{}",
        String::from_utf8_lossy(&fetched.body),
        replicas.haproxy_log()
    );
    let directory = fetched.json();
    let new_account = directory["newAccount"].as_str().expect("newAccount");
    let path = new_account
        .strip_prefix(&format!("http://{}", replicas.front))
        .expect("the directory names the balancer");
    let key = Key::p256();
    let body = key.sign(
        &json!({"alg": key.alg(), "jwk": key.jwk, "nonce": nonce, "url": new_account}),
        Some(&json!({"termsOfServiceAgreed": true})),
    );
    let at_replica = |i: usize| format!("{}{path}", replicas.replica_base(i));
    let accepted = raw::post(&at_replica(1), &body).await;
    assert_eq!(accepted.status, 201, "{:?}", accepted.json());
    for i in 0..REPLICAS {
        raw::post(&at_replica(i), &body).await.assert_refused(
            400,
            "badNonce",
            &format!("the nonce replayed at replica {i}"),
        );
    }
    // A nonce of another replica is as good through the balancer.
    let nonce = nonce_at(2).await;
    let protected = json!({"alg": key.alg(), "kid": accepted.location().expect("account URL"), "nonce": nonce, "url": accepted.location().expect("account URL")});
    let body = key.sign(&protected, None);
    let fetched = raw::post(&accepted.location().expect("account URL"), &body).await;
    assert_eq!(fetched.status, 200, "{:?}", fetched.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_and_lego_obtain_renew_and_revoke_through_three_replicas_behind_haproxy() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    assert!(harness::require_program("certbot") && harness::require_program("lego"));
    let at = harness::own_addr();
    let data = harness::tempdir();
    let toml = shared_database(
        TestServer::config_text(data.path(), at.port(), Some(&dns), "").replacen(
            "timeout = \"5s\"",
            "timeout = \"10s\"",
            1,
        ),
    );
    // The first replica makes the profile's CA in the shared data
    // directory; the others load it.
    let replicas = Replicas::start(&toml, false);
    let directory = replicas.directory();
    let served_before = replicas.haproxy_log().lines().count();
    let check = |ran: &Ran, what: &str| {
        assert!(ran.success(), "{what} failed\n{}", ran.report());
        eprintln!("{what}: {:.1?}", ran.elapsed);
    };

    // certbot: obtain, renew, revoke.
    let certbot_home = harness::tempdir();
    let d = certbot_home.path().to_path_buf();
    let name = "certbot.example.test";
    let ran = clients::run(
        "certbot",
        clients::certbot_certonly_standalone(&d, &directory, at, name),
        d.clone(),
    )
    .await;
    check(&ran, "certbot certonly");
    let cert_path = d.join("conf").join("live").join("t").join("cert.pem");
    let first = clients::leaf(&cert_path, &|| ran.report());
    let mut args = vec!["renew".to_owned()];
    args.extend(clients::certbot_common(&d, &directory));
    args.extend(["--http-01-address".to_owned(), at.ip().to_string()]);
    args.extend(
        [
            "--no-random-sleep-on-renew",
            "--force-renewal",
            "--cert-name",
            "t",
        ]
        .map(str::to_owned),
    );
    let ran = clients::run("certbot", args, d.clone()).await;
    check(&ran, "certbot renew");
    let renewed = clients::leaf(&cert_path, &|| ran.report());
    assert_ne!(first.serial, renewed.serial, "renewal issued a new serial");
    let mut args = vec!["revoke".to_owned()];
    args.extend(clients::certbot_common(&d, &directory));
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
    check(
        &clients::run("certbot", args, d.clone()).await,
        "certbot revoke",
    );

    // lego: obtain, renew, revoke.
    let lego_home = harness::tempdir();
    let l = lego_home.path().to_path_buf();
    let name = "lego.example.test";
    let ran = clients::run(
        "lego",
        clients::lego_http_run(&directory, &l, at, name),
        l.clone(),
    )
    .await;
    check(&ran, "lego run");
    let lego_cert = l.join("certificates").join(format!("{name}.crt"));
    let lego_first = clients::leaf(&lego_cert, &|| ran.report());
    let mut args = clients::lego_http_run(&directory, &l, at, name);
    args.pop(); // "run"
    args.extend(["renew", "--days", "36500", "--no-random-sleep"].map(str::to_owned));
    let ran = clients::run("lego", args, l.clone()).await;
    check(&ran, "lego renew");
    let lego_renewed = clients::leaf(&lego_cert, &|| ran.report());
    assert_ne!(lego_first.serial, lego_renewed.serial);
    let mut args = clients::lego_http_run(&directory, &l, at, name);
    args.truncate(args.len() - 6); // "--http … -d NAME run"
    args.extend(["-d", name, "revoke", "--reason", "4"].map(str::to_owned));
    check(&clients::run("lego", args, l.clone()).await, "lego revoke");

    // Both revocations are on the one CRL every replica serves.
    for i in 0..REPLICAS {
        let crl = crate::flow::crl_der(&replicas.replica_base(i)).await;
        let (_, crl) = x509_parser::prelude::parse_x509_crl(&crl).expect("CRL parses");
        let serials: Vec<&[u8]> = crl
            .iter_revoked_certificates()
            .map(|r| r.raw_serial())
            .collect();
        for revoked in [&renewed.serial, &lego_renewed.serial] {
            assert!(
                serials.contains(&revoked.as_slice()),
                "replica {i}'s CRL lists {}",
                hex::encode(revoked)
            );
        }
    }

    // The clients' requests were spread over every replica.
    let log = replicas.haproxy_log();
    let client_lines: Vec<&str> = log.lines().skip(served_before).collect();
    let served: BTreeSet<&str> = client_lines.iter().filter_map(|l| served_by(l)).collect();
    assert_eq!(
        served.len(),
        REPLICAS,
        "the balancer sent the clients' requests to {served:?}:\n{log}"
    );
    eprintln!(
        "{} client requests through the balancer, served by {served:?}",
        client_lines.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_relays_through_the_balancer_survive_a_replica_sigkilled_twice() {
    const ORDERS: usize = 200;
    let pki = TestPki::new();
    let pebble = Pebble::start(&pki, relay::always_valid()).expect("pebble");
    // Counts every upstream request; injects nothing.
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let data = harness::tempdir();
    let lease = Duration::from_secs(2);
    let toml = relay::server_toml(
        data.path(),
        1,
        None,
        &relay::bypass_profile(&proxy.directory_url(), &pki, "")
            .replace("poll_interval = \"100ms\"", "poll_interval = \"300ms\""),
    )
    // Two relays at a time per replica and a slow upstream poll: the
    // relays outlast two kills and restarts.
    .replace("[jobs]\n", "[jobs]\nconcurrency = 2\n");
    assert!(toml.contains(&format!("lease = \"{}s\"", lease.as_secs())));
    let toml = shared_database(toml);
    relay::register_upstream_accounts(&toml).await;
    let mut replicas = Replicas::start(&toml, true);
    let database = replicas.database_url();

    let account = crate::client::account(&replicas.directory()).await;
    let mut finalizing = tokio::task::JoinSet::new();
    let mut urls: Vec<String> = Vec::new();
    for i in 0..ORDERS {
        let account = account.clone();
        finalizing.spawn(async move {
            let mut order = relay::ready_order(&account, &[&format!("r{i}.example.test")]).await;
            order.finalize().await.expect("finalize");
            order.url().to_owned()
        });
        // A few at a time: the balancer and the replicas are not under
        // test for load here.
        while finalizing.len() >= 16 {
            urls.push(
                finalizing
                    .join_next()
                    .await
                    .expect("a task")
                    .expect("finalized"),
            );
        }
    }
    urls.extend(finalizing.join_all().await);
    assert_eq!(urls.len(), ORDERS);

    let victim = 1;
    for kill in 0..2 {
        // The kill lands while the victim relays: it holds leases.
        let held = format!(
            "SELECT COUNT(*) FROM jobs WHERE status IN ('running', 'retiring') AND lease_owner LIKE '{}:%'",
            replicas.pid(victim)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while harness::psql_scalar(&database, &held) == "0" {
            assert!(
                Instant::now() < deadline,
                "replica {victim} took no relay within 30 s of its (re)start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        replicas.kill(victim);
        let killed = Instant::now();
        let in_flight: u64 = harness::psql_scalar(&database, &held)
            .parse()
            .expect("a count");
        assert!(
            in_flight > 0,
            "the killed replica's jobs finished by themselves"
        );
        // The others take the dead replica's jobs when their leases run
        // out: within one lease of the kill (and room for a poll, the
        // claim and this loop on a busy machine).
        loop {
            let left: u64 = harness::psql_scalar(&database, &held)
                .parse()
                .expect("a count");
            if left == 0 {
                break;
            }
            assert!(
                killed.elapsed() < lease + Duration::from_secs(2),
                "{left} of the killed replica's jobs still held {:?} after the kill",
                killed.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "kill {kill}: {in_flight} job(s) in flight, taken over {:?} after the kill",
            killed.elapsed()
        );
        replicas.restart(victim);
    }

    // Every order ends valid, polled through the balancer.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let valid: usize = harness::psql_scalar(
            &database,
            "SELECT COUNT(*) FROM orders WHERE status = 'valid'",
        )
        .parse()
        .expect("a count");
        let invalid = harness::psql_scalar(
            &database,
            "SELECT COUNT(*) FROM orders WHERE status = 'invalid'",
        );
        assert_eq!(invalid, "0", "an order ended invalid");
        if valid == ORDERS {
            break;
        }
        if Instant::now() >= deadline {
            // What to look at when it stalls: the relay jobs, and whether
            // the upstream still answers (Pebble's memory store can
            // deadlock under concurrent requests).
            let jobs = harness::psql_scalar(
                &database,
                "SELECT status || ' attempts=' || attempts || ' owner=' || coalesce(lease_owner, '-')
                        || ' error=' || coalesce(last_error, '-') || ' x' || COUNT(*)
                   FROM jobs WHERE kind = 'signer_relay_issue'
                  GROUP BY status, attempts, lease_owner, last_error",
            );
            let recent: Vec<(Duration, String, String, u16)> = proxy
                .requests_at()
                .into_iter()
                .rev()
                .take(20)
                .map(|(at, m, p, s)| (at.elapsed(), m, p, s))
                .collect();
            panic!(
                "{valid} of {ORDERS} orders valid after 120 s\nrelay jobs:\n{jobs}\nlast upstream requests (age, method, path, status): {recent:#?}\nPebble's log ends:\n{}",
                pebble
                    .log()
                    .lines()
                    .rev()
                    .take(30)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for url in &urls {
        let mut order = account
            .order(url.clone())
            .await
            .expect("poll through the balancer");
        assert_eq!(
            order.refresh().await.expect("refresh").status,
            OrderStatus::Valid,
            "{url}"
        );
    }

    // Each upstream order was finalized exactly once.
    let finalizes: Vec<(String, String, u16)> = proxy
        .requests()
        .into_iter()
        .filter(|(m, p, _)| m == "POST" && p.contains(relay::FINALIZE))
        .collect();
    let accepted = finalizes.iter().filter(|(_, _, s)| *s == 200).count();
    assert_eq!(accepted, ORDERS, "upstream finalizes: {finalizes:?}");
    let mut paths: Vec<&str> = finalizes.iter().map(|(_, p, _)| p.as_str()).collect();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), ORDERS, "an upstream order was finalized twice");
    assert_eq!(
        harness::psql_scalar(
            &database,
            "SELECT COUNT(*) FROM upstream_orders WHERE status = 'processing'"
        ),
        "0",
        "an upstream order was left processing"
    );
    assert_eq!(
        harness::psql_scalar(
            &database,
            "SELECT COUNT(*) FROM jobs WHERE status IN ('queued', 'running', 'retiring') AND kind = 'signer_relay_issue'"
        ),
        "0",
        "a relay job was left unfinished"
    );
    let served = replicas.servers_in_log();
    assert_eq!(served.len(), REPLICAS, "{served:?}");
}
