//! Crash at every write: the binary, built with the `failpoints` feature,
//! aborts at one crash point (`CRASH_AT`, each right after a
//! transaction commits, or the signer answered) while a client goes through a whole issuance and
//! revocation with a webhook listening. The client retries what a crash
//! cut off against the restarted server, as real clients do, and then the
//! state must have converged: the order valid with exactly one
//! certificate, no order left processing, the certificate revoked and on
//! the CRL, and every notification delivered: at least once, and again
//! only if the crash caught its delivery between the receiver's answer and
//! the job's settlement (at most twice).
//!
//! The crash points (`acme_proxy::CRASH_POINTS`) and where they are:
//!
//! | point                 | right after                                            |
//! |-----------------------|--------------------------------------------------------|
//! | `order.created`       | newOrder's transaction (order, authorizations)         |
//! | `challenge.bypassed`  | a challenge's trigger made it valid (bypass profile)   |
//! | `challenge.started`   | a trigger: the challenge processing, its job queued    |
//! | `challenge.settled`   | a real http-01 validation's outcome recorded           |
//! | `finalize.began`      | a guarded finalize: order processing, its watch queued |
//! | `finalize.signed`     | the custom program signed, before the outcome is kept  |
//! | `finalize.completed`  | the certificate, the valid order and its audit row     |
//! | `revocation.stored`   | the revocation and its notification's job              |
//! | `crl.number_reserved` | a CRL number taken, before the CRL is stored           |
//! | `job.claimed`         | a job claim (any kind)                                 |
//! | `job.ran`             | an attempt ended, before it is settled                 |
//! | `job.settled`         | a job's settlement                                     |
//! | `notify.delivered`    | a webhook answered 2xx, before the job is settled      |
//! | `relay.settled`       | the upstream's certificate stored on the local order   |
//! | `relay.abandoned`     | a relay retired (the upstream refused): order invalid  |
//! | `relay.moved`         | a relayed order moved off its upstream (failover)      |
//!
//! The relay's rows sign through Pebble (and, to be refused, a proxy
//! answering its finalize 403); the `finalize.*` rows both with the
//! embedded CA (which has only `finalize.completed`) and with a custom
//! program (openssl), where a crash between `began` and the outcome
//! leaves the order to its watch, which fails it once the program's time
//! limit is well past; the client then orders anew. The others sign with
//! the embedded CA. The
//! challenge rows validate http-01 for real (a responder, names resolved
//! by pebble-challtestsrv); the others bypass validation.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::custom::LegacyPki;
use crate::harness::{self, Dns, Receiver, Responder, under_umask_022};
use crate::raw::{self, Key, Resp, b64};
use crate::relay::{FINALIZE, always_valid, bypass_profile, register_upstream_accounts};
use crate::upstream::{Fault, FaultProxy, Match, Pebble, TestPki};

/// Delivery retries and job leases short enough for a test.
const JOBS: &str = "[jobs]\nbackoff_base = \"100ms\"\nbackoff_cap = \"500ms\"\npoll_interval = \"50ms\"\nlease = \"2s\"\n";

