//! The JWS rejection table (RFC 8555 §6.1–§6.5, §6.7, §7.3.6): forged and
//! malformed requests, each answered with the expected status and problem
//! type — and, like every POST response, a fresh nonce, not the one the
//! request used, that the next request can use.

use serde_json::{Value, json};

use crate::harness::TestServer;
use crate::raw::{self, Acct, Key, b64};

struct Case {
    name: &'static str,
    url: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    problem: &'static str,
}

fn case(name: &'static str, url: &str, body: Value, status: u16, problem: &'static str) -> Case {
    Case {
        name,
        url: url.to_owned(),
        content_type: Some("application/jose+json"),
        body: body.to_string().into_bytes(),
        status,
        problem,
    }
}

/// Signs with `key` but lets the test write any protected header.
fn forged(key: &Key, protected: Value, payload: Option<&Value>) -> Value {
    key.sign(&protected, payload)
}

/// `s` with the trailing '=' a padding base64 encoder writes (at least one).
fn padded(s: &Value) -> Value {
    let s = s.as_str().unwrap();
    json!(format!("{s}{}", "=".repeat(((4 - s.len() % 4) % 4).max(1))))
}

#[tokio::test]
async fn forged_and_malformed_requests_get_the_right_problem_and_a_fresh_nonce() {
    let server = TestServer::start(
        1,
        None,
        "[profiles.default]\nbypass = true\n[profiles.other]\n",
    )
    .await;
    let dir = raw::directory(&server.directory("default")).await;
    let other_dir = raw::directory(&server.directory("other")).await;
    let new_order = dir["newOrder"].as_str().unwrap().to_owned();
    let new_account = dir["newAccount"].as_str().unwrap().to_owned();

    let alice = Acct::create(&dir, Key::p256()).await;
    // The same key at another profile is another account (profiles never cross).
    let alice_elsewhere = Acct::create(&other_dir, alice.key.clone()).await;
    assert_ne!(alice.url, alice_elsewhere.url);
    let gone = Acct::create(&dir, Key::p256()).await;
    let r = gone
        .post(
            &dir,
            &gone.url.clone(),
            Some(&json!({"status": "deactivated"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["status"], "deactivated");

    // An order to POST-as-GET against.
    let r = alice
        .post(
            &dir,
            &new_order,
            Some(&json!({"identifiers": [{"type": "dns", "value": "t.example.test"}]})),
        )
        .await;
    assert_eq!(r.status, 201);
    let order_url = r.location().unwrap();

    let order_payload = json!({"identifiers": [{"type": "dns", "value": "a.example.test"}]});
    let k = &alice.key;
    let kid = |nonce: &str, url: &str| json!({"alg": k.alg(), "kid": alice.url, "nonce": nonce, "url": url});
    let mut cases = Vec::new();
    macro_rules! n {
        () => {
            raw::nonce(&dir).await
        };
    }

    // Content type and serialization.
    let good = k.sign(&kid(&n!(), &new_order), Some(&order_payload));
    cases.push(Case {
        content_type: Some("application/json"),
        ..case(
            "wrong content type",
            &new_order,
            good.clone(),
            415,
            "malformed",
        )
    });
    cases.push(Case {
        content_type: None,
        ..case("no content type", &new_order, good, 415, "malformed")
    });
    cases.push(Case {
        body: b"eyJhbGciOiJFUzI1NiJ9.e30.c2ln".to_vec(),
        ..case(
            "compact serialization as bare text",
            &new_order,
            json!(null),
            400,
            "malformed",
        )
    });
    cases.push(case(
        "compact serialization as a JSON string",
        &new_order,
        json!("eyJhbGciOiJFUzI1NiJ9.e30.c2ln"),
        400,
        "malformed",
    ));
    let s = k.sign(&kid(&n!(), &new_order), Some(&order_payload));
    cases.push(case(
        "general serialization",
        &new_order,
        json!({"payload": s["payload"], "signatures": [{"protected": s["protected"], "signature": s["signature"]}]}),
        400,
        "malformed",
    ));
    let mut s = k.sign(&kid(&n!(), &new_order), Some(&order_payload));
    s["header"] = json!({"kid": alice.url});
    cases.push(case("unprotected header", &new_order, s, 400, "malformed"));
    let mut s = k.sign(&kid(&n!(), &new_order), Some(&order_payload));
    s["protected"] = json!(b64(b"not json"));
    cases.push(case(
        "protected header not JSON",
        &new_order,
        s,
        400,
        "malformed",
    ));
    let mut s = k.sign(&kid(&n!(), &new_order), Some(&order_payload));
    s["payload"] = json!("***");
    cases.push(case(
        "payload not base64url",
        &new_order,
        s,
        400,
        "malformed",
    ));
    // §6.1: "Encoded values that include trailing '=' characters MUST be
    // rejected as improperly encoded" — each part, padded after signing
    // or before (the signature then covers the padding).
    for part in ["protected", "payload", "signature"] {
        let mut s = k.sign(&kid(&n!(), &new_order), Some(&order_payload));
        s[part] = padded(&s[part]);
        cases.push(Case {
            name: match part {
                "protected" => "protected header with trailing padding",
                "payload" => "payload with trailing padding",
                _ => "signature with trailing padding",
            },
            ..case("", &new_order, s, 400, "malformed")
        });
    }
    let h = b64(kid(&n!(), &new_order).to_string().as_bytes());
    let p = b64(order_payload.to_string().as_bytes());
    let (h, p) = (padded(&json!(h)), padded(&json!(p)));
    let sig = k.sign_raw(format!("{}.{}", h.as_str().unwrap(), p.as_str().unwrap()).as_bytes());
    cases.push(case(
        "padded parts signed as sent",
        &new_order,
        json!({"protected": h, "payload": p, "signature": b64(&sig)}),
        400,
        "malformed",
    ));
    let mut s = k.sign(&kid(&n!(), &new_order), Some(&order_payload));
    let sig = s["signature"].as_str().unwrap().to_owned();
    s["signature"] = json!(format!("+/{}", &sig[2..]));
    cases.push(case(
        "signature in the standard base64 alphabet",
        &new_order,
        s,
        400,
        "malformed",
    ));

    // Header members.
    let mut h = kid(&n!(), &new_order);
    h["crit"] = json!(["exp"]);
    cases.push(case(
        "crit present",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "malformed",
    ));
    let mut h = kid(&n!(), &new_order);
    h["jwk"] = k.jwk.clone();
    cases.push(case(
        "jwk and kid",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "malformed",
    ));
    let h = json!({"alg": "ES256", "nonce": n!(), "url": new_order});
    cases.push(case(
        "neither jwk nor kid",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "malformed",
    ));
    let h = json!({"alg": "ES256", "jwk": k.jwk, "nonce": n!(), "url": new_order});
    cases.push(case(
        "jwk at a kid-only resource",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "malformed",
    ));
    let h = json!({"alg": "ES256", "kid": alice.url, "nonce": n!(), "url": new_account});
    cases.push(case(
        "kid at newAccount",
        &new_account,
        forged(k, h, Some(&json!({}))),
        400,
        "malformed",
    ));

    // Algorithms: never chosen by the header.
    for (name, alg) in [
        ("alg none", "none"),
        ("alg HS256", "HS256"),
        ("alg PS256", "PS256"),
    ] {
        let mut h = kid(&n!(), &new_order);
        h["alg"] = json!(alg);
        cases.push(case(
            name,
            &new_order,
            forged(k, h, Some(&order_payload)),
            400,
            "badSignatureAlgorithm",
        ));
    }
    // §6.2: a supported alg whose key is of another kind or curve is the
    // key's fault (badPublicKey), for the account's key as for a jwk.
    let mut h = kid(&n!(), &new_order);
    h["alg"] = json!("RS256");
    cases.push(case(
        "alg RS256 with an EC account key",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "badPublicKey",
    ));
    let mut h = kid(&n!(), &new_order);
    h["alg"] = json!("ES384");
    cases.push(case(
        "alg ES384 with a P-256 account key",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "badPublicKey",
    ));
    for (name, alg, problem) in [
        ("jwk P-256 key with alg ES384", "ES384", "badPublicKey"),
        ("jwk EC key with alg RS256", "RS256", "badPublicKey"),
        ("jwk with alg HS256", "HS256", "badSignatureAlgorithm"),
        ("jwk with alg none", "none", "badSignatureAlgorithm"),
    ] {
        let fresh = Key::p256();
        let h = json!({"alg": alg, "jwk": fresh.jwk, "nonce": n!(), "url": new_account});
        cases.push(case(
            name,
            &new_account,
            forged(&fresh, h, Some(&json!({}))),
            400,
            problem,
        ));
    }
    let mut h = json!({"alg": "ES256", "nonce": n!(), "url": new_order});
    h["kid"] = json!(alice.url);
    h.as_object_mut().unwrap().remove("alg");
    cases.push(case(
        "alg missing",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "malformed",
    ));

    // Keys, parsed strictly.
    let fresh = Key::p256();
    let mut jwk = fresh.jwk.clone();
    jwk["x"] = json!(b64(&[7u8; 31]));
    let h = json!({"alg": "ES256", "jwk": jwk, "nonce": n!(), "url": new_account});
    cases.push(case(
        "EC coordinate one octet short",
        &new_account,
        forged(&fresh, h, Some(&json!({}))),
        400,
        "badPublicKey",
    ));
    let mut n1024 = vec![0xc3u8; 128];
    n1024[127] |= 1;
    let h = json!({"alg": "RS256", "jwk": {"kty": "RSA", "n": b64(&n1024), "e": "AQAB"}, "nonce": n!(), "url": new_account});
    cases.push(case(
        "RSA-1024 key",
        &new_account,
        forged(&fresh, h, Some(&json!({}))),
        400,
        "badPublicKey",
    ));
    let mut jwk = fresh.jwk.clone();
    jwk["d"] = json!(b64(&[1u8; 32]));
    let h = json!({"alg": "ES256", "jwk": jwk, "nonce": n!(), "url": new_account});
    cases.push(case(
        "private key material in jwk",
        &new_account,
        forged(&fresh, h, Some(&json!({}))),
        400,
        "badPublicKey",
    ));
    let h = json!({"alg": "ES256", "jwk": {"kty": "EC", "crv": "P-521", "x": b64(&[1u8; 66]), "y": b64(&[1u8; 66])}, "nonce": n!(), "url": new_account});
    cases.push(case(
        "unsupported curve",
        &new_account,
        forged(&fresh, h, Some(&json!({}))),
        400,
        "badPublicKey",
    ));
    let h = json!({"alg": "ES256", "jwk": {"kty": "oct", "k": "AAAA"}, "nonce": n!(), "url": new_account});
    cases.push(case(
        "symmetric key",
        &new_account,
        forged(&fresh, h, Some(&json!({}))),
        400,
        "badPublicKey",
    ));
    let mut jwk = fresh.jwk.clone();
    jwk["y"] = padded(&jwk["y"]);
    let h = json!({"alg": "ES256", "jwk": jwk, "nonce": n!(), "url": new_account});
    cases.push(case(
        "jwk coordinate with trailing padding",
        &new_account,
        forged(&fresh, h, Some(&json!({}))),
        400,
        "malformed",
    ));

    // Signatures.
    let mut s = k.sign(&kid(&n!(), &new_order), Some(&order_payload));
    let mut sig = base64::Engine::decode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        s["signature"].as_str().unwrap(),
    )
    .unwrap();
    sig[10] ^= 0x40;
    s["signature"] = json!(b64(&sig));
    cases.push(case("bad signature", &new_order, s, 400, "malformed"));
    let mallory = Key::p256();
    cases.push(case(
        "signed by another key",
        &new_order,
        forged(&mallory, kid(&n!(), &new_order), Some(&order_payload)),
        400,
        "malformed",
    ));
    let mut s = k.sign(&kid(&n!(), &new_order), Some(&order_payload));
    s["signature"] = json!("");
    cases.push(case("empty signature", &new_order, s, 400, "malformed"));
    let p384 = Key::p384();
    let h = json!({"alg": "ES256", "jwk": p384.jwk, "nonce": n!(), "url": new_account});
    cases.push(case(
        "jwk P-384 key with alg ES256",
        &new_account,
        forged(&p384, h, Some(&json!({}))),
        400,
        "badPublicKey",
    ));

    // url (§6.4).
    cases.push(case(
        "url of another resource",
        &new_order,
        k.sign(&kid(&n!(), &new_account), Some(&order_payload)),
        403,
        "unauthorized",
    ));
    let elsewhere = new_order.replace("127.0.0.1", "localhost");
    cases.push(case(
        "url of another host",
        &new_order,
        k.sign(&kid(&n!(), &elsewhere), Some(&order_payload)),
        403,
        "unauthorized",
    ));
    let h = json!({"alg": k.alg(), "kid": alice.url, "nonce": n!()});
    cases.push(case(
        "url missing",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "malformed",
    ));

    // Nonces (§6.5).
    let h = json!({"alg": k.alg(), "kid": alice.url, "url": new_order});
    cases.push(case(
        "nonce missing",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "badNonce",
    ));
    cases.push(case(
        "nonce unknown",
        &new_order,
        k.sign(
            &kid("AAAAAAAAAAAAAAAAAAAAAA", &new_order),
            Some(&order_payload),
        ),
        400,
        "badNonce",
    ));
    cases.push(case(
        "nonce not base64url",
        &new_order,
        k.sign(&kid("not a nonce!", &new_order), Some(&order_payload)),
        400,
        "malformed",
    ));
    let used = n!();
    let replayed = k.sign(&kid(&used, &new_order), Some(&order_payload));
    let first = raw::post(&new_order, &replayed).await;
    assert_eq!(first.status, 201, "the original of the replay is accepted");
    cases.push(case(
        "nonce replayed",
        &new_order,
        replayed,
        400,
        "badNonce",
    ));

    // Accounts and profiles.
    let h = json!({"alg": k.alg(), "kid": alice_elsewhere.url, "nonce": n!(), "url": new_order});
    cases.push(case(
        "kid of another profile",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "accountDoesNotExist",
    ));
    let unknown = format!("{}/profile/default/acct/nope", server.base());
    let h = json!({"alg": k.alg(), "kid": unknown, "nonce": n!(), "url": new_order});
    cases.push(case(
        "kid unknown",
        &new_order,
        forged(k, h, Some(&order_payload)),
        400,
        "accountDoesNotExist",
    ));
    // §7.3.6: "a POST or POST-as-GET from a deactivated account" is 401.
    let h = json!({"alg": gone.key.alg(), "kid": gone.url, "nonce": n!(), "url": new_order});
    cases.push(case(
        "deactivated account ordering",
        &new_order,
        forged(&gone.key, h, Some(&order_payload)),
        401,
        "unauthorized",
    ));
    let h = json!({"alg": gone.key.alg(), "kid": gone.url, "nonce": n!(), "url": gone.url});
    cases.push(case(
        "deactivated account reading itself (POST-as-GET)",
        &gone.url,
        forged(&gone.key, h, None),
        401,
        "unauthorized",
    ));
    let h = json!({"alg": gone.key.alg(), "kid": gone.url, "nonce": n!(), "url": gone.url});
    cases.push(case(
        "deactivated account updating its contacts",
        &gone.url,
        forged(
            &gone.key,
            h,
            Some(&json!({"contact": ["mailto:back@example.test"]})),
        ),
        401,
        "unauthorized",
    ));
    // §7.3.6: no further request authorized by its key, newAccount with
    // the key itself included (Boulder and Pebble answer 401 too).
    for (name, payload) in [
        (
            "deactivated account's key at newAccount",
            json!({"termsOfServiceAgreed": true}),
        ),
        (
            "deactivated account's key at newAccount, onlyReturnExisting",
            json!({"onlyReturnExisting": true}),
        ),
    ] {
        let h =
            json!({"alg": gone.key.alg(), "jwk": gone.key.jwk, "nonce": n!(), "url": new_account});
        cases.push(case(
            name,
            &new_account,
            forged(&gone.key, h, Some(&payload)),
            401,
            "unauthorized",
        ));
    }

    // Payloads.
    cases.push(case(
        "POST-as-GET with a payload",
        &order_url,
        k.sign(&kid(&n!(), &order_url), Some(&json!({}))),
        400,
        "malformed",
    ));
    cases.push(case(
        "newOrder payload of the wrong shape",
        &new_order,
        k.sign(&kid(&n!(), &new_order), Some(&json!({"identifiers": 5}))),
        400,
        "malformed",
    ));
    cases.push(case(
        "newOrder without a payload",
        &new_order,
        k.sign(&kid(&n!(), &new_order), None),
        400,
        "malformed",
    ));
    let big = json!({"identifiers": [{"type": "dns", "value": "x".repeat(70_000)}]});
    cases.push(case(
        "oversize body",
        &new_order,
        k.sign(&kid(&n!(), &new_order), Some(&big)),
        413,
        "malformed",
    ));

    assert!(cases.len() >= 30, "the table has {} cases", cases.len());
    let mut failures = Vec::new();
    let mut last_nonce = None;
    for c in &cases {
        let r = raw::request("POST", &c.url, c.content_type, c.body.clone()).await;
        let nonce = r.nonce();
        // Fresh: present, and not the one the request carried (if any).
        let fresh = nonce.is_some() && (r.sent_nonce.is_none() || nonce != r.sent_nonce);
        let ok = r.status == c.status
            && r.problem() == c.problem
            && r.headers.get("content-type").map(|v| v.to_str().unwrap())
                == Some("application/problem+json")
            && fresh;
        if !ok {
            failures.push(format!(
                "{}: got {} {:?} (fresh nonce: {fresh}), want {} {}",
                c.name,
                r.status,
                String::from_utf8_lossy(&r.body),
                c.status,
                c.problem
            ));
        }
        last_nonce = nonce;
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );

    // The nonce of an error response is fresh: a valid request can use it.
    let r = raw::post(
        &new_order,
        &k.sign(&kid(&last_nonce.unwrap(), &new_order), Some(&order_payload)),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));

    // The deactivated account's key at newAccount is refused on the
    // record, in rows naming the account.
    let gone_id = gone.url.rsplit('/').next().expect("an account id");
    let rows = server
        .running()
        .authority()
        .store()
        .audit_recent(Some("account.refused"), 10)
        .await
        .expect("audit");
    let about_gone = rows
        .iter()
        .filter(|r| {
            r.account_id.as_deref() == Some(gone_id)
                && r.problem_type.as_deref() == Some("unauthorized")
        })
        .count();
    assert_eq!(about_gone, 2, "{rows:?}");
    server.stop().await;
}
