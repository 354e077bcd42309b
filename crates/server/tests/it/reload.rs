//! Reloading the configuration: SIGHUP to the binary while lego issues in a
//! loop, and `Running::reload` in process for what only a restart applies.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use acme_proxy::config::Config;
use acme_proxy_store::{AuditFilter, Store, StoreOptions};
use serde_json::json;

use crate::clients::{self, Ran};
use crate::harness::{self, Dns, TestServer};
use crate::raw::{self, Acct, Key};

/// Waits until lego has finished one more run than `seen` (so that the
/// reloads fall across several runs); returns the new count.
async fn next_lego_run(finished: &AtomicUsize, seen: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = finished.load(Ordering::SeqCst);
        if now > seen {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "lego finished no run within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends SIGHUP to `pid` and waits until the log at `log` holds `count`
/// lines containing `what` (the reload is applied or refused then).
pub(crate) fn hangup_and_wait(pid: u32, log: &Path, what: &str, count: usize) {
    Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill -HUP");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(what).count() >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {count} lines with {what:?} within 20 s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_while_lego_issues_adds_removes_and_restores_a_profile_and_refuses_a_broken_file() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    assert!(harness::require_program("lego"));
    let at = harness::own_addr();
    let home = harness::tempdir();
    let data = home.path().join("data");
    let base = TestServer::config_text(&data, at.port(), Some(&dns), "").replacen(
        "timeout = \"5s\"",
        "timeout = \"10s\"",
        1,
    );
    let with_extra = format!("{base}\n[profiles.extra]\nbypass = true\n");
    let config = home.path().join("acme-proxy.toml");
    std::fs::write(&config, &base).expect("config");
    let (mut server, directory) = harness::spawn_binary(
        home.path(),
        &["serve", "--config", config.to_str().expect("utf-8")],
        &[],
    );
    let pid = server.0.id();
    let log = home.path().join("acme-proxy.log");
    let server_base = directory
        .strip_suffix("/profile/default/directory")
        .expect("a directory URL")
        .to_owned();
    let extra_directory = format!("{server_base}/profile/extra/directory");

    // lego issues, one run after another, for as long as the reloads go on.
    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicUsize::new(0));
    let lego = tokio::spawn({
        let stop = Arc::clone(&stop);
        let finished = Arc::clone(&finished);
        let directory = directory.clone();
        async move {
            let state = harness::tempdir();
            let mut runs: Vec<Ran> = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let name = format!("reload{i}.example.test");
                let args = clients::lego_http_run(&directory, state.path(), at, &name);
                runs.push(clients::run("lego", args, state.path().to_path_buf()).await);
                finished.fetch_add(1, Ordering::SeqCst);
            }
            runs
        }
    });

    // 1. A profile added by reload answers at once.
    let seen = next_lego_run(&finished, 0).await;
    std::fs::write(&config, &with_extra).expect("config");
    hangup_and_wait(pid, &log, "configuration reloaded", 1);
    let r = raw::request("GET", &extra_directory, None, vec![]).await;
    assert_eq!(r.status, 200, "the added profile");
    let extra = raw::directory(&extra_directory).await;
    let acct = Acct::create(&extra, Key::p256()).await;
    let new_order = extra["newOrder"].as_str().expect("newOrder").to_owned();
    let made = acct
        .post(
            &extra,
            &new_order,
            Some(&json!({"identifiers": [{"type": "dns", "value": "kept.example.test"}]})),
        )
        .await;
    assert_eq!(made.status, 201, "{:?}", made.json());
    let order_url = made.location().expect("order URL");

    // 2. Removed: 404, its stored order kept.
    let seen = next_lego_run(&finished, seen).await;
    std::fs::write(&config, &base).expect("config");
    hangup_and_wait(pid, &log, "configuration reloaded", 2);
    let r = raw::request("GET", &extra_directory, None, vec![]).await;
    assert_eq!(r.status, 404, "the removed profile");
    let r = raw::request(
        "GET",
        &format!("{server_base}/profile/extra/new-nonce"),
        None,
        vec![],
    )
    .await;
    assert_eq!(r.status, 404, "the removed profile's endpoints");

    // 3. Added back: the same account and order.
    let seen = next_lego_run(&finished, seen).await;
    std::fs::write(&config, &with_extra).expect("config");
    hangup_and_wait(pid, &log, "configuration reloaded", 3);
    let order = acct.post(&extra, &order_url, None).await;
    assert_eq!(order.status, 200, "{:?}", order.json());
    assert_eq!(
        order.json()["identifiers"][0]["value"],
        "kept.example.test",
        "the order stored before the profile was removed"
    );

    // 4. A broken file is refused; the previous configuration serves on.
    next_lego_run(&finished, seen).await;
    std::fs::write(&config, "[profiles.default\nbypass = ").expect("config");
    hangup_and_wait(pid, &log, "configuration not reloaded", 1);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let refusal = text
        .lines()
        .find(|l| l.contains("configuration not reloaded"))
        .expect("the refusal line");
    assert!(refusal.contains("does not load"), "the reason: {refusal}");
    assert_eq!(
        raw::request("GET", &extra_directory, None, vec![])
            .await
            .status,
        200,
        "the previous configuration still serves"
    );

    stop.store(true, Ordering::SeqCst);
    let runs = lego.await.expect("lego loop");
    for ran in &runs {
        assert!(
            ran.success(),
            "a lego run failed during the reloads\n{}",
            ran.report()
        );
    }
    eprintln!(
        "{} lego issuances across four reloads, none failed",
        runs.len()
    );
    assert!(
        server.0.try_wait().expect("status").is_none(),
        "still running"
    );
    drop(server);

    // Every reload is in the audit trail, the refusal with its reason.
    let url = Config::from_toml(&base).expect("the config").database_url();
    let store = Store::open(&url, &StoreOptions::default())
        .await
        .expect("open");
    let rows = store
        .audit_list(
            &AuditFilter {
                event: Some(acme_proxy_store::AuditEvent::ConfigReload),
                ..AuditFilter::default()
            },
            10,
        )
        .await
        .expect("audit rows");
    let outcomes: Vec<&str> = rows.iter().map(|r| r.outcome.as_str()).collect();
    assert_eq!(
        outcomes,
        ["refused", "success", "success", "success"],
        "newest first"
    );
    assert!(
        rows[0]
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("does not load"),
        "{:?}",
        rows[0].detail
    );
    assert_eq!(rows[0].actor, "system:reload");
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_job_tuning_and_refuses_what_only_a_restart_applies() {
    let dir = harness::tempdir();
    let toml = TestServer::config_text(dir.path(), 1, None, "");
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let running = server.running();
    assert_eq!(running.generations.current().number, 1);

    let tuned = format!("{toml}\n[jobs]\nlease = \"7s\"\nbackoff_cap = \"9s\"\n");
    let number = running
        .reload(Config::from_toml(&tuned).expect("config"))
        .await
        .expect("reloaded");
    assert_eq!(number, 2);
    let queue = running.runner.queue();
    assert_eq!(queue.config().lease, Duration::from_secs(7));
    assert_eq!(queue.config().backoff_cap, Duration::from_secs(9));

    let moved = tuned.replacen("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\"", 1);
    let refused = running
        .reload(Config::from_toml(&moved).expect("config"))
        .await
        .expect_err("a new listen address needs a restart");
    let reason = refused.0.join("\n");
    assert!(
        reason.contains("listen changed") && reason.contains("restart"),
        "{reason}"
    );
    assert_eq!(
        running.generations.current().number,
        2,
        "generation 2 serves on"
    );
    assert_eq!(queue.config().lease, Duration::from_secs(7));
    // The proxies trusted for the client's address: the listeners' limits
    // exempt them, and those are made at start-up.
    let proxied = tuned.replacen(
        "listen = \"127.0.0.1:0\"",
        "listen = \"127.0.0.1:0\"\ntrusted_proxies = [\"10.9.0.0/16\"]",
        1,
    );
    let refused = running
        .reload(Config::from_toml(&proxied).expect("config"))
        .await
        .expect_err("new trusted proxies need a restart");
    assert!(
        refused.0.join("\n").contains("trusted_proxies changed"),
        "{refused:?}"
    );

    // A signer that does not build refuses the whole file.
    let broken = format!(
        "{tuned}\n[profiles.custom]\n[profiles.custom.signer]\ntype = \"custom\"\ncommand = \"/nonexistent/signer\"\nca_cert = \"/nonexistent/ca.pem\"\n"
    );
    let refused = running
        .reload(Config::from_toml(&broken).expect("config"))
        .await
        .expect_err("a custom signer without its files");
    assert!(refused.0.join("\n").contains("custom"), "{refused:?}");
    assert!(running.generations.authority().profile("custom").is_none());
    server.stop().await;
}

/// A new order of `acct` for `name`: its URL, its authorization's URL
/// and the authorization as first read.
async fn order_one(
    acct: &Acct,
    dir: &serde_json::Value,
    name: &str,
) -> (String, String, serde_json::Value) {
    let r = acct
        .post(
            dir,
            dir["newOrder"].as_str().expect("newOrder"),
            Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let order_url = r.location().expect("order URL");
    let authz_url = r.json()["authorizations"][0]
        .as_str()
        .expect("authorization")
        .to_owned();
    let authz = acct.post(dir, &authz_url, None).await.json();
    (order_url, authz_url, authz)
}

/// An order of the web profile (served by `toml`) whose challenge was
/// triggered and whose process stopped before validating it: processing,
/// with no job. Returns the client, its directory, the order's URL and the
/// challenge's id.
async fn processing_without_a_job(toml: &str) -> (Acct, serde_json::Value, String, String) {
    let server = TestServer::start_in(harness::tempdir(), toml).await;
    let dir = raw::directory(&server.directory("web")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let (order_url, _, authz) = order_one(&acct, &dir, "held.example.test").await;
    let challenge_url = authz["challenges"][0]["url"]
        .as_str()
        .expect("challenge")
        .to_owned();
    let challenge_id = challenge_url.rsplit('/').next().expect("id").to_owned();
    let store = server.running().authority().store().clone();
    let now = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .expect("clock")
        .as_secs() as i64;
    assert!(
        store
            .start_challenge(&challenge_id, now)
            .await
            .expect("start")
    );
    server.stop().await;
    (acct, dir, order_url, challenge_id)
}

/// The validation job of `challenge_id` once it is queued, held for its
/// profile `web`; fails after 20 s.
async fn held_validation(store: &Store, challenge_id: &str) -> acme_proxy_store::JobRow {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let jobs = acme_proxy::admin::ops::list_jobs(store, Some("challenge_validation"), None, 10)
            .await
            .expect("jobs");
        if let Some(job) = jobs.into_iter().find(|j| j.key == challenge_id)
            && job.status.as_str() == "queued"
            && job
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("profile web is not mounted"))
        {
            return store.job(job.id).await.expect("read").expect("the job");
        }
        assert!(Instant::now() < deadline, "the validation was never held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Job `id` once its worker has recorded it done; fails after 10 s. A
/// validation settles its challenge (and so its order) before the worker
/// records the job finished, so a client can see the order ready first.
async fn job_done(store: &Store, id: i64) -> acme_proxy_store::JobRow {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let job = store.job(id).await.expect("read").expect("the job");
        if job.status.as_str() == "done" {
            return job;
        }
        assert!(Instant::now() < deadline, "never recorded done: {job:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A profile taken out (by a reload or a restart) keeps its orders for when
/// it comes back, and its relay jobs wait for it; a validation of one of
/// its challenges failed instead, leaving the client's order invalid when
/// the profile returned. It waits too now, its attempts unspent, and
/// completes once the profile is mounted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_whose_profile_is_not_mounted_waits_and_completes_once_it_is() {
    const KIND: &str = "challenge_validation";
    let data = harness::tempdir();
    // One address for every start: the client's URLs stay valid.
    let listen = format!("listen = \"{}\"", harness::own_addr());
    let jobs = "[jobs]\nbackoff_base = \"100ms\"\nbackoff_cap = \"500ms\"\n";
    let toml = |profiles: &str| {
        TestServer::config_text(data.path(), 1, None, &format!("{profiles}{jobs}"))
            .replace("listen = \"127.0.0.1:0\"", &listen)
    };
    let web =
        |bypass: bool| format!("[profiles.web]\nchallenges = [\"http-01\"]\nbypass = {bypass}\n");

    let (acct, dir, order_url, challenge_id) = processing_without_a_job(&toml(&web(false))).await;

    // Restarted without it: recovery queues the validation, which waits
    // for its profile without spending attempts.
    let server = TestServer::start_in(harness::tempdir(), &toml("[profiles.default]\n")).await;
    let store = server.running().authority().store().clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut holds = Vec::new();
    let mut held = None;
    while holds.len() < 2 {
        let jobs = acme_proxy::admin::ops::list_jobs(&store, Some(KIND), None, 10)
            .await
            .expect("jobs");
        if let Some(job) = jobs.into_iter().find(|j| j.key == challenge_id)
            && job.status.as_str() == "queued"
            && job
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("profile web is not mounted"))
        {
            assert_eq!(
                job.attempts, 0,
                "a wait for the profile spent an attempt: {job:?}"
            );
            if holds.last() != Some(&job.run_at) {
                holds.push(job.run_at);
            }
            held = Some(job.id);
        }
        assert!(Instant::now() < deadline, "never held twice: {holds:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ch = store
        .challenge(&challenge_id)
        .await
        .expect("read")
        .expect("challenge");
    assert_eq!(ch.status.as_str(), "processing", "{ch:?}");
    server.stop().await;

    // Mounted again (validation bypassed now, so that no responder is
    // needed): the same validation completes and the order is ready.
    let server = TestServer::start_in(harness::tempdir(), &toml(&web(true))).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let order = acct.post(&dir, &order_url, None).await.json();
        match order["status"].as_str() {
            Some("ready") => break,
            Some("pending") => {}
            other => panic!("the order ended {other:?}: {order}"),
        }
        assert!(Instant::now() < deadline, "the held validation never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Completed by the job that was held, not a new one. The order is
    // ready once the challenge settles, a moment before the worker records
    // its job done: wait for that.
    let store = server.running().authority().store().clone();
    let held = held.expect("held job");
    let job = job_done(&store, held).await;
    let jobs = acme_proxy::admin::ops::list_jobs(&store, Some(KIND), None, 10)
        .await
        .expect("jobs");
    assert_eq!(job.key, challenge_id, "{jobs:?}");
    assert_eq!(
        jobs.iter().filter(|j| j.key == challenge_id).count(),
        1,
        "{jobs:?}"
    );
    server.stop().await;
}

/// A held job looks again every 30 s; a reload that mounts its profile
/// again makes it look at once, on the server that reloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_mounts_the_profile_again_runs_its_held_validation_at_once() {
    let data = harness::tempdir();
    let listen = format!("listen = \"{}\"", harness::own_addr());
    let toml = |profiles: &str| {
        TestServer::config_text(data.path(), 1, None, profiles)
            .replace("listen = \"127.0.0.1:0\"", &listen)
    };
    let web =
        |bypass: bool| format!("[profiles.web]\nchallenges = [\"http-01\"]\nbypass = {bypass}\n");
    let (acct, dir, order_url, challenge_id) = processing_without_a_job(&toml(&web(false))).await;

    // Started without the profile, the default job tuning: the recovered
    // validation is held until its next look, 30 s on.
    let server = TestServer::start_in(harness::tempdir(), &toml("[profiles.default]\n")).await;
    let running = server.running();
    let store = running.authority().store().clone();
    let held = held_validation(&store, &challenge_id).await;
    let now_ms = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .expect("clock")
        .as_millis() as i64;
    assert!(
        held.run_at - now_ms > 20_000,
        "held for its next look in half a minute: {held:?}"
    );

    // Mounted again by a reload (validation bypassed now): the order is
    // ready within a few seconds, long before that look.
    let started = Instant::now();
    running
        .reload(
            Config::from_toml(&toml(&format!("[profiles.default]\n{}", web(true))))
                .expect("config"),
        )
        .await
        .expect("reloaded");
    loop {
        let order = acct.post(&dir, &order_url, None).await.json();
        match order["status"].as_str() {
            Some("ready") => break,
            Some("pending") => {}
            other => panic!("the order ended {other:?}: {order}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the held validation waited for its next look"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    job_done(&store, held.id).await;
    server.stop().await;
}

/// A challenge type a reload takes out of a profile validates nothing
/// from then on, even for authorizations made while it was offered: a
/// response to it is refused, and the types still offered work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_challenge_type_a_reload_took_away_is_refused_and_the_others_still_validate() {
    let dir = harness::tempdir();
    let web = |types: &str| {
        TestServer::config_text(
            dir.path(),
            1,
            None,
            &format!("[profiles.web]\nchallenges = [{types}]\nbypass = true\n"),
        )
    };
    let server = TestServer::start_in(harness::tempdir(), &web("\"http-01\", \"dns-01\"")).await;
    let running = server.running();
    let directory = raw::directory(&server.directory("web")).await;
    let acct = Acct::create(&directory, Key::p256()).await;
    let (order_url, authz_url, authz) = order_one(&acct, &directory, "taken.example.test").await;
    let url_of = |kind: &str| {
        authz["challenges"]
            .as_array()
            .expect("challenges")
            .iter()
            .find(|c| c["type"] == kind)
            .and_then(|c| c["url"].as_str())
            .unwrap_or_else(|| panic!("no {kind} challenge: {authz}"))
            .to_owned()
    };

    running
        .reload(Config::from_toml(&web("\"dns-01\"")).expect("config"))
        .await
        .expect("reloaded");
    let refused = acct
        .post(&directory, &url_of("http-01"), Some(&json!({})))
        .await;
    let problem = refused.json();
    assert_eq!(
        (refused.status, problem["type"].as_str()),
        (400, Some("urn:ietf:params:acme:error:malformed")),
        "{problem}"
    );
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no longer validates http-01") && d.contains("dns-01")),
        "{problem}"
    );
    let authz_now = acct.post(&directory, &authz_url, None).await.json();
    assert_eq!(authz_now["status"], "pending", "{authz_now}");

    let answered = acct
        .post(&directory, &url_of("dns-01"), Some(&json!({})))
        .await;
    assert_eq!(answered.json()["status"], "valid", "{}", answered.json());
    let order = acct.post(&directory, &order_url, None).await.json();
    assert_eq!(order["status"], "ready", "{order}");
    server.stop().await;
}

/// A validation held while its profile was out, which comes back without
/// the challenge's type, settles invalid, saying why, rather than valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_validation_whose_type_the_returning_profile_no_longer_offers_settles_invalid() {
    let data = harness::tempdir();
    let listen = format!("listen = \"{}\"", harness::own_addr());
    let toml = |profiles: &str| {
        TestServer::config_text(data.path(), 1, None, profiles)
            .replace("listen = \"127.0.0.1:0\"", &listen)
    };
    let (acct, dir, order_url, challenge_id) = processing_without_a_job(&toml(
        "[profiles.web]\nchallenges = [\"http-01\"]\nbypass = false\n",
    ))
    .await;
    let server = TestServer::start_in(harness::tempdir(), &toml("[profiles.default]\n")).await;
    let running = server.running();
    let store = running.authority().store().clone();
    let held = held_validation(&store, &challenge_id).await;

    // Back with dns-01 only, validation bypassed: without the check the
    // held http-01 validation would be marked valid.
    running
        .reload(
            Config::from_toml(&toml(
                "[profiles.default]\n[profiles.web]\nchallenges = [\"dns-01\"]\nbypass = true\n\
                 [rate_limits]\nfailed_validations_per_account_and_name = \"1/1h\"\n",
            ))
            .expect("config"),
        )
        .await
        .expect("reloaded");
    let deadline = Instant::now() + Duration::from_secs(20);
    let order = loop {
        let order = acct.post(&dir, &order_url, None).await.json();
        if order["status"] != "pending" {
            break order;
        }
        assert!(Instant::now() < deadline, "the held validation never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(order["status"], "invalid", "{order}");
    let ch = store
        .challenge(&challenge_id)
        .await
        .expect("read")
        .expect("challenge");
    assert_eq!(ch.status.as_str(), "invalid", "{ch:?}");
    let error = format!("{:?}", ch.error);
    assert!(error.contains("no longer validates http-01"), "{error}");
    job_done(&store, held.id).await;
    // Not the client's failure: the name may be ordered again at once,
    // one failed validation an hour allowed.
    order_one(&acct, &dir, "held.example.test").await;
    server.stop().await;
}

/// The generation a reload replaced — its profiles and signers, a token's
/// session among them — is let go once nothing started on it runs, rather
/// than kept for the life of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_lets_the_generation_it_replaced_go() {
    let dir = harness::tempdir();
    let toml = TestServer::config_text(dir.path(), 1, None, "");
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let running = server.running();
    let first = Arc::downgrade(&running.authority());
    // Served by the first generation, on a connection the client keeps.
    let directory = raw::directory(&server.directory("default")).await;
    assert!(directory["newOrder"].is_string(), "{directory}");
    running
        .reload(Config::from_toml(&toml).expect("config"))
        .await
        .expect("reloaded");
    let deadline = Instant::now() + Duration::from_secs(10);
    while first.upgrade().is_some() {
        assert!(
            Instant::now() < deadline,
            "generation 1's authority is still held after the reload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The server goes on under the new one.
    let directory = raw::directory(&server.directory("default")).await;
    assert!(directory["newOrder"].is_string(), "{directory}");
    server.stop().await;
}

/// `max_in_flight` bounds the requests of every generation together: one
/// still running on the generation a reload replaced keeps its slot (the
/// bound does not double while it drains), and a new limit applies at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_running_across_a_reload_keeps_its_slot_and_the_new_limit_applies_at_once() {
    // The only slot is held by a finalize whose signer, an operator's
    // program, takes its time and then refuses.
    let files = harness::tempdir();
    let profile = crate::operations::slow_refusing_profile(files.path(), 15);
    let dir = harness::tempdir();
    let toml = |slots: usize| {
        format!(
            "max_in_flight = {slots}\n{}",
            TestServer::config_text(dir.path(), 1, None, &profile)
        )
    };
    let server = TestServer::start_in(harness::tempdir(), &toml(1)).await;
    let running = server.running();
    let slow = crate::operations::finalize_in_background(&server.directory("default")).await;
    // A malformed newOrder: 400 once admitted, 503 when shed.
    let new_order = format!("{}/profile/default/new-order", server.base());
    let ask = || async {
        raw::request(
            "POST",
            &new_order,
            Some("application/jose+json"),
            b"{}".to_vec(),
        )
        .await
        .status
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while ask().await != 503 {
        if slow.is_finished() {
            panic!(
                "the finalize was answered before it was seen holding the slot: {:?}",
                slow.await
                    .map(|r| (r.status, String::from_utf8_lossy(&r.body).into_owned()))
            );
        }
        assert!(
            Instant::now() < deadline,
            "the finalize never held the slot"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The same limit under a new generation: the slot is still taken.
    assert_eq!(
        running
            .reload(Config::from_toml(&toml(1)).expect("config"))
            .await
            .expect("reloaded"),
        2
    );
    assert_eq!(ask().await, 503, "generation 2 admitted past max_in_flight");
    // A higher limit admits at once; a lower one sheds at once.
    running
        .reload(Config::from_toml(&toml(2)).expect("config"))
        .await
        .expect("reloaded");
    assert_eq!(
        ask().await,
        400,
        "max_in_flight = 2 admits a second request"
    );
    running
        .reload(Config::from_toml(&toml(1)).expect("config"))
        .await
        .expect("reloaded");
    assert_eq!(ask().await, 503, "max_in_flight = 1 again");
    assert!(!slow.is_finished(), "the finalize held the slot throughout");
    // Its slot is given back when it is answered, on generation 1.
    assert_eq!(slow.await.unwrap().status, 500);
    assert_eq!(ask().await, 400);
    server.stop().await;
}
