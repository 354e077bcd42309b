//! The embedded CA's key in a PKCS#11 token: SoftHSM2 from Debian, the key
//! generated inside the token by pkcs11-tool (it never exists anywhere
//! else), the CA certificate made for the token's public key by a test
//! root. A full issuance signs with the token; a CA certificate whose key is
//! not the token's stops start-up; a token that stops answering fails the
//! finalize at its deadline while the server goes on serving.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use instant_acme::{Account, ChallengeType, NewOrder, Order, OrderStatus};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PublicKeyData, SubjectPublicKeyInfo,
};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::client;
use crate::harness::{self, Responder};

const MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

/// A SoftHSM2 token of its own (its own configuration and token
/// directory), with an EC P-256 key pair generated inside it.
struct Token {
    dir: tempfile::TempDir,
}

impl Token {
    fn new() -> Option<Token> {
        if !harness::require_program("softhsm2-util") || !harness::require_program("pkcs11-tool") {
            return None;
        }
        let dir = crate::harness::tempdir();
        std::fs::create_dir(dir.path().join("tokens")).expect("token dir");
        std::fs::write(
            dir.path().join("softhsm2.conf"),
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                dir.path().join("tokens").display()
            ),
        )
        .expect("softhsm2.conf");
        std::fs::write(dir.path().join("pin"), "2222\n").expect("pin file");
        let token = Token { dir };
        token.run(
            "softhsm2-util",
            &[
                "--init-token",
                "--free",
                "--label",
                "acme-ca",
                "--so-pin",
                "1111",
                "--pin",
                "2222",
            ],
        );
        token.run(
            "pkcs11-tool",
            &[
                "--module",
                MODULE,
                "--token-label",
                "acme-ca",
                "--login",
                "--pin",
                "2222",
                "--keypairgen",
                "--key-type",
                "EC:prime256v1",
                "--label",
                "ca-key",
                "--id",
                "01",
            ],
        );
        token.run(
            "pkcs11-tool",
            &[
                "--module",
                MODULE,
                "--token-label",
                "acme-ca",
                "--read-object",
                "--type",
                "pubkey",
                "--label",
                "ca-key",
                "-o",
                "pub.der",
            ],
        );
        Some(token)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn conf(&self) -> String {
        self.path("softhsm2.conf").display().to_string()
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = Command::new(program)
            .args(args)
            .current_dir(self.dir.path())
            .env("SOFTHSM2_CONF", self.conf())
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The token's public key (SubjectPublicKeyInfo DER).
    fn public_key(&self) -> Vec<u8> {
        std::fs::read(self.path("pub.der")).expect("pub.der")
    }

    /// Write locks on every file of the token, of the kind SoftHSM2 takes
    /// itself (fcntl): while they are held, a SoftHSM2 in another process
    /// blocks inside its next signing call, waiting for them — a token
    /// that does not answer. Dropped, that call goes on.
    fn hang(&self) -> Hang {
        let mut files = Vec::new();
        for token in std::fs::read_dir(self.path("tokens")).expect("tokens") {
            for entry in std::fs::read_dir(token.expect("token").path()).expect("token dir") {
                let path = entry.expect("token file").path();
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .expect("token file");
                rustix::fs::fcntl_lock(&file, rustix::fs::FlockOperation::LockExclusive)
                    .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
                files.push(file);
            }
        }
        assert!(!files.is_empty(), "the token has files");
        Hang { _locked: files }
    }
}

/// The token's files, locked: the locks go when the files are closed.
struct Hang {
    _locked: Vec<std::fs::File>,
}

/// A test root, and an intermediate CA certificate for `spki` signed by it:
/// (intermediate PEM, root PEM).
fn intermediate_for(spki: &[u8]) -> (String, String) {
    let root_key = KeyPair::generate().expect("root key");
    let mut root = CertificateParams::new(Vec::<String>::new()).expect("params");
    root.distinguished_name
        .push(DnType::CommonName, "HSM test root");
    root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    root.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let root_cert = root.self_signed(&root_key).expect("root");
    let issuer = Issuer::new(root, root_key);
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.distinguished_name
        .push(DnType::CommonName, "acme-proxy CA in an HSM");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.use_authority_key_identifier_extension = true;
    let spki = SubjectPublicKeyInfo::from_der(spki).expect("token public key");
    let ca_cert = ca.signed_by(&spki, &issuer).expect("intermediate");
    (ca_cert.pem(), root_cert.pem())
}

/// `pkcs11` is added to the `[profiles.default.signer.pkcs11]` table.
fn config(
    dir: &Path,
    token: &Token,
    ca_pem: &Path,
    chain: &Path,
    http_port: u16,
    pkcs11: &str,
) -> PathBuf {
    let text = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[validation]\nhttp_port = {http_port}\nallow_networks = [\"127.0.0.1\"]\n\
         [profiles.default]\nbypass = true\n[profiles.default.signer]\ntype = \"local_ca\"\n\
         ca_cert = \"{}\"\nchain = \"{}\"\n[profiles.default.signer.pkcs11]\nmodule = \"{MODULE}\"\n\
         token_label = \"acme-ca\"\nkey_label = \"ca-key\"\npin_file = \"{}\"\n{pkcs11}\n",
        dir.join("data").display(),
        ca_pem.display(),
        chain.display(),
        token.path("pin").display()
    );
    let path = dir.join("acme-proxy.toml");
    std::fs::write(&path, text).expect("config");
    path
}

/// A token, a CA certificate for its key (and the test root) in a new
/// directory, and a configuration that signs with them.
struct Setup {
    token: Token,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Setup {
    /// `pkcs11` as in [`config`]; None where the tools are missing (only
    /// outside CI).
    fn new(http_port: u16, pkcs11: &str) -> Option<Setup> {
        Self::with_ca_key(None, http_port, pkcs11)
    }

    /// [`Setup::new`], with the CA certificate made for `spki` if given
    /// instead of the token's key.
    fn with_ca_key(spki: Option<&[u8]>, http_port: u16, pkcs11: &str) -> Option<Setup> {
        let token = Token::new()?;
        let (ca_pem, root_pem) = intermediate_for(spki.unwrap_or(&token.public_key()));
        let dir = crate::harness::tempdir();
        std::fs::write(dir.path().join("ca.pem"), &ca_pem).expect("ca.pem");
        std::fs::write(dir.path().join("root.pem"), &root_pem).expect("root.pem");
        let config = config(
            dir.path(),
            &token,
            &dir.path().join("ca.pem"),
            &dir.path().join("root.pem"),
            http_port,
            pkcs11,
        );
        Some(Setup { token, dir, config })
    }

    fn config(&self) -> &str {
        self.config.to_str().expect("utf-8")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_ca_signs_with_a_key_that_exists_only_in_a_softhsm2_token() {
    let responder = Responder::start().await;
    let Some(setup) = Setup::new(responder.port, "") else {
        return;
    };
    let token = &setup.token;
    let (_server, directory) = harness::spawn_binary(
        setup.dir.path(),
        &["serve", "--config", setup.config()],
        &[("SOFTHSM2_CONF", token.conf())],
    );
    let account = client::account(&directory).await;
    let (chain, _) = client::issue(&account, &responder, &["hsm.example.test"]).await;

    // The leaf is signed by the CA certificate's key — the token's.
    let blocks = ::pem::parse_many(&chain).expect("PEM chain");
    assert_eq!(blocks.len(), 3, "leaf, the CA, the root");
    let (_, leaf) = X509Certificate::from_der(blocks[0].contents()).expect("leaf");
    let (_, ca) = X509Certificate::from_der(blocks[1].contents()).expect("CA");
    assert_eq!(
        ca.public_key().raw,
        token.public_key().as_slice(),
        "the CA's key is the token's"
    );
    leaf.verify_signature(Some(ca.public_key()))
        .expect("the leaf verifies with the token's public key");
    assert_eq!(leaf.issuer(), ca.subject());

    // The CRL is signed in the token too.
    let base = directory.trim_end_matches("/directory");
    let crl = crate::raw::request("GET", &format!("{base}/crl"), None, vec![]).await;
    assert_eq!(crl.status, 200);
    let (_, crl) = x509_parser::parse_x509_crl(&crl.body).expect("CRL");
    crl.verify_signature(ca.public_key())
        .expect("the CRL verifies with the token's public key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_certificate_whose_key_is_not_the_tokens_stops_start_up() {
    // A CA certificate for some other key.
    let other = KeyPair::generate().expect("key");
    let Some(setup) = Setup::with_ca_key(
        Some(&other.subject_public_key_info()),
        harness::free_port(),
        "",
    ) else {
        return;
    };
    let out = Command::new(harness::binary())
        .args(["serve", "--config", setup.config()])
        .env("SOFTHSM2_CONF", setup.token.conf())
        .output()
        .expect("run acme-proxy");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not belong to ca_cert"), "{stderr}");
}

/// An order for `name`, ready to be finalized (the profile bypasses
/// validation).
async fn ready_order(account: &Account, name: &str) -> Order {
    let mut order = account
        .new_order(&NewOrder::new(&[instant_acme::Identifier::Dns(
            name.to_owned(),
        )]))
        .await
        .expect("new order");
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.expect("authorization");
        let mut challenge = authz
            .challenge(ChallengeType::Http01)
            .expect("http-01 offered");
        challenge.set_ready().await.expect("challenge triggered");
    }
    let status = order
        .poll_ready(&client::retry())
        .await
        .expect("order settles");
    assert_eq!(status, OrderStatus::Ready);
    order
}

/// GET /health and HEAD newNonce, each answered within 5 s.
async fn still_serving(base: &str, directory: &serde_json::Value) {
    let within = Duration::from_secs(5);
    let health = tokio::time::timeout(
        within,
        crate::raw::request("GET", &format!("{base}/health"), None, vec![]),
    )
    .await
    .expect("/health is answered while a signing hangs in the token");
    assert_eq!(health.status, 200);
    tokio::time::timeout(within, crate::raw::nonce(directory))
        .await
        .expect("newNonce is answered while a signing hangs in the token");
}

// The server runs one async worker (TOKIO_WORKER_THREADS=1): a signing
// blocking it in the module would leave no thread for any other request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_stops_answering_fails_the_finalize_at_its_timeout_while_the_server_keeps_serving()
 {
    let Some(setup) = Setup::new(harness::free_port(), "timeout = \"1s\"") else {
        return;
    };
    let (token, dir) = (&setup.token, &setup.dir);
    let (_server, directory_url) = harness::spawn_binary(
        dir.path(),
        &["serve", "--config", setup.config()],
        &[
            ("SOFTHSM2_CONF", token.conf()),
            ("TOKIO_WORKER_THREADS", "1".to_owned()),
        ],
    );
    let base = directory_url.trim_end_matches("/profile/default/directory");
    let directory = crate::raw::directory(&directory_url).await;
    let log = || std::fs::read_to_string(dir.path().join("acme-proxy.log")).expect("log");
    let account = client::account(&directory_url).await;
    let mut order = ready_order(&account, "stuck.example.test").await;

    let hang = token.hang();
    let finalize = tokio::spawn(async move {
        let result = order.finalize().await;
        (order, result)
    });
    // Other requests are answered for as long as the finalize waits for
    // the token (at least its 1 s deadline).
    let mut served = 0;
    while !finalize.is_finished() {
        still_serving(base, &directory).await;
        served += 1;
    }
    let (mut order, result) = finalize.await.expect("finalize task");
    assert!(served > 0);
    let err = result.expect_err("the finalize fails once the token's deadline has passed");
    assert_eq!(client::problem_type(&err), "serverInternal", "{err}");
    let text = log();
    assert!(
        text.contains("the token did not answer within 1s"),
        "the log says why:\n{text}"
    );
    // Nothing was issued: the order can be finalized again.
    let state = order.refresh().await.expect("order");
    assert_eq!(state.status, OrderStatus::Ready);

    // The call is still stuck in the module, holding the session: the
    // next signing waits behind it for its own deadline only, and fails.
    let err = order
        .finalize()
        .await
        .expect_err("a finalize behind the hung signing fails at its deadline");
    assert_eq!(client::problem_type(&err), "serverInternal", "{err}");
    still_serving(base, &directory).await;
    let text = log();
    assert!(
        text.contains("the token was still busy with an earlier signing"),
        "the log says why:\n{text}"
    );

    // The token answers again: the stuck call returns (its certificate is
    // discarded) and the next finalize signs.
    drop(hang);
    order
        .finalize()
        .await
        .expect("finalize once the token answers");
    let chain = order
        .poll_certificate(&client::retry())
        .await
        .expect("certificate");
    let blocks = ::pem::parse_many(&chain).expect("PEM chain");
    let (_, leaf) = X509Certificate::from_der(blocks[0].contents()).expect("leaf");
    let (_, ca) = X509Certificate::from_der(blocks[1].contents()).expect("CA");
    leaf.verify_signature(Some(ca.public_key()))
        .expect("the leaf verifies with the token's public key");
    let text = log();
    assert!(
        text.contains("the token answered after the deadline"),
        "the stuck call returned once the token answered:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_while_the_token_does_not_answer_is_refused_at_its_timeout_and_the_next_applies() {
    let Some(setup) = Setup::new(harness::free_port(), "timeout = \"1s\"") else {
        return;
    };
    let (token, dir) = (&setup.token, &setup.dir);
    let (server, directory_url) = harness::spawn_binary(
        dir.path(),
        &["serve", "--config", setup.config()],
        &[("SOFTHSM2_CONF", token.conf())],
    );
    let pid = server.0.id();
    let base = directory_url.trim_end_matches("/profile/default/directory");
    let directory = crate::raw::directory(&directory_url).await;
    let log = dir.path().join("acme-proxy.log");

    // Each reload opens the key again (a session, a login, a test
    // signature): with the token not answering, the reload is refused at
    // twice the token's timeout, and the running generation serves on.
    let hang = token.hang();
    crate::reload::hangup_and_wait(pid, &log, "configuration not reloaded", 1);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        text.contains("the token did not answer within 2s"),
        "the refusal says why:\n{text}"
    );
    still_serving(base, &directory).await;
    // The token answers again: the next SIGHUP is not stuck behind the
    // first, and applies.
    drop(hang);
    crate::reload::hangup_and_wait(pid, &log, "configuration reloaded", 1);
    still_serving(base, &directory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_does_not_answer_at_start_up_stops_it_at_its_timeout_saying_why() {
    let Some(setup) = Setup::new(harness::free_port(), "timeout = \"1s\"") else {
        return;
    };
    let hang = setup.token.hang();
    let mut child = Command::new(harness::binary())
        .args(["serve", "--config", setup.config()])
        .env("SOFTHSM2_CONF", setup.token.conf())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run acme-proxy");
    // The call stuck in the module must not keep the process from ending.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("acme-proxy did not exit while the token hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    drop(hang);
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(
        stderr.contains("the token did not answer within 2s"),
        "{stderr}"
    );
}
