//! The custom signer against a real external PKI stand-in: a shell script
//! that signs with the `openssl` command line (fixtures/openssl_signer.sh).
//! certbot and lego obtain certificates through it; a refusal, a hang, a
//! failure and a chain for the wrong key each end as the issue says; CSRs
//! asking for more than names and TLS usages are refused before it runs,
//! and leaves it returns with more than that are never served; its
//! revocation, CRL and renewal-window operations are used.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use instant_acme::{
    CertificateIdentifier, ChallengeType, Identifier, NewOrder, OrderStatus, RevocationRequest,
};
use rustls::pki_types::CertificateDer;

use crate::clients::{certbot_certonly_standalone, lego_http_run, run};
use crate::harness::{self, Responder, TestServer, free_port};
use crate::{client, raw};

/// The PKI stand-in: its CA and the signing script, in one directory.
pub(crate) struct LegacyPki {
    dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl LegacyPki {
    pub(crate) fn new() -> Option<LegacyPki> {
        if !harness::require_program("openssl") {
            return None;
        }
        let dir = crate::harness::tempdir();
        let d = dir.path();
        let script = d.join("sign.sh");
        std::fs::write(&script, include_str!("fixtures/openssl_signer.sh")).expect("script");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "30",
                "-subj",
                "/CN=Legacy PKI test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        // A certificate for the right name but another key: what a buggy
        // or compromised signer might hand back.
        openssl(
            d,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "other.key",
                "-out",
                "other.csr",
                "-subj",
                "/CN=wrong.example.test",
                "-addext",
                "subjectAltName=DNS:wrong.example.test",
            ],
        );
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "other.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                "7",
                "-days",
                "30",
                "-copy_extensions",
                "copyall",
                "-out",
                "other.pem",
            ],
        );
        Some(LegacyPki { dir })
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Makes the script misbehave ("badcsr", "hang", "fail", "wrongkey",
    /// "extraeku", "organization") or sign ("sign").
    fn mode(&self, mode: &str) {
        std::fs::write(self.path("mode"), mode).expect("mode");
    }

    /// The profile `legacy` signing through the script, with every
    /// optional operation declared.
    pub(crate) fn profile(&self, timeout: &str) -> String {
        let script = self.path("sign.sh").display().to_string();
        format!(
            "[profiles.legacy]\nbypass = true\n[profiles.legacy.signer]\ntype = \"custom\"\ncommand = \"{script}\"\nargs = [\"issue\"]\ntimeout = \"{timeout}\"\nca_cert = \"{}\"\n[profiles.legacy.signer.revoke]\ncommand = \"{script}\"\n[profiles.legacy.signer.crl]\ncommand = \"{script}\"\n[profiles.legacy.signer.renewal_window]\ncommand = \"{script}\"\n",
            self.path("ca.pem").display()
        )
    }

    /// `openssl verify` of a leaf (PEM file) against the CA.
    fn verifies(&self, leaf: &Path) -> bool {
        let out = Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(self.path("ca.pem"))
            .arg(leaf)
            .output()
            .expect("openssl verify");
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains(": OK")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certbot_and_lego_issue_through_a_custom_signer_that_signs_with_openssl() {
    let Some(pki) = LegacyPki::new() else {
        return;
    };
    let lego = harness::require_program("lego");
    let certbot = harness::require_program("certbot");
    let server = TestServer::start(free_port(), None, &pki.profile("10s")).await;
    let directory = server.directory("legacy");
    let home = crate::harness::tempdir();
    if certbot {
        let d = home.path().join("certbot");
        let args =
            certbot_certonly_standalone(&d, &directory, harness::own_addr(), "cb.legacy.test");
        let ran = run("certbot", args, d.clone()).await;
        assert!(ran.success(), "certbot\n{}", ran.report());
        let cert = d.join("conf/live/t/cert.pem");
        assert!(
            pki.verifies(&cert),
            "the chain verifies against the PKI's CA"
        );
        let got = crate::clients::leaf(&cert, &|| ran.report());
        assert_eq!(got.sans, vec!["cb.legacy.test".to_owned()]);
        // The program was told the order: its id, names, CSR and window.
        let asked: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(pki.path("last-request.json")).expect("request"),
        )
        .expect("JSON");
        assert_eq!(asked["operation"], "issue");
        assert_eq!(asked["profile"], "legacy");
        assert_eq!(asked["identifiers"][0]["value"], "cb.legacy.test");
        assert!(asked["order"].as_str().is_some_and(|o| !o.is_empty()));
        assert!(asked["not_after"].as_str().is_some(), "{asked}");
    }
    if lego {
        let d = home.path().join("lego");
        let args = lego_http_run(&directory, &d, harness::own_addr(), "lego.legacy.test");
        let ran = run("lego", args, d.clone()).await;
        assert!(ran.success(), "lego\n{}", ran.report());
        let cert = d.join("certificates/lego.legacy.test.crt");
        // lego stores the whole chain; verify the leaf alone.
        let chain = std::fs::read_to_string(&cert).expect("chain");
        let leaf = ::pem::parse_many(&chain).expect("PEM")[0].clone();
        let leaf_path = home.path().join("lego-leaf.pem");
        std::fs::write(&leaf_path, ::pem::encode(&leaf)).expect("leaf");
        assert!(
            pki.verifies(&leaf_path),
            "the chain verifies against the PKI's CA"
        );
    }
    // ca.pem serves the configured CA certificate.
    let served = raw::request(
        "GET",
        &format!("{}/profile/legacy/ca.pem", server.base()),
        None,
        vec![],
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&served.body),
        std::fs::read_to_string(pki.path("ca.pem")).expect("ca.pem")
    );
    server.stop().await;
}

