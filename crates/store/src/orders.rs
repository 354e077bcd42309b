//! Orders, authorizations and challenges (RFC 8555 §7.1.3–§7.1.6, §7.4, §7.5).
//!
//! Every status change is a guarded statement inside one transaction that
//! also moves whatever depends on it (challenge → authorization → orders),
//! so readers never see a valid challenge under a pending authorization.

use acme_proxy_protocol::Problem;
use acme_proxy_protocol::types::Identifier;
use sqlx::sqlite::SqliteRow;
use sqlx::{Connection, Row};

use crate::jobs::insert_jobs_in;
use crate::{NewJob, Result, Store, StoreError, to_json};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderRow {
    pub id: String,
    pub profile: String,
    pub account_id: String,
    pub status: String,
    pub identifiers: Vec<Identifier>,
    pub not_before: Option<i64>,
    pub not_after: Option<i64>,
    pub expires_at: i64,
    pub error: Option<Problem>,
    pub created_at: i64,
    /// Set once the order is valid.
    pub certificate_id: Option<String>,
    /// The certificate profile it was given (draft-ietf-acme-profiles).
    pub certificate_profile: Option<String>,
    /// RFC 9773 §5: the certificate identifier it replaces, as sent.
    pub replaces: Option<String>,
    /// Its authorizations, in the order of its identifiers (read with the
    /// order in one statement: every order document lists them).
    pub authorization_ids: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorizationRow {
    pub id: String,
    pub profile: String,
    pub account_id: String,
    pub identifier: Identifier,
    pub wildcard: bool,
    pub status: String,
    pub expires_at: i64,
    pub created_at: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChallengeRow {
    pub id: String,
    pub authz_id: String,
    pub kind: String,
    pub token: String,
    pub status: String,
    pub validated_at: Option<i64>,
    pub error: Option<Problem>,
}

/// A challenge being validated, with what the validator needs.
#[derive(Clone, Debug)]
pub struct ProcessingChallenge {
    pub challenge: ChallengeRow,
    pub authorization: AuthorizationRow,
}

#[derive(Clone, Debug)]
pub struct NewChallenge {
    pub id: String,
    pub kind: String,
    pub token: String,
}

#[derive(Clone, Debug)]
pub struct NewAuthorization {
    pub id: String,
    pub identifier: Identifier,
    pub wildcard: bool,
    pub expires_at: i64,
    pub challenges: Vec<NewChallenge>,
}

#[derive(Clone, Debug)]
pub struct NewOrderRow {
    pub id: String,
    pub profile: String,
    pub account_id: String,
    pub identifiers: Vec<Identifier>,
    pub not_before: Option<i64>,
    pub not_after: Option<i64>,
    pub expires_at: i64,
    pub now: i64,
    /// One per identifier, in the order's order.
    pub authorizations: Vec<OrderAuthorization>,
    pub certificate_profile: Option<String>,
    /// (certificate identifier as sent, id of the certificate it names).
    pub replaces: Option<(String, String)>,
}

/// What [`Store::insert_order`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InsertOrder {
    /// The order as written (no need to read it back).
    Inserted(Box<OrderRow>),
    /// RFC 9773 §5: another order that is not invalid already replaces the
    /// certificate named by `replaces`; nothing was written.
    AlreadyReplaced,
}

/// An order's authorization: a new one, or a valid one being reused.
#[derive(Clone, Debug)]
pub enum OrderAuthorization {
    New(NewAuthorization),
    Reuse(String),
}

/// pending → processing for a challenge whose authorization is still
/// pending and unexpired ($1 challenge id, $2 now).
const START_CHALLENGE: &str = "UPDATE challenges SET status = 'processing'
     WHERE id = $1 AND status = 'pending'
       AND EXISTS (SELECT 1 FROM authorizations a WHERE a.id = challenges.authz_id
                   AND a.status = 'pending' AND a.expires_at > $2)";

macro_rules! order_columns {
    () => {
        "o.id, o.profile, o.account_id, o.status, o.identifiers, o.not_before, \
     o.not_after, o.expires_at, o.error, o.created_at, c.id AS certificate_id, \
     o.certificate_profile, o.replaces, \
     (SELECT json_group_array(oa.authz_id ORDER BY oa.position) \
        FROM order_authorizations oa WHERE oa.order_id = o.id) AS authorization_ids"
    };
}
macro_rules! authz_columns {
    () => {
        "a.id, a.profile, a.account_id, a.identifier_type, a.identifier_value, \
     a.wildcard, a.status, a.expires_at, a.created_at"
    };
}
macro_rules! challenge_columns {
    () => {
        "ch.id, ch.authz_id, ch.type, ch.token, ch.status, ch.validated_at, ch.error"
    };
}

fn problem(s: Option<String>) -> Result<Option<Problem>> {
    s.map(|s| serde_json::from_str(&s).map_err(|e| StoreError::Corrupt(format!("problem: {e}"))))
        .transpose()
}

fn order_from_row(row: &SqliteRow) -> Result<OrderRow> {
    let identifiers: String = row.try_get("identifiers")?;
    Ok(OrderRow {
        id: row.try_get("id")?,
        profile: row.try_get("profile")?,
        account_id: row.try_get("account_id")?,
        status: row.try_get("status")?,
        identifiers: serde_json::from_str(&identifiers)
            .map_err(|e| StoreError::Corrupt(format!("identifiers: {e}")))?,
        not_before: row.try_get("not_before")?,
        not_after: row.try_get("not_after")?,
        expires_at: row.try_get("expires_at")?,
        error: problem(row.try_get("error")?)?,
        created_at: row.try_get("created_at")?,
        certificate_id: row.try_get("certificate_id")?,
        certificate_profile: row.try_get("certificate_profile")?,
        replaces: row.try_get("replaces")?,
        authorization_ids: crate::json_vec(&row.try_get::<String, _>("authorization_ids")?)?,
    })
}

fn authz_from_row(row: &SqliteRow) -> Result<AuthorizationRow> {
    Ok(AuthorizationRow {
        id: row.try_get("id")?,
        profile: row.try_get("profile")?,
        account_id: row.try_get("account_id")?,
        identifier: Identifier {
            kind: row.try_get("identifier_type")?,
            value: row.try_get("identifier_value")?,
        },
        wildcard: row.try_get("wildcard")?,
        status: row.try_get("status")?,
        expires_at: row.try_get("expires_at")?,
        created_at: row.try_get("created_at")?,
    })
}

/// The names a challenge row's columns are read under: alone, or beside an
/// authorization's (whose `id` and `status` they would shadow).
const CHALLENGE: [&str; 7] = [
    "id",
    "authz_id",
    "type",
    "token",
    "status",
    "validated_at",
    "error",
];
const JOINED_CHALLENGE: [&str; 7] = [
    "ch_id",
    "ch_authz_id",
    "ch_type",
    "ch_token",
    "ch_status",
    "ch_validated_at",
    "ch_error",
];

fn challenge_from_row(row: &SqliteRow) -> Result<ChallengeRow> {
    challenge_named(row, &CHALLENGE)
}

fn joined_challenge_from_row(row: &SqliteRow) -> Result<ChallengeRow> {
    challenge_named(row, &JOINED_CHALLENGE)
}

fn challenge_named(row: &SqliteRow, c: &[&str; 7]) -> Result<ChallengeRow> {
    Ok(ChallengeRow {
        id: row.try_get(c[0])?,
        authz_id: row.try_get(c[1])?,
        kind: row.try_get(c[2])?,
        token: row.try_get(c[3])?,
        status: row.try_get(c[4])?,
        validated_at: row.try_get(c[5])?,
        error: problem(row.try_get(c[6])?)?,
    })
}

/// The challenge columns under other names, for a row that also has an
/// authorization's.
macro_rules! joined_challenge_columns {
    () => {
        "ch.id AS ch_id, ch.authz_id AS ch_authz_id, ch.type AS ch_type, ch.token AS ch_token, \
         ch.status AS ch_status, ch.validated_at AS ch_validated_at, ch.error AS ch_error"
    };
}

/// A challenge of `authz_id` just became valid: the authorization becomes
/// valid until `valid_until`, and each pending order whose authorizations
/// are now all valid becomes ready (RFC 8555 §7.1.6).
async fn validate_authorization_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    authz_id: &str,
    valid_until: i64,
) -> Result<()> {
    let moved = sqlx::query(
        "UPDATE authorizations SET status = 'valid', expires_at = $1 WHERE id = $2 AND status = 'pending'",
    )
    .bind(valid_until)
    .bind(authz_id)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if moved == 1 {
        sqlx::query(
            "UPDATE orders SET status = 'ready'
             WHERE status = 'pending'
               AND id IN (SELECT order_id FROM order_authorizations WHERE authz_id = $1)
               AND NOT EXISTS (
                   SELECT 1 FROM order_authorizations oa
                   JOIN authorizations a ON a.id = oa.authz_id
                   WHERE oa.order_id = orders.id AND a.status <> 'valid')",
        )
        .bind(authz_id)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

impl Store {
    /// Creates an order with its authorizations and their challenges, in one
    /// transaction of at most five statements whatever the number of
    /// identifiers (each table's rows in one multi-row `INSERT`: every
    /// statement is a round trip to the connection's thread). Returns the
    /// order as written.
    pub async fn insert_order(&self, new: &NewOrderRow) -> Result<InsertOrder> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO orders (id, profile, account_id, status, identifiers, not_before, not_after, expires_at, created_at,
                                 certificate_profile, replaces, replaces_certificate_id)
             VALUES ($1, $2, $3, 'pending', $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&new.id)
        .bind(&new.profile)
        .bind(&new.account_id)
        .bind(to_json(&new.identifiers))
        .bind(new.not_before)
        .bind(new.not_after)
        .bind(new.expires_at)
        .bind(new.now)
        .bind(&new.certificate_profile)
        .bind(new.replaces.as_ref().map(|r| &r.0))
        .bind(new.replaces.as_ref().map(|r| &r.1))
        .execute(&mut *tx)
        .await;
        match inserted {
            Err(sqlx::Error::Database(e))
                if e.is_unique_violation() && e.message().contains("replaces_certificate_id") =>
            {
                return Ok(InsertOrder::AlreadyReplaced);
            }
            other => {
                other?;
            }
        }
        let fresh: Vec<&NewAuthorization> = new
            .authorizations
            .iter()
            .filter_map(|a| match a {
                OrderAuthorization::New(authz) => Some(authz),
                OrderAuthorization::Reuse(_) => None,
            })
            .collect();
        if !fresh.is_empty() {
            sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                "INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value, wildcard, status, expires_at, created_at) ",
            )
            .push_values(&fresh, |mut row, authz| {
                row.push_bind(&authz.id)
                    .push_bind(&new.profile)
                    .push_bind(&new.account_id)
                    .push_bind(&authz.identifier.kind)
                    .push_bind(&authz.identifier.value)
                    .push_bind(authz.wildcard)
                    .push_bind("pending")
                    .push_bind(authz.expires_at)
                    .push_bind(new.now);
            })
            .build()
            .execute(&mut *tx)
            .await?;
            let challenges: Vec<(&str, &NewChallenge)> = fresh
                .iter()
                .flat_map(|a| a.challenges.iter().map(|ch| (a.id.as_str(), ch)))
                .collect();
            if !challenges.is_empty() {
                sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                    "INSERT INTO challenges (id, authz_id, type, token, status) ",
                )
                .push_values(&challenges, |mut row, (authz_id, ch)| {
                    row.push_bind(&ch.id)
                        .push_bind(*authz_id)
                        .push_bind(&ch.kind)
                        .push_bind(&ch.token)
                        .push_bind("pending");
                })
                .build()
                .execute(&mut *tx)
                .await?;
            }
        }
        let authorization_ids: Vec<String> = new
            .authorizations
            .iter()
            .map(|a| match a {
                OrderAuthorization::Reuse(id) => id.clone(),
                OrderAuthorization::New(authz) => authz.id.clone(),
            })
            .collect();
        if !authorization_ids.is_empty() {
            sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                "INSERT INTO order_authorizations (order_id, authz_id, position) ",
            )
            .push_values(
                authorization_ids.iter().enumerate(),
                |mut row, (position, id)| {
                    row.push_bind(&new.id)
                        .push_bind(id)
                        .push_bind(position as i64);
                },
            )
            .build()
            .execute(&mut *tx)
            .await?;
        }
        // Every authorization reused and valid: the order is ready at once
        // (RFC 8555 §7.1.6). A new authorization is pending, so the check is
        // needed only when all were reused.
        let mut status = "pending";
        if fresh.is_empty() {
            let ready = sqlx::query(
                "UPDATE orders SET status = 'ready' WHERE id = $1 AND status = 'pending'
                   AND NOT EXISTS (SELECT 1 FROM order_authorizations oa JOIN authorizations a ON a.id = oa.authz_id
                                   WHERE oa.order_id = orders.id AND a.status <> 'valid')",
            )
            .bind(&new.id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if ready == 1 {
                status = "ready";
            }
        }
        tx.commit().await?;
        Ok(InsertOrder::Inserted(Box::new(OrderRow {
            id: new.id.clone(),
            profile: new.profile.clone(),
            account_id: new.account_id.clone(),
            status: status.to_owned(),
            identifiers: new.identifiers.clone(),
            not_before: new.not_before,
            not_after: new.not_after,
            expires_at: new.expires_at,
            error: None,
            created_at: new.now,
            certificate_id: None,
            certificate_profile: new.certificate_profile.clone(),
            replaces: new.replaces.as_ref().map(|r| r.0.clone()),
            authorization_ids,
        })))
    }

    pub async fn order(&self, id: &str) -> Result<Option<OrderRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            order_columns!(),
            " FROM orders o LEFT JOIN certificates c ON c.order_id = o.id WHERE o.id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref().map(order_from_row).transpose()
    }

    /// One page of an account's order ids, oldest first (RFC 8555 §7.1.2.1).
    pub async fn account_order_ids(
        &self,
        account_id: &str,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM orders WHERE account_id = $1 ORDER BY created_at, id LIMIT $2 OFFSET $3",
        )
        .bind(account_id)
        .bind(limit)
        .bind(offset)
        .fetch_all(&mut *self.reader().await?)
        .await?)
    }

    pub async fn authorization(&self, id: &str) -> Result<Option<AuthorizationRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            authz_columns!(),
            " FROM authorizations a WHERE a.id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref().map(authz_from_row).transpose()
    }

    pub async fn challenges_of(&self, authz_id: &str) -> Result<Vec<ChallengeRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            challenge_columns!(),
            " FROM challenges ch WHERE ch.authz_id = $1 ORDER BY ch.rowid"
        ))
        .bind(authz_id)
        .fetch_all(&mut *self.reader().await?)
        .await?;
        rows.iter().map(challenge_from_row).collect()
    }

    pub async fn challenge(&self, id: &str) -> Result<Option<ChallengeRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            challenge_columns!(),
            " FROM challenges ch WHERE ch.id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref().map(challenge_from_row).transpose()
    }

    /// An authorization with its challenges, in one statement.
    pub async fn authorization_with_challenges(
        &self,
        id: &str,
    ) -> Result<Option<(AuthorizationRow, Vec<ChallengeRow>)>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            authz_columns!(),
            ", ",
            joined_challenge_columns!(),
            " FROM authorizations a LEFT JOIN challenges ch ON ch.authz_id = a.id
              WHERE a.id = $1 ORDER BY ch.rowid"
        ))
        .bind(id)
        .fetch_all(&mut *self.reader().await?)
        .await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let authz = authz_from_row(first)?;
        let mut challenges = Vec::with_capacity(rows.len());
        for row in &rows {
            // LEFT JOIN: an authorization without challenges is one row of NULLs.
            if row.try_get::<Option<String>, _>("ch_id")?.is_some() {
                challenges.push(joined_challenge_from_row(row)?);
            }
        }
        Ok(Some((authz, challenges)))
    }

    /// A challenge with its authorization, in one statement.
    pub async fn challenge_with_authorization(
        &self,
        id: &str,
    ) -> Result<Option<(ChallengeRow, AuthorizationRow)>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            authz_columns!(),
            ", ",
            joined_challenge_columns!(),
            " FROM challenges ch JOIN authorizations a ON a.id = ch.authz_id WHERE ch.id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref()
            .map(|row| Ok((joined_challenge_from_row(row)?, authz_from_row(row)?)))
            .transpose()
    }

    /// A valid authorization of `account_id` for `identifier` (same wildcard
    /// flag) that was validated at or after `validated_since` and stays valid
    /// past `valid_past`: one a new order may reuse.
    #[allow(clippy::too_many_arguments)]
    pub async fn reusable_authorization(
        &self,
        profile: &str,
        account_id: &str,
        identifier: &Identifier,
        wildcard: bool,
        validated_since: i64,
        valid_past: i64,
    ) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "SELECT a.id FROM authorizations a
             WHERE a.profile = $1 AND a.account_id = $2 AND a.identifier_type = $3 AND a.identifier_value = $4
               AND a.wildcard = $5 AND a.status = 'valid' AND a.expires_at > $6
               AND EXISTS (SELECT 1 FROM challenges ch WHERE ch.authz_id = a.id AND ch.status = 'valid'
                           AND ch.validated_at >= $7)
             ORDER BY a.expires_at DESC LIMIT 1",
        )
        .bind(profile)
        .bind(account_id)
        .bind(&identifier.kind)
        .bind(&identifier.value)
        .bind(wildcard)
        .bind(valid_past)
        .bind(validated_since)
        .fetch_optional(&mut *self.reader().await?)
        .await?)
    }

    /// Whether `account_id` holds a valid, unexpired authorization for
    /// `identifier` at `profile` (RFC 8555 §7.6 revocation by an account that
    /// controls every name).
    pub async fn has_valid_authorization(
        &self,
        profile: &str,
        account_id: &str,
        identifier: &Identifier,
        wildcard: bool,
        now: i64,
    ) -> Result<bool> {
        let found: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM authorizations WHERE profile = $1 AND account_id = $2 AND identifier_type = $3
             AND identifier_value = $4 AND wildcard = $5 AND status = 'valid' AND expires_at > $6 LIMIT 1",
        )
        .bind(profile)
        .bind(account_id)
        .bind(&identifier.kind)
        .bind(&identifier.value)
        .bind(wildcard)
        .bind(now)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        Ok(found.is_some())
    }

    /// pending → processing for a challenge whose authorization is still
    /// pending and unexpired. False if another request got there first or
    /// the authorization moved on (RFC 8555 §7.5.1).
    pub async fn start_challenge(&self, challenge_id: &str, now: i64) -> Result<bool> {
        Ok(sqlx::query(START_CHALLENGE)
            .bind(challenge_id)
            .bind(now)
            .execute(&mut *self.writer().await?)
            .await?
            .rows_affected()
            == 1)
    }

    /// pending → processing (as [`Store::start_challenge`]) and the job that
    /// will validate it, in one transaction: a challenge is never left
    /// processing without the work that settles it.
    pub async fn start_challenge_with_job(
        &self,
        challenge_id: &str,
        now: i64,
        job: &crate::NewJob<'_>,
        now_ms: i64,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let started = sqlx::query(START_CHALLENGE)
            .bind(challenge_id)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        if !started {
            return Ok(false);
        }
        crate::jobs::insert_job_in(&mut *tx, job, now_ms).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records a validation outcome and moves the authorization and every
    /// order that contains it, in one transaction:
    ///
    /// - valid: challenge valid, authorization valid (its expiry becomes
    ///   `valid_until`), each pending order whose authorizations are now all
    ///   valid becomes ready;
    /// - invalid: challenge invalid with `error`, authorization invalid, each
    ///   pending order containing it invalid (RFC 8555 §7.1.6).
    ///
    /// Returns false (and changes nothing, `notices` included) if the
    /// challenge was not processing any more; otherwise `notices` are
    /// queued in the same transaction.
    pub async fn settle_challenge(
        &self,
        challenge_id: &str,
        outcome: std::result::Result<(), &Problem>,
        now: i64,
        valid_until: i64,
        notices: &[NewJob<'_>],
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        // The guarded change and the read of its authorization are one
        // statement.
        let authz_id: Option<String> = match outcome {
            Ok(()) => sqlx::query_scalar(
                "UPDATE challenges SET status = 'valid', validated_at = $1
                 WHERE id = $2 AND status = 'processing' RETURNING authz_id",
            )
            .bind(now)
            .bind(challenge_id),
            Err(problem) => sqlx::query_scalar(
                "UPDATE challenges SET status = 'invalid', error = $1
                 WHERE id = $2 AND status = 'processing' RETURNING authz_id",
            )
            .bind(to_json(problem))
            .bind(challenge_id),
        }
        .fetch_optional(&mut *tx)
        .await?;
        let Some(authz_id) = authz_id else {
            return Ok(false);
        };
        match outcome {
            Ok(()) => validate_authorization_in(&mut tx, &authz_id, valid_until).await?,
            Err(problem) => {
                sqlx::query("UPDATE authorizations SET status = 'invalid' WHERE id = $1 AND status = 'pending'")
                    .bind(&authz_id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "UPDATE orders SET status = 'invalid', error = $1
                     WHERE status = 'pending'
                       AND id IN (SELECT order_id FROM order_authorizations WHERE authz_id = $2)",
                )
                .bind(to_json(problem))
                .bind(&authz_id)
                .execute(&mut *tx)
                .await?;
            }
        }
        insert_jobs_in(&mut tx, notices).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// pending → valid for a challenge at once, with its authorization and
    /// orders as [`Store::settle_challenge`] moves them: validation bypass,
    /// for tests. Guarded as [`Store::start_challenge`]: false (nothing
    /// written) if another request got there first or the authorization is
    /// no longer pending and unexpired.
    pub async fn bypass_challenge(
        &self,
        challenge_id: &str,
        now: i64,
        valid_until: i64,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let authz_id: Option<String> = sqlx::query_scalar(
            "UPDATE challenges SET status = 'valid', validated_at = $2
             WHERE id = $1 AND status = 'pending'
               AND EXISTS (SELECT 1 FROM authorizations a WHERE a.id = challenges.authz_id
                           AND a.status = 'pending' AND a.expires_at > $2)
             RETURNING authz_id",
        )
        .bind(challenge_id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(authz_id) = authz_id else {
            return Ok(false);
        };
        validate_authorization_in(&mut tx, &authz_id, valid_until).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// pending|valid → deactivated for an authorization (RFC 8555 §7.5.2);
    /// its unfinished orders become invalid. False if it was neither.
    pub async fn deactivate_authorization(&self, authz_id: &str) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = sqlx::query(
            "UPDATE authorizations SET status = 'deactivated' WHERE id = $1 AND status IN ('pending', 'valid')",
        )
        .bind(authz_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if changed {
            sqlx::query(
                "UPDATE orders SET status = 'invalid'
                 WHERE status IN ('pending', 'ready')
                   AND id IN (SELECT order_id FROM order_authorizations WHERE authz_id = $1)",
            )
            .bind(authz_id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Marks an order invalid because it expired (RFC 8555 §7.1.6), together
    /// with its authorizations that were still pending.
    /// Expires the orders replacing certificate `certificate_id` whose
    /// lifetime has passed but that nobody has read since (expiry is lazy),
    /// so that an abandoned renewal does not hold the certificate in the
    /// `orders_replacing` index for ever. Returns how many.
    pub async fn expire_replacing_orders(
        &self,
        certificate_id: &str,
        now: i64,
        error: &Problem,
    ) -> Result<u64> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM orders
             WHERE replaces_certificate_id = $1 AND status IN ('pending', 'ready') AND expires_at <= $2",
        )
        .bind(certificate_id)
        .bind(now)
        .fetch_all(&mut *self.reader().await?)
        .await?;
        let mut n = 0;
        for id in ids {
            if self.expire_order(&id, now, error).await? {
                n += 1;
            }
        }
        Ok(n)
    }

    pub async fn expire_order(&self, order_id: &str, now: i64, error: &Problem) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = sqlx::query(
            "UPDATE orders SET status = 'invalid', error = $1
             WHERE id = $2 AND status IN ('pending', 'ready') AND expires_at <= $3",
        )
        .bind(to_json(error))
        .bind(order_id)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if changed {
            sqlx::query(
                "UPDATE authorizations SET status = 'expired'
                 WHERE status = 'pending' AND expires_at <= $1
                   AND id IN (SELECT authz_id FROM order_authorizations WHERE order_id = $2)",
            )
            .bind(now)
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// ready → processing, guarded: of two concurrent finalize requests
    /// exactly one gets `true` (RFC 8555 §7.4).
    pub async fn begin_finalize(&self, order_id: &str) -> Result<bool> {
        Ok(sqlx::query(
            "UPDATE orders SET status = 'processing' WHERE id = $1 AND status = 'ready'",
        )
        .bind(order_id)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
    }

    /// processing → ready: the signer refused the CSR, the client may try
    /// again with a better one (RFC 8555 §7.4 badCSR).
    pub async fn abort_finalize(&self, order_id: &str) -> Result<bool> {
        Ok(sqlx::query(
            "UPDATE orders SET status = 'ready' WHERE id = $1 AND status = 'processing'",
        )
        .bind(order_id)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
    }

    /// processing → invalid with an error the client will see.
    pub async fn fail_order(&self, order_id: &str, error: &Problem) -> Result<bool> {
        Ok(sqlx::query(
            "UPDATE orders SET status = 'invalid', error = $1 WHERE id = $2 AND status = 'processing'",
        )
        .bind(to_json(error))
        .bind(order_id)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
    }

    /// Challenges left `processing` without a live job of `job_kind` whose
    /// key is the challenge id (e.g. the job row was lost), oldest
    /// authorization first, to be queued again at start-up.
    pub async fn orphaned_processing_challenges(
        &self,
        job_kind: &str,
        limit: i64,
    ) -> Result<Vec<ProcessingChallenge>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            challenge_columns!(),
            ", ",
            authz_columns!(),
            " FROM challenges ch
             JOIN authorizations a ON a.id = ch.authz_id
             WHERE ch.status = 'processing'
               AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.kind = $2 AND j.key = ch.id
                               AND j.status IN ('queued', 'running', 'retiring'))
             ORDER BY a.created_at, ch.id
             LIMIT $1"
        ))
        .bind(limit)
        .bind(job_kind)
        .fetch_all(&mut *self.reader().await?)
        .await?;
        rows.iter()
            .map(|row| {
                // The column lists share "id" and "status": read the
                // challenge's by position-aware names.
                Ok(ProcessingChallenge {
                    challenge: ChallengeRow {
                        id: row.try_get(0)?,
                        authz_id: row.try_get(1)?,
                        kind: row.try_get(2)?,
                        token: row.try_get(3)?,
                        status: row.try_get(4)?,
                        validated_at: row.try_get(5)?,
                        error: problem(row.try_get(6)?)?,
                    },
                    authorization: AuthorizationRow {
                        id: row.try_get(7)?,
                        profile: row.try_get(8)?,
                        account_id: row.try_get(9)?,
                        identifier: Identifier {
                            kind: row.try_get(10)?,
                            value: row.try_get(11)?,
                        },
                        wildcard: row.try_get(12)?,
                        status: row.try_get(13)?,
                        expires_at: row.try_get(14)?,
                        created_at: row.try_get(15)?,
                    },
                })
            })
            .collect()
    }
}

impl Store {
    /// Orders for operators, newest first.
    pub async fn list_orders(
        &self,
        profile: Option<&str>,
        account: Option<&str>,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<OrderRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            order_columns!(),
            " FROM orders o LEFT JOIN certificates c ON c.order_id = o.id
              WHERE ($1 IS NULL OR o.profile = $1) AND ($2 IS NULL OR o.account_id = $2)
                AND ($3 IS NULL OR o.status = $3)
              ORDER BY o.created_at DESC, o.id DESC LIMIT $4"
        ))
        .bind(profile)
        .bind(account)
        .bind(status)
        .bind(limit)
        .fetch_all(&mut *self.reader().await?)
        .await?;
        rows.iter().map(order_from_row).collect()
    }
}
