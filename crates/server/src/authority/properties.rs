//! Properties of the ACME state machine (RFC 8555 §7.1.6), checked over
//! random sequences of what clients and operators do, applied to the
//! authority over a real SQLite store.
//!
//! Each step is one call a request handler, the validation job or an
//! admin command makes. A validation's outcome is the one input from
//! outside, so a step settles a processing challenge as the job does
//! after its validator answered, with success or failure. After every step
//! the whole database of the sequence is read back and checked: statuses
//! only move forward, an order is valid only with its certificate, an
//! authorization is valid only through a valid challenge, a certificate
//! names exactly its order's identifiers, each proven by a valid
//! authorization of its account, and a deactivated account keeps nothing
//! open (§7.3.6).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use acme_proxy_protocol::jwk::EcCurve;
use acme_proxy_protocol::types::{
    AccountStatus, AuthorizationStatus, ChallengeStatus, NewAccount, NewOrder, OrderStatus,
    RawIdentifier,
};
use acme_proxy_protocol::{Jwk, Problem, ProblemType};
use acme_proxy_store::{AccountRow, CertificateRow};
use proptest::prelude::*;
use x509_parser::prelude::*;

use super::certificates::leaf_der;
use super::{Authority, Profile, RequestContext, RevocationSigner};
use crate::clock::ManualClock;
use crate::config::Config;
use crate::error::AcmeError;

/// The names orders draw from: shared between accounts, so that
/// authorizations are reused and contended; a wildcard (dns-01 only) and
/// an IP address (RFC 8738) among them.
const NAMES: [(&str, &str); 4] = [
    ("dns", "a.example.test"),
    ("dns", "b.example.test"),
    ("dns", "*.c.example.test"),
    ("ip", "192.0.2.7"),
];

/// What a CSR at finalize holds.
#[derive(Clone, Copy, Debug)]
enum Csr {
    /// The order's names and a fresh key: the only acceptable one.
    Exact,
    /// One name more than the order has.
    ExtraName,
    /// One name fewer (when the order has two or more).
    MissingName,
    /// The account's own key (§11.1 forbids it).
    AccountKey,
}

