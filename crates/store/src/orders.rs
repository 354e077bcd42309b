//! Orders, authorizations and challenges (RFC 8555 §7.1.3–§7.1.6, §7.4, §7.5).
//!
//! Every status change is a guarded statement inside one transaction that
//! also moves whatever depends on it (challenge → authorization → orders),
//! so readers never see a valid challenge under a pending authorization.

use acme_proxy_protocol::types::{
    AuthorizationStatus, ChallengeStatus, ChallengeType, Identifier, OrderStatus,
};
use acme_proxy_protocol::{Problem, ProblemType};

use crate::accounts::account_changed_raised;
use crate::audit::insert_audit_in;
use crate::db::{Conn, Row, args, col, col_enum};
use crate::jobs::{insert_job_in, insert_jobs_in};
use crate::{AccountGuard, NewAuditRow, NewJob, Result, Store, StoreError, to_json};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderRow {
    pub id: String,
    pub profile: String,
    pub account_id: String,
    pub status: OrderStatus,
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
    pub status: AuthorizationStatus,
    pub expires_at: i64,
    pub created_at: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChallengeRow {
    pub id: String,
    pub authz_id: String,
    pub kind: ChallengeType,
    pub token: String,
    pub status: ChallengeStatus,
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
    pub kind: ChallengeType,
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
    pub authorizations: Vec<NewAuthorization>,
    /// Authorization reuse: when set, an authorization of the account for
    /// the same identifier (and wildcard flag), valid, validated at or
    /// after this time and valid past the order's expiry, is linked in
    /// place of the new one, which is then not written.
    pub reuse_validated_since: Option<i64>,
    pub certificate_profile: Option<String>,
    /// (certificate identifier as sent, id of the certificate it names).
    pub replaces: Option<(String, String)>,
    /// The most pending, unexpired authorizations the account may have at
    /// the profile, this order's identifiers counted in: the count is
    /// taken by the write itself, so that checking it costs no round trip
    /// of its own ([`InsertOrder::TooManyPending`]).
    pub max_pending_authorizations: i64,
}

/// An order with its authorizations, each with its challenges
/// ([`Store::order_with_authorizations`]).
pub type OrderAuthorizations = (OrderRow, Vec<(AuthorizationRow, Vec<ChallengeRow>)>);

/// What [`Store::insert_order`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InsertOrder {
    /// The order as written (no need to read it back).
    Inserted(Box<OrderRow>),
    /// RFC 9773 §5: another order that is not invalid already replaces the
    /// certificate named by `replaces`; nothing was written.
    AlreadyReplaced,
    /// The account has `pending` pending, unexpired authorizations at the
    /// profile: this order's would take it past
    /// [`NewOrderRow::max_pending_authorizations`]. Nothing was written.
    TooManyPending { pending: i64 },
}

/// Whether `pending` authorizations and the order's own stay within its cap.
fn within_pending_cap(new: &NewOrderRow, pending: i64) -> bool {
    let asked = i64::try_from(new.identifiers.len()).unwrap_or(i64::MAX);
    pending.saturating_add(asked) <= new.max_pending_authorizations
}

/// pending → processing for a challenge whose authorization is still
/// pending and unexpired (?1 challenge id, ?2 now).
macro_rules! start_challenge {
    () => {
        "UPDATE challenges SET status = 'processing'
          WHERE id = ?1 AND status = 'pending'
            AND EXISTS (SELECT 1 FROM authorizations a WHERE a.id = challenges.authz_id
                        AND a.status = 'pending' AND a.expires_at > ?2)"
    };
}
const START_CHALLENGE: &str = start_challenge!();

/// A valid authorization that a new order may reuse (?1 profile, ?2
/// account, ?3 identifier type, ?4 value, ?5 wildcard flag): it stays
/// valid past ?6 (the order's expiry) and its challenge was validated at
/// or after ?7; the one that lives longest.
macro_rules! reusable_authorization {
    () => {
        "SELECT a.id FROM authorizations a
     WHERE a.profile = ?1 AND a.account_id = ?2 AND a.identifier_type = ?3 AND a.identifier_value = ?4
       AND a.wildcard = ?5 AND a.status = 'valid' AND a.expires_at > ?6
       AND EXISTS (SELECT 1 FROM challenges ch WHERE ch.authz_id = a.id AND ch.status = 'valid'
                   AND ch.validated_at >= ?7)
     ORDER BY a.expires_at DESC LIMIT 1"
    };
}

/// pending → ready for an order (?1) whose authorizations are all valid
/// (RFC 8555 §7.1.6).
const READY_WHEN_ALL_VALID: &str = "UPDATE orders SET status = 'ready' WHERE id = ?1 AND status = 'pending'
     AND NOT EXISTS (SELECT 1 FROM order_authorizations oa JOIN authorizations a ON a.id = oa.authz_id
                     WHERE oa.order_id = orders.id AND a.status <> 'valid')";

/// ready → processing for an order being finalized (?1 order id): of two
/// concurrent finalizes exactly one changes the row.
/// ready → processing at `?2` (Unix milliseconds), guarded.
pub(crate) const BEGIN_FINALIZE: &str = "UPDATE orders SET status = 'processing', processing_since = ?2 WHERE id = ?1 AND status = 'ready'";

// Read by position in `order_from_row`: a column added goes at the end.
macro_rules! order_columns {
    () => {
        "o.id, o.profile, o.account_id, o.status, o.identifiers, o.not_before, \
     o.not_after, o.expires_at, o.error, o.created_at, o.certificate_id, \
     o.certificate_profile, o.replaces, o.authorization_ids"
    };
}
// Read by position in `authz_at` and `challenge_at`: a column added goes at
// the end, and the count beside each reader changes with it.
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

/// A row of `order_columns!`, read by position (an issuance reads several).
fn order_from_row(row: Row<'_>) -> Result<OrderRow> {
    let identifiers: String = col(row, 4, "identifiers")?;
    Ok(OrderRow {
        id: col(row, 0, "id")?,
        profile: col(row, 1, "profile")?,
        account_id: col(row, 2, "account_id")?,
        status: col_enum(row, 3, "status", "orders.status")?,
        identifiers: serde_json::from_str(&identifiers)
            .map_err(|e| StoreError::Corrupt(format!("identifiers: {e}")))?,
        not_before: col(row, 5, "not_before")?,
        not_after: col(row, 6, "not_after")?,
        expires_at: col(row, 7, "expires_at")?,
        error: problem(col(row, 8, "error")?)?,
        created_at: col(row, 9, "created_at")?,
        certificate_id: col(row, 10, "certificate_id")?,
        certificate_profile: col(row, 11, "certificate_profile")?,
        replaces: col(row, 12, "replaces")?,
        authorization_ids: crate::json_vec(&col::<String>(row, 13, "authorization_ids")?)?,
    })
}

/// An authorization whose `authz_columns!()` start at column `at`, read by
/// position (twice per issuance: with its challenges, and with the one
/// challenge answered).
fn authz_at(row: Row<'_>, at: usize) -> Result<AuthorizationRow> {
    Ok(AuthorizationRow {
        id: col(row, at, "id")?,
        profile: col(row, at + 1, "profile")?,
        account_id: col(row, at + 2, "account_id")?,
        identifier: Identifier {
            kind: col_enum(
                row,
                at + 3,
                "identifier_type",
                "authorizations.identifier_type",
            )?,
            value: col(row, at + 4, "identifier_value")?,
        },
        wildcard: col(row, at + 5, "wildcard")?,
        status: col_enum(row, at + 6, "status", "authorizations.status")?,
        expires_at: col(row, at + 7, "expires_at")?,
        created_at: col(row, at + 8, "created_at")?,
    })
}

/// How many columns `authz_columns!()` has: where a challenge's start after it.
const AUTHZ_COLUMNS: usize = 9;

/// A challenge whose `challenge_columns!()` start at column `at`.
fn challenge_at(row: Row<'_>, at: usize) -> Result<ChallengeRow> {
    Ok(ChallengeRow {
        id: col(row, at, "id")?,
        authz_id: col(row, at + 1, "authz_id")?,
        kind: col_enum(row, at + 2, "type", "challenges.type")?,
        token: col(row, at + 3, "token")?,
        status: col_enum(row, at + 4, "status", "challenges.status")?,
        validated_at: col(row, at + 5, "validated_at")?,
        error: problem(col(row, at + 6, "error")?)?,
    })
}

/// How many columns `challenge_columns!()` has.
const CHALLENGE_COLUMNS: usize = 7;

/// A challenge with its authorization, as `conn`'s transaction sees them.
async fn challenge_with_authorization_in(
    conn: &mut Conn<'_>,
    id: &str,
) -> Result<Option<(ChallengeRow, AuthorizationRow)>> {
    conn.one(
        concat!(
            "SELECT ",
            authz_columns!(),
            ", ",
            challenge_columns!(),
            " FROM challenges ch JOIN authorizations a ON a.id = ch.authz_id WHERE ch.id = ?1"
        ),
        args![id],
        |row| Ok((challenge_at(row, AUTHZ_COLUMNS)?, authz_at(row, 0)?)),
    )
    .await
}

