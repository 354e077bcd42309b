//! The ACME resources one by one (RFC 8555 §7), over real HTTP with the raw
//! forging client: newNonce, the directory's meta, accounts (creation,
//! contacts, lookup, update, orders list, key rollover), newOrder's
//! identifier checks and validity window, authorization deactivation,
//! revocation and who may do it, and unknown resources.

use serde_json::{Value, json};
use x509_parser::prelude::{FromDer, X509Certificate, parse_x509_crl};

use crate::concurrency::{csr_for, ready_order, ready_order_for};
use crate::harness::TestServer;
use crate::raw::{self, Acct, Key, Resp, b64};

const BYPASS: &str = "[profiles.default]\nbypass = true\n";

/// A server with `profile` (TOML) and its default directory.
async fn start(profile: &str) -> (TestServer, Value) {
    let server = TestServer::start(1, None, profile).await;
    let dir = raw::directory(&server.directory("default")).await;
    (server, dir)
}

fn text(r: &Resp) -> String {
    format!("{} {}", r.status, String::from_utf8_lossy(&r.body))
}

fn url(dir: &Value, name: &str) -> String {
    dir[name].as_str().unwrap().to_owned()
}

fn header<'a>(r: &'a Resp, name: &str) -> Option<&'a str> {
    r.headers.get(name).and_then(|v| v.to_str().ok())
}

/// Asserts a problem response: status, problem type, problem content type.
fn assert_problem(r: &Resp, status: u16, problem: &str, what: &str) {
    assert_eq!(
        (r.status, r.problem().as_str()),
        (status, problem),
        "{what}: {}",
        text(r)
    );
    assert_eq!(
        header(r, "content-type"),
        Some("application/problem+json"),
        "{what}"
    );
}

/// A `jwk`-signed request (newAccount, or revokeCert by the certificate key).
async fn jwk_post(dir: &Value, key: &Key, url: &str, payload: Option<&Value>) -> Resp {
    let protected =
        json!({"alg": key.alg(), "jwk": key.jwk, "nonce": raw::nonce(dir).await, "url": url});
    raw::post(url, &key.sign(&protected, payload)).await
}

async fn new_account(dir: &Value, key: &Key, payload: &Value) -> Resp {
    jwk_post(dir, key, &url(dir, "newAccount"), Some(payload)).await
}

/// A kid-signed request as account `kid` but signed by `key`.
async fn kid_post(dir: &Value, key: &Key, kid: &str, url: &str, payload: Option<&Value>) -> Resp {
    let protected =
        json!({"alg": key.alg(), "kid": kid, "nonce": raw::nonce(dir).await, "url": url});
    raw::post(url, &key.sign(&protected, payload)).await
}

/// The wall clock, truncated to seconds (what RFC 3339 in orders and
/// X.509 validity carry).
#[allow(clippy::disallowed_methods)] // The test compares against the server's real clock.
fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

fn parse_rfc3339(s: &str) -> i64 {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{s:?} is not RFC 3339: {e}"))
        .unix_timestamp()
}

/// A CSR for `names` whose key is `key` (so the certificate key is known to
/// the test as a JWK).
fn csr_with_key(names: &[&str], key: &Key) -> String {
    let pair = rcgen::KeyPair::try_from(key.pkcs8()).unwrap();
    let names = names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
    let mut params = rcgen::CertificateParams::new(names).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    b64(params.serialize_request(&pair).unwrap().der())
}

/// An issued certificate: its URL, its order's URL and the leaf's DER.
pub(crate) struct Issued {
    pub(crate) cert_url: String,
    order_url: String,
    pub(crate) leaf: Vec<u8>,
}

/// Finalizes a ready order with `csr` and downloads the certificate.
pub(crate) async fn finalize_and_download(
    dir: &Value,
    acct: &Acct,
    order_url: String,
    finalize: &str,
    csr: String,
) -> Issued {
    let r = acct.post(dir, finalize, Some(&json!({"csr": csr}))).await;
    assert_eq!(r.status, 200, "finalize: {}", text(&r));
    assert_eq!(r.json()["status"], "valid", "finalize: {}", text(&r));
    let cert_url = r.json()["certificate"].as_str().unwrap().to_owned();
    let r = acct.post(dir, &cert_url, None).await;
    assert_eq!(r.status, 200, "download: {}", text(&r));
    assert_eq!(
        header(&r, "content-type"),
        Some("application/pem-certificate-chain")
    );
    let chain = pem::parse_many(&r.body).unwrap();
    Issued {
        cert_url,
        order_url,
        leaf: chain[0].contents().to_vec(),
    }
}

/// The newOrder payload for DNS `names`.
fn dns_order(names: &[&str]) -> Value {
    let ids: Vec<Value> = names
        .iter()
        .map(|n| json!({"type": "dns", "value": n}))
        .collect();
    json!({ "identifiers": ids })
}

/// Orders, validates (bypass), finalizes and downloads a certificate for
/// `names`, whose key is `cert_key`.
pub(crate) async fn issue(dir: &Value, acct: &Acct, names: &[&str], cert_key: &Key) -> Issued {
    let (order_url, finalize) = ready_order_for(dir, acct, &dns_order(names)).await;
    let csr = csr_with_key(names, cert_key);
    finalize_and_download(dir, acct, order_url, &finalize, csr).await
}

/// The serials the profile's CRL lists, with their reason codes.
pub(crate) async fn crl_entries(server: &TestServer) -> Vec<(Vec<u8>, Option<u8>)> {
    let r = raw::request(
        "GET",
        &format!("{}/profile/default/crl", server.base()),
        None,
        vec![],
    )
    .await;
    assert_eq!(r.status, 200, "CRL: {}", text(&r));
    assert_eq!(header(&r, "content-type"), Some("application/pkix-crl"));
    let (_, crl) = parse_x509_crl(&r.body).expect("the CRL parses");
    crl.iter_revoked_certificates()
        .map(|e| (e.raw_serial().to_vec(), e.reason_code().map(|(_, c)| c.0)))
        .collect()
}

pub(crate) fn serial(der: &[u8]) -> Vec<u8> {
    X509Certificate::from_der(der)
        .unwrap()
        .1
        .raw_serial()
        .to_vec()
}

/// A revocation payload for `leaf`.
fn revocation(leaf: &[u8], reason: Option<u8>) -> Value {
    match reason {
        Some(r) => json!({"certificate": b64(leaf), "reason": r}),
        None => json!({"certificate": b64(leaf)}),
    }
}

// 1. newNonce (§7.2).