/// One thing a client, the validation job, time or an operator does.
/// Indices pick among the objects made so far, modulo their number.
#[derive(Clone, Debug)]
enum Op {
    NewAccount,
    /// `any`: by any account; otherwise by one still valid.
    NewOrder {
        account: usize,
        names: Vec<usize>,
        any: bool,
    },
    /// `any`: among every challenge; otherwise among the pending ones
    /// (as a client answers), so that sequences get somewhere.
    Trigger {
        challenge: usize,
        any: bool,
    },
    /// Settles one of the processing challenges.
    Validate {
        challenge: usize,
        ok: bool,
    },
    DeactivateAuthorization {
        authz: usize,
    },
    /// `any`: among every order; otherwise among the ready ones.
    Finalize {
        order: usize,
        csr: Csr,
        any: bool,
    },
    Revoke {
        cert: usize,
        by_owner: bool,
    },
    /// Time passes (hours), then every order is read as its client polls.
    Expire {
        hours: u64,
    },
    KeyChange {
        account: usize,
    },
    DeactivateAccount {
        account: usize,
    },
    OperatorDeactivateAccount {
        account: usize,
    },
    OperatorRevokeOrder {
        order: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let index = 0usize..64;
    prop_oneof![
        1 => Just(Op::NewAccount),
        4 => (index.clone(), prop::collection::vec(0..NAMES.len(), 1..=3), prop::bool::weighted(0.1))
            .prop_map(|(account, names, any)| Op::NewOrder { account, names, any }),
        6 => (index.clone(), prop::bool::weighted(0.1))
            .prop_map(|(challenge, any)| Op::Trigger { challenge, any }),
        6 => (index.clone(), prop::bool::weighted(0.8))
            .prop_map(|(challenge, ok)| Op::Validate { challenge, ok }),
        1 => index.clone().prop_map(|authz| Op::DeactivateAuthorization { authz }),
        6 => (index.clone(), prop::bool::weighted(0.1), prop_oneof![
                6 => Just(Csr::Exact),
                1 => Just(Csr::ExtraName),
                1 => Just(Csr::MissingName),
                1 => Just(Csr::AccountKey),
            ])
            .prop_map(|(order, any, csr)| Op::Finalize { order, csr, any }),
        1 => (index.clone(), any::<bool>())
            .prop_map(|(cert, by_owner)| Op::Revoke { cert, by_owner }),
        1 => prop_oneof![Just(1u64), Just(24 * 8), Just(24 * 31)]
            .prop_map(|hours| Op::Expire { hours }),
        1 => index.clone().prop_map(|account| Op::KeyChange { account }),
        1 => (index.clone(), any::<bool>()).prop_map(|(account, operator)| if operator {
            Op::OperatorDeactivateAccount { account }
        } else {
            Op::DeactivateAccount { account }
        }),
        1 => index.prop_map(|order| Op::OperatorRevokeOrder { order }),
    ]
}

/// An account as its client knows it: the row read when it was made or
/// rekeyed (the copy a request would be verified with), and its key.
struct Client {
    row: AccountRow,
    key: rcgen::KeyPair,
}

fn jwk_of(key: &rcgen::KeyPair) -> Jwk {
    // rcgen's raw public key of a P-256 pair is the uncompressed point.
    Jwk::from_ec_point(EcCurve::P256, key.public_key_raw()).expect("a P-256 point")
}

/// The statuses seen at the previous check, by id.
#[derive(Default)]
struct Seen {
    accounts: BTreeMap<String, AccountStatus>,
    orders: BTreeMap<String, OrderStatus>,
    authzs: BTreeMap<String, AuthorizationStatus>,
    challenges: BTreeMap<String, ChallengeStatus>,
    /// Each challenge's authorization.
    challenge_authz: BTreeMap<String, String>,
    /// Certificates by id: revoked or not.
    certificates: BTreeMap<String, bool>,
}

struct World {
    authority: Arc<Authority>,
    profile: Arc<Profile>,
    clock: Arc<ManualClock>,
    clients: Vec<Client>,
    orders: Vec<String>,
    /// Every authorization and challenge id seen, in the order first seen.
    authzs: Vec<String>,
    challenges: Vec<String>,
    certificates: Vec<String>,
    seen: Seen,
    /// Steps applied, and how many of them the authority refused.
    steps: usize,
    refused: usize,
    _dir: tempfile::TempDir,
}

fn pick<T>(items: &[T], i: usize) -> Option<&T> {
    (!items.is_empty()).then(|| &items[i % items.len()])
}

/// A refusal is an answer; a server error from a sequence any client may
/// send is a bug.
fn refused_cleanly<T>(
    refused: &mut usize,
    step: &Op,
    result: Result<T, AcmeError>,
) -> Result<Option<T>, TestCaseError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind == ProblemType::ServerInternal => Err(TestCaseError::fail(format!(
            "{step:?} failed inside the server: {} {:?}",
            e.detail, e.internal
        ))),
        Err(_) => {
            *refused += 1;
            Ok(None)
        }
    }
}