/// Orders `name` at `legacy`, validated (bypass), and finalizes it with a
/// CSR for a fresh key; returns the order after finalize answered (or the
/// error) and how long finalize took.
async fn finalize_once(
    account: &instant_acme::Account,
    name: &str,
) -> (
    instant_acme::Order,
    Result<(), instant_acme::Error>,
    Duration,
) {
    let mut order = ready_order(account, name).await;
    let started = Instant::now();
    let result = order.finalize().await.map(|_| ());
    let took = started.elapsed();
    (order, result, took)
}

/// Orders `name` at `legacy` and triggers its challenge (bypassed): the
/// order, ready.
async fn ready_order(account: &instant_acme::Account, name: &str) -> instant_acme::Order {
    let ids = [Identifier::Dns(name.to_owned())];
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .expect("order");
    let mut authorizations = order.authorizations();
    while let Some(a) = authorizations.next().await {
        let mut a = a.expect("authz");
        a.challenge(ChallengeType::Http01)
            .expect("http-01")
            .set_ready()
            .await
            .expect("trigger");
    }
    assert_eq!(
        order.poll_ready(&client::retry()).await.expect("ready"),
        OrderStatus::Ready
    );
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_a_hang_a_failure_and_a_chain_for_the_wrong_key_each_end_as_documented() {
    let Some(pki) = LegacyPki::new() else {
        return;
    };
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(dir.path(), free_port(), None, &pki.profile("2s"));
    let (_etc, config) = harness::config_file(&toml);
    let server = TestServer::start_in(dir, &toml).await;
    let account = client::account(&server.directory("legacy")).await;

    // The documented bad-CSR exit: badCSR, and the order stays ready.
    pki.mode("badcsr");
    let (mut order, result, _) = finalize_once(&account, "refused.legacy.test").await;
    let e = result.expect_err("refused");
    assert_eq!(client::problem_type(&e), "badCSR", "{e}");
    assert!(
        !e.to_string().contains("policy:"),
        "the program's words stay in the log: {e}"
    );
    assert_eq!(
        order.refresh().await.expect("order").status,
        OrderStatus::Ready
    );
    // ... and once the PKI agrees, the same order is finalized.
    pki.mode("sign");
    order.finalize().await.expect("finalized on a second try");
    let chain = order
        .poll_certificate(&client::retry())
        .await
        .expect("issued");
    assert!(chain.contains("BEGIN CERTIFICATE"));

    // A hang: killed at the 2 s deadline; the order is invalid with a
    // generic problem.
    pki.mode("hang");
    let (mut order, result, took) = finalize_once(&account, "hang.legacy.test").await;
    let e = result.expect_err("a hung signer fails");
    assert_eq!(client::problem_type(&e), "serverInternal", "{e}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "killed at the deadline: {took:?}"
    );
    let state = order.refresh().await.expect("order");
    assert_eq!(state.status, OrderStatus::Invalid);
    let problem = state.error.as_ref().expect("the order's error");
    assert_eq!(
        problem.r#type.as_deref(),
        Some("urn:ietf:params:acme:error:serverInternal")
    );

    // A failure: the first line of its stderr is logged, never sent.
    pki.mode("fail");
    let (mut order, result, _) = finalize_once(&account, "fail.legacy.test").await;
    let e = result.expect_err("failed");
    assert!(!e.to_string().contains("hsm-01"), "{e}");
    let state = order.refresh().await.expect("order");
    assert_eq!(state.status, OrderStatus::Invalid);
    assert!(!format!("{:?}", state.error).contains("hsm-01"));

    // A chain for another key (right name, right CA): refused, invalid.
    pki.mode("wrongkey");
    let (mut order, result, _) = finalize_once(&account, "wrong.example.test").await;
    let e = result.expect_err("wrong key");
    assert_eq!(client::problem_type(&e), "serverInternal", "{e}");
    assert_eq!(
        order.refresh().await.expect("order").status,
        OrderStatus::Invalid
    );

    // Each refusal is audited with its real reason, for operators only.
    let audit = harness::run_cli(
        &config,
        &[
            "audit",
            "list",
            "--event",
            "certificate.issue_failed",
            "--json",
        ],
        &[],
    );
    assert_eq!(audit.code, 0, "{audit:?}");
    for reason in [
        "refused this CSR",
        "did not finish within 2s",
        "hsm-01: connection refused",
        "the leaf's public key is not the CSR's",
    ] {
        assert!(
            audit.stdout.contains(reason),
            "{reason:?} not in\n{}",
            audit.stdout
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_while_the_program_signs_leaves_the_order_invalid_not_processing() {
    let Some(pki) = LegacyPki::new() else {
        return;
    };
    let server = TestServer::start(free_port(), None, &pki.profile("4s")).await;
    let account = client::account(&server.directory("legacy")).await;
    pki.mode("hang");
    let mut order = ready_order(&account, "hangup.legacy.test").await;
    let url = order.url().to_owned();
    // The client gives up after half a second: its connection closes.
    let gave_up = tokio::time::timeout(Duration::from_millis(500), order.finalize()).await;
    assert!(gave_up.is_err(), "finalize cannot have answered yet");
    // The order ends invalid (not processing for ever) once the request or
    // the program's deadline is over.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut fetched = account.order(url.clone()).await.expect("order");
        let status = fetched.state().status;
        if status == OrderStatus::Invalid {
            break;
        }
        assert_eq!(status, OrderStatus::Processing);
        assert!(Instant::now() < deadline, "still processing");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_signers_revocation_crl_and_renewal_window_programs_are_used() {
    let Some(pki) = LegacyPki::new() else {
        return;
    };
    let responder = Responder::start().await;
    let server = TestServer::start(responder.port, None, &pki.profile("10s")).await;
    let account = client::account(&server.directory("legacy")).await;
    let (chain, _) = client::issue(&account, &responder, &["ops.legacy.test"]).await;
    let der = ::pem::parse_many(&chain).expect("PEM")[0]
        .contents()
        .to_vec();

    // Renewal information comes from the program.
    let id = CertificateIdentifier::try_from(&CertificateDer::from(der.clone()))
        .expect("openssl's leaves carry an AKI");
    let (info, _) = account.renewal_info(&id).await.expect("renewalInfo");
    assert_eq!(
        info.suggested_window.start,
        ::time::macros::datetime!(2031-01-01 0:00 UTC)
    );

    // Revocation goes through the program (which records the serial).
    account
        .revoke(&RevocationRequest {
            certificate: &CertificateDer::from(der.clone()),
            reason: None,
        })
        .await
        .expect("revoked");
    let (_, leaf) = x509_parser::parse_x509_certificate(&der).expect("leaf");
    let serial = hex::encode(leaf.raw_serial());
    let recorded = std::fs::read_to_string(pki.path("revoked")).expect("the program ran");
    assert_eq!(recorded.trim(), serial);

    // The CRL is the program's DER, signed by the PKI's CA.
    let crl = raw::request(
        "GET",
        &format!("{}/profile/legacy/crl", server.base()),
        None,
        vec![],
    )
    .await;
    assert_eq!(crl.status, 200);
    let (_, parsed) = x509_parser::parse_x509_crl(&crl.body).expect("a DER CRL from the program");
    assert_eq!(parsed.issuer().to_string(), "CN=Legacy PKI test CA");
    server.stop().await;
}

/// A DER TLV with a short-form length (every value here is short).
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let len = u8::try_from(content.len()).expect("short");
    assert!(len < 0x80);
    [&[tag, len][..], content].concat()
}

/// A CSR for `name` (its SAN, no subject) by rcgen, after `tweak`, with
/// extra PKCS #10 `attributes`.
fn rcgen_csr(
    name: &str,
    tweak: impl FnOnce(&mut rcgen::CertificateParams),
    attributes: Vec<rcgen::Attribute>,
) -> Vec<u8> {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).expect("params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    tweak(&mut params);
    params
        .serialize_request_with_attributes(&key, attributes)
        .expect("CSR")
        .der()
        .to_vec()
}

/// A CSR for `name` by the openssl command line, for an RSA key made with
/// `key_options` and signed with `digest`.
fn openssl_csr(dir: &Path, name: &str, key_options: &[&str], digest: &str) -> Vec<u8> {
    let mut genpkey = vec!["genpkey", "-algorithm", "RSA", "-out", "csr-key.pem"];
    genpkey.extend(key_options.iter().flat_map(|o| ["-pkeyopt", o]));
    openssl(dir, &genpkey);
    let san = format!("subjectAltName=DNS:{name}");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            "csr-key.pem",
            digest,
            "-subj",
            "/",
            "-addext",
            &san,
            "-outform",
            "DER",
            "-out",
            "csr.der",
        ],
    );
    std::fs::read(dir.join("csr.der")).expect("csr.der")
}

/// CSRs for `name` asking for more than names and TLS usages, each with
/// what it asks.
fn overreaching_csrs(dir: &Path, name: &str) -> Vec<(&'static str, Vec<u8>)> {
    use rcgen::{DnType, ExtendedKeyUsagePurpose as Eku, KeyUsagePurpose as Ku};
    // A second extensionRequest attribute (its SET of one Extensions)
    // asking for basicConstraints cA TRUE, critical.
    let ca_true = tlv(
        0x30,
        &[
            &[0x06, 0x03, 0x55, 0x1d, 0x13, 0x01, 0x01, 0xff][..],
            &tlv(0x04, &tlv(0x30, &[0x01, 0x01, 0xff])),
        ]
        .concat(),
    );
    let second_request = rcgen::Attribute {
        oid: &[1, 2, 840, 113_549, 1, 9, 14],
        values: tlv(0x31, &tlv(0x30, &ca_true)),
    };
    vec![
        (
            "an O attribute",
            rcgen_csr(
                name,
                |p| p.distinguished_name.push(DnType::OrganizationName, "Evil"),
                vec![],
            ),
        ),
        (
            "an OU attribute",
            rcgen_csr(
                name,
                |p| {
                    p.distinguished_name
                        .push(DnType::OrganizationalUnitName, "Ops")
                },
                vec![],
            ),
        ),
        (
            "codeSigning",
            rcgen_csr(
                name,
                |p| p.extended_key_usages = vec![Eku::ServerAuth, Eku::CodeSigning],
                vec![],
            ),
        ),
        (
            "keyCertSign",
            rcgen_csr(
                name,
                |p| p.key_usages = vec![Ku::DigitalSignature, Ku::KeyCertSign],
                vec![],
            ),
        ),
        (
            "nameConstraints",
            rcgen_csr(
                name,
                |p| {
                    let permitted = tlv(0xa0, &tlv(0x30, &tlv(0x82, b"legacy.test")));
                    p.custom_extensions
                        .push(rcgen::CustomExtension::from_oid_content(
                            &[2, 5, 29, 30],
                            tlv(0x30, &permitted),
                        ));
                },
                vec![],
            ),
        ),
        (
            "basicConstraints CA:TRUE",
            rcgen_csr(
                name,
                |p| p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained),
                vec![],
            ),
        ),
        (
            "two extensionRequest attributes",
            rcgen_csr(name, |_| {}, vec![second_request]),
        ),
        (
            "a SHA-1 signature",
            openssl_csr(dir, name, &["rsa_keygen_bits:2048"], "-sha1"),
        ),
        (
            "an RSA key with exponent 3",
            openssl_csr(
                dir,
                name,
                &["rsa_keygen_bits:2048", "rsa_keygen_pubexp:3"],
                "-sha256",
            ),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csrs_asking_for_more_than_names_and_tls_usages_are_bad_csr_and_the_program_never_runs() {
    let Some(pki) = LegacyPki::new() else {
        return;
    };
    let server = TestServer::start(free_port(), None, &pki.profile("10s")).await;
    let account = client::account(&server.directory("legacy")).await;
    let name = "strict.legacy.test";
    let mut order = ready_order(&account, name).await;
    let work = crate::harness::tempdir();
    for (case, der) in overreaching_csrs(work.path(), name) {
        let e = order.finalize_csr(&der).await.expect_err(case);
        match &e {
            instant_acme::Error::Api(p) => assert_eq!(
                p.r#type.as_deref(),
                Some("urn:ietf:params:acme:error:badCSR"),
                "{case}: {e}"
            ),
            other => panic!("{case}: not a problem document: {other}"),
        }
        assert_eq!(
            order.refresh().await.expect("order").status,
            OrderStatus::Ready,
            "{case}: the order stays ready"
        );
        assert!(
            !pki.path("runs").exists(),
            "{case}: the program ran for a CSR the server refuses"
        );
    }
    // The same order, with a CSR of names alone, is signed by the program:
    // its trace is there when it runs.
    order
        .finalize_csr(&rcgen_csr(name, |_| {}, vec![]))
        .await
        .expect("a plain CSR is signed");
    order
        .poll_certificate(&client::retry())
        .await
        .expect("issued");
    assert_eq!(
        std::fs::read_to_string(pki.path("runs")).expect("runs"),
        "issue\n"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_with_an_extra_purpose_or_an_o_attribute_makes_the_order_invalid_and_is_never_served()
 {
    let Some(pki) = LegacyPki::new() else {
        return;
    };
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(dir.path(), free_port(), None, &pki.profile("10s"));
    let (_etc, config) = harness::config_file(&toml);
    let server = TestServer::start_in(dir, &toml).await;
    let account = client::account(&server.directory("legacy")).await;
    let cases = [
        (
            "extraeku",
            "eku.legacy.test",
            "the leaf's extKeyUsage is serverAuth, codeSigning; the certificate profile's is serverAuth",
        ),
        (
            "organization",
            "org.legacy.test",
            "the leaf's subject has O (2.5.4.10)",
        ),
    ];
    for (mode, name, reason) in cases {
        pki.mode(mode);
        let (mut order, result, _) = finalize_once(&account, name).await;
        let e = result.expect_err(mode);
        // The client gets the generic problem of a failed signer, not the
        // reason.
        assert_eq!(client::problem_type(&e), "serverInternal", "{mode}: {e}");
        assert!(!e.to_string().contains("leaf"), "{mode}: {e}");
        let state = order.refresh().await.expect("order");
        assert_eq!(state.status, OrderStatus::Invalid, "{mode}");
        assert!(state.certificate.is_none(), "{mode}: nothing is served");
        assert!(
            order.poll_certificate(&client::retry()).await.is_err(),
            "{mode}: nothing is served"
        );
        // The operator reads the reason in the audit trail.
        let audit = harness::run_cli(
            &config,
            &[
                "audit",
                "list",
                "--event",
                "certificate.issue_failed",
                "--json",
            ],
            &[],
        );
        assert_eq!(audit.code, 0, "{audit:?}");
        assert!(
            audit.stdout.contains(reason),
            "{reason:?} not in\n{}",
            audit.stdout
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crl_refresh_skips_a_custom_profile_without_a_crl_program_and_fails_nothing() {
    // The periodic refresh (every minute) asked every profile for its CRL,
    // and a signer with none logged an error each time.
    let server = TestServer::start(
        1,
        None,
        "[profiles.default]\n[profiles.legacy.signer]\ntype = \"custom\"\ncommand = \"/bin/true\"\n",
    )
    .await;
    let authority = &server.running().authority();
    assert_eq!(authority.refresh_stale_crls().await, 0, "no profile failed");
    assert!(
        authority.store().crl("default").await.unwrap().is_some(),
        "the embedded CA's CRL is still signed"
    );
    server.stop().await;
}
