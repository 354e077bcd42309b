//! The web console's users ("operators") and their sessions. Passwords
//! arrive here already hashed; session tokens only as their digests.

use crate::audit::insert_audit_in;
use crate::db::{Arg, Row, args, col_enum};
use crate::{NewAuditRow, Result, Store};

/// An operator as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorRow {
    pub name: String,
    /// argon2id PHC string.
    pub password_hash: String,
    pub password_changed_at: i64,
    /// The enrolled TOTP secret; none: not enrolled.
    pub totp_secret: Option<Vec<u8>>,
    /// The last TOTP time step accepted (each code works once).
    pub totp_last_step: Option<i64>,
    pub disabled_at: Option<i64>,
    pub created_at: i64,
}

impl std::fmt::Debug for OperatorRow {
    // Never the hash or the secret, whatever logs a row.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorRow")
            .field("name", &self.name)
            .field("password_changed_at", &self.password_changed_at)
            .field("totp", &self.totp_secret.is_some())
            .field("disabled_at", &self.disabled_at)
            .field("created_at", &self.created_at)
            .finish_non_exhaustive()
    }
}

acme_proxy_protocol::string_enum! {
    /// How far a session's login has come.
    pub enum SessionStage {
        /// The password was right; the TOTP code is still due.
        Totp = "totp",
        /// The operator must enrol a TOTP authenticator before anything else.
        Enrol = "enrol",
        /// Logged in.
        Full = "full",
    }
}

/// A session as stored: found by its token's digest, named by `id`.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorSessionRow {
    pub id: String,
    pub operator: String,
    pub csrf_token: String,
    pub stage: SessionStage,
    pub created_at: i64,
    pub last_seen_at: i64,
    pub client_ip: Option<String>,
    pub user_agent: Option<String>,
    /// A TOTP secret shown for enrolment, not yet confirmed.
    pub pending_totp: Option<Vec<u8>>,
}

impl std::fmt::Debug for OperatorSessionRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorSessionRow")
            .field("id", &self.id)
            .field("operator", &self.operator)
            .field("created_at", &self.created_at)
            .field("last_seen_at", &self.last_seen_at)
            .field("client_ip", &self.client_ip)
            .finish_non_exhaustive()
    }
}

/// What [`Store::insert_operator_session`] needs.
pub struct NewOperatorSession<'a> {
    pub token_hash: &'a [u8],
    pub id: &'a str,
    pub operator: &'a str,
    /// The stored hash the login's password was checked against: the
    /// session is made only while it is still the operator's.
    pub password_hash: &'a str,
    pub csrf_token: &'a str,
    pub stage: SessionStage,
    pub now: i64,
    pub client_ip: Option<&'a str>,
    pub user_agent: Option<&'a str>,
}

/// An API token as stored: found by its digest, named by `id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorTokenRow {
    pub id: String,
    pub operator: String,
    pub label: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    pub last_used_at: Option<i64>,
}

fn token_row(row: Row<'_>) -> Result<OperatorTokenRow> {
    Ok(OperatorTokenRow {
        id: row.get("id")?,
        operator: row.get("operator")?,
        label: row.get("label")?,
        created_at: row.get("created_at")?,
        expires_at: row.get("expires_at")?,
        last_used_at: row.get("last_used_at")?,
    })
}

fn operator_row(row: Row<'_>) -> Result<OperatorRow> {
    operator_with(row, "created_at")
}

/// The operator of a row joined to `operators o` (its `created_at` as
/// `operator_created_at`, beside the joined row's own).
fn joined_operator(row: Row<'_>) -> Result<OperatorRow> {
    operator_with(row, "operator_created_at")
}

fn operator_with(row: Row<'_>, created_at: &str) -> Result<OperatorRow> {
    Ok(OperatorRow {
        name: row.get("name")?,
        password_hash: row.get("password_hash")?,
        password_changed_at: row.get("password_changed_at")?,
        totp_secret: row.get("totp_secret")?,
        totp_last_step: row.get("totp_last_step")?,
        disabled_at: row.get("disabled_at")?,
        created_at: row.get(created_at)?,
    })
}

fn session_row(row: Row<'_>) -> Result<OperatorSessionRow> {
    Ok(OperatorSessionRow {
        id: row.get("id")?,
        operator: row.get("operator")?,
        csrf_token: row.get("csrf_token")?,
        stage: col_enum(row, 3, "stage", "operator_sessions.stage")?,
        created_at: row.get("created_at")?,
        last_seen_at: row.get("last_seen_at")?,
        client_ip: row.get("client_ip")?,
        user_agent: row.get("user_agent")?,
        pending_totp: row.get("pending_totp")?,
    })
}

