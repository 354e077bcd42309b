//! `[policy]` at its three stages, against the real binary and clients:
//! lego through HAProxy (Debian's, its connections to the server made
//! from this test's own loopback address, so the server sees a second
//! client address) and straight from 127.0.0.1; in process, the exact
//! problem documents, the reload that makes finalize refuse, warn mode,
//! and a check program that cannot answer.

use serde_json::json;

use crate::clients::{leaf, lego_http_run, run};
use crate::concurrency::{csr_for, ready_order};
use crate::harness::{self, Dns, TestServer};
use crate::raw::{self, Acct, Key};

/// The policy of the client tests: the lab network (this test's own
/// loopback address, which HAProxy's connections come from) only, and no
/// names of another team's domain.
fn lab_policy(lab: &str) -> String {
    format!(
        r#"
[policy.checks.lab_network]
type = "client_ip"
networks = ["{lab}/32"]

[policy.checks.other_team]
type = "identifiers"
allow = ["*.other.test"]

[[policy.rules]]
name = "lab-hosts-only"
stages = ["connection"]
when = "not lab_network"
then = "deny"
message = "this CA serves the lab network only"

[[policy.rules]]
name = "not-other-teams-names"
when = "other_team"
then = "deny"
message = "other.test belongs to another team's CA"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lego_is_served_from_a_permitted_address_and_refused_from_another_with_the_rules_message() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("lego") || !harness::require_program("haproxy") {
        return;
    }
    let lab = harness::own_host().to_string();
    let at = harness::own_addr();
    let front = harness::own_addr();
    let listen = harness::own_addr();
    let dir = harness::tempdir();
    let text = TestServer::config_text(
        &dir.path().join("data"),
        at.port(),
        Some(&dns),
        &lab_policy(&lab),
    )
    .replacen(
        "listen = \"127.0.0.1:0\"",
        &format!("public_url = \"http://{front}\"\nlisten = \"{listen}\""),
        1,
    )
    .replacen("timeout = \"5s\"", "timeout = \"10s\"", 1);
    let config = dir.path().join("acme-proxy.toml");
    std::fs::write(&config, &text).expect("write config");
    let config_arg = config.to_str().expect("utf-8").to_owned();
    let (_server, _) = harness::spawn_binary(dir.path(), &["serve", "--config", &config_arg], &[]);
    let _haproxy = harness::start_haproxy(
        dir.path(),
        front,
        "server",
        &format!("    server s {listen} source {lab}\n"),
    );

    // Through HAProxy, from the lab address: issued.
    let home = harness::tempdir();
    let name = "host1.lab.test";
    let ran = run(
        "lego",
        lego_http_run(
            &format!("http://{front}/profile/default/directory"),
            home.path(),
            at,
            name,
        ),
        home.path().to_path_buf(),
    )
    .await;
    assert!(ran.success(), "lego from the lab address\n{}", ran.report());
    let cert = leaf(
        &home.path().join("certificates").join(format!("{name}.crt")),
        &|| ran.report(),
    );
    assert_eq!(cert.sans, vec![name.to_owned()]);

    // Straight to the server, from 127.0.0.1: the directory is refused.
    let direct = harness::tempdir();
    let ran = run(
        "lego",
        lego_http_run(
            &format!("http://{listen}/profile/default/directory"),
            direct.path(),
            at,
            "host2.lab.test",
        ),
        direct.path().to_path_buf(),
    )
    .await;
    assert!(
        !ran.success(),
        "lego from 127.0.0.1 was served\n{}",
        ran.report()
    );
    let said = ran.report();
    assert!(
        said.contains("unauthorized") && said.contains("this CA serves the lab network only"),
        "lego reports the rule's message\n{said}"
    );

    // From the lab, one name of another team's among permitted ones: that
    // one is refused.
    let mut args = lego_http_run(
        &format!("http://{front}/profile/default/directory"),
        home.path(),
        at,
        "host3.lab.test",
    );
    let run_at = args.len() - 1;
    args.splice(
        run_at..run_at,
        ["-d".to_owned(), "www.other.test".to_owned()],
    );
    let ran = run("lego", args, home.path().to_path_buf()).await;
    assert!(
        !ran.success(),
        "lego got another team's name\n{}",
        ran.report()
    );
    let said = ran.report();
    assert!(
        said.contains("rejectedIdentifier")
            && said.contains("other.test belongs to another team's CA"),
        "lego reports the refused identifier\n{said}"
    );

    // The audit trail has the connection's refusal with its rule, checks
    // and address.
    let out = harness::run_cli(
        &config,
        &["audit", "list", "--event", "policy.refused", "--json"],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows: serde_json::Value = serde_json::from_str(&out.stdout).expect("audit JSON");
    let row = rows
        .as_array()
        .and_then(|r| r.first())
        .unwrap_or_else(|| panic!("a policy.refused row: {}", out.stdout));
    assert_eq!(row["client_ip"], "127.0.0.1", "{row}");
    assert_eq!(
        row["detail"], "policy deny at connection: rule lab-hosts-only; checks: lab_network=false",
        "{row}"
    );
    let out = harness::run_cli(
        &config,
        &["audit", "list", "--event", "order.refused", "--json"],
        &[],
    );
    assert!(
        out.stdout
            .contains("rule not-other-teams-names; checks: other_team=true"),
        "the order's refusal names the rule\n{}",
        out.stdout
    );

    // `policy explain` says what the server did, for each client.
    let explain = |client: &str, names: &[&str]| {
        let mut args = vec![
            "policy",
            "explain",
            "--profile",
            "default",
            "--client-ip",
            client,
        ];
        for n in names {
            args.extend(["--identifier", n]);
        }
        harness::run_cli(&config, &args, &[])
    };
    let out = explain("127.0.0.1", &["host2.lab.test"]);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains(
            "connection: deny: this CA serves the lab network only (rule lab-hosts-only)"
        ) && out.stdout.ends_with("decision: refused\n"),
        "{}",
        out.stdout
    );
    let out = explain(&lab, &[name]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.ends_with("decision: allowed\n"),
        "{}",
        out.stdout
    );
    let out = explain(&lab, &["host3.lab.test", "www.other.test"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stdout.contains("new_order www.other.test: deny: other.test belongs to another team's CA (rule not-other-teams-names)")
            && out.stdout.contains("new_order host3.lab.test: allow (rule default)"),
        "{}",
        out.stdout
    );
}

/// Asserts that `authority`'s metrics have each of `lines`.
async fn assert_counted(authority: &acme_proxy::authority::Authority, lines: &[&str]) {
    let metrics = authority.render_metrics().await;
    for line in lines {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

/// A bypass profile with `extra` policy, in process.
async fn bypass_server(extra: &str) -> TestServer {
    TestServer::start(
        1,
        None,
        &format!("[profiles.default]\nbypass = true\n{extra}"),
    )
    .await
}

const OTHER_TEAM: &str = r#"
[policy.checks.other_team]
type = "identifiers"
allow = ["*.other.test"]

[[policy.rules]]
name = "not-other-teams-names"
when = "other_team"
then = "deny"
message = "other.test belongs to another team's CA"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_identifier_among_permitted_ones_is_the_only_subproblem_and_is_audited() {
    let server = bypass_server(OTHER_TEAM).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let r = acct
        .post(
            &dir,
            dir["newOrder"].as_str().unwrap(),
            Some(&json!({"identifiers": [
                {"type": "dns", "value": "a.lab.test"},
                {"type": "dns", "value": "www.other.test"},
                {"type": "dns", "value": "b.lab.test"},
            ]})),
        )
        .await;
    r.assert_refused(
        403,
        "rejectedIdentifier",
        "newOrder with another team's name",
    );
    assert_eq!(
        r.json()["subproblems"],
        json!([{
            "type": "urn:ietf:params:acme:error:rejectedIdentifier",
            "detail": "other.test belongs to another team's CA",
            "identifier": {"type": "dns", "value": "www.other.test"},
        }])
    );
    let authority = &server.running().authority();
    let rows = authority
        .store()
        .audit_recent(Some("order.refused"), 1)
        .await
        .expect("audit");
    assert!(
        rows[0].detail.as_deref().is_some_and(|d| d.contains(
            "www.other.test: policy deny at new_order: rule not-other-teams-names; checks: other_team=true"
        )),
        "{:?}",
        rows[0].detail
    );
    assert_counted(authority, &[
        "acme_proxy_policy_decisions_total{stage=\"new_order\",rule=\"not-other-teams-names\",decision=\"deny\"} 1",
        "acme_proxy_policy_decisions_total{stage=\"new_order\",rule=\"default\",decision=\"allow\"} 2",
    ])
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reload_finalize_refuses_a_name_with_bad_csr_and_warn_mode_lets_it_through() {
    let data = harness::tempdir();
    let base = TestServer::config_text(data.path(), 1, None, "[profiles.default]\nbypass = true\n");
    let server = TestServer::start_in(harness::tempdir(), &base).await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let name = "www.other.test";
    let (order_url, finalize) = ready_order(&dir, &acct, name).await;
    let reload = |extra: &str| {
        acme_proxy::config::Config::from_toml(&format!("{base}{extra}")).expect("config")
    };
    server
        .running()
        .reload(reload(OTHER_TEAM))
        .await
        .expect("reloaded");
    let r = acct
        .post(&dir, &finalize, Some(&json!({"csr": csr_for(name)})))
        .await;
    r.assert_refused(400, "badCSR", "finalize of a name the policy now refuses");
    assert_eq!(
        r.json()["detail"],
        "the policy refuses a certificate for www.other.test (other.test belongs to another team's CA)"
    );
    let order = acct.post(&dir, &order_url, None).await.json();
    assert_eq!(
        order["status"], "ready",
        "a refused CSR leaves the order ready"
    );

    // The same rule in warn mode: issued, and the would-be refusal kept.
    server
        .running()
        .reload(reload(
            &OTHER_TEAM.replace("then = \"deny\"", "then = \"deny\"\nmode = \"warn\""),
        ))
        .await
        .expect("reloaded");
    let r = acct
        .post(&dir, &finalize, Some(&json!({"csr": csr_for(name)})))
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["status"], "valid");
    let authority = server.running().authority().clone();
    let rows = authority
        .store()
        .audit_recent(Some("policy.warned"), 5)
        .await
        .expect("audit");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].outcome, "success");
    assert_eq!(rows[0].identifiers.len(), 1);
    assert_eq!(rows[0].identifiers[0].value, name);
    assert_eq!(
        rows[0].detail.as_deref(),
        Some(
            "policy allow (rule not-other-teams-names in warn mode would deny) at finalize: rule not-other-teams-names; checks: other_team=true"
        )
    );
    assert_counted(&server.running().authority(), &["acme_proxy_policy_decisions_total{stage=\"finalize\",rule=\"not-other-teams-names\",decision=\"warn\"} 1"]).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_program_that_cannot_answer_gets_503_with_retry_after_and_the_same_request_passes_once_it_can()
 {
    use std::os::unix::fs::PermissionsExt;
    let tools = harness::tempdir();
    let down = tools.path().join("down");
    let program = tools.path().join("approve");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\ncat >/dev/null\nif [ -e {} ]; then echo 'approvals database unreachable' >&2; exit 3; fi\nexit 0\n",
            down.display()
        ),
    )
    .expect("write program");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let server = bypass_server(&format!(
        r#"
[policy.checks.approved]
type = "program"
command = "{}"

[[policy.rules]]
name = "needs-approval"
when = "not approved"
then = "deny"
message = "not approved"
"#,
        program.display()
    ))
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    let acct = Acct::create(&dir, Key::p256()).await;
    let new_order = json!({"identifiers": [{"type": "dns", "value": "a.lab.test"}]});

    std::fs::write(&down, "").expect("down");
    let r = acct
        .post(&dir, dir["newOrder"].as_str().unwrap(), Some(&new_order))
        .await;
    r.assert_refused(
        503,
        "serverInternal",
        "newOrder while the program cannot answer",
    );
    assert_eq!(
        r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("10")
    );
    let rows = server
        .running()
        .authority()
        .store()
        .audit_recent(Some("order.refused"), 1)
        .await
        .expect("audit");
    assert_eq!(rows[0].outcome, "failure");
    let detail = rows[0].detail.clone().unwrap_or_default();
    assert!(
        detail.contains("policy undecided at new_order: rule needs-approval; checks: approved=undecided (the program exited with 3: approvals database unreachable)"),
        "{detail}"
    );
    std::fs::remove_file(&down).expect("up");
    let r = acct
        .post(&dir, dir["newOrder"].as_str().unwrap(), Some(&new_order))
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));

    // At finalize: the order stays ready while the program cannot answer.
    let (order_url, finalize) = ready_order(&dir, &acct, "b.lab.test").await;
    std::fs::write(&down, "").expect("down");
    let r = acct
        .post(
            &dir,
            &finalize,
            Some(&json!({"csr": csr_for("b.lab.test")})),
        )
        .await;
    r.assert_refused(
        503,
        "serverInternal",
        "finalize while the program cannot answer",
    );
    let order = acct.post(&dir, &order_url, None).await.json();
    assert_eq!(order["status"], "ready");
    std::fs::remove_file(&down).expect("up");
    let r = acct
        .post(
            &dir,
            &finalize,
            Some(&json!({"csr": csr_for("b.lab.test")})),
        )
        .await;
    assert_eq!(
        r.json()["status"],
        "valid",
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    server.stop().await;
}