#[tokio::test]
async fn new_nonce_answers_head_with_200_and_get_with_204_each_with_a_fresh_uncacheable_nonce_and_an_index_link()
 {
    let (server, dir) = start(BYPASS).await;
    let new_nonce = url(&dir, "newNonce");
    let index = format!("<{}>;rel=\"index\"", server.directory("default"));
    let mut seen = Vec::new();
    for (method, status) in [("HEAD", 200), ("GET", 204)] {
        let r = raw::request(method, &new_nonce, None, vec![]).await;
        assert_eq!(r.status, status, "{method}: {}", text(&r));
        let nonce = r
            .nonce()
            .unwrap_or_else(|| panic!("{method}: no Replay-Nonce"));
        assert!(!nonce.is_empty());
        seen.push(nonce);
        assert_eq!(
            header(&r, "cache-control"),
            Some("no-store"),
            "{method}: Cache-Control"
        );
        assert!(
            r.headers
                .get_all("link")
                .iter()
                .any(|v| v == index.as_str()),
            "{method}: no {index} among {:?}",
            r.headers.get_all("link")
        );
        assert!(r.body.is_empty(), "{method}: newNonce has no body");
    }
    assert_ne!(seen[0], seen[1], "every nonce is fresh");
    server.stop().await;
}

// 2. Directory meta (§7.1.1) and terms of service (§7.3).

#[tokio::test]
async fn the_directory_meta_shows_the_profiles_terms_website_and_caa_identities_and_new_accounts_must_agree_to_the_terms()
 {
    let (server, dir) = start(
        "[profiles.default]\nbypass = true\nterms_of_service = \"https://tos.example/\"\nwebsite = \"https://example.test\"\ncaa_identities = [\"ca.example.test\"]\n",
    )
    .await;
    assert_eq!(dir["meta"]["termsOfService"], "https://tos.example/");
    assert_eq!(dir["meta"]["website"], "https://example.test");
    assert_eq!(dir["meta"]["caaIdentities"], json!(["ca.example.test"]));

    let key = Key::p256();
    let r = new_account(&dir, &key, &json!({})).await;
    assert_problem(&r, 400, "malformed", "no termsOfServiceAgreed");
    let r = new_account(&dir, &key, &json!({"termsOfServiceAgreed": false})).await;
    assert_problem(&r, 400, "malformed", "termsOfServiceAgreed false");

    // The refusals created nothing: the same key now creates the account.
    let r = new_account(&dir, &key, &json!({"termsOfServiceAgreed": true})).await;
    assert_eq!(r.status, 201, "{}", text(&r));
    let location = r.location().expect("Location");
    assert!(location.starts_with(&format!("{}/profile/default/acct/", server.base())));
    assert_eq!(r.json()["status"], "valid");
    assert_eq!(r.json()["termsOfServiceAgreed"], true);
    server.stop().await;
}

// 3. Contacts (§7.3).

#[tokio::test]
async fn contacts_of_an_unsupported_scheme_or_an_invalid_mailto_are_refused_and_a_valid_mailto_is_stored()
 {
    let (server, dir) = start(BYPASS).await;
    let key = Key::p256();
    let with = |c: &str| json!({"termsOfServiceAgreed": true, "contact": [c]});

    let r = new_account(&dir, &key, &with("tel:+1")).await;
    assert_problem(&r, 400, "unsupportedContact", "tel:");
    assert!(
        r.json()["detail"].as_str().unwrap_or("").contains("mailto"),
        "the detail says which contacts are acceptable: {}",
        text(&r)
    );
    for bad in ["mailto:a@b.test?subject=x", "mailto:nobody"] {
        let r = new_account(&dir, &key, &with(bad)).await;
        assert_problem(&r, 400, "invalidContact", bad);
    }

    let r = new_account(&dir, &key, &with("mailto:ops@example.test")).await;
    assert_eq!(r.status, 201, "{}", text(&r));
    assert_eq!(r.json()["contact"], json!(["mailto:ops@example.test"]));
    let acct = Acct {
        url: r.location().unwrap(),
        key,
    };
    let r = acct.post(&dir, &acct.url, None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["contact"], json!(["mailto:ops@example.test"]));
    server.stop().await;
}

// 4. Finding an account URL given a key (§7.3.1).

#[tokio::test]
async fn only_return_existing_finds_an_account_by_its_key_and_never_creates_one() {
    let (server, dir) = start(BYPASS).await;
    let key = Key::p256();
    let r = new_account(&dir, &key, &json!({"onlyReturnExisting": true})).await;
    assert_problem(&r, 400, "accountDoesNotExist", "unknown key");

    let r = new_account(&dir, &key, &json!({"termsOfServiceAgreed": true})).await;
    assert_eq!(r.status, 201, "the lookup created nothing: {}", text(&r));
    let location = r.location().unwrap();

    let r = new_account(&dir, &key, &json!({"onlyReturnExisting": true})).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.location().as_deref(), Some(location.as_str()));
    assert!(
        r.json().get("onlyReturnExisting").is_none(),
        "onlyReturnExisting is not reflected"
    );

    let r = new_account(
        &dir,
        &key,
        &json!({"termsOfServiceAgreed": true, "contact": ["mailto:x@example.test"]}),
    )
    .await;
    assert_eq!(
        r.status,
        200,
        "an existing key is found, not created: {}",
        text(&r)
    );
    assert_eq!(r.location().as_deref(), Some(location.as_str()));
    assert!(
        r.json()["contact"].as_array().is_none_or(Vec::is_empty),
        "the fields of the request are ignored: {}",
        text(&r)
    );
    server.stop().await;
}

// 5. Account update (§7.3.2).

#[tokio::test]
async fn an_account_is_updated_and_read_by_its_own_key_only() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let bob = Acct::create(&dir, Key::p256()).await;

    let contact = json!(["mailto:alice@example.test", "mailto:ops@example.test"]);
    let r = alice
        .post(&dir, &alice.url, Some(&json!({"contact": contact})))
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["contact"], contact);
    assert_eq!(r.json()["status"], "valid");

    let r = alice.post(&dir, &alice.url, None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["contact"], contact);
    assert_eq!(r.location().as_deref(), Some(alice.url.as_str()));
    assert!(r.json()["orders"].as_str().unwrap().starts_with(&alice.url));

    // Bob, with his own kid and key, about Alice's account.
    let r = bob
        .post(
            &dir,
            &alice.url,
            Some(&json!({"contact": ["mailto:bob@example.test"]})),
        )
        .await;
    assert_problem(&r, 403, "unauthorized", "Bob updates Alice");
    let r = bob.post(&dir, &alice.url, None).await;
    assert_problem(&r, 403, "unauthorized", "Bob reads Alice");
    let r = alice.post(&dir, &alice.url, None).await;
    assert_eq!(r.json()["contact"], contact, "Bob changed nothing");
    server.stop().await;
}

// 6. Orders list (§7.1.2.1).

