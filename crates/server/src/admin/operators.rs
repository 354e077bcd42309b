//! The operation layer's web console users ("operators") and their
//! sessions: what `acme-proxy admin user|session` and the console itself
//! do, each change audited with the acting operator.

use acme_proxy_store::{
    AuditEvent, AuditOutcome, NewAuditRow, OperatorRow, OperatorSessionRow, Store,
};
use serde::Serialize;

use super::ops::OpsError;
use crate::clock::rfc3339;

/// A password shorter than this is refused (NIST SP 800-63B asks for at
/// least 8; an operator of a CA is held to more).
pub const MIN_PASSWORD_CHARS: usize = 12;
/// Longer is refused before hashing: argon2 takes any length, but nobody
/// types this much and a bound keeps every input bounded.
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// An operator as the CLI and the console show one (never its hash or
/// TOTP secret).
#[derive(Debug, Clone, Serialize)]
pub struct OperatorView {
    pub name: String,
    /// `active` or `disabled`.
    pub status: &'static str,
    pub totp: bool,
    pub sessions: usize,
    pub created_at: String,
    pub password_changed_at: String,
    pub disabled_at: Option<String>,
}

/// A session as the CLI shows one (never its tokens).
#[derive(Debug, Clone, Serialize)]
pub struct SessionView {
    pub id: String,
    pub operator: String,
    /// `full`, or how far its login has come (`totp`, `enrol`).
    pub stage: String,
    pub created_at: String,
    pub last_seen_at: String,
    pub client_ip: Option<String>,
    pub user_agent: Option<String>,
}

impl From<OperatorSessionRow> for SessionView {
    fn from(s: OperatorSessionRow) -> Self {
        Self {
            id: s.id,
            operator: s.operator,
            stage: s.stage.as_str().to_owned(),
            created_at: rfc3339(s.created_at),
            last_seen_at: rfc3339(s.last_seen_at),
            client_ip: s.client_ip,
            user_agent: s.user_agent,
        }
    }
}

fn view(row: OperatorRow, sessions: usize) -> OperatorView {
    OperatorView {
        status: if row.disabled_at.is_some() {
            "disabled"
        } else {
            "active"
        },
        totp: row.totp_secret.is_some(),
        sessions,
        created_at: rfc3339(row.created_at),
        password_changed_at: rfc3339(row.password_changed_at),
        disabled_at: row.disabled_at.map(rfc3339),
        name: row.name,
    }
}

/// An operator's name: 1 to 64 of `a-z 0-9 . _ -`, starting with a letter
/// or digit (it becomes `operator:NAME` in the audit trail).
pub fn check_name(name: &str) -> Result<(), OpsError> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(OpsError::Refused(format!(
            "{name:?} is not an operator name: use 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit (e.g. alice)"
        )))
    }
}

/// Refuses a password too short or too long to be one.
pub fn check_password(password: &str) -> Result<(), OpsError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(OpsError::Refused(format!(
            "the password has {} characters; an operator's password needs at least {MIN_PASSWORD_CHARS}",
            password.chars().count()
        )));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(OpsError::Refused(format!(
            "the password is longer than {MAX_PASSWORD_BYTES} bytes"
        )));
    }
    Ok(())
}

fn audit_row<'a>(now: i64, event: AuditEvent, actor: &'a str, detail: &'a str) -> NewAuditRow<'a> {
    let mut row = NewAuditRow::new(now, event, AuditOutcome::Success, actor);
    row.detail = Some(detail);
    row
}

async fn hashed(password: &str) -> Result<String, OpsError> {
    crate::passwords::hash(password.to_owned(), None)
        .await
        .map_err(|e| OpsError::Refused(e.to_string()))
}

fn no_such(name: &str) -> OpsError {
    OpsError::NotFound(format!("no operator named {name:?}"))
}

