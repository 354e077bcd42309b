//! Logging in and out: the password (argon2id, throttled before it is
//! hashed), sessions, and the cookie.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acme_proxy_store::{AuditEvent, AuditOutcome, NewAuditRow, NewOperatorSession, SessionStage};
use axum::Extension;
use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Deserialize;

use super::{Console, SESSION_COOKIE, Session};
use crate::api::forwarded::{Forwarding, client_key};
use crate::passwords::Checked;

/// Wrong passwords allowed per name and per address within [`WINDOW_MS`];
/// the next attempt is refused before any hash is computed.
pub const FAILURES_ALLOWED: usize = 5;
const WINDOW_MS: i64 = 60_000;
/// Names and addresses remembered at most: past this, the oldest are
/// forgotten first (a flood of made-up names cannot grow memory).
const MAX_KEYS: usize = 65_536;
/// Recovery codes made at enrolment.
const RECOVERY_CODES: usize = 10;
/// How long a login waits for a hashing slot before it is answered 503.
const HASHING_WAIT: Duration = Duration::from_secs(10);

/// Recent failed logins per name and per client address, in this
/// process (each replica counts its own).
#[derive(Default)]
pub struct Throttle {
    failures: Mutex<HashMap<String, VecDeque<i64>>>,
}

impl Throttle {
    /// Takes an attempt for `keys` at `now_ms`: refused, with the seconds
    /// until it may be tried again, when one of the keys is over its
    /// allowance; else counted at once, as a failure until
    /// [`Throttle::refund`] takes it back. Counted before the password is
    /// hashed, not after: attempts racing each other (a burst queued for
    /// the hashing slots) cannot all pass the check before the first
    /// failure is counted.
    fn attempt(&self, keys: &[String], now_ms: i64) -> Result<(), i64> {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let wait = keys
            .iter()
            .filter_map(|key| {
                let times = failures.get_mut(key)?;
                while times.front().is_some_and(|t| now_ms - t >= WINDOW_MS) {
                    times.pop_front();
                }
                (times.len() >= FAILURES_ALLOWED).then(|| {
                    times
                        .front()
                        .map_or(1, |t| (t + WINDOW_MS - now_ms + 999) / 1000)
                })
            })
            .max();
        if let Some(wait) = wait {
            return Err(wait);
        }
        if failures.len() + keys.len() > MAX_KEYS {
            failures.retain(|_, times| times.back().is_some_and(|t| now_ms - t < WINDOW_MS));
            while failures.len() + keys.len() > MAX_KEYS {
                let Some(oldest) = failures
                    .iter()
                    .min_by_key(|(_, times)| times.back().copied().unwrap_or(i64::MIN))
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                failures.remove(&oldest);
            }
        }
        for key in keys {
            let times = failures.entry(key.clone()).or_default();
            times.push_back(now_ms);
            while times.len() > FAILURES_ALLOWED {
                times.pop_front();
            }
        }
        Ok(())
    }

    /// Takes back the attempt counted at `at_ms` for each of `keys`: it
    /// succeeded, or failed for a reason that is not the client's (the
    /// database, the hashing slots).
    fn refund(&self, keys: &[String], at_ms: i64) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        for key in keys {
            if let Some(times) = failures.get_mut(key)
                && let Some(at) = times.iter().rposition(|t| *t == at_ms)
            {
                times.remove(at);
            }
        }
    }

    fn forget(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The digest a session token is stored as.
pub fn token_hash(token: &str) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
        .as_ref()
        .to_vec()
}

/// The first value of `name` in an `application/x-www-form-urlencoded`
/// body.
pub fn form_field(body: &[u8], name: &str) -> Option<String> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

fn session_cookie(token: &str) -> HeaderValue {
    // No Max-Age: the browser forgets it when it closes; the server ends
    // it sooner (idle and absolute lifetimes).
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={token}; Path=/; Secure; HttpOnly; SameSite=Strict"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn cleared_cookie() -> HeaderValue {
    HeaderValue::from_static(
        "__Host-acme-proxy-session=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0",
    )
}

/// Who is logging in: the peer, or behind a reverse proxy of
/// `[admin] trusted_proxies` the client it forwarded for, so that logins
/// through one proxy are neither audited as the proxy nor throttled
/// together. Not the ACME listener's `trusted_proxies`: a host trusted to
/// forward ACME requests could otherwise name a new client on each guess.
fn client_of(console: &Console, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
    let header = console.generations.current().config.forwarded_header;
    Forwarding::new(console.settings.trusted_proxies.clone(), header).client_ip(peer.ip(), headers)
}