#[tokio::test]
async fn the_orders_list_of_an_account_lists_its_orders_to_it_alone() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let bob = Acct::create(&dir, Key::p256()).await;
    let mut orders = Vec::new();
    for name in ["one.example.test", "two.example.test"] {
        let r = alice
            .post(
                &dir,
                &url(&dir, "newOrder"),
                Some(&json!({"identifiers": [{"type": "dns", "value": name}]})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", text(&r));
        orders.push(r.location().unwrap());
    }
    let list_url = alice.post(&dir, &alice.url, None).await.json()["orders"]
        .as_str()
        .unwrap()
        .to_owned();

    let r = alice.post(&dir, &list_url, None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let mut listed: Vec<String> = r.json()["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    orders.sort();
    assert_eq!(listed, orders);

    let r = bob.post(&dir, &list_url, None).await;
    assert_problem(&r, 403, "unauthorized", "Bob lists Alice's orders");
    // Bob's own list is empty.
    let bobs = bob.post(&dir, &bob.url, None).await.json()["orders"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = bob.post(&dir, &bobs, None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["orders"], json!([]));
    server.stop().await;
}

/// The orders list pages with `?page=N` (§7.1.2.1 leaves paging to the
/// server). A page number too large for any offset — past `u64`, or whose
/// offset overflows — is a page past the end of the list, answered as any
/// such page is: empty, with no `next` link. A page that is no number is
/// `malformed`. Every answer carries a fresh nonce.
#[tokio::test]
async fn a_huge_orders_page_is_an_empty_page_and_a_page_that_is_no_number_is_malformed() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let r = alice
        .post(
            &dir,
            &url(&dir, "newOrder"),
            Some(&dns_order(&["listed.example.test"])),
        )
        .await;
    assert_eq!(r.status, 201, "{}", text(&r));
    let list = format!("{}/orders", alice.url);

    let r = alice.post(&dir, &format!("{list}?page=0"), None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["orders"].as_array().map(Vec::len), Some(1));

    for far in [
        "18446744073709551615",
        "99999999999999999999",
        "92233720368547758",
        "9223372036854775807",
    ] {
        let r = alice.post(&dir, &format!("{list}?page={far}"), None).await;
        assert_eq!(r.status, 200, "page {far}: {}", text(&r));
        assert_eq!(r.json()["orders"], json!([]), "page {far}");
        assert!(
            !r.headers
                .get_all("link")
                .iter()
                .any(|l| l.to_str().unwrap().contains("rel=\"next\"")),
            "page {far}: {:?}",
            r.headers
        );
        r.assert_fresh_nonce(&format!("page {far}"));
    }
    for bad in ["-1", "abc", "", "1e3", "%FF"] {
        let r = alice.post(&dir, &format!("{list}?page={bad}"), None).await;
        r.assert_refused(400, "malformed", &format!("page {bad:?}"));
    }
    server.stop().await;
}

// 7. Account key rollover (§7.3.5).

/// The inner JWS of a keyChange: signed by `new`, with its jwk, `url`, and
/// optionally a nonce (which §7.3.5 forbids).
fn inner_jws(new: &Key, url: &str, account: &str, old_jwk: &Value, nonce: Option<&str>) -> Value {
    let mut protected = json!({"alg": new.alg(), "jwk": new.jwk, "url": url});
    if let Some(n) = nonce {
        protected["nonce"] = json!(n);
    }
    new.sign(
        &protected,
        Some(&json!({"account": account, "oldKey": old_jwk})),
    )
}

#[tokio::test]
async fn key_change_rolls_the_account_over_to_the_new_key_and_refuses_a_key_in_use_or_a_bad_inner_jws()
 {
    let (server, dir) = start(BYPASS).await;
    let key_change = url(&dir, "keyChange");
    let old = Key::p256();
    let alice = Acct::create(&dir, old.clone()).await;
    let bob = Acct::create(&dir, Key::p256()).await;
    let new = Key::p256();

    // Refusals first, each leaving the account as it was.
    let n = raw::nonce(&dir).await;
    let inner = inner_jws(&new, &key_change, &alice.url, &old.jwk, Some(&n));
    let r = alice.post(&dir, &key_change, Some(&inner)).await;
    assert_problem(&r, 400, "malformed", "inner JWS with a nonce");

    let inner = inner_jws(&new, &key_change, &bob.url, &old.jwk, None);
    let r = alice.post(&dir, &key_change, Some(&inner)).await;
    assert_problem(&r, 403, "unauthorized", "inner payload names Bob");

    let stranger = Key::p256();
    let inner = inner_jws(&new, &key_change, &alice.url, &stranger.jwk, None);
    let r = alice.post(&dir, &key_change, Some(&inner)).await;
    assert!(
        matches!(
            (r.status, r.problem().as_str()),
            (403, "unauthorized") | (400, "malformed")
        ),
        "oldKey not the account's key: {}",
        text(&r)
    );
    let r = alice.post(&dir, &alice.url, None).await;
    assert_eq!(r.status, 200, "the old key still works: {}", text(&r));

    // The rollover.
    let inner = inner_jws(&new, &key_change, &alice.url, &old.jwk, None);
    let r = alice.post(&dir, &key_change, Some(&inner)).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["status"], "valid");

    let r = kid_post(&dir, &old, &alice.url, &alice.url, None).await;
    assert_problem(&r, 400, "malformed", "signed with the old key");
    let r = kid_post(&dir, &new, &alice.url, &alice.url, None).await;
    assert_eq!(r.status, 200, "signed with the new key: {}", text(&r));
    let r = new_account(&dir, &new, &json!({"onlyReturnExisting": true})).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.location().as_deref(), Some(alice.url.as_str()));
    let r = new_account(&dir, &old, &json!({"onlyReturnExisting": true})).await;
    assert_problem(
        &r,
        400,
        "accountDoesNotExist",
        "the old key names no account",
    );

    let alice = Acct {
        key: new.clone(),
        url: alice.url,
    };

    // The old key as oldKey, now that it is no longer the account's key.
    let third = Key::p256();
    let inner = inner_jws(&third, &key_change, &alice.url, &old.jwk, None);
    let r = alice.post(&dir, &key_change, Some(&inner)).await;
    assert!(
        matches!(
            (r.status, r.problem().as_str()),
            (403, "unauthorized") | (400, "malformed")
        ),
        "a stale oldKey: {}",
        text(&r)
    );
    let r = kid_post(&dir, &new, &alice.url, &alice.url, None).await;
    assert_eq!(r.status, 200, "the key did not change: {}", text(&r));

    // To Bob's key: 409 with Bob's account URL.
    let inner = inner_jws(&bob.key, &key_change, &alice.url, &new.jwk, None);
    let r = alice.post(&dir, &key_change, Some(&inner)).await;
    assert_eq!(r.status, 409, "{}", text(&r));
    assert_eq!(r.location().as_deref(), Some(bob.url.as_str()));
    let r = kid_post(&dir, &new, &alice.url, &alice.url, None).await;
    assert_eq!(r.status, 200, "Alice keeps her key: {}", text(&r));
    server.stop().await;
}

// 8. newOrder identifiers (§7.4, §6.7.1).

#[tokio::test]
async fn new_order_reports_every_bad_identifier_and_normalises_the_good_ones() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let new_order = url(&dir, "newOrder");
    let order = |ids: Value| json!({"identifiers": ids});
    let dns = |v: &str| json!({"type": "dns", "value": v});

    let bad = ["bad_name.example", "-lead.example", "10.0.0.1"];
    let r = alice
        .post(
            &dir,
            &new_order,
            Some(&order(json!([
                dns("good.example.test"),
                dns(bad[0]),
                dns(bad[1]),
                dns(bad[2])
            ]))),
        )
        .await;
    assert_problem(&r, 400, "compound", "three bad names");
    let subs = r.json()["subproblems"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(subs.len(), 3, "one subproblem per bad name: {}", text(&r));
    for (sub, name) in subs.iter().zip(bad) {
        assert_eq!(sub["identifier"], dns(name), "{sub}");
        assert!(
            sub["type"]
                .as_str()
                .unwrap()
                .starts_with("urn:ietf:params:acme:error:"),
            "{sub}"
        );
    }

    let r = alice
        .post(
            &dir,
            &new_order,
            Some(&order(json!([dns("*.example.test")]))),
        )
        .await;
    assert_problem(&r, 400, "rejectedIdentifier", "wildcard without dns-01");

    let r = alice
        .post(
            &dir,
            &new_order,
            Some(&order(
                json!([{"type": "email", "value": "a@example.test"}]),
            )),
        )
        .await;
    assert_problem(&r, 400, "unsupportedIdentifier", "email identifier");

    let r = alice
        .post(
            &dir,
            &new_order,
            Some(&order(json!([{"type": "ip", "value": "300.1.1.1"}]))),
        )
        .await;
    assert_problem(&r, 400, "malformed", "ip identifier that is no address");

    let r = alice.post(&dir, &new_order, Some(&order(json!([])))).await;
    assert_problem(&r, 400, "malformed", "no identifiers");

    let r = alice
        .post(
            &dir,
            &new_order,
            Some(&order(json!([
                dns("WWW.Example.TEST"),
                dns("www.example.test"),
                dns("Api.Example.Test")
            ]))),
        )
        .await;
    assert_eq!(r.status, 201, "{}", text(&r));
    assert_eq!(
        r.json()["identifiers"],
        json!([dns("www.example.test"), dns("api.example.test")])
    );
    let authzs = r.json()["authorizations"].as_array().cloned().unwrap();
    assert_eq!(authzs.len(), 2, "one authorization per distinct name");
    let a = alice
        .post(&dir, authzs[0].as_str().unwrap(), None)
        .await
        .json();
    assert_eq!(a["identifier"], dns("www.example.test"));
    server.stop().await;
}

/// RFC 8555 §7.1.4: "Servers MUST verify any identifier values that begin
/// with the ASCII-Compatible Encoding prefix "xn--" as defined in
/// [RFC5890] are properly encoded." A label with the prefix that is not
/// punycode, or is the punycode of no valid U-label, is refused as every
/// other ill-formed name is (`rejectedIdentifier`), wherever it stands in
/// the name; a proper A-label is ordered like any name.
#[tokio::test]
async fn a_dns_identifier_with_an_xn_label_that_is_not_a_proper_a_label_is_a_rejected_identifier() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let new_order = url(&dir, "newOrder");
    let dns = |v: &str| json!({"type": "dns", "value": v});
    for bad in [
        "xn--0.example.test",
        "xn--99999999999.example.test",
        "www.xn--ab--c.example.test",
        "xn--a.example.test",
        "XN--BER-VIA.example.test",
        "*.xn--bcher-kva0.example.test",
    ] {
        let r = alice.post(&dir, &new_order, Some(&dns_order(&[bad]))).await;
        r.assert_refused(400, "rejectedIdentifier", bad);
        assert_eq!(
            r.json()["subproblems"][0]["identifier"],
            dns(bad),
            "{}",
            text(&r)
        );
        assert!(
            text(&r).contains("xn--"),
            "the detail names the label: {}",
            text(&r)
        );
    }
    // Two of them, and a good name: one subproblem each.
    let r = alice
        .post(
            &dir,
            &new_order,
            Some(&dns_order(&[
                "xn--0.example.test",
                "ok.example.test",
                "xn--a.example.test",
            ])),
        )
        .await;
    r.assert_refused(400, "compound", "two bad A-labels");
    let subs = r.json()["subproblems"].as_array().cloned().unwrap();
    assert_eq!(subs.len(), 2, "{}", text(&r));
    for sub in &subs {
        assert_eq!(
            sub["type"], "urn:ietf:params:acme:error:rejectedIdentifier",
            "{sub}"
        );
    }

    let r = alice
        .post(
            &dir,
            &new_order,
            Some(&dns_order(&["XN--Bcher-KVA.example.test"])),
        )
        .await;
    assert_eq!(r.status, 201, "{}", text(&r));
    assert_eq!(
        r.json()["identifiers"],
        json!([dns("xn--bcher-kva.example.test")])
    );
    server.stop().await;
}

