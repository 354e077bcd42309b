//! Issued certificates, revocation (RFC 8555 §7.6) and CRLs (RFC 5280 §5).

use acme_proxy_protocol::types::{Identifier, OrderStatus};

use crate::accounts::{account_changed_raised, raised};
use crate::audit::{NewAuditRow, audit_args, insert_audit_in};
use crate::db::{Arg, Conn, Row, args, col};
use crate::jobs::{insert_jobs_in, insert_jobs_postgres, jobs_json};
use crate::{AccountGuard, NewJob, Result, Store, StoreError, to_json};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateRow {
    pub id: String,
    pub profile: String,
    pub order_id: String,
    pub account_id: String,
    /// Lowercase hex, no separators.
    pub serial: String,
    pub chain_pem: String,
    pub key_thumbprint: Option<String>,
    pub identifiers: Vec<Identifier>,
    pub not_before: i64,
    pub not_after: i64,
    pub revoked_at: Option<i64>,
    pub revocation_reason: Option<i64>,
    pub created_at: i64,
}

#[derive(Clone, Debug)]
pub struct NewCertificateRow<'a> {
    pub id: &'a str,
    pub profile: &'a str,
    pub order_id: &'a str,
    pub account_id: &'a str,
    pub serial: &'a str,
    pub chain_pem: &'a str,
    pub key_thumbprint: Option<&'a str>,
    pub identifiers: &'a [Identifier],
    pub not_before: i64,
    pub not_after: i64,
    pub now: i64,
}