/// What a login attempt is throttled under: the name tried, and the
/// client it came from — an IPv4 address, or an IPv6 /64, so that a host
/// holding a /64 does not get a fresh allowance from each of its
/// addresses.
fn throttle_keys(name: &str, client: IpAddr) -> [String; 2] {
    [
        format!("name:{name}"),
        format!("address:{}", client_key(client)),
    ]
}

/// An `operator.login` audit row.
fn login_row<'a>(
    at: i64,
    outcome: AuditOutcome,
    actor: &'a str,
    client_ip: &'a str,
    user_agent: Option<&'a str>,
    detail: &'a str,
) -> NewAuditRow<'a> {
    let mut row = NewAuditRow::new(at, AuditEvent::OperatorLogin, outcome, actor);
    row.client_ip = Some(client_ip);
    row.user_agent = user_agent;
    row.detail = Some(detail);
    row
}

fn count_login(authority: &crate::authority::Authority, outcome: &str) {
    authority
        .metrics
        .admin_logins
        .get_or_create(&vec![("outcome", outcome.to_owned())])
        .inc();
}

fn user_agent_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(|ua| crate::bounded::truncate(ua, crate::bounded::USER_AGENT_OCTETS).into_owned())
}

/// A recovery code's digest as stored: lower case, without the dash or
/// spaces it may be typed with.
fn recovery_hash(code: &str) -> Vec<u8> {
    let normal: String = code
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    token_hash(&normal)
}

pub async fn login_page(
    State(console): State<Arc<Console>>,
    session: Option<Extension<Session>>,
) -> Response {
    match session.as_ref().map(|s| s.stage) {
        Some(SessionStage::Full) => return super::see_other("/"),
        Some(SessionStage::Enrol) => return super::see_other("/account/totp"),
        Some(SessionStage::Totp) => {
            return console.page(
                StatusCode::OK,
                "login_totp.html",
                session.as_deref(),
                minijinja::context! { error => None::<String> },
            );
        }
        None => {}
    }
    console.page(
        StatusCode::OK,
        "login.html",
        None,
        minijinja::context! { error => None::<String> },
    )
}

#[derive(Deserialize)]
pub struct LoginForm {
    username: String,
    password: String,
}