pub async fn create_operator(
    store: &Store,
    now: i64,
    name: &str,
    password: &str,
    actor: &str,
) -> Result<OperatorView, OpsError> {
    check_name(name)?;
    check_password(password)?;
    let hash = hashed(password).await?;
    let detail = format!("operator {name} created");
    if !store
        .insert_operator(
            name,
            &hash,
            now,
            &audit_row(now, AuditEvent::OperatorCreated, actor, &detail),
        )
        .await?
    {
        return Err(OpsError::Refused(format!(
            "an operator named {name:?} exists already; `acme-proxy admin user passwd {name}` changes its password"
        )));
    }
    let row = store.operator(name).await?.ok_or_else(|| no_such(name))?;
    Ok(view(row, 0))
}

/// A new password; every session of the operator ends.
pub async fn set_password(
    store: &Store,
    now: i64,
    name: &str,
    password: &str,
    actor: &str,
) -> Result<(), OpsError> {
    check_password(password)?;
    let hash = hashed(password).await?;
    let detail = format!("operator {name}: password changed, sessions ended");
    if store
        .set_operator_password(
            name,
            &hash,
            now,
            &audit_row(now, AuditEvent::OperatorChanged, actor, &detail),
        )
        .await?
    {
        Ok(())
    } else {
        Err(no_such(name))
    }
}

/// Disables (ending its sessions) or enables an operator.
pub async fn set_disabled(
    store: &Store,
    now: i64,
    name: &str,
    disabled: bool,
    actor: &str,
) -> Result<OperatorView, OpsError> {
    let detail = if disabled {
        format!("operator {name} disabled, sessions ended, API tokens revoked")
    } else {
        format!("operator {name} enabled")
    };
    let changed = store
        .set_operator_disabled(
            name,
            disabled.then_some(now),
            &audit_row(now, AuditEvent::OperatorChanged, actor, &detail),
        )
        .await?;
    let row = store.operator(name).await?.ok_or_else(|| no_such(name))?;
    if !changed {
        return Err(OpsError::Refused(format!(
            "operator {name} is {} already",
            if disabled { "disabled" } else { "enabled" }
        )));
    }
    Ok(view(row, 0))
}

pub async fn delete_operator(
    store: &Store,
    now: i64,
    name: &str,
    actor: &str,
) -> Result<(), OpsError> {
    let detail = format!("operator {name} deleted with its sessions");
    if store
        .delete_operator(
            name,
            &audit_row(now, AuditEvent::OperatorDeleted, actor, &detail),
        )
        .await?
    {
        Ok(())
    } else {
        Err(no_such(name))
    }
}

/// Forgets an operator's authenticator and recovery codes and ends their
/// sessions: they enrol again at their next login.
pub async fn reset_totp(store: &Store, now: i64, name: &str, actor: &str) -> Result<(), OpsError> {
    let detail = format!("operator {name}: TOTP and recovery codes reset, sessions ended");
    if store
        .reset_operator_totp(
            name,
            &audit_row(now, AuditEvent::OperatorChanged, actor, &detail),
        )
        .await?
    {
        Ok(())
    } else {
        Err(no_such(name))
    }
}

pub async fn list_operators(store: &Store) -> Result<Vec<OperatorView>, OpsError> {
    let sessions = store.list_operator_sessions(None).await?;
    Ok(store
        .list_operators()
        .await?
        .into_iter()
        .map(|row| {
            let n = sessions.iter().filter(|s| s.operator == row.name).count();
            view(row, n)
        })
        .collect())
}

pub async fn list_sessions(
    store: &Store,
    operator: Option<&str>,
) -> Result<Vec<SessionView>, OpsError> {
    Ok(store
        .list_operator_sessions(operator)
        .await?
        .into_iter()
        .map(SessionView::from)
        .collect())
}

pub async fn revoke_session(
    store: &Store,
    now: i64,
    id: &str,
    actor: &str,
) -> Result<(), OpsError> {
    let detail = format!("session {id} revoked");
    if store
        .revoke_operator_session(
            id,
            &audit_row(now, AuditEvent::OperatorSessionRevoked, actor, &detail),
        )
        .await?
    {
        Ok(())
    } else {
        Err(OpsError::NotFound(format!("no session {id:?}")))
    }
}

/// The longest an API token may live: a script's credential is renewed
/// at least yearly.
pub const MAX_TOKEN_LIFETIME: std::time::Duration = std::time::Duration::from_secs(366 * 86_400);
/// What every API token starts with, so that one found in a file or a
/// log is recognised for what it is (and secret scanners can match it).
pub const TOKEN_PREFIX: &str = "apx_";