/// A challenge of `authz_id` just became valid: the authorization becomes
/// valid until `valid_until`, and each pending order whose authorizations
/// are now all valid becomes ready (RFC 8555 §7.1.6).
async fn validate_authorization_in(
    conn: &mut Conn<'_>,
    authz_id: &str,
    valid_until: i64,
) -> Result<()> {
    if conn.is_postgres() {
        // These statements as one function (migration 0022), which also
        // locks the pending orders first, in one order (so that two
        // lockers queue instead of deadlocking): two of an order's
        // authorizations validated at once would otherwise each see the
        // other still pending, and the order would stay pending with every
        // authorization valid. SQLite's single writer makes the second see
        // the first.
        conn.exec(
            "SELECT acme_validate_authorization(?1, ?2)",
            args![authz_id, valid_until],
        )
        .await?;
        return Ok(());
    }
    let moved = conn.exec(
        "UPDATE authorizations SET status = 'valid', expires_at = ?1 WHERE id = ?2 AND status = 'pending'",
        args![valid_until, authz_id],
    ).await?;
    if moved == 1 {
        // The orders first, then each by its key: as one statement, the
        // `id IN (SELECT …)` filled a temporary b-tree on every run.
        let order_ids: Vec<String> = conn
            .all(
                "SELECT order_id FROM order_authorizations WHERE authz_id = ?1",
                args![authz_id],
                |row| row.get(0),
            )
            .await?;
        for order_id in order_ids {
            conn.exec(READY_WHEN_ALL_VALID, args![order_id]).await?;
        }
    }
    Ok(())
}

/// The columns of `order_columns!`.
const ORDER_COLUMNS: usize = 14;

/// [`Store::order_with_authorizations`] on PostgreSQL: the order's row
/// repeated on each of its authorizations' challenges, in the order's
/// order and each authorization's challenges in the order they were made.
const ORDER_WITH_AUTHORIZATIONS_POSTGRES: &str = concat!(
    "SELECT ",
    order_columns!(),
    ", ",
    authz_columns!(),
    ", ",
    challenge_columns!(),
    " FROM orders o
      LEFT JOIN order_authorizations oa ON oa.order_id = o.id
      LEFT JOIN authorizations a ON a.id = oa.authz_id
      LEFT JOIN challenges ch ON ch.authz_id = a.id
     WHERE o.id = ?1
     ORDER BY oa.position, ch.seq"
);

/// [`Store::bypass_challenge`] on PostgreSQL: its transaction as one
/// function (migration 0022), the rows it returns read as
/// [`challenge_with_authorization_in`] reads them.
const BYPASS_CHALLENGE_POSTGRES: &str = concat!(
    "SELECT ",
    authz_columns!(),
    ", ",
    challenge_columns!(),
    " FROM acme_bypass_challenge(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) AS moved,
      LATERAL (SELECT (moved.authz).*) AS a, LATERAL (SELECT (moved.challenge).*) AS ch"
);

/// An authorization and its challenges, one row per challenge (its
/// order appended by each engine).
macro_rules! authz_with_challenges {
    () => {
        concat!(
            "SELECT ",
            authz_columns!(),
            ", ",
            challenge_columns!(),
            " FROM authorizations a LEFT JOIN challenges ch ON ch.authz_id = a.id WHERE a.id = ?1"
        )
    };
}

/// The order [`Store::insert_order`] wrote, as it wrote it.
fn inserted_order(
    new: &NewOrderRow,
    status: OrderStatus,
    authorization_ids: Vec<String>,
) -> InsertOrder {
    InsertOrder::Inserted(Box::new(OrderRow {
        id: new.id.clone(),
        profile: new.profile.clone(),
        account_id: new.account_id.clone(),
        status,
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
    }))
}

/// [`Store::insert_order`] on PostgreSQL for an order whose authorizations
/// are all new (no reuse asked for): the account's check, the order, its
/// authorizations, their challenges and the links as one statement, so one
/// round trip where the transaction takes seven for one name. Each round
/// trip costs both processes about 57 µs of CPU on a shared 2-core host
/// (docs/performance.md). Sub-statements of one `WITH` see one snapshot
/// and none of each other's rows, which nothing here needs: every row is
/// new, and the foreign keys are checked at the statement's end, after
/// every row is in. Every insert hangs off `o`, which is empty unless the
/// account is valid with its key (locked, as `check_in` locks it) and its
/// pending authorizations, counted in the same snapshot, leave room for
/// this order's, so an account that changed or is at its cap gets nothing
/// written.
async fn insert_fresh_order_postgres(
    conn: &mut Conn<'_>,
    new: &NewOrderRow,
    account: AccountGuard<'_>,
) -> Result<InsertOrder> {
    #[derive(serde::Serialize)]
    struct Authz<'a> {
        id: &'a str,
        kind: &'a str,
        value: &'a str,
        wildcard: bool,
        expires_at: i64,
    }
    #[derive(serde::Serialize)]
    struct Challenge<'a> {
        id: &'a str,
        authz_id: &'a str,
        kind: &'a str,
        token: &'a str,
    }
    let authorizations: Vec<Authz<'_>> = new
        .authorizations
        .iter()
        .map(|a| Authz {
            id: &a.id,
            kind: a.identifier.kind.as_str(),
            value: &a.identifier.value,
            wildcard: a.wildcard,
            expires_at: a.expires_at,
        })
        .collect();
    let challenges: Vec<Challenge<'_>> = new
        .authorizations
        .iter()
        .flat_map(|a| {
            a.challenges.iter().map(|ch| Challenge {
                id: &ch.id,
                authz_id: &a.id,
                kind: ch.kind.as_str(),
                token: &ch.token,
            })
        })
        .collect();
    let authorization_ids: Vec<String> = new.authorizations.iter().map(|a| a.id.clone()).collect();
    let asked = i64::try_from(new.identifiers.len()).unwrap_or(i64::MAX);
    let written = conn
        .one(
            "WITH account AS (
                 SELECT 1 FROM accounts WHERE id = ?16 AND key_thumbprint = ?13 AND status = 'valid' FOR SHARE
             ), pending AS (
                 SELECT COUNT(*) AS n FROM authorizations
                  WHERE account_id = ?3 AND profile = ?2 AND status = 'pending' AND expires_at > ?8
             ), o AS (
                 INSERT INTO orders (id, profile, account_id, status, identifiers, not_before, not_after, expires_at, created_at,
                                     certificate_profile, replaces, replaces_certificate_id, authorization_ids)
                 SELECT ?1, ?2, ?3, 'pending', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12 FROM account, pending
                  WHERE pending.n + ?17 <= ?18
                 RETURNING id
             ), a AS (
                 INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value, wildcard, status, expires_at, created_at)
                 SELECT x.id, ?2, ?3, x.kind, x.value, x.wildcard, 'pending', x.expires_at, ?8
                   FROM o, jsonb_to_recordset(?14::jsonb) AS x(id text, kind text, value text, wildcard boolean, expires_at bigint)
             ), c AS (
                 INSERT INTO challenges (id, authz_id, type, token, status)
                 SELECT x.id, x.authz_id, x.kind, x.token, 'pending'
                   FROM o, ROWS FROM (jsonb_to_recordset(?15::jsonb) AS (id text, authz_id text, kind text, token text))
                        WITH ORDINALITY AS x(id, authz_id, kind, token, n)
                  ORDER BY x.n
             ), l AS (
                 INSERT INTO order_authorizations (order_id, authz_id, position)
                 SELECT o.id, x.authz_id, x.n - 1
                   FROM o, jsonb_array_elements_text(?12::jsonb) WITH ORDINALITY AS x(authz_id, n)
             )
             SELECT (SELECT COUNT(*) FROM account), (SELECT n FROM pending), (SELECT COUNT(*) FROM o)",
            args![
                new.id,
                new.profile,
                new.account_id,
                to_json(&new.identifiers),
                new.not_before,
                new.not_after,
                new.expires_at,
                new.now,
                new.certificate_profile,
                new.replaces.as_ref().map(|r| &r.0),
                new.replaces.as_ref().map(|r| &r.1),
                to_json(&authorization_ids),
                account.key_thumbprint,
                to_json(&authorizations),
                to_json(&challenges),
                account.id,
                asked,
                new.max_pending_authorizations,
            ],
            |row| Ok((row.get::<i64>(0)?, row.get::<i64>(1)?, row.get::<i64>(2)?)),
        )
        .await;
    match written {
        Err(e) if e.is_unique_violation_of("replaces_certificate_id", "orders_replacing") => {
            Ok(InsertOrder::AlreadyReplaced)
        }
        Err(e) => Err(e),
        Ok(Some((1, _, 1))) => Ok(inserted_order(new, OrderStatus::Pending, authorization_ids)),
        Ok(Some((1, pending, _))) if !within_pending_cap(new, pending) => {
            Ok(InsertOrder::TooManyPending { pending })
        }
        Ok(_) => Err(StoreError::AccountChanged),
    }
}

/// What a challenge that passed says once its authorization has stopped
/// accepting responses ([`Store::settle_challenge`]).
fn late_challenge() -> Problem {
    Problem::new(
        ProblemType::Malformed,
        "the authorization stopped accepting challenge responses (another challenge of it failed, or it was deactivated or expired) before this validation finished",
    )
}

/// [`Store::settle_challenge`] on PostgreSQL: its transaction as one
/// function (migration 0023), and the notices queued only when it returns
/// true, in one statement. The function runs once, first: the insert
/// reads its answer.
const SETTLE_CHALLENGE_POSTGRES: &str = concat!(
    "WITH done AS MATERIALIZED (
         SELECT acme_settle_challenge(?1, ?2, ?3, ?4, ?5) AS ok
     ),
     queued AS (",
    crate::jobs::insert_jobs_postgres!("?6"),
    ")
     SELECT ok FROM done"
);