// 9. notBefore / notAfter (§7.4).

#[tokio::test]
async fn an_order_with_not_before_and_not_after_gets_exactly_that_validity_and_one_longer_than_the_profile_issues_is_refused()
 {
    let (server, dir) = start(
        "[profiles.default]\nbypass = true\n[profiles.default.signer]\ntype = \"local_ca\"\nvalidity = \"10d\"\n",
    )
    .await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let name = "window.example.test";
    let not_before = now_unix();
    let not_after = not_before + 2 * 86400;
    let payload = json!({
        "identifiers": [{"type": "dns", "value": name}],
        "notBefore": rfc3339(not_before),
        "notAfter": rfc3339(not_after),
    });

    let r = alice
        .post(&dir, &url(&dir, "newOrder"), Some(&payload))
        .await;
    assert_eq!(r.status, 201, "{}", text(&r));
    assert_eq!(
        parse_rfc3339(r.json()["notBefore"].as_str().unwrap()),
        not_before
    );
    assert_eq!(
        parse_rfc3339(r.json()["notAfter"].as_str().unwrap()),
        not_after
    );

    let (order_url, finalize) = ready_order_for(&dir, &alice, &payload).await;
    let issued = finalize_and_download(&dir, &alice, order_url, &finalize, csr_for(name)).await;
    let order = alice.post(&dir, &issued.order_url, None).await.json();
    assert_eq!(
        parse_rfc3339(order["notBefore"].as_str().unwrap()),
        not_before
    );
    assert_eq!(
        parse_rfc3339(order["notAfter"].as_str().unwrap()),
        not_after
    );
    let (_, leaf) = X509Certificate::from_der(&issued.leaf).unwrap();
    assert_eq!(leaf.validity().not_before.timestamp(), not_before);
    assert_eq!(leaf.validity().not_after.timestamp(), not_after);

    let too_long = json!({
        "identifiers": [{"type": "dns", "value": name}],
        "notAfter": rfc3339(now_unix() + 11 * 86400),
    });
    let r = alice
        .post(&dir, &url(&dir, "newOrder"), Some(&too_long))
        .await;
    assert_problem(&r, 400, "malformed", "notAfter beyond the 10d validity");
    server.stop().await;
}