impl World {
    async fn new() -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let toml = format!(
            "data_dir = \"{}\"\nlisten = \"127.0.0.1:0\"\n[profiles.default]\nchallenges = [\"http-01\", \"dns-01\", \"tls-alpn-01\"]\n",
            dir.path().display()
        );
        let config = Config::from_toml(&toml).expect("configuration");
        let clock = Arc::new(ManualClock::starting_now());
        let assembled = crate::server::assemble(
            &config,
            Arc::clone(&clock) as crate::clock::SharedClock,
            "https://acme.example.test".to_owned(),
        )
        .await
        .expect("assembled");
        let authority = assembled.authority;
        let profile = Arc::clone(authority.profile("default").expect("default profile"));
        World {
            authority,
            profile,
            clock,
            clients: Vec::new(),
            orders: Vec::new(),
            authzs: Vec::new(),
            challenges: Vec::new(),
            certificates: Vec::new(),
            seen: Seen::default(),
            steps: 0,
            refused: 0,
            _dir: dir,
        }
    }

    async fn apply(&mut self, step: &Op) -> Result<(), TestCaseError> {
        let a = Arc::clone(&self.authority);
        let profile = Arc::clone(&self.profile);
        self.steps += 1;
        match step {
            Op::NewAccount => {
                let key = rcgen::KeyPair::generate().expect("key");
                let req = NewAccount::default();
                let made = a.new_account(&profile, &jwk_of(&key), &req, "").await;
                if let Some((row, _)) = refused_cleanly(&mut self.refused, step, made)? {
                    self.clients.push(Client { row, key });
                }
            }
            Op::NewOrder {
                account,
                names,
                any,
            } => {
                let live: Vec<&Client> = self
                    .clients
                    .iter()
                    .filter(|c| {
                        *any || self.seen.accounts.get(&c.row.id) == Some(&AccountStatus::Valid)
                    })
                    .collect();
                let Some(client) = pick(&live, *account) else {
                    return Ok(());
                };
                let req = NewOrder {
                    identifiers: names
                        .iter()
                        .map(|&i| RawIdentifier {
                            kind: NAMES[i].0.to_owned(),
                            value: NAMES[i].1.to_owned(),
                        })
                        .collect(),
                    not_before: None,
                    not_after: None,
                    profile: None,
                    replaces: None,
                };
                let made = a.new_order(&profile, &client.row, Ok(&req)).await;
                if let Some(order) = refused_cleanly(&mut self.refused, step, made)? {
                    self.orders.push(order.id);
                }
            }
            Op::Trigger { challenge, any } => {
                let seen = &self.seen;
                let pending: Vec<String> = self
                    .challenges
                    .iter()
                    .filter(|c| {
                        let authz = seen
                            .challenge_authz
                            .get(*c)
                            .and_then(|a| seen.authzs.get(a));
                        *any || (seen.challenges.get(*c) == Some(&ChallengeStatus::Pending)
                            && authz == Some(&AuthorizationStatus::Pending))
                    })
                    .cloned()
                    .collect();
                let Some(id) = pick(&pending, *challenge).cloned() else {
                    return Ok(());
                };
                let Some(client) = self.owner_of_challenge(&id).await else {
                    return Ok(());
                };
                let row = client.row.clone();
                refused_cleanly(
                    &mut self.refused,
                    step,
                    a.trigger_challenge(&profile, &row, &id).await,
                )?;
            }
            Op::Validate { challenge, ok } => {
                // As the validation job does once its validator answered.
                let processing = self.with_status(&self.challenges, &self.seen.challenges, |s| {
                    s == ChallengeStatus::Processing
                });
                let Some(id) = pick(&processing, *challenge) else {
                    return Ok(());
                };
                let ch = a.store.challenge(id).await.expect("read").expect("exists");
                if ch.status != ChallengeStatus::Processing {
                    return Ok(());
                }
                let result = if *ok {
                    Ok(())
                } else {
                    Err(Problem::new(ProblemType::Connection, "no answer"))
                };
                refused_cleanly(
                    &mut self.refused,
                    step,
                    a.settle(&profile, &ch, result, &[]).await,
                )?;
            }
            Op::DeactivateAuthorization { authz } => {
                let Some(id) = pick(&self.authzs, *authz).cloned() else {
                    return Ok(());
                };
                let Some(owner) = self.owner_of_authz(&id).await else {
                    return Ok(());
                };
                let row = owner.row.clone();
                refused_cleanly(
                    &mut self.refused,
                    step,
                    a.deactivate_authorization(&profile, &row, &id).await,
                )?;
            }
            Op::Finalize { order, csr, any } => {
                let ready = self.with_status(&self.orders, &self.seen.orders, |s| {
                    *any || s == OrderStatus::Ready
                });
                let Some(id) = pick(&ready, *order).cloned() else {
                    return Ok(());
                };
                let o = a.store.order(&id).await.expect("read").expect("exists");
                let Some(client) = self.clients.iter().find(|c| c.row.id == o.account_id) else {
                    return Ok(());
                };
                let mut names: Vec<String> =
                    o.identifiers.iter().map(|i| i.value.clone()).collect();
                match csr {
                    Csr::ExtraName => names.push("extra.example.test".into()),
                    Csr::MissingName if names.len() > 1 => {
                        names.pop();
                    }
                    _ => {}
                }
                let fresh;
                let key = match csr {
                    Csr::AccountKey => &client.key,
                    _ => {
                        fresh = rcgen::KeyPair::generate().expect("key");
                        &fresh
                    }
                };
                let mut params = rcgen::CertificateParams::new(names).expect("params");
                // As certbot and lego send it: the names in SANs only.
                params.distinguished_name = rcgen::DistinguishedName::new();
                let der = params.serialize_request(key).expect("CSR").der().to_vec();
                let row = client.row.clone();
                let done = a
                    .finalize(&profile, &row, &id, Ok(&der), &RequestContext::default())
                    .await;
                refused_cleanly(&mut self.refused, step, done)?;
            }
            Op::Revoke { cert, by_owner } => {
                let Some(id) = pick(&self.certificates, *cert) else {
                    return Ok(());
                };
                let c = a
                    .store
                    .certificate(id)
                    .await
                    .expect("read")
                    .expect("exists");
                let signer = if *by_owner {
                    self.clients.iter().find(|x| x.row.id == c.account_id)
                } else {
                    self.clients.iter().find(|x| x.row.id != c.account_id)
                };
                let Some(signer) = signer else {
                    return Ok(());
                };
                let der = leaf_der(&c.chain_pem).expect("a leaf");
                let row = signer.row.clone();
                let done = a
                    .revoke(
                        &profile,
                        RevocationSigner::Account(&row),
                        Ok(&der),
                        Some(4.into()),
                    )
                    .await;
                refused_cleanly(&mut self.refused, step, done)?;
            }
            Op::Expire { hours } => {
                self.clock.advance(Duration::from_secs(hours * 3600));
                for id in self.orders.clone() {
                    let o = a.store.order(&id).await.expect("read").expect("exists");
                    let Some(client) = self.clients.iter().find(|c| c.row.id == o.account_id)
                    else {
                        continue;
                    };
                    let row = client.row.clone();
                    refused_cleanly(&mut self.refused, step, a.order(&profile, &row, &id).await)?;
                }
            }
            Op::KeyChange { account } => {
                if self.clients.is_empty() {
                    return Ok(());
                }
                let i = account % self.clients.len();
                let new_key = rcgen::KeyPair::generate().expect("key");
                let old = jwk_of(&self.clients[i].key).to_value();
                let row = self.clients[i].row.clone();
                let changed = a
                    .change_key(&profile, &row, true, &old, &jwk_of(&new_key), |id| {
                        id.to_owned()
                    })
                    .await;
                if let Some(row) = refused_cleanly(&mut self.refused, step, changed)? {
                    self.clients[i] = Client { row, key: new_key };
                }
            }
            Op::DeactivateAccount { account } => {
                let Some(client) = pick(&self.clients, *account) else {
                    return Ok(());
                };
                // The front end lets only a valid account ask (§7.3.6).
                let row = a.store.account(&client.row.id).await.expect("read");
                if row.is_some_and(|r| r.status == AccountStatus::Valid) {
                    let id = client.row.id.clone();
                    refused_cleanly(
                        &mut self.refused,
                        step,
                        a.deactivate(&profile.name, &id, None).await,
                    )?;
                }
            }
            Op::OperatorDeactivateAccount { account } => {
                let Some(client) = pick(&self.clients, *account) else {
                    return Ok(());
                };
                let id = client.row.id.clone();
                let done = a.operator_deactivate_account(&id, "operator:props").await;
                refused_cleanly(&mut self.refused, step, done)?;
            }
            Op::OperatorRevokeOrder { order } => {
                let Some(id) = pick(&self.orders, *order).cloned() else {
                    return Ok(());
                };
                let done = a
                    .operator_revoke_order(&id, Some(5), "operator:props")
                    .await;
                refused_cleanly(&mut self.refused, step, done)?;
            }
        }
        Ok(())
    }

    /// The ids whose status at the last check passes `keep`.
    fn with_status<S: Copy>(
        &self,
        ids: &[String],
        seen: &BTreeMap<String, S>,
        keep: impl Fn(S) -> bool,
    ) -> Vec<String> {
        ids.iter()
            .filter(|id| seen.get(*id).is_some_and(|s| keep(*s)))
            .cloned()
            .collect()
    }

    async fn owner_of_challenge(&self, id: &str) -> Option<&Client> {
        let (_, authz) = self
            .authority
            .store
            .challenge_with_authorization(id)
            .await
            .expect("read")?;
        self.clients.iter().find(|c| c.row.id == authz.account_id)
    }

    async fn owner_of_authz(&self, id: &str) -> Option<&Client> {
        let (authz, _) = self
            .authority
            .store
            .authorization_with_challenges(id)
            .await
            .expect("read")?;
        self.clients.iter().find(|c| c.row.id == authz.account_id)
    }

    /// Reads back everything of the sequence and checks the invariants,
    /// then remembers what it saw for the next step's check.
    async fn check(&mut self, step: &Op) -> Result<(), TestCaseError> {
        let store = self.authority.store.clone();
        let now = self.authority.clock.unix();
        let fail = |what: String| TestCaseError::fail(format!("after {step:?}: {what}"));
        let mut next = Seen::default();

        let mut accounts = BTreeMap::new();
        for c in &self.clients {
            let row = store
                .account(&c.row.id)
                .await
                .expect("read")
                .expect("account");
            forward_account(self.seen.accounts.get(&row.id), row.status)
                .map_err(|e| fail(format!("account {}: {e}", row.id)))?;
            next.accounts.insert(row.id.clone(), row.status);
            accounts.insert(row.id.clone(), row);
        }

        // Orders first: they name the authorizations (new ones included).
        let mut orders = Vec::new();
        for id in &self.orders {
            let o = store.order(id).await.expect("read").expect("order");
            for a in &o.authorization_ids {
                if !self.authzs.contains(a) {
                    self.authzs.push(a.clone());
                }
            }
            orders.push(o);
        }
        let mut authzs = BTreeMap::new();
        for id in &self.authzs {
            let (authz, challenges) = store
                .authorization_with_challenges(id)
                .await
                .expect("read")
                .expect("authorization");
            forward_authz(self.seen.authzs.get(id), authz.status)
                .map_err(|e| fail(format!("authorization {id}: {e}")))?;
            next.authzs.insert(id.clone(), authz.status);
            for ch in &challenges {
                if !self.challenges.contains(&ch.id) {
                    self.challenges.push(ch.id.clone());
                }
                forward_challenge(self.seen.challenges.get(&ch.id), ch.status)
                    .map_err(|e| fail(format!("challenge {}: {e}", ch.id)))?;
                next.challenges.insert(ch.id.clone(), ch.status);
                next.challenge_authz.insert(ch.id.clone(), id.clone());
                // §7.1.6: a challenge that failed while its authorization
                // was pending made it invalid; one that passed, valid.
                if ch.status == ChallengeStatus::Invalid
                    && authz.status == AuthorizationStatus::Pending
                {
                    return Err(fail(format!(
                        "authorization {id} is pending with its challenge {} invalid",
                        ch.id
                    )));
                }
                if ch.status == ChallengeStatus::Valid
                    && matches!(
                        authz.status,
                        AuthorizationStatus::Pending | AuthorizationStatus::Invalid
                    )
                {
                    return Err(fail(format!(
                        "authorization {id} is {} with its challenge {} valid",
                        authz.status, ch.id
                    )));
                }
            }
            let proven = challenges
                .iter()
                .any(|c| c.status == ChallengeStatus::Valid);
            if authz.status == AuthorizationStatus::Valid && !proven {
                return Err(fail(format!(
                    "authorization {id} is valid without a valid challenge"
                )));
            }
            authzs.insert(id.clone(), authz);
        }

        for o in &orders {
            forward_order(self.seen.orders.get(&o.id), o.status)
                .map_err(|e| fail(format!("order {}: {e}", o.id)))?;
            next.orders.insert(o.id.clone(), o.status);
            let statuses: Vec<AuthorizationStatus> = o
                .authorization_ids
                .iter()
                .map(|a| authzs[a].status)
                .collect();
            match o.status {
                OrderStatus::Pending
                    if statuses.iter().any(|s| {
                        !matches!(s, AuthorizationStatus::Pending | AuthorizationStatus::Valid)
                    }) =>
                {
                    return Err(fail(format!(
                        "order {} is pending with authorizations {statuses:?}",
                        o.id
                    )));
                }
                OrderStatus::Ready if statuses.iter().any(|s| *s != AuthorizationStatus::Valid) => {
                    return Err(fail(format!(
                        "order {} is ready with authorizations {statuses:?}",
                        o.id
                    )));
                }
                _ => {}
            }
            let account = &accounts[&o.account_id];
            if account.status != AccountStatus::Valid
                && matches!(o.status, OrderStatus::Pending | OrderStatus::Ready)
            {
                return Err(fail(format!(
                    "order {} is {} of the {} account {}",
                    o.id, o.status, account.status, account.id
                )));
            }
            match (&o.certificate_id, o.status) {
                (None, OrderStatus::Valid) => {
                    return Err(fail(format!(
                        "order {} is valid without a certificate",
                        o.id
                    )));
                }
                (Some(c), s) if s != OrderStatus::Valid => {
                    return Err(fail(format!("order {} is {s} with certificate {c}", o.id)));
                }
                (Some(c), _) => {
                    let cert = store.certificate(c).await.expect("read").ok_or_else(|| {
                        fail(format!("order {} names certificate {c}, not stored", o.id))
                    })?;
                    let first_seen = !self.seen.certificates.contains_key(c);
                    if first_seen {
                        self.certificates.push(c.clone());
                        self.check_new_certificate(o, &cert, &authzs, now)
                            .map_err(fail)?;
                    }
                    let revoked = cert.revoked_at.is_some();
                    if self.seen.certificates.get(c) == Some(&true) && !revoked {
                        return Err(fail(format!("certificate {c} is no longer revoked")));
                    }
                    next.certificates.insert(c.clone(), revoked);
                }
                (None, _) => {}
            }
        }

        // §7.3.6: a deactivated account's authorizations are deactivated.
        for authz in authzs.values() {
            let account = &accounts[&authz.account_id];
            if account.status != AccountStatus::Valid
                && matches!(
                    authz.status,
                    AuthorizationStatus::Pending | AuthorizationStatus::Valid
                )
            {
                return Err(fail(format!(
                    "authorization {} is {} of the {} account {}",
                    authz.id, authz.status, account.status, account.id
                )));
            }
        }
        self.seen = next;
        Ok(())
    }

    /// A certificate that appeared in this step: for its order's account,
    /// still valid before the step, naming exactly the order's identifiers,
    /// each proven by an authorization valid before the step and unexpired.
    fn check_new_certificate(
        &self,
        order: &acme_proxy_store::OrderRow,
        cert: &CertificateRow,
        authzs: &BTreeMap<String, acme_proxy_store::AuthorizationRow>,
        now: i64,
    ) -> Result<(), String> {
        if cert.order_id != order.id || cert.account_id != order.account_id {
            return Err(format!("certificate {} is not its order's", cert.id));
        }
        if self.seen.accounts.get(&order.account_id) != Some(&AccountStatus::Valid) {
            return Err(format!(
                "certificate {} issued to account {} that was not valid",
                cert.id, order.account_id
            ));
        }
        for id in &order.authorization_ids {
            let before = self.seen.authzs.get(id);
            if before != Some(&AuthorizationStatus::Valid) || authzs[id].expires_at <= now {
                return Err(format!(
                    "certificate {} issued with authorization {id} {before:?} (expires {}, now {now})",
                    cert.id, authzs[id].expires_at
                ));
            }
        }
        let der = leaf_der(&cert.chain_pem).ok_or("no leaf in the chain")?;
        let (_, leaf) = X509Certificate::from_der(&der).map_err(|e| e.to_string())?;
        let mut named = BTreeSet::new();
        if let Ok(Some(san)) = leaf.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(d) => {
                        named.insert(d.to_string());
                    }
                    GeneralName::IPAddress(ip) => {
                        let ip: [u8; 4] = (*ip).try_into().map_err(|_| "not IPv4")?;
                        named.insert(std::net::Ipv4Addr::from(ip).to_string());
                    }
                    other => return Err(format!("unexpected SAN {other:?}")),
                }
            }
        }
        let ordered: BTreeSet<String> = order.identifiers.iter().map(|i| i.value.clone()).collect();
        if named != ordered {
            return Err(format!(
                "certificate {} names {named:?}, its order {ordered:?}",
                cert.id
            ));
        }
        Ok(())
    }
}

