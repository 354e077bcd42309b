//! The admin CLI against the real database of a running server after a real
//! issuance: accounts and orders listed and shown, a certificate revoked
//! (and on the CRL the server serves), deletions refused while something
//! still needs the rows, destructive commands refused without `--yes` when
//! no terminal can confirm, and the documented exit codes.

use instant_acme::{Identifier, NewOrder};

use crate::client;
use crate::harness::{self, CliOutput, Responder, TestServer};

/// Exit codes docs/operating/cli.md documents.
const FAILED: i32 = 1;
const NOT_CONFIRMED: i32 = 3;

/// A server whose default profile bypasses validation, with `extra`
/// settings, the responder its clients answer on, and its configuration
/// file for the admin commands (keep the directory alive).
async fn bypass_server(
    extra: &str,
) -> (TestServer, Responder, tempfile::TempDir, std::path::PathBuf) {
    let dir = crate::harness::tempdir();
    let responder = Responder::start().await;
    let toml = TestServer::config_text(
        dir.path(),
        responder.port,
        None,
        &format!("{extra}[profiles.default]\nbypass = true\n"),
    );
    let (etc, config) = harness::config_file(&toml);
    let server = TestServer::start_in(dir, &toml).await;
    (server, responder, etc, config)
}

fn json(out: &CliOutput) -> serde_json::Value {
    assert_eq!(out.code, 0, "{out:?}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_show_revoke_and_delete_through_the_cli_and_destructive_commands_need_yes() {
    let (server, responder, _etc, config) = bypass_server("").await;
    let cli = |args: &[&str]| harness::run_cli(&config, args, &[("USER", "alice")]);

    let account = client::account(&server.directory("default")).await;
    let account_id = account.id().rsplit('/').next().expect("id").to_owned();
    client::issue(&account, &responder, &["admin.example.test"]).await;

    // Reads: accounts, orders, one of each shown whole.
    let accounts = json(&cli(&["account", "list", "--json"]));
    assert_eq!(accounts[0]["id"], account_id.as_str());
    assert_eq!(accounts[0]["contact"][0], "mailto:ops@example.test");
    let shown = json(&cli(&["account", "show", &account_id, "--json"]));
    assert_eq!(
        (shown["orders"].as_i64(), shown["certificates"].as_i64()),
        (Some(1), Some(1))
    );
    let orders = json(&cli(&["order", "list", "--account", &account_id, "--json"]));
    assert_eq!(orders.as_array().map(Vec::len), Some(1), "{orders:#}");
    assert_eq!(orders[0]["status"], "valid");
    assert_eq!(orders[0]["identifiers"][0], "admin.example.test");
    let order_id = orders[0]["id"].as_str().expect("order id").to_owned();
    let order = json(&cli(&["order", "show", &order_id, "--json"]));
    let serial = order["certificate"]["serial"]
        .as_str()
        .expect("serial")
        .to_owned();
    assert!(order["certificate"]["revoked_at"].is_null());
    // The human table: aligned, no color when piped.
    let table = cli(&["order", "list"]);
    assert_eq!(table.code, 0, "{table:?}");
    assert!(
        table.stdout.starts_with("ID  ") && !table.stdout.contains('\u{1b}'),
        "{table:?}"
    );
    assert!(table.stdout.contains(&order_id) && table.stdout.contains("admin.example.test"));

    // Destructive without --yes and without a terminal: refused, nothing changed.
    let refused = cli(&["order", "revoke", &order_id]);
    assert_eq!(refused.code, NOT_CONFIRMED, "{refused:?}");
    assert!(refused.stderr.contains("--yes"), "{refused:?}");
    let order = json(&cli(&["order", "show", &order_id, "--json"]));
    assert!(order["certificate"]["revoked_at"].is_null(), "{order:#}");

    // With --yes: revoked, audited as the operator, on the served CRL.
    let revoked = cli(&["order", "revoke", &order_id, "--reason", "4", "--yes"]);
    assert_eq!(revoked.code, 0, "{revoked:?}");
    let order = json(&cli(&["order", "show", &order_id, "--json"]));
    assert!(order["certificate"]["revoked_at"].is_string(), "{order:#}");
    assert_eq!(order["certificate"]["revocation_reason"], 4);
    let audit = json(&cli(&[
        "audit",
        "list",
        "--event",
        "certificate.revoked",
        "--json",
    ]));
    assert_eq!(audit[0]["actor"], "operator:alice");
    assert_eq!(audit[0]["serial"], serial.as_str());
    let (status, _, crl) =
        crate::flow::reqwest_get(&format!("{}/profile/default/crl", server.base())).await;
    assert_eq!(status, 200);
    let (_, crl) = x509_parser::parse_x509_crl(&crl).expect("a DER CRL");
    assert!(
        crl.iter_revoked_certificates()
            .any(|r| hex::encode(r.raw_serial()) == serial),
        "the CRL lists the serial revoked from the CLI"
    );
    let again = cli(&["order", "revoke", &order_id, "--yes"]);
    assert_eq!(again.code, FAILED, "{again:?}");
    assert!(again.stderr.contains("already revoked"), "{again:?}");

    // Deletions wait while a certificate has not expired (it is on the CRL).
    let kept = cli(&["order", "delete", &order_id, "--yes"]);
    assert_eq!(kept.code, FAILED, "{kept:?}");
    assert!(kept.stderr.contains("has not expired"), "{kept:?}");
    let kept = cli(&["account", "delete", &account_id, "--yes"]);
    assert_eq!(kept.code, FAILED, "{kept:?}");

    // Deactivation: confirmed, then the account can do nothing more.
    assert_eq!(
        cli(&["account", "deactivate", &account_id]).code,
        NOT_CONFIRMED
    );
    let deactivated = cli(&["account", "deactivate", &account_id, "--yes"]);
    assert_eq!(deactivated.code, 0, "{deactivated:?}");
    let shown = json(&cli(&["account", "show", &account_id, "--json"]));
    assert_eq!(shown["status"], "deactivated");
    let Err(err) = account
        .new_order(&NewOrder::new(&[Identifier::Dns(
            "after.example.test".into(),
        )]))
        .await
    else {
        panic!("a deactivated account orders nothing");
    };
    assert_eq!(client::problem_type(&err), "unauthorized");
    let audit = json(&cli(&[
        "audit",
        "list",
        "--event",
        "account.deactivated",
        "--json",
    ]));
    assert_eq!(audit[0]["actor"], "operator:alice");
    assert_eq!(audit[0]["account"], account_id.as_str());

    // An order without a certificate, then its account, are deleted for good.
    let other = client::account(&server.directory("default")).await;
    let other_id = other.id().rsplit('/').next().expect("id").to_owned();
    other
        .new_order(&NewOrder::new(&[Identifier::Dns(
            "pending.example.test".into(),
        )]))
        .await
        .expect("order");
    let pending = json(&cli(&["order", "list", "--account", &other_id, "--json"]));
    let pending_id = pending[0]["id"].as_str().expect("id").to_owned();
    assert_eq!(cli(&["order", "delete", &pending_id]).code, NOT_CONFIRMED);
    let deleted = cli(&["order", "delete", &pending_id, "--yes"]);
    assert_eq!(deleted.code, 0, "{deleted:?}");
    let gone = cli(&["order", "show", &pending_id]);
    assert_eq!(gone.code, FAILED, "{gone:?}");
    let deleted = cli(&["account", "delete", &other_id, "--yes"]);
    assert_eq!(deleted.code, 0, "{deleted:?}");
    assert_eq!(cli(&["account", "show", &other_id]).code, FAILED);
    let audit = json(&cli(&["audit", "list", "--account", &other_id, "--json"]));
    let events: Vec<&str> = audit
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["event"].as_str())
        .collect();
    assert!(
        events.contains(&"order.deleted") && events.contains(&"account.deleted"),
        "the audit trail outlives what it describes: {events:?}"
    );

    // Two records of used nonces past their expiry: both go, the
    // unexpired ones stay.
    let store = server.running().authority().store().clone();
    let live = store.used_nonce_count().await.expect("count");
    for value in ["expired-nonce-1", "expired-nonce-2"] {
        assert!(store.use_nonce(value, 1).await.expect("insert"));
    }
    let cleanup = cli(&["nonce", "cleanup"]);
    assert_eq!(cleanup.code, 0, "{cleanup:?}");
    assert!(
        cleanup
            .stdout
            .contains("deleted 2 expired used-nonce record"),
        "{cleanup:?}"
    );
    // On SQLite the server's nonces are in its memory: the command says
    // so rather than count a table that does not hold them.
    let claim = if harness::on_postgres() {
        "unexpired remain"
    } else {
        "nonce_store = \"memory\""
    };
    assert!(cleanup.stdout.contains(claim), "{cleanup:?}");
    assert_eq!(store.used_nonce_count().await.expect("count"), live);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_admin_commands_every_audit_counter_equals_the_table_and_actors_name_the_login() {
    let (server, responder, _etc, config) =
        bypass_server("[metrics]\nlisten = \"127.0.0.1:0\"\n").await;
    // As cron or a systemd unit runs it: neither $USER nor $LOGNAME.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(harness::binary())
            .args(args)
            .arg("--config")
            .arg(&config)
            .env_remove("ACME_PROXY_CONFIG")
            .env_remove("USER")
            .env_remove("LOGNAME")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run acme-proxy");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let login = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .expect("id -un")
            .stdout,
    )
    .expect("utf-8")
    .trim()
    .to_owned();

    let account = client::account(&server.directory("default")).await;
    let account_id = account.id().rsplit('/').next().expect("id").to_owned();
    client::issue(&account, &responder, &["counted.example.test"]).await;
    let orders: serde_json::Value =
        serde_json::from_str(&cli(&["order", "list", "--json"])).expect("JSON");
    let order_id = orders[0]["id"].as_str().expect("id").to_owned();
    cli(&[
        "order",
        "revoke",
        &order_id,
        "--reason",
        "superseded",
        "--yes",
    ]);
    cli(&["account", "deactivate", &account_id, "--yes"]);
    let created: serde_json::Value =
        serde_json::from_str(&cli(&["eab", "create", "--json"])).expect("JSON");
    let kid = created["kid"].as_str().expect("kid").to_owned();
    cli(&["eab", "revoke", &kid, "--yes"]);

    // Every row, whoever wrote it, is in the counters the server exports.
    let metrics_url = format!(
        "http://{}/metrics",
        server.running().metrics_addr.expect("a metrics listener")
    );
    let (status, _, body) = crate::flow::reqwest_get(&metrics_url).await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).expect("UTF-8");
    let (_, samples) = crate::metrics::parse(&text);
    crate::metrics::assert_audit_counters_match_the_table(&server, &samples).await;
    let rows = server
        .running()
        .authority()
        .store()
        .audit_recent(None, 10_000)
        .await
        .expect("audit");
    for event in [
        "certificate.revoked",
        "account.deactivated",
        "eab.created",
        "eab.revoked",
    ] {
        let row = rows
            .iter()
            .find(|r| r.event == event)
            .unwrap_or_else(|| panic!("no {event} row"));
        assert_eq!(row.actor, format!("operator:{login}"), "{event}");
    }
    // A second scrape counts nothing twice.
    let (_, _, again) = crate::flow::reqwest_get(&metrics_url).await;
    let (_, again) = crate::metrics::parse(&String::from_utf8(again).expect("UTF-8"));
    let revoked = "acme_proxy_audit_events_total{event=\"certificate.revoked\",outcome=\"success\",profile=\"default\"}";
    assert_eq!(again.get(revoked), Some(&1.0), "{again:?}");
    server.stop().await;
}