// 10. Authorization deactivation (§7.5.2).

#[tokio::test]
async fn a_pending_authorization_is_deactivated_once_and_its_order_becomes_invalid() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let r = alice
        .post(
            &dir,
            &url(&dir, "newOrder"),
            Some(&json!({"identifiers": [
                {"type": "dns", "value": "a.example.test"},
                {"type": "dns", "value": "b.example.test"}
            ]})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", text(&r));
    let order_url = r.location().unwrap();
    let authzs: Vec<String> = r.json()["authorizations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();

    // Anything but {"status": "deactivated"} is refused and changes nothing.
    for payload in [
        json!({"status": "valid"}),
        json!({"status": "invalid"}),
        json!({}),
    ] {
        let r = alice.post(&dir, &authzs[1], Some(&payload)).await;
        assert_problem(&r, 400, "malformed", &payload.to_string());
    }
    assert_eq!(
        alice.post(&dir, &authzs[1], None).await.json()["status"],
        "pending"
    );
    assert_eq!(
        alice.post(&dir, &order_url, None).await.json()["status"],
        "pending"
    );

    let deactivate = json!({"status": "deactivated"});
    let r = alice.post(&dir, &authzs[0], Some(&deactivate)).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["status"], "deactivated");
    assert_eq!(r.json()["identifier"]["value"], "a.example.test");
    let r = alice.post(&dir, &authzs[0], None).await;
    assert_eq!(r.json()["status"], "deactivated");
    let r = alice.post(&dir, &order_url, None).await;
    assert_eq!(r.json()["status"], "invalid", "{}", text(&r));

    let r = alice.post(&dir, &authzs[0], Some(&deactivate)).await;
    assert_problem(&r, 400, "malformed", "second deactivation");
    server.stop().await;
}

// 11. Revocation with the certificate's key (§7.6).

#[tokio::test]
async fn a_certificate_is_revoked_by_a_request_signed_with_its_own_key_and_the_crl_lists_it() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let cert_key = Key::p256();
    let issued = issue(&dir, &alice, &["revoke.example.test"], &cert_key).await;
    let revoke = url(&dir, "revokeCert");
    let leaf = &issued.leaf;

    let r = jwk_post(&dir, &Key::p256(), &revoke, Some(&revocation(leaf, None))).await;
    assert_problem(&r, 403, "unauthorized", "an unrelated key");
    let r = jwk_post(&dir, &cert_key, &revoke, Some(&revocation(leaf, Some(7)))).await;
    assert_problem(&r, 400, "badRevocationReason", "reason 7 (unassigned)");
    let r = jwk_post(&dir, &cert_key, &revoke, Some(&revocation(leaf, Some(2)))).await;
    assert_problem(&r, 400, "badRevocationReason", "reason 2 (cACompromise)");
    // Numbers no reason code has: refused as a reason, not as a payload
    // that does not parse (§7.6).
    for (reason, what) in [
        (json!(-1), "reason -1"),
        (json!(4.0), "reason 4.0"),
        (json!(18_446_744_073_709_551_616.0_f64), "reason 2^64"),
    ] {
        let mut payload = revocation(leaf, None);
        payload["reason"] = reason;
        let r = jwk_post(&dir, &cert_key, &revoke, Some(&payload)).await;
        assert_problem(&r, 400, "badRevocationReason", what);
    }
    assert!(
        crl_entries(&server).await.is_empty(),
        "nothing is revoked yet"
    );

    let r = jwk_post(&dir, &cert_key, &revoke, Some(&revocation(leaf, Some(1)))).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(r.nonce().is_some());
    let entries = crl_entries(&server).await;
    assert_eq!(
        entries,
        vec![(serial(leaf), Some(1))],
        "the CRL lists the serial as keyCompromise"
    );

    let r = jwk_post(&dir, &cert_key, &revoke, Some(&revocation(leaf, None))).await;
    assert_problem(&r, 400, "alreadyRevoked", "revoking again");
    server.stop().await;
}

/// RFC 8555 §6.1: base64url values "that include trailing '=' characters
/// MUST be rejected as improperly encoded". finalize's `csr` (§7.4) and
/// revokeCert's `certificate` (§7.6) are such values: padded, or in the
/// standard alphabet, they are `malformed` with a fresh nonce, and the
/// order stays ready and the certificate unrevoked.
#[tokio::test]
async fn a_padded_or_standard_base64_csr_or_certificate_is_malformed_and_changes_nothing() {
    use base64::Engine;
    let standard = base64::engine::general_purpose::STANDARD;
    let name = "padded.example.test";
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let (order_url, finalize) = ready_order(&dir, &alice, name).await;

    // A CSR whose DER is not a multiple of three octets, so that a padding
    // encoder pads it; and one that is, padded all the same.
    let csr = loop {
        let csr = csr_for(name);
        if !csr.len().is_multiple_of(4) {
            break csr;
        }
    };
    let der = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&csr)
        .unwrap();
    let padded = base64::engine::general_purpose::URL_SAFE.encode(&der);
    assert!(padded.ends_with('='), "{padded}");
    for (what, bad) in [
        ("a padded csr", padded),
        ("a csr with one '=' too many", format!("{csr}=")),
        ("a csr in standard, padded base64", standard.encode(&der)),
    ] {
        let r = alice
            .post(&dir, &finalize, Some(&json!({"csr": bad})))
            .await;
        r.assert_refused(400, "malformed", what);
        let order = alice.post(&dir, &order_url, None).await.json();
        assert_eq!(order["status"], "ready", "{what}: {order}");
    }
    let issued = finalize_and_download(&dir, &alice, order_url, &finalize, csr).await;

    let revoke = url(&dir, "revokeCert");
    let mut padded_cert = base64::engine::general_purpose::URL_SAFE.encode(&issued.leaf);
    if !padded_cert.ends_with('=') {
        padded_cert.push('=');
    }
    for (what, bad) in [
        ("a padded certificate", padded_cert),
        (
            "a certificate in standard base64",
            standard.encode(&issued.leaf),
        ),
    ] {
        let r = alice
            .post(&dir, &revoke, Some(&json!({"certificate": bad})))
            .await;
        r.assert_refused(400, "malformed", what);
    }
    assert!(crl_entries(&server).await.is_empty(), "nothing was revoked");
    let r = alice
        .post(&dir, &revoke, Some(&revocation(&issued.leaf, None)))
        .await;
    assert_eq!(r.status, 200, "the unpadded certificate: {}", text(&r));
    server.stop().await;
}

// 12. Other accounts (§7.4, §7.5, §7.6).

