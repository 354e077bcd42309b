//! What an operator sees: the operator's own CA and chain, leaf extensions
//! from configuration, http-01 redirects, admission control, /health,
//! configuration mistakes at start-up, JSON logs and graceful shutdown.

use std::collections::HashMap;
use std::io::Read;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acme_proxy_protocol::Jwk;
use axum::extract::{Path as AxPath, State};
use axum::response::{IntoResponse, Redirect};
use axum::routing::get;
use serde_json::json;
use x509_parser::prelude::*;

use crate::concurrency::{csr_for, ready_order};
use crate::harness::{Dns, TestServer, binary, spawn_binary};
use crate::raw::{self, Acct, Key};

fn pem_certs(chain: &str) -> Vec<Vec<u8>> {
    ::pem::parse_many(chain)
        .unwrap()
        .into_iter()
        .map(::pem::Pem::into_contents)
        .collect()
}

/// Orders, validates (bypass), finalizes and downloads one certificate.
async fn issue_one(server: &TestServer, name: &str) -> String {
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let (order_url, finalize) = ready_order(&dir, &acct, name).await;
    let r = acct
        .post(&dir, &finalize, Some(&json!({"csr": csr_for(name)})))
        .await;
    assert_eq!(
        r.json()["status"],
        "valid",
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let order = acct.post(&dir, &order_url, None).await.json();
    let cert = acct
        .post(&dir, order["certificate"].as_str().unwrap(), None)
        .await;
    String::from_utf8(cert.body).unwrap()
}

#[tokio::test]
async fn an_operator_intermediate_signs_leaves_with_its_chain_and_configured_extensions() {
    let work = crate::harness::tempdir();
    // Root → intermediate, made the way an operator's PKI would hand them over.
    let root_key = rcgen::KeyPair::generate().unwrap();
    let mut root = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    root.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    root.distinguished_name
        .push(rcgen::DnType::CommonName, "Test Root");
    root.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let root_cert = root.self_signed(&root_key).unwrap();
    let root_issuer = rcgen::Issuer::new(root, root_key);
    let int_key = rcgen::KeyPair::generate().unwrap();
    let mut int = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    int.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    int.distinguished_name
        .push(rcgen::DnType::CommonName, "Test Intermediate");
    int.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let int_cert = int.signed_by(&int_key, &root_issuer).unwrap();
    let p = |n: &str| work.path().join(n).display().to_string();
    std::fs::write(p("int.pem"), int_cert.pem()).unwrap();
    std::fs::write(p("int.key"), int_key.serialize_pem()).unwrap();
    std::fs::write(p("root.pem"), root_cert.pem()).unwrap();

    let server = TestServer::start(
        1,
        None,
        &format!(
            "[profiles.default]\nbypass = true\n[profiles.default.signer]\ntype = \"local_ca\"\nca_cert = \"{}\"\nca_key = \"{}\"\nchain = \"{}\"\nvalidity = \"10d\"\nbackdate = \"2h\"\ncrl_url = \"http://crl.example.test/default.crl\"\nissuer_url = \"http://ca.example.test/int.der\"\n",
            p("int.pem"),
            p("int.key"),
            p("root.pem")
        ),
    )
    .await;
    let chain = issue_one(&server, "op.example.test").await;
    let certs = pem_certs(&chain);
    assert_eq!(certs.len(), 3, "leaf, intermediate, root");
    assert_eq!(certs[1], int_cert.der().to_vec());
    assert_eq!(certs[2], root_cert.der().to_vec());
    let (_, leaf) = X509Certificate::from_der(&certs[0]).unwrap();
    let (_, intermediate) = X509Certificate::from_der(&certs[1]).unwrap();
    assert_eq!(leaf.issuer(), intermediate.subject());
    leaf.verify_signature(Some(intermediate.public_key()))
        .unwrap();
    let life = leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp();
    assert_eq!(life, 10 * 86400 + 2 * 3600, "validity plus backdating");
    let mut crl_uri = None;
    let mut aia_uri = None;
    for ext in leaf.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::CRLDistributionPoints(points) => {
                if let Some(DistributionPointName::FullName(names)) =
                    &points.points[0].distribution_point
                    && let GeneralName::URI(u) = &names[0]
                {
                    crl_uri = Some(u.to_string());
                }
            }
            ParsedExtension::AuthorityInfoAccess(aia) => {
                let access = &aia.accessdescs[0];
                assert_eq!(
                    access.access_method,
                    x509_parser::oid_registry::OID_PKIX_ACCESS_DESCRIPTOR_CA_ISSUERS
                );
                if let GeneralName::URI(u) = &access.access_location {
                    aia_uri = Some(u.to_string());
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        crl_uri.as_deref(),
        Some("http://crl.example.test/default.crl")
    );
    assert_eq!(aia_uri.as_deref(), Some("http://ca.example.test/int.der"));

    // The CRL is signed by the intermediate and names it as issuer.
    let (status, _, der) =
        crate::flow::reqwest_get(&format!("{}/profile/default/crl", server.base())).await;
    assert_eq!(status, 200);
    let (_, crl) = parse_x509_crl(&der).unwrap();
    crl.verify_signature(intermediate.public_key()).unwrap();
    assert_eq!(crl.issuer(), intermediate.subject());
    server.stop().await;
}

#[tokio::test]
async fn a_ca_key_that_does_not_match_its_certificate_stops_start_up() {
    let work = crate::harness::tempdir();
    let key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = ca.self_signed(&key).unwrap();
    std::fs::write(work.path().join("ca.pem"), cert.pem()).unwrap();
    std::fs::write(work.path().join("ca.key"), other.serialize_pem()).unwrap();
    let toml = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{d}/data\"\n[profiles.default.signer]\ntype = \"local_ca\"\nca_cert = \"{d}/ca.pem\"\nca_key = \"{d}/ca.key\"\n",
        d = work.path().display()
    );
    let config = acme_proxy::config::Config::from_toml(&toml).unwrap();
    let err = acme_proxy::server::start(config, Arc::new(acme_proxy::clock::SystemClock))
        .await
        .expect_err("refused");
    assert!(
        format!("{err:#}").contains("does not belong to the certificate"),
        "{err:#}"
    );
}

type Routes = Arc<Mutex<HashMap<String, String>>>;

/// A responder whose challenge path redirects: `/.well-known/acme-challenge/T`
/// → wherever `redirects[T]` says; `/final/T` serves `answers[T]`.
async fn redirecting_responder(redirects: Routes, answers: Routes) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new()
        .route(
            "/.well-known/acme-challenge/{token}",
            get(
                |State((r, _)): State<(Routes, Routes)>, AxPath(t): AxPath<String>| async move {
                    let to = r.lock().unwrap().get(&t).cloned().unwrap_or_default();
                    Redirect::temporary(&to).into_response()
                },
            ),
        )
        .route(
            "/final/{token}",
            get(
                |State((_, a)): State<(Routes, Routes)>, AxPath(t): AxPath<String>| async move {
                    a.lock().unwrap().get(&t).cloned().unwrap_or_default()
                },
            ),
        )
        .with_state((redirects, answers));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

#[tokio::test]
async fn http_01_follows_redirects_only_to_allowed_ports_and_not_forever() {
    let Some(dns) = Dns::start() else { return };
    let redirects: Routes = Arc::default();
    let answers: Routes = Arc::default();
    let port = redirecting_responder(Arc::clone(&redirects), Arc::clone(&answers)).await;
    let server = TestServer::start(port, Some(&dns), "").await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let thumb = Jwk::from_value(&acct.key.jwk).unwrap().thumbprint_b64();

    // (name, where its challenge redirects, expected status, expected problem)
    let cases = [
        ("ok.example.test", "/final/{t}".to_owned(), "valid", ""),
        (
            "abs.example.test",
            format!("http://abs.example.test:{port}/final/{{t}}"),
            "valid",
            "",
        ),
        (
            "port.example.test",
            "http://port.example.test:8081/final/{t}".to_owned(),
            "invalid",
            "unauthorized",
        ),
        (
            "ftp.example.test",
            "ftp://ftp.example.test/{t}".to_owned(),
            "invalid",
            "unauthorized",
        ),
        (
            "loop.example.test",
            "/.well-known/acme-challenge/{t}".to_owned(),
            "invalid",
            "unauthorized",
        ),
    ];
    for (name, target, want_status, want_problem) in cases {
        let r = acct
            .post(
                &dir,
                dir["newOrder"].as_str().unwrap(),
                Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
            )
            .await;
        let authz_url = r.json()["authorizations"][0].as_str().unwrap().to_owned();
        let authz = acct.post(&dir, &authz_url, None).await.json();
        let ch = &authz["challenges"][0];
        let token = ch["token"].as_str().unwrap().to_owned();
        redirects
            .lock()
            .unwrap()
            .insert(token.clone(), target.replace("{t}", &token));
        answers
            .lock()
            .unwrap()
            .insert(token.clone(), format!("{token}.{thumb}"));
        let r = acct
            .post(&dir, ch["url"].as_str().unwrap(), Some(&json!({})))
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.json()["status"],
            "processing",
            "validation runs off the request path"
        );
        assert!(r.headers.get("retry-after").is_some());
        assert!(
            r.headers
                .get_all("link")
                .iter()
                .any(|l| l.to_str().unwrap().contains("rel=\"up\""))
        );
        let settled = acct
            .wait_while(
                &dir,
                ch["url"].as_str().unwrap(),
                "processing",
                Duration::from_secs(10),
            )
            .await;
        assert_eq!(settled["status"], want_status, "{name}: {settled}");
        assert_eq!(raw::error_type(&settled), want_problem, "{name}: {settled}");
    }
    server.stop().await;
}