/// The server under test: its configuration, the process, and how many
/// times it crashed.
struct Server {
    work: tempfile::TempDir,
    config: PathBuf,
    child: Option<Child>,
    starts: usize,
    crashes: usize,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Server {
    /// `profile`: the default profile's table (bypassing validation).
    async fn new(receiver: &Receiver, profile: &str) -> Server {
        let work = harness::tempdir();
        let config = work.path().join("acme-proxy.toml");
        let toml = format!(
            "listen = \"{}\"\ndata_dir = \"{}\"\n{JOBS}{profile}\n\n[profiles.default.notify.webhooks.ops]\nurl = \"{}\"\ntimeout = \"2s\"\n",
            harness::own_addr(),
            work.path().join("data").display(),
            receiver.url("/hook"),
        );
        register_upstream_accounts(&toml).await;
        std::fs::write(&config, toml).unwrap();
        Server {
            work,
            config,
            child: None,
            starts: 0,
            crashes: 0,
        }
    }

    fn work(&self) -> &Path {
        self.work.path()
    }

    /// Starts the server (armed at `crash_at`) and returns its directory
    /// URL; a start that crashes (a crash point on the start-up path) is
    /// counted and followed by an unarmed one.
    fn start(&mut self, crash_at: Option<&str>) -> String {
        use std::io::{BufRead, BufReader};
        self.starts += 1;
        let mut cmd = under_umask_022();
        cmd.args(["serve", "--config"])
            .arg(&self.config)
            .current_dir(self.work.path())
            .env_remove("ACME_PROXY_CONFIG")
            .stdout(Stdio::piped())
            .stderr(
                std::fs::File::create(self.work.path().join(format!("server-{}.log", self.starts)))
                    .unwrap(),
            );
        if let Some(point) = crash_at {
            cmd.env("CRASH_AT", point);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.split("ACME directory (default): ").nth(1) {
                    let _ = tx.send(url.trim().to_owned());
                }
            }
        });
        self.child = Some(child);
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => url,
            Err(_) => {
                // Its output closes a moment before its exit is seen.
                let deadline = Instant::now() + Duration::from_secs(5);
                while !self.reap_crash() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                assert!(
                    self.child.is_none(),
                    "the server neither served nor crashed; logs in {}",
                    self.work.path().display()
                );
                self.start(None)
            }
        }
    }

    /// Whether the process has ended; an end must be the crash point's
    /// abort (SIGABRT), counted.
    fn reap_crash(&mut self) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let Some(child) = &mut self.child else {
            return false;
        };
        match child.try_wait().unwrap() {
            None => false,
            Some(status) => {
                assert_eq!(
                    status.signal(),
                    Some(6),
                    "the server ended otherwise: {status}"
                );
                self.child = None;
                self.crashes += 1;
                true
            }
        }
    }

    /// After a request failed: if the server crashed (waiting a moment for
    /// the abort to land), restarts it and says so.
    fn restarted_after_crash(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if self.reap_crash() {
                self.start(None);
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

/// One HTTP request; an error (refused, reset, cut off) instead of a
/// panic, since a crash point ends the server mid-request.
async fn try_request(method: &str, url: &str, body: Option<Vec<u8>>) -> Result<Resp, String> {
    let headers: &[(&str, &str)] = if body.is_some() {
        &[("content-type", "application/jose+json")]
    } else {
        &[]
    };
    raw::try_request_with(method, url, headers, body.unwrap_or_default()).await
}

/// A client: its key, its account URL once it has one, and the
/// directory.
struct Client {
    key: Key,
    account: Option<String>,
    dir: Value,
}

impl Client {
    async fn signed(&self, url: &str, payload: Option<&Value>) -> Result<Resp, String> {
        let head = try_request("HEAD", self.dir["newNonce"].as_str().unwrap(), None).await?;
        let nonce = head
            .headers
            .get("replay-nonce")
            .and_then(|v| v.to_str().ok())
            .ok_or("no nonce")?
            .to_owned();
        let mut protected = json!({"alg": self.key.alg(), "nonce": nonce, "url": url});
        match &self.account {
            Some(kid) => protected["kid"] = json!(kid),
            None => protected["jwk"] = self.key.jwk.clone(),
        }
        let body = self.key.sign(&protected, payload).to_string().into_bytes();
        let r = try_request("POST", url, Some(body)).await?;
        // A 5xx is not a crash's answer; anything else the step judges.
        if r.status >= 500 {
            return Err(format!(
                "{url}: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            ));
        }
        Ok(r)
    }

    async fn get(&self, url: &str) -> Result<Value, String> {
        let r = self.signed(url, None).await?;
        if r.status != 200 {
            return Err(format!("{url}: {} {}", r.status, r.json()));
        }
        Ok(r.json())
    }
}

/// Runs `step` until it succeeds, restarting the server each time a
/// crash cut it off; a failure without a crash fails the test.
async fn step<T>(
    server: &mut Server,
    client: &Client,
    what: &str,
    run: impl AsyncFn(&Client) -> Result<T, String>,
) -> T {
    for _ in 0..3 {
        match run(client).await {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    server.restarted_after_crash(),
                    "{what} failed without a crash: {e}; logs in {}",
                    server.work().display()
                );
            }
        }
    }
    panic!("{what}: still failing after restarts");
}

/// The order at `url` once its status is none of `passing` (restarting
/// the server after a crash), within `seconds`.
async fn order_once_past(
    server: &mut Server,
    client: &Client,
    url: &str,
    passing: &[&str],
    seconds: u64,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let order = step(server, client, "the order", async |c: &Client| {
            c.get(url).await
        })
        .await;
        if !passing.iter().any(|s| order["status"] == *s) {
            return order;
        }
        server.restarted_after_crash();
        assert!(Instant::now() < deadline, "the order still {order}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// newOrder for `names`, its challenges (http-01, answered by
/// `responder`), and finalize with `csr`, each step retried after a crash:
/// the order once it is past pending, ready and processing.
async fn issue(
    server: &mut Server,
    client: &Client,
    names: &[&str],
    csr: &[u8],
    responder: &Responder,
) -> Value {
    let order_url = step(server, client, "newOrder", async |c: &Client| {
        let ids: Vec<Value> = names
            .iter()
            .map(|n| json!({"type": "dns", "value": n}))
            .collect();
        let r = c
            .signed(
                c.dir["newOrder"].as_str().unwrap(),
                Some(&json!({"identifiers": ids})),
            )
            .await?;
        if r.status != 201 {
            return Err(format!("newOrder: {} {}", r.status, r.json()));
        }
        Ok(r.headers
            .get("location")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned())
    })
    .await;

    let thumbprint = acme_proxy_protocol::Jwk::from_value(&client.key.jwk)
        .unwrap()
        .thumbprint_b64();
    step(server, client, "the challenges", async |c: &Client| {
        let order = c.get(&order_url).await?;
        for authz_url in order["authorizations"].as_array().unwrap() {
            let authz = c.get(authz_url.as_str().unwrap()).await?;
            let Some(ch) = authz["challenges"]
                .as_array()
                .unwrap()
                .iter()
                .find(|ch| ch["type"] == "http-01")
            else {
                return Err(format!("no http-01 challenge: {authz}"));
            };
            if authz["status"] == "pending" && ch["status"] == "pending" {
                let token = ch["token"].as_str().unwrap();
                responder.publish(token, &format!("{token}.{thumbprint}"));
                let r = c
                    .signed(ch["url"].as_str().unwrap(), Some(&json!({})))
                    .await?;
                if r.status != 200 {
                    return Err(format!("trigger: {} {}", r.status, r.json()));
                }
            }
        }
        Ok(())
    })
    .await;
    // Validations settle in the background.
    let order = order_once_past(server, client, &order_url, &["pending"], 30).await;
    assert_eq!(order["status"], "ready", "{order}");

    step(server, client, "finalize", async |c: &Client| {
        let order = c.get(&order_url).await?;
        if order["status"] == "ready" {
            let r = c
                .signed(
                    order["finalize"].as_str().unwrap(),
                    Some(&json!({"csr": b64(csr)})),
                )
                .await?;
            if r.status != 200 {
                return Err(format!("finalize: {} {}", r.status, r.json()));
            }
        }
        Ok(())
    })
    .await;
    // The relay settles (or retires) in the background; a finalize that
    // died while its signer worked is failed by its watch.
    order_once_past(server, client, &order_url, &["ready", "processing"], 60).await
}

fn events(got: &[harness::Received]) -> Vec<String> {
    got.iter()
        .filter_map(|r| {
            r.body
                .get("event")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

/// Who signs, and how names are proven.
enum Signer {
    Embedded,
    /// The embedded CA, with http-01 validated for real.
    Validated,
    /// Pebble through the relay; `refuse`: a proxy answers the upstream
    /// finalize 403, and the relay is retired.
    Relay {
        refuse: bool,
    },
    /// A custom program signing with openssl, which takes its time: the
    /// order is processing while it runs.
    Custom,
}

/// The flow with the embedded CA.
async fn converges_after_a_crash_at(point: &str) {
    converges(point, Signer::Embedded).await;
}

/// The whole flow with the server armed at `point`, then the checks.
async fn converges(point: &str, signer: Signer) {
    let receiver = Receiver::start().await;
    let pki = TestPki::new();
    let embedded = matches!(signer, Signer::Embedded | Signer::Validated);
    // A crash between the order's step to processing and the outcome's:
    // the finalize dies while the program signs.
    let died_signing =
        matches!(signer, Signer::Custom) && ["finalize.began", "finalize.signed"].contains(&point);
    let responder = Responder::start().await;
    let mut _dns = None;
    let mut legacy = None;
    let (_pebble, _proxy, profile, refused) = match signer {
        Signer::Embedded => (
            None,
            None,
            "[profiles.default]\nbypass = true\n".to_owned(),
            false,
        ),
        Signer::Validated => {
            let Some(dns) = Dns::start() else { return };
            let profile = format!(
                "[validation]\nhttp_port = {}\ntimeout = \"5s\"\n{}\ndns_resolvers = [\"{}\"]\n[profiles.default]\n",
                responder.port,
                harness::allow_networks_line(),
                dns.addr
            );
            _dns = Some(dns);
            (None, None, profile, false)
        }
        Signer::Custom => {
            let Some(pki) = LegacyPki::new() else { return };
            // A short time limit: the watch calls a finalize dead 12 s
            // (2 s and 10 s more) after it began.
            let profile = pki
                .profile("2s")
                .replace("[profiles.legacy", "[profiles.default");
            legacy = Some(pki);
            (None, None, profile, false)
        }
        Signer::Relay { refuse } => {
            let Some(pebble) = Pebble::start(&pki, always_valid()) else {
                return;
            };
            let proxy = FaultProxy::start(&pki, pebble.addr);
            if refuse {
                proxy.set_always(Match::PathContains(FINALIZE), Some(Fault::Forbidden403));
            }
            let profile = bypass_profile(&proxy.directory_url(), &pki, "");
            (Some(pebble), Some(proxy), profile, refuse)
        }
    };
    let mut server = Server::new(&receiver, &profile).await;
    let url = server.start(Some(point));
    // A job's crash point may end the server at once.
    let dir = loop {
        match try_request("GET", &url, None).await {
            Ok(r) => break r.json(),
            Err(e) => assert!(server.restarted_after_crash(), "the directory: {e}"),
        }
    };
    let mut client = Client {
        key: Key::p256(),
        account: None,
        dir,
    };

    let account = step(&mut server, &client, "newAccount", async |c: &Client| {
        let url = c.dir["newAccount"].as_str().unwrap();
        let r = c
            .signed(url, Some(&json!({"termsOfServiceAgreed": true})))
            .await?;
        match r.status {
            200 | 201 => Ok(r
                .headers
                .get("location")
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned()),
            s => Err(format!("newAccount: {s}")),
        }
    })
    .await;
    client.account = Some(account);

    let names = ["one.example.test", "two.example.test"];
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(names.map(str::to_owned).to_vec()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params.serialize_request(&key).unwrap().der().to_vec();
    let mut order = issue(&mut server, &client, &names, &csr, &responder).await;
    if died_signing {
        // The finalize the crash cut off never recorded its outcome: once
        // the signer's time limit is well past, the watch has made the
        // order invalid, and the client starts anew, as it is told.
        assert_eq!(order["status"], "invalid", "{order}");
        assert_eq!(
            order["error"]["type"], "urn:ietf:params:acme:error:serverInternal",
            "{order}"
        );
        order = issue(&mut server, &client, &names, &csr, &responder).await;
    }
    if refused {
        assert_eq!(order["status"], "invalid", "{order}");
        let wanted = ["account.created", "relay.abandoned"];
        settled(&mut server, &receiver, point, &wanted).await;
        let conn = stop_and_open(&mut server);
        let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(count("SELECT count(*) FROM certificates"), 0);
        assert_eq!(
            count("SELECT count(*) FROM orders WHERE status = 'processing'"),
            0
        );
        assert_eq!(
            count("SELECT count(*) FROM upstream_orders WHERE status = 'invalid'"),
            1,
            "the relay retired once"
        );
        return;
    }
    assert_eq!(order["status"], "valid", "{order}");
    let cert_url = order["certificate"].as_str().unwrap().to_owned();

    let leaf = step(
        &mut server,
        &client,
        "the certificate",
        async |c: &Client| {
            let r = c.signed(&cert_url, None).await?;
            let chain = String::from_utf8_lossy(&r.body).into_owned();
            let pem = ::pem::parse_many(&chain).map_err(|e| e.to_string())?;
            pem.first()
                .map(|p| p.contents().to_vec())
                .ok_or_else(|| format!("no certificate: {chain}"))
        },
    )
    .await;

    step(&mut server, &client, "revokeCert", async |c: &Client| {
        let r = c
            .signed(
                c.dir["revokeCert"].as_str().unwrap(),
                Some(&json!({"certificate": b64(&leaf), "reason": 4})),
            )
            .await?;
        let already = r.json()["type"] == "urn:ietf:params:acme:error:alreadyRevoked";
        if r.status == 200 || already {
            Ok(())
        } else {
            Err(format!("revokeCert: {} {}", r.status, r.json()))
        }
    })
    .await;

    // The embedded CA's CRL lists it (a relayed certificate is on the
    // upstream CA's, a custom signer's on its own).
    if embedded {
        let (_, x509) = x509_parser::parse_x509_certificate(&leaf).unwrap();
        let serial = x509.raw_serial().to_vec();
        let crl_url = format!("{}/crl", url.trim_end_matches("/directory"));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let listed = match try_request("GET", &crl_url, None).await {
                Ok(r) if r.status == 200 => x509_parser::parse_x509_crl(&r.body)
                    .map(|(_, crl)| {
                        crl.iter_revoked_certificates()
                            .any(|e| e.raw_serial() == serial)
                    })
                    .unwrap_or(false),
                _ => {
                    server.restarted_after_crash();
                    false
                }
            };
            if listed {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the CRL never listed the revoked certificate"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let wanted = [
        "account.created",
        "certificate.issued",
        "certificate.revoked",
    ];
    settled(&mut server, &receiver, point, &wanted).await;
    let conn = stop_and_open(&mut server);
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM certificates"),
        1,
        "one certificate issued"
    );
    assert_eq!(
        count("SELECT count(*) FROM certificates WHERE revoked_at IS NOT NULL"),
        1
    );
    assert_eq!(
        count("SELECT count(*) FROM orders WHERE status = 'processing'"),
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM orders WHERE status = 'valid'"),
        1,
        "the order that was finalized is valid"
    );
    assert_eq!(
        count("SELECT count(*) FROM orders WHERE status = 'invalid'"),
        i64::from(died_signing),
        "only the order whose finalize died is invalid"
    );
    assert_eq!(
        count(
            "SELECT count(*) FROM audit_log WHERE event = 'certificate.issue_failed' AND actor = 'system'"
        ),
        i64::from(died_signing),
        "the watch's failing of the order is audited"
    );
    if let Some(pki) = legacy {
        // The program signed once per finalize that reached it: twice when
        // the crash came after it signed (that certificate never left the
        // server, and the order was failed, not completed with it).
        let runs = std::fs::read_to_string(pki.path("runs")).unwrap_or_default();
        let signed_twice = point == "finalize.signed";
        assert_eq!(
            runs.lines().count(),
            1 + usize::from(signed_twice),
            "{runs}"
        );
        let revoked = std::fs::read_to_string(pki.path("revoked")).unwrap_or_default();
        assert_eq!(
            revoked.lines().count(),
            1,
            "revoked through the program once"
        );
    }
}

/// Waits for every `wanted` notification and for the crash, checks that
/// the point was reached once and that each notification came at least
/// once and at most twice, and waits until every delivery job is done.
async fn settled(server: &mut Server, receiver: &Receiver, point: &str, wanted: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !wanted
        .iter()
        .all(|w| events(&receiver.received()).iter().any(|e| e == w))
    {
        server.restarted_after_crash();
        assert!(
            Instant::now() < deadline,
            "notifications missing: got {:?}",
            events(&receiver.received())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The crash point was reached, once (every later start was unarmed).
    // A job's point may be reached only after the client is done.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.crashes == 0 && Instant::now() < deadline {
        server.restarted_after_crash();
    }
    assert_eq!(server.crashes, 1, "{point} was not reached by the flow");

    let db = server.work().join("data").join("acme-proxy.db");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let open: i64 = rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM jobs WHERE kind = 'notify_delivery' AND status <> 'done'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if open == 0 {
            break;
        }
        server.restarted_after_crash();
        assert!(Instant::now() < deadline, "{open} deliveries not done");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // At least once, and at most twice: a crash sends again what it caught
    // between a receiver's answer and the delivery's settlement (any
    // delivery in flight, whatever the point).
    let got = events(&receiver.received());
    let times = |w: &str| got.iter().filter(|e| *e == w).count();
    for w in wanted {
        assert!(
            (1..=2).contains(&times(w)),
            "{w} delivered {} times after a crash at {point}: {got:?}",
            times(w)
        );
    }
    if point == "notify.delivered" {
        assert!(
            wanted.iter().any(|w| times(w) == 2),
            "the delivery the crash cut off was not sent again: {got:?}"
        );
    }
}

/// Stops the server and opens its database.
fn stop_and_open(server: &mut Server) -> rusqlite::Connection {
    if let Some(mut c) = server.child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
    rusqlite::Connection::open(server.work().join("data").join("acme-proxy.db")).unwrap()
}

#[test]
fn every_crash_point_has_its_test_below() {
    assert_eq!(
        acme_proxy::CRASH_POINTS,
        [
            "order.created",
            "challenge.bypassed",
            "challenge.started",
            "challenge.settled",
            "finalize.began",
            "finalize.signed",
            "finalize.completed",
            "revocation.stored",
            "crl.number_reserved",
            "job.claimed",
            "job.ran",
            "job.settled",
            "notify.delivered",
            "relay.settled",
            "relay.abandoned",
            "relay.moved",
        ]
    );
}

/// The `relay.moved` row: two upstreams, A down after it took an order
/// and before its finalize; the server dies right after moving the order
/// off A. Restarted, it places the order at B: one upstream finalize in
/// all, the move audited once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_an_order_moves_upstream_leaves_one_upstream_finalize() {
    use crate::relay::{NEW_ORDER, a_then_b, all_valid, ready_order, relay_issue, two_pebbles};
    let pki = TestPki::new();
    let Some((_pebbles, a, b)) = two_pebbles(&pki) else {
        return;
    };
    let profile = a_then_b(
        &pki,
        &a,
        "breaker_failures = 2\nbreaker_open_for = \"1s\"\nfailover_after = \"2s\"",
        &b,
    );
    let receiver = Receiver::start().await;
    let mut server = Server::new(&receiver, &profile).await;
    let url = server.start(Some("relay.moved"));
    let account = crate::client::account(&url).await;
    // A up: the relay reads its directory once.
    relay_issue(&account, &["first.example.test"], Duration::from_secs(30))
        .await
        .chain();
    // A takes the next order, then is down before its finalize.
    a.set_always(Match::PathContains("/dir"), Some(Fault::Html502));
    a.set_always(Match::PathContains("my-order"), Some(Fault::Html502));
    let mut order = ready_order(&account, &["moved.example.test"]).await;
    order.finalize().await.expect("finalize");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.reap_crash() {
        assert!(
            Instant::now() < deadline,
            "no crash at the move; logs in {}",
            server.work().display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.crashes, 1);
    server.start(None);
    all_valid(
        &account,
        vec![order.url().to_owned()],
        Instant::now() + Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        (a.count(NEW_ORDER), a.count(FINALIZE)),
        (2, 1),
        "made at A, never finalized there: {:?}",
        a.requests()
    );
    assert_eq!(
        (b.count(NEW_ORDER), b.count(FINALIZE)),
        (1, 1),
        "{:?}",
        b.requests()
    );
    let db = stop_and_open(&mut server);
    let id = order.url().rsplit('/').next().unwrap().to_owned();
    let (upstream, moved_from): (String, String) = db
        .query_row(
            "SELECT upstream, moved_from FROM upstream_orders WHERE order_id = ?1",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((upstream.as_str(), moved_from.as_str()), ("b", "a"));
    let moves: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM audit_log WHERE event = 'order.upstream_moved' AND order_id = ?1",
            [&id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(moves, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_an_order_is_created_converges() {
    converges_after_a_crash_at("order.created").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_challenge_is_made_valid_converges() {
    converges_after_a_crash_at("challenge.bypassed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_the_certificate_is_stored_converges_with_one_certificate() {
    converges_after_a_crash_at("finalize.completed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_revocation_is_stored_converges_with_the_crl_listing_it() {
    converges_after_a_crash_at("revocation.stored").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_taking_a_crl_number_and_storing_the_crl_converges() {
    converges_after_a_crash_at("crl.number_reserved").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_job_claim_converges() {
    converges_after_a_crash_at("job.claimed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_a_jobs_attempt_and_its_settlement_converges() {
    converges_after_a_crash_at("job.ran").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_job_is_settled_converges() {
    converges_after_a_crash_at("job.settled").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_a_webhooks_answer_and_the_delivery_settling_sends_it_at_most_twice() {
    converges_after_a_crash_at("notify.delivered").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_relayed_certificate_is_stored_converges_with_one_certificate() {
    converges("relay.settled", Signer::Relay { refuse: false }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_refused_relay_is_retired_converges_with_the_order_invalid() {
    converges("relay.abandoned", Signer::Relay { refuse: true }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_challenge_is_triggered_converges() {
    converges("challenge.started", Signer::Validated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_validation_is_recorded_converges() {
    converges("challenge.settled", Signer::Validated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_a_custom_program_signs_leaves_the_order_invalid_once_its_limit_is_past() {
    converges("finalize.began", Signer::Custom).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_custom_program_signed_leaves_the_order_invalid_once_its_limit_is_past() {
    converges("finalize.signed", Signer::Custom).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_custom_programs_certificate_is_stored_converges_with_one_certificate()
 {
    converges("finalize.completed", Signer::Custom).await;
}