/// §7.1.6's account diagram: valid → deactivated | revoked.
fn forward_account(before: Option<&AccountStatus>, now: AccountStatus) -> Result<(), String> {
    use AccountStatus::*;
    match (before, now) {
        (None, Valid) => Ok(()),
        (Some(b), n) if *b == n => Ok(()),
        (Some(Valid), Deactivated | Revoked) => Ok(()),
        (b, n) => Err(format!("went from {b:?} to {n}")),
    }
}

/// §7.1.6's order diagram. ready → valid is one transaction when the
/// embedded CA signs inline (processing is never seen).
fn forward_order(before: Option<&OrderStatus>, now: OrderStatus) -> Result<(), String> {
    use OrderStatus::*;
    match (before, now) {
        (None, Pending | Ready) => Ok(()),
        (Some(b), n) if *b == n => Ok(()),
        (Some(Pending), Ready | Invalid) => Ok(()),
        (Some(Ready), Processing | Valid | Invalid) => Ok(()),
        (Some(Processing), Valid | Invalid) => Ok(()),
        (b, n) => Err(format!("went from {b:?} to {n}")),
    }
}

/// §7.1.6's authorization diagram. A reused authorization is first seen
/// valid.
fn forward_authz(
    before: Option<&AuthorizationStatus>,
    now: AuthorizationStatus,
) -> Result<(), String> {
    use AuthorizationStatus::*;
    match (before, now) {
        (None, Pending | Valid) => Ok(()),
        (Some(b), n) if *b == n => Ok(()),
        (Some(Pending), Valid | Invalid | Deactivated | Expired | Revoked) => Ok(()),
        (Some(Valid), Deactivated | Expired | Revoked) => Ok(()),
        (b, n) => Err(format!("went from {b:?} to {n}")),
    }
}

