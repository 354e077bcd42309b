//! The web console (`[admin]`) over HTTP: operators made with the CLI log
//! in and out, the session cookie's attributes, the security headers, the
//! CSRF and same-origin checks on every mutating route, the login
//! throttle (timed), sessions ended by the CLI, by a password change, by
//! disabling, and by idleness, and the listener's start-up refusals.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::harness::{self, CliOutput, TestServer};
use crate::raw;

const COOKIE: &str = "__Host-acme-proxy-session";
pub(crate) const PASSWORD: &str = "correct horse battery";

/// A server with the console on loopback, and its configuration file for
/// the admin commands.
pub(crate) struct Console {
    pub(crate) server: TestServer,
    pub(crate) url: String,
    _etc: tempfile::TempDir,
    config: PathBuf,
}

impl Console {
    pub(crate) async fn start(admin: &str) -> Console {
        Self::start_with(admin, "bypass = true\n").await
    }

    /// With `profile` as the default profile's settings.
    pub(crate) async fn start_with(admin: &str, profile: &str) -> Console {
        Self::start_with_top("", admin, profile).await
    }

    /// With `top` as the configuration's first, top-level lines.
    async fn start_with_top(top: &str, admin: &str, profile: &str) -> Console {
        let dir = harness::tempdir();
        let toml = top.to_owned()
            + &TestServer::config_text(
                dir.path(),
                1,
                None,
                &format!(
                    "[admin]\nlisten = \"127.0.0.1:0\"\n{admin}\n[profiles.default]\n{profile}"
                ),
            );
        let (etc, config) = harness::config_file(&toml);
        let server = TestServer::start_in(dir, &toml).await;
        let url = server
            .running()
            .admin_url
            .clone()
            .expect("the console's URL")
            .trim_end_matches('/')
            .to_owned();
        Console {
            server,
            url,
            _etc: etc,
            config,
        }
    }

    pub(crate) fn cli(&self, args: &[&str]) -> CliOutput {
        harness::run_cli(&self.config, args, &[("USER", "root-operator")])
    }

    /// `admin user create NAME` with the password in a 0600 file.
    pub(crate) fn create(&self, name: &str, password: &str) {
        let file = self.config.with_file_name(format!("{name}.password"));
        std::fs::write(&file, format!("{password}\n")).expect("password file");
        let out = self.cli(&[
            "admin",
            "user",
            "create",
            name,
            "--password-file",
            file.to_str().expect("path"),
        ]);
        assert_eq!(out.code, 0, "{out:?}");
    }

    pub(crate) async fn get(&self, path: &str, cookie: Option<&str>) -> raw::Resp {
        let cookie = cookie.map(|c| format!("{COOKIE}={c}"));
        let mut headers = vec![];
        if let Some(c) = &cookie {
            headers.push(("cookie", c.as_str()));
        }
        raw::request_with("GET", &format!("{}{path}", self.url), &headers, vec![]).await
    }

    async fn post(&self, path: &str, headers: &[(&str, &str)], form: &str) -> raw::Resp {
        let mut all = vec![("content-type", "application/x-www-form-urlencoded")];
        all.extend_from_slice(headers);
        raw::request_with(
            "POST",
            &format!("{}{path}", self.url),
            &all,
            form.as_bytes().to_vec(),
        )
        .await
    }

    async fn login_from(&self, from: IpAddr, name: &str, password: &str) -> raw::Resp {
        self.login_forwarded(from, None, name, password).await
    }

    /// A login from `from`, saying it forwards for `client` if given.
    async fn login_forwarded(
        &self,
        from: IpAddr,
        client: Option<&str>,
        name: &str,
        password: &str,
    ) -> raw::Resp {
        let form = serde_urlencoded::to_string([("username", name), ("password", password)])
            .expect("form");
        let mut headers = vec![
            ("content-type", "application/x-www-form-urlencoded"),
            ("origin", self.url.as_str()),
        ];
        if let Some(client) = client {
            headers.push(("x-forwarded-for", client));
        }
        raw::request_from(
            from,
            "POST",
            &format!("{}/login", self.url),
            &headers,
            form.into_bytes(),
        )
        .await
    }

    /// Logs in and returns the session's cookie value and CSRF token.
    pub(crate) async fn login(&self, name: &str, password: &str) -> (String, String) {
        let resp = self
            .login_from("127.0.0.1".parse().expect("ip"), name, password)
            .await;
        assert_eq!(resp.status, 303, "{}", text(&resp));
        let token = session_cookie(&resp).expect("a session cookie");
        let page = self.get("/", Some(&token)).await;
        assert_eq!(page.status, 200, "{}", text(&page));
        (token, csrf_of(&text(&page)))
    }

    pub(crate) async fn audit(&self, event: &str) -> Vec<serde_json::Value> {
        let out = self.cli(&["audit", "list", "--event", event, "--json"]);
        assert_eq!(out.code, 0, "{out:?}");
        serde_json::from_str::<Vec<serde_json::Value>>(&out.stdout).expect("audit JSON")
    }
}

/// A CSRF case: its name, the request's headers beside the cookie, and
/// its form.
type Case<'a> = (&'a str, Vec<(&'a str, String)>, String);

fn text(resp: &raw::Resp) -> String {
    String::from_utf8_lossy(&resp.body).into_owned()
}

fn header<'r>(resp: &'r raw::Resp, name: &str) -> &'r str {
    resp.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The session token a response sets, from its Set-Cookie.
