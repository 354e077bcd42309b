//! Operators' deletions: an order or an account and everything that hangs
//! off it, in one transaction, refused while something still needs it.
//! The audit log has no foreign keys, so its rows outlive what they describe.

use crate::audit::insert_audit_in;
use crate::db::{Conn, args};
use crate::{NewAuditRow, Result, Store};

/// What a deletion did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    NotFound,
    /// Something still needs the row.
    Refused(Blocker),
}

/// What a deletion must wait for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// A certificate that has not expired: it stays for revocation and
    /// the CRL until `not_after` (Unix seconds).
    Unexpired { serial: String, not_after: i64 },
    /// An order being validated or finalized: its job would lose its
    /// subject.
    InFlight { order: String },
}

/// Which orders a deletion covers: one order, or all of one account's.
#[derive(Clone, Copy)]
enum Scope {
    Order,
    Account,
}

/// A static SQL text with the scope's WHERE clause on `o` (bound to `?1`)
/// between `$before` and `$after`: no SQL is built at run time.
macro_rules! scoped {
    ($scope:expr, $before:literal, $after:literal) => {
        match $scope {
            Scope::Order => concat!($before, "o.id = ?1", $after),
            Scope::Account => concat!($before, "o.account_id = ?1", $after),
        }
    };
}

/// Why a deletion must wait, if anything does: a certificate that has not
/// expired (it belongs on the CRL and may still be revoked), an order being
/// finalized, or a challenge being validated (their jobs would lose their
/// subject).
async fn blocker(conn: &mut Conn<'_>, scope: Scope, id: &str, now: i64) -> Result<Option<Blocker>> {
    let unexpired: Option<(String, i64)> = conn.one(
        scoped!(
            scope,
            "SELECT c.serial, c.not_after FROM certificates c JOIN orders o ON o.id = c.order_id WHERE ",
            " AND c.not_after > ?2 ORDER BY c.not_after DESC LIMIT 1"
        ),
        args![id, now],
        |row| Ok((row.get("serial")?, row.get("not_after")?)),
    ).await?;
    if let Some((serial, not_after)) = unexpired {
        return Ok(Some(Blocker::Unexpired { serial, not_after }));
    }
    let busy: Option<String> = conn
        .scalar(
            scoped!(
                scope,
                "SELECT o.id FROM orders o WHERE ",
                " AND (o.status = 'processing' OR EXISTS (
             SELECT 1 FROM order_authorizations oa JOIN challenges ch ON ch.authz_id = oa.authz_id
             WHERE oa.order_id = o.id AND ch.status = 'processing'))
         LIMIT 1"
            ),
            args![id],
        )
        .await?;
    Ok(busy.map(|order| Blocker::InFlight { order }))
}

/// Deletes the authorizations (and their challenges) of `account_id` that
/// no order links any more.
async fn delete_orphan_authorizations(conn: &mut Conn<'_>, account_id: &str) -> Result<()> {
    macro_rules! orphans {
        () => {
            "(SELECT a.id FROM authorizations a WHERE a.account_id = ?1
              AND NOT EXISTS (SELECT 1 FROM order_authorizations oa WHERE oa.authz_id = a.id))"
        };
    }
    for sql in [
        concat!("DELETE FROM challenges WHERE authz_id IN ", orphans!()),
        concat!("DELETE FROM authorizations WHERE id IN ", orphans!()),
    ] {
        conn.exec(sql, args![account_id]).await?;
    }
    Ok(())
}

/// Deletes the orders in `scope` and what hangs off them: expired
/// certificates, relay mappings, links to authorizations.
async fn delete_orders(conn: &mut Conn<'_>, scope: Scope, id: &str) -> Result<()> {
    for sql in [
        scoped!(
            scope,
            "DELETE FROM certificates WHERE order_id IN (SELECT o.id FROM orders o WHERE ",
            ")"
        ),
        scoped!(
            scope,
            "DELETE FROM upstream_orders WHERE order_id IN (SELECT o.id FROM orders o WHERE ",
            ")"
        ),
        scoped!(
            scope,
            "DELETE FROM order_authorizations WHERE order_id IN (SELECT o.id FROM orders o WHERE ",
            ")"
        ),
        scoped!(
            scope,
            "DELETE FROM orders WHERE id IN (SELECT o.id FROM orders o WHERE ",
            ")"
        ),
    ] {
        conn.exec(sql, args![id]).await?;
    }
    Ok(())
}

impl Store {
    /// Deletes an order with its certificate (expired), relay mapping and
    /// the authorizations no other order uses; `audit`, its row, is
    /// written in the same transaction.
    pub async fn delete_order(
        &self,
        id: &str,
        now: i64,
        audit: Option<&NewAuditRow<'_>>,
    ) -> Result<DeleteOutcome> {
        // IMMEDIATE (as every `begin`): these run beside a serving process;
        // taking the write lock first means waiting for it (busy timeout)
        // rather than failing when the server commits between our first
        // read and first write.
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        // On PostgreSQL the order's row is locked before the checks below:
        // a finalize committing in between would otherwise go unseen by
        // them, and the order be deleted under its job. (SQLite's single
        // writer already keeps it out.)
        let sql = if tx.is_postgres() {
            "SELECT account_id FROM orders WHERE id = ?1 FOR UPDATE"
        } else {
            "SELECT account_id FROM orders WHERE id = ?1"
        };
        let account: Option<String> = tx.scalar(sql, args![id]).await?;
        let Some(account) = account else {
            return Ok(DeleteOutcome::NotFound);
        };
        if let Some(why) = blocker(&mut tx, Scope::Order, id, now).await? {
            return Ok(DeleteOutcome::Refused(why));
        }
        delete_orders(&mut tx, Scope::Order, id).await?;
        delete_orphan_authorizations(&mut tx, &account).await?;
        if let Some(audit) = audit {
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(DeleteOutcome::Deleted)
    }

    /// Deletes an account with all its orders, authorizations and expired
    /// certificates; `audit`, its row, is written in the same transaction.
    pub async fn delete_account(
        &self,
        id: &str,
        now: i64,
        audit: Option<&NewAuditRow<'_>>,
    ) -> Result<DeleteOutcome> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        // On PostgreSQL: the account locked first (a write of the account
        // checks it `FOR SHARE`, so no new order starts), then its orders
        // (so none moves on unseen by the checks below).
        let sql = if tx.is_postgres() {
            "SELECT id FROM accounts WHERE id = ?1 FOR UPDATE"
        } else {
            "SELECT id FROM accounts WHERE id = ?1"
        };
        let exists: Option<String> = tx.scalar(sql, args![id]).await?;
        if exists.is_none() {
            return Ok(DeleteOutcome::NotFound);
        }
        if tx.is_postgres() {
            tx.exec(
                "SELECT 1 FROM orders WHERE account_id = ?1 FOR UPDATE",
                args![id],
            )
            .await?;
        }
        if let Some(why) = blocker(&mut tx, Scope::Account, id, now).await? {
            return Ok(DeleteOutcome::Refused(why));
        }
        delete_orders(&mut tx, Scope::Account, id).await?;
        delete_orphan_authorizations(&mut tx, id).await?;
        tx.exec("DELETE FROM accounts WHERE id = ?1", args![id])
            .await?;
        if let Some(audit) = audit {
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(DeleteOutcome::Deleted)
    }
}