#[tokio::test]
async fn another_account_can_neither_read_nor_revoke_my_certificate_until_it_is_authorized_for_all_its_names()
 {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let bob = Acct::create(&dir, Key::p256()).await;
    let names = ["shared.example.test", "also.example.test"];
    let issued = issue(&dir, &alice, &names, &Key::p256()).await;
    let order = alice.post(&dir, &issued.order_url, None).await.json();
    let authz_url = order["authorizations"][0].as_str().unwrap().to_owned();
    let authz = alice.post(&dir, &authz_url, None).await.json();
    let chall_url = authz["challenges"][0]["url"].as_str().unwrap().to_owned();

    for (what, u) in [
        ("certificate", &issued.cert_url),
        ("order", &issued.order_url),
        ("authorization", &authz_url),
        ("challenge", &chall_url),
    ] {
        // As an unknown id would be (RFC 8555 §10.5; see below).
        let r = bob.post(&dir, u, None).await;
        r.assert_refused(404, "malformed", &format!("Bob reads Alice's {what}"));
    }

    let revoke = url(&dir, "revokeCert");
    let payload = revocation(&issued.leaf, None);
    let r = bob.post(&dir, &revoke, Some(&payload)).await;
    assert_problem(&r, 403, "unauthorized", "Bob revokes without authorization");

    // Bob proves control of one name: not enough.
    let _ = ready_order(&dir, &bob, names[0]).await;
    let r = bob.post(&dir, &revoke, Some(&payload)).await;
    assert_problem(
        &r,
        403,
        "unauthorized",
        "Bob is authorized for one name of two",
    );
    assert!(crl_entries(&server).await.is_empty());

    // And of the other: now he may.
    let _ = ready_order(&dir, &bob, names[1]).await;
    let r = bob.post(&dir, &revoke, Some(&payload)).await;
    assert_eq!(
        r.status,
        200,
        "Bob holds valid authorizations for all names: {}",
        text(&r)
    );
    let entries = crl_entries(&server).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].0, serial(&issued.leaf));
    server.stop().await;
}

/// An id in `url` (its last path segment, or the one before `/finalize`)
/// replaced by one of the same shape that names nothing.
fn unknown_like(url: &str) -> String {
    let (base, tail) = match url.strip_suffix("/finalize") {
        Some(base) => (base, "/finalize"),
        None => (url, ""),
    };
    let (prefix, id) = base.rsplit_once('/').unwrap();
    assert!(id.len() > 8, "{url}");
    format!("{prefix}/{}AAAAAAAA{tail}", &id[..id.len() - 8])
}

/// What a refusal says: status, problem type and detail.
fn answer(r: &Resp) -> (u16, String, String) {
    let doc = r.json();
    (
        r.status,
        r.problem(),
        doc["detail"].as_str().unwrap_or("").to_owned(),
    )
}

/// What the server answers from memory for an order it just made valid
/// and for its certificate (the poll and the download that follow a
/// finalize) is what the database holds.
#[tokio::test]
async fn an_order_just_made_valid_and_its_certificate_answer_as_the_stored_rows() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let issued = issue(&dir, &alice, &["fresh.example.test"], &Key::p256()).await;
    let authority = server.running().authority();
    let store = authority.store();
    let order_id = issued.order_url.rsplit('/').next().unwrap();
    let cert_id = issued.cert_url.rsplit('/').next().unwrap();
    let stored_order = store.order(order_id).await.unwrap().expect("the order");
    let stored_cert = store
        .certificate(cert_id)
        .await
        .unwrap()
        .expect("the certificate");
    let account = store
        .account(&stored_order.account_id)
        .await
        .unwrap()
        .expect("the account");
    let profile = authority.profile("default").expect("the profile");
    assert_eq!(
        authority.order(profile, &account, order_id).await.unwrap(),
        stored_order
    );
    assert_eq!(
        authority
            .certificate(profile, &account, cert_id)
            .await
            .unwrap(),
        stored_cert
    );
    // The download that followed the finalize got the stored chain.
    assert_eq!(
        pem::parse_many(&stored_cert.chain_pem).unwrap()[0].contents(),
        issued.leaf.as_slice()
    );
    server.stop().await;
}

/// RFC 8555 §10.5: a server whose answers differ between "no such
/// resource" and "not yours" tells anyone with an account which ids exist.
/// Another account's order, authorization, challenge and certificate —
/// read, finalized, deactivated or triggered — get exactly what an unknown
/// id of the same kind gets (404 `malformed`, the same detail), each with
/// a fresh nonce, and nothing of Alice's changes. An account URL and its
/// orders list, which the server never looks up for a request signed by
/// another account, answer the same for Alice's id as for an unknown one.
#[tokio::test]
async fn another_accounts_resources_are_answered_exactly_as_unknown_ids_whatever_the_request() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let bob = Acct::create(&dir, Key::p256()).await;
    let issued = issue(&dir, &alice, &["mine.example.test"], &Key::p256()).await;
    // A pending order, so that a trigger or a deactivation would change it.
    let r = alice
        .post(
            &dir,
            &url(&dir, "newOrder"),
            Some(&dns_order(&["pending.example.test"])),
        )
        .await;
    assert_eq!(r.status, 201, "{}", text(&r));
    let order_url = r.location().unwrap();
    let finalize = r.json()["finalize"].as_str().unwrap().to_owned();
    let authz_url = r.json()["authorizations"][0].as_str().unwrap().to_owned();
    let authz = alice.post(&dir, &authz_url, None).await.json();
    let chall_url = authz["challenges"][0]["url"].as_str().unwrap().to_owned();

    let csr = json!({"csr": csr_for("pending.example.test")});
    let deactivate = json!({"status": "deactivated"});
    let requests: [(&str, &str, Option<&Value>); 8] = [
        ("read an order", &order_url, None),
        ("read a valid order", &issued.order_url, None),
        ("finalize an order", &finalize, Some(&csr)),
        ("read an authorization", &authz_url, None),
        ("deactivate an authorization", &authz_url, Some(&deactivate)),
        ("read a challenge", &chall_url, None),
        ("trigger a challenge", &chall_url, Some(&json!({}))),
        ("download a certificate", &issued.cert_url, None),
    ];
    for (what, alices, payload) in requests {
        let theirs = bob.post(&dir, alices, payload).await;
        let nobodys = bob.post(&dir, &unknown_like(alices), payload).await;
        theirs.assert_refused(404, "malformed", &format!("Bob: {what} of Alice's"));
        nobodys.assert_refused(404, "malformed", &format!("Bob: {what} unknown"));
        assert_eq!(answer(&theirs), answer(&nobodys), "{what}");
    }
    // Nothing of Alice's moved.
    let order = alice.post(&dir, &order_url, None).await.json();
    assert_eq!(order["status"], "pending", "{order}");
    let authz = alice.post(&dir, &authz_url, None).await.json();
    assert_eq!(authz["status"], "pending", "{authz}");
    let chall = alice.post(&dir, &chall_url, None).await.json();
    assert_eq!(chall["status"], "pending", "{chall}");

    // The account URL and its orders list.
    let alices_orders = format!("{}/orders", alice.url);
    let nobody = unknown_like(&alice.url);
    let requests: [(&str, &str, &str, Option<&Value>); 3] = [
        ("read an account", &alice.url, &nobody, None),
        (
            "update an account",
            &alice.url,
            &nobody,
            Some(&json!({"contact": ["mailto:bob@example.test"]})),
        ),
        (
            "list an account's orders",
            &alices_orders,
            &format!("{nobody}/orders"),
            None,
        ),
    ];
    for (what, alices, nobodys_url, payload) in requests {
        let theirs = bob.post(&dir, alices, payload).await;
        let nobodys = bob.post(&dir, nobodys_url, payload).await;
        theirs.assert_refused(403, "unauthorized", &format!("Bob: {what} of Alice's"));
        nobodys.assert_refused(403, "unauthorized", &format!("Bob: {what} unknown"));
        assert_eq!(answer(&theirs), answer(&nobodys), "{what}");
    }
    server.stop().await;
}