pub async fn login(
    State(console): State<Arc<Console>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<LoginForm>,
) -> Response {
    let authority = console.generations.authority();
    let clock = &authority.clock;
    let now_ms = clock.unix_ms();
    let name = crate::bounded::truncate(form.username.trim(), 64).into_owned();
    let known_shape = crate::admin::operators::check_name(&name).is_ok();
    let actor = if known_shape {
        format!("operator:{name}")
    } else {
        "anonymous".to_owned()
    };
    let client = client_of(&console, peer, &headers);
    let client_ip = client.to_string();
    let user_agent = user_agent_of(&headers);
    let audit = |outcome, detail| {
        login_row(
            clock.unix(),
            outcome,
            &actor,
            &client_ip,
            user_agent.as_deref(),
            detail,
        )
    };
    let logins = |outcome: &str| count_login(&authority, outcome);
    let keys = throttle_keys(&name, client);
    if let Err(wait) = console.throttle.attempt(&keys, now_ms) {
        logins("throttled");
        authority
            .audit_row(&audit(
                AuditOutcome::Refused,
                &format!("throttled: {FAILURES_ALLOWED} wrong passwords within a minute"),
            ))
            .await;
        let mut response = console.page(
            StatusCode::TOO_MANY_REQUESTS,
            "login.html",
            None,
            minijinja::context! { error => format!("Too many wrong passwords: try again in {wait} s.") },
        );
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_str(&wait.to_string()).unwrap_or(HeaderValue::from_static("60")),
        );
        return response;
    }
    // Not the client's failure: its attempt is not counted.
    let unavailable = |why: &dyn std::fmt::Display| {
        console.throttle.refund(&keys, now_ms);
        console.unavailable(why)
    };
    let store = authority.store();
    let operator = if known_shape {
        match store.operator(&name).await {
            Ok(found) => found,
            Err(e) => return unavailable(&e),
        }
    } else {
        None
    };
    // An unknown or disabled name is checked against a hash all the same:
    // the answer's time must not tell which names exist.
    let usable = operator.filter(|o| o.disabled_at.is_none());
    let stored = usable
        .as_ref()
        .map_or_else(|| console.unknown_hash.clone(), |o| o.password_hash.clone());
    let slot = match tokio::time::timeout(
        HASHING_WAIT,
        Arc::clone(&console.hashing).acquire_owned(),
    )
    .await
    {
        Ok(Ok(slot)) => slot,
        _ => return unavailable(&"no password hashing slot within 10 s"),
    };
    let checked = crate::passwords::check(form.password.clone(), stored, Some(slot)).await;
    let checked = match checked {
        Ok(checked) => checked,
        Err(e) => return unavailable(&e),
    };
    // Refused, audited with `why`; the client hears only that the name or
    // password is wrong.
    let (authority_ref, console_ref) = (&authority, &console);
    let wrong = |why: &'static str| {
        logins("refused");
        let row = audit(AuditOutcome::Refused, why);
        async move {
            authority_ref.audit_row(&row).await;
            console_ref.page(
                StatusCode::FORBIDDEN,
                "login.html",
                None,
                minijinja::context! { error => "Wrong name or password." },
            )
        }
    };
    // A wrong password's attempt stays counted.
    let Some(operator) = usable.filter(|_| checked != Checked::Wrong) else {
        return wrong("wrong name or password").await;
    };
    console.throttle.refund(&keys, now_ms);
    let stage = if operator.totp_secret.is_some() {
        SessionStage::Totp
    } else if console.settings.require_totp {
        SessionStage::Enrol
    } else {
        SessionStage::Full
    };
    let token = crate::ids::session_token();
    let hash = token_hash(&token);
    let id = crate::ids::session_id();
    let csrf = crate::ids::csrf_token();
    let detail = format!(
        "session {id}{}",
        match stage {
            SessionStage::Full => "",
            SessionStage::Totp => "; the TOTP code is due",
            SessionStage::Enrol => "; TOTP enrolment is due",
        }
    );
    let row = audit(AuditOutcome::Success, &detail);
    let created = store
        .insert_operator_session(
            &NewOperatorSession {
                token_hash: &hash,
                id: &id,
                operator: &operator.name,
                password_hash: &operator.password_hash,
                csrf_token: &csrf,
                stage,
                now: clock.unix(),
                client_ip: Some(&client_ip),
                user_agent: user_agent.as_deref(),
            },
            &row,
        )
        .await;
    match created {
        Ok(true) => {}
        // The password was changed, or the operator disabled, while this
        // login was being checked: the password it proved is no longer
        // the operator's.
        Ok(false) => {
            return wrong("the password changed or the operator was disabled during the login")
                .await;
        }
        Err(e) => return console.unavailable(&e),
    }
    authority.metrics.audited(&row);
    // The name's earlier failures go only with a whole login made: wrong
    // TOTP codes count on the name too, and the password alone must not
    // wipe them.
    if stage == SessionStage::Full {
        console.throttle.forget(&keys[0]);
    }
    // After the session, which is made only while the hash it was checked
    // against is still the stored one.
    if checked == Checked::RightOutdated {
        upgrade_hash(
            &console,
            &operator.name,
            &operator.password_hash,
            form.password,
        )
        .await;
    }
    logins("success");
    let mut response = super::see_other(if stage == SessionStage::Full {
        "/"
    } else {
        "/login"
    });
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie(&token));
    response
}

/// Stores the password's hash made with today's parameters: a login is
/// the only time the password is known. A failure leaves the old hash,
/// which still verifies.
async fn upgrade_hash(console: &Console, name: &str, old: &str, password: String) {
    let authority = console.generations.authority();
    let Ok(slot) = Arc::clone(&console.hashing).acquire_owned().await else {
        return;
    };
    let upgraded = match crate::passwords::hash(password, Some(slot)).await {
        Ok(new) => authority
            .store()
            .upgrade_operator_hash(name, old, &new)
            .await
            .map_err(anyhow::Error::from),
        Err(e) => Err(e),
    };
    match upgraded {
        Ok(_) => {
            tracing::info!(event = "admin.password_rehashed", outcome = "success", operator = %name, "an operator's password hash was upgraded to today's parameters")
        }
        Err(e) => {
            tracing::warn!(event = "admin.password_rehashed", outcome = "failure", operator = %name, error = %e, "an operator's password hash could not be upgraded")
        }
    }
}