#[test]
fn config_check_refuses_a_rule_whose_check_cannot_run_at_its_stage() {
    let (_dir, config) = harness::config_file(
        "[profiles.default]\n[policy.checks.names]\ntype = \"identifiers\"\nallow = [\"*.lab.test\"]\n[[policy.rules]]\nname = \"early\"\nstages = [\"connection\"]\nwhen = \"names\"\nthen = \"deny\"\n",
    );
    let out = harness::run_cli(&config, &["config", "check"], &[]);
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("policy.rules[0] (\"early\"): the check \"names\" (identifiers) cannot run at stage connection: no identifier is known before a newOrder is read; take connection out of this rule's stages"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_stage_gates_every_spelling_of_a_profile_but_not_its_crl_and_audits_once_a_minute()
 {
    use std::os::unix::fs::PermissionsExt;
    let tools = harness::tempdir();
    let program = tools.path().join("unsure");
    std::fs::write(&program, "#!/bin/sh\ncat >/dev/null\nexit 3\n").expect("write program");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let server = TestServer::start(
        1,
        None,
        &format!(
            r#"
[profiles.default]
[profiles.closed]
[profiles.unsure]

[policy.checks.closed]
type = "path"
profiles = ["closed"]

[policy.checks.unsure_path]
type = "path"
profiles = ["unsure"]

[policy.checks.unsure]
type = "program"
command = "{}"

[[policy.rules]]
name = "closed-to-all"
stages = ["connection"]
when = "closed"
then = "deny"
message = "this profile is closed"

[[policy.rules]]
name = "ask-the-program"
stages = ["connection"]
when = "unsure_path and not unsure"
then = "deny"

[policy.checks.default_path]
type = "path"
profiles = ["default"]

[[policy.rules]]
name = "watch-default"
stages = ["connection"]
when = "default_path"
then = "deny"
mode = "warn"
"#,
            program.display()
        ),
    )
    .await;
    let base = server.base().to_owned();
    let get = |path: &str| {
        let url = format!("{base}{path}");
        async move { raw::request("GET", &url, None, Vec::new()).await }
    };
    // Spelled plainly or percent-encoded, as the router decodes it.
    for path in ["/profile/closed/directory", "/profile/%63losed/directory"] {
        let r = get(path).await;
        assert_eq!(
            r.status,
            403,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.problem(), "unauthorized", "{path}");
        assert_eq!(r.json()["detail"], "this profile is closed");
        assert!(r.nonce().is_none(), "a refused client gets no nonce");
    }
    // A warn rule sees every request of the clients it would refuse: one
    // row a minute, each counted.
    for _ in 0..2 {
        assert_eq!(get("/profile/default/directory").await.status, 200);
    }
    // Relying parties anywhere fetch the CRL and the CA certificate.
    assert_eq!(get("/profile/closed/crl").await.status, 200);
    assert_eq!(get("/profile/closed/ca.pem").await.status, 200);
    // A program that cannot answer: 503, Retry-After, an undecided row.
    let r = get("/profile/unsure/new-nonce").await;
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("10")
    );
    let store = server.running().authority().store().clone();
    let undecided = store
        .audit_recent(Some("policy.undecided"), 10)
        .await
        .expect("audit");
    assert_eq!(undecided.len(), 1, "{undecided:?}");
    assert_eq!(undecided[0].outcome, "failure");
    assert_eq!(
        undecided[0].detail.as_deref(),
        Some(
            "policy undecided at connection: rule ask-the-program; checks: closed=false, unsure_path=true, unsure=undecided (the program exited with 3), default_path=false"
        )
    );
    let warned = store
        .audit_recent(Some("policy.warned"), 10)
        .await
        .expect("audit");
    assert_eq!(warned.len(), 1, "{warned:?}");
    // Two refusals of one address by one rule within a minute: one row,
    // both counted.
    let refused = store
        .audit_recent(Some("policy.refused"), 10)
        .await
        .expect("audit");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].client_ip.as_deref(), Some("127.0.0.1"));
    assert_counted(&server.running().authority(), &[
        "acme_proxy_policy_decisions_total{stage=\"connection\",rule=\"closed-to-all\",decision=\"deny\"} 2",
        "acme_proxy_policy_decisions_total{stage=\"connection\",rule=\"watch-default\",decision=\"warn\"} 2",
    ])
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverse_name_counts_only_when_it_resolves_back_and_an_unreachable_dns_is_undecided() {
    // Client addresses come through a trusted proxy's header (the
    // resolver answers every 127.0.0.0/8 PTR question with localhost
    // itself, RFC 6761 §6.3): 10.20.0.5 is host1.lab.test both ways in
    // BIND; 10.20.0.6's PTR claims the same name, which does not resolve
    // to it.
    let Some(bind) = harness::Bind::start_zones(
        "lab.test",
        "host1 IN A 10.20.0.5\n",
        &[(
            "20.10.in-addr.arpa",
            "5.0 IN PTR host1.lab.test.\n6.0 IN PTR host1.lab.test.\n",
        )],
    ) else {
        return;
    };
    let dir = harness::tempdir();
    let toml = TestServer::config_text(dir.path(), 1, None, "")
        .replacen(
            "[validation]\n",
            &format!("[validation]\ndns_resolvers = [\"{}\"]\n", bind.addr),
            1,
        )
        .replacen(
            "listen = ",
            "trusted_proxies = [\"127.0.0.1\"]\nlisten = ",
            1,
        )
        + r#"
[policy.checks.lab_host]
type = "reverse_dns"
names = ["*.lab.test"]
timeout = "2s"

[[policy.rules]]
name = "lab-hosts-only"
stages = ["connection"]
when = "not lab_host"
then = "deny"
message = "only hosts named in lab.test"
"#;
    let (_etc, config) = harness::config_file(&toml);
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let url = server.directory("default");
    let from = |client: &'static str| {
        let url = url.clone();
        async move {
            let headers: &[(&str, &str)] = if client.is_empty() {
                &[]
            } else {
                &[("x-forwarded-for", client)]
            };
            raw::request_with("GET", &url, headers, Vec::new()).await
        }
    };
    let r = from("10.20.0.5").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    for client in ["10.20.0.6", ""] {
        let r = from(client).await;
        assert_eq!(
            r.status,
            403,
            "{client}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let store = server.running().authority().store().clone();
    let rows = store
        .audit_recent(Some("policy.refused"), 10)
        .await
        .expect("audit");
    let details: Vec<(Option<&str>, Option<&str>)> = rows
        .iter()
        .map(|r| (r.client_ip.as_deref(), r.detail.as_deref()))
        .collect();
    assert_eq!(
        details,
        vec![
            (
                Some("127.0.0.1"),
                Some(
                    "policy deny at connection: rule lab-hosts-only; checks: lab_host=false (PTR localhost)"
                )
            ),
            (
                Some("10.20.0.6"),
                Some(
                    "policy deny at connection: rule lab-hosts-only; checks: lab_host=false (PTR host1.lab.test does not resolve to 10.20.0.6)"
                )
            ),
        ]
    );
    // `policy explain` asks the same DNS.
    let out = harness::run_cli(
        &config,
        &[
            "policy",
            "explain",
            "--profile",
            "default",
            "--client-ip",
            "10.20.0.5",
        ],
        &[],
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("check lab_host = true (PTR host1.lab.test, confirmed)"),
        "{}",
        out.stdout
    );
    // No DNS server: undecided, 503 (for an address not asked before).
    drop(bind);
    let r = from("10.20.0.7").await;
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    server.stop().await;
}

#[test]
fn an_ipam_token_file_readable_by_others_stops_start_up_saying_how_to_close_it() {
    use std::os::unix::fs::PermissionsExt;
    let etc = harness::tempdir();
    let token = etc.path().join("netbox-token");
    std::fs::write(&token, "nbt_abc.def\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let data = harness::tempdir();
    let (_dir, config) = harness::config_file(&TestServer::config_text(
        data.path(),
        1,
        None,
        &format!(
            "[policy.checks.netbox]\ntype = \"ipam\"\nsource = \"netbox\"\nurl = \"http://127.0.0.1:1\"\ntoken_file = \"{}\"\n",
            token.display()
        ),
    ));
    let refused = std::process::Command::new(harness::binary())
        .args(["serve", "--config", config.to_str().expect("utf-8")])
        .env_remove("ACME_PROXY_CONFIG")
        .output()
        .expect("run acme-proxy");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("chmod 600 '{}'", token.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("nbt_abc.def"), "{stderr}");
}