// 13. Unknown resources.

#[tokio::test]
async fn unknown_resources_and_wrong_methods_get_problem_documents() {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;

    let nope = format!("{}/profile/default/order/nope", server.base());
    let r = alice.post(&dir, &nope, None).await;
    assert_eq!(r.status, 404, "{}", text(&r));
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    assert!(r.json()["type"].as_str().is_some(), "{}", text(&r));

    let r = raw::request(
        "GET",
        &format!("{}/profile/nope/directory", server.base()),
        None,
        vec![],
    )
    .await;
    assert_eq!(r.status, 404, "{}", text(&r));
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    assert!(r.json()["type"].as_str().is_some(), "{}", text(&r));

    for post_only in [url(&dir, "newOrder"), alice.url.clone()] {
        let r = raw::request("GET", &post_only, None, vec![]).await;
        assert_eq!(r.status, 405, "GET {post_only}: {}", text(&r));
        assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
        assert!(r.json()["type"].as_str().is_some(), "{}", text(&r));
    }
    server.stop().await;
}

/// The server keeps a copy of each account that signs requests, with its
/// parsed key (`account_cache_ttl`). Another process that changes the
/// account — here a second store on the same database rolls its key over —
/// cannot tell the server to forget the copy. Writes must still see the
/// change at once: newOrder, a challenge and finalize check the account in
/// the transaction that writes, and refuse the old key. Only a read may be
/// answered from the copy, until it expires or a refused write drops it;
/// without a copy (`0s`) the old key is refused everywhere at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_changed_by_another_process_is_refused_by_every_write_at_once_and_by_reads_once_its_copy_goes()
 {
    use acme_proxy_protocol::Jwk;
    use acme_proxy_store::{KeyChangeOutcome, Store, StoreOptions};

    for ttl in ["60s", "0s"] {
        let data = crate::harness::tempdir();
        // A top-level key, so before the tables config_text writes.
        let toml = format!(
            "account_cache_ttl = \"{ttl}\"\n{}",
            TestServer::config_text(data.path(), 1, None, BYPASS)
        );
        let db = acme_proxy::config::Config::from_toml(&toml)
            .expect("config")
            .database_url();
        let server = TestServer::start_in(data, &toml).await;
        let dir = raw::directory(&server.directory("default")).await;
        let mut alice = Acct::create(&dir, Key::p256()).await;
        let account_id = alice.url.rsplit('/').next().unwrap().to_owned();
        // A ready order, and one whose challenge is still pending.
        let (order_url, finalize) = ready_order(&dir, &alice, "ready.example.test").await;
        let r = alice
            .post(
                &dir,
                &url(&dir, "newOrder"),
                Some(&json!({"identifiers": [{"type": "dns", "value": "pending.example.test"}]})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", text(&r));
        let pending_url = r.location().unwrap();
        let authz_url = r.json()["authorizations"][0].as_str().unwrap().to_owned();
        let authz = alice.post(&dir, &authz_url, None).await.json();
        let challenge_url = authz["challenges"][0]["url"].as_str().unwrap().to_owned();
        let other = Store::open(&db, &StoreOptions::default()).await.unwrap();

        let writes = [
            (
                "newOrder",
                url(&dir, "newOrder"),
                json!({"identifiers": [{"type": "dns", "value": "after.example.test"}]}),
            ),
            ("challenge", challenge_url, json!({})),
            (
                "finalize",
                finalize,
                json!({"csr": csr_for("ready.example.test")}),
            ),
        ];
        for (what, to, payload) in &writes {
            // The account signs a read: the server has its copy now.
            let r = alice.post(&dir, &order_url, None).await;
            assert_eq!(r.status, 200, "{}", text(&r));
            // Another process rolls the key over.
            let new = Key::p256();
            let old = Jwk::from_value(&alice.key.jwk).unwrap();
            let new_jwk = Jwk::from_value(&new.jwk).unwrap();
            let outcome = other
                .change_account_key(
                    &account_id,
                    "default",
                    &old.thumbprint_b64(),
                    &new_jwk.thumbprint_b64(),
                    &new_jwk.to_value().to_string(),
                )
                .await
                .unwrap();
            assert_eq!(outcome, KeyChangeOutcome::Changed);

            let r = alice.post(&dir, &order_url, None).await;
            if ttl == "0s" {
                assert_problem(&r, 400, "malformed", "a read with the old key, no copy");
            } else {
                assert_eq!(r.status, 200, "the copy answers a read: {}", text(&r));
            }
            // The write with the old key is refused, whatever the copy says.
            let r = alice.post(&dir, to, Some(payload)).await;
            if ttl == "0s" {
                assert_problem(&r, 400, "malformed", &format!("{what}, no copy"));
            } else {
                // RFC 8555 §7.3.6's 401 for an account that can no
                // longer sign: the guarded write cannot tell a rollover
                // from a deactivation.
                r.assert_refused(401, "unauthorized", &format!("{what} from the copy"));
            }
            // The refusal dropped the copy: the old key is refused for
            // reads too now.
            let r = alice.post(&dir, &order_url, None).await;
            assert_problem(
                &r,
                400,
                "malformed",
                "a read with the old key after a refusal",
            );
            alice = Acct {
                key: new,
                url: alice.url,
            };
        }
        other.close().await;
        // Nothing was written: the orders are as they were, the challenge
        // pending, no certificate, no third order.
        let ready = alice.post(&dir, &order_url, None).await.json();
        assert_eq!(ready["status"], "ready", "{ready}");
        assert!(ready["certificate"].is_null(), "{ready}");
        let pending = alice.post(&dir, &pending_url, None).await.json();
        assert_eq!(pending["status"], "pending", "{pending}");
        let challenge = alice.post(&dir, &writes[1].1, None).await.json();
        assert_eq!(challenge["status"], "pending", "{challenge}");
        let orders = alice.post(&dir, &alice.url, None).await.json()["orders"]
            .as_str()
            .unwrap()
            .to_owned();
        let listed = alice.post(&dir, &orders, None).await.json();
        assert_eq!(
            listed["orders"].as_array().map(Vec::len),
            Some(2),
            "{listed}"
        );
        server.stop().await;
    }
}

/// What this server changes on an account it forgets the copy of at once,
/// however long copies live: the client's own deactivation (RFC 8555
/// §7.3.6) refuses its very next request, a read included, and a contact
/// update is what the next read of the account shows.
#[tokio::test]
async fn the_accounts_own_update_and_deactivation_are_seen_by_its_next_read_however_long_copies_live()
 {
    let data = crate::harness::tempdir();
    let toml = format!(
        "account_cache_ttl = \"60s\"\n{}",
        TestServer::config_text(data.path(), 1, None, BYPASS)
    );
    let server = TestServer::start_in(data, &toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let (order_url, _) = ready_order(&dir, &alice, "own.example.test").await;
    // Reads that leave the server a copy of the account.
    assert_eq!(alice.post(&dir, &alice.url, None).await.status, 200);
    assert_eq!(alice.post(&dir, &order_url, None).await.status, 200);

    let r = alice
        .post(
            &dir,
            &alice.url,
            Some(&json!({"contact": ["mailto:new@example.test"]})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let shown = alice.post(&dir, &alice.url, None).await.json();
    assert_eq!(shown["contact"], json!(["mailto:new@example.test"]));

    let r = alice
        .post(&dir, &alice.url, Some(&json!({"status": "deactivated"})))
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let r = alice.post(&dir, &order_url, None).await;
    r.assert_refused(401, "unauthorized", "a read after deactivation");
    server.stop().await;
}

/// RFC 8555 §7.3.6: "If a server receives a POST or POST-as-GET from a
/// deactivated account, it MUST return an error response with status code
/// 401 (Unauthorized)". Here another process (a second store on the same
/// database, as the admin CLI) deactivates the account while the server
/// holds a fresh copy of it that still reads valid: the guarded write of a
/// newOrder refuses with 401, and so does the next read, now from the
/// store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_deactivated_by_another_process_gets_401_from_a_write_verified_by_its_stale_copy_and_from_the_next_read()
 {
    use acme_proxy_store::{Store, StoreOptions};

    let data = crate::harness::tempdir();
    let toml = format!(
        "account_cache_ttl = \"60s\"\n{}",
        TestServer::config_text(data.path(), 1, None, BYPASS)
    );
    let db = acme_proxy::config::Config::from_toml(&toml)
        .expect("config")
        .database_url();
    let server = TestServer::start_in(data, &toml).await;
    let dir = raw::directory(&server.directory("default")).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let account_id = alice.url.rsplit('/').next().unwrap().to_owned();
    // A read: the server keeps a copy of the account, valid.
    assert_eq!(alice.post(&dir, &alice.url, None).await.status, 200);

    let other = Store::open(&db, &StoreOptions::default()).await.unwrap();
    assert!(
        other
            .deactivate_account(&account_id, &[], None)
            .await
            .unwrap()
    );
    other.close().await;

    let r = alice
        .post(
            &dir,
            &url(&dir, "newOrder"),
            Some(&dns_order(&["late.example.test"])),
        )
        .await;
    r.assert_refused(401, "unauthorized", "newOrder verified by the stale copy");
    let r = alice.post(&dir, &alice.url, None).await;
    r.assert_refused(401, "unauthorized", "a read after the refused write");
    server.stop().await;
}

/// A bypass profile's challenge trigger (RFC 8555 §7.5.1) makes its
/// account's pending challenge valid, with its authorization and its order,
/// and answers the other cases: another account's challenge is not found
/// (as an unknown one is) and left pending, a repeated trigger answers the state, an unknown challenge
/// is not found, and a deactivated authorization takes no response.
#[tokio::test]
async fn a_bypassed_challenge_goes_valid_for_its_own_account_only_and_a_repeat_or_a_dead_authorization_is_answered()
 {
    let (server, dir) = start(BYPASS).await;
    let alice = Acct::create(&dir, Key::p256()).await;
    let bob = Acct::create(&dir, Key::p256()).await;
    let order = |name: &str| json!({"identifiers": [{"type": "dns", "value": name}]});
    let r = alice
        .post(
            &dir,
            &url(&dir, "newOrder"),
            Some(&order("mine.example.test")),
        )
        .await;
    let order_url = r.location().unwrap();
    let authz_url = r.json()["authorizations"][0].as_str().unwrap().to_owned();
    let authz = alice.post(&dir, &authz_url, None).await.json();
    let challenge_url = authz["challenges"][0]["url"].as_str().unwrap().to_owned();

    let r = bob.post(&dir, &challenge_url, Some(&json!({}))).await;
    r.assert_refused(404, "malformed", "another account's challenge");
    let r = alice.post(&dir, &challenge_url, None).await;
    assert_eq!(r.json()["status"], "pending", "{}", text(&r));

    let r = alice.post(&dir, &challenge_url, Some(&json!({}))).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["status"], "valid");
    assert!(r.json()["validated"].is_string(), "{}", text(&r));
    assert!(
        header(&r, "link").is_some_and(|l| l.contains(&authz_url) && l.contains("rel=\"up\"")),
        "{:?}",
        r.headers
    );
    let authz = alice.post(&dir, &authz_url, None).await.json();
    assert_eq!(authz["status"], "valid", "{authz}");
    let mine = alice.post(&dir, &order_url, None).await.json();
    assert_eq!(mine["status"], "ready", "{mine}");
    let r = alice.post(&dir, &challenge_url, Some(&json!({}))).await;
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (200, Some("valid")),
        "a repeated trigger: {}",
        text(&r)
    );

    let unknown = format!("{}x", challenge_url);
    let r = alice.post(&dir, &unknown, Some(&json!({}))).await;
    assert_problem(&r, 404, "malformed", "an unknown challenge");

    // An authorization deactivated by its client takes no response.
    let r = alice
        .post(
            &dir,
            &url(&dir, "newOrder"),
            Some(&order("dead.example.test")),
        )
        .await;
    let dead_url = r.json()["authorizations"][0].as_str().unwrap().to_owned();
    let dead = alice.post(&dir, &dead_url, None).await.json();
    let dead_challenge = dead["challenges"][0]["url"].as_str().unwrap().to_owned();
    let r = alice
        .post(&dir, &dead_url, Some(&json!({"status": "deactivated"})))
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let r = alice.post(&dir, &dead_challenge, Some(&json!({}))).await;
    assert_problem(
        &r,
        400,
        "malformed",
        "a deactivated authorization's challenge",
    );
    assert!(text(&r).contains("deactivated"), "{}", text(&r));
    let r = alice.post(&dir, &dead_challenge, None).await;
    assert_eq!(r.json()["status"], "pending", "{}", text(&r));
    server.stop().await;
}
