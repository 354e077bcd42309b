//! The job queue across process boundaries: a validation in flight when
//! the process is SIGKILLed resumes within seconds of the restart (the
//! short lease, not the minutes-long budget, bounds the wait); work whose
//! job row was lost is re-queued by `recover` without duplicates; and the
//! operator commands work against a real database file, including the
//! cancellation of a running job.

use std::process::Command;
use std::time::{Duration, Instant};

use acme_proxy::authority::VALIDATION_KIND;
use acme_proxy_protocol::Jwk;
use serde_json::{Value, json};

use crate::harness::{ChildGuard, Dns, Responder, TestServer, binary, own_addr, spawn_binary};
use crate::raw::{self, Acct, Key};

/// A pending challenge for `name`: (challenge URL, order URL), published on
/// the responder with the right key authorization.
pub(crate) async fn pending_challenge(
    dir: &Value,
    acct: &Acct,
    responder: &Responder,
    name: &str,
) -> (String, String) {
    let r = acct
        .post(
            dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let order_url = r.location().unwrap();
    let authz = acct
        .post(dir, r.json()["authorizations"][0].as_str().unwrap(), None)
        .await
        .json();
    let ch = &authz["challenges"][0];
    let token = ch["token"].as_str().unwrap();
    let thumb = Jwk::from_value(&acct.key.jwk).unwrap().thumbprint_b64();
    responder.publish(token, &format!("{token}.{thumb}"));
    (ch["url"].as_str().unwrap().to_owned(), order_url)
}

async fn wait_for_challenge(
    dir: &Value,
    acct: &Acct,
    url: &str,
    want: &str,
    within: Duration,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let c = acct.post(dir, url, None).await.json();
        if c["status"] == want {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "challenge still {} after {within:?}: {c}",
            c["status"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn config_file(
    dir: &std::path::Path,
    listen: std::net::SocketAddr,
    http_port: u16,
    dns: &Dns,
    lease: &str,
) -> std::path::PathBuf {
    let file = dir.join("acme-proxy.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"{listen}\"\ndata_dir = \"{}\"\n[validation]\nhttp_port = {http_port}\nallow_networks = [\"127.0.0.1\"]\ndns_resolvers = [\"{}\"]\n# Minutes: the attempt budget must not be what bounds recovery.\ntimeout = \"5m\"\n[jobs]\nlease = \"{lease}\"\npoll_interval = \"200ms\"\n[profiles.default]\n",
            dir.join("data").display(),
            dns.addr
        ),
    )
    .unwrap();
    file
}

fn cli(config: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(binary())
        .args(["--config", config.to_str().unwrap(), "job"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_in_flight_when_the_process_is_sigkilled_resumes_within_seconds_of_the_restart()
 {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let work = crate::harness::tempdir();
    // One address for both starts: the client's URLs must stay valid.
    let config = config_file(work.path(), own_addr(), responder.port, &dns, "2s");
    let (mut first, directory) = spawn_binary(
        work.path(),
        &["serve", "--config", config.to_str().unwrap()],
        &[],
    );

    let dir = raw::directory(&directory).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let (chall, _) = pending_challenge(&dir, &acct, &responder, "killed.example.test").await;
    responder.hang_next(1);
    let r = acct.post(&dir, &chall, Some(&json!({}))).await;
    assert_eq!(r.json()["status"], "processing");
    let deadline = Instant::now() + Duration::from_secs(10);
    while responder.hits() == 0 {
        assert!(
            Instant::now() < deadline,
            "the validation never reached the responder"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Mid-validation: the responder holds the connection; kill -9.
    Command::new("kill")
        .args(["-KILL", &first.0.id().to_string()])
        .status()
        .unwrap();
    first.0.wait().unwrap();
    drop(first);

    let restarted_at = Instant::now();
    let (_second, directory2) = spawn_binary(
        work.path(),
        &["serve", "--config", config.to_str().unwrap()],
        &[],
    );
    assert_eq!(directory, directory2);
    wait_for_challenge(&dir, &acct, &chall, "valid", Duration::from_secs(20)).await;
    let waited = restarted_at.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "resumed after {waited:?}; the lease is 2s, the budget minutes"
    );
    assert!(responder.hits() >= 2, "validated again after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_requeues_a_processing_challenge_whose_job_was_lost_without_duplicates() {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let server = TestServer::start(responder.port, Some(&dns), "").await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let (chall, order_url) = pending_challenge(&dir, &acct, &responder, "lost.example.test").await;
    let id = chall.rsplit('/').next().unwrap().to_owned();
    let authority = &server.running().authority();
    // The state change without its job, as if the process died between them.
    assert!(
        authority
            .store()
            .start_challenge(&id, authority.clock.unix())
            .await
            .unwrap()
    );
    assert!(
        authority
            .store()
            .live_job(VALIDATION_KIND, &id)
            .await
            .unwrap()
            .is_none()
    );

    server.running().runner.recover().await.unwrap();
    server.running().runner.recover().await.unwrap();
    let jobs: Vec<_> = authority
        .store()
        .list_jobs(Some(VALIDATION_KIND), None, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|j| j.key == id)
        .collect();
    assert_eq!(jobs.len(), 1, "recover twice queues once");
    wait_for_challenge(&dir, &acct, &chall, "valid", Duration::from_secs(10)).await;
    assert_eq!(
        acct.post(&dir, &order_url, None).await.json()["status"],
        "ready"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_show_retry_and_cancel_jobs_and_a_running_job_is_cancelled() {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let work = crate::harness::tempdir();
    let any_port = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let config = config_file(work.path(), any_port, responder.port, &dns, "1s");
    let (server, directory): (ChildGuard, String) = spawn_binary(
        work.path(),
        &["serve", "--config", config.to_str().unwrap()],
        &[],
    );
    let dir = raw::directory(&directory).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let (chall, order_url) =
        pending_challenge(&dir, &acct, &responder, "cancel.example.test").await;
    responder.hang_next(1);
    acct.post(&dir, &chall, Some(&json!({}))).await;

    // The validation job is running (the responder holds it).
    let deadline = Instant::now() + Duration::from_secs(10);
    let job = loop {
        let (code, out, err) = cli(&config, &["list", "--kind", VALIDATION_KIND, "--json"]);
        assert_eq!(code, 0, "{err}");
        let jobs: Vec<Value> = serde_json::from_str(&out).unwrap();
        if let Some(j) = jobs.into_iter().find(|j| j["status"] == "running") {
            break j;
        }
        assert!(Instant::now() < deadline, "no running validation job");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let id = job["id"].as_i64().unwrap().to_string();

    // The table form and show work too.
    let (code, table, _) = cli(&config, &["list"]);
    assert_eq!(code, 0);
    for kind in [
        VALIDATION_KIND,
        "nonce_sweep",
        "crl_refresh",
        "job_retention",
    ] {
        assert!(table.contains(kind), "{kind} listed:\n{table}");
    }
    let (code, shown, _) = cli(&config, &["show", &id, "--json"]);
    assert_eq!(code, 0);
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(
        shown["payload"]["challenge"],
        chall.rsplit('/').next().unwrap()
    );

    let (code, out, err) = cli(&config, &["cancel", &id, "--actor", "operator:test"]);
    assert_eq!(code, 0, "{out}{err}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let cancelled = loop {
        let (_, out, _) = cli(&config, &["show", &id, "--json"]);
        let j: Value = serde_json::from_str(&out).unwrap();
        if j["status"] == "cancelled" {
            break j;
        }
        assert!(
            Instant::now() < deadline,
            "the running job was not cancelled: {j}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        cancelled["last_error"]
            .as_str()
            .unwrap()
            .contains("cancelled by operator:test"),
        "{cancelled}"
    );
    // Its abandon ran: the challenge and order are invalid, not stuck.
    let c = acct.post(&dir, &chall, None).await.json();
    assert_eq!(c["status"], "invalid");
    assert_eq!(
        c["error"]["type"],
        "urn:ietf:params:acme:error:serverInternal"
    );
    assert_eq!(
        acct.post(&dir, &order_url, None).await.json()["status"],
        "invalid"
    );

    // Cancelling a finished job is refused; retry queues it again.
    let (code, _, err) = cli(&config, &["cancel", &id]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot be cancelled"), "{err}");
    let (code, out, err) = cli(&config, &["retry", &id]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("queued") || out.contains("running") || out.contains("done"),
        "{out}"
    );
    let (code, _, err) = cli(&config, &["show", "999999"]);
    assert_ne!(code, 0);
    assert!(err.contains("no job with id 999999"), "{err}");
    drop(server);
}
