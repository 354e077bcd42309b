//! External Account Binding (RFC 8555 §7.3.4): credentials minted with
//! `acme-proxy eab create`, lego and certbot registering with them, every
//! malformed or forged binding refused with its problem type, a revoked
//! credential refused at registration and at newOrder, and a credential
//! limited to name globs enforced at newOrder; a rate-limit override for a
//! credential shared by its accounts.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use instant_acme::{ExternalAccountKey, Identifier, NewAccount, NewOrder};
use serde_json::{Value, json};

use crate::clients::{certbot_certonly_standalone, leaf, lego_http_run, run};
use crate::harness::{self, CliOutput, TestServer};
use crate::raw::{self, Key, b64};
use crate::{client, harness::free_port};

/// A profile that requires a binding; validation bypassed (this is about
/// registration and order policy, not challenges).
const REQUIRED: &str = "[profiles.default]\nbypass = true\neab = \"required\"\n";

fn json_of(out: &CliOutput) -> Value {
    assert_eq!(out.code, 0, "{out:?}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// (kid, base64url HMAC key) of a credential minted through the CLI.
fn mint(config: &std::path::Path, extra: &[&str]) -> (String, String) {
    let mut args = vec!["eab", "create", "--json"];
    args.extend_from_slice(extra);
    let v = json_of(&harness::run_cli(config, &args, &[("USER", "alice")]));
    (
        v["kid"].as_str().expect("kid").to_owned(),
        v["hmac_key"].as_str().expect("hmac_key").to_owned(),
    )
}

/// The binding a client builds: HS256 over `{alg, kid, url}` and `payload`.
fn binding(kid: &str, url: &str, payload: &Value, key: &[u8]) -> Value {
    let protected = b64(json!({"alg": "HS256", "kid": kid, "url": url})
        .to_string()
        .as_bytes());
    let payload = b64(payload.to_string().as_bytes());
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag = ring::hmac::sign(&k, format!("{protected}.{payload}").as_bytes());
    json!({"protected": protected, "payload": payload, "signature": b64(tag.as_ref())})
}

async fn new_account(dir: &Value, key: &Key, payload: &Value) -> raw::Resp {
    let url = dir["newAccount"].as_str().expect("newAccount");
    let protected =
        json!({"alg": key.alg(), "jwk": key.jwk, "nonce": raw::nonce(dir).await, "url": url});
    raw::post(url, &key.sign(&protected, Some(payload))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_binding_that_is_missing_forged_for_another_url_or_another_key_or_revoked_is_refused()
 {
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(dir.path(), free_port(), None, REQUIRED);
    let (_etc, config) = harness::config_file(&toml);
    let server = TestServer::start_in(dir, &toml).await;
    let directory = raw::directory(&server.directory("default")).await;
    assert_eq!(directory["meta"]["externalAccountRequired"], true);
    let new_account_url = directory["newAccount"].as_str().expect("url").to_owned();
    let (kid, hmac_b64) = mint(&config, &["--label", "raw tests"]);
    let hmac = URL_SAFE_NO_PAD.decode(&hmac_b64).expect("base64url key");
    assert_eq!(hmac.len(), 32);

    let key = Key::p256();
    let refused = |r: &raw::Resp, want: &str, status: u16, what: &str| {
        assert_eq!(
            (r.status, r.problem().as_str()),
            (status, want),
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
    };
    // No binding at all.
    let r = new_account(&directory, &key, &json!({"termsOfServiceAgreed": true})).await;
    refused(&r, "externalAccountRequired", 403, "no binding");
    // A MAC made with another key.
    let mut wrong_key = hmac.clone();
    wrong_key[0] ^= 1;
    let eab = binding(&kid, &new_account_url, &key.jwk, &wrong_key);
    let r = new_account(&directory, &key, &json!({"externalAccountBinding": eab})).await;
    refused(&r, "unauthorized", 403, "tampered MAC");
    // The right MAC over a payload changed afterwards.
    let mut eab = binding(&kid, &new_account_url, &key.jwk, &hmac);
    eab["signature"] = json!(b64(&[0u8; 32]));
    let r = new_account(&directory, &key, &json!({"externalAccountBinding": eab})).await;
    refused(&r, "unauthorized", 403, "signature replaced");
    // An inner url other than newAccount.
    let eab = binding(&kid, &format!("{new_account_url}x"), &key.jwk, &hmac);
    let r = new_account(&directory, &key, &json!({"externalAccountBinding": eab})).await;
    refused(&r, "malformed", 400, "wrong inner url");
    // An inner key other than the one signing the request.
    let other = Key::p256();
    let eab = binding(&kid, &new_account_url, &other.jwk, &hmac);
    let r = new_account(&directory, &key, &json!({"externalAccountBinding": eab})).await;
    refused(&r, "malformed", 400, "mismatched inner key");
    // A key id nobody minted gets the same answer as a wrong MAC.
    let eab = binding("no-such-kid", &new_account_url, &key.jwk, &hmac);
    let r = new_account(&directory, &key, &json!({"externalAccountBinding": eab})).await;
    refused(&r, "unauthorized", 403, "unknown kid");
    // RFC 8555 §6.1: a binding member with trailing '=' is improperly
    // encoded, whatever its MAC.
    let mut eab = binding(&kid, &new_account_url, &key.jwk, &hmac);
    eab["signature"] = json!(format!(
        "{}=",
        eab["signature"].as_str().expect("signature")
    ));
    let r = new_account(&directory, &key, &json!({"externalAccountBinding": eab})).await;
    r.assert_refused(400, "malformed", "padded binding signature");

    // The same binding, done right, registers (so each refusal above was
    // for the one thing changed).
    let eab = binding(&kid, &new_account_url, &key.jwk, &hmac);
    let r = new_account(&directory, &key, &json!({"externalAccountBinding": eab})).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let account_url = r.location().expect("Location");
    let account_id = account_url.rsplit('/').next().expect("id").to_owned();
    let shown = json_of(&harness::run_cli(
        &config,
        &["account", "show", &account_id, "--json"],
        &[],
    ));
    assert_eq!(shown["external_account"], kid.as_str());

    // Revoked: a new registration with it is refused.
    let revoked = harness::run_cli(&config, &["eab", "revoke", &kid, "--yes"], &[]);
    assert_eq!(revoked.code, 0, "{revoked:?}");
    let newcomer = Key::p256();
    let eab = binding(&kid, &new_account_url, &newcomer.jwk, &hmac);
    let r = new_account(
        &directory,
        &newcomer,
        &json!({"externalAccountBinding": eab}),
    )
    .await;
    refused(&r, "unauthorized", 403, "revoked credential");
    // And the account registered with it may not order any more.
    let acct = raw::Acct {
        url: account_url,
        key,
    };
    let r = acct
        .post(
            &directory,
            directory["newOrder"].as_str().expect("newOrder"),
            Some(&json!({"identifiers": [{"type": "dns", "value": "a.example.test"}]})),
        )
        .await;
    refused(
        &r,
        "unauthorized",
        403,
        "order by an account of a revoked credential",
    );

    // Every refused binding left an audit row naming the key that tried.
    let audit = json_of(&harness::run_cli(
        &config,
        &["audit", "list", "--event", "account.refused", "--json"],
        &[],
    ));
    let rows = audit.as_array().expect("rows");
    assert_eq!(rows.len(), 8, "{audit:#}");
    assert!(
        rows.iter()
            .all(|r| r["actor"].as_str().is_some_and(|a| a.starts_with("key:"))),
        "{audit:#}"
    );
    let listed = json_of(&harness::run_cli(&config, &["eab", "list", "--json"], &[]));
    assert_eq!(listed[0]["status"], "revoked");
    assert_eq!(listed[0]["accounts"], 1);
    assert!(
        listed[0].get("hmac_key").is_none(),
        "list never shows the key"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_limited_to_a_glob_registers_through_instant_acme_and_cannot_order_other_names()
 {
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(
        dir.path(),
        free_port(),
        None,
        "[profiles.default]\nbypass = true\neab = \"optional\"\nchallenges = [\"http-01\", \"dns-01\"]\n[profiles.other]\nbypass = true\neab = \"required\"\n",
    );
    let (_etc, config) = harness::config_file(&toml);
    let server = TestServer::start_in(dir, &toml).await;
    let (kid, hmac_b64) = mint(
        &config,
        &[
            "--profile",
            "default",
            "--name",
            "*.lab.test",
            "--label",
            "lab",
        ],
    );
    let hmac = URL_SAFE_NO_PAD.decode(&hmac_b64).expect("base64url key");
    let create = |profile: &'static str| {
        let eak = ExternalAccountKey::new(kid.clone(), &hmac);
        let directory = server.directory(profile);
        async move {
            client::builder()
                .create(
                    &NewAccount {
                        contact: &[],
                        terms_of_service_agreed: true,
                        only_return_existing: false,
                    },
                    directory,
                    Some(&eak),
                )
                .await
        }
    };
    // Scoped to `default`: another profile refuses it.
    let e = create("other")
        .await
        .err()
        .expect("refused at another profile");
    assert_eq!(client::problem_type(&e), "unauthorized", "{e}");
    let (account, _) = create("default").await.expect("registers at its profile");

    let order = |names: &[&str]| {
        let ids: Vec<Identifier> = names.iter().map(|n| Identifier::Dns((*n).into())).collect();
        let account = &account;
        async move { account.new_order(&NewOrder::new(&ids)).await.map(|_| ()) }
    };
    order(&["host.lab.test", "*.lab.test", "a.b.lab.test"])
        .await
        .expect("names inside the glob");
    let e = order(&["example.com"]).await.expect_err("outside the glob");
    assert_eq!(client::problem_type(&e), "rejectedIdentifier", "{e}");
    assert!(e.to_string().contains("*.lab.test"), "{e}");
    // One name outside among several: the whole order is refused, naming it.
    let e = order(&["ok.lab.test", "lab.test.evil.example"])
        .await
        .expect_err("one name outside");
    assert_eq!(client::problem_type(&e), "rejectedIdentifier", "{e}");

    // Optional: an account without a binding registers and is not limited.
    let free = client::account(&server.directory("default")).await;
    free.new_order(&NewOrder::new(&[Identifier::Dns("example.com".into())]))
        .await
        .expect("an unbound account orders anything");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lego_and_certbot_register_with_an_eab_credential_and_obtain_certificates() {
    let lego = harness::require_program("lego");
    let certbot = harness::require_program("certbot");
    if !lego && !certbot {
        return;
    }
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(dir.path(), free_port(), None, REQUIRED);
    let (_etc, config) = harness::config_file(&toml);
    let server = TestServer::start_in(dir, &toml).await;
    let directory = server.directory("default");
    let (kid, hmac) = mint(&config, &["--label", "fleet"]);
    let home = crate::harness::tempdir();

    if lego {
        let d = home.path().join("lego");
        // Without the binding: refused, naming what is missing.
        let args = lego_http_run(&directory, &d, harness::own_addr(), "lego-eab.example.test");
        let ran = run("lego", args.clone(), d.clone()).await;
        assert!(
            !ran.success(),
            "lego without EAB must fail\n{}",
            ran.report()
        );
        // lego reads the directory's externalAccountRequired and stops
        // before asking.
        assert!(
            ran.report()
                .to_ascii_lowercase()
                .contains("external account binding"),
            "{}",
            ran.report()
        );
        let mut with = args;
        let at = with.len() - 1; // before `run`
        let (kid_arg, hmac_arg) = (format!("--kid={kid}"), format!("--hmac={hmac}"));
        for (i, a) in ["--eab", &kid_arg, &hmac_arg].iter().enumerate() {
            with.insert(at + i, (*a).to_owned());
        }
        let ran = run("lego", with, d.clone()).await;
        assert!(ran.success(), "lego with EAB failed\n{}", ran.report());
        let cert = d.join("certificates").join("lego-eab.example.test.crt");
        let got = leaf(&cert, &|| ran.report());
        assert_eq!(got.sans, vec!["lego-eab.example.test".to_owned()]);
    }
    if certbot {
        let d = home.path().join("certbot");
        let mut args = certbot_certonly_standalone(
            &d,
            &directory,
            harness::own_addr(),
            "certbot-eab.example.test",
        );
        args.extend([format!("--eab-kid={kid}"), format!("--eab-hmac-key={hmac}")]);
        let ran = run("certbot", args, d.clone()).await;
        assert!(ran.success(), "certbot with EAB failed\n{}", ran.report());
        let cert = d.join("conf").join("live").join("t").join("cert.pem");
        let got = leaf(&cert, &|| ran.report());
        assert_eq!(got.sans, vec!["certbot-eab.example.test".to_owned()]);
    }
    let listed = json_of(&harness::run_cli(&config, &["eab", "list", "--json"], &[]));
    assert_eq!(
        listed[0]["accounts"].as_i64(),
        Some(i64::from(lego) + i64::from(certbot)),
        "{listed:#}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentials_rate_limit_override_is_one_allowance_shared_by_its_accounts() {
    let dir = crate::harness::tempdir();
    let base = TestServer::config_text(
        dir.path(),
        free_port(),
        None,
        &format!("{REQUIRED}[rate_limits]\ncertificates_per_domain = \"1/7d\"\n"),
    );
    let (_etc, config) = harness::config_file(&base);
    let server = TestServer::start_in(dir, &base).await;
    let directory = raw::directory(&server.directory("default")).await;
    let url = directory["newAccount"].as_str().expect("url").to_owned();
    let (fleet, fleet_key) = mint(&config, &["--label", "fleet"]);
    let (other, other_key) = mint(&config, &["--label", "other"]);
    let register = |kid: String, hmac: String| {
        let (directory, url) = (&directory, &url);
        async move {
            let key = Key::p256();
            let hmac = URL_SAFE_NO_PAD.decode(&hmac).expect("base64url key");
            let eab = binding(&kid, url, &key.jwk, &hmac);
            let r = new_account(
                directory,
                &key,
                &json!({"termsOfServiceAgreed": true, "externalAccountBinding": eab}),
            )
            .await;
            assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
            raw::Acct {
                url: r.location().expect("Location"),
                key,
            }
        }
    };
    let a = register(fleet.clone(), fleet_key.clone()).await;
    let b = register(fleet.clone(), fleet_key).await;
    let c = register(other, other_key).await;
    let raised = format!(
        "{base}[rate_limits.overrides.fleet]\neab_key_id = \"{fleet}\"\ncertificates_per_domain = \"2/7d\"\n"
    );
    server
        .running()
        .reload(acme_proxy::config::Config::from_toml(&raised).expect("config"))
        .await
        .expect("reloaded");
    async fn issue(directory: &Value, acct: &raw::Acct, name: &str) -> raw::Resp {
        let (_, finalize) = crate::concurrency::ready_order(directory, acct, name).await;
        let csr = crate::concurrency::csr_for(name);
        acct.post(directory, &finalize, Some(&json!({"csr": csr})))
            .await
    }
    async fn order(directory: &Value, acct: &raw::Acct, name: &str) -> raw::Resp {
        let payload = json!({"identifiers": [{"type": "dns", "value": name}]});
        acct.post(
            directory,
            directory["newOrder"].as_str().unwrap(),
            Some(&payload),
        )
        .await
    }
    // The credential's two accounts share its two places, apart from the
    // one everyone else shares.
    assert_eq!(
        issue(&directory, &a, "a.example.com").await.json()["status"],
        "valid"
    );
    assert_eq!(
        issue(&directory, &b, "b.example.com").await.json()["status"],
        "valid"
    );
    order(&directory, &a, "a2.example.com")
        .await
        .assert_refused(429, "rateLimited", "the credential's third");
    assert_eq!(
        issue(&directory, &c, "c.example.com").await.json()["status"],
        "valid"
    );
    order(&directory, &c, "c2.example.com")
        .await
        .assert_refused(429, "rateLimited", "everyone else's second");
    server.stop().await;
}