impl NewCertificateRow<'_> {
    /// The row as it reads once stored.
    pub fn into_row(self) -> CertificateRow {
        CertificateRow {
            id: self.id.to_owned(),
            profile: self.profile.to_owned(),
            order_id: self.order_id.to_owned(),
            account_id: self.account_id.to_owned(),
            serial: self.serial.to_owned(),
            chain_pem: self.chain_pem.to_owned(),
            key_thumbprint: self.key_thumbprint.map(str::to_owned),
            identifiers: self.identifiers.to_vec(),
            not_before: self.not_before,
            not_after: self.not_after,
            revoked_at: None,
            revocation_reason: None,
            created_at: self.now,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RevokeOutcome {
    Revoked,
    AlreadyRevoked,
    NotFound,
}

/// One line of a CRL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevokedEntry {
    pub serial: String,
    pub revoked_at: i64,
    pub reason: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrlRow {
    pub number: i64,
    pub this_update: i64,
    pub next_update: i64,
    pub der: Vec<u8>,
    /// The profile's revocation count it was signed with
    /// ([`RevokedList::revocations`]); None for a CRL stored before counts
    /// were kept.
    pub revocations: Option<i64>,
}

/// What a CRL signed now lists, and the revocation count it covers: both
/// read in one snapshot, so a count means exactly these revocations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevokedList {
    pub entries: Vec<RevokedEntry>,
    /// Every revocation the profile has had, expired certificates and
    /// deleted ones included: it only grows.
    pub revocations: i64,
}

macro_rules! cert_columns {
    () => {
        "id, profile, order_id, account_id, serial, chain_pem, key_thumbprint, \
     identifiers, not_before, not_after, revoked_at, revocation_reason, created_at"
    };
}

/// A row of `cert_columns!`, read by position (a column added goes at the
/// end); one per issuance, when the certificate is downloaded.
fn cert_from_row(row: Row<'_>) -> Result<CertificateRow> {
    let identifiers: String = col(row, 7, "identifiers")?;
    Ok(CertificateRow {
        id: col(row, 0, "id")?,
        profile: col(row, 1, "profile")?,
        order_id: col(row, 2, "order_id")?,
        account_id: col(row, 3, "account_id")?,
        serial: col(row, 4, "serial")?,
        chain_pem: col(row, 5, "chain_pem")?,
        key_thumbprint: col(row, 6, "key_thumbprint")?,
        identifiers: serde_json::from_str(&identifiers)
            .map_err(|e| StoreError::Corrupt(format!("identifiers: {e}")))?,
        not_before: col(row, 8, "not_before")?,
        not_after: col(row, 9, "not_after")?,
        revoked_at: col(row, 10, "revoked_at")?,
        revocation_reason: col(row, 11, "revocation_reason")?,
        created_at: col(row, 12, "created_at")?,
    })
}

impl Store {
    /// Stores the certificate and moves its order processing → valid, in one
    /// transaction. False (nothing written) if the order was not processing:
    /// with the `UNIQUE (order_id)` constraint this makes "exactly one
    /// certificate per order" hold whatever the callers do. `notices` are
    /// queued, and the issuance's `audit` row written, with it.
    pub async fn complete_order(
        &self,
        cert: &NewCertificateRow<'_>,
        audit: &NewAuditRow<'_>,
        notices: &[NewJob<'_>],
    ) -> Result<bool> {
        self.complete(None, cert, audit, notices).await
    }

    /// [`Store::complete_order`] for an order that is still `ready`: the
    /// certificate (written only while the order is ready), ready → valid,
    /// the audit row and the notices, all in one transaction, for a signer
    /// that signs inside the request (the embedded CA). False, and nothing
    /// written, if the order was not ready — another finalize won, and the
    /// certificate its caller signed is never stored nor served — or had
    /// expired, or one of its authorizations was no longer valid or had
    /// expired (RFC 8555 §7.4), at the certificate's `now`: the write
    /// checks what a finalize checks before it signs, so a caller may sign
    /// without reading the order first.
    ///
    /// The order never passes through `processing`: a crash or an error
    /// anywhere before the commit leaves it ready to finalize again, and an
    /// issuance costs one write transaction less than a separate
    /// [`Store::begin_finalize`] (docs/performance.md).
    ///
    /// Errs with [`StoreError::AccountChanged`], writing nothing, unless
    /// `account` (the finalize request's) is still valid with its key.
    pub async fn complete_ready_order(
        &self,
        cert: &NewCertificateRow<'_>,
        audit: &NewAuditRow<'_>,
        notices: &[NewJob<'_>],
        account: AccountGuard<'_>,
    ) -> Result<bool> {
        self.complete(Some(account), cert, audit, notices).await
    }

    /// `from_ready`: the finalize request's account, for
    /// [`Store::complete_ready_order`]; `None` for an order already
    /// processing.
    async fn complete(
        &self,
        from_ready: Option<AccountGuard<'_>>,
        cert: &NewCertificateRow<'_>,
        audit: &NewAuditRow<'_>,
        notices: &[NewJob<'_>],
    ) -> Result<bool> {
        if let Some(account) = from_ready
            && self.is_postgres()
        {
            // The same statements in one function, the audit row and the
            // notices in the same statement: one round trip, which carries
            // the request's nonce (a finalize may come to it without a
            // read before).
            let mut conn = self.carrying_writer().await?;
            let identifiers = to_json(cert.identifiers);
            let audit_identifiers = audit.identifiers.map(to_json);
            let jobs = jobs_json(notices);
            let args = [
                args![account.id, account.key_thumbprint],
                &cert_args(cert, &identifiers),
                &audit_args(audit, &audit_identifiers, self.audit_origin),
                args![jobs],
            ]
            .concat();
            let done = match conn
                .scalar::<bool>(COMPLETE_READY_ORDER_POSTGRES, &args)
                .await
            {
                // The order left ready under the finalize, or a finalize
                // racing this one stored its certificate first: nothing
                // written, as when the transaction rolls back.
                Err(e)
                    if raised(&e, "AP002")
                        || e.is_unique_violation_of("order_id", "certificates_order_id_key") =>
                {
                    return Ok(false);
                }
                done => done.map_err(account_changed_raised)?,
            };
            return Ok(done == Some(true));
        }
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        if let Some(account) = from_ready {
            account.check_in(&mut tx).await?;
        }
        let from = match from_ready {
            Some(_) => OrderStatus::Ready,
            None => OrderStatus::Processing,
        };
        if !complete_order_in(&mut tx, cert, from).await? {
            return Ok(false);
        }
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        insert_jobs_in(&mut tx, notices).await?;
        tx.commit().await?;
        Ok(true)
    }

    pub async fn certificate(&self, id: &str) -> Result<Option<CertificateRow>> {
        self.point_reader()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    cert_columns!(),
                    " FROM certificates WHERE id = ?1"
                ),
                args![id],
                cert_from_row,
            )
            .await
    }

    /// How many unrevoked certificates expire in `[from, until)` (the
    /// expiry index: a count, not rows).
    pub async fn count_expiring_certificates(&self, from: i64, until: i64) -> Result<i64> {
        self.reader()
            .await?
            .one(
                "SELECT COUNT(*) FROM certificates
                 WHERE revoked_at IS NULL AND not_after >= ?1 AND not_after < ?2",
                args![from, until],
                |row| row.get(0),
            )
            .await
            .map(|n| n.unwrap_or(0))
    }

    /// Unrevoked certificates whose notAfter falls in `[from, until)`,
    /// soonest first, of one profile or all; without `renewed`, only those
    /// that no later unrevoked certificate of the same account and profile
    /// for the same identifiers has replaced (later: expiring later, or as
    /// late and issued after; of two issued in the same second, the one
    /// with the greater id stands for both).
    pub async fn expiring_certificates(
        &self,
        from: i64,
        until: i64,
        profile: Option<&str>,
        renewed: bool,
        limit: i64,
    ) -> Result<Vec<CertificateRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    cert_columns!(),
                    " FROM certificates c
                  WHERE c.revoked_at IS NULL AND c.not_after >= ?1 AND c.not_after < ?2
                    AND (?3 IS NULL OR c.profile = ?3)
                    AND (?4 OR NOT EXISTS (
                      SELECT 1 FROM certificates n
                       WHERE n.account_id = c.account_id AND n.profile = c.profile
                         AND n.identifiers = c.identifiers AND n.revoked_at IS NULL
                         AND (n.not_after > c.not_after
                              OR (n.not_after = c.not_after AND n.created_at > c.created_at)
                              OR (n.not_after = c.not_after AND n.created_at = c.created_at
                                  AND n.id > c.id))))
                  ORDER BY c.not_after, c.id LIMIT ?5"
                ),
                args![from, until, profile, renewed, limit],
                cert_from_row,
            )
            .await
    }

    pub async fn certificate_by_serial(
        &self,
        profile: &str,
        serial: &str,
    ) -> Result<Option<CertificateRow>> {
        self.reader()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    cert_columns!(),
                    " FROM certificates WHERE profile = ?1 AND serial = ?2"
                ),
                args![profile, serial],
                cert_from_row,
            )
            .await
    }

    /// Revokes once: a second revocation of one serial is `AlreadyRevoked`
    /// even when both race. `notices` are queued, and `audit` (its
    /// `certificate.revoked` row) written, with the revocation.
    pub async fn revoke_certificate(
        &self,
        profile: &str,
        serial: &str,
        reason: Option<i64>,
        now: i64,
        notices: &[NewJob<'_>],
        audit: Option<&NewAuditRow<'_>>,
    ) -> Result<RevokeOutcome> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = tx
            .exec(
                "UPDATE certificates SET revoked_at = ?1, revocation_reason = ?2
             WHERE profile = ?3 AND serial = ?4 AND revoked_at IS NULL",
                args![now, reason, profile, serial],
            )
            .await?;
        if changed == 1 {
            // The profile's revocation count rose with it (a trigger).
            insert_jobs_in(&mut tx, notices).await?;
            if let Some(audit) = audit {
                insert_audit_in(&mut tx, audit, self.audit_origin).await?;
            }
            tx.commit().await?;
            return Ok(RevokeOutcome::Revoked);
        }
        let exists = tx
            .exists(
                "SELECT 1 FROM certificates WHERE profile = ?1 AND serial = ?2",
                args![profile, serial],
            )
            .await?;
        Ok(if exists {
            RevokeOutcome::AlreadyRevoked
        } else {
            RevokeOutcome::NotFound
        })
    }

    /// Every revoked, not yet expired certificate of a profile, for its
    /// CRL, with the revocation count they make up (one statement: one
    /// snapshot on either engine).
    pub async fn revoked_entries(&self, profile: &str, now: i64) -> Result<RevokedList> {
        let rows = self.reader().await?.all(
            "SELECT n.revoked, c.serial, c.revoked_at, c.revocation_reason
             FROM (SELECT COALESCE((SELECT revoked FROM revocation_counts WHERE profile = ?1), 0) AS revoked) n
             LEFT JOIN certificates c
               ON c.profile = ?1 AND c.revoked_at IS NOT NULL AND c.not_after > ?2
             ORDER BY c.revoked_at, c.serial",
            args![profile, now],
            |row| {
                let revocations: i64 = row.get("revoked")?;
                let serial: Option<String> = row.get("serial")?;
                let entry = match serial {
                    Some(serial) => Some(RevokedEntry {
                        serial,
                        revoked_at: row.get("revoked_at")?,
                        reason: row.get("revocation_reason")?,
                    }),
                    None => None,
                };
                Ok((revocations, entry))
            },
        ).await?;
        // The outer row is always there: one row with no certificate when
        // nothing is listed.
        let revocations = rows
            .first()
            .map(|(n, _)| *n)
            .ok_or_else(|| StoreError::Corrupt("no revocation count returned".into()))?;
        Ok(RevokedList {
            entries: rows.into_iter().filter_map(|(_, e)| e).collect(),
            revocations,
        })
    }

    /// How many revocations the profile has had ([`RevokedList::revocations`]).
    pub async fn revocations(&self, profile: &str) -> Result<i64> {
        self.reader()
            .await?
            .scalar::<i64>(
                "SELECT COALESCE((SELECT revoked FROM revocation_counts WHERE profile = ?1), 0)",
                args![profile],
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("no revocation count returned".into()))
    }

    /// The newest CRL of a profile.
    pub async fn crl(&self, profile: &str) -> Result<Option<CrlRow>> {
        self.reader()
            .await?
            .one(
                "SELECT number, this_update, next_update, der, revocations FROM crls WHERE profile = ?1",
                args![profile],
                |row| {
                    Ok(CrlRow {
                        number: row.get("number")?,
                        this_update: row.get("this_update")?,
                        next_update: row.get("next_update")?,
                        der: row.get("der")?,
                        revocations: row.get("revocations")?,
                    })
                },
            )
            .await
    }

    /// Takes the profile's next CRL number, for a CRL about to be signed:
    /// one statement, so that two signers (processes, replicas) never get
    /// the same one, and numbers only grow (RFC 5280 §5.2.3). A number
    /// taken by a signing that then failed is skipped, which §5.2.3 allows.
    pub async fn reserve_crl_number(&self, profile: &str) -> Result<i64> {
        let number: Option<i64> = self
            .writer()
            .await?
            .scalar(
                // Past the stored CRL's number too, whatever wrote it.
                "INSERT INTO crl_numbers (profile, last)
                 VALUES (?1, COALESCE((SELECT number FROM crls WHERE profile = ?1), 0) + 1)
                 ON CONFLICT (profile) DO UPDATE SET last = CASE
                     WHEN crl_numbers.last >= COALESCE((SELECT number FROM crls WHERE profile = ?1), 0)
                     THEN crl_numbers.last + 1
                     ELSE (SELECT number FROM crls WHERE profile = ?1) + 1 END
                 RETURNING last",
                args![profile],
            )
            .await?;
        number.ok_or_else(|| StoreError::Corrupt("no CRL number returned".into()))
    }

    /// Stores a CRL unless a newer one (higher number) is already stored;
    /// returns whether it was stored.
    pub async fn store_crl(&self, profile: &str, crl: &CrlRow) -> Result<bool> {
        Ok(self.writer().await?.exec(
            "INSERT INTO crls (profile, number, this_update, next_update, der, revocations)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (profile) DO UPDATE SET number = excluded.number, this_update = excluded.this_update,
                 next_update = excluded.next_update, der = excluded.der, revocations = excluded.revocations
             WHERE excluded.number > crls.number",
            args![profile, crl.number, crl.this_update, crl.next_update, crl.der, crl.revocations],
        ).await? == 1)
    }
}