/// The `[profiles.default]` of a bypass profile whose signer is an
/// operator's program that takes `seconds` to refuse every CSR, its files
/// in `files`: a finalize that holds its request slot that long.
pub(crate) fn slow_refusing_profile(files: &std::path::Path, seconds: u32) -> String {
    let script = files.join("slow.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ncat >/dev/null\nsleep {seconds}\nexit 1\n"),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_pem = files.join("ca.pem");
    std::fs::write(&ca_pem, ca.self_signed(&ca_key).unwrap().pem()).unwrap();
    format!(
        "[profiles.default]\nbypass = true\n[profiles.default.signer]\ntype = \"custom\"\ncommand = \"{}\"\nca_cert = \"{}\"\n",
        script.display(),
        ca_pem.display()
    )
}

/// Finalizes a new ready order of a new account at `directory` (the
/// profile of [`slow_refusing_profile`]) in the background: the finalize's
/// answer, once its signer has refused.
///
/// With `max_in_flight = 1` the caller's own probes can hold the slot when
/// the finalize arrives; the finalize is then shed (503, before its nonce
/// is read) and sent again, as a client does after `Retry-After`, until it
/// is admitted (10 s at most).
pub(crate) async fn finalize_in_background(directory: &str) -> tokio::task::JoinHandle<raw::Resp> {
    let dir = raw::directory(directory).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let (_, finalize) = ready_order(&dir, &acct, "slow.example.test").await;
    let nonce = raw::nonce(&dir).await;
    let protected = json!({"alg": "ES256", "kid": acct.url, "nonce": nonce, "url": finalize});
    let body = acct.key.sign(
        &protected,
        Some(&json!({"csr": csr_for("slow.example.test")})),
    );
    tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = raw::post(&finalize, &body).await;
            let shed = r.status == 503 && String::from_utf8_lossy(&r.body).contains("at capacity");
            if !shed || Instant::now() >= deadline {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

#[tokio::test]
async fn past_max_in_flight_requests_are_shed_with_503_and_retry_after() {
    // The only slot is held by a finalize whose signer takes its time: an
    // operator's program that sleeps (a request still arriving holds no
    // slot: its body is read before admission).
    let files = crate::harness::tempdir();
    let server = TestServer::start_with_toml(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{{data_dir}}\"\nmax_in_flight = 1\n[metrics]\nlisten = \"127.0.0.1:0\"\n{}",
        slow_refusing_profile(files.path(), 3)
    ))
    .await;
    let slow = finalize_in_background(&server.directory("default")).await;
    let new_order = format!("{}/profile/default/new-order", server.base());
    // Shed as soon as the finalize holds the slot.
    let deadline = Instant::now() + Duration::from_secs(2);
    let shed = loop {
        let r = raw::request(
            "POST",
            &new_order,
            Some("application/jose+json"),
            b"{}".to_vec(),
        )
        .await;
        if r.status == 503 {
            break r;
        }
        assert!(Instant::now() < deadline, "never shed: {}", r.status);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(shed.problem(), "serverInternal");
    assert_eq!(shed.headers.get("retry-after").unwrap(), "1");
    assert!(!slow.is_finished(), "the finalize still holds the slot");
    // Counted by the bound that was full.
    let metrics = format!(
        "http://{}",
        server.running().metrics_addr.expect("a metrics listener")
    );
    assert!(crate::connections::shed(&metrics, "max_in_flight").await >= 1);
    assert_eq!(
        crate::connections::shed(&metrics, "max_buffered_body_bytes").await,
        0
    );
    // The slot is free again once the finalize is answered.
    assert_eq!(slow.await.unwrap().status, 500);
    let r = raw::request(
        "POST",
        &new_order,
        Some("application/jose+json"),
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(r.status, 400, "an ordinary refusal once admitted");
    let (status, _, body) = crate::flow::reqwest_get(&format!("{}/health", server.base())).await;
    assert_eq!(
        (status, String::from_utf8(body).unwrap().as_str()),
        (200, "{\"status\":\"ok\"}")
    );
    server.stop().await;
}

#[test]
fn an_unknown_configuration_key_stops_start_up_and_names_it() {
    let dir = crate::harness::tempdir();
    let file = dir.path().join("acme-proxy.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\n[profiles.default]\nbypas = true\n",
    )
    .unwrap();
    let out = Command::new(binary())
        .args(["serve", "--config", file.to_str().unwrap()])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bypas") && stderr.contains("bypass"),
        "names the key and what to write: {stderr}"
    );
    // Nothing was created: a broken configuration starts nothing.
    assert!(!dir.path().join("acme-proxy-data").exists());

    let out = Command::new(binary())
        .args(["serve"])
        .current_dir(dir.path())
        .env("ACME_PROXY_LISTNE", "127.0.0.1:0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("listne"),
        "an environment key is checked too"
    );
}

/// A Service named `acme-proxy` makes Kubernetes put service links into
/// every pod of its namespace (`ACME_PROXY_PORT=tcp://…`,
/// `ACME_PROXY_SERVICE_HOST`, …): the server starts, warns about them, and
/// logs without colour codes into a file; a misspelt key still stops it.
#[test]
fn kubernetes_service_links_are_ignored_with_a_warning_and_logs_to_a_file_have_no_colour() {
    let cwd = crate::harness::tempdir();
    let (server, _directory) = spawn_binary(
        cwd.path(),
        &["serve"],
        &[
            ("ACME_PROXY_LISTEN", "127.0.0.1:0".to_owned()),
            ("ACME_PROXY_PORT", "tcp://10.0.0.1:14000".to_owned()),
            (
                "ACME_PROXY_PORT_14000_TCP",
                "tcp://10.0.0.1:14000".to_owned(),
            ),
            ("ACME_PROXY_PORT_14000_TCP_PROTO", "tcp".to_owned()),
            ("ACME_PROXY_PORT_14000_TCP_PORT", "14000".to_owned()),
            ("ACME_PROXY_PORT_14000_TCP_ADDR", "10.0.0.1".to_owned()),
            ("ACME_PROXY_SERVICE_HOST", "10.0.0.1".to_owned()),
            ("ACME_PROXY_SERVICE_PORT", "14000".to_owned()),
            ("ACME_PROXY_SERVICE_PORT_ACME", "14000".to_owned()),
        ],
    );
    let log_file = cwd.path().join("acme-proxy.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = std::fs::read_to_string(&log_file).unwrap_or_default();
        if log.contains("Kubernetes") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(server);
    let warning = log
        .lines()
        .find(|l| l.contains("Kubernetes service links"))
        .unwrap_or_else(|| panic!("a warning about the service links:\n{log}"));
    assert!(warning.contains("WARN"), "{warning}");
    for name in [
        "ACME_PROXY_PORT,",
        "ACME_PROXY_SERVICE_HOST",
        "ACME_PROXY_SERVICE_PORT_ACME",
    ] {
        assert!(warning.contains(name), "{name} in {warning}");
    }
    assert!(
        !log.contains('\u{1b}'),
        "no ANSI escape in a log file:\n{log:?}"
    );

    let out = Command::new(binary())
        .args(["serve"])
        .current_dir(cwd.path())
        .env_remove("ACME_PROXY_CONFIG")
        .env("ACME_PROXY_SERVICE_HOST", "10.0.0.1")
        .env("ACME_PROXY_LISTN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("listn") || stderr.contains("LISTN"),
        "names the misspelt key: {stderr}"
    );
}

/// `systemctl reload` sends SIGHUP; without TLS files there is nothing to
/// re-read, and the signal's default action would end the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_to_a_server_without_tls_reloads_its_configuration_and_keeps_serving() {
    let cwd = crate::harness::tempdir();
    let (mut server, directory) = spawn_binary(
        cwd.path(),
        &["serve"],
        &[("ACME_PROXY_LISTEN", "127.0.0.1:0".to_owned())],
    );
    Command::new("kill")
        .args(["-HUP", &server.0.id().to_string()])
        .status()
        .unwrap();
    let log_file = cwd.path().join("acme-proxy.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log_file)
        .unwrap_or_default()
        .contains("configuration reloaded")
    {
        assert!(
            Instant::now() < deadline,
            "no reload line; process: {:?}\n{}",
            server.0.try_wait(),
            std::fs::read_to_string(&log_file).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.0.try_wait().unwrap().is_none(), "still running");
    let r = raw::request("GET", &directory, None, vec![]).await;
    assert_eq!(r.status, 200, "still serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_event_outcome_and_request_id_and_sigterm_stops_cleanly() {
    let cwd = crate::harness::tempdir();
    let (mut server, directory) = spawn_binary(
        cwd.path(),
        &["serve"],
        &[
            ("ACME_PROXY_LISTEN", "127.0.0.1:0".to_owned()),
            ("ACME_PROXY_LOG_FORMAT", "json".to_owned()),
        ],
    );
    let r = raw::request("GET", &directory, None, vec![]).await;
    assert_eq!(r.status, 200);
    let request_id = r.headers["x-request-id"].to_str().unwrap().to_owned();

    Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = server.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "SIGTERM did not stop the server");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "graceful exit, got {status:?}");

    let mut log = String::new();
    std::fs::File::open(cwd.path().join("acme-proxy.log"))
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(
            l["event"].is_string() && l["outcome"].is_string() && l["fields"].is_null(),
            "event and outcome on {l}"
        );
    }
    let served = lines
        .iter()
        .find(|l| l["event"] == "http.request")
        .expect("a request line");
    // Flat, as collectors expect: the span's request id beside the rest.
    assert_eq!(served["request_id"], request_id.as_str(), "{served}");
    assert_eq!(served["client"], "127.0.0.1", "{served}");
    assert_eq!(served["profile"], "default", "{served}");
    assert_eq!(served["target"], "acme_proxy::request", "{served}");
    assert_eq!(served["level"], "INFO", "{served}");
    assert!(
        served["timestamp"].is_string() && served["span"].is_null(),
        "{served}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "server.shutdown" && l["outcome"] == "success")
    );
}

#[test]
fn config_check_loads_like_serve_prints_the_effective_profiles_and_refuses_what_serve_would() {
    let dir = crate::harness::tempdir();
    let check = |toml: &str| {
        let path = dir.path().join("acme-proxy.toml");
        std::fs::write(&path, toml).unwrap();
        let out = Command::new(crate::harness::binary())
            .args(["config", "check", "--config"])
            .arg(&path)
            .env_remove("ACME_PROXY_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let data = dir.path().join("data");
    let base = format!("data_dir = \"{}\"\n", data.display());
    let (code, out, err) = check(&format!(
        "{base}[profiles.default]\nchallenges = [\"http-01\", \"dns-01\"]\n[profiles.lab]\nbypass = true\n"
    ));
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("default: embedded CA (self-generated); challenges http-01, dns-01"),
        "{out}"
    );
    assert!(
        out.contains("lab:") && out.contains("bypass is ON"),
        "{out}"
    );

    // A relay profile without its upstream account would not start.
    let (code, out, err) = check(&format!(
        "{base}[profiles.edge.signer]\ntype = \"relay\"\ndirectory = \"https://ca.example/dir\"\n"
    ));
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("acme-proxy upstream register --profile edge"),
        "{err}"
    );

    // Nor would a broken template.
    let templates = dir.path().join("templates");
    std::fs::create_dir_all(&templates).unwrap();
    std::fs::write(
        templates.join("chat.json"),
        "{\"text\": {{ notice.event }\n",
    )
    .unwrap();
    let (code, _, err) = check(&format!(
        "{base}[notify]\ntemplates_dir = \"{}\"\n[profiles.default.notify.webhooks.chat]\nurl = \"https://chat.example/hook\"\ntemplate = \"chat.json\"\n",
        templates.display()
    ));
    assert_eq!(code, Some(2));
    assert!(err.contains("chat.json") && err.contains("line 1"), "{err}");
}

#[tokio::test]
async fn the_root_lists_each_profiles_directory_as_json_and_to_a_browser_as_a_page() {
    let server = TestServer::start(
        crate::harness::free_port(),
        None,
        "[profiles.default]\n[profiles.lab]\nbypass = true\n",
    )
    .await;
    let root = format!("{}/", server.base());
    let json = raw::request_with("GET", &root, &[], Vec::new()).await;
    assert_eq!(json.status, 200);
    assert_eq!(
        json.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&json.body).expect("JSON"),
        json!({"profiles": [
            {"name": "default", "directory": server.directory("default"), "signer": "local_ca"},
            {"name": "lab", "directory": server.directory("lab"), "signer": "local_ca"},
        ]})
    );
    // What a browser sends.
    let page = raw::request_with(
        "GET",
        &root,
        &[(
            "accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        )],
        Vec::new(),
    )
    .await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/html; charset=utf-8")
    );
    let html = String::from_utf8(page.body).expect("UTF-8");
    for name in ["default", "lab"] {
        let url = server.directory(name);
        assert!(
            html.contains(&format!("<tr><td>{name}</td><td><a href=\"{url}\">{url}</a></td><td>the embedded CA</td></tr>")),
            "{name} in:\n{html}"
        );
    }
    // Each listed directory is one a client can use.
    for name in ["default", "lab"] {
        let directory = raw::request("GET", &server.directory(name), None, Vec::new()).await;
        assert_eq!(directory.status, 200, "{name}");
    }
    server.stop().await;
}