#[derive(Deserialize)]
pub struct CodeForm {
    #[serde(default)]
    code: String,
    #[serde(default)]
    recovery_code: String,
}

/// The second step of a login: a TOTP code (each taken once) or one of
/// the recovery codes; throttled like passwords.
pub async fn login_totp(
    State(console): State<Arc<Console>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Extension(session): Extension<Session>,
    axum::Form(form): axum::Form<CodeForm>,
) -> Response {
    let authority = console.generations.authority();
    let clock = &authority.clock;
    let store = authority.store();
    let actor = session.actor();
    let client = client_of(&console, peer, &headers);
    let client_ip = client.to_string();
    let user_agent = user_agent_of(&headers);
    let row = |outcome, detail| {
        login_row(
            clock.unix(),
            outcome,
            &actor,
            &client_ip,
            user_agent.as_deref(),
            detail,
        )
    };
    let again = |status: StatusCode, error: String| {
        console.page(
            status,
            "login_totp.html",
            Some(&session),
            minijinja::context! { error },
        )
    };
    let keys = throttle_keys(&session.operator, client);
    let now_ms = clock.unix_ms();
    if let Err(wait) = console.throttle.attempt(&keys, now_ms) {
        count_login(&authority, "throttled");
        authority
            .audit_row(&row(
                AuditOutcome::Refused,
                "throttled: too many wrong codes within a minute",
            ))
            .await;
        return again(
            StatusCode::TOO_MANY_REQUESTS,
            format!("Too many wrong codes: try again in {wait} s."),
        );
    }
    // Not a guess: the attempt is not counted.
    let refund = || console.throttle.refund(&keys, now_ms);
    let operator = match store.operator(&session.operator).await {
        Ok(Some(operator)) => operator,
        Ok(None) => {
            refund();
            return super::see_other("/login");
        }
        Err(e) => {
            refund();
            return console.unavailable(&e);
        }
    };
    let Some(secret) = operator.totp_secret else {
        refund();
        return super::see_other("/login");
    };
    let now = clock.unix();
    let accepted = if !form.recovery_code.trim().is_empty() {
        let left = match store.unused_recovery_codes(&operator.name).await {
            Ok(n) => n.saturating_sub(1),
            Err(e) => {
                refund();
                return console.unavailable(&e);
            }
        };
        let detail = format!("session {}: a recovery code used, {left} left", session.id);
        let row = login_row(
            now,
            AuditOutcome::Success,
            &actor,
            &client_ip,
            user_agent.as_deref(),
            &detail,
        );
        store
            .use_operator_recovery_code(
                &session.token_hash,
                &recovery_hash(&form.recovery_code),
                now,
                &row,
            )
            .await
            .map(|used| used.then(|| authority.metrics.audited(&row)))
    } else if let Some(step) =
        crate::totp::matching_step(&secret, &form.code, now, operator.totp_last_step)
    {
        let detail = format!("session {}: TOTP code", session.id);
        let row = login_row(
            now,
            AuditOutcome::Success,
            &actor,
            &client_ip,
            user_agent.as_deref(),
            &detail,
        );
        store
            .accept_operator_totp(&session.token_hash, step, &row)
            .await
            .map(|taken| taken.then(|| authority.metrics.audited(&row)))
    } else {
        Ok(None)
    };
    match accepted {
        Ok(Some(())) => {
            refund();
            console.throttle.forget(&keys[0]);
            count_login(&authority, "success");
            super::see_other("/")
        }
        // The attempt stays counted.
        Ok(None) => {
            count_login(&authority, "refused");
            authority
                .audit_row(&row(
                    AuditOutcome::Refused,
                    "a wrong, used or expired TOTP or recovery code",
                ))
                .await;
            again(
                StatusCode::FORBIDDEN,
                "That code is wrong, was used already, or has expired.".to_owned(),
            )
        }
        Err(e) => {
            refund();
            console.unavailable(&e)
        }
    }
}