/// §7.1.6's challenge diagram.
fn forward_challenge(before: Option<&ChallengeStatus>, now: ChallengeStatus) -> Result<(), String> {
    use ChallengeStatus::*;
    match (before, now) {
        (None, Pending | Valid) => Ok(()),
        (Some(b), n) if *b == n => Ok(()),
        (Some(Pending), Processing | Valid | Invalid) => Ok(()),
        (Some(Processing), Valid | Invalid) => Ok(()),
        (b, n) => Err(format!("went from {b:?} to {n}")),
    }
}

/// What the sequences reached, summed over a run: a run that never
/// issued, revoked or expired anything checked nothing about those.
#[derive(Debug, Default)]
struct Reached {
    steps: usize,
    /// Steps the authority refused (a clean problem).
    refused: usize,
    orders: BTreeMap<String, usize>,
    authorizations: BTreeMap<String, usize>,
    challenges: BTreeMap<String, usize>,
    certificates: usize,
    revoked: usize,
    deactivated_accounts: usize,
}

impl Reached {
    fn add(&mut self, world: &World) {
        for s in world.seen.orders.values() {
            *self.orders.entry(s.to_string()).or_default() += 1;
        }
        for s in world.seen.authzs.values() {
            *self.authorizations.entry(s.to_string()).or_default() += 1;
        }
        for s in world.seen.challenges.values() {
            *self.challenges.entry(s.to_string()).or_default() += 1;
        }
        self.certificates += world.seen.certificates.len();
        self.revoked += world.seen.certificates.values().filter(|r| **r).count();
        self.deactivated_accounts += world
            .seen
            .accounts
            .values()
            .filter(|s| **s == AccountStatus::Deactivated)
            .count();
        self.steps += world.steps;
        self.refused += world.refused;
    }
}

