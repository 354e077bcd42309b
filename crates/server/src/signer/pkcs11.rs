//! The embedded CA's key in a PKCS#11 token (an HSM, SoftHSM2): the key
//! never leaves the token; rcgen asks it for each signature.
//!
//! At start-up the token signs a random message that is verified with the
//! CA certificate's public key, so a token key that is not the
//! certificate's stops start-up instead of signing leaves nobody can
//! verify. A session lost later (token reset, module restart) is opened
//! again once, then the signature retried.
//!
//! A module call may take long or never return (a hung HSM, a session
//! blocked in the token). rcgen's `SigningKey` is synchronous, so the
//! embedded CA runs its whole rcgen signing call — and with it every call
//! into the module, a reconnect included — through [`TokenKey::offload`]:
//! on tokio's blocking pool, one at a time, within the configured
//! `timeout`. Past the deadline the request fails and the async workers
//! go on serving. A call stuck in the module cannot be cancelled: it keeps
//! its blocking thread and the session until the module returns, and the
//! signings after it wait for their turn, each at most its own deadline,
//! without taking a thread while they wait.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error, RvError};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use cryptoki::types::AuthPin;
use rcgen::{PublicKeyData, SignatureAlgorithm, SigningKey};

use crate::config::Pkcs11Config;

/// The signature algorithms a token key may have (the CA certificate's).
#[derive(Clone, Copy, Debug)]
enum Kind {
    EcdsaP256,
    EcdsaP384,
    RsaSha256,
}

/// A private key in a token, with the CA certificate's public key.
pub struct TokenKey {
    config: Pkcs11Config,
    pkcs11: Pkcs11,
    /// The open, logged-in session and the key's handle in it.
    state: Mutex<(Session, ObjectHandle)>,
    /// rcgen's `der_bytes`: the EC point, or the RSAPublicKey DER.
    public: Vec<u8>,
    kind: Kind,
    turns: Turns,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenKey")
            .field("module", &self.config.module)
            .field("key_label", &self.config.key_label)
            .finish_non_exhaustive()
    }
}

impl TokenKey {
    /// Opens the token, logs in and finds the key; `spki_der` is the CA
    /// certificate's SubjectPublicKeyInfo, which the key must match.
    pub fn open(config: &Pkcs11Config, spki_der: &[u8]) -> Result<Self, String> {
        use x509_parser::prelude::FromDer;
        let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(spki_der)
            .map_err(|e| format!("the CA certificate's public key: {e}"))?;
        let alg = spki.algorithm.algorithm.to_id_string();
        let param = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .map(|o| o.to_id_string());
        let kind = match (alg.as_str(), param.as_deref()) {
            ("1.2.840.10045.2.1", Some("1.2.840.10045.3.1.7")) => Kind::EcdsaP256,
            ("1.2.840.10045.2.1", Some("1.3.132.0.34")) => Kind::EcdsaP384,
            ("1.2.840.113549.1.1.1", _) => Kind::RsaSha256,
            _ => {
                return Err(format!(
                    "the CA certificate's key ({alg}) is not ECDSA P-256/P-384 or RSA"
                ));
            }
        };
        let pkcs11 = Pkcs11::new(&config.module).map_err(|e| {
            format!(
                "loading the PKCS#11 module {}: {e}",
                config.module.display()
            )
        })?;
        match pkcs11.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
            // Another profile's key in the same module initialized it.
            Ok(()) | Err(Error::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
            Err(e) => return Err(format!("initializing the PKCS#11 module: {e}")),
        }
        let (session, handle) = connect(&pkcs11, config)?;
        let key = TokenKey {
            config: config.clone(),
            pkcs11,
            state: Mutex::new((session, handle)),
            public: spki.subject_public_key.data.to_vec(),
            kind,
            turns: Turns::new(config.timeout),
        };
        key.cross_check()?;
        Ok(key)
    }

    /// How long one signing may take, waiting for its turn included.
    pub fn time_limit(&self) -> Duration {
        self.turns.timeout
    }

    /// Runs `work`, which signs with this key (`what` names it for the
    /// log), off the async workers: see [`Turns::run`].
    pub async fn offload<T, F>(&self, what: &str, work: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.turns.run(what, work).await
    }