/// [`Store::start_challenge_with_job`] on PostgreSQL: the account's check,
/// the challenge's step and its job as one statement, one round trip
/// where the transaction takes five. The step hangs off `account`, which
/// is empty unless the account is valid with its key (locked, as
/// `check_in` locks it), and the job off the step; the step is
/// [`START_CHALLENGE`] with that condition added. The statement's one
/// snapshot is taken before the account's lock is waited for, where the
/// transaction's next statement took a new one; that is safe because
/// every write that locks an account and changes its authorizations
/// (deactivation, deletion) also changes or deletes the account row, which
/// the lock then sees: the step is not taken.
async fn start_challenge_with_job_postgres(
    conn: &mut Conn<'_>,
    challenge_id: &str,
    now: i64,
    job: &crate::NewJob<'_>,
    now_ms: i64,
    account: AccountGuard<'_>,
) -> Result<bool> {
    let moved = conn
        .one(
            concat!(
                "WITH account AS (
                     SELECT 1 FROM accounts WHERE id = ?3 AND key_thumbprint = ?4 AND status = 'valid' FOR SHARE
                 ), started AS (",
                start_challenge!(),
                "       AND EXISTS (SELECT 1 FROM account)
                     RETURNING 1
                 ), queued AS (
                 INSERT INTO jobs (kind, key, payload, status, attempts, max_attempts, run_at, deadline, created_at, updated_at, fair_key)
                 SELECT ?5, ?6, ?7, 'queued', 0, ?8, ?9, ?10, ?11, ?11, ?12 FROM started
                 ON CONFLICT (kind, key) WHERE (status = 'queued' OR status = 'running' OR status = 'retiring') DO NOTHING
             )
             SELECT (SELECT COUNT(*) FROM account), (SELECT COUNT(*) FROM started)"
            ),
            args![
                challenge_id,
                now,
                account.id,
                account.key_thumbprint,
                job.kind,
                job.key,
                job.payload,
                job.max_attempts,
                job.run_at,
                job.deadline,
                now_ms,
                job.fair_key,
            ],
            |row| Ok((row.get::<i64>(0)?, row.get::<i64>(1)?)),
        )
        .await?;
    match moved {
        Some((1, started)) => Ok(started == 1),
        _ => Err(StoreError::AccountChanged),
    }
}

impl Store {
    /// Creates an order with its authorizations and their challenges, in one
    /// transaction: one single-row `INSERT` per order, new authorization,
    /// challenge and order–authorization link (each statement prepared once
    /// and cached; on SQLite statements run on this thread, so there is no
    /// round trip for batching rows to save), with reused authorizations
    /// linked instead of new ones when `reuse_validated_since` asks for
    /// them. On PostgreSQL, when none may be reused, all of it is one
    /// statement instead ([`insert_fresh_order_postgres`]). Returns the
    /// order as written, or, writing nothing,
    /// [`InsertOrder::AlreadyReplaced`] or [`InsertOrder::TooManyPending`].
    ///
    /// Errs with [`StoreError::AccountChanged`], writing nothing, unless
    /// `account` is still valid with its key.
    pub async fn insert_order(
        &self,
        new: &NewOrderRow,
        account: AccountGuard<'_>,
    ) -> Result<InsertOrder> {
        if self.is_postgres() && new.reuse_validated_since.is_none() {
            // One statement, which carries the request's nonce.
            let mut conn = self.carrying_writer().await?;
            return insert_fresh_order_postgres(&mut conn, new, account).await;
        }
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        account.check_in(&mut tx).await?;
        // Counted in the transaction that writes: on SQLite no other
        // writer can add one in between; on PostgreSQL (authorization
        // reuse) orders racing may pass the cap as the one-statement
        // insert's may.
        let pending = tx
            .scalar::<i64>(
                "SELECT COUNT(*) FROM authorizations
                  WHERE account_id = ?1 AND profile = ?2 AND status = 'pending' AND expires_at > ?3",
                args![new.account_id, new.profile, new.now],
            )
            .await?
            .unwrap_or(0);
        if !within_pending_cap(new, pending) {
            return Ok(InsertOrder::TooManyPending { pending });
        }
        // Reusable authorizations are looked up in the transaction that
        // links them: no read transaction of its own per identifier, and no
        // window in which the one found could change before it is linked.
        let mut fresh: Vec<&NewAuthorization> = Vec::with_capacity(new.authorizations.len());
        let mut authorization_ids: Vec<String> = Vec::with_capacity(new.authorizations.len());
        for authz in &new.authorizations {
            let reused = match new.reuse_validated_since {
                Some(since) => {
                    // Locked on PostgreSQL, so that a deactivation of it
                    // waits until the link exists, and then finds it.
                    let sql = if tx.is_postgres() {
                        concat!(reusable_authorization!(), " FOR SHARE OF a")
                    } else {
                        reusable_authorization!()
                    };
                    tx.scalar::<String>(
                        sql,
                        args![
                            new.profile,
                            new.account_id,
                            authz.identifier.kind.as_str(),
                            authz.identifier.value,
                            authz.wildcard,
                            new.expires_at,
                            since,
                        ],
                    )
                    .await?
                }
                None => None,
            };
            match reused {
                Some(id) => authorization_ids.push(id),
                None => {
                    fresh.push(authz);
                    authorization_ids.push(authz.id.clone());
                }
            }
        }
        let inserted = tx.exec(
            "INSERT INTO orders (id, profile, account_id, status, identifiers, not_before, not_after, expires_at, created_at,
                                 certificate_profile, replaces, replaces_certificate_id, authorization_ids)
             VALUES (?1, ?2, ?3, 'pending', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            args![
                new.id,
                new.profile,
                new.account_id,
                to_json(&new.identifiers),
                new.not_before,
                new.not_after,
                new.expires_at,
                new.now,
                new.certificate_profile,
                new.replaces.as_ref().map(|r| &r.0),
                new.replaces.as_ref().map(|r| &r.1),
                to_json(&authorization_ids),
            ],
        ).await;
        match inserted {
            Err(e) if e.is_unique_violation_of("replaces_certificate_id", "orders_replacing") => {
                return Ok(InsertOrder::AlreadyReplaced);
            }
            other => {
                other?;
            }
        }
        for authz in &fresh {
            tx.exec(
                "INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value, wildcard, status, expires_at, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7, ?8)",
                args![
                    authz.id,
                    new.profile,
                    new.account_id,
                    authz.identifier.kind.as_str(),
                    authz.identifier.value,
                    authz.wildcard,
                    authz.expires_at,
                    new.now,
                ],
            ).await?;
        }
        for authz in &fresh {
            for ch in &authz.challenges {
                tx.exec(
                    "INSERT INTO challenges (id, authz_id, type, token, status)
                     VALUES (?1, ?2, ?3, ?4, 'pending')",
                    args![ch.id, authz.id, ch.kind.as_str(), ch.token],
                )
                .await?;
            }
        }
        for (position, id) in authorization_ids.iter().enumerate() {
            tx.exec(
                "INSERT INTO order_authorizations (order_id, authz_id, position) VALUES (?1, ?2, ?3)",
                args![new.id, id, position as i64],
            ).await?;
        }
        // Every authorization reused and valid: the order is ready at once
        // (RFC 8555 §7.1.6). A new authorization is pending, so the check is
        // needed only when all were reused.
        let mut status = OrderStatus::Pending;
        if fresh.is_empty() {
            let ready = tx.exec(READY_WHEN_ALL_VALID, args![new.id]).await?;
            if ready == 1 {
                status = OrderStatus::Ready;
            }
        }
        tx.commit().await?;
        Ok(inserted_order(new, status, authorization_ids))
    }

