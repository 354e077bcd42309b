//! The web console in a real browser: Debian's headless Chromium driven
//! over WebDriver (chromedriver) against the server's own listener.
//! Every page visited is saved as a screenshot under the tests' output
//! directory (`target/tmp/console-screenshots/`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use crate::console::{Console, PASSWORD, totp_code};
use crate::harness::{self, ChildGuard};

/// A headless Chromium session, with its chromedriver and profile.
struct Browser {
    client: Client,
    shots: PathBuf,
    test: &'static str,
    profile: tempfile::TempDir,
    _driver: ChildGuard,
}

impl Drop for Browser {
    /// A test that fails before `close` leaves Chromium running: killing
    /// chromedriver does not end the browser it started. Every Chromium
    /// process of this session names its own profile directory, so those
    /// are ended here (nothing is found after a clean `close`).
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .arg("-KILL")
            .arg("-f")
            .arg(format!("--user-data-dir={}", self.profile.path().display()))
            .status();
    }
}

impl Browser {
    /// None when Chromium or chromedriver is missing outside CI (the test
    /// then skips; under CI it fails).
    async fn start(test: &'static str) -> Option<Browser> {
        if !harness::require_program("chromedriver") || !harness::require_program("chromium") {
            return None;
        }
        // Port 0: chromedriver picks one and says which.
        let mut child = Command::new("chromedriver")
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let stdout = child.stdout.take().expect("stdout");
        let driver = ChildGuard(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(port) = line
                    .split("started successfully on port ")
                    .nth(1)
                    .and_then(|rest| rest.trim_end_matches('.').trim().parse::<u16>().ok())
                {
                    let _ = tx.send(port);
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromedriver said on which port it listens");
        let profile = harness::tempdir();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".to_owned(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session");
        let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
        std::fs::create_dir_all(&shots).expect("screenshot directory");
        Some(Browser {
            client,
            shots,
            test,
            profile,
            _driver: driver,
        })
    }

    async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("navigate");
    }

    /// The path of the page shown now.
    async fn path(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("current URL")
            .path()
            .to_owned()
    }

    async fn fill(&self, css: &str, text: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .send_keys(text)
            .await
            .expect("type");
    }