/// How many sequences: `PROPTEST_CASES` overrides.
const CASES: u32 = 2000;

/// Runs one sequence on a fresh database; the first broken invariant ends it.
fn run(ops: &[Op], reached: &std::sync::Mutex<Reached>) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut world = World::new().await;
        let mut outcome = Ok(());
        for step in ops {
            outcome = world.apply(step).await;
            if outcome.is_ok() {
                outcome = world.check(step).await;
            }
            if outcome.is_err() {
                break;
            }
        }
        world.authority.close().await;
        if let Ok(mut r) = reached.lock() {
            r.add(&world);
        }
        outcome
    })
}

#[test]
fn every_sequence_of_client_and_operator_operations_keeps_the_state_machine_invariants() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        // Each shrink step replays a sequence against a fresh database.
        max_shrink_iters: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let reached = std::sync::Mutex::new(Reached::default());
    let result = runner.run(&prop::collection::vec(op(), 1..60), |ops| {
        run(&ops, &reached)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let reached = reached.into_inner().expect("not poisoned");
    eprintln!("{reached:#?}");
    // The sequences reached every status worth checking.
    for status in ["pending", "ready", "valid", "invalid"] {
        assert!(
            reached.orders.contains_key(status),
            "no order {status}: {reached:#?}"
        );
    }
    for status in ["pending", "valid", "invalid", "deactivated", "expired"] {
        assert!(
            reached.authorizations.contains_key(status),
            "no authorization {status}: {reached:#?}"
        );
    }
    for status in ["pending", "processing", "valid", "invalid"] {
        assert!(
            reached.challenges.contains_key(status),
            "no challenge {status}: {reached:#?}"
        );
    }
    assert!(
        reached.certificates > 0 && reached.revoked > 0,
        "{reached:#?}"
    );
    assert!(reached.deactivated_accounts > 0, "{reached:#?}");
}