    pub async fn order(&self, id: &str) -> Result<Option<OrderRow>> {
        self.carrying_point_reader()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    order_columns!(),
                    " FROM orders o WHERE o.id = ?1"
                ),
                args![id],
                order_from_row,
            )
            .await
    }

    /// One page of an account's order ids, oldest first (RFC 8555 §7.1.2.1).
    pub async fn account_order_ids(
        &self,
        account_id: &str,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<String>> {
        self.reader().await?.all(
            "SELECT id FROM orders WHERE account_id = ?1 ORDER BY created_at, id LIMIT ?2 OFFSET ?3",
            args![account_id, limit, offset],
            |row| row.get(0),
        ).await
    }

    pub async fn challenge(&self, id: &str) -> Result<Option<ChallengeRow>> {
        self.point_reader()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    challenge_columns!(),
                    " FROM challenges ch WHERE ch.id = ?1"
                ),
                args![id],
                |row| challenge_at(row, 0),
            )
            .await
    }

    /// An authorization with its challenges, in one statement.
    pub async fn authorization_with_challenges(
        &self,
        id: &str,
    ) -> Result<Option<(AuthorizationRow, Vec<ChallengeRow>)>> {
        // Every row repeats the authorization: it is read from the first.
        let mut authz: Option<AuthorizationRow> = None;
        let mut conn = self.carrying_point_reader().await?;
        // In the order they were made: SQLite's rowid, PostgreSQL's seq.
        let sql = if conn.is_postgres() {
            concat!(authz_with_challenges!(), " ORDER BY ch.seq")
        } else {
            concat!(authz_with_challenges!(), " ORDER BY ch.rowid")
        };
        let challenges = conn
            .all(sql, args![id], |row| {
                if authz.is_none() {
                    authz = Some(authz_at(row, 0)?);
                }
                // LEFT JOIN: an authorization without challenges is one row of NULLs.
                if col::<Option<String>>(row, AUTHZ_COLUMNS, "id")?.is_some() {
                    Ok(Some(challenge_at(row, AUTHZ_COLUMNS)?))
                } else {
                    Ok(None)
                }
            })
            .await?;
        let Some(authz) = authz else {
            return Ok(None);
        };
        Ok(Some((authz, challenges.into_iter().flatten().collect())))
    }

    /// An order with its authorizations and their challenges, the
    /// authorizations in the order's order: what the finalize checks
    /// again. One statement on PostgreSQL, where reading the order and
    /// then each authorization would be a round trip each (N + 1 for N
    /// names); on SQLite, where a statement is no round trip, those reads.
    /// An authorization the order lists that is missing is left out.
    pub async fn order_with_authorizations(&self, id: &str) -> Result<Option<OrderAuthorizations>> {
        if !self.is_postgres() {
            let Some(order) = self.order(id).await? else {
                return Ok(None);
            };
            let mut authorizations = Vec::with_capacity(order.authorization_ids.len());
            for authz_id in &order.authorization_ids {
                if let Some(found) = self.authorization_with_challenges(authz_id).await? {
                    authorizations.push(found);
                }
            }
            return Ok(Some((order, authorizations)));
        }
        let mut order = None;
        let mut authorizations: Vec<(AuthorizationRow, Vec<ChallengeRow>)> = Vec::new();
        self.carrying_point_reader()
            .await?
            .all(ORDER_WITH_AUTHORIZATIONS_POSTGRES, args![id], |row| {
                if order.is_none() {
                    order = Some(order_from_row(row)?);
                }
                // LEFT JOINs: an order without authorizations, or an
                // authorization without challenges, has NULLs there.
                if col::<Option<String>>(row, ORDER_COLUMNS, "id")?.is_none() {
                    return Ok(());
                }
                let authz = authz_at(row, ORDER_COLUMNS)?;
                // Every row of an authorization repeats it: each is read
                // from its first.
                if authorizations.last().is_none_or(|(a, _)| a.id != authz.id) {
                    authorizations.push((authz, Vec::new()));
                }
                let challenge = ORDER_COLUMNS + AUTHZ_COLUMNS;
                if col::<Option<String>>(row, challenge, "id")?.is_some()
                    && let Some((_, challenges)) = authorizations.last_mut()
                {
                    challenges.push(challenge_at(row, challenge)?);
                }
                Ok(())
            })
            .await?;
        Ok(order.map(|order| (order, authorizations)))
    }

    /// A challenge with its authorization, in one statement.
    pub async fn challenge_with_authorization(
        &self,
        id: &str,
    ) -> Result<Option<(ChallengeRow, AuthorizationRow)>> {
        challenge_with_authorization_in(&mut self.carrying_point_reader().await?, id).await
    }

    /// What a validation needs of challenge `id`: the challenge, its
    /// authorization and the key thumbprint of the account that holds it
    /// (for the key authorization, RFC 8555 §8.1), in one statement.
    /// `None` when the challenge or its account is gone.
    pub async fn challenge_to_validate(
        &self,
        id: &str,
    ) -> Result<Option<(ChallengeRow, AuthorizationRow, String)>> {
        self.point_reader()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    authz_columns!(),
                    ", ",
                    challenge_columns!(),
                    ", acct.key_thumbprint FROM challenges ch JOIN authorizations a ON a.id = ch.authz_id
                       JOIN accounts acct ON acct.id = a.account_id WHERE ch.id = ?1"
                ),
                args![id],
                |row| {
                    Ok((
                        challenge_at(row, AUTHZ_COLUMNS)?,
                        authz_at(row, 0)?,
                        row.get(AUTHZ_COLUMNS + CHALLENGE_COLUMNS)?,
                    ))
                },
            )
            .await
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
        self.reader().await?.exists(
            "SELECT 1 FROM authorizations WHERE profile = ?1 AND account_id = ?2 AND identifier_type = ?3
             AND identifier_value = ?4 AND wildcard = ?5 AND status = 'valid' AND expires_at > ?6 LIMIT 1",
            args![
                profile,
                account_id,
                identifier.kind.as_str(),
                identifier.value,
                wildcard,
                now,
            ],
        ).await
    }

    /// pending → processing for a challenge whose authorization is still
    /// pending and unexpired. False if another request got there first or
    /// the authorization moved on (RFC 8555 §7.5.1).
    pub async fn start_challenge(&self, challenge_id: &str, now: i64) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(START_CHALLENGE, args![challenge_id, now])
            .await?
            == 1)
    }

    /// pending → processing (as [`Store::start_challenge`]) and the job that
    /// will validate it, in one transaction: a challenge is never left
    /// processing without the work that settles it.
    ///
    /// Errs with [`StoreError::AccountChanged`] unless `account` is still
    /// valid with its key.
    pub async fn start_challenge_with_job(
        &self,
        challenge_id: &str,
        now: i64,
        job: &crate::NewJob<'_>,
        now_ms: i64,
        account: AccountGuard<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        if conn.is_postgres() {
            return start_challenge_with_job_postgres(
                &mut conn,
                challenge_id,
                now,
                job,
                now_ms,
                account,
            )
            .await;
        }
        let mut tx = conn.begin().await?;
        account.check_in(&mut tx).await?;
        let started = tx.exec(START_CHALLENGE, args![challenge_id, now]).await? == 1;
        if !started {
            return Ok(false);
        }
        crate::jobs::insert_job_in(&mut tx, job, now_ms).await?;
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
    ///   pending order containing it invalid (RFC 8555 §7.1.6);
    /// - valid, but the authorization is no longer pending or valid (another
    ///   of its challenges failed first, or it was deactivated or expired):
    ///   the challenge invalid, nothing else moved.
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
        if conn.is_postgres() {
            // The same statements in one function (migration 0023), the
            // notices queued by the same statement when it says true.
            let failed = outcome.err().map(to_json);
            return Ok(conn
                .scalar::<bool>(
                    SETTLE_CHALLENGE_POSTGRES,
                    args![
                        challenge_id,
                        now,
                        valid_until,
                        failed,
                        to_json(&late_challenge()),
                        crate::jobs::jobs_json(notices),
                    ],
                )
                .await?
                == Some(true));
        }
        let mut tx = conn.begin().await?;
        // The guarded change and the read of its authorization are one
        // statement.
        let authz_id: Option<String> = match outcome {
            // Only while its authorization is pending or valid: an
            // invalid, deactivated or expired authorization is final
            // (§7.1.6), and a challenge must not read valid under it (a
            // second challenge of the authorization that failed first).
            Ok(()) => {
                let moved = tx
                    .scalar(
                        "UPDATE challenges SET status = 'valid', validated_at = ?1
                 WHERE id = ?2 AND status = 'processing'
                   AND (SELECT a.status FROM authorizations a WHERE a.id = challenges.authz_id)
                       IN ('pending', 'valid')
                 RETURNING authz_id",
                        args![now, challenge_id],
                    )
                    .await?;
                if moved.is_none() {
                    let ended = tx
                        .exec(
                            "UPDATE challenges SET status = 'invalid', error = ?1
                         WHERE id = ?2 AND status = 'processing'",
                            args![to_json(&late_challenge()), challenge_id],
                        )
                        .await?;
                    if ended == 1 {
                        insert_jobs_in(&mut tx, notices).await?;
                        tx.commit().await?;
                    }
                    return Ok(ended == 1);
                }
                moved
            }
            Err(problem) => {
                tx.scalar(
                    "UPDATE challenges SET status = 'invalid', error = ?1
                 WHERE id = ?2 AND status = 'processing' RETURNING authz_id",
                    args![to_json(problem), challenge_id],
                )
                .await?
            }
        };
        let Some(authz_id) = authz_id else {
            return Ok(false);
        };
        match outcome {
            Ok(()) => validate_authorization_in(&mut tx, &authz_id, valid_until).await?,
            Err(problem) => {
                tx.exec(
                    "UPDATE authorizations SET status = 'invalid' WHERE id = ?1 AND status = 'pending'",
                    args![authz_id],
                ).await?;
                tx.exec(
                    "UPDATE orders SET status = 'invalid', error = ?1
                     WHERE status = 'pending'
                       AND id IN (SELECT order_id FROM order_authorizations WHERE authz_id = ?2)",
                    args![to_json(problem), authz_id],
                )
                .await?;
            }
        }
        insert_jobs_in(&mut tx, notices).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// pending → valid for a challenge at once, with its authorization and
    /// orders as [`Store::settle_challenge`] moves them: validation bypass,
    /// for tests. One transaction, on the writer only, for the whole
    /// trigger (RFC 8555 §7.5.1): the challenge must be pending, of an
    /// authorization of `account` at `profile` that is pending and
    /// unexpired, and of a type in `offered` (the profile's challenge types
    /// now: a reload may have taken one away since the authorization was
    /// made; at most three, one per type). Returns the challenge and its
    /// authorization as the transaction left them; `None`, and nothing
    /// written, when any of that does not hold, for the caller to read what
    /// to answer. When it holds,
    /// [`StoreError::AccountChanged`] (nothing written) unless `account` is
    /// still valid with its key — checked only then, so that every other
    /// case is answered as it would be without the guard.
    pub async fn bypass_challenge(
        &self,
        challenge_id: &str,
        profile: &str,
        offered: &[&str],
        now: i64,
        valid_until: i64,
        account: AccountGuard<'_>,
    ) -> Result<Option<(ChallengeRow, AuthorizationRow)>> {
        // Unused places are NULL, which `IN` never matches.
        let offered = |i: usize| offered.get(i).copied();
        if self.is_postgres() {
            // The same statements in one function: one round trip, which
            // carries the request's nonce.
            return self
                .carrying_writer()
                .await?
                .one(
                    BYPASS_CHALLENGE_POSTGRES,
                    args![
                        challenge_id,
                        now,
                        account.id,
                        account.key_thumbprint,
                        profile,
                        offered(0),
                        offered(1),
                        offered(2),
                        valid_until
                    ],
                    |row| Ok((challenge_at(row, AUTHZ_COLUMNS)?, authz_at(row, 0)?)),
                )
                .await
                .map_err(account_changed_raised);
        }
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        // Not `RETURNING authz_id`, which SQLite serves through a temporary
        // b-tree made on every run: the row is read back by its key.
        let moved = tx
            .exec(
                "UPDATE challenges SET status = 'valid', validated_at = ?2
             WHERE id = ?1 AND status = 'pending' AND type IN (?5, ?6, ?7)
               AND EXISTS (SELECT 1 FROM authorizations a WHERE a.id = challenges.authz_id
                           AND a.status = 'pending' AND a.expires_at > ?2
                           AND a.account_id = ?3 AND a.profile = ?4)",
                args![
                    challenge_id,
                    now,
                    account.id,
                    profile,
                    offered(0),
                    offered(1),
                    offered(2)
                ],
            )
            .await?;
        if moved == 0 {
            return Ok(None);
        }
        let authz_id: String = tx
            .scalar(
                "SELECT authz_id FROM challenges WHERE id = ?1",
                args![challenge_id],
            )
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "challenge {challenge_id} vanished in its own update"
                ))
            })?;
        // Dropping `tx` on an error rolls the update back.
        account.check_in(&mut tx).await?;
        validate_authorization_in(&mut tx, &authz_id, valid_until).await?;
        let rows = challenge_with_authorization_in(&mut tx, challenge_id)
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "challenge {challenge_id} vanished in its own update"
                ))
            })?;
        tx.commit().await?;
        Ok(Some(rows))
    }

    /// pending|valid → deactivated for an authorization (RFC 8555 §7.5.2);
    /// its unfinished orders become invalid. False if it was neither.
    pub async fn deactivate_authorization(&self, authz_id: &str) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = tx.exec(
            "UPDATE authorizations SET status = 'deactivated' WHERE id = ?1 AND status IN ('pending', 'valid')",
            args![authz_id],
        ).await? == 1;
        if changed {
            tx.exec(
                "UPDATE orders SET status = 'invalid'
                 WHERE status IN ('pending', 'ready')
                   AND id IN (SELECT order_id FROM order_authorizations WHERE authz_id = ?1)",
                args![authz_id],
            )
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
        // The reader is given back at the end of this statement, before the
        // awaits below.
        let ids: Vec<String> = self.reader().await?.all(
            "SELECT id FROM orders
             WHERE replaces_certificate_id = ?1 AND status IN ('pending', 'ready') AND expires_at <= ?2",
            args![certificate_id, now],
            |row| row.get(0),
        ).await?;
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
        let changed = tx
            .exec(
                "UPDATE orders SET status = 'invalid', error = ?1
             WHERE id = ?2 AND status IN ('pending', 'ready') AND expires_at <= ?3",
                args![to_json(error), order_id, now],
            )
            .await?
            == 1;
        if changed {
            tx.exec(
                "UPDATE authorizations SET status = 'expired'
                 WHERE status = 'pending' AND expires_at <= ?1
                   AND id IN (SELECT authz_id FROM order_authorizations WHERE order_id = ?2)",
                args![now, order_id],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// ready → processing, guarded: of two concurrent finalize requests
    /// exactly one gets `true` (RFC 8555 §7.4). Errs with
    /// [`StoreError::AccountChanged`] unless `account` is still valid with
    /// its key.
    ///
    /// `watch` is queued with it: the job, keyed by the order and this
    /// start, that makes the order invalid if the process asking the
    /// signer dies before recording the outcome
    /// ([`Store::fail_stalled_finalize`]).
    pub async fn begin_finalize(
        &self,
        order_id: &str,
        since_ms: i64,
        watch: &NewJob<'_>,
        account: AccountGuard<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        account.check_in(&mut tx).await?;
        let begun = tx.exec(BEGIN_FINALIZE, args![order_id, since_ms]).await? == 1;
        if !begun {
            return Ok(false);
        }
        insert_job_in(&mut tx, watch, since_ms).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// When the finalize of an order that is processing without a relay
    /// began (Unix milliseconds); None when it is not such an order.
    pub async fn processing_since(&self, order_id: &str) -> Result<Option<i64>> {
        let since: Option<Option<i64>> = self
            .point_reader()
            .await?
            .scalar(
                "SELECT processing_since FROM orders o
                 WHERE id = ?1 AND status = 'processing'
                   AND NOT EXISTS (SELECT 1 FROM upstream_orders u WHERE u.order_id = o.id)",
                args![order_id],
            )
            .await?;
        Ok(since.flatten())
    }

    /// processing → invalid, with the audit row, when the finalize that
    /// began at `since_ms` never recorded its outcome (its process died
    /// while the signer worked). False, and nothing written, when the
    /// order left processing or another finalize has begun since.
    pub async fn fail_stalled_finalize(
        &self,
        order_id: &str,
        since_ms: i64,
        error: &Problem,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let failed = tx
            .exec(
                "UPDATE orders SET status = 'invalid', error = ?1
                 WHERE id = ?2 AND status = 'processing' AND processing_since = ?3",
                args![to_json(error), order_id, since_ms],
            )
            .await?
            == 1;
        if !failed {
            return Ok(false);
        }
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Orders processing without a relay and without a live job of
    /// `job_kind` keyed `ID@SINCE` (their id and the start of their
    /// finalize: e.g. processing before the watch existed), as (id,
    /// start), oldest first, to be watched again at start-up.
    pub async fn unwatched_finalizes(
        &self,
        job_kind: &str,
        limit: i64,
    ) -> Result<Vec<(String, i64)>> {
        self.reader()
            .await?
            .all(
                "SELECT o.id, o.processing_since FROM orders o
                 WHERE o.status = 'processing' AND o.processing_since IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM upstream_orders u WHERE u.order_id = o.id)
                   AND NOT EXISTS (SELECT 1 FROM jobs j
                                   WHERE j.kind = ?1 AND j.key = o.id || '@' || o.processing_since
                                   AND (j.status = 'queued' OR j.status = 'running' OR j.status = 'retiring'))
                 ORDER BY o.processing_since, o.id
                 LIMIT ?2",
                args![job_kind, limit],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .await
    }

    /// processing → ready: the signer refused the CSR, the client may try
    /// again with a better one (RFC 8555 §7.4 badCSR). The start is
    /// cleared: no watch reads this attempt as live any more.
    pub async fn abort_finalize(&self, order_id: &str) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE orders SET status = 'ready', processing_since = NULL
                 WHERE id = ?1 AND status = 'processing'",
                args![order_id],
            )
            .await?
            == 1)
    }

    /// processing → invalid with an error the client will see.
    pub async fn fail_order(&self, order_id: &str, error: &Problem) -> Result<bool> {
        Ok(self.writer().await?.exec(
            "UPDATE orders SET status = 'invalid', error = ?1 WHERE id = ?2 AND status = 'processing'",
            args![to_json(error), order_id],
        ).await? == 1)
    }

    /// Challenges left `processing` without a live job of `job_kind` whose
    /// key is the challenge id (e.g. the job row was lost), oldest
    /// authorization first, to be queued again at start-up.
    pub async fn orphaned_processing_challenges(
        &self,
        job_kind: &str,
        limit: i64,
    ) -> Result<Vec<ProcessingChallenge>> {
        self.reader().await?.all(
            concat!(
                "SELECT ",
                challenge_columns!(),
                ", ",
                authz_columns!(),
                " FROM challenges ch
                 JOIN authorizations a ON a.id = ch.authz_id
                 WHERE ch.status = 'processing'
                   AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.kind = ?2 AND j.key = ch.id
                                   AND (j.status = 'queued' OR j.status = 'running' OR j.status = 'retiring'))
                 ORDER BY a.created_at, ch.id
                 LIMIT ?1"
            ),
            args![limit, job_kind],
            |row| {
                Ok(ProcessingChallenge {
                    challenge: challenge_at(row, 0)?,
                    authorization: authz_at(row, CHALLENGE_COLUMNS)?,
                })
            },
        ).await
    }
}

