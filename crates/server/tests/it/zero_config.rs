//! `acme-proxy serve` with no configuration file, in an empty directory, run
//! as a process: it creates its data directory (SQLite file, self-generated
//! CA with its key 0600) and answers a full issuance by instant-acme.
//!
//! Only the addresses a shared test machine needs are overridden, through
//! the environment: the listener (the default port 14000 may be taken by a
//! suite running beside this one), the http-01 port (80 likewise), the
//! DNS server that maps test names to 127.0.0.1, and that address allowed
//! to validation.

use std::os::unix::fs::PermissionsExt;

use crate::client;
use crate::harness::{Dns, Responder, not_private, spawn_binary, under_umask_022};

/// The environment overrides of a shared test machine (see above).
fn overrides(dns: &Dns, responder: &Responder) -> Vec<(&'static str, String)> {
    vec![
        ("ACME_PROXY_LISTEN", "127.0.0.1:0".to_owned()),
        (
            "ACME_PROXY_VALIDATION__HTTP_PORT",
            responder.port.to_string(),
        ),
        (
            "ACME_PROXY_VALIDATION__DNS_RESOLVERS",
            format!("[\"{}\"]", dns.addr),
        ),
        // The responder listens on loopback, refused by default.
        (
            "ACME_PROXY_VALIDATION__ALLOW_NETWORKS",
            "[\"127.0.0.1\"]".to_owned(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_configuration_answers_a_full_issuance() {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let cwd = crate::harness::tempdir();
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "starts empty"
    );
    let (_server, directory) = spawn_binary(cwd.path(), &["serve"], &overrides(&dns, &responder));
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

/// The data directory holds the database (with EAB MAC keys) and the CA
/// key: under `umask 022` every file of it is still 0600 and every
/// directory 0700, and a database opened to others by hand stops the next
/// start with the `chmod` that closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_every_file_of_its_data_directory_private_and_refuses_to_start_on_an_open_database()
 {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let cwd = crate::harness::tempdir();
    let env = overrides(&dns, &responder);
    let (server, directory) = spawn_binary(cwd.path(), &["serve"], &env);
    let account = client::account(&directory).await;
    client::issue(&account, &responder, &["private.example.test"]).await;
    let data = cwd.path().join("acme-proxy-data");
    let db = data.join("acme-proxy.db");
    assert!(
        std::path::PathBuf::from(format!("{}-wal", db.display())).exists(),
        "the WAL is there to be checked"
    );
    assert_eq!(not_private(&data), vec![]);
    drop(server);

    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = under_umask_022()
        .arg("serve")
        .current_dir(cwd.path())
        .env_remove("ACME_PROXY_CONFIG")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // The data directory is relative (the default), and so is the path.
    assert!(
        stderr.contains("run: chmod 600 'acme-proxy-data/acme-proxy.db'"),
        "{stderr}"
    );
}