/// [`Store::complete_ready_order`] on PostgreSQL: its transaction as one
/// function (migration 0022, rewritten in 0024), and the audit row and the notices written
/// only when it returns true, in one statement. The function runs once,
/// first: the two inserts read its answer.
const COMPLETE_READY_ORDER_POSTGRES: &str = concat!(
    "WITH done AS MATERIALIZED (
         SELECT acme_complete_ready_order(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) AS ok
     ),
     logged AS (
         INSERT INTO audit_log (at, event, outcome, profile, actor, account_id, order_id, serial,
             identifiers, client_ip, reverse_name, user_agent, request_id, problem_type, detail, origin)
         SELECT ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29
           FROM done WHERE done.ok
     ),
     queued AS (",
    insert_jobs_postgres!("?30"),
    ")
     SELECT ok FROM done"
);

/// A new certificate's columns, in the order its insert takes them (here
/// and in the finalize function, migration 0024); `identifiers` is
/// `cert.identifiers` as JSON.
fn cert_args<'a>(cert: &'a NewCertificateRow<'a>, identifiers: &'a str) -> [Arg<'a>; 11] {
    [
        Arg::Text(Some(cert.id)),
        Arg::Text(Some(cert.profile)),
        Arg::Text(Some(cert.order_id)),
        Arg::Text(Some(cert.account_id)),
        Arg::Text(Some(cert.serial)),
        Arg::Text(Some(cert.chain_pem)),
        Arg::Text(cert.key_thumbprint),
        Arg::Text(Some(identifiers)),
        Arg::Int(Some(cert.not_before)),
        Arg::Int(Some(cert.not_after)),
        Arg::Int(Some(cert.now)),
    ]
}