/// Enrolling an authenticator: the secret as a QR code and as text; or,
/// once enrolled, how many recovery codes are left.
pub async fn totp_page(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Response {
    let authority = console.generations.authority();
    let store = authority.store();
    let operator = match store.operator(&session.operator).await {
        Ok(Some(operator)) => operator,
        Ok(None) => return super::see_other("/login"),
        Err(e) => return console.unavailable(&e),
    };
    if operator.totp_secret.is_some() && session.stage == SessionStage::Full {
        let left = match store.unused_recovery_codes(&operator.name).await {
            Ok(n) => n,
            Err(e) => return console.unavailable(&e),
        };
        return console.page(
            StatusCode::OK,
            "totp.html",
            Some(&session),
            minijinja::context! { state => "enrolled", left },
        );
    }
    let secret = match &session.pending_totp {
        Some(secret) => secret.clone(),
        None => {
            let secret = crate::totp::new_secret().to_vec();
            match store
                .set_operator_session_pending_totp(&session.token_hash, &secret)
                .await
            {
                Ok(_) => secret,
                Err(e) => return console.unavailable(&e),
            }
        }
    };
    enrol_page(&console, &session, &secret, StatusCode::OK, None)
}

fn enrol_page(
    console: &Console,
    session: &Session,
    secret: &[u8],
    status: StatusCode,
    error: Option<&str>,
) -> Response {
    use base64::Engine;
    let uri = crate::totp::otpauth_uri("acme-proxy", &session.operator, secret);
    let qr = match crate::totp::qr_svg(&uri) {
        Ok(svg) => format!(
            "data:image/svg+xml;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(svg)
        ),
        Err(e) => return console.unavailable(&e),
    };
    console.page(
        status,
        "totp.html",
        Some(session),
        minijinja::context! {
            state => "enrol",
            qr,
            secret => crate::totp::base32(secret),
            uri,
            error,
        },
    )
}

/// Confirms enrolment with a code from the new secret; the recovery
/// codes are shown once, on the answer.
pub async fn enrol_totp(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    axum::Form(form): axum::Form<CodeForm>,
) -> Response {
    let Some(secret) = session.pending_totp.clone() else {
        return super::see_other("/account/totp");
    };
    let authority = console.generations.authority();
    let now = authority.clock.unix();
    let Some(step) = crate::totp::matching_step(&secret, &form.code, now, None) else {
        return enrol_page(
            &console,
            &session,
            &secret,
            StatusCode::FORBIDDEN,
            Some(
                "That code is not the authenticator's current one; check the phone's clock and try the next code.",
            ),
        );
    };
    let codes: Vec<String> = (0..RECOVERY_CODES)
        .map(|_| crate::ids::recovery_code())
        .collect();
    let hashes: Vec<Vec<u8>> = codes.iter().map(|c| recovery_hash(c)).collect();
    let actor = session.actor();
    let detail = format!(
        "operator {}: TOTP enrolled with {RECOVERY_CODES} recovery codes; their other sessions ended",
        session.operator
    );
    let mut row = NewAuditRow::new(
        now,
        AuditEvent::OperatorChanged,
        AuditOutcome::Success,
        &actor,
    );
    row.detail = Some(&detail);
    match authority
        .store()
        .enrol_operator_totp(&session.token_hash, &secret, step, &hashes, &row)
        .await
    {
        Ok(true) => authority.metrics.audited(&row),
        Ok(false) => return super::see_other("/login"),
        Err(e) => return console.unavailable(&e),
    }
    console.page(
        StatusCode::OK,
        "totp.html",
        Some(&session),
        minijinja::context! { state => "done", codes },
    )
}

pub async fn logout(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Response {
    let authority = console.generations.authority();
    let actor = session.actor();
    let detail = format!("session {}", session.id);
    let mut row = NewAuditRow::new(
        authority.clock.unix(),
        AuditEvent::OperatorLogout,
        AuditOutcome::Success,
        &actor,
    );
    row.detail = Some(&detail);
    match authority
        .store()
        .end_operator_session(&session.token_hash, Some(&row))
        .await
    {
        Ok(true) => authority.metrics.audited(&row),
        Ok(false) => {}
        Err(e) => return console.unavailable(&e),
    }
    let mut response = super::see_other("/login");
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cleared_cookie());
    response.into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::throttle_keys;

    #[test]
    fn logins_are_throttled_per_name_and_per_client_network() {
        let keys = |client: &str| throttle_keys("alice", client.parse().unwrap());
        assert_eq!(keys("2001:db8:1:2::1"), keys("2001:db8:1:2:ffff::9"));
        assert_ne!(keys("2001:db8:1:2::1")[1], keys("2001:db8:1:3::1")[1]);
        assert_eq!(keys("192.0.2.7"), keys("::ffff:192.0.2.7"));
        assert_ne!(keys("192.0.2.7")[1], keys("192.0.2.8")[1]);
        assert_eq!(keys("192.0.2.7")[0], "name:alice");
    }
}