impl Store {
    /// Orders for operators, newest first.
    pub async fn list_orders(
        &self,
        profile: Option<&str>,
        account: Option<&str>,
        status: Option<OrderStatus>,
        limit: i64,
    ) -> Result<Vec<OrderRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    order_columns!(),
                    " FROM orders o
                  WHERE (?1 IS NULL OR o.profile = ?1) AND (?2 IS NULL OR o.account_id = ?2)
                    AND (?3 IS NULL OR o.status = ?3)
                  ORDER BY o.created_at DESC, o.id DESC LIMIT ?4"
                ),
                args![profile, account, status.map(OrderStatus::as_str), limit],
                order_from_row,
            )
            .await
    }
}

/// What the console's order search narrows by; none: every order.
#[derive(Clone, Debug, Default)]
pub struct OrderSearch<'a> {
    /// An identifier's value, exactly (a wildcard's base name).
    pub name: Option<&'a str>,
    /// The certificate's serial, lowercase hex.
    pub serial: Option<&'a str>,
    pub account: Option<&'a str>,
    pub profile: Option<&'a str>,
    pub status: Option<OrderStatus>,
    /// Only orders older than this one (created_at, id): the next page.
    pub before: Option<(i64, &'a str)>,
}

impl Store {
    /// Orders matching `search`, newest first, at most `limit`: one page,
    /// read along the `orders_by_time` index.
    pub async fn search_orders(
        &self,
        search: &OrderSearch<'_>,
        limit: i64,
    ) -> Result<Vec<OrderRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    order_columns!(),
                    " FROM orders o
                  WHERE (?1 IS NULL OR o.id IN (
                           SELECT oa.order_id FROM order_authorizations oa
                           JOIN authorizations a ON a.id = oa.authz_id
                           WHERE a.identifier_value = ?1))
                    AND (?2 IS NULL OR o.id IN (SELECT c.order_id FROM certificates c WHERE c.serial = ?2))
                    AND (?3 IS NULL OR o.account_id = ?3) AND (?4 IS NULL OR o.profile = ?4)
                    AND (?5 IS NULL OR o.status = ?5)
                    AND (?6 IS NULL OR o.created_at < ?6 OR (o.created_at = ?6 AND o.id < ?7))
                  ORDER BY o.created_at DESC, o.id DESC LIMIT ?8"
                ),
                args![
                    search.name,
                    search.serial,
                    search.account,
                    search.profile,
                    search.status.map(OrderStatus::as_str),
                    search.before.map(|(at, _)| at),
                    search.before.map(|(_, id)| id),
                    limit
                ],
                order_from_row,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use acme_proxy_protocol::types::{
        AuthorizationStatus, ChallengeStatus, Identifier, OrderStatus,
    };
    use acme_proxy_protocol::{Problem, ProblemType};
    use rusqlite::Connection;

    use crate::test_support::{ACCOUNT, GUARD, TestDb, open_in};
    use crate::{
        AuditEvent, AuditOutcome, InsertOrder, NewAuditRow, NewAuthorization, NewChallenge, NewJob,
        NewOrderRow, NewUpstreamOrder,
    };

    /// PostgreSQL writes a new order as one statement, SQLite as a
    /// transaction of several: both give back what was sent, the links in
    /// the order's order and each authorization's challenges in theirs.
    #[tokio::test]
    async fn an_order_of_several_names_is_written_whole_with_links_and_challenges_in_order() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        let name = |value: &str| Identifier {
            kind: "dns".parse().unwrap(),
            value: value.to_owned(),
        };
        let challenge = |id: &str, kind: &str| NewChallenge {
            id: id.to_owned(),
            kind: kind.parse().unwrap(),
            token: format!("token-{id}"),
        };
        // Ids that sort against the order given, so that an engine's own
        // order (by key) cannot pass for the order sent.
        let authz = |id: &str, value: &str, wildcard: bool, ids: [&str; 3]| NewAuthorization {
            id: id.to_owned(),
            identifier: name(value),
            wildcard,
            expires_at: 90,
            challenges: vec![
                challenge(ids[0], "http-01"),
                challenge(ids[1], "dns-01"),
                challenge(ids[2], "tls-alpn-01"),
            ],
        };
        let order = NewOrderRow {
            id: "ord".to_owned(),
            profile: "default".to_owned(),
            account_id: "acct".to_owned(),
            identifiers: vec![name("z.example"), name("a.example"), name("m.example")],
            not_before: Some(5),
            not_after: None,
            expires_at: 100,
            now: 1,
            authorizations: vec![
                authz("az-z", "z.example", false, ["z3", "z1", "z2"]),
                authz("az-a", "a.example", true, ["a2", "a3", "a1"]),
                authz("az-m", "m.example", false, ["m1", "m3", "m2"]),
            ],
            reuse_validated_since: None,
            certificate_profile: Some("short".to_owned()),
            replaces: None,
            max_pending_authorizations: i64::MAX,
        };
        let InsertOrder::Inserted(written) = store.insert_order(&order, GUARD).await.unwrap()
        else {
            panic!("not inserted");
        };
        let read = store.order("ord").await.unwrap().unwrap();
        assert_eq!(read, *written);
        assert_eq!(read.authorization_ids, ["az-z", "az-a", "az-m"]);
        assert_eq!(read.status, OrderStatus::Pending);
        assert_eq!(read.not_before, Some(5));
        assert_eq!(read.certificate_profile.as_deref(), Some("short"));
        for sent in &order.authorizations {
            let (authz, challenges) = store
                .authorization_with_challenges(&sent.id)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(authz.identifier, sent.identifier);
            assert_eq!(authz.wildcard, sent.wildcard, "{}", sent.id);
            assert_eq!(authz.status, AuthorizationStatus::Pending);
            assert_eq!((authz.expires_at, authz.created_at), (90, 1));
            assert_eq!(
                (authz.account_id.as_str(), authz.profile.as_str()),
                ("acct", "default")
            );
            let got: Vec<(&str, &str, &str)> = challenges
                .iter()
                .map(|c| (c.id.as_str(), c.kind.as_str(), c.token.as_str()))
                .collect();
            let want: Vec<(&str, &str, &str)> = sent
                .challenges
                .iter()
                .map(|c| (c.id.as_str(), c.kind.as_str(), c.token.as_str()))
                .collect();
            assert_eq!(got, want, "{}", sent.id);
            assert!(
                challenges
                    .iter()
                    .all(|c| c.status == ChallengeStatus::Pending)
            );
        }
        // Read with the order, the same: authorizations in the order's
        // order (not by key), each with its challenges as made.
        let (with, authorizations) = store
            .order_with_authorizations("ord")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(with, read);
        let mut one_by_one = Vec::new();
        for id in &read.authorization_ids {
            one_by_one.push(
                store
                    .authorization_with_challenges(id)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        assert_eq!(authorizations, one_by_one);
        assert!(
            store
                .order_with_authorizations("none")
                .await
                .unwrap()
                .is_none()
        );
        for (position, id) in ["az-z", "az-a", "az-m"].iter().enumerate() {
            let sql = format!(
                "SELECT position FROM order_authorizations WHERE order_id = 'ord' AND authz_id = '{id}'"
            );
            assert_eq!(db.scalar(&sql).await, position as i64, "{id}");
        }
        assert_eq!(
            db.scalar(
                "SELECT COUNT(*) FROM authorizations
                  WHERE account_id = 'acct' AND profile = 'default' AND status = 'pending'"
            )
            .await,
            3
        );
    }

    /// The cap on pending authorizations is counted by the write itself
    /// (one statement on PostgreSQL, the transaction on SQLite and when
    /// reuse is asked for): past it nothing is written, and the count
    /// comes back for the refusal. Expired ones and another profile's do
    /// not count.
    #[tokio::test]
    async fn an_order_past_the_accounts_pending_authorizations_cap_writes_nothing_and_says_how_many()
     {
        let (db, store) = TestDb::open().await;
        db.exec(&format!(
            "{ACCOUNT}
             INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value,
                     status, expires_at, created_at)
                 VALUES ('old', 'default', 'acct', 'dns', 'old.example', 'pending', 10, 1),
                        ('elsewhere', 'other', 'acct', 'dns', 'other.example', 'pending', 100, 1);"
        ))
        .await;
        let order = |id: &str, names: usize, cap: i64, reuse: Option<i64>| NewOrderRow {
            id: id.to_owned(),
            profile: "default".to_owned(),
            account_id: "acct".to_owned(),
            identifiers: (0..names)
                .map(|n| Identifier {
                    kind: "dns".parse().unwrap(),
                    value: format!("{id}-{n}.example"),
                })
                .collect(),
            not_before: None,
            not_after: None,
            expires_at: 100,
            now: 20,
            authorizations: (0..names)
                .map(|n| NewAuthorization {
                    id: format!("{id}-authz-{n}"),
                    identifier: Identifier {
                        kind: "dns".parse().unwrap(),
                        value: format!("{id}-{n}.example"),
                    },
                    wildcard: false,
                    expires_at: 100,
                    challenges: vec![NewChallenge {
                        id: format!("{id}-ch-{n}"),
                        kind: "http-01".parse().unwrap(),
                        token: format!("token-{id}-{n}"),
                    }],
                })
                .collect(),
            reuse_validated_since: reuse,
            certificate_profile: None,
            replaces: None,
            max_pending_authorizations: cap,
        };
        let pending = "SELECT COUNT(*) FROM authorizations WHERE status = 'pending'";
        for reuse in [None, Some(0)] {
            db.exec(
                "DELETE FROM order_authorizations; DELETE FROM challenges;
                     DELETE FROM authorizations WHERE id NOT IN ('old', 'elsewhere');
                     DELETE FROM orders;",
            )
            .await;
            let first = store.insert_order(&order("a", 2, 3, reuse), GUARD).await;
            assert!(
                matches!(first, Ok(InsertOrder::Inserted(_))),
                "{reuse:?}: {first:?}"
            );
            assert_eq!(
                store
                    .insert_order(&order("b", 2, 3, reuse), GUARD)
                    .await
                    .unwrap(),
                InsertOrder::TooManyPending { pending: 2 },
                "{reuse:?}"
            );
            assert!(store.order("b").await.unwrap().is_none(), "{reuse:?}");
            assert_eq!(
                db.scalar(pending).await,
                4,
                "{reuse:?}: nothing of b written"
            );
            let fits = store.insert_order(&order("c", 2, 4, reuse), GUARD).await;
            assert!(
                matches!(fits, Ok(InsertOrder::Inserted(_))),
                "{reuse:?}: {fits:?}"
            );
        }
        // An account that changed is told so, not counted.
        let stale = crate::AccountGuard {
            id: "acct",
            key_thumbprint: "old-thumb",
        };
        assert!(matches!(
            store.insert_order(&order("d", 1, 0, None), stale).await,
            Err(crate::StoreError::AccountChanged)
        ));
    }

    /// PostgreSQL starts a challenge with its job in one statement, SQLite
    /// in a transaction: either way once, with one job, and not under an
    /// authorization that expired.
    #[tokio::test]
    async fn a_challenge_starts_once_with_one_job_and_never_under_an_expired_authorization() {
        let (db, store) = TestDb::open().await;
        db.exec(&format!(
            "{ACCOUNT}
             INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value,
                     status, expires_at, created_at)
                 VALUES ('live', 'default', 'acct', 'dns', 'live.example', 'pending', 100, 1),
                        ('old', 'default', 'acct', 'dns', 'old.example', 'pending', 3, 1);
             INSERT INTO challenges (id, authz_id, type, token, status)
                 VALUES ('ch-live', 'live', 'http-01', 't1', 'pending'),
                        ('ch-old', 'old', 'http-01', 't2', 'pending');"
        ))
        .await;
        let job = |key: &'static str| NewJob {
            kind: "challenge_validation",
            key,
            payload: "{}",
            run_at: 5,
            deadline: None,
            max_attempts: 1,
            fair_key: Some("acct"),
        };
        let jobs = "SELECT COUNT(*) FROM jobs WHERE status = 'queued'";
        assert!(
            store
                .start_challenge_with_job("ch-live", 5, &job("ch-live"), 5, GUARD)
                .await
                .unwrap()
        );
        assert_eq!(db.scalar(jobs).await, 1);
        assert!(
            !store
                .start_challenge_with_job("ch-live", 5, &job("ch-live"), 5, GUARD)
                .await
                .unwrap(),
            "started twice"
        );
        assert!(
            !store
                .start_challenge_with_job("ch-old", 5, &job("ch-old"), 5, GUARD)
                .await
                .unwrap(),
            "started under an expired authorization"
        );
        assert_eq!(db.scalar(jobs).await, 1, "one job, for ch-live");
        let status = |id: &'static str| {
            let store = store.clone();
            async move { store.challenge(id).await.unwrap().unwrap().status }
        };
        assert_eq!(status("ch-live").await, ChallengeStatus::Processing);
        assert_eq!(status("ch-old").await, ChallengeStatus::Pending);
        // What its validation then reads, in one statement: the challenge,
        // its authorization, and the key its account signs with.
        let (ch, authz, thumbprint) = store
            .challenge_to_validate("ch-live")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((ch.id.as_str(), ch.token.as_str()), ("ch-live", "t1"));
        assert_eq!(
            (authz.id.as_str(), authz.account_id.as_str()),
            ("live", "acct")
        );
        assert_eq!(thumbprint, "thumb");
        assert!(store.challenge_to_validate("none").await.unwrap().is_none());
    }

    /// Found by the state machine's property test: two challenges of one
    /// authorization triggered together, the first failing. The second's
    /// success came after the authorization was invalid, and the challenge
    /// read valid under it.
    #[tokio::test]
    async fn a_challenge_passing_after_its_authorization_went_invalid_is_invalid_too() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        let challenge = |id: &str, kind: &str| NewChallenge {
            id: id.to_owned(),
            kind: kind.parse().unwrap(),
            token: format!("token-{id}"),
        };
        let order = NewOrderRow {
            id: "ord".to_owned(),
            profile: "default".to_owned(),
            account_id: "acct".to_owned(),
            identifiers: vec![Identifier {
                kind: "dns".parse().unwrap(),
                value: "a.example".to_owned(),
            }],
            not_before: None,
            not_after: None,
            expires_at: 100,
            now: 1,
            authorizations: vec![NewAuthorization {
                id: "az".to_owned(),
                identifier: Identifier {
                    kind: "dns".parse().unwrap(),
                    value: "a.example".to_owned(),
                },
                wildcard: false,
                expires_at: 100,
                challenges: vec![challenge("http", "http-01"), challenge("dns", "dns-01")],
            }],
            reuse_validated_since: None,
            certificate_profile: None,
            replaces: None,
            max_pending_authorizations: i64::MAX,
        };
        store.insert_order(&order, GUARD).await.unwrap();
        assert!(store.start_challenge("http", 2).await.unwrap());
        assert!(store.start_challenge("dns", 2).await.unwrap());
        let refused = Problem::new(ProblemType::Connection, "no answer");
        assert!(
            store
                .settle_challenge("http", Err(&refused), 3, 50, &[])
                .await
                .unwrap()
        );
        // Settled (it leaves processing), but not valid.
        assert!(
            store
                .settle_challenge("dns", Ok(()), 4, 50, &[])
                .await
                .unwrap()
        );

        let (authz, challenges) = store
            .authorization_with_challenges("az")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(authz.status, AuthorizationStatus::Invalid);
        for ch in &challenges {
            assert_eq!(ch.status, ChallengeStatus::Invalid, "{}", ch.id);
        }
        let late = challenges.iter().find(|c| c.id == "dns").unwrap();
        assert_eq!(
            late.error.as_ref().unwrap().kind,
            Problem::new(ProblemType::Malformed, "").kind
        );
        assert_eq!(
            store.order("ord").await.unwrap().unwrap().status,
            OrderStatus::Invalid
        );
        // A settled challenge is not settled again.
        assert!(
            !store
                .settle_challenge("dns", Ok(()), 5, 50, &[])
                .await
                .unwrap()
        );
        store.close().await;
    }

    /// A settled challenge's notices are queued with it (by the same
    /// statement on PostgreSQL), and none for one no longer processing;
    /// a failure takes the authorization and its pending order with it,
    /// the order carrying the problem; a pass makes the order ready.
    #[tokio::test]
    async fn a_settled_challenge_queues_its_notices_and_one_no_longer_processing_queues_none() {
        let (db, store) = TestDb::open().await;
        db.exec(&format!(
            "{ACCOUNT}
             INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('o-pass', 'default', 'acct', 'pending', '[]', 100, 1),
                        ('o-fail', 'default', 'acct', 'pending', '[]', 100, 1);
             INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value,
                     status, expires_at, created_at)
                 VALUES ('a-pass', 'default', 'acct', 'dns', 'pass.example', 'pending', 100, 1),
                        ('a-fail', 'default', 'acct', 'dns', 'fail.example', 'pending', 100, 1);
             INSERT INTO challenges (id, authz_id, type, token, status)
                 VALUES ('c-pass', 'a-pass', 'http-01', 't1', 'processing'),
                        ('c-fail', 'a-fail', 'http-01', 't2', 'processing');
             INSERT INTO order_authorizations (order_id, authz_id, position)
                 VALUES ('o-pass', 'a-pass', 0), ('o-fail', 'a-fail', 0);"
        ))
        .await;
        let notice = |key: &'static str| NewJob {
            kind: "notification",
            key,
            payload: "{}",
            run_at: 5,
            deadline: None,
            max_attempts: 3,
            fair_key: None,
        };
        let queued = "SELECT COUNT(*) FROM jobs WHERE kind = 'notification'";
        assert!(
            store
                .settle_challenge("c-pass", Ok(()), 5, 60, &[notice("pass")])
                .await
                .unwrap()
        );
        assert_eq!(db.scalar(queued).await, 1);
        assert!(
            !store
                .settle_challenge("c-pass", Ok(()), 6, 60, &[notice("again")])
                .await
                .unwrap(),
            "settled twice"
        );
        assert_eq!(
            db.scalar(queued).await,
            1,
            "no notice for a settled challenge"
        );
        let refused = Problem::new(ProblemType::Connection, "no answer");
        assert!(
            store
                .settle_challenge(
                    "c-fail",
                    Err(&refused),
                    7,
                    60,
                    &[notice("fail"), notice("fail-2")]
                )
                .await
                .unwrap()
        );
        assert_eq!(db.scalar(queued).await, 3);
        let passed = store.order("o-pass").await.unwrap().unwrap();
        assert_eq!(passed.status, OrderStatus::Ready);
        let (authz, _) = store
            .authorization_with_challenges("a-pass")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (authz.status, authz.expires_at),
            (AuthorizationStatus::Valid, 60)
        );
        let failed = store.order("o-fail").await.unwrap().unwrap();
        assert_eq!(failed.status, OrderStatus::Invalid);
        assert_eq!(failed.error.unwrap().kind, refused.kind);
        let (authz, challenges) = store
            .authorization_with_challenges("a-fail")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(authz.status, AuthorizationStatus::Invalid);
        assert_eq!(challenges[0].error.as_ref().unwrap().kind, refused.kind);
    }

    #[tokio::test]
    async fn a_dead_finalize_is_failed_only_for_the_attempt_its_watch_was_queued_for() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        db.exec(
            "INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('ord', 'default', 'acct', 'ready', '[]', 100, 1),
                        ('rel', 'default', 'acct', 'ready', '[]', 100, 1)",
        )
        .await;
        let watch = |key: &'static str, run_at: i64| NewJob {
            kind: "finalize_watch",
            key,
            payload: "{}",
            run_at,
            deadline: None,
            max_attempts: 5,
            fair_key: None,
        };
        let problem = Problem::new(ProblemType::ServerInternal, "the server stopped");
        let audit = || NewAuditRow {
            order_id: Some("ord"),
            ..NewAuditRow::new(
                9,
                AuditEvent::CertificateIssueFailed,
                AuditOutcome::Failure,
                "system",
            )
        };

        // The first attempt: processing since 1000, its watch queued with it.
        assert!(
            store
                .begin_finalize("ord", 1000, &watch("ord@1000", 25_000), GUARD)
                .await
                .unwrap()
        );
        assert_eq!(store.processing_since("ord").await.unwrap(), Some(1000));
        assert_eq!(
            db.scalar("SELECT run_at FROM jobs WHERE kind = 'finalize_watch' AND key = 'ord@1000'")
                .await,
            25_000
        );
        assert!(
            store
                .unwatched_finalizes("finalize_watch", 10)
                .await
                .unwrap()
                .is_empty()
        );
        // A second finalize of a processing order begins nothing.
        assert!(
            !store
                .begin_finalize("ord", 1500, &watch("ord@1500", 1), GUARD)
                .await
                .unwrap()
        );

        // badCSR: ready again, then a second attempt at 5000. The first
        // attempt's watch cannot fail it.
        assert!(store.abort_finalize("ord").await.unwrap());
        assert_eq!(store.processing_since("ord").await.unwrap(), None);
        assert_eq!(
            db.scalar("SELECT count(*) FROM orders WHERE id = 'ord' AND processing_since IS NULL")
                .await,
            1
        );
        assert!(
            store
                .begin_finalize("ord", 5000, &watch("ord@5000", 29_000), GUARD)
                .await
                .unwrap()
        );
        assert!(
            !store
                .fail_stalled_finalize("ord", 1000, &problem, &audit())
                .await
                .unwrap()
        );
        assert_eq!(
            store.order("ord").await.unwrap().unwrap().status,
            OrderStatus::Processing
        );
        assert!(store.audit_for_order("ord").await.unwrap().is_empty());

        // The second attempt's watch, once it is dead: invalid, audited.
        assert!(
            store
                .fail_stalled_finalize("ord", 5000, &problem, &audit())
                .await
                .unwrap()
        );
        let order = store.order("ord").await.unwrap().unwrap();
        assert_eq!(order.status, OrderStatus::Invalid);
        assert_eq!(
            order.error.unwrap().detail.as_deref(),
            Some("the server stopped")
        );
        let audited = store.audit_for_order("ord").await.unwrap();
        assert_eq!(audited.len(), 1);
        assert_eq!(
            audited[0].event,
            AuditEvent::CertificateIssueFailed.as_str()
        );
        // Once: the order left processing.
        assert!(
            !store
                .fail_stalled_finalize("ord", 5000, &problem, &audit())
                .await
                .unwrap()
        );
        assert_eq!(store.processing_since("ord").await.unwrap(), None);

        // A relayed order has its own job: no watch is about it.
        let relayed = NewUpstreamOrder {
            order_id: "rel",
            profile: "default",
            account_id: "acct",
            csr_der: b"csr",
            client_ip: None,
            reverse_name: None,
            user_agent: None,
            request_id: None,
            now: 2,
        };
        let relay_job = NewJob {
            kind: "signer_relay_issue",
            ..watch("rel", 2)
        };
        assert!(
            store
                .begin_relay(&relayed, &relay_job, 2, GUARD)
                .await
                .unwrap()
        );
        assert_eq!(store.processing_since("rel").await.unwrap(), None);
        assert!(
            store
                .unwatched_finalizes("finalize_watch", 10)
                .await
                .unwrap()
                .is_empty()
        );
        store.close().await;
    }

    #[tokio::test]
    async fn relayed_orders_page_newest_first_through_ties_with_a_cursor() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        // Five relayed orders, three begun in the same second.
        let begun = [("r1", 1), ("r2", 2), ("r3", 2), ("r4", 2), ("r5", 3)];
        for (id, _) in begun {
            db.exec(&format!(
                "INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                     VALUES ('{id}', 'default', 'acct', 'ready', '[]', 100, 1)"
            ))
            .await;
        }
        for (id, now) in begun {
            let relayed = NewUpstreamOrder {
                order_id: id,
                profile: "default",
                account_id: "acct",
                csr_der: b"csr",
                client_ip: None,
                reverse_name: None,
                user_agent: None,
                request_id: None,
                now,
            };
            let job = NewJob {
                kind: "signer_relay_issue",
                key: id,
                payload: "{}",
                run_at: now * 1000,
                deadline: None,
                max_attempts: 5,
                fair_key: None,
            };
            assert!(
                store
                    .begin_relay(&relayed, &job, now * 1000, GUARD)
                    .await
                    .unwrap()
            );
        }
        let mut seen = Vec::new();
        let mut before: Option<(i64, String)> = None;
        loop {
            let page = store
                .upstream_orders(
                    Some(OrderStatus::Processing),
                    before.as_ref().map(|(at, id)| (*at, id.as_str())),
                    2,
                )
                .await
                .unwrap();
            let Some(last) = page.last() else { break };
            before = Some((last.created_at, last.order_id.clone()));
            seen.extend(page.iter().map(|r| r.order_id.clone()));
            assert!(seen.len() <= 5, "the pages never ended: {seen:?}");
        }
        // Newest first; within a second, by id downwards; each once.
        assert_eq!(seen, ["r5", "r4", "r3", "r2", "r1"]);
        store.close().await;
    }

    #[tokio::test]
    async fn an_order_processing_without_a_watch_is_found_for_one_at_start_up() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        db.exec(
            "INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at, processing_since)
                 VALUES ('old', 'default', 'acct', 'processing', '[]', 100, 1, 7000),
                        ('older', 'default', 'acct', 'processing', '[]', 100, 1, 6000),
                        ('done', 'default', 'acct', 'invalid', '[]', 100, 1, 5000)",
        )
        .await;
        // An order an older version was signing, as migration 0013 finds
        // it: processing, no start recorded. Its backfill (run here as
        // written in the file) dates the start to the upgrade.
        db.exec(
            "INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('pre', 'default', 'acct', 'processing', '[]', 100, 1)",
        )
        .await;
        let migration = if crate::test_support::on_postgres() {
            include_str!("../migrations/postgres/0013_finalize_watch.sql")
        } else {
            include_str!("../migrations/sqlite/0013_finalize_watch.sql")
        };
        db.exec(&migration[migration.find("UPDATE orders").unwrap()..])
            .await;
        let upgraded = store.processing_since("pre").await.unwrap().unwrap();
        // The upgrade's time in milliseconds (not seconds): after 2023,
        // before 2096.
        assert!(
            (1_700_000_000_000..4_000_000_000_000).contains(&upgraded),
            "{upgraded}"
        );
        assert_eq!(store.processing_since("done").await.unwrap(), None);
        let unwatched = store
            .unwatched_finalizes("finalize_watch", 10)
            .await
            .unwrap();
        assert_eq!(
            unwatched,
            [
                ("older".to_owned(), 6000),
                ("old".to_owned(), 7000),
                ("pre".to_owned(), upgraded)
            ]
        );
        assert_eq!(
            store
                .unwatched_finalizes("finalize_watch", 1)
                .await
                .unwrap(),
            [("older".to_owned(), 6000)]
        );
        // A watch of another attempt does not count; one of this attempt
        // does.
        db.exec(
            "INSERT INTO jobs (kind, key, payload, status, attempts, max_attempts, run_at, created_at, updated_at)
                 VALUES ('finalize_watch', 'older@5999', '{}', 'queued', 0, 5, 1, 1, 1),
                        ('finalize_watch', 'old@7000', '{}', 'queued', 0, 5, 1, 1, 1)",
        )
        .await;
        assert_eq!(
            store
                .unwatched_finalizes("finalize_watch", 10)
                .await
                .unwrap(),
            [("older".to_owned(), 6000), ("pre".to_owned(), upgraded)]
        );
        store.close().await;
    }

    #[tokio::test]
    async fn an_order_stored_before_migration_6_lists_its_authorizations_by_position_and_its_certificate_once_backfilled()
     {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = open_in(dir.path()).await;
        // Rows as a database from before migration 0006 holds them: the
        // links and the certificate only in their own tables, the order's
        // new columns at their defaults. The positions run against the
        // ids' order: the list must follow the positions, not the primary
        // key's order. (The migration's backfill statement runs here as
        // written in the file; sqlx runs the whole file when a store
        // opens an older database.)
        let raw = Connection::open(&path).unwrap();
        raw.execute_batch(&format!(
            "{ACCOUNT}
             INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('ord', 'default', 'acct', 'valid', '[]', 2, 1),
                        ('bare', 'default', 'acct', 'pending', '[]', 2, 1);
             INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value, status, expires_at, created_at)
                 VALUES ('az-b', 'default', 'acct', 'dns', 'b.test', 'valid', 2, 1),
                        ('az-a', 'default', 'acct', 'dns', 'a.test', 'valid', 2, 1);
             INSERT INTO order_authorizations (order_id, authz_id, position)
                 VALUES ('ord', 'az-a', 1), ('ord', 'az-b', 0);
             INSERT INTO certificates (id, profile, order_id, account_id, serial, chain_pem, identifiers, not_before, not_after, created_at)
                 VALUES ('cert', 'default', 'ord', 'acct', '01', '', '[]', 1, 2, 1);"
        ))
        .unwrap();
        let migration = include_str!("../migrations/sqlite/0006_order_rows.sql");
        let backfill = &migration[migration.find("UPDATE orders").unwrap()..];
        raw.execute_batch(backfill).unwrap();
        drop(raw);

        let order = store.order("ord").await.unwrap().unwrap();
        assert_eq!(order.authorization_ids, ["az-b", "az-a"]);
        assert_eq!(order.certificate_id.as_deref(), Some("cert"));
        let bare = store.order("bare").await.unwrap().unwrap();
        assert!(bare.authorization_ids.is_empty());
        assert_eq!(bare.certificate_id, None);
        store.close().await;
    }
}