macro_rules! operator_columns {
    () => {
        "name, password_hash, password_changed_at, totp_secret, totp_last_step, disabled_at, \
         created_at"
    };
}

impl Store {
    /// Runs `sql`; when it changed one row, writes `audit` (if any) in the
    /// same transaction. Whether it changed one.
    pub(crate) async fn change_audited(
        &self,
        sql: &'static str,
        args: &[Arg<'_>],
        audit: Option<&NewAuditRow<'_>>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = tx.exec(sql, args).await? == 1;
        if let (true, Some(audit)) = (changed, audit) {
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Creates an operator and audits it; false (and nothing written) when
    /// the name is taken.
    pub async fn insert_operator(
        &self,
        name: &str,
        password_hash: &str,
        now: i64,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        self.change_audited(
            "INSERT INTO operators (name, password_hash, password_changed_at, created_at)
             VALUES (?1, ?2, ?3, ?3) ON CONFLICT (name) DO NOTHING",
            args![name, password_hash, now],
            Some(audit),
        )
        .await
    }

    pub async fn operator(&self, name: &str) -> Result<Option<OperatorRow>> {
        self.point_reader()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    operator_columns!(),
                    " FROM operators WHERE name = ?1"
                ),
                args![name],
                operator_row,
            )
            .await
    }

    /// Every operator, by name.
    pub async fn list_operators(&self) -> Result<Vec<OperatorRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    operator_columns!(),
                    " FROM operators ORDER BY name"
                ),
                &[],
                operator_row,
            )
            .await
    }

    /// Sets a new password and ends every session of the operator, audited
    /// in the same transaction; false when there is no such operator.
    pub async fn set_operator_password(
        &self,
        name: &str,
        password_hash: &str,
        now: i64,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let found = tx
            .exec(
                "UPDATE operators SET password_hash = ?2, password_changed_at = ?3 WHERE name = ?1",
                args![name, password_hash, now],
            )
            .await?
            == 1;
        if found {
            tx.exec(
                "DELETE FROM operator_sessions WHERE operator = ?1",
                args![name],
            )
            .await?;
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(found)
    }

    /// The same password hashed with today's parameters, replacing `old`
    /// only if it is still the stored one (a login's upgrade, racing
    /// nothing else): sessions stay.
    pub async fn upgrade_operator_hash(&self, name: &str, old: &str, new: &str) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE operators SET password_hash = ?3 WHERE name = ?1 AND password_hash = ?2",
                args![name, old, new],
            )
            .await?
            == 1)
    }

    /// Disables (`Some(now)`) or enables (`None`) an operator, audited;
    /// disabling ends its sessions and revokes its API tokens. False when
    /// there is no such operator or it already was so.
    pub async fn set_operator_disabled(
        &self,
        name: &str,
        disabled_at: Option<i64>,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = tx
            .exec(
                "UPDATE operators SET disabled_at = ?2
                 WHERE name = ?1 AND (disabled_at IS NULL) = (?2 IS NOT NULL)",
                args![name, disabled_at],
            )
            .await?
            == 1;
        if changed {
            if disabled_at.is_some() {
                // Sessions end and API tokens are revoked: enabling the
                // operator again brings neither back.
                tx.exec(
                    "DELETE FROM operator_sessions WHERE operator = ?1",
                    args![name],
                )
                .await?;
                tx.exec(
                    "DELETE FROM operator_tokens WHERE operator = ?1",
                    args![name],
                )
                .await?;
            }
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Deletes an operator with its sessions and recovery codes, audited;
    /// false when there is none.
    pub async fn delete_operator(&self, name: &str, audit: &NewAuditRow<'_>) -> Result<bool> {
        self.change_audited(
            "DELETE FROM operators WHERE name = ?1",
            args![name],
            Some(audit),
        )
        .await
    }

    /// Records a new session, with the login's audit row; false, and
    /// nothing written, when the operator's password hash is no longer
    /// `password_hash` or the operator is disabled.
    pub async fn insert_operator_session(
        &self,
        new: &NewOperatorSession<'_>,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        // Guarded by the hash the password was checked against: a
        // password change (or a disable) that lands while the login was
        // hashing ended every session, and must end this one too.
        let made = tx
            .exec(
                "INSERT INTO operator_sessions
                     (token_hash, id, operator, csrf_token, stage, created_at, last_seen_at,
                      client_ip, user_agent)
                 SELECT ?1, ?2, name, ?4, ?8, ?5, ?5, ?6, ?7 FROM operators
                 WHERE name = ?3 AND password_hash = ?9 AND disabled_at IS NULL",
                args![
                    new.token_hash,
                    new.id,
                    new.operator,
                    new.csrf_token,
                    new.now,
                    new.client_ip,
                    new.user_agent,
                    new.stage.as_str(),
                    new.password_hash
                ],
            )
            .await?;
        if made == 0 {
            return Ok(false);
        }
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The session whose token has this digest, with its operator.
    pub async fn operator_session(
        &self,
        token_hash: &[u8],
    ) -> Result<Option<(OperatorSessionRow, OperatorRow)>> {
        self.point_reader()
            .await?
            .one(
                "SELECT s.id, s.operator, s.csrf_token, s.stage, s.created_at, s.last_seen_at, s.client_ip,
                        s.user_agent, s.pending_totp,
                        o.name, o.password_hash, o.password_changed_at, o.totp_secret,
                        o.totp_last_step, o.disabled_at, o.created_at AS operator_created_at
                 FROM operator_sessions s JOIN operators o ON o.name = s.operator
                 WHERE s.token_hash = ?1",
                args![token_hash],
                |row| Ok((session_row(row)?, joined_operator(row)?)),
            )
            .await
    }

    /// Moves a session on to `stage` (its TOTP code given, or enrolment
    /// done), clearing a pending secret; false when it is gone.
    pub async fn set_operator_session_stage(
        &self,
        token_hash: &[u8],
        stage: SessionStage,
    ) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE operator_sessions SET stage = ?2, pending_totp = NULL WHERE token_hash = ?1",
                args![token_hash, stage.as_str()],
            )
            .await?
            == 1)
    }

    /// Keeps a TOTP secret shown for enrolment with the session that saw
    /// it, until a code from it is confirmed.
    pub async fn set_operator_session_pending_totp(
        &self,
        token_hash: &[u8],
        secret: &[u8],
    ) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE operator_sessions SET pending_totp = ?2 WHERE token_hash = ?1",
                args![token_hash, secret],
            )
            .await?
            == 1)
    }

    /// Enrols `secret` for the session's operator, its first code having
    /// been `step`: replaces the recovery codes with `recovery` (digests),
    /// ends the operator's other sessions, and makes this one `full`, with
    /// `audit`, in one transaction. False when the session is gone.
    pub async fn enrol_operator_totp(
        &self,
        token_hash: &[u8],
        secret: &[u8],
        step: i64,
        recovery: &[Vec<u8>],
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let Some(operator) = tx
            .one(
                "SELECT operator FROM operator_sessions WHERE token_hash = ?1",
                args![token_hash],
                |row| row.get::<String>(0),
            )
            .await?
        else {
            return Ok(false);
        };
        tx.exec(
            "UPDATE operators SET totp_secret = ?2, totp_last_step = ?3 WHERE name = ?1",
            args![operator, secret, step],
        )
        .await?;
        tx.exec(
            "DELETE FROM operator_recovery_codes WHERE operator = ?1",
            args![operator],
        )
        .await?;
        for code in recovery {
            tx.exec(
                "INSERT INTO operator_recovery_codes (operator, code_hash) VALUES (?1, ?2)",
                args![operator, code.as_slice()],
            )
            .await?;
        }
        tx.exec(
            "DELETE FROM operator_sessions WHERE operator = ?1 AND token_hash <> ?2",
            args![operator, token_hash],
        )
        .await?;
        tx.exec(
            "UPDATE operator_sessions SET stage = 'full', pending_totp = NULL WHERE token_hash = ?1",
            args![token_hash],
        )
        .await?;
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Takes TOTP step `step` for the session's operator, once: only a
    /// step after the last one taken; the session becomes `full` and
    /// `audit` is written with it. False when the step was taken already
    /// (or the session is gone).
    pub async fn accept_operator_totp(
        &self,
        token_hash: &[u8],
        step: i64,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        self.second_factor(
            "UPDATE operators SET totp_last_step = ?2
             WHERE name = (SELECT operator FROM operator_sessions WHERE token_hash = ?1)
               AND totp_secret IS NOT NULL
               AND (totp_last_step IS NULL OR totp_last_step < ?2)",
            args![token_hash, step],
            token_hash,
            audit,
        )
        .await
    }

    /// Uses one of the session's operator's recovery codes (by digest),
    /// once; the session becomes `full` with `audit`. False when no unused
    /// code has that digest.
    pub async fn use_operator_recovery_code(
        &self,
        token_hash: &[u8],
        code_hash: &[u8],
        now: i64,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        self.second_factor(
            "UPDATE operator_recovery_codes SET used_at = ?3
             WHERE operator = (SELECT operator FROM operator_sessions WHERE token_hash = ?1)
               AND code_hash = ?2 AND used_at IS NULL",
            args![token_hash, code_hash, now],
            token_hash,
            audit,
        )
        .await
    }

    /// Runs `sql`, which takes a second factor once; when it changed one
    /// row, the session becomes `full` and `audit` is written, in the same
    /// transaction.
    async fn second_factor(
        &self,
        sql: &'static str,
        args: &[Arg<'_>],
        token_hash: &[u8],
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let taken = tx.exec(sql, args).await? == 1;
        if taken {
            tx.exec(
                "UPDATE operator_sessions SET stage = 'full' WHERE token_hash = ?1",
                args![token_hash],
            )
            .await?;
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(taken)
    }

    /// How many of an operator's recovery codes are unused.
    pub async fn unused_recovery_codes(&self, operator: &str) -> Result<i64> {
        self.point_reader()
            .await?
            .one(
                "SELECT CAST(COUNT(*) AS BIGINT) FROM operator_recovery_codes
                 WHERE operator = ?1 AND used_at IS NULL",
                args![operator],
                |row| row.get(0),
            )
            .await
            .map(|n| n.unwrap_or(0))
    }

    /// Forgets an operator's TOTP secret and recovery codes and ends their
    /// sessions (a lost authenticator), audited; false when there is no
    /// such operator.
    pub async fn reset_operator_totp(&self, name: &str, audit: &NewAuditRow<'_>) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let found = tx
            .exec(
                "UPDATE operators SET totp_secret = NULL, totp_last_step = NULL WHERE name = ?1",
                args![name],
            )
            .await?
            == 1;
        if found {
            tx.exec(
                "DELETE FROM operator_recovery_codes WHERE operator = ?1",
                args![name],
            )
            .await?;
            tx.exec(
                "DELETE FROM operator_sessions WHERE operator = ?1",
                args![name],
            )
            .await?;
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(found)
    }

    /// Moves a session's last use forward (its idle lifetime counts from
    /// there).
    pub async fn touch_operator_session(&self, token_hash: &[u8], now: i64) -> Result<()> {
        self.writer()
            .await?
            .exec(
                "UPDATE operator_sessions SET last_seen_at = ?2 WHERE token_hash = ?1",
                args![token_hash, now],
            )
            .await?;
        Ok(())
    }

    /// Ends the session whose token has this digest (logout); `audit`, when
    /// given, is written with it. False when there was none.
    pub async fn end_operator_session(
        &self,
        token_hash: &[u8],
        audit: Option<&NewAuditRow<'_>>,
    ) -> Result<bool> {
        self.change_audited(
            "DELETE FROM operator_sessions WHERE token_hash = ?1",
            args![token_hash],
            audit,
        )
        .await
    }

    /// Revokes the session named `id` (the operator's command), audited;
    /// false when there is none.
    pub async fn revoke_operator_session(&self, id: &str, audit: &NewAuditRow<'_>) -> Result<bool> {
        self.change_audited(
            "DELETE FROM operator_sessions WHERE id = ?1",
            args![id],
            Some(audit),
        )
        .await
    }

    /// Sessions, newest first; of one operator when named.
    pub async fn list_operator_sessions(
        &self,
        operator: Option<&str>,
    ) -> Result<Vec<OperatorSessionRow>> {
        self.reader()
            .await?
            .all(
                "SELECT id, operator, csrf_token, stage, created_at, last_seen_at, client_ip, user_agent,
                        pending_totp
                 FROM operator_sessions
                 WHERE (?1 IS NULL OR operator = ?1) ORDER BY created_at DESC, id",
                args![operator],
                session_row,
            )
            .await
    }

    /// Deletes sessions idle since before `idle_before` or created before
    /// `created_before`; how many.
    pub async fn delete_stale_operator_sessions(
        &self,
        idle_before: i64,
        created_before: i64,
    ) -> Result<u64> {
        self.writer()
            .await?
            .exec(
                "DELETE FROM operator_sessions WHERE last_seen_at < ?1 OR created_at < ?2",
                args![idle_before, created_before],
            )
            .await
    }

    /// Stores a new API token (its digest) for an existing operator,
    /// audited in the same transaction; false when there is no such
    /// operator or it is disabled.
    pub async fn insert_operator_token(
        &self,
        token: &OperatorTokenRow,
        token_hash: &[u8],
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        self.change_audited(
            "INSERT INTO operator_tokens (id, token_hash, operator, label, created_at, expires_at)
             SELECT ?1, ?2, name, ?4, ?5, ?6 FROM operators WHERE name = ?3 AND disabled_at IS NULL",
            args![
                token.id.as_str(),
                token_hash,
                token.operator.as_str(),
                token.label.as_deref(),
                token.created_at,
                token.expires_at
            ],
            Some(audit),
        )
        .await
    }

    /// The token whose digest this is, with its operator.
    pub async fn operator_token(
        &self,
        token_hash: &[u8],
    ) -> Result<Option<(OperatorTokenRow, OperatorRow)>> {
        self.point_reader()
            .await?
            .one(
                "SELECT t.id, t.operator, t.label, t.created_at, t.expires_at, t.last_used_at,
                        o.name, o.password_hash, o.password_changed_at, o.totp_secret,
                        o.totp_last_step, o.disabled_at, o.created_at AS operator_created_at
                 FROM operator_tokens t JOIN operators o ON o.name = t.operator
                 WHERE t.token_hash = ?1",
                args![token_hash],
                |row| Ok((token_row(row)?, joined_operator(row)?)),
            )
            .await
    }

    /// Notes a token's use (at most as often as the caller asks).
    pub async fn touch_operator_token(&self, id: &str, now: i64) -> Result<()> {
        self.writer()
            .await?
            .exec(
                "UPDATE operator_tokens SET last_used_at = ?2 WHERE id = ?1",
                args![id, now],
            )
            .await?;
        Ok(())
    }

    /// Tokens, newest first; of one operator when named.
    pub async fn list_operator_tokens(
        &self,
        operator: Option<&str>,
    ) -> Result<Vec<OperatorTokenRow>> {
        self.reader()
            .await?
            .all(
                "SELECT id, operator, label, created_at, expires_at, last_used_at
                 FROM operator_tokens
                 WHERE (?1 IS NULL OR operator = ?1) ORDER BY created_at DESC, id",
                args![operator],
                token_row,
            )
            .await
    }

    /// Revokes (deletes) the token named `id`, audited; false when there
    /// is none.
    pub async fn revoke_operator_token(&self, id: &str, audit: &NewAuditRow<'_>) -> Result<bool> {
        self.change_audited(
            "DELETE FROM operator_tokens WHERE id = ?1",
            args![id],
            Some(audit),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::NewOperatorSession;
    use crate::test_support::TestDb;
    use crate::{AuditEvent, AuditOutcome, NewAuditRow, SessionStage};

    fn session<'a>(token_hash: &'a [u8], id: &'a str, hash: &'a str) -> NewOperatorSession<'a> {
        NewOperatorSession {
            token_hash,
            id,
            operator: "alice",
            password_hash: hash,
            csrf_token: "csrf",
            stage: SessionStage::Full,
            now: 10,
            client_ip: None,
            user_agent: None,
        }
    }

    #[tokio::test]
    async fn a_login_checked_against_a_password_since_changed_or_a_disabled_operator_makes_no_session()
     {
        let (_db, store) = TestDb::open().await;
        let row = NewAuditRow::new(
            1,
            AuditEvent::OperatorLogin,
            AuditOutcome::Success,
            "operator:alice",
        );
        assert!(
            store
                .insert_operator("alice", "old", 1, &row)
                .await
                .unwrap()
        );
        // The password changes while a login holding the old hash hashes.
        assert!(
            store
                .set_operator_password("alice", "new", 2, &row)
                .await
                .unwrap()
        );
        assert!(
            !store
                .insert_operator_session(&session(b"t1", "s1", "old"), &row)
                .await
                .unwrap(),
            "made with a password that is no longer the operator's"
        );
        assert!(
            store
                .insert_operator_session(&session(b"t2", "s2", "new"), &row)
                .await
                .unwrap()
        );
        assert!(
            store
                .set_operator_disabled("alice", Some(3), &row)
                .await
                .unwrap()
        );
        assert!(
            !store
                .insert_operator_session(&session(b"t3", "s3", "new"), &row)
                .await
                .unwrap(),
            "made for a disabled operator"
        );
        let sessions = store.list_operator_sessions(None).await.unwrap();
        assert!(sessions.is_empty(), "{sessions:?}");
    }
}