fn session_cookie(resp: &raw::Resp) -> Option<String> {
    resp.headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{COOKIE}=")))
        .and_then(|v| v.split(';').next())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// The CSRF token a page's forms carry.
fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token in the page: {page}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_made_with_the_cli_logs_in_sees_the_dashboard_and_logs_out() {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let listed = console.cli(&["admin", "user", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("list JSON");
    assert_eq!(listed[0]["name"], "alice");
    assert_eq!(listed[0]["status"], "active");
    assert_eq!(listed[0]["totp"], false);

    // Not logged in: sent to the login page, which is strict about itself.
    let home = console.get("/", None).await;
    assert_eq!((home.status, header(&home, "location")), (303, "/login"));
    let page = console.get("/login", None).await;
    assert_eq!(page.status, 200);
    let csp = header(&page, "content-security-policy");
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(header(&page, "cache-control"), "no-store");
    assert_eq!(header(&page, "x-frame-options"), "DENY");
    assert_eq!(header(&page, "x-content-type-options"), "nosniff");
    assert_eq!(header(&page, "referrer-policy"), "same-origin");
    // Its stylesheet is served under its digest, cached for ever.
    let css = text(&page)
        .split("href=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a stylesheet link")
        .replace("&#x2f;", "/");
    assert!(
        css.starts_with("/static/console-") && css.ends_with(".css"),
        "{css}"
    );
    let sheet = console.get(&css, None).await;
    assert_eq!(sheet.status, 200);
    assert!(header(&sheet, "cache-control").contains("immutable"));
    assert_eq!(console.get("/static/console-0.css", None).await.status, 404);

    // A wrong password: refused, no cookie, audited.
    let local: IpAddr = "127.0.0.1".parse().expect("ip");
    let wrong = console.login_from(local, "alice", "not the password").await;
    assert_eq!(wrong.status, 403);
    assert!(session_cookie(&wrong).is_none());
    assert!(text(&wrong).contains("Wrong name or password."));

    // The right one: a session cookie with every attribute.
    let right = console.login_from(local, "alice", PASSWORD).await;
    assert_eq!((right.status, header(&right, "location")), (303, "/"));
    let set = header(&right, "set-cookie");
    let token = session_cookie(&right).expect("session cookie");
    assert_eq!(token.len(), 43, "256 bits, base64url: {set}");
    for attribute in ["Path=/", "Secure", "HttpOnly", "SameSite=Strict"] {
        assert!(
            set.split("; ").any(|a| a == attribute),
            "{attribute} in {set}"
        );
    }
    assert!(
        !set.contains("Domain="),
        "a __Host- cookie names no domain: {set}"
    );

    let home = console.get("/", Some(&token)).await;
    assert_eq!(home.status, 200, "{}", text(&home));
    let html = text(&home);
    assert!(
        html.contains("Dashboard") && html.contains("alice"),
        "{html}"
    );
    assert!(html.contains("Profile <strong>default</strong> has <code>bypass = true</code>"));
    let csrf = csrf_of(&html);
    // A made-up cookie is no session.
    let forged = console.get("/", Some(&"A".repeat(43))).await;
    assert_eq!(forged.status, 303);

    let out = console
        .post(
            "/logout",
            &[
                ("cookie", &format!("{COOKIE}={token}")),
                ("origin", &console.url),
            ],
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!((out.status, header(&out, "location")), (303, "/login"));
    assert!(header(&out, "set-cookie").contains("Max-Age=0"));
    assert_eq!(console.get("/", Some(&token)).await.status, 303);

    let logins = console.audit("operator.login").await;
    let outcomes: Vec<(&str, &str)> = logins
        .iter()
        .map(|r| {
            (
                r["outcome"].as_str().unwrap_or(""),
                r["actor"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(
        outcomes.contains(&("refused", "operator:alice")),
        "{logins:#?}"
    );
    assert!(
        outcomes.contains(&("success", "operator:alice")),
        "{logins:#?}"
    );
    assert!(
        logins.iter().all(|r| r["client_ip"] == "127.0.0.1"),
        "{logins:#?}"
    );
    let logouts = console.audit("operator.logout").await;
    assert_eq!(logouts.len(), 1, "{logouts:#?}");
    let created = console.audit("operator.created").await;
    assert_eq!(created[0]["actor"], "operator:root-operator");

    let metrics = console.server.running().authority().render_metrics().await;
    assert!(
        metrics.contains("acme_proxy_admin_logins_total{outcome=\"success\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("acme_proxy_admin_http_requests_total{route=\"/\",status=\"200\"}"),
        "{metrics}"
    );
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutating_route_refuses_a_request_without_its_sessions_csrf_token_or_from_another_site()
 {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    console.create("bob", PASSWORD);
    let (token, csrf) = console.login("alice", PASSWORD).await;
    let (_, bobs_csrf) = console.login("bob", PASSWORD).await;
    let cookie = format!("{COOKIE}={token}");
    let own = console.url.clone();
    // Every route that changes something, with a body that would work.
    let routes = [
        ("/logout", String::new()),
        ("/account/totp", "code=123456".to_owned()),
        (
            "/orders/AAAAAAAAAAAAAAAAAAAAAA/revoke",
            "reason=0&confirm=yes".to_owned(),
        ),
        ("/eab", "label=forged".to_owned()),
        ("/jobs/1/retry", String::new()),
        ("/jobs/1/cancel", "confirm=yes".to_owned()),
        (
            "/accounts/AAAAAAAAAAAAAAAAAAAAAA/deactivate",
            "confirm=yes".to_owned(),
        ),
        (
            "/accounts/AAAAAAAAAAAAAAAAAAAAAA/delete",
            "confirm=yes".to_owned(),
        ),
        ("/eab/AAAAAAAAAAAAAAAA/revoke", "confirm=yes".to_owned()),
    ];
    for (route, body) in &routes {
        let with = |extra: &str| {
            if body.is_empty() {
                extra.to_owned()
            } else {
                format!("{body}&{extra}")
            }
        };
        let cases: Vec<Case<'_>> = vec![
            ("no token", vec![("origin", own.clone())], with("")),
            (
                "another session's token",
                vec![("origin", own.clone())],
                with(&format!("csrf={bobs_csrf}")),
            ),
            (
                "another session's token in the header",
                vec![("origin", own.clone()), ("x-csrf-token", bobs_csrf.clone())],
                with(""),
            ),
            (
                "a cross-site origin",
                vec![("origin", "http://evil.example".to_owned())],
                with(&format!("csrf={csrf}")),
            ),
            (
                "the origin null",
                vec![("origin", "null".to_owned())],
                with(&format!("csrf={csrf}")),
            ),
            (
                "no origin, sec-fetch-site cross-site",
                vec![("sec-fetch-site", "cross-site".to_owned())],
                with(&format!("csrf={csrf}")),
            ),
            (
                "no origin, sec-fetch-site same-site",
                vec![("sec-fetch-site", "same-site".to_owned())],
                with(&format!("csrf={csrf}")),
            ),
        ];
        for (case, headers, form) in cases {
            let mut all: Vec<(&str, &str)> = vec![("cookie", cookie.as_str())];
            all.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
            let resp = console.post(route, &all, &form).await;
            assert_eq!(resp.status, 403, "{route}, {case}: {}", text(&resp));
            // Refused by the gate, for this reason, not by the handler.
            let why = if case.contains("token") {
                "did not come from this console"
            } else {
                "came from another site"
            };
            assert!(
                text(&resp).contains(why),
                "{route}, {case}: {}",
                text(&resp)
            );
            // Nothing changed: the session still works.
            let home = console.get("/", Some(&token)).await;
            assert_eq!(home.status, 200, "{route}, {case}: the session was ended");
        }
        // Not logged in at all: refused, not redirected.
        let anonymous = console
            .post(
                route,
                &[("origin", own.as_str())],
                &with(&format!("csrf={csrf}")),
            )
            .await;
        assert_eq!(anonymous.status, 403, "{route} without a session");
    }
    // Nothing was minted by the refused requests.
    let minted = console.cli(&["eab", "list", "--json"]);
    assert_eq!(minted.stdout.trim(), "[]", "{minted:?}");
    // A revocation needs its box ticked.
    let unconfirmed = console
        .post(
            "/orders/AAAAAAAAAAAAAAAAAAAAAA/revoke",
            &[("cookie", &cookie), ("origin", &own)],
            &format!("csrf={csrf}&reason=0"),
        )
        .await;
    assert_eq!(unconfirmed.status, 400);
    assert!(text(&unconfirmed).contains("Nothing was revoked"));
    // A login from another site is refused too (login CSRF).
    let cross = console
        .post(
            "/login",
            &[("origin", "http://evil.example")],
            &format!("username=alice&password={}", PASSWORD.replace(' ', "+")),
        )
        .await;
    assert_eq!(cross.status, 403);
    assert!(session_cookie(&cross).is_none());
    // And the right token, same origin, works: the table is not refusing
    // everything.
    let out = console
        .post(
            "/logout",
            &[
                ("cookie", &cookie),
                ("origin", &own),
                ("x-csrf-token", &csrf),
            ],
            "",
        )
        .await;
    assert_eq!(out.status, 303);
    assert_eq!(console.get("/", Some(&token)).await.status, 303);
    console.server.stop().await;
}

/// One wrong-password login, timed.
async fn timed_wrong_login(console: &Console, from: IpAddr, name: &str) -> Duration {
    let started = Instant::now();
    let resp = console.login_from(from, name, "not the password").await;
    let took = started.elapsed();
    assert_eq!(resp.status, 403, "{}", text(&resp));
    took
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sixth_wrong_password_in_a_minute_is_refused_before_hashing_and_unknown_names_cost_the_same()
 {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let a: IpAddr = "127.0.0.2".parse().expect("ip");
    let b: IpAddr = "127.0.0.3".parse().expect("ip");
    let c: IpAddr = "127.0.0.4".parse().expect("ip");
    // Five wrong passwords each: a known name from one address, an
    // unknown one from another. Both cost one argon2id hash.
    // Taken in turns, so that a warming cache or a neighbour's load
    // falls on both alike.
    let (mut known, mut unknown) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        known.push(timed_wrong_login(&console, a, "alice").await);
        unknown.push(timed_wrong_login(&console, b, "nobody").await);
    }
    let (known, unknown) = (median(known), median(unknown));
    let (fast, slow) = (known.min(unknown), known.max(unknown));
    eprintln!("median wrong-password login: known name {known:?}, unknown name {unknown:?}");
    // Within noise: the same hash either way (a shared 2-core machine
    // running other tests is noisy, hence a factor, not a margin).
    assert!(
        slow.as_secs_f64() < fast.as_secs_f64() * 2.0,
        "a known name took {known:?}, an unknown one {unknown:?}"
    );
    // The sixth within the minute, by name from a fresh address, and by
    // address for a fresh name: refused at once, with Retry-After.
    for (from, name) in [(c, "alice"), (b, "carol")] {
        let started = Instant::now();
        let resp = console.login_from(from, name, PASSWORD).await;
        let took = started.elapsed();
        eprintln!("throttled login: {took:?}");
        assert_eq!(resp.status, 429, "{name} from {from}: {}", text(&resp));
        let retry: u64 = header(&resp, "retry-after").parse().expect("Retry-After");
        assert!((1..=60).contains(&retry), "{retry}");
        assert!(
            took.as_secs_f64() < fast.as_secs_f64() / 3.0,
            "a throttled login took {took:?}; a hashed one {fast:?}"
        );
    }
    // Even the right password waits out the minute.
    let resp = console.login_from(a, "alice", PASSWORD).await;
    assert_eq!(resp.status, 429);
    let throttled = console.audit("operator.login").await;
    assert!(
        throttled
            .iter()
            .any(|r| r["detail"].as_str().unwrap_or("").starts_with("throttled")),
        "{throttled:#?}"
    );
    let metrics = console.server.running().authority().render_metrics().await;
    assert!(
        metrics.contains("acme_proxy_admin_logins_total{outcome=\"throttled\"} 3"),
        "{metrics}"
    );
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_whose_body_stops_half_way_is_answered_408_at_the_body_deadline_and_closed() {
    use tokio::io::AsyncWriteExt as _;
    let console = Console::start_with(
        "",
        "bypass = true\n[connections]\nbody_read_timeout = \"1s\"\n",
    )
    .await;
    let addr: std::net::SocketAddr = console
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("the console's address");
    // A login form announced at 100 octets, of which 11 ever come.
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connected");
    tcp.write_all(
        format!(
            "POST /login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nusername=al"
        )
        .as_bytes(),
    )
    .await
    .expect("sent");
    let (answer, took) = crate::connections::until_closed(&mut tcp, Duration::from_secs(8)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 1s"), "{answer}");
    assert!(
        took >= Duration::from_millis(800),
        "answered after {took:?}"
    );
    // The half form was never looked at: no login attempt audited.
    assert!(console.audit("operator.login").await.is_empty());
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_logins_are_throttled_and_audited_by_the_client_it_forwarded_for() {
    // 127.0.0.6 fronts the console; 127.0.0.7 is trusted by the ACME
    // listener only.
    let console = Console::start_with_top(
        "trusted_proxies = [\"127.0.0.7\"]\n",
        "trusted_proxies = [\"127.0.0.6\"]",
        "bypass = true\n",
    )
    .await;
    console.create("alice", PASSWORD);
    let proxy: IpAddr = "127.0.0.6".parse().expect("ip");
    // Five wrong passwords through the proxy for one client: that client's
    // allowance is spent, not the proxy's.
    for _ in 0..5 {
        let resp = console
            .login_forwarded(proxy, Some("192.0.2.10"), "nobody", "not the password")
            .await;
        assert_eq!(resp.status, 403, "{}", text(&resp));
    }
    let resp = console
        .login_forwarded(proxy, Some("192.0.2.10"), "carol", "not the password")
        .await;
    assert_eq!(resp.status, 429, "{}", text(&resp));
    let resp = console
        .login_forwarded(proxy, Some("192.0.2.20"), "alice", PASSWORD)
        .await;
    assert_eq!(resp.status, 303, "{}", text(&resp));
    // A peer that is not one of the console's proxies is itself the
    // client, whatever it claims, even a proxy the ACME listener trusts.
    let resp = console
        .login_forwarded(
            "127.0.0.7".parse().expect("ip"),
            Some("192.0.2.30"),
            "alice",
            PASSWORD,
        )
        .await;
    assert_eq!(resp.status, 303, "{}", text(&resp));
    let logins = console.audit("operator.login").await;
    let seen = |outcome: &str| -> Vec<&str> {
        logins
            .iter()
            .filter(|r| r["outcome"] == outcome)
            .filter_map(|r| r["client_ip"].as_str())
            .collect()
    };
    let mut succeeded = seen("success");
    succeeded.sort_unstable();
    assert_eq!(succeeded, ["127.0.0.7", "192.0.2.20"], "{logins:#?}");
    // Five wrong passwords and the throttled sixth.
    assert_eq!(seen("refused"), ["192.0.2.10"; 6], "{logins:#?}");
    let sessions = console.cli(&["admin", "session", "list", "--json"]);
    let sessions: serde_json::Value = serde_json::from_str(&sessions.stdout).expect("JSON");
    let mut from: Vec<&str> = sessions
        .as_array()
        .expect("sessions")
        .iter()
        .filter_map(|s| s["client_ip"].as_str())
        .collect();
    from.sort_unstable();
    assert_eq!(from, ["127.0.0.7", "192.0.2.20"], "{sessions:#}");
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_when_revoked_when_its_password_changes_and_when_its_operator_is_disabled() {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);

    let (token, _) = console.login("alice", PASSWORD).await;
    let sessions = console.cli(&["admin", "session", "list", "--json"]);
    let sessions: serde_json::Value = serde_json::from_str(&sessions.stdout).expect("JSON");
    assert_eq!(sessions[0]["operator"], "alice");
    assert_eq!(sessions[0]["client_ip"], "127.0.0.1");
    assert!(
        !sessions.to_string().contains(&token),
        "the token itself is never shown"
    );
    let id = sessions[0]["id"].as_str().expect("id");
    let out = console.cli(&["admin", "session", "revoke", id]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(console.get("/", Some(&token)).await.status, 303);
    assert_eq!(console.audit("operator.session_revoked").await.len(), 1);

    let (token, _) = console.login("alice", PASSWORD).await;
    let file = console.config.with_file_name("new.password");
    std::fs::write(&file, "a brand new passphrase\n").expect("write");
    let out = console.cli(&[
        "admin",
        "user",
        "passwd",
        "alice",
        "--password-file",
        file.to_str().expect("path"),
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(console.get("/", Some(&token)).await.status, 303);
    let (token, _) = console.login("alice", "a brand new passphrase").await;

    let out = console.cli(&["admin", "user", "disable", "alice", "--yes"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(console.get("/", Some(&token)).await.status, 303);
    let local: IpAddr = "127.0.0.1".parse().expect("ip");
    let refused = console
        .login_from(local, "alice", "a brand new passphrase")
        .await;
    assert_eq!(refused.status, 403, "a disabled operator cannot log in");
    assert_eq!(console.cli(&["admin", "user", "enable", "alice"]).code, 0);
    console.login("alice", "a brand new passphrase").await;

    // Passwords shorter than twelve characters, and from argv, are not
    // taken.
    std::fs::write(&file, "short\n").expect("write");
    let out = console.cli(&[
        "admin",
        "user",
        "create",
        "bob",
        "--password-file",
        file.to_str().expect("path"),
    ]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("at least 12"), "{out:?}");
    let out = console.cli(&["admin", "user", "create", "bob", PASSWORD]);
    assert_eq!(out.code, 2, "a password as an argument: {out:?}");
    let out = console.cli(&["admin", "user", "delete", "alice", "--yes"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        console
            .cli(&["admin", "user", "list", "--json"])
            .stdout
            .trim(),
        "[]"
    );
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_ends_after_session_idle() {
    let console = Console::start("session_idle = \"1s\"\n").await;
    console.create("alice", PASSWORD);
    let (token, _) = console.login("alice", PASSWORD).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // Each look is itself a use, so look from afar: the session's last
        // use is written at most once a minute, and this one stays idle.
        let status = console.get("/", Some(&token)).await.status;
        if status == 303 {
            break;
        }
        assert_eq!(status, 200);
        assert!(Instant::now() < deadline, "the idle session never ended");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    console.server.stop().await;
}

#[test]
fn a_console_on_a_network_address_without_tls_or_on_the_acme_port_refuses_to_start_naming_the_key()
{
    for (admin, says) in [
        (
            "listen = \"0.0.0.0:9443\"",
            "add [admin.tls] (cert = \"…\", key = \"…\", or self_signed = true)",
        ),
        (
            "listen = \"127.0.0.1:14000\"",
            "give the console a port of its own",
        ),
        (
            "listen = \"127.0.0.1:9443\"\nsession_idle = \"1d\"",
            "admin.session_idle",
        ),
    ] {
        let dir = harness::tempdir();
        let toml = format!(
            "listen = \"127.0.0.1:14000\"\ndata_dir = \"{}\"\n[admin]\n{admin}\n[profiles.default]\n",
            dir.path().display()
        );
        let (_etc, config) = harness::config_file(&toml);
        let out = harness::run_cli(&config, &["serve"], &[]);
        assert_eq!(out.code, 2, "{admin}: {out:?}");
        assert!(out.stderr.contains(says), "{admin}: {out:?}");
    }
}

/// The text of the element with `id` in a page (a `<code>` or `<span>`).
fn element_text(page: &str, id: &str) -> String {
    page.split(&format!("id=\"{id}\">"))
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_else(|| panic!("no #{id} in the page: {page}"))
        .to_owned()
}

/// The TOTP code of `secret` (base32, as the enrolment page shows it)
/// `steps` steps from now.
pub(crate) fn totp_code(secret: &str, steps: i64) -> String {
    let secret = data_encoding::BASE32_NOPAD
        .decode(secret.as_bytes())
        .expect("a base32 secret");
    use acme_proxy::clock::Clock;
    let now = acme_proxy::clock::SystemClock.unix();
    format!(
        "{:06}",
        acme_proxy::totp::code(&secret, now / acme_proxy::totp::STEP_SECONDS + steps)
    )
}

impl Console {
    async fn post_as(&self, path: &str, token: &str, csrf: &str, form: &str) -> raw::Resp {
        let cookie = format!("{COOKIE}={token}");
        self.post(
            path,
            &[("cookie", &cookie), ("origin", &self.url)],
            &format!("csrf={csrf}&{form}"),
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_enrols_totp_then_needs_a_code_each_usable_once_or_a_recovery_code_once() {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let local: IpAddr = "127.0.0.1".parse().expect("ip");
    let (token, csrf) = console.login("alice", PASSWORD).await;

    let page = console.get("/account/totp", Some(&token)).await;
    assert_eq!(page.status, 200);
    let html = text(&page);
    assert!(
        html.contains("src=\"data:image&#x2f;svg+xml;base64,"),
        "{html}"
    );
    let secret = element_text(&html, "totp-secret");
    assert_eq!(secret.len(), 32, "160 bits in base32: {secret}");
    // The same secret until it is confirmed.
    let again = text(&console.get("/account/totp", Some(&token)).await);
    assert_eq!(element_text(&again, "totp-secret"), secret);
    let wrong = console
        .post_as("/account/totp", &token, &csrf, "code=000000")
        .await;
    assert_eq!(wrong.status, 403);
    // Kept as sent: the login below offers this very code again,
    // whichever 30-second step the clock is in by then.
    let enrolment_code = totp_code(&secret, 0);
    let done = console
        .post_as(
            "/account/totp",
            &token,
            &csrf,
            &format!("code={enrolment_code}"),
        )
        .await;
    assert_eq!(done.status, 200, "{}", text(&done));
    let codes: Vec<String> = text(&done)
        .split("<li><code>")
        .skip(1)
        .map(|r| r.split('<').next().expect("code").to_owned())
        .collect();
    assert_eq!(codes.len(), 10, "{}", text(&done));
    assert!(
        codes
            .iter()
            .all(|c| c.len() == 11 && c.as_bytes()[5] == b'-'),
        "{codes:?}"
    );
    let listed = console.cli(&["admin", "user", "list", "--json"]);
    assert!(listed.stdout.contains("\"totp\": true"), "{listed:?}");

    // Password alone no longer opens the console.
    let login = console.login_from(local, "alice", PASSWORD).await;
    assert_eq!((login.status, header(&login, "location")), (303, "/login"));
    let half = session_cookie(&login).expect("a session");
    assert_eq!(
        (
            console.get("/", Some(&half)).await.status,
            header(&console.get("/", Some(&half)).await, "location").to_owned()
        ),
        (303, "/login".to_owned())
    );
    let form = text(&console.get("/login", Some(&half)).await);
    assert!(form.contains("name=\"code\""), "{form}");
    let half_csrf = csrf_of(&form);
    // The enrolment's code was taken: it does not open a session.
    let reused = console
        .post_as(
            "/login/totp",
            &half,
            &half_csrf,
            &format!("code={enrolment_code}"),
        )
        .await;
    assert_eq!(reused.status, 403, "{}", text(&reused));
    let next = totp_code(&secret, 1);
    // The code without the session's CSRF token: refused, still half in.
    let forged = console
        .post(
            "/login/totp",
            &[
                ("cookie", &format!("{COOKIE}={half}")),
                ("origin", &console.url),
            ],
            &format!("code={next}"),
        )
        .await;
    assert_eq!(forged.status, 403);
    assert!(text(&forged).contains("did not come from this console"));
    assert_eq!(console.get("/", Some(&half)).await.status, 303);
    let ok = console
        .post_as("/login/totp", &half, &half_csrf, &format!("code={next}"))
        .await;
    assert_eq!((ok.status, header(&ok, "location")), (303, "/"));
    assert_eq!(console.get("/", Some(&half)).await.status, 200);

    // The same code on another login: refused.
    let login = console.login_from(local, "alice", PASSWORD).await;
    let other = session_cookie(&login).expect("a session");
    let other_csrf = csrf_of(&text(&console.get("/login", Some(&other)).await));
    let reused = console
        .post_as("/login/totp", &other, &other_csrf, &format!("code={next}"))
        .await;
    assert_eq!(reused.status, 403);
    // A recovery code works, once.
    let recovery = console
        .post_as(
            "/login/totp",
            &other,
            &other_csrf,
            &format!("recovery_code={}", codes[3].to_uppercase()),
        )
        .await;
    assert_eq!((recovery.status, header(&recovery, "location")), (303, "/"));
    let left = text(&console.get("/account/totp", Some(&other)).await);
    assert_eq!(element_text(&left, "recovery-left"), "9");
    let login = console.login_from(local, "alice", PASSWORD).await;
    let third = session_cookie(&login).expect("a session");
    let third_csrf = csrf_of(&text(&console.get("/login", Some(&third)).await));
    let spent = console
        .post_as(
            "/login/totp",
            &third,
            &third_csrf,
            &format!("recovery_code={}", codes[3]),
        )
        .await;
    assert_eq!(spent.status, 403);
    assert_eq!(console.get("/", Some(&third)).await.status, 303);

    let details: Vec<String> = console
        .audit("operator.login")
        .await
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["outcome"].as_str().unwrap_or(""),
                r["detail"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("success") && d.ends_with("TOTP code")),
        "{details:#?}"
    );
    assert!(
        details
            .iter()
            .any(|d| d.contains("a recovery code used, 9 left")),
        "{details:#?}"
    );
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("refused a wrong, used or expired")),
        "{details:#?}"
    );

    // A lost phone: the operator's authenticator is reset by the CLI.
    let out = console.cli(&["admin", "user", "reset-totp", "alice", "--yes"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        console.get("/", Some(&half)).await.status,
        303,
        "sessions end"
    );
    console.login("alice", PASSWORD).await;
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_totp_an_operator_without_one_sees_only_the_enrolment_page() {
    let console = Console::start("require_totp = true\n").await;
    console.create("alice", PASSWORD);
    let local: IpAddr = "127.0.0.1".parse().expect("ip");
    let login = console.login_from(local, "alice", PASSWORD).await;
    assert_eq!(login.status, 303);
    let token = session_cookie(&login).expect("a session");
    let home = console.get("/", Some(&token)).await;
    assert_eq!(
        (home.status, header(&home, "location")),
        (303, "/account/totp")
    );
    let page = text(&console.get("/account/totp", Some(&token)).await);
    let secret = element_text(&page, "totp-secret");
    let csrf = csrf_of(&page);
    let done = console
        .post_as(
            "/account/totp",
            &token,
            &csrf,
            &format!("code={}", totp_code(&secret, 0)),
        )
        .await;
    assert_eq!(done.status, 200);
    assert_eq!(console.get("/", Some(&token)).await.status, 200);
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_for_an_operator_and_none_without_a_session() {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let (token, _) = console.login("alice", PASSWORD).await;
    let pages = [
        "/",
        "/orders",
        "/orders?name=a.example.test&status=valid",
        "/accounts",
        "/accounts?contact=ops&status=valid",
        "/audit",
        "/audit?event=operator.login&outcome=success",
        "/eab",
        "/relay",
        "/relay?status=any",
        "/profiles",
        "/policy",
        "/jobs",
        "/jobs?status=queued",
        "/account/totp",
    ];
    for page in pages {
        let resp = console.get(page, Some(&token)).await;
        assert_eq!(resp.status, 200, "{page}: {}", text(&resp));
        assert!(text(&resp).contains("</html>"), "{page}");
        let anonymous = console.get(page, None).await;
        assert_eq!(
            (anonymous.status, header(&anonymous, "location")),
            (303, "/login"),
            "{page} without a session"
        );
    }
    // Bad filters are refused with a page saying which, not a 500.
    // htmx, whose requests follow redirects inside the page, is told to
    // go to the login page instead.
    let swapped = raw::request_with(
        "GET",
        &format!("{}/orders?name=a", console.url),
        &[("hx-request", "true")],
        vec![],
    )
    .await;
    assert_eq!(
        (swapped.status, header(&swapped, "hx-redirect")),
        (200, "/login")
    );
    for page in [
        "/orders?status=lost",
        "/accounts?status=lost",
        "/audit?event=nope",
    ] {
        let resp = console.get(page, Some(&token)).await;
        assert_eq!(resp.status, 400, "{page}");
    }
    for page in [
        "/orders/nope",
        "/accounts/nope",
        "/orders/nope/chain.pem",
        "/nope",
    ] {
        let resp = console.get(page, Some(&token)).await;
        assert_eq!(resp.status, 404, "{page}");
    }
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_page_explains_a_refusal_and_an_allowance_as_policy_explain_does() {
    let policy = "\n[policy.checks.lab_network]\ntype = \"client_ip\"\nnetworks = [\"10.20.0.0/16\"]\n\
        [policy.checks.lab_names]\ntype = \"identifiers\"\nallow = [\"*.lab.example.internal\"]\n\
        [[policy.rules]]\nname = \"lab-names-from-the-lab\"\nwhen = \"lab_names and not lab_network\"\n\
        then = \"deny\"\nmessage = \"lab names are issued to hosts on the lab network only\"\n";
    let console = Console::start_with(policy, "bypass = true\n").await;
    console.create("alice", PASSWORD);
    let (token, _) = console.login("alice", PASSWORD).await;
    for (client, decision) in [("10.99.0.1", "refused"), ("10.20.0.5", "allowed")] {
        let page = console
            .get(
                &format!(
                    "/policy?profile=default&client_ip={client}&identifiers=a.lab.example.internal"
                ),
                Some(&token),
            )
            .await;
        assert_eq!(page.status, 200, "{}", text(&page));
        let html = text(&page);
        assert_eq!(element_text(&html, "decision"), decision, "{client}");
        assert!(html.contains("lab-names-from-the-lab"), "{html}");
        let cli = console.cli(&[
            "policy",
            "explain",
            "--profile",
            "default",
            "--client-ip",
            client,
            "--identifier",
            "a.lab.example.internal",
        ]);
        assert!(
            cli.stdout.contains(&format!("decision: {decision}")),
            "{cli:?}"
        );
        // The page's lines are the command's, escaped.
        for line in cli.stdout.lines() {
            let escaped = line
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('"', "&quot;")
                .replace('\'', "&#x27;")
                .replace('/', "&#x2f;");
            assert!(html.contains(&escaped), "{line:?} not on the page:\n{html}");
        }
    }
    for bad in [
        "/policy?profile=nope&client_ip=10.0.0.1",
        "/policy?profile=default&client_ip=nope",
    ] {
        assert_eq!(console.get(bad, Some(&token)).await.status, 400, "{bad}");
    }
    let profiles = text(&console.get("/profiles", Some(&token)).await);
    assert!(
        profiles.contains("&#x2f;profile&#x2f;default&#x2f;directory"),
        "{profiles}"
    );
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_hashed_with_older_parameters_is_rehashed_with_todays_at_login() {
    use argon2::password_hash::{PasswordHasher, SaltString};
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let store = console.server.running().authority().store().clone();
    let today = store
        .operator("alice")
        .await
        .expect("read")
        .expect("alice")
        .password_hash;
    assert!(today.contains("m=19456,t=2,p=1"), "{today}");
    // As an older release would have stored it: weaker parameters.
    let older = argon2::Argon2::new(
        argon2::Algorithm::Argon2id,
        argon2::Version::V0x13,
        argon2::Params::new(8192, 1, 1, None).expect("params"),
    )
    .hash_password(
        PASSWORD.as_bytes(),
        &SaltString::encode_b64(b"sixteen byte slt").expect("salt"),
    )
    .expect("hash")
    .to_string();
    assert!(
        store
            .upgrade_operator_hash("alice", &today, &older)
            .await
            .expect("write")
    );
    let (cookie, _) = console.login("alice", PASSWORD).await;
    let upgraded = store
        .operator("alice")
        .await
        .expect("read")
        .expect("alice")
        .password_hash;
    assert_ne!(upgraded, older, "the login left the old hash");
    assert!(upgraded.contains("m=19456,t=2,p=1"), "{upgraded}");
    // Same password, the session that logged in still there, and the new
    // hash logs in too.
    assert_eq!(console.get("/", Some(&cookie)).await.status, 200);
    console.login("alice", PASSWORD).await;
    assert_eq!(
        store
            .operator("alice")
            .await
            .expect("read")
            .expect("alice")
            .password_hash,
        upgraded,
        "a current hash is left alone"
    );
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_use_ends_at_its_absolute_lifetime() {
    let console = Console::start("session_idle = \"2s\"\nsession_lifetime = \"3s\"\n").await;
    console.create("alice", PASSWORD);
    let (cookie, _) = console.login("alice", PASSWORD).await;
    let started = Instant::now();
    let store = console.server.running().authority().store().clone();
    let digest = ring::digest::digest(&ring::digest::SHA256, cookie.as_bytes());
    let deadline = started + Duration::from_secs(15);
    loop {
        // In use all along (a use is written at most once a minute, so
        // write it here): never idle, only old.
        let now = console.server.running().authority().clock.unix();
        store
            .touch_operator_session(digest.as_ref(), now)
            .await
            .expect("touch");
        let status = console.get("/", Some(&cookie)).await.status;
        if status == 303 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            Instant::now() < deadline,
            "the session outlived its lifetime"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Not before its lifetime (seconds are whole: 3 s less one).
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "ended after {:?}",
        started.elapsed()
    );
    console.server.stop().await;
}

/// POST /login over TLS on a connection whose ALPN chose `alpn`, with
/// `origin`; the status and whether a session cookie came back.
async fn tls_login(
    console: &Console,
    tls: &std::sync::Arc<rustls::ClientConfig>,
    alpn: &[u8],
    origin: &str,
) -> (u16, http::Version, bool) {
    use http_body_util::{BodyExt as _, Full};

    let addr: std::net::SocketAddr = console
        .url
        .trim_start_matches("https://")
        .parse()
        .expect("the console's address");
    let (stream, _) = crate::tls::connect(tls, addr, &[alpn]).await;
    let form =
        serde_urlencoded::to_string([("username", "alice"), ("password", PASSWORD)]).expect("form");
    let req = http::Request::post(format!("{}/login", console.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", origin)
        .body(Full::new(bytes::Bytes::from(form)))
        .expect("request");
    let resp = crate::tls::send(stream, req).await;
    let status = resp.status().as_u16();
    let version = resp.version();
    let cookie = resp
        .headers()
        .get_all(http::header::SET_COOKIE)
        .iter()
        .any(|v| v.to_str().unwrap_or("").starts_with(COOKIE));
    let _ = resp.into_body().collect().await;
    (status, version, cookie)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_login_from_the_consoles_own_origin_works_in_h2_and_http11_and_another_origin_is_refused()
 {
    let pki = crate::upstream::TestPki::new();
    let (cert, key) = pki.server_cert(&["127.0.0.1"]);
    let console = Console::start(&format!(
        "[admin.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    ))
    .await;
    assert!(console.url.starts_with("https://"), "{}", console.url);
    console.create("alice", PASSWORD);
    let tls = pki.rustls_client_config();
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let (status, version, cookie) = tls_login(&console, &tls, alpn, &console.url).await;
        let expected = if alpn == b"h2" {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        assert_eq!(version, expected);
        assert_eq!((status, cookie), (303, true), "{version:?}");
        let elsewhere = tls_login(&console, &tls, alpn, "https://evil.example.test").await;
        assert_eq!((elsewhere.0, elsewhere.2), (403, false), "{version:?}");
    }
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_passwords_sent_all_at_once_are_counted_before_hashing_so_only_five_are_hashed() {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let from: IpAddr = "127.0.0.5".parse().expect("ip");
    // Twelve at once: with two hashing slots, most wait for a slot after
    // the throttle let them in, before any failure was counted.
    let mut attempts = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let url = console.url.clone();
        attempts.spawn(async move {
            let form = serde_urlencoded::to_string([
                ("username", "alice"),
                ("password", "not the password"),
            ])
            .expect("form");
            raw::request_from(
                from,
                "POST",
                &format!("{url}/login"),
                &[
                    ("content-type", "application/x-www-form-urlencoded"),
                    ("origin", &url),
                ],
                form.into_bytes(),
            )
            .await
            .status
        });
    }
    let statuses = attempts.join_all().await;
    let hashed = statuses.iter().filter(|s| **s == 403).count();
    let throttled = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((hashed, throttled), (5, 7), "{statuses:?}");
    console.server.stop().await;
}

impl Console {
    /// A form POST with the session's cookie and CSRF token, from `from`.
    async fn post_from(
        &self,
        from: IpAddr,
        path: &str,
        token: &str,
        csrf: &str,
        form: &str,
    ) -> raw::Resp {
        let cookie = format!("{COOKIE}={token}");
        raw::request_from(
            from,
            "POST",
            &format!("{}{path}", self.url),
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("cookie", &cookie),
                ("origin", &self.url),
            ],
            format!("csrf={csrf}&{form}").into_bytes(),
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_right_password_does_not_wipe_the_wrong_totp_codes_counted_on_the_name() {
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let (token, csrf) = console.login("alice", PASSWORD).await;
    let html = text(&console.get("/account/totp", Some(&token)).await);
    let secret = element_text(&html, "totp-secret");
    let enrolled = console
        .post_as(
            "/account/totp",
            &token,
            &csrf,
            &format!("code={}", totp_code(&secret, 0)),
        )
        .await;
    assert_eq!(enrolled.status, 200, "{}", text(&enrolled));
    // Each request from an address of its own: only the name's count
    // can throttle.
    let address = |n: u8| IpAddr::from([127, 0, 0, n]);
    let shared = &console;
    let half_login = |from: IpAddr| async move {
        let console = shared;
        let login = console.login_from(from, "alice", PASSWORD).await;
        assert_eq!((login.status, header(&login, "location")), (303, "/login"));
        let half = session_cookie(&login).expect("a session");
        let half_csrf = csrf_of(&text(&console.get("/login", Some(&half)).await));
        (half, half_csrf)
    };
    let (half, half_csrf) = half_login(address(11)).await;
    for n in 12..16 {
        let wrong = console
            .post_from(address(n), "/login/totp", &half, &half_csrf, "code=000000")
            .await;
        assert_eq!(wrong.status, 403, "{}", text(&wrong));
    }
    // The password again: a new half-made session, and the four wrong
    // codes still count.
    let (again, again_csrf) = half_login(address(16)).await;
    let fifth = console
        .post_from(
            address(17),
            "/login/totp",
            &again,
            &again_csrf,
            "code=000000",
        )
        .await;
    assert_eq!(fifth.status, 403, "{}", text(&fifth));
    let sixth = console
        .post_from(
            address(18),
            "/login/totp",
            &again,
            &again_csrf,
            &format!("code={}", totp_code(&secret, 1)),
        )
        .await;
    assert_eq!(sixth.status, 429, "{}", text(&sixth));
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_sweep_deletes_sessions_past_their_idle_time() {
    use acme_proxy::jobs::JobHandler as _;

    let console = Console::start("session_idle = \"1s\"\n").await;
    console.create("alice", PASSWORD);
    let (token, _) = console.login("alice", PASSWORD).await;
    let running = console.server.running();
    let store = running.authority().store().clone();
    assert_eq!(
        store
            .list_operator_sessions(None)
            .await
            .expect("list")
            .len(),
        1
    );
    // The sweep as the job runner runs it (every five minutes).
    let sweep = acme_proxy::authority::NonceSweep {
        generations: running.generations.clone(),
        every: Duration::from_secs(300),
        sessions: Some((Duration::from_secs(1), Duration::from_secs(3600))),
    };
    let job = store
        .list_jobs(Some("nonce_sweep"), None, None, 1)
        .await
        .expect("jobs")
        .pop()
        .expect("the periodic sweep's job");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        sweep.run(&job).await;
        if store
            .list_operator_sessions(None)
            .await
            .expect("list")
            .is_empty()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle session was never swept"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(console.get("/", Some(&token)).await.status, 303);
    console.server.stop().await;
}
