//! Notifications: webhooks told of issuance, revocation and accounts with
//! templated bodies, delivered as durable jobs — a receiver that is down is
//! retried until it is back; one that refuses is audited, not retried.

use std::sync::Arc;
use std::time::Duration;

use acme_proxy::clock::SystemClock;
use acme_proxy::config::Config;

use crate::client;
use crate::harness::{self, Received, Receiver, Responder, TestServer};

/// Fast retries so that a receiver's outage is ridden out within a test.
const FAST_JOBS: &str =
    "[jobs]\nbackoff_base = \"100ms\"\nbackoff_cap = \"500ms\"\npoll_interval = \"50ms\"\n";

fn events(got: &[Received]) -> Vec<String> {
    got.iter()
        .filter_map(|r| {
            r.body
                .get("event")
                .and_then(|e| e.as_str())
                .map(str::to_owned)
        })
        .collect()
}

/// The newest delivery job once it is past `retiring`: its
/// `notification.failed` audit row is written while it retires, and it is
/// marked failed just after.
async fn newest_delivery_once_retired(
    store: &acme_proxy_store::Store,
) -> acme_proxy::admin::ops::JobView {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let jobs = acme_proxy::admin::ops::list_jobs(store, Some("notify_delivery"), None, 10)
            .await
            .expect("jobs");
        if jobs[0].status.as_str() != "retiring" {
            return jobs[0].clone();
        }
        assert!(std::time::Instant::now() < deadline, "{jobs:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until no delivery job is queued, running or retiring: every
/// notification so far was delivered or given up, so what the receivers
/// got is final.
/// The newest `notification.failed` audit row, once there is one (10 s
/// at most).
async fn first_notification_failed(store: &acme_proxy_store::Store) -> acme_proxy_store::AuditRow {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rows = store
            .audit_recent(Some("notification.failed"), 10)
            .await
            .expect("audit");
        if let Some(row) = rows.into_iter().next() {
            return row;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no notification.failed audit row within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn deliveries_settled(store: &acme_proxy_store::Store) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let jobs = acme_proxy::admin::ops::list_jobs(store, Some("notify_delivery"), None, 100)
            .await
            .expect("jobs");
        if jobs.iter().all(|j| {
            use acme_proxy_store::JobStatus::{Cancelled, Done, Failed};
            matches!(j.status, Done | Failed | Cancelled)
        }) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "deliveries still under way after 10s: {jobs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_told_of_accounts_issuance_and_revocation_with_templated_bodies() {
    let ops = Receiver::start().await;
    let chat = Receiver::start().await;
    let responder = Responder::start().await;
    let extra = format!(
        "{FAST_JOBS}\n[profiles.default]\nbypass = true\n\n[profiles.default.notify.webhooks.ops]\nurl = \"{}\"\nheaders = {{ Authorization = \"Bearer s3cret\" }}\n\n[profiles.default.notify.webhooks.chat]\nurl = \"{}\"\ntemplate = \"slack.json\"\nevents = [\"certificate.issued\"]\n",
        ops.url("/hook"),
        chat.url("/slack")
    );
    let server = TestServer::start(responder.port, None, &extra).await;
    let account = client::account(&server.directory("default")).await;
    let (chain, _) = client::issue(&account, &responder, &["notified.example.test"]).await;
    ops.wait_for(
        "account.created and certificate.issued",
        Duration::from_secs(10),
        |got| {
            let e = events(got);
            e.contains(&"account.created".to_owned())
                && e.contains(&"certificate.issued".to_owned())
        },
    )
    .await;
    chat.wait_for("the chat message", Duration::from_secs(10), |got| {
        !got.is_empty()
    })
    .await;

    let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).expect("PEM");
    let der = rustls::pki_types::CertificateDer::from(pem.contents.clone());
    account
        .revoke(&instant_acme::RevocationRequest {
            certificate: &der,
            reason: None,
        })
        .await
        .expect("revoke");
    ops.wait_for("certificate.revoked", Duration::from_secs(10), |got| {
        events(got).contains(&"certificate.revoked".to_owned())
    })
    .await;

    let got = ops.received();
    let issued = got
        .iter()
        .find(|r| r.body["event"] == "certificate.issued")
        .expect("issued");
    assert_eq!(issued.path, "/hook");
    assert_eq!(
        issued.headers.get("authorization").map(String::as_str),
        Some("Bearer s3cret")
    );
    assert_eq!(issued.body["identifiers"][0], "notified.example.test");
    assert!(issued.body["serial"].is_string() && issued.body["not_after"].is_string());
    // The chat webhook subscribed to issuance only, and got Slack's shape.
    deliveries_settled(server.running().authority().store()).await;
    let chat_got = chat.received();
    assert_eq!(chat_got.len(), 1, "{chat_got:#?}");
    let text = chat_got[0].body["text"]
        .as_str()
        .expect("a Slack text message");
    assert!(
        text.contains("certificate.issued") && text.contains("notified.example.test"),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_is_down_is_retried_and_gets_the_notification_once_it_is_back() {
    // The receiver's port, held (refusing connections) until it comes up.
    let socket = harness::reserve_port();
    let port = socket.local_addr().expect("addr").port();
    let extra = format!(
        "{FAST_JOBS}\n[profiles.default]\nbypass = true\n\n[profiles.default.notify.webhooks.ops]\nurl = \"http://127.0.0.1:{port}/hook\"\ntimeout = \"1s\"\n"
    );
    let server = TestServer::start(harness::free_port(), None, &extra).await;
    // Nothing listens yet: the account.created delivery keeps failing.
    client::account(&server.directory("default")).await;
    let store = server.running().authority().store().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let jobs = acme_proxy::admin::ops::list_jobs(&store, Some("notify_delivery"), None, 10)
            .await
            .expect("jobs");
        if jobs.first().is_some_and(|j| j.attempts >= 2) {
            // Attempts are counted when claimed, so the second attempt may
            // still be running; what matters is that it was not given up.
            assert!(
                matches!(jobs[0].status.as_str(), "queued" | "running"),
                "{:?}",
                jobs[0]
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no retry: {jobs:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The receiver comes back: the same notification arrives, once.
    let receiver = Receiver::start_reserved(socket);
    receiver
        .wait_for("account.created", Duration::from_secs(10), |got| {
            events(got) == ["account.created"]
        })
        .await;
    deliveries_settled(&store).await;
    assert_eq!(receiver.received().len(), 1);
    // Delivered: the job keeps no error of the attempts that failed.
    let jobs = acme_proxy::admin::ops::list_jobs(&store, Some("notify_delivery"), None, 10)
        .await
        .expect("jobs");
    assert!(
        jobs.len() == 1
            && jobs[0].status == acme_proxy_store::JobStatus::Done
            && jobs[0].last_error.is_none(),
        "{jobs:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_cancel_of_a_notification_is_audited_as_theirs_even_without_user_set() {
    // Nothing ever listens on the receiver's port: the delivery retries.
    let socket = harness::reserve_port();
    let port = socket.local_addr().expect("addr").port();
    let extra = format!(
        "{FAST_JOBS}\n[metrics]\nlisten = \"127.0.0.1:0\"\n[profiles.default]\nbypass = true\n\n[profiles.default.notify.webhooks.ops]\nurl = \"http://127.0.0.1:{port}/hook\"\ntimeout = \"1s\"\n"
    );
    let dir = harness::tempdir();
    let toml = TestServer::config_text(dir.path(), harness::free_port(), None, &extra);
    let (_etc, config) = harness::config_file(&toml);
    let server = TestServer::start_in(dir, &toml).await;
    client::account(&server.directory("default")).await;
    let store = server.running().authority().store().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let id = loop {
        let jobs = acme_proxy::admin::ops::list_jobs(&store, Some("notify_delivery"), None, 10)
            .await
            .expect("jobs");
        if let Some(job) = jobs.first().filter(|j| j.attempts >= 1) {
            break job.id.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no delivery: {jobs:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // The operator's login name as the system knows it, with $USER and
    // $LOGNAME unset (a cron job, a systemd unit).
    let whoami = std::process::Command::new("id")
        .arg("-un")
        .output()
        .expect("id -un");
    let name = String::from_utf8(whoami.stdout)
        .expect("utf-8")
        .trim()
        .to_owned();
    let out = std::process::Command::new(harness::binary())
        .args(["job", "cancel", &id, "--config"])
        .arg(&config)
        .env_remove("ACME_PROXY_CONFIG")
        .env_remove("USER")
        .env_remove("LOGNAME")
        .output()
        .expect("job cancel");
    assert!(out.status.success(), "{out:?}");

    let audited = first_notification_failed(&store).await;
    assert_eq!(audited.actor, format!("operator:{name}"), "{audited:?}");
    assert!(
        audited
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("cancelled"),
        "{audited:?}"
    );
    // The metrics count the cancel's record with the rest.
    let metrics_url = format!(
        "http://{}/metrics",
        server.running().metrics_addr.expect("a metrics listener")
    );
    let (_, _, body) = crate::flow::reqwest_get(&metrics_url).await;
    let (_, samples) = crate::metrics::parse(&String::from_utf8(body).expect("UTF-8"));
    let counted = crate::metrics::assert_audit_counters_match_the_table(&server, &samples).await;
    assert!(
        counted.keys().any(|k| k.contains("notification.failed")),
        "{counted:?}"
    );
    drop(socket);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_refuses_is_not_retried_and_the_lost_notification_is_audited() {
    let receiver = Receiver::start().await;
    receiver.answer(400);
    let extra = format!(
        "{FAST_JOBS}\n[profiles.default]\nbypass = true\n\n[profiles.default.notify.webhooks.ops]\nurl = \"{}\"\n",
        receiver.url("/hook")
    );
    let server = TestServer::start(harness::free_port(), None, &extra).await;
    client::account(&server.directory("default")).await;
    let store = server.running().authority().store().clone();
    let audited = first_notification_failed(&store).await;
    let detail = audited.detail.unwrap_or_default();
    assert!(
        detail.contains("account.created") && detail.contains("400"),
        "{detail}"
    );
    assert_eq!(receiver.received().len(), 1, "a 400 must not be retried");
    let job = newest_delivery_once_retired(&store).await;
    assert_eq!(job.status.as_str(), "failed");
    assert_eq!(job.attempts, 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_template_stops_start_up_with_its_name_and_line() {
    let dir = crate::harness::tempdir();
    let templates = dir.path().join("templates");
    std::fs::create_dir(&templates).expect("dir");
    std::fs::write(
        templates.join("teams.json"),
        "{\n  \"text\": \"{{ notice.event }\"\n}\n",
    )
    .expect("template");
    let toml = TestServer::config_text(
        dir.path(),
        harness::free_port(),
        None,
        &format!(
            "[notify]\ntemplates_dir = \"{}\"\n\n[profiles.default]\n\n[profiles.default.notify.webhooks.teams]\nurl = \"https://teams.example/hook\"\ntemplate = \"teams.json\"\n",
            templates.display()
        ),
    );
    let config = Config::from_toml(&toml).expect("config");
    let err = acme_proxy::server::start(config, Arc::new(SystemClock))
        .await
        .expect_err("start-up must refuse");
    let text = format!("{err:#}");
    assert!(
        text.contains("teams.json") && text.contains("line 2"),
        "{text}"
    );
}

#[test]
fn a_webhook_for_an_unknown_event_is_refused_naming_the_events() {
    let err = Config::from_toml(
        "[profiles.default.notify.webhooks.x]\nurl = \"https://h.example/\"\nevents = [\"certificate.issue\"]\n",
    )
    .expect_err("unknown event")
    .to_string();
    assert!(
        err.contains("certificate.issue") && err.contains("certificate.issued"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_answering_503_three_times_then_200_gets_exactly_one_delivery_of_the_body() {
    let receiver = Receiver::start().await;
    receiver.unavailable_for(3);
    let extra = format!(
        "{FAST_JOBS}\n[profiles.default]\nbypass = true\n\n[profiles.default.notify.webhooks.ops]\nurl = \"{}\"\ntemplate = \"slack.json\"\n",
        receiver.url("/hook")
    );
    let server = TestServer::start(harness::free_port(), None, &extra).await;
    client::account(&server.directory("default")).await;
    // Three 503s, then the delivery.
    receiver
        .wait_for("four attempts", Duration::from_secs(15), |got| {
            got.len() >= 4
        })
        .await;
    deliveries_settled(server.running().authority().store()).await;
    let got = receiver.received();
    assert_eq!(
        got.len(),
        4,
        "3 refused attempts and one delivery: {got:#?}"
    );
    // Every attempt carried the same rendered body; the last was accepted.
    for r in &got {
        assert!(
            r.body["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("account.created (default)")),
            "{r:?}"
        );
    }
    let store = server.running().authority().store().clone();
    let jobs = acme_proxy::admin::ops::list_jobs(&store, Some("notify_delivery"), None, 10)
        .await
        .expect("jobs");
    assert_eq!(jobs.len(), 1);
    assert_eq!((jobs[0].status.as_str(), jobs[0].attempts), ("done", 4));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_receiver_does_not_slow_acme_responses() {
    let receiver = Receiver::start().await;
    receiver.hang();
    let extra = format!(
        "{FAST_JOBS}\n[profiles.default]\nbypass = true\n\n[profiles.default.notify.webhooks.ops]\nurl = \"{}\"\ntimeout = \"5s\"\n",
        receiver.url("/hook")
    );
    let server = TestServer::start(harness::free_port(), None, &extra).await;
    let responder = Responder::start().await;
    let started = std::time::Instant::now();
    let account = client::account(&server.directory("default")).await;
    client::issue(&account, &responder, &["patient.example.test"]).await;
    let took = started.elapsed();
    receiver
        .wait_for("the held deliveries", Duration::from_secs(5), |got| {
            got.len() >= 2
        })
        .await;
    assert!(
        took < Duration::from_secs(3),
        "an account and an issuance took {took:?} while the receiver hangs for 5 s per delivery"
    );
    server.stop().await;
}

/// An executable shell script at `dir/name`.
fn script(dir: &std::path::Path, name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_gets_the_notice_on_stdin_in_a_cleared_environment_and_exit_75_is_retried() {
    let dir = crate::harness::tempdir();
    let out = dir.path().join("notice.json");
    let tries = dir.path().join("tries");
    // Fails "later" (75) on its first run, then records its input and env.
    let prog = script(
        dir.path(),
        "notify",
        &format!(
            "echo x >> {tries}\nif [ $(wc -l < {tries}) -lt 2 ]; then echo 'busy' >&2; exit 75; fi\ncat > \"$1\"\nenv > \"$1.env\"",
            tries = tries.display()
        ),
    );
    let extra = format!(
        "{FAST_JOBS}\n[profiles.default]\nbypass = true\n\n[profiles.default.notify.scripts.ticket]\ncommand = \"{}\"\nargs = [\"{}\"]\nevents = [\"account.created\"]\n",
        prog.display(),
        out.display()
    );
    let server = TestServer::start(harness::free_port(), None, &extra).await;
    client::account(&server.directory("default")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !out.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the script never succeeded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The script has finished writing once its delivery is done.
    deliveries_settled(server.running().authority().store()).await;
    let notice: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("output")).expect("JSON");
    assert_eq!(notice["event"], "account.created");
    assert_eq!(notice["profile"], "default");
    let env = std::fs::read_to_string(format!("{}.env", out.display())).expect("env");
    assert!(!env.contains("HOME=") && !env.contains("CARGO"), "{env}");
    assert_eq!(
        std::fs::read_to_string(&tries)
            .expect("tries")
            .lines()
            .count(),
        2
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_script_is_not_retried_and_its_first_error_line_is_audited() {
    let dir = crate::harness::tempdir();
    let prog = script(
        dir.path(),
        "notify",
        "cat > /dev/null\necho 'ticket system says no' >&2\nexit 1",
    );
    let extra = format!(
        "{FAST_JOBS}\n[profiles.default]\nbypass = true\n\n[profiles.default.notify.scripts.ticket]\ncommand = \"{}\"\n",
        prog.display()
    );
    let server = TestServer::start(harness::free_port(), None, &extra).await;
    client::account(&server.directory("default")).await;
    let store = server.running().authority().store().clone();
    let row = first_notification_failed(&store).await;
    let detail = row.detail.unwrap_or_default();
    assert!(detail.contains("ticket system says no"), "{detail}");
    let job = newest_delivery_once_retired(&store).await;
    assert_eq!((job.status.as_str(), job.attempts), ("failed", 1));
    server.stop().await;
}

#[test]
fn a_script_must_be_named_by_an_absolute_path() {
    let err = Config::from_toml("[profiles.default.notify.scripts.x]\ncommand = \"notify.sh\"\n")
        .expect_err("relative command")
        .to_string();
    assert!(err.contains("absolute path"), "{err}");
}

/// A real SMTP server (aiosmtpd) that writes every message it accepts to a
/// directory; with a certificate it offers STARTTLS and refuses mail sent
/// without it.
struct SmtpSink {
    addr: std::net::SocketAddr,
    out: tempfile::TempDir,
    _child: harness::ChildGuard,
}

/// One message as the sink received it.
#[derive(Debug, serde::Deserialize)]
struct Mail {
    rcpt_tos: Vec<String>,
    mail_from: String,
    tls: bool,
    data: String,
}

impl Mail {
    /// A header's value, unfolded (RFC 5322 §2.2.3).
    fn header(&self, name: &str) -> Option<String> {
        let unfolded = self.data.replace("\r\n ", " ").replace("\n ", " ");
        unfolded.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }

    fn body(&self) -> &str {
        self.data
            .split_once("\r\n\r\n")
            .or_else(|| self.data.split_once("\n\n"))
            .map_or("", |(_, b)| b)
    }
}

impl SmtpSink {
    fn start(tls: Option<(std::path::PathBuf, std::path::PathBuf)>) -> Option<SmtpSink> {
        if !harness::require_python_module("aiosmtpd") {
            return None;
        }
        let out = crate::harness::tempdir();
        let script = out.path().join("smtp_sink.py");
        std::fs::write(&script, include_str!("fixtures/smtp_sink.py")).expect("script");
        // aiosmtpd must be given its address: an own_addr. The script
        // prints "ready" once it listens.
        let addr = harness::own_addr();
        let log = out.path().join("sink.log");
        let mut command = std::process::Command::new("/usr/bin/python3");
        command
            .arg(&script)
            .arg(addr.ip().to_string())
            .arg(addr.port().to_string())
            .arg(out.path());
        if let Some((cert, key)) = &tls {
            command.arg(cert).arg(key);
        }
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start the SMTP sink");
        let stdout = child.stdout.take().expect("stdout");
        let guard = harness::ChildGuard(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let _ = tx.send(line.unwrap_or_default());
            }
        });
        match rx.recv_timeout(Duration::from_secs(15)) {
            Ok(line) if line.trim() == "ready" => {}
            _ => panic!(
                "the SMTP sink did not start on {addr}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
        }
        Some(SmtpSink {
            addr,
            out,
            _child: guard,
        })
    }

    /// Waits for `n` messages and returns them in arrival order.
    async fn wait_for(&self, n: usize, within: Duration) -> Vec<Mail> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let mut mails: Vec<(u64, Mail)> = std::fs::read_dir(self.out.path())
                .expect("read the sink's directory")
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let n: u64 = name.strip_suffix(".json")?.parse().ok()?;
                    let text = std::fs::read_to_string(e.path()).ok()?;
                    Some((n, serde_json::from_str(&text).expect("a sink record")))
                })
                .collect();
            if mails.len() >= n {
                mails.sort_by_key(|(n, _)| *n);
                return mails.into_iter().map(|(_, m)| m).collect();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{n} message(s) expected, {} arrived",
                mails.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Issues one certificate for `name` on a server mailing `email` (a TOML
/// table body) and returns the certificate's serial as the audit saw it.
async fn issue_with_email(email: &str, name: &str) -> (TestServer, String) {
    let responder = Responder::start().await;
    let extra = format!(
        "{FAST_JOBS}\n[profiles.default]\nbypass = true\n\n[profiles.default.notify.emails.pki]\n{email}"
    );
    let server = TestServer::start(responder.port, None, &extra).await;
    let account = client::account(&server.directory("default")).await;
    client::issue(&account, &responder, &[name]).await;
    let store = server.running().authority().store().clone();
    let issued = store
        .audit_recent(Some("certificate.issued"), 1)
        .await
        .expect("audit");
    let serial = issued[0].serial.clone().expect("a serial");
    (server, serial)
}

fn assert_the_issuance_mail(mail: &Mail, name: &str, serial: &str) {
    assert_eq!(
        mail.header("Subject").as_deref(),
        Some(format!("[acme-proxy] certificate.issued (default): {name}").as_str()),
        "{}",
        mail.data
    );
    assert_eq!(mail.mail_from, "pki@example.test");
    let mut to = mail.rcpt_tos.clone();
    to.sort();
    assert_eq!(to, ["oncall@example.test", "pki-team@example.test"]);
    let to_header = mail.header("To").expect("a To header");
    assert!(
        to_header.contains("pki-team@example.test") && to_header.contains("oncall@example.test"),
        "{to_header}"
    );
    let body = mail.body();
    assert!(
        body.contains(&format!("Identifiers: {name}"))
            && body.contains(&format!("Serial:      {serial}")),
        "{body}"
    );
}

const MAIL_ENVELOPE: &str = "from = \"acme-proxy <pki@example.test>\"\nto = [\"pki-team@example.test\", \"Oncall <oncall@example.test>\"]\nevents = [\"certificate.issued\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_server_receives_the_templated_issuance_mail_over_plain_smtp() {
    let Some(sink) = SmtpSink::start(None) else {
        return;
    };
    let email = format!(
        "host = \"{}\"\nport = {}\ntls = \"none\"\n{MAIL_ENVELOPE}",
        sink.addr.ip(),
        sink.addr.port()
    );
    let (server, serial) = issue_with_email(&email, "mailed.example.test").await;
    let mails = sink.wait_for(1, Duration::from_secs(15)).await;
    assert_the_issuance_mail(&mails[0], "mailed.example.test", &serial);
    assert!(!mails[0].tls);
    // Subscribed to issuance only: account.created was never queued for it.
    let jobs = acme_proxy::admin::ops::list_jobs(
        server.running().authority().store(),
        Some("notify_delivery"),
        None,
        100,
    )
    .await
    .expect("jobs");
    let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    assert!(
        keys.iter()
            .all(|k| k.contains("/email:pki/certificate.issued/")),
        "{keys:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_server_receives_the_templated_issuance_mail_over_starttls() {
    let pki = crate::upstream::TestPki::new();
    let Some(sink) = SmtpSink::start(Some(pki.server_cert(&[&harness::own_host().to_string()])))
    else {
        return;
    };
    let email = format!(
        "host = \"{}\"\nport = {}\ntls = \"starttls\"\ntrust_anchors = \"{}\"\n{MAIL_ENVELOPE}",
        sink.addr.ip(),
        sink.addr.port(),
        pki.ca_pem_path().display()
    );
    let (server, serial) = issue_with_email(&email, "sealed.example.test").await;
    let mails = sink.wait_for(1, Duration::from_secs(15)).await;
    assert_the_issuance_mail(&mails[0], "sealed.example.test", &serial);
    assert!(mails[0].tls, "the message came after STARTTLS");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_server_whose_certificate_is_not_trusted_gets_nothing_and_the_mail_is_retried() {
    let pki = crate::upstream::TestPki::new();
    let Some(sink) = SmtpSink::start(Some(pki.server_cert(&[&harness::own_host().to_string()])))
    else {
        return;
    };
    // No trust_anchors: the test CA is not among the system roots.
    let email = format!(
        "host = \"{}\"\nport = {}\ntls = \"starttls\"\n{MAIL_ENVELOPE}",
        sink.addr.ip(),
        sink.addr.port()
    );
    let (server, _) = issue_with_email(&email, "untrusted.example.test").await;
    let store = server.running().authority().store().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let job = loop {
        let jobs = acme_proxy::admin::ops::list_jobs(&store, Some("notify_delivery"), None, 10)
            .await
            .expect("jobs");
        if let Some(j) = jobs.into_iter().find(|j| j.attempts >= 2) {
            break j;
        }
        assert!(std::time::Instant::now() < deadline, "no retry");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        matches!(job.status.as_str(), "queued" | "running"),
        "{job:?}"
    );
    assert!(
        job.last_error.as_deref().unwrap_or("").contains("smtp"),
        "{job:?}"
    );
    assert!(sink.wait_for(0, Duration::ZERO).await.is_empty());
    server.stop().await;
}

#[test]
fn an_email_sender_that_is_not_an_address_stops_start_up_naming_the_key() {
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(
        dir.path(),
        harness::free_port(),
        None,
        "[profiles.default.notify.emails.pki]\nhost = \"smtp.example.test\"\nfrom = \"not an address\"\nto = [\"a@example.test\"]\n",
    );
    let config = Config::from_toml(&toml).expect("parses");
    let problems = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(acme_proxy::server::check(
            &config,
            std::sync::Arc::new(acme_proxy::clock::SystemClock),
        ))
        .expect_err("refused");
    assert!(
        problems
            .0
            .iter()
            .any(|p| p.contains("profiles.default.notify.emails.pki.from")),
        "{problems:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_is_queued_by_the_transaction_that_records_its_change_and_only_then() {
    use acme_proxy::clock::Clock;
    use acme_proxy_store::{NewJob, RevokeOutcome};
    let responder = Responder::start().await;
    let server =
        TestServer::start(responder.port, None, "[profiles.default]\nbypass = true\n").await;
    let account = client::account(&server.directory("default")).await;
    client::issue(&account, &responder, &["outbox.example.test"]).await;
    let store = server.running().authority().store().clone();
    let issued = store
        .audit_recent(Some("certificate.issued"), 1)
        .await
        .expect("audit");
    let serial = issued[0].serial.clone().expect("serial");
    let now = SystemClock.unix();
    let job = NewJob {
        kind: "notify_delivery",
        key: "default/test/certificate.revoked/outbox",
        payload: "{}",
        // Far in the future: no runner claims it during the test.
        run_at: (now + 3600) * 1000,
        deadline: None,
        max_attempts: 1,
        fair_key: None,
    };
    let queued = || async {
        acme_proxy::admin::ops::list_jobs(&store, Some("notify_delivery"), None, 100)
            .await
            .expect("jobs")
            .into_iter()
            .filter(|j| j.key == job.key)
            .count()
    };
    // The revocation happens: its notification is queued with it.
    let first = store
        .revoke_certificate(
            "default",
            &serial,
            Some(0),
            now,
            std::slice::from_ref(&job),
            None,
        )
        .await
        .expect("revoke");
    assert_eq!(first, RevokeOutcome::Revoked);
    assert_eq!(queued().await, 1);
    // Nothing changes the second time: nothing is queued either.
    let second_key = NewJob {
        key: "default/test/certificate.revoked/again",
        ..job
    };
    let again = store
        .revoke_certificate(
            "default",
            &serial,
            Some(0),
            now,
            std::slice::from_ref(&second_key),
            None,
        )
        .await
        .expect("revoke");
    assert_eq!(again, RevokeOutcome::AlreadyRevoked);
    let all = acme_proxy::admin::ops::list_jobs(&store, Some("notify_delivery"), None, 100)
        .await
        .expect("jobs");
    assert!(
        !all.iter().any(|j| j.key == second_key.key),
        "a notice of a change that did not happen was queued: {all:?}"
    );
    server.stop().await;
}