    async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .click()
            .await
            .expect("click");
    }

    /// Clicks a button that submits a form, and waits until the browser
    /// shows the answer: the old page's root element gone stale.
    async fn submit(&self, css: &str) {
        let old = self
            .client
            .find(Locator::Css("html"))
            .await
            .expect("the page's root");
        self.click(css).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while old.tag_name().await.is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "{css}: no new page within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Clicks a button of a form htmx enhances, and waits until its
    /// answer replaced `#results` in place: the page itself stays (no
    /// navigation), which shows that htmx ran under the console's CSP.
    async fn swap(&self, css: &str) {
        let root = self
            .client
            .find(Locator::Css("html"))
            .await
            .expect("the page's root");
        let results = self
            .client
            .find(Locator::Css("#results"))
            .await
            .expect("the results");
        self.click(css).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while results.tag_name().await.is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "{css}: the results were not replaced within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            root.tag_name().await.is_ok(),
            "{css}: the whole page was loaded again, not swapped in place"
        );
    }

    async fn text(&self, css: &str) -> String {
        let found = self.client.find(Locator::Css(css)).await;
        let source = match &found {
            Ok(_) => String::new(),
            Err(_) => self.client.source().await.unwrap_or_default(),
        };
        found
            .unwrap_or_else(|e| panic!("{css}: {e}\n{source}"))
            .text()
            .await
            .expect("text")
    }

    async fn texts(&self, css: &str) -> Vec<String> {
        let mut all = Vec::new();
        for e in self.client.find_all(Locator::Css(css)).await.expect("find") {
            all.push(e.text().await.expect("text"));
        }
        all
    }

    async fn script(&self, js: &str) -> serde_json::Value {
        self.client
            .execute(js, vec![])
            .await
            .unwrap_or_else(|e| panic!("{js}: {e}"))
    }

    /// Saves the page as `TEST-NAME.png`.
    async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::write(self.shots.join(format!("{}-{name}.png", self.test)), png)
            .expect("write the screenshot");
    }

    /// Logs in with the password (and nothing else).
    async fn login(&self, base: &str, name: &str, password: &str) {
        self.goto(&format!("{base}/login")).await;
        self.fill("input[name=username]", name).await;
        self.fill("input[name=password]", password).await;
        self.submit("form[action='/login'] button[type=submit]")
            .await;
    }

    async fn logout(&self) {
        self.submit("form[action='/logout'] button").await;
        assert_eq!(self.path().await, "/login");
    }

    async fn close(self) {
        self.client
            .clone()
            .close()
            .await
            .expect("close the browser");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_an_operator_logs_in_enrols_totp_and_then_needs_a_code_each_usable_once() {
    let Some(browser) = Browser::start("totp").await else {
        return;
    };
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let base = console.url.clone();

    // Anything asked for before logging in goes to the login page.
    browser.goto(&format!("{base}/")).await;
    assert_eq!(browser.path().await, "/login");
    browser.shot("login").await;
    browser.login(&base, "alice", "not the password").await;
    assert_eq!(browser.text("p.error").await, "Wrong name or password.");
    browser.login(&base, "alice", PASSWORD).await;
    assert_eq!(browser.path().await, "/");
    assert_eq!(browser.text("h1").await, "Dashboard");
    browser.shot("dashboard").await;

    // The session cookie as the browser keeps it: out of scripts' reach.
    let cookie = browser
        .client
        .get_named_cookie("__Host-acme-proxy-session")
        .await
        .expect("the session cookie");
    assert_eq!(cookie.http_only(), Some(true));
    assert_eq!(cookie.secure(), Some(true));
    assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");
    assert_eq!(browser.script("return document.cookie").await, json!(""));

    // Enrol: the QR code is drawn, and its secret is shown as text.
    browser.goto(&format!("{base}/account/totp")).await;
    let secret = browser.text("#totp-secret").await;
    let drawn = browser
        .script("const i = document.querySelector('img.qr'); return i.complete && i.naturalWidth;")
        .await;
    assert!(drawn.as_u64().unwrap_or(0) >= 200, "QR image: {drawn}");
    browser.shot("totp-enrol").await;
    // Kept as typed: the login below must offer this very code again,
    // whichever 30-second step the clock is in by then.
    let enrolment_code = totp_code(&secret, 0);
    browser.fill("input[name=code]", &enrolment_code).await;
    browser.submit("form[action='/account/totp'] button").await;
    let codes = browser.texts("ul.recovery-codes code").await;
    assert_eq!(codes.len(), 10, "{codes:?}");
    browser.shot("totp-recovery-codes").await;
    browser.goto(&format!("{base}/")).await;
    browser.logout().await;

    // Password, then a code; the enrolment's code is spent.
    browser.login(&base, "alice", PASSWORD).await;
    assert_eq!(browser.path().await, "/login");
    browser.shot("login-totp").await;
    browser.goto(&format!("{base}/")).await;
    assert_eq!(browser.path().await, "/login", "no page before the code");
    browser.fill("input[name=code]", &enrolment_code).await;
    browser.submit("form[action='/login/totp'] button").await;
    assert!(
        browser.text("p.error").await.contains("was used already"),
        "a reused code is refused"
    );
    browser.shot("login-totp-reused").await;
    browser
        .fill("input[name=code]", &totp_code(&secret, 1))
        .await;
    browser.submit("form[action='/login/totp'] button").await;
    assert_eq!(browser.path().await, "/");
    browser.logout().await;

    // A recovery code instead, once.
    for attempt in 0..2 {
        browser.login(&base, "alice", PASSWORD).await;
        browser.click("details summary").await;
        browser.fill("input[name=recovery_code]", &codes[0]).await;
        browser.submit("details button").await;
        if attempt == 0 {
            assert_eq!(browser.path().await, "/", "the recovery code works");
            browser.logout().await;
        } else {
            assert_eq!(browser.path().await, "/login/totp");
            assert!(browser.text("p.error").await.contains("was used already"));
            browser.shot("recovery-code-spent").await;
        }
    }
    browser.close().await;
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_certbot_issuance_shows_on_the_dashboard_and_its_order_page_revokes_it() {
    if !harness::require_program("certbot") {
        return;
    }
    let Some(browser) = Browser::start("dashboard").await else {
        return;
    };
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    // The profile bypasses validation: certbot's manual hook need do
    // nothing.
    let dir = harness::tempdir();
    let d = dir.path().to_path_buf();
    let mut args = vec!["certonly".to_owned()];
    args.extend(crate::clients::certbot_common(
        &d,
        &console.server.directory("default"),
    ));
    args.extend(
        [
            "--manual",
            "--preferred-challenges",
            "http",
            "--manual-auth-hook",
            "/bin/true",
            "-d",
            "dash.example.test",
            "--cert-name",
            "t",
        ]
        .map(str::to_owned),
    );
    let ran = crate::clients::run("certbot", args, d.clone()).await;
    assert!(
        ran.success(),
        "certbot: {}\n{}",
        ran.report(),
        crate::clients::certbot_log_tail(&d)
    );

    browser.login(&console.url, "alice", PASSWORD).await;
    assert_eq!(browser.path().await, "/");
    let today = browser
        .script(
            "const r = [...document.querySelectorAll('figure[data-profile=default] rect.issued')]; \
             return r[r.length - 1].dataset.count + ' ' + r[r.length - 1].getAttribute('height');",
        )
        .await;
    let today = today.as_str().expect("a count and a height").to_owned();
    let (count, height) = today.split_once(' ').expect("two values");
    assert_eq!(count, "1", "today's bar counts the issuance");
    assert!(
        height.parse::<i64>().expect("height") > 0,
        "and is drawn: {today}"
    );
    assert_eq!(
        browser
            .text("figure[data-profile=default] .issued-total")
            .await,
        "1"
    );
    browser.shot("dashboard-after-issuance").await;

    // Found by name on the orders page, shown with its certificate.
    browser.goto(&format!("{}/orders", console.url)).await;
    // htmx loaded from the console itself, held to its configuration: no
    // style element of its own (the CSP allows none inline).
    assert_eq!(
        browser
            .script("return [typeof htmx, document.querySelectorAll('style').length];")
            .await,
        serde_json::json!(["object", 0])
    );
    browser.fill("input[name=name]", "DASH.example.test.").await;
    browser.swap("form.search button").await;
    assert_eq!(
        browser.texts("table.orders td.names").await,
        ["dash.example.test"]
    );
    // The search is in the address (a link to it works without script),
    // and no copy of the page went to sessionStorage.
    assert_eq!(
        browser
            .script("return [location.search, sessionStorage.getItem('htmx-history-cache')];")
            .await,
        serde_json::json!([
            "?name=DASH.example.test.&serial=&account=&profile=&status=",
            null
        ])
    );
    browser.shot("orders").await;
    browser.submit("table.orders td a").await;
    assert!(browser.path().await.starts_with("/orders/"));
    assert_eq!(browser.text("#order-status").await, "valid");
    let serial = browser.text("#serial").await;
    let cert = std::fs::read_to_string(d.join("conf/live/t/cert.pem")).expect("certbot's cert");
    let (_, der) = x509_parser::pem::parse_x509_pem(cert.as_bytes()).expect("PEM");
    let (_, leaf) = x509_parser::parse_x509_certificate(&der.contents).expect("DER");
    assert_eq!(
        serial,
        hex::encode(leaf.raw_serial()),
        "the page shows certbot's serial"
    );
    // The chain link downloads what certbot got.
    let href = browser
        .script("return document.querySelector('a[download]').getAttribute('href')")
        .await;
    let chain = crate::raw::request_with(
        "GET",
        &format!("{}{}", console.url, href.as_str().expect("href")),
        &[("cookie", &session_cookie_of(&browser).await)],
        vec![],
    )
    .await;
    assert_eq!(chain.status, 200);
    assert!(String::from_utf8_lossy(&chain.body).starts_with(cert.trim_end()));
    browser.shot("order").await;

    // Revoke, confirmed, for keyCompromise.
    browser
        .client
        .find(Locator::Css("select[name=reason] option[value='1']"))
        .await
        .expect("the reason")
        .click()
        .await
        .expect("choose it");
    browser.click("input[name=confirm]").await;
    browser.submit("form.revoke button").await;
    assert!(
        browser.text("#revoked").await.ends_with("(reason 1)"),
        "the page shows the revocation"
    );
    browser.shot("order-revoked").await;
    let (status, _, crl) =
        crate::flow::reqwest_get(&format!("{}/profile/default/crl", console.server.base())).await;
    assert_eq!(status, 200);
    let (_, crl) = x509_parser::parse_x509_crl(&crl).expect("a DER CRL");
    assert!(
        crl.iter_revoked_certificates()
            .any(|r| hex::encode(r.raw_serial()) == serial),
        "the served CRL lists the serial revoked from the page"
    );
    let audit = console.cli(&["audit", "list", "--event", "certificate.revoked", "--json"]);
    let audit: serde_json::Value = serde_json::from_str(&audit.stdout).expect("JSON");
    assert_eq!(audit[0]["actor"], "operator:alice");
    assert_eq!(audit[0]["serial"], serial.as_str());
    browser.close().await;
    console.server.stop().await;
}

/// The session cookie the browser holds, as a `Cookie` header's value.
async fn session_cookie_of(browser: &Browser) -> String {
    let cookie = browser
        .client
        .get_named_cookie("__Host-acme-proxy-session")
        .await
        .expect("the session cookie");
    format!("{}={}", cookie.name(), cookie.value())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_an_eab_credential_minted_on_the_page_registers_lego_and_is_revoked_there() {
    if !harness::require_program("lego") {
        return;
    }
    let Some(browser) = Browser::start("eab").await else {
        return;
    };
    let console = Console::start_with("", "bypass = true\neab = \"required\"\n").await;
    console.create("alice", PASSWORD);
    browser.login(&console.url, "alice", PASSWORD).await;
    browser.goto(&format!("{}/eab", console.url)).await;
    browser
        .fill("form.mint input[name=label]", "fleet <b>one</b>")
        .await;
    browser.submit("form.mint button").await;
    let kid = browser.text("#eab-kid").await;
    let hmac = browser.text("#eab-hmac").await;
    browser.shot("minted").await;
    // The label is text, not markup.
    assert_eq!(
        browser
            .text(&format!("tr[data-kid='{kid}'] td:nth-child(3)"))
            .await,
        "fleet <b>one</b>"
    );

    // lego registers with what the page showed (and, the profile
    // bypassing validation, gets a certificate through its webroot).
    let home = harness::tempdir();
    let d = home.path().to_path_buf();
    let webroot = d.join("webroot");
    std::fs::create_dir_all(&webroot).expect("webroot");
    let args: Vec<String> = [
        "--server",
        &console.server.directory("default"),
        "--email",
        "admin@example.test",
        "--accept-tos",
        "--path",
        d.to_str().expect("utf-8"),
        "--key-type",
        "ec256",
        "--eab",
        "--kid",
        &kid,
        "--hmac",
        &hmac,
        "--http",
        "--http.webroot",
        webroot.to_str().expect("utf-8"),
        "-d",
        "eab.example.test",
        "run",
    ]
    .map(str::to_owned)
    .to_vec();
    let ran = crate::clients::run("lego", args, d.clone()).await;
    assert!(
        ran.success(),
        "lego with the page's credential: {}",
        ran.report()
    );

    // A reload shows the account bound to it; revoke it there.
    browser.goto(&format!("{}/eab", console.url)).await;
    let row = format!("tr[data-kid='{kid}']");
    assert_eq!(browser.text(&format!("{row} td.accounts")).await, "1");
    assert!(
        browser.texts("#eab-hmac").await.is_empty(),
        "the key is never shown again"
    );
    browser.click(&format!("{row} input[name=confirm]")).await;
    browser.submit(&format!("{row} button")).await;
    assert_eq!(browser.text(&format!("{row} td.status")).await, "revoked");
    browser.shot("revoked").await;
    let audit = console.cli(&["audit", "list", "--event", "eab.revoked", "--json"]);
    let audit: serde_json::Value = serde_json::from_str(&audit.stdout).expect("JSON");
    assert_eq!(audit[0]["actor"], "operator:alice");
    browser.close().await;
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_what_clients_chose_is_shown_as_text_and_never_runs() {
    let Some(browser) = Browser::start("xss").await else {
        return;
    };
    let console = Console::start("").await;
    console.create("alice", PASSWORD);
    let script_ua = "<script>window.__xss=1</script>";
    let contact = "mailto:x\"'/onmouseover=window.__xss=2//@example.test";
    let identifier = "\"><img src=x onerror=window.__xss=3>";

    // An account whose contact breaks out of an attribute, registered by a
    // client whose user agent is a script.
    let directory = crate::raw::directory(&console.server.directory("default")).await;
    let key = crate::raw::Key::p256();
    let url = directory["newAccount"].as_str().expect("newAccount");
    let protected = json!({"alg": key.alg(), "jwk": key.jwk, "nonce": crate::raw::nonce(&directory).await, "url": url});
    let body = key.sign(
        &protected,
        Some(&json!({"termsOfServiceAgreed": true, "contact": [contact]})),
    );
    let made = crate::raw::request_with(
        "POST",
        url,
        &[
            ("content-type", "application/jose+json"),
            ("user-agent", script_ua),
        ],
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.body));
    let account_url = made.location().expect("the account's URL");
    let account_id = account_url.rsplit('/').next().expect("id").to_owned();
    // An order for an identifier that is markup: refused, and audited with
    // the identifier as sent.
    let url = directory["newOrder"].as_str().expect("newOrder");
    let protected = json!({"alg": key.alg(), "kid": account_url, "nonce": crate::raw::nonce(&directory).await, "url": url});
    let body = key.sign(
        &protected,
        Some(&json!({"identifiers": [{"type": "dns", "value": identifier}]})),
    );
    let refused = crate::raw::request_with(
        "POST",
        url,
        &[
            ("content-type", "application/jose+json"),
            ("user-agent", script_ua),
        ],
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(
        refused.status,
        400,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );

    browser.login(&console.url, "alice", PASSWORD).await;
    let inert = "return typeof window.__xss === 'undefined' \
                 && document.querySelectorAll('img[onerror], [onmouseover], main script').length === 0";
    for (path, shot) in [
        ("/audit".to_owned(), "audit"),
        ("/accounts".to_owned(), "accounts"),
        (format!("/accounts/{account_id}"), "account"),
        ("/".to_owned(), "dashboard"),
    ] {
        browser.goto(&format!("{}{path}", console.url)).await;
        assert_eq!(browser.script(inert).await, json!(true), "{path}");
        browser.shot(shot).await;
        let shown = browser.text("main").await;
        if path == "/audit" {
            assert!(shown.contains(script_ua), "{path}: {shown}");
            assert!(shown.contains(identifier), "{path}: {shown}");
        }
        if path.starts_with("/accounts") {
            assert!(shown.contains(contact), "{path}: {shown}");
        }
        if path.starts_with("/accounts/") {
            assert_eq!(browser.text("#account-contact").await, contact);
        }
    }
    browser.close().await;
    console.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_relay_order_held_by_an_upstream_fault_is_cancelled_from_the_relay_queue() {
    use crate::relay::{NEW_ORDER, Relaying, bypass_profile, relay_issue};
    use crate::upstream::{Fault, FaultProxy, Match, Pebble, TestPki};
    let pki = TestPki::new();
    let Some(pebble) = Pebble::start(&pki, crate::relay::always_valid()) else {
        return;
    };
    let Some(browser) = Browser::start("relay").await else {
        return;
    };
    let proxy = FaultProxy::start(&pki, pebble.addr);
    let profiles = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n{}",
        bypass_profile(&proxy.directory_url(), &pki, "")
    );
    let relaying = Relaying::start(&profiles).await;
    let password = relaying.config.with_file_name("alice.password");
    std::fs::write(&password, format!("{PASSWORD}\n")).expect("password file");
    let made = harness::run_cli(
        &relaying.config,
        &[
            "admin",
            "user",
            "create",
            "alice",
            "--password-file",
            password.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(made.code, 0, "{made:?}");
    let base = relaying
        .server
        .running()
        .admin_url
        .clone()
        .expect("the console")
        .trim_end_matches('/')
        .to_owned();

    // The upstream is down for good: the relay keeps retrying.
    proxy.set_always(Match::PathContains(NEW_ORDER), Some(Fault::Unavailable503));
    let order = tokio::spawn({
        let account = relaying.account.clone();
        async move { relay_issue(&account, &["stuck.example.test"], Duration::from_secs(60)).await }
    });
    browser.login(&base, "alice", PASSWORD).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        browser.goto(&format!("{base}/relay")).await;
        let attempts = browser.texts("table.relay td.attempts").await;
        if attempts
            .first()
            .and_then(|a| a.trim().parse::<u32>().ok())
            .is_some_and(|a| a >= 2)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stuck relay never showed in the queue with its retries: {attempts:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let error = browser.text("table.relay td.error").await;
    assert!(!error.is_empty(), "the last error is shown");
    browser.shot("stuck").await;
    browser
        .click("table.relay form.cancel input[name=confirm]")
        .await;
    browser.submit("table.relay form.cancel button").await;
    assert_eq!(browser.path().await, "/relay");

    let relayed = order.await.expect("the client's order");
    assert!(
        relayed.result.is_err(),
        "the cancelled relay's order ends invalid: {:?}",
        relayed.result
    );
    let store = relaying.server.running().authority().store().clone();
    let failed = acme_proxy::admin::ops::list_audit(
        &store,
        &acme_proxy_store::AuditFilter {
            event: Some(acme_proxy_store::AuditEvent::CertificateIssueFailed),
            ..Default::default()
        },
        10,
    )
    .await
    .expect("audit");
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0].actor, "operator:alice");
    browser.goto(&format!("{base}/relay?status=invalid")).await;
    browser.shot("cancelled").await;
    assert_eq!(browser.texts("table.relay td.state").await.len(), 1);
    browser.close().await;
    relaying.server.stop().await;
}