/// An API token as the CLI shows one (never the token itself but on
/// creation).
#[derive(Debug, Clone, Serialize)]
pub struct TokenView {
    pub id: String,
    pub operator: String,
    pub label: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    pub last_used_at: Option<String>,
    /// Only in `create`'s answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl From<acme_proxy_store::OperatorTokenRow> for TokenView {
    fn from(t: acme_proxy_store::OperatorTokenRow) -> Self {
        Self {
            id: t.id,
            operator: t.operator,
            label: t.label,
            created_at: rfc3339(t.created_at),
            expires_at: rfc3339(t.expires_at),
            last_used_at: t.last_used_at.map(rfc3339),
            token: None,
        }
    }
}

/// Mints an API token for `operator`, valid for `lifetime`: the token is
/// in the answer only (its SHA-256 is stored).
pub async fn create_token(
    store: &Store,
    now: i64,
    operator: &str,
    label: Option<&str>,
    lifetime: std::time::Duration,
    actor: &str,
) -> Result<TokenView, OpsError> {
    // Expiry is kept in whole seconds: less than one would never work.
    if lifetime.as_secs() == 0 || lifetime > MAX_TOKEN_LIFETIME {
        return Err(OpsError::Refused(format!(
            "a token's lifetime must be at least 1s and at most {} (e.g. --expires 90d)",
            humantime::format_duration(MAX_TOKEN_LIFETIME)
        )));
    }
    if let Some(label) = label
        && (label.len() > 200 || label.chars().any(char::is_control))
    {
        return Err(OpsError::Refused(
            "a token's label is at most 200 bytes of printable text".to_owned(),
        ));
    }
    match store.operator(operator).await? {
        None => return Err(no_such(operator)),
        Some(row) if row.disabled_at.is_some() => {
            return Err(OpsError::Refused(format!(
                "operator {operator} is disabled; `acme-proxy admin user enable {operator}` first"
            )));
        }
        Some(_) => {}
    }
    let token = format!("{TOKEN_PREFIX}{}", crate::ids::session_token());
    let row = acme_proxy_store::OperatorTokenRow {
        id: crate::ids::session_id(),
        operator: operator.to_owned(),
        label: label.map(str::to_owned),
        created_at: now,
        expires_at: now.saturating_add(i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX)),
        last_used_at: None,
    };
    let detail = format!(
        "API token {} created for operator {operator}, expiring {}",
        row.id,
        rfc3339(row.expires_at)
    );
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    if !store
        .insert_operator_token(
            &row,
            digest.as_ref(),
            &audit_row(now, AuditEvent::OperatorTokenCreated, actor, &detail),
        )
        .await?
    {
        return Err(no_such(operator));
    }
    let mut view = TokenView::from(row);
    view.token = Some(token);
    Ok(view)
}

pub async fn list_tokens(
    store: &Store,
    operator: Option<&str>,
) -> Result<Vec<TokenView>, OpsError> {
    Ok(store
        .list_operator_tokens(operator)
        .await?
        .into_iter()
        .map(TokenView::from)
        .collect())
}

pub async fn revoke_token(store: &Store, now: i64, id: &str, actor: &str) -> Result<(), OpsError> {
    let detail = format!("API token {id} revoked");
    if store
        .revoke_operator_token(
            id,
            &audit_row(now, AuditEvent::OperatorTokenRevoked, actor, &detail),
        )
        .await?
    {
        Ok(())
    } else {
        Err(OpsError::NotFound(format!("no API token {id:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_names_are_short_lowercase_words() {
        for good in ["alice", "ops-1", "a.b_c", "0day"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Alice", "-x", "a b", "al:ce", "é", &"a".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn passwords_need_twelve_characters_and_at_most_a_kibibyte() {
        assert!(check_password("elevenchars").is_err());
        assert!(check_password("twelve chars").is_ok());
        // Characters, not bytes: twelve two-byte letters are enough.
        assert!(check_password(&"é".repeat(12)).is_ok());
        assert!(check_password(&"x".repeat(MAX_PASSWORD_BYTES + 1)).is_err());
    }
}
