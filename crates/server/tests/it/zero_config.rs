//! `acme-proxy serve` with no configuration file, in an empty directory, run
//! as a process: it creates its data directory (SQLite file, self-generated
//! CA with its key 0600) and answers a full issuance by instant-acme.
//!
//! Only the addresses a shared test machine needs are overridden, through
//! the environment: the listener (the default port 14000 may be taken by a
//! suite running beside this one), the http-01 port (80 likewise) and the
//! DNS server that maps test names to 127.0.0.1.

use std::os::unix::fs::PermissionsExt;

use crate::client;
use crate::harness::{Dns, Responder, spawn_binary};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_configuration_answers_a_full_issuance() {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let cwd = tempfile::tempdir().unwrap();
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "starts empty"
    );
    let (_server, directory) = spawn_binary(
        cwd.path(),
        &["serve"],
        &[
            ("ACME_PROXY_LISTEN", "127.0.0.1:0".to_owned()),
            (
                "ACME_PROXY_VALIDATION__HTTP_PORT",
                responder.port.to_string(),
            ),
            (
                "ACME_PROXY_VALIDATION__DNS_RESOLVERS",
                format!("[\"{}\"]", dns.addr),
            ),
        ],
    );
    assert!(
        directory.ends_with("/profile/default/directory"),
        "{directory}"
    );

    let data = cwd.path().join("acme-proxy-data");
    let entries: Vec<String> = std::fs::read_dir(cwd.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        entries.contains(&"acme-proxy-data".to_owned()),
        "{entries:?}"
    );
    assert!(
        data.join("acme-proxy.db").exists(),
        "SQLite file in the data directory"
    );
    let key = data.join("ca/default/ca.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the CA key is private");
    let ca_pem = std::fs::read_to_string(data.join("ca/default/ca.pem")).unwrap();
    let (_, ca) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).unwrap();
    let ca = ca.parse_x509().unwrap();
    assert!(ca.is_ca());
    assert_eq!(
        ca.public_key()
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok()),
        Some(x509_parser::oid_registry::OID_EC_P256),
        "the self-generated CA is ECDSA P-256"
    );

    let account = client::account(&directory).await;
    let (chain, _) = client::issue(&account, &responder, &["zero.example.test"]).await;
    let (_, leaf) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).unwrap();
    let leaf = leaf.parse_x509().unwrap();
    leaf.verify_signature(Some(ca.public_key()))
        .expect("issued by the self-generated CA");
}
