//! The whole RFC 8555 flow driven by instant-acme over real HTTP: account,
//! order, http-01 answered by a responder this test runs, finalize,
//! download, renewal, revocation and the CRL.

use instant_acme::{RevocationReason, RevocationRequest};
use rustls::pki_types::CertificateDer;
use x509_parser::prelude::*;

use crate::client;
use crate::harness::{Dns, Responder, TestServer};

fn pem_blocks(chain: &str) -> Vec<Vec<u8>> {
    ::pem::parse_many(chain)
        .expect("PEM")
        .into_iter()
        .map(::pem::Pem::into_contents)
        .collect()
}

pub(crate) async fn crl_der(base: &str) -> Vec<u8> {
    let response = reqwest_get(&format!("{base}/profile/default/crl")).await;
    assert_eq!(response.0, 200);
    assert_eq!(response.1.as_deref(), Some("application/pkix-crl"));
    response.2
}

/// A minimal GET over hyper (no extra HTTP client dependency).
pub async fn reqwest_get(url: &str) -> (u16, Option<String>, Vec<u8>) {
    use http_body_util::{BodyExt, Empty};
    let uri: http::Uri = url.parse().expect("uri");
    let addr = format!(
        "{}:{}",
        uri.host().expect("host"),
        uri.port_u16().unwrap_or(80)
    );
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let req = http::Request::get(uri.path())
        .header("host", uri.host().expect("host"))
        .body(Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    (status, ct, body)
}

#[tokio::test]
async fn instant_acme_obtains_renews_and_revokes_a_certificate_and_the_crl_lists_it() {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let server = TestServer::start(responder.port, Some(&dns), "").await;
    let account = client::account(&server.directory("default")).await;

    let names = ["www.example.test", "api.example.test"];
    let (chain, _key) = client::issue(&account, &responder, &names).await;
    let blocks = pem_blocks(&chain);
    assert_eq!(blocks.len(), 2, "leaf and CA");
    let (_, leaf) = X509Certificate::from_der(&blocks[0]).expect("leaf parses");
    let (_, ca) = X509Certificate::from_der(&blocks[1]).expect("CA parses");

    // The CA in the chain is the profile's CA, as served at ca.pem.
    let (status, _, ca_pem) =
        reqwest_get(&format!("{}/profile/default/ca.pem", server.base())).await;
    assert_eq!(status, 200);
    assert_eq!(
        pem_blocks(&String::from_utf8(ca_pem).unwrap())[0],
        blocks[1]
    );

    // SANs are exactly the order's names; the issuer is the CA; the leaf is
    // signed by it; EKU is serverAuth; AKI names the CA's SKI.
    let mut sans: Vec<String> = leaf
        .subject_alternative_name()
        .expect("SAN ext")
        .expect("SAN present")
        .value
        .general_names
        .iter()
        .map(|g| match g {
            GeneralName::DNSName(n) => (*n).to_owned(),
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect();
    sans.sort();
    assert_eq!(sans, vec!["api.example.test", "www.example.test"]);
    assert_eq!(leaf.issuer(), ca.subject());
    leaf.verify_signature(Some(ca.public_key()))
        .expect("signed by the CA");
    assert!(
        leaf.extended_key_usage()
            .unwrap()
            .unwrap()
            .value
            .server_auth
    );
    assert!(!leaf.is_ca());
    let ski = match ca
        .get_extension_unique(&x509_parser::oid_registry::OID_X509_EXT_SUBJECT_KEY_IDENTIFIER)
        .unwrap()
        .unwrap()
        .parsed_extension()
    {
        ParsedExtension::SubjectKeyIdentifier(k) => k.0.to_vec(),
        _ => panic!("no SKI"),
    };
    let aki = match leaf
        .get_extension_unique(&x509_parser::oid_registry::OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER)
        .unwrap()
        .unwrap()
        .parsed_extension()
    {
        ParsedExtension::AuthorityKeyIdentifier(a) => a.key_identifier.as_ref().unwrap().0.to_vec(),
        _ => panic!("no AKI"),
    };
    assert_eq!(aki, ski);
    assert!(
        leaf.raw_serial().len() >= 8,
        "serial carries at least 64 bits"
    );
    assert!(
        leaf.get_extension_unique(&x509_parser::oid_registry::OID_X509_EXT_SUBJECT_KEY_IDENTIFIER)
            .unwrap()
            .is_some(),
        "the leaf has an SKI"
    );

    // Renewal: a second order for the same names gets a new certificate.
    let (chain2, _) = client::issue(&account, &responder, &names).await;
    let renewed = pem_blocks(&chain2);
    let (_, leaf2) = X509Certificate::from_der(&renewed[0]).expect("renewed leaf parses");
    assert_ne!(leaf.raw_serial(), leaf2.raw_serial());

    // Revocation of the first certificate by the account key.
    let crl_before = crl_der(server.base()).await;
    let (_, before) = parse_x509_crl(&crl_before).expect("CRL parses");
    let before_number = before.crl_number().cloned().expect("CRL number");
    account
        .revoke(&RevocationRequest {
            certificate: &CertificateDer::from(blocks[0].clone()),
            reason: Some(RevocationReason::KeyCompromise),
        })
        .await
        .expect("revoked");
    let again = account
        .revoke(&RevocationRequest {
            certificate: &CertificateDer::from(blocks[0].clone()),
            reason: None,
        })
        .await
        .expect_err("a second revocation is refused");
    assert_eq!(client::problem_type(&again), "alreadyRevoked");

    let crl = crl_der(server.base()).await;
    let (_, crl) = parse_x509_crl(&crl).expect("CRL parses");
    crl.verify_signature(ca.public_key())
        .expect("CRL signed by the CA");
    assert_eq!(crl.issuer(), ca.subject());
    assert!(
        crl.crl_number().expect("CRL number") > &before_number,
        "CRL number grows"
    );
    let revoked: Vec<&[u8]> = crl
        .iter_revoked_certificates()
        .map(|r| r.raw_serial())
        .collect();
    assert!(
        revoked.contains(&leaf.raw_serial()),
        "the revoked serial is listed"
    );
    assert!(
        !revoked.contains(&leaf2.raw_serial()),
        "the renewed certificate is not"
    );
    let reason = crl
        .iter_revoked_certificates()
        .find(|r| r.raw_serial() == leaf.raw_serial())
        .and_then(|r| r.reason_code())
        .map(|(_, rc)| rc.0);
    assert_eq!(reason, Some(1), "keyCompromise is recorded");
    server.stop().await;
}

#[tokio::test]
async fn a_wrong_key_authorization_makes_the_challenge_and_order_invalid() {
    let Some(dns) = Dns::start() else { return };
    let responder = Responder::start().await;
    let server = TestServer::start(responder.port, Some(&dns), "").await;
    let account = client::account(&server.directory("default")).await;
    let ids = [instant_acme::Identifier::Dns("bad.example.test".into())];
    let mut order = account
        .new_order(&instant_acme::NewOrder::new(&ids))
        .await
        .unwrap();
    let mut authzs = order.authorizations();
    let mut authz = authzs.next().await.unwrap().unwrap();
    let mut ch = authz
        .challenge(instant_acme::ChallengeType::Http01)
        .unwrap();
    responder.publish(&ch.token, "not-the-key-authorization");
    ch.set_ready().await.unwrap();
    // instant-acme reports an invalid order's error as Err: accept both.
    match order.poll_ready(&client::retry()).await {
        Ok(status) => assert_eq!(status, instant_acme::OrderStatus::Invalid),
        Err(e) => assert_eq!(client::problem_type(&e), "incorrectResponse"),
    }
    let state = order.refresh().await.unwrap();
    assert_eq!(state.status, instant_acme::OrderStatus::Invalid);
    let mut authzs = order.authorizations();
    let authz = authzs.next().await.unwrap().unwrap();
    assert_eq!(authz.status, instant_acme::AuthorizationStatus::Invalid);
    let err = authz.challenges[0].error.as_ref().expect("challenge error");
    assert_eq!(
        err.r#type.as_deref(),
        Some("urn:ietf:params:acme:error:incorrectResponse")
    );
    server.stop().await;
}