    /// Signs a random message in the token and verifies it with the CA
    /// certificate's public key.
    fn cross_check(&self) -> Result<(), String> {
        let mut message = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut message)
            .map_err(|_| "no randomness".to_owned())?;
        let signature = self
            .sign(&message)
            .map_err(|e| format!("signing a test message in the token: {e}"))?;
        let alg: &dyn ring::signature::VerificationAlgorithm = match self.kind {
            Kind::EcdsaP256 => &ring::signature::ECDSA_P256_SHA256_ASN1,
            Kind::EcdsaP384 => &ring::signature::ECDSA_P384_SHA384_ASN1,
            Kind::RsaSha256 => &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        };
        ring::signature::UnparsedPublicKey::new(alg, &self.public)
            .verify(&message, &signature)
            .map_err(|_| {
                "the token's key does not belong to ca_cert: a test signature does not verify with the certificate's public key".to_owned()
            })
    }

    fn sign_in(
        &self,
        session: &Session,
        key: ObjectHandle,
        msg: &[u8],
    ) -> cryptoki::error::Result<Vec<u8>> {
        match self.kind {
            Kind::EcdsaP256 | Kind::EcdsaP384 => {
                // CKM_ECDSA signs a digest we compute, and answers r‖s; X.509
                // wants the DER ECDSA-Sig-Value.
                let digest = match self.kind {
                    Kind::EcdsaP384 => ring::digest::digest(&ring::digest::SHA384, msg),
                    _ => ring::digest::digest(&ring::digest::SHA256, msg),
                };
                let raw = session.sign(&Mechanism::Ecdsa, key, digest.as_ref())?;
                Ok(ecdsa_der(&raw))
            }
            Kind::RsaSha256 => session.sign(&Mechanism::Sha256RsaPkcs, key, msg),
        }
    }
}

/// The token's signings, one at a time (its one session), each on tokio's
/// blocking pool and each within a deadline.
#[derive(Debug)]
struct Turns {
    /// One permit: held by the signing in the module, until it returns.
    turn: Arc<tokio::sync::Semaphore>,
    timeout: Duration,
}

impl Turns {
    fn new(timeout: Duration) -> Self {
        Self {
            turn: Arc::new(tokio::sync::Semaphore::new(1)),
            timeout,
        }
    }

    /// Runs `work` on the blocking pool once the signings before it are
    /// done; an error once `timeout` has passed since the call, waiting
    /// included. `work` cannot be stopped: past the deadline it runs on,
    /// keeps the turn until it returns, and its result is dropped.
    async fn run<T, F>(&self, what: &str, work: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let limit = humantime::format_duration(self.timeout);
        // Waiting for the turn takes no thread: signings behind a hung one
        // do not pile up on the blocking pool, they fail at their deadline.
        let permit = match tokio::time::timeout_at(deadline, Arc::clone(&self.turn).acquire_owned())
            .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err("the token's signing queue is closed".to_owned()),
            Err(_) => {
                return Err(format!(
                    "signing {what}: the token was still busy with an earlier signing that has not returned after {limit}"
                ));
            }
        };
        let late_after = deadline.into_std();
        let label = what.to_owned();
        let task = tokio::task::spawn_blocking(move || {
            // Held until the module returns, however late: two signings
            // never share the session.
            let _turn = permit;
            let out = work();
            if std::time::Instant::now() > late_after {
                tracing::warn!(
                    event = "pkcs11.sign",
                    outcome = "late",
                    what = %label,
                    "the token answered after the deadline; the request had failed already and this signature is discarded"
                );
            }
            out
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(format!("signing {what}: {e}")),
            Err(_) => Err(format!(
                "signing {what}: the token did not answer within {limit}; the call stays in the module, holding the session until it returns"
            )),
        }
    }
}