/// The certificate row and `from` → valid (processing, or ready for a
/// finalize that completes in its own transaction), inside the caller's
/// transaction (`conn` is that transaction); false (nothing written) when
/// the order is not `from`.
pub(crate) async fn complete_order_in(
    conn: &mut Conn<'_>,
    cert: &NewCertificateRow<'_>,
    from: OrderStatus,
) -> Result<bool> {
    // Written only while the order is `from` (the guard and the insert
    // are one statement); the status change follows (a trigger wants the
    // certificate there first).
    let (insert, update) = match from {
        OrderStatus::Ready => (
            "INSERT INTO certificates (id, profile, order_id, account_id, serial, chain_pem, key_thumbprint,
                 identifiers, not_before, not_after, created_at)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11
              WHERE EXISTS (SELECT 1 FROM orders WHERE id = ?3 AND status = 'ready' AND expires_at > ?11)
                AND NOT EXISTS (SELECT 1 FROM order_authorizations oa
                                  JOIN authorizations a ON a.id = oa.authz_id
                                 WHERE oa.order_id = ?3
                                   AND (a.status <> 'valid' OR a.expires_at <= ?11))",
            "UPDATE orders SET status = 'valid', certificate_id = ?2 WHERE id = ?1 AND status = 'ready'",
        ),
        _ => (
            "INSERT INTO certificates (id, profile, order_id, account_id, serial, chain_pem, key_thumbprint,
                 identifiers, not_before, not_after, created_at)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11
              WHERE EXISTS (SELECT 1 FROM orders WHERE id = ?3 AND status = 'processing')",
            "UPDATE orders SET status = 'valid', certificate_id = ?2 WHERE id = ?1 AND status = 'processing'",
        ),
    };
    let identifiers = to_json(cert.identifiers);
    let inserted = conn.exec(insert, &cert_args(cert, &identifiers)).await?;
    if inserted != 1 {
        return Ok(false);
    }
    // Checked again: on PostgreSQL an abandon or a cancel can move the
    // order on between the insert's check and this update (which then
    // waits for it and matches nothing); the caller rolls back.
    let completed = conn.exec(update, args![cert.order_id, cert.id]).await?;
    Ok(completed == 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::test_support::{ACCOUNT, GUARD, TestDb, cert_row, issued_row};
    use crate::{AuditFilter, NewJob};

    #[tokio::test]
    async fn a_ready_order_is_not_completed_once_it_or_an_authorization_expired_or_one_was_deactivated()
     {
        let (db, store) = TestDb::open().await;
        // The certificates' `now` is 1: an expiry at 1 is past.
        db.exec(&format!(
            "{ACCOUNT}
             INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('deactivated', 'default', 'acct', 'ready', '[]', 10, 1),
                        ('lapsed', 'default', 'acct', 'ready', '[]', 10, 1),
                        ('expired', 'default', 'acct', 'ready', '[]', 1, 1),
                        ('fine', 'default', 'acct', 'ready', '[]', 10, 1);
             INSERT INTO authorizations (id, profile, account_id, identifier_type, identifier_value,
                     status, expires_at, created_at)
                 VALUES ('off', 'default', 'acct', 'dns', 'one.example', 'deactivated', 10, 1),
                        ('old', 'default', 'acct', 'dns', 'two.example', 'valid', 1, 1),
                        ('v1', 'default', 'acct', 'dns', 'three.example', 'valid', 10, 1),
                        ('v2', 'default', 'acct', 'dns', 'four.example', 'valid', 10, 1);
             INSERT INTO order_authorizations (order_id, authz_id, position)
                 VALUES ('deactivated', 'v1', 0), ('deactivated', 'off', 1),
                        ('lapsed', 'old', 0), ('expired', 'v2', 0),
                        ('fine', 'v1', 0), ('fine', 'v2', 1);"
        ))
        .await;
        for (n, order) in ["deactivated", "lapsed", "expired", "fine"]
            .into_iter()
            .enumerate()
        {
            let id = ["c1", "c2", "c3", "c4"][n];
            let done = store
                .complete_ready_order(&cert_row(id, order, id), &issued_row(order), &[], GUARD)
                .await
                .unwrap();
            assert_eq!(done, order == "fine", "{order}");
            let status = store.order(order).await.unwrap().unwrap().status;
            assert_eq!(
                status.as_str(),
                if done { "valid" } else { "ready" },
                "{order}"
            );
            assert_eq!(
                store.certificate(id).await.unwrap().is_some(),
                done,
                "{order}"
            );
        }
        let audited = store.audit_list(&AuditFilter::default(), 10).await.unwrap();
        assert_eq!(audited.len(), 1, "{audited:?}");
        store.close().await;
    }

    #[tokio::test]
    async fn only_a_ready_order_is_completed_and_a_refused_completion_writes_nothing() {
        let (db, store) = TestDb::open().await;
        db.exec(&format!(
            "{ACCOUNT}
             INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('ready', 'default', 'acct', 'ready', '[]', 2, 1),
                        ('pending', 'default', 'acct', 'pending', '[]', 2, 1),
                        ('clash', 'default', 'acct', 'ready', '[]', 2, 1);"
        ))
        .await;
        // Serials are the certificate ids, but c1 and c4 share one.
        let cert = |id: &'static str, order_id: &'static str| {
            cert_row(id, order_id, if id == "c4" { "c1" } else { id })
        };
        let audit = issued_row;
        let completed = |id: &'static str, order| {
            let store = store.clone();
            async move {
                let notice = NewJob {
                    kind: "notify",
                    key: id,
                    payload: "{}",
                    run_at: 1,
                    deadline: None,
                    max_attempts: 1,
                    fair_key: None,
                };
                store
                    .complete_ready_order(&cert(id, order), &audit(order), &[notice], GUARD)
                    .await
                    .unwrap()
            }
        };
        assert!(completed("c1", "ready").await);
        let order = store.order("ready").await.unwrap().unwrap();
        assert_eq!(
            (order.status.as_str(), order.certificate_id.as_deref()),
            ("valid", Some("c1"))
        );
        // Ready → valid in one update: the order never went processing,
        // whose update stamps `processing_since`.
        assert_eq!(
            db.scalar(
                "SELECT COUNT(*) FROM orders WHERE id = 'ready' AND processing_since IS NULL"
            )
            .await,
            1
        );
        // The order is valid now: a second finalize that signed too is
        // refused, and neither its certificate nor its audit row is kept.
        assert!(!completed("c2", "ready").await);
        // Never ready: nothing written either.
        assert!(!completed("c3", "pending").await);
        assert_eq!(
            store
                .order("pending")
                .await
                .unwrap()
                .unwrap()
                .status
                .as_str(),
            "pending"
        );
        // A certificate that cannot be stored (its serial is taken): the
        // processing step rolls back with it, the order is ready again.
        let clash = store
            .complete_ready_order(&cert("c4", "clash"), &audit("clash"), &[], GUARD)
            .await;
        assert!(clash.is_err(), "{clash:?}");
        assert_eq!(
            store.order("clash").await.unwrap().unwrap().status.as_str(),
            "ready"
        );
        for (id, kept) in [("c1", true), ("c2", false), ("c3", false), ("c4", false)] {
            assert_eq!(store.certificate(id).await.unwrap().is_some(), kept, "{id}");
        }
        let audited = store.audit_list(&AuditFilter::default(), 10).await.unwrap();
        assert_eq!(audited.len(), 1, "{audited:?}");
        assert_eq!(audited[0].order_id.as_deref(), Some("ready"));
        assert_eq!(
            store.job_counts().await.unwrap().by_kind_and_status,
            [("notify".to_owned(), "queued".to_owned(), 1)]
        );
        store.close().await;
    }

    #[tokio::test]
    async fn each_revocation_counts_once_read_with_the_crl_entries_and_deleting_certificates_keeps_the_count()
     {
        let (db, store) = TestDb::open().await;
        db.exec(&format!(
            "{ACCOUNT}
             INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('o1', 'p', 'acct', 'pending', '[]', 2, 1),
                        ('o2', 'p', 'acct', 'pending', '[]', 2, 1),
                        ('o3', 'q', 'acct', 'pending', '[]', 2, 1),
                        ('o4', 'q', 'acct', 'pending', '[]', 2, 1);
             INSERT INTO certificates (id, profile, order_id, account_id, serial, chain_pem,
                     identifiers, not_before, not_after, created_at)
                 VALUES ('c1', 'p', 'o1', 'acct', '01', 'pem', '[]', 0, 100, 0),
                        ('c2', 'p', 'o2', 'acct', '02', 'pem', '[]', 0, 1000, 0),
                        ('c3', 'q', 'o3', 'acct', '03', 'pem', '[]', 0, 1000, 0),
                        ('c4', 'q', 'o4', 'acct', '04', 'pem', '[]', 0, 1000, 0);"
        ))
        .await;
        let none = store.revoked_entries("p", 50).await.unwrap();
        assert_eq!((none.entries.len(), none.revocations), (0, 0));
        let revoke = |profile: &'static str, serial: &'static str, at: i64| {
            let store = store.clone();
            async move {
                store
                    .revoke_certificate(profile, serial, Some(1), at, &[], None)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(revoke("p", "02", 20).await, super::RevokeOutcome::Revoked);
        assert_eq!(revoke("p", "01", 10).await, super::RevokeOutcome::Revoked);
        // Refused revocations count nothing.
        assert_eq!(
            revoke("p", "01", 30).await,
            super::RevokeOutcome::AlreadyRevoked
        );
        assert_eq!(revoke("p", "09", 30).await, super::RevokeOutcome::NotFound);
        assert_eq!(revoke("q", "03", 30).await, super::RevokeOutcome::Revoked);

        let listed = store.revoked_entries("p", 50).await.unwrap();
        let serials: Vec<_> = listed.entries.iter().map(|e| e.serial.as_str()).collect();
        assert_eq!((serials, listed.revocations), (vec!["01", "02"], 2));
        assert_eq!(listed.entries[0].revoked_at, 10);
        // Past c1's expiry it is no longer listed, but still counted.
        let later = store.revoked_entries("p", 500).await.unwrap();
        let serials: Vec<_> = later.entries.iter().map(|e| e.serial.as_str()).collect();
        assert_eq!((serials, later.revocations), (vec!["02"], 2));
        db.exec("DELETE FROM certificates WHERE id = 'c1'").await;
        assert_eq!(store.revocations("p").await.unwrap(), 2);
        assert_eq!(store.revocations("q").await.unwrap(), 1);
        assert_eq!(store.revocations("r").await.unwrap(), 0);
        // Whatever writes the revocation (an older replica during an
        // upgrade, an operator's SQL), it is counted.
        db.exec("UPDATE certificates SET revoked_at = 40 WHERE id = 'c4'")
            .await;
        db.exec("UPDATE certificates SET revoked_at = 50 WHERE id = 'c4'")
            .await;
        assert_eq!(store.revocations("q").await.unwrap(), 2);

        // A CRL keeps the count it was signed with.
        let crl = crate::CrlRow {
            number: 1,
            this_update: 50,
            next_update: 150,
            der: vec![1],
            revocations: Some(2),
        };
        assert!(store.store_crl("p", &crl).await.unwrap());
        assert_eq!(store.crl("p").await.unwrap(), Some(crl));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_processes_taking_crl_numbers_at_once_never_get_the_same_one_and_follow_the_stored_crl()
     {
        let (db, first) = TestDb::open().await;
        let second = crate::Store::open(db.url(), &crate::StoreOptions::default())
            .await
            .unwrap();
        // A CRL stored without a reservation (copied in, say): numbers go
        // on after it.
        first
            .store_crl(
                "p",
                &crate::CrlRow {
                    number: 7,
                    this_update: 1,
                    next_update: 2,
                    der: vec![0],
                    revocations: None,
                },
            )
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for store in [first.clone(), second.clone()] {
            for _ in 0..25 {
                let store = store.clone();
                tasks.push(tokio::spawn(
                    async move { store.reserve_crl_number("p").await },
                ));
            }
        }
        let mut numbers = Vec::new();
        for task in tasks {
            numbers.push(task.await.unwrap().unwrap());
        }
        numbers.sort_unstable();
        assert_eq!(numbers, (8..58).collect::<Vec<i64>>());
        assert_eq!(second.reserve_crl_number("q").await.unwrap(), 1);
    }
}
