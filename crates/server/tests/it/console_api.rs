//! The console's JSON API (`/api/v1/`): a browser session with its CSRF
//! header, a script with an API token made by the CLI, what neither may
//! do without the other half, and lists paged with a cursor to the end.

use std::time::{Duration, Instant};

use crate::client;
use crate::console::{Console, PASSWORD};
use crate::harness;
use crate::raw;

const COOKIE: &str = "__Host-acme-proxy-session";

fn json(resp: &raw::Resp) -> serde_json::Value {
    serde_json::from_slice(&resp.body).unwrap_or_else(|e| {
        panic!(
            "{e}: {} {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        )
    })
}

fn content_type(resp: &raw::Resp) -> &str {
    resp.headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

impl Console {
    async fn api(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> raw::Resp {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        raw::request_with(
            method,
            &format!("{}/api/v1{path}", self.url),
            &all,
            body.as_bytes().to_vec(),
        )
        .await
    }

    /// `admin token create USER` with these extra arguments: the token.
    fn token(&self, user: &str, extra: &[&str]) -> serde_json::Value {
        let mut args = vec!["admin", "token", "create", user, "--json"];
        args.extend_from_slice(extra);
        let out = self.cli(&args);
        assert_eq!(out.code, 0, "{out:?}");
        serde_json::from_str(&out.stdout).expect("token JSON")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_changes_things_through_the_api_only_with_its_csrf_header_and_from_its_own_origin()
 {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let (token, page_csrf) = console.login("alice", PASSWORD).await;
    let cookie = format!("{COOKIE}={token}");
    let own = console.url.clone();

    // Not logged in: a problem document, not the login page.
    let anonymous = console.api("GET", "/orders", &[], "").await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(content_type(&anonymous), "application/problem+json");
    assert_eq!(json(&anonymous)["status"], 401);

    // The session says who it is and what its CSRF header must say.
    let me = console
        .api("GET", "/session", &[("cookie", &cookie)], "")
        .await;
    assert_eq!(me.status, 200);
    let me = json(&me);
    assert_eq!(me["operator"], "alice");
    assert_eq!(me["via"], "session");
    let csrf = me["csrf_token"].as_str().expect("a CSRF token").to_owned();
    assert_eq!(
        csrf, page_csrf,
        "one token per session, pages and API alike"
    );

    let mint = r#"{"label":"from the api","names":["*.api.example.test"]}"#;
    for (case, headers) in [
        ("no CSRF header", vec![("origin", own.clone())]),
        (
            "another token",
            vec![("origin", own.clone()), ("x-csrf-token", "x".repeat(43))],
        ),
        (
            "a cross-site origin",
            vec![
                ("origin", "http://evil.example".to_owned()),
                ("x-csrf-token", csrf.clone()),
            ],
        ),
        (
            "sec-fetch-site cross-site",
            vec![
                ("sec-fetch-site", "cross-site".to_owned()),
                ("x-csrf-token", csrf.clone()),
            ],
        ),
    ] {
        let mut all: Vec<(&str, &str)> = vec![("cookie", cookie.as_str())];
        all.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
        let refused = console.api("POST", "/eab", &all, mint).await;
        assert_eq!(refused.status, 403, "{case}");
        assert_eq!(content_type(&refused), "application/problem+json", "{case}");
    }
    let listed = console.cli(&["eab", "list", "--json"]);
    assert_eq!(
        listed.stdout.trim(),
        "[]",
        "the refused requests minted nothing"
    );

    let minted = console
        .api(
            "POST",
            "/eab",
            &[
                ("cookie", &cookie),
                ("origin", &own),
                ("x-csrf-token", &csrf),
            ],
            mint,
        )
        .await;
    assert_eq!(minted.status, 201);
    let minted = json(&minted);
    assert!(minted["hmac_key"].as_str().is_some_and(|k| k.len() >= 43));
    assert_eq!(minted["names"][0], "*.api.example.test");
    let kid = minted["kid"].as_str().expect("kid");
    // Read back, the key is not there; the credential is.
    let listed = console.api("GET", "/eab", &[("cookie", &cookie)], "").await;
    let listed = json(&listed);
    assert_eq!(listed["items"][0]["kid"], kid);
    assert!(listed["items"][0].get("hmac_key").is_none());
    // A body that is not the JSON expected is refused, naming the field.
    let bad = console
        .api(
            "POST",
            "/eab",
            &[("cookie", &cookie), ("x-csrf-token", &csrf)],
            r#"{"lable":"typo"}"#,
        )
        .await;
    assert_eq!(bad.status, 400);
    assert!(
        json(&bad)["detail"]
            .as_str()
            .unwrap_or("")
            .contains("lable")
    );
    let created = console.audit("eab.created").await;
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(created[0]["actor"], "operator:alice");
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_with_an_api_token_acts_as_its_operator_until_revoked_expired_or_disabled() {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let made = console.token("alice", &["--label", "nightly report"]);
    let token = made["token"].as_str().expect("the token, shown once");
    assert!(token.starts_with("apx_"), "{token}");
    let bearer = format!("Bearer {token}");

    // A real issuance for the script to find.
    let responder = harness::Responder::start().await;
    let account = client::account(&console.server.directory("default")).await;
    client::issue(&account, &responder, &["script.example.test"]).await;

    let me = console
        .api("GET", "/session", &[("authorization", &bearer)], "")
        .await;
    assert_eq!(me.status, 200);
    let me = json(&me);
    assert_eq!(
        (me["operator"].as_str(), me["via"].as_str()),
        (Some("alice"), Some("token"))
    );
    assert!(me["csrf_token"].is_null());
    let orders = json(
        &console
            .api(
                "GET",
                "/orders?name=script.example.test",
                &[("authorization", &bearer)],
                "",
            )
            .await,
    );
    let order = &orders["items"][0];
    assert_eq!(order["identifiers"][0], "script.example.test");
    let id = order["id"].as_str().expect("order id").to_owned();
    let chain = console
        .api(
            "GET",
            &format!("/orders/{id}/chain"),
            &[("authorization", &bearer)],
            "",
        )
        .await;
    assert_eq!(chain.status, 200);
    assert!(String::from_utf8_lossy(&chain.body).starts_with("-----BEGIN CERTIFICATE-----"));

    // A change with the token alone: no cookie, no CSRF header, no Origin.
    let revoked = console
        .api(
            "POST",
            &format!("/orders/{id}/revoke"),
            &[("authorization", &bearer)],
            r#"{"reason":4}"#,
        )
        .await;
    assert_eq!(
        revoked.status,
        200,
        "{}",
        String::from_utf8_lossy(&revoked.body)
    );
    let serial = json(&revoked)["serial"]
        .as_str()
        .expect("serial")
        .to_owned();
    let rows = console.audit("certificate.revoked").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["actor"], "operator:alice");
    assert_eq!(rows[0]["serial"], serial.as_str());
    // Again: the operation's own refusal, as a problem.
    let again = console
        .api(
            "POST",
            &format!("/orders/{id}/revoke"),
            &[("authorization", &bearer)],
            "{}",
        )
        .await;
    assert_eq!(again.status, 409);

    // The token is for the API only: the pages still want a login.
    let page = raw::request_with(
        "GET",
        &format!("{}/orders", console.url),
        &[("authorization", &bearer)],
        vec![],
    )
    .await;
    assert_eq!(page.status, 303);
    // Its use is noted; the token itself is nowhere in the audit trail.
    let listed = console.cli(&["admin", "token", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("list JSON");
    assert_eq!(listed[0]["label"], "nightly report");
    assert!(listed[0]["last_used_at"].is_string(), "{listed}");
    assert!(listed[0].get("token").is_none());
    let audit = console.cli(&["audit", "list", "--json"]);
    assert!(
        !audit.stdout.contains(&token[4..]),
        "the token leaked into the audit trail"
    );
    assert_eq!(console.audit("operator.token_created").await.len(), 1);

    // Unknown, disabled, revoked, expired: 401 with the RFC 6750 challenge.
    let refused = |resp: raw::Resp, case: &str| {
        assert_eq!(resp.status, 401, "{case}");
        assert_eq!(
            resp.headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer error=\"invalid_token\""),
            "{case}"
        );
    };
    let forged = format!("Bearer apx_{}", "A".repeat(43));
    refused(
        console
            .api("GET", "/orders", &[("authorization", &forged)], "")
            .await,
        "unknown",
    );
    // Revoked: that token only.
    let second = console.token("alice", &["--label", "second"]);
    let second = format!("Bearer {}", second["token"].as_str().expect("token"));
    let id = made["id"].as_str().expect("token id");
    let out = console.cli(&["admin", "token", "revoke", id]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(console.audit("operator.token_revoked").await.len(), 1);
    refused(
        console
            .api("GET", "/orders", &[("authorization", &bearer)], "")
            .await,
        "revoked",
    );
    assert_eq!(
        console
            .api("GET", "/orders", &[("authorization", &second)], "")
            .await
            .status,
        200,
        "the other token still works"
    );
    // Disabling the operator revokes every token of theirs for good:
    // enabling them again brings none back.
    let out = console.cli(&["admin", "user", "disable", "alice", "--yes"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("API tokens were revoked"), "{out:?}");
    refused(
        console
            .api("GET", "/orders", &[("authorization", &second)], "")
            .await,
        "disabled",
    );
    let refused_while_disabled = console.cli(&["admin", "token", "create", "alice"]);
    assert_ne!(refused_while_disabled.code, 0);
    assert!(
        refused_while_disabled.stderr.contains("is disabled"),
        "{refused_while_disabled:?}"
    );
    let out = console.cli(&["admin", "user", "enable", "alice"]);
    assert_eq!(out.code, 0, "{out:?}");
    refused(
        console
            .api("GET", "/orders", &[("authorization", &second)], "")
            .await,
        "disabled, then enabled",
    );
    let left = console.cli(&["admin", "token", "list", "--json"]);
    assert_eq!(left.stdout.trim(), "[]", "{left:?}");

    let short = console.token("alice", &["--expires", "1s"]);
    let short = format!("Bearer {}", short["token"].as_str().expect("token"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = console
            .api("GET", "/orders", &[("authorization", &short)], "")
            .await
            .status;
        if status == 401 {
            break;
        }
        assert_eq!(status, 200);
        assert!(Instant::now() < deadline, "the token never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Lifetimes are bounded, and a token is for someone who exists.
    for (args, says) in [
        (vec!["alice", "--expires", "400d"], "at most"),
        (vec!["alice", "--expires", "500ms"], "at least 1s"),
        (vec!["nobody"], "no operator named"),
    ] {
        let mut all = vec!["admin", "token", "create"];
        all.extend(args);
        let out = console.cli(&all);
        assert_ne!(out.code, 0, "{out:?}");
        assert!(out.stderr.contains(says), "{out:?}");
    }
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_lists_are_paged_with_a_cursor_to_the_last_page() {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let made = console.token("alice", &[]);
    let bearer = format!("Bearer {}", made["token"].as_str().expect("token"));
    let auth = [("authorization", bearer.as_str())];
    let mut minted = Vec::new();
    for i in 0..5 {
        let resp = console
            .api("POST", "/eab", &auth, &format!(r#"{{"label":"key {i}"}}"#))
            .await;
        assert_eq!(resp.status, 201);
        minted.push(json(&resp)["kid"].as_str().expect("kid").to_owned());
    }
    for list in ["/eab", "/audit?event=eab.created"] {
        let mut seen = Vec::new();
        let mut pages = 0;
        let mut next: Option<String> = None;
        loop {
            let path = match &next {
                None => format!(
                    "{list}{}limit=2",
                    if list.contains('?') { "&" } else { "?" }
                ),
                Some(cursor) => format!(
                    "{list}{}limit=2&before={cursor}",
                    if list.contains('?') { "&" } else { "?" }
                ),
            };
            let page = json(&console.api("GET", &path, &auth, "").await);
            let items = page["items"].as_array().expect("items");
            assert!(items.len() <= 2, "{list}: {page}");
            pages += 1;
            for item in items {
                let kid = if list == "/eab" {
                    item["kid"].as_str()
                } else {
                    item["detail"].as_str().and_then(|d| {
                        minted
                            .iter()
                            .find(|k| d.contains(k.as_str()))
                            .map(String::as_str)
                    })
                };
                seen.push(kid.expect("each row names its credential").to_owned());
            }
            match page["next"].as_str() {
                Some(cursor) => next = Some(cursor.to_owned()),
                None => break,
            }
            assert!(pages < 10, "{list}: the pages never ended");
        }
        let mut newest_first = minted.clone();
        newest_first.reverse();
        let mut sorted_seen = seen.clone();
        sorted_seen.sort();
        let mut sorted_minted = minted.clone();
        sorted_minted.sort();
        assert_eq!(sorted_seen, sorted_minted, "{list}: each once, none lost");
        assert_eq!(pages, 3, "{list}: 2 + 2 + 1");
        if list == "/audit?event=eab.created" {
            assert_eq!(seen, newest_first, "{list}: newest first");
        }
    }
    for bad in [
        "/eab?limit=0",
        "/eab?limit=201",
        "/jobs?limit=x",
        "/jobs?before=x",
    ] {
        let resp = console.api("GET", bad, &auth, "").await;
        assert_eq!(resp.status, 400, "{bad}");
        assert_eq!(content_type(&resp), "application/problem+json", "{bad}");
    }
    let missing = console.api("GET", "/nope", &auth, "").await;
    assert_eq!(
        (missing.status, content_type(&missing)),
        (404, "application/problem+json")
    );
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutating_api_route_refuses_a_session_without_its_csrf_header_or_from_another_site() {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    console.create("bob", PASSWORD);
    let (token, csrf) = console.login("alice", PASSWORD).await;
    let (_, bobs_csrf) = console.login("bob", PASSWORD).await;
    let cookie = format!("{COOKIE}={token}");
    let own = console.url.clone();
    // Every API route that changes something, with a body that would do.
    let routes = [
        (
            "POST",
            "/orders/AAAAAAAAAAAAAAAAAAAAAA/revoke",
            r#"{"reason":0}"#,
        ),
        ("POST", "/accounts/AAAAAAAAAAAAAAAAAAAAAA/deactivate", ""),
        ("DELETE", "/accounts/AAAAAAAAAAAAAAAAAAAAAA", ""),
        ("POST", "/jobs/1/retry", ""),
        ("POST", "/jobs/1/cancel", ""),
        ("POST", "/eab", r#"{"label":"forged"}"#),
        ("POST", "/eab/AAAAAAAAAAAAAAAA/revoke", ""),
    ];
    for (method, route, body) in routes {
        let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
            ("no token", vec![("origin", own.clone())]),
            (
                "another session's token",
                vec![("origin", own.clone()), ("x-csrf-token", bobs_csrf.clone())],
            ),
            (
                "a cross-site origin",
                vec![
                    ("origin", "http://evil.example".to_owned()),
                    ("x-csrf-token", csrf.clone()),
                ],
            ),
            (
                "the origin null",
                vec![
                    ("origin", "null".to_owned()),
                    ("x-csrf-token", csrf.clone()),
                ],
            ),
            (
                "no origin, sec-fetch-site cross-site",
                vec![
                    ("sec-fetch-site", "cross-site".to_owned()),
                    ("x-csrf-token", csrf.clone()),
                ],
            ),
            (
                "no origin, sec-fetch-site same-site",
                vec![
                    ("sec-fetch-site", "same-site".to_owned()),
                    ("x-csrf-token", csrf.clone()),
                ],
            ),
        ];
        for (case, headers) in cases {
            let mut all: Vec<(&str, &str)> = vec![("cookie", cookie.as_str())];
            all.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
            let resp = console.api(method, route, &all, body).await;
            assert_eq!(resp.status, 403, "{method} {route}, {case}");
            let why = if case.contains("token") {
                "did not come from this console"
            } else {
                "came from another site"
            };
            let detail = json(&resp)["detail"].as_str().unwrap_or("").to_owned();
            assert!(detail.contains(why), "{method} {route}, {case}: {detail}");
        }
        let anonymous = console
            .api(
                method,
                route,
                &[("origin", &own), ("x-csrf-token", &csrf)],
                body,
            )
            .await;
        assert_eq!(anonymous.status, 401, "{method} {route} without a session");
    }
    // Nothing was minted, and the session still works.
    let minted = console.cli(&["eab", "list", "--json"]);
    assert_eq!(minted.stdout.trim(), "[]", "{minted:?}");
    let me = console
        .api("GET", "/session", &[("cookie", &cookie)], "")
        .await;
    assert_eq!(me.status, 200);
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_paged_and_retried_or_cancelled_through_the_api_as_the_operator() {
    use acme_proxy_store::NewJob;
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let made = console.token("alice", &[]);
    let bearer = format!("Bearer {}", made["token"].as_str().expect("token"));
    let auth = [("authorization", bearer.as_str())];
    // Jobs of a kind no runner takes, far in the future: they stay queued.
    let store = console.server.running().authority().store().clone();
    let now = console.server.running().authority().clock.unix();
    let mut ids = Vec::new();
    for i in 0..4 {
        let key = format!("job-{i}");
        let queued = store
            .insert_job(
                &NewJob {
                    kind: "console_test",
                    key: &key,
                    payload: "{}",
                    run_at: (now + 3600) * 1000,
                    deadline: None,
                    max_attempts: 1,
                    fair_key: None,
                },
                now * 1000,
            )
            .await
            .expect("queued");
        let acme_proxy_store::Enqueued::Queued(id) = queued else {
            panic!("{queued:?}")
        };
        ids.push(id);
    }
    // Two pages of two, newest first, the second saying it is the last.
    let first = json(
        &console
            .api("GET", "/jobs?kind=console_test&limit=2", &auth, "")
            .await,
    );
    let next = first["next"].as_str().expect("a second page");
    let second = json(
        &console
            .api(
                "GET",
                &format!("/jobs?kind=console_test&limit=2&before={next}"),
                &auth,
                "",
            )
            .await,
    );
    assert!(second["next"].is_null(), "{second}");
    let seen: Vec<i64> = [&first, &second]
        .iter()
        .flat_map(|p| p["items"].as_array().expect("items").iter())
        .map(|j| j["id"].as_i64().expect("id"))
        .collect();
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first);

    // Cancelled and retried as alice, each audited.
    let cancelled = console
        .api("POST", &format!("/jobs/{}/cancel", ids[0]), &auth, "")
        .await;
    assert_eq!(cancelled.status, 200);
    assert_eq!(json(&cancelled)["cancel_requested_by"], "operator:alice");
    let retried = console
        .api("POST", &format!("/jobs/{}/retry", ids[1]), &auth, "")
        .await;
    assert_eq!(retried.status, 200);
    for event in ["job.cancel_requested", "job.retry_requested"] {
        let rows = console.audit(event).await;
        assert_eq!(rows.len(), 1, "{event}: {rows:?}");
        assert_eq!(rows[0]["actor"], "operator:alice", "{event}");
    }
    // The CLI's retry is audited too, with its actor.
    let out = console.cli(&[
        "job",
        "retry",
        &ids[2].to_string(),
        "--actor",
        "operator:bob",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let rows = console.audit("job.retry_requested").await;
    assert_eq!(rows[0]["actor"], "operator:bob", "{rows:?}");

    // Every refusal is a problem document, axum's own included.
    for (method, path, status) in [
        ("GET", "/jobs/abc".to_owned(), 400),
        ("POST", "/jobs/999999/retry".to_owned(), 404),
        (
            "POST",
            "/orders/AAAAAAAAAAAAAAAAAAAAAA/revoke".to_owned(),
            404,
        ),
        ("DELETE", "/accounts/AAAAAAAAAAAAAAAAAAAAAA".to_owned(), 404),
        ("PUT", "/eab".to_owned(), 405),
        ("GET", "/orders?name=a&name=b".to_owned(), 400),
    ] {
        let resp = console.api(method, &path, &auth, "{}").await;
        assert_eq!(resp.status, status, "{method} {path}");
        assert_eq!(
            content_type(&resp),
            "application/problem+json",
            "{method} {path}"
        );
        assert_eq!(json(&resp)["status"], status, "{method} {path}");
        if status == 405 {
            assert!(resp.headers.get("allow").is_some(), "405 keeps Allow");
        }
    }

    // A proxy's Basic credentials in front of the console are not a token:
    // the session cookie is still what counts.
    let (cookie, _) = console.login("alice", PASSWORD).await;
    let cookie = format!("{COOKIE}={cookie}");
    let behind_proxy = console
        .api(
            "GET",
            "/session",
            &[("cookie", &cookie), ("authorization", "Basic YWxpY2U6cHc=")],
            "",
        )
        .await;
    assert_eq!(behind_proxy.status, 200);
    assert_eq!(json(&behind_proxy)["via"], "session");
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_are_taken_whole_or_refused_and_every_path_under_api_answers_a_problem() {
    let policy = "[policy.checks.lab_names]\ntype = \"identifiers\"\n\
        allow = [\"*.lab.example.internal\"]\n[[policy.rules]]\nname = \"lab-names-only\"\n\
        when = \"not lab_names\"\nthen = \"deny\"\nmessage = \"lab names only\"\n";
    let console = Console::start_with(policy, "bypass = true\n").await;
    console.create("alice", PASSWORD);
    let made = console.token("alice", &[]);
    let bearer = format!("Bearer {}", made["token"].as_str().expect("token"));
    let auth = [("authorization", bearer.as_str())];

    // Thirty lab names, 750 bytes: each one is explained, none made up
    // from a cut.
    let names: Vec<String> = (10..40)
        .map(|i| format!("h{i}.lab.example.internal"))
        .collect();
    let explain = |identifiers: String| {
        let query = serde_urlencoded::to_string([
            ("profile", "default"),
            ("client_ip", "10.0.0.1"),
            ("identifiers", identifiers.as_str()),
        ])
        .expect("query");
        format!("/policy/explain?{query}")
    };
    let allowed = console
        .api("GET", &explain(names.join(" ")), &auth, "")
        .await;
    assert_eq!(
        allowed.status,
        200,
        "{}",
        String::from_utf8_lossy(&allowed.body)
    );
    assert_eq!(
        json(&allowed)["decision"],
        "allowed",
        "{:?}",
        json(&allowed)
    );
    let many: Vec<String> = (0..101)
        .map(|i| format!("h{i}.lab.example.internal"))
        .collect();
    let refused = console
        .api("GET", &explain(many.join(" ")), &auth, "")
        .await;
    assert_eq!(
        refused.status,
        400,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert!(
        json(&refused)["detail"]
            .as_str()
            .unwrap_or("")
            .contains("at most 100"),
        "{:?}",
        json(&refused)
    );

    // An empty list of names is not "any name".
    let empty = console
        .api("POST", "/eab", &auth, r#"{"profile":"default","names":[]}"#)
        .await;
    assert_eq!(
        empty.status,
        400,
        "{}",
        String::from_utf8_lossy(&empty.body)
    );
    assert_eq!(content_type(&empty), "application/problem+json");
    let listed = json(&console.api("GET", "/eab", &auth, "").await);
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(0),
        "{listed:?}"
    );
    let named = console
        .api(
            "POST",
            "/eab",
            &auth,
            r#"{"profile":"default","names":["*.lab.example.internal"]}"#,
        )
        .await;
    assert_eq!(
        named.status,
        201,
        "{}",
        String::from_utf8_lossy(&named.body)
    );

    // Another version of the API, and a missing order's chain: problems
    // that say what is missing.
    let other = raw::request_with(
        "GET",
        &format!("{}/api/v2/orders", console.url),
        &auth,
        vec![],
    )
    .await;
    assert_eq!(other.status, 404);
    assert_eq!(content_type(&other), "application/problem+json");
    let chain = console
        .api("GET", "/orders/nothing-here/chain", &auth, "")
        .await;
    assert_eq!(chain.status, 404);
    let detail = json(&chain)["detail"].as_str().unwrap_or("").to_owned();
    assert!(detail.contains("no order"), "{detail}");
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_change_whose_audit_row_cannot_be_written_is_not_made() {
    use instant_acme::{Identifier, NewOrder};

    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let made = console.token("alice", &[]);
    let bearer = format!("Bearer {}", made["token"].as_str().expect("token"));
    let auth = [("authorization", bearer.as_str())];
    // Before the audit log refuses: a credential, a certificate, and an
    // order left pending.
    let minted = console
        .api("POST", "/eab", &auth, r#"{"profile":"default"}"#)
        .await;
    assert_eq!(
        minted.status,
        201,
        "{}",
        String::from_utf8_lossy(&minted.body)
    );
    let kid = json(&minted)["kid"].as_str().expect("kid").to_owned();
    let responder = harness::Responder::start().await;
    let account = client::account(&console.server.directory("default")).await;
    client::issue(&account, &responder, &["kept.example.test"]).await;
    let issued = json(&console.api("GET", "/orders?status=valid", &auth, "").await);
    let issued_id = issued["items"][0]["id"].as_str().expect("id").to_owned();
    account
        .new_order(&NewOrder::new(&[Identifier::Dns(
            "pending.example.test".into(),
        )]))
        .await
        .expect("order");
    let pending = json(
        &console
            .api("GET", "/orders?status=pending", &auth, "")
            .await,
    );
    let pending_id = pending["items"][0]["id"].as_str().expect("id").to_owned();

    harness::refuse_audit_rows(&console.server);
    let refused = console
        .api("POST", "/eab", &auth, r#"{"profile":"default"}"#)
        .await;
    assert!(
        refused.status >= 500,
        "minted unaudited: {}",
        refused.status
    );
    let revoke = console
        .api("POST", &format!("/eab/{kid}/revoke"), &auth, "")
        .await;
    assert!(revoke.status >= 500, "revoked unaudited: {}", revoke.status);
    let listed = json(&console.api("GET", "/eab", &auth, "").await);
    let items = listed["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{listed:?}");
    assert_eq!(items[0]["kid"], kid.as_str());
    assert_eq!(items[0]["status"], "valid", "{listed:?}");

    let revoke = console
        .api(
            "POST",
            &format!("/orders/{issued_id}/revoke"),
            &auth,
            r#"{"reason":4}"#,
        )
        .await;
    assert!(revoke.status >= 500, "revoked unaudited: {}", revoke.status);
    let order = json(
        &console
            .api("GET", &format!("/orders/{issued_id}"), &auth, "")
            .await,
    );
    assert!(order["certificate"]["serial"].is_string(), "{order:?}");
    assert!(
        order["certificate"]["revoked_at"].is_null(),
        "the certificate was revoked without its row: {order:?}"
    );

    let deleted = console.cli(&["order", "delete", &pending_id, "--yes"]);
    assert_ne!(deleted.code, 0, "{deleted:?}");
    let still = console
        .api("GET", &format!("/orders/{pending_id}"), &auth, "")
        .await;
    assert_eq!(still.status, 200, "deleted without its row");

    let account_id = order["account"].as_str().expect("account").to_owned();
    let deactivate = console
        .api(
            "POST",
            &format!("/accounts/{account_id}/deactivate"),
            &auth,
            "",
        )
        .await;
    assert!(
        deactivate.status >= 500,
        "deactivated unaudited: {}",
        deactivate.status
    );
    let shown = json(
        &console
            .api("GET", &format!("/accounts/{account_id}"), &auth, "")
            .await,
    );
    assert_eq!(shown["status"], "valid", "{shown:?}");
    console.server.stop().await;
}