/// Opens a session on the configured token, logs in with the PIN from its
/// file, and finds the private key.
fn connect(pkcs11: &Pkcs11, config: &Pkcs11Config) -> Result<(Session, ObjectHandle), String> {
    let slot = find_slot(pkcs11, config)?;
    let session = pkcs11
        .open_ro_session(slot)
        .map_err(|e| format!("opening a session on the token: {e}"))?;
    let pin = std::fs::read_to_string(&config.pin_file)
        .map_err(|e| format!("reading pin_file {}: {e}", config.pin_file.display()))?;
    let pin = AuthPin::from(pin.trim_end_matches(['\n', '\r']).to_owned());
    match session.login(UserType::User, Some(&pin)) {
        // PKCS#11 logins are per application and token: reconnecting while
        // the old session still lives, the user already is logged in.
        Ok(()) | Err(Error::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
        Err(e) => return Err(format!("logging in to the token (check pin_file): {e}")),
    }
    let mut template = vec![Attribute::Class(ObjectClass::PRIVATE_KEY)];
    if let Some(label) = &config.key_label {
        template.push(Attribute::Label(label.as_bytes().to_vec()));
    }
    if let Some(id) = &config.key_id {
        template.push(Attribute::Id(
            hex::decode(id).map_err(|_| "key_id is not hex".to_owned())?,
        ));
    }
    let found = session
        .find_objects(&template)
        .map_err(|e| format!("searching the token for the key: {e}"))?;
    match found.as_slice() {
        [one] => Ok((session, *one)),
        [] => Err("no private key with that label/id in the token".to_owned()),
        _ => Err("several private keys match that label/id; add key_id".to_owned()),
    }
}

fn find_slot(pkcs11: &Pkcs11, config: &Pkcs11Config) -> Result<Slot, String> {
    let slots = pkcs11
        .get_slots_with_initialized_token()
        .map_err(|e| format!("listing the token slots: {e}"))?;
    for slot in slots {
        if let Some(want) = config.slot {
            if slot.id() == want {
                return Ok(slot);
            }
            continue;
        }
        let info = pkcs11
            .get_token_info(slot)
            .map_err(|e| format!("reading token info: {e}"))?;
        if Some(info.label().trim_end()) == config.token_label.as_deref() {
            return Ok(slot);
        }
    }
    Err(match (&config.token_label, config.slot) {
        (Some(label), _) => format!("no initialized token labelled {label:?}"),
        (None, Some(slot)) => format!("no initialized token in slot {slot}"),
        (None, None) => "no token named".to_owned(),
    })
}

impl PublicKeyData for TokenKey {
    fn der_bytes(&self) -> &[u8] {
        &self.public
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        match self.kind {
            Kind::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Kind::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            Kind::RsaSha256 => &rcgen::PKCS_RSA_SHA256,
        }
    }
}

impl SigningKey for TokenKey {
    /// Blocks its thread for as long as the module takes: called by rcgen
    /// inside [`TokenKey::offload`], or by the start-up cross-check.
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| rcgen::Error::RemoteKeyError)?;
        match self.sign_in(&state.0, state.1, msg) {
            Ok(sig) => Ok(sig),
            Err(first) => {
                // The session may have been lost (token reset, module
                // restarted): open it again, once, and retry.
                tracing::warn!(
                    event = "pkcs11.sign",
                    outcome = "retry",
                    error = %first,
                    "the token refused to sign; reconnecting once"
                );
                let fresh = connect(&self.pkcs11, &self.config).map_err(|e| {
                    tracing::error!(event = "pkcs11.reconnect", outcome = "failure", error = %e, "reconnecting to the token failed");
                    rcgen::Error::RemoteKeyError
                })?;
                *state = fresh;
                self.sign_in(&state.0, state.1, msg).map_err(|e| {
                    tracing::error!(event = "pkcs11.sign", outcome = "failure", error = %e, "the token refused to sign after reconnecting");
                    rcgen::Error::RemoteKeyError
                })
            }
        }
    }
}

