//! A signer backend from outside the crate, plugged into a running server
//! through `server::start_with`: the authority drives it through issuance
//! (RFC 8555 §7.4), renewalInfo (RFC 9773) and revocation (RFC 8555 §7.6)
//! by the questions of `SignerBackend` alone, knowing nothing of its kind.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use acme_proxy::signer::{
    AskedWindow, BoxFuture, Issuance, IssueContext, IssueRequest, Issued, IssuedCertificate,
    RevokeFailure, Signer, SignerBackend, SignerError,
};
use instant_acme::{CertificateIdentifier, RevocationRequest};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyIdMethod, KeyPair, SanType,
    SerialNumber, SubjectPublicKeyInfo,
};
use rustls::pki_types::CertificateDer;

use crate::harness::{Responder, TestServer};
use crate::{client, raw};

/// The renewal window the test signer gives for every certificate.
const WINDOW: (i64, i64) = (2_000_000_000, 2_000_086_400);

/// A CA in memory that signs inside the request, gives a fixed renewal
/// window and writes down what it was asked to revoke.
struct TestSigner {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    issued: Mutex<u64>,
    revoked: Mutex<Vec<(String, u64)>>,
}

impl std::fmt::Debug for TestSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestSigner").finish_non_exhaustive()
    }
}

impl TestSigner {
    fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "test signer CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_identifier_method = KeyIdMethod::Sha256;
        let ca_pem = params.self_signed(&key).unwrap().pem();
        TestSigner {
            issuer: Issuer::new(params, key),
            ca_pem,
            issued: Mutex::new(0),
            revoked: Mutex::new(Vec::new()),
        }
    }

    fn sign(&self, req: &IssueRequest<'_>) -> Result<Issued, SignerError> {
        let spki = SubjectPublicKeyInfo::from_der(req.spki_der)
            .map_err(|e| SignerError::BadCsr(e.to_string()))?;
        let mut n = self.issued.lock().unwrap();
        *n += 1;
        let serial = [0x7e, (*n & 0xff) as u8, 0x01];
        let mut params = CertificateParams::default();
        params.not_before = req.not_before;
        params.not_after = req.not_after;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.use_authority_key_identifier_extension = true;
        params.key_identifier_method = KeyIdMethod::Sha256;
        for id in req.identifiers {
            params
                .subject_alt_names
                .push(SanType::DnsName(id.value.clone().try_into().unwrap()));
        }
        let cert = params
            .signed_by(&spki, &self.issuer)
            .map_err(|e| SignerError::Internal(e.to_string()))?;
        Ok(Issued {
            chain_pem: format!("{}{}", cert.pem(), self.ca_pem),
            serial: hex::encode(serial),
            not_before: req.not_before.unix_timestamp(),
            not_after: req.not_after.unix_timestamp(),
        })
    }
}

impl SignerBackend for TestSigner {
    fn issuance(&self) -> Issuance<'_> {
        Issuance::Inline
    }

    fn issue<'a>(
        &'a self,
        req: &'a IssueRequest<'a>,
        _ctx: &'a IssueContext<'a>,
    ) -> BoxFuture<'a, Result<Issued, SignerError>> {
        Box::pin(std::future::ready(self.sign(req)))
    }

    fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn renewal_window<'a>(&'a self, _cert: &'a IssuedCertificate<'a>) -> Option<AskedWindow<'a>> {
        Some(Box::pin(std::future::ready(Ok(Some(WINDOW)))))
    }

    fn revoke<'a>(
        &'a self,
        cert: &'a IssuedCertificate<'a>,
        reason: u64,
    ) -> BoxFuture<'a, Result<(), RevokeFailure>> {
        self.revoked
            .lock()
            .unwrap()
            .push((cert.serial.to_owned(), reason));
        Box::pin(std::future::ready(Ok(())))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signer_plugged_in_from_outside_issues_gives_its_renewal_window_and_revokes() {
    let responder = Responder::start().await;
    let signer = Arc::new(TestSigner::new());
    let plugged: BTreeMap<String, Signer> =
        BTreeMap::from([("default".to_owned(), Arc::clone(&signer) as Signer)]);
    let server = TestServer::start_plugged(
        responder.port,
        "[profiles.default]\nbypass = true\n",
        plugged,
    )
    .await;
    let account = client::account(&server.directory("default")).await;

    // Issuance: the chain is the test signer's, leaf first.
    let (chain, _) = client::issue(&account, &responder, &["plugged.example.test"]).await;
    assert!(chain.ends_with(&signer.ca_pem), "{chain}");
    assert_eq!(*signer.issued.lock().unwrap(), 1);
    let leaf = ::pem::parse_many(&chain).unwrap()[0].contents().to_vec();
    let served = raw::request(
        "GET",
        &format!("{}/profile/default/ca.pem", server.base()),
        None,
        vec![],
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&served.body),
        signer.ca_pem,
        "the CA certificate served is the signer's"
    );

    // renewalInfo: the signer's window, as it gave it.
    let id = CertificateIdentifier::try_from(&CertificateDer::from(leaf.clone())).unwrap();
    let (info, _) = account.renewal_info(&id).await.expect("renewalInfo");
    assert_eq!(
        (
            info.suggested_window.start.unix_timestamp(),
            info.suggested_window.end.unix_timestamp()
        ),
        WINDOW
    );

    // Revocation: the signer is told first, then the authority records it
    // (the window moves into the past: renew now).
    account
        .revoke(&RevocationRequest {
            certificate: &CertificateDer::from(leaf),
            reason: None,
        })
        .await
        .expect("revoked");
    assert_eq!(
        *signer.revoked.lock().unwrap(),
        vec![("7e0101".to_owned(), 0)]
    );
    let (info, _) = account.renewal_info(&id).await.expect("renewalInfo");
    assert!(
        info.suggested_window.end.unix_timestamp() < WINDOW.0,
        "{:?}",
        info.suggested_window
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signer_plugged_in_for_a_profile_the_configuration_lacks_refuses_start_up() {
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(dir.path(), 1, None, "");
    let config = acme_proxy::config::Config::from_toml(&toml).unwrap();
    let plugged: BTreeMap<String, Signer> =
        BTreeMap::from([("absent".to_owned(), Arc::new(TestSigner::new()) as Signer)]);
    let e =
        acme_proxy::server::start_with(config, Arc::new(acme_proxy::clock::SystemClock), plugged)
            .await
            .expect_err("refused");
    assert!(e.to_string().contains("profile absent"), "{e}");
}