/// r‖s (two equal halves) as a DER `ECDSA-Sig-Value` (RFC 3279 §2.2.3).
fn ecdsa_der(raw: &[u8]) -> Vec<u8> {
    let (r, s) = raw.split_at(raw.len() / 2);
    let integer = |v: &[u8]| {
        let v = match v.iter().position(|&b| b != 0) {
            Some(i) => &v[i..],
            None => &[0u8][..],
        };
        let mut content = Vec::with_capacity(v.len() + 1);
        if v[0] & 0x80 != 0 {
            content.push(0);
        }
        content.extend_from_slice(v);
        tlv(0x02, &content)
    };
    let mut body = integer(r);
    body.extend(integer(s));
    tlv(0x30, &body)
}

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else if len < 0x100 {
        out.extend([0x81, len as u8]);
    } else {
        out.extend([0x82, (len >> 8) as u8, len as u8]);
    }
    out.extend_from_slice(content);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A stand-in for a module call that does not return: it blocks its
    /// thread until `release` is sent (or dropped), 30 s at most so that a
    /// regression fails rather than hangs. `began` says it is inside.
    fn hung_call(
        began: tokio::sync::oneshot::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
    ) -> impl FnOnce() -> &'static str + Send + 'static {
        move || {
            let _ = began.send(());
            let _ = release.recv_timeout(Duration::from_secs(30));
            "signed late"
        }
    }

    // The default #[tokio::test] runtime has one thread: work blocking it
    // would stop every other task, as one stuck worker of the server's.
    #[tokio::test]
    async fn a_token_call_that_does_not_return_leaves_the_async_thread_serving_and_fails_at_its_deadline()
     {
        let turns = Turns::new(Duration::from_millis(300));
        let (began, inside) = tokio::sync::oneshot::channel();
        let (release, hang) = std::sync::mpsc::channel();
        let started = Instant::now();
        let signing = async {
            let out = turns.run("certificate 01", hung_call(began, hang)).await;
            (out, Instant::now())
        };
        let meanwhile = async {
            inside.await.expect("the call began");
            // The call is blocked now; this task still runs, on the
            // runtime's only thread, and so does a timer.
            tokio::time::sleep(Duration::from_millis(10)).await;
            Instant::now()
        };
        let ((out, failed_at), served_at) = tokio::join!(signing, meanwhile);
        let err = out.expect_err("a call that does not return fails the signing");
        assert!(
            err.contains("certificate 01") && err.contains("did not answer within 300ms"),
            "{err}"
        );
        assert!(
            served_at < failed_at,
            "another task ran while the call was blocked"
        );
        assert!(
            failed_at - started < Duration::from_secs(10),
            "the signing failed at its deadline, not when the call returned"
        );
        drop(release);
    }

    #[tokio::test]
    async fn signings_behind_a_hung_one_fail_at_their_own_deadline_without_starting_then_sign_once_it_returns()
     {
        let turns = Turns::new(Duration::from_millis(300));
        let (began, inside) = tokio::sync::oneshot::channel();
        let (release, hang) = std::sync::mpsc::channel();
        let first = turns.run("certificate 01", hung_call(began, hang));
        let behind = async {
            inside.await.expect("the first call began");
            let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = Arc::clone(&ran);
            let out = turns
                .run("CRL 7", move || {
                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                })
                .await;
            (out, ran.load(std::sync::atomic::Ordering::SeqCst))
        };
        let (first, (second, second_ran)) = tokio::join!(first, behind);
        assert!(first.is_err(), "the hung call failed its signing");
        let err = second.expect_err("the signing behind it fails too");
        assert!(
            err.contains("CRL 7") && err.contains("still busy with an earlier signing"),
            "{err}"
        );
        assert!(
            !second_ran,
            "a signing behind a hung one never reaches the module"
        );

        // The module returns: the next signing has the session again.
        release.send(()).expect("the hung call is still waiting");
        let out = turns.run("certificate 02", || "signed").await;
        assert_eq!(out, Ok("signed"));
    }

    #[test]
    fn a_raw_ecdsa_signature_becomes_minimal_der() {
        // r with a high bit (needs a 0x00), s with leading zeros (trimmed).
        let mut raw = vec![0x80; 32];
        raw.extend([0u8, 0, 0x01, 0x02]);
        raw.extend(vec![0x11; 28]);
        let der = ecdsa_der(&raw);
        assert_eq!(der[0], 0x30);
        assert_eq!(&der[2..5], &[0x02, 33, 0x00]);
        let s_at = 2 + 2 + 33;
        assert_eq!(&der[s_at..s_at + 3], &[0x02, 30, 0x01]);
        assert_eq!(der[1] as usize, der.len() - 2);
    }
}
