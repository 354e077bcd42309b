//! The relay's rows: each relay profile's upstream account, and the mapping
//! from a local order to the order placed at the upstream CA.

use acme_proxy_protocol::Problem;
use acme_proxy_protocol::types::OrderStatus;

use crate::audit::{NewAuditRow, insert_audit_in};
use crate::certificates::{NewCertificateRow, complete_order_in};
use crate::db::{Row, args};
use crate::jobs::{insert_job_in, insert_jobs_in};
use crate::{NewJob, Result, Store, parse_text, to_json};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamAccountRow {
    pub profile: String,
    /// The upstream's name in the profile's configuration.
    pub upstream: String,
    pub directory: String,
    pub account_url: String,
    pub key_thumbprint: String,
    pub created_at: i64,
}

/// The mapping row of one relayed order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamOrderRow {
    pub order_id: String,
    pub profile: String,
    pub account_id: String,
    pub csr_der: Vec<u8>,
    pub upstream_url: Option<String>,
    /// The upstream that accepted it (or holds its reservation); None:
    /// none yet, or the profile's preferred one (recorded before there
    /// could be more than one).
    pub upstream: Option<String>,
    /// When the upstream finalize was about to be sent (ms): the order
    /// never moves to another upstream after that.
    pub finalize_sent_at: Option<i64>,
    /// The upstream it moved away from, if it did.
    pub moved_from: Option<String>,
    /// `processing`, then `valid` or `invalid`: the order's own statuses
    /// from finalize on (RFC 8555 §7.1.6).
    pub status: OrderStatus,
    pub certificate_url: Option<String>,
    pub error: Option<String>,
    pub client_ip: Option<String>,
    pub reverse_name: Option<String>,
    pub user_agent: Option<String>,
    pub request_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What the finalize request records before answering `processing`.
#[derive(Clone, Debug)]
pub struct NewUpstreamOrder<'a> {
    pub order_id: &'a str,
    pub profile: &'a str,
    pub account_id: &'a str,
    pub csr_der: &'a [u8],
    pub client_ip: Option<&'a str>,
    pub reverse_name: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    pub request_id: Option<&'a str>,
    pub now: i64,
}

macro_rules! upstream_order_columns {
    () => {
        "order_id, profile, account_id, csr_der, upstream_url, status, certificate_url, error, \
         client_ip, reverse_name, user_agent, request_id, created_at, updated_at, upstream, \
         finalize_sent_at, moved_from"
    };
}

fn upstream_order_from_row(row: Row<'_>) -> Result<UpstreamOrderRow> {
    Ok(UpstreamOrderRow {
        order_id: row.get("order_id")?,
        profile: row.get("profile")?,
        account_id: row.get("account_id")?,
        csr_der: row.get("csr_der")?,
        upstream_url: row.get("upstream_url")?,
        upstream: row.get("upstream")?,
        finalize_sent_at: row.get("finalize_sent_at")?,
        moved_from: row.get("moved_from")?,
        status: parse_text(&row.get::<String>("status")?, "upstream_orders.status")?,
        certificate_url: row.get("certificate_url")?,
        error: row.get("error")?,
        client_ip: row.get("client_ip")?,
        reverse_name: row.get("reverse_name")?,
        user_agent: row.get("user_agent")?,
        request_id: row.get("request_id")?,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
    })
}

impl Store {
    /// The account of `profile` at its upstream `upstream`.
    pub async fn upstream_account(
        &self,
        profile: &str,
        upstream: &str,
    ) -> Result<Option<UpstreamAccountRow>> {
        self.reader()
            .await?
            .one(
                "SELECT profile, upstream, directory, account_url, key_thumbprint, created_at
             FROM upstream_accounts WHERE profile = ?1 AND upstream = ?2",
                args![profile, upstream],
                |r| {
                    Ok(UpstreamAccountRow {
                        profile: r.get("profile")?,
                        upstream: r.get("upstream")?,
                        directory: r.get("directory")?,
                        account_url: r.get("account_url")?,
                        key_thumbprint: r.get("key_thumbprint")?,
                        created_at: r.get("created_at")?,
                    })
                },
            )
            .await
    }

    /// Records (or replaces, after a re-registration) a profile's upstream account.
    pub async fn save_upstream_account(&self, row: &UpstreamAccountRow) -> Result<()> {
        self.writer().await?.exec(
            "INSERT INTO upstream_accounts (profile, directory, account_url, key_thumbprint, created_at, upstream)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (profile, upstream) DO UPDATE SET directory = excluded.directory,
                 account_url = excluded.account_url, key_thumbprint = excluded.key_thumbprint,
                 created_at = excluded.created_at",
            args![
                row.profile,
                row.directory,
                row.account_url,
                row.key_thumbprint,
                row.created_at,
                row.upstream,
            ],
        ).await?;
        Ok(())
    }

    /// finalize of a relayed order, in one transaction: ready → processing,
    /// the mapping row (with the CSR; no upstream order yet), and the job.
    /// False when the order was not ready (another finalize won).
    /// Errs with [`crate::StoreError::AccountChanged`] unless `account` is
    /// still valid with its key.
    pub async fn begin_relay(
        &self,
        row: &NewUpstreamOrder<'_>,
        job: &NewJob<'_>,
        now_ms: i64,
        account: crate::AccountGuard<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        account.check_in(&mut tx).await?;
        let started = tx
            .exec(
                "UPDATE orders SET status = 'processing' WHERE id = ?1 AND status = 'ready'",
                args![row.order_id],
            )
            .await?
            == 1;
        if !started {
            return Ok(false);
        }
        // A mapping left by an earlier finalize that the upstream refused
        // (the order went back to ready) is replaced.
        tx.exec(
            "DELETE FROM upstream_orders WHERE order_id = ?1",
            args![row.order_id],
        )
        .await?;
        tx.exec(
            concat!(
                "INSERT INTO upstream_orders (",
                upstream_order_columns!(),
                ") VALUES (?1, ?2, ?3, ?4, NULL, 'processing', NULL, NULL, ?5, ?6, ?7, ?8, ?9, ?9, NULL, NULL, NULL)"
            ),
            args![
                row.order_id,
                row.profile,
                row.account_id,
                row.csr_der,
                row.client_ip,
                row.reverse_name,
                row.user_agent,
                row.request_id,
                row.now,
            ],
        )
        .await?;
        insert_job_in(&mut tx, job, now_ms).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Undoes [`Store::begin_relay`] when the upstream refused the order for
    /// good before anything else ran: the mapping goes, the queued job is
    /// cancelled, the order is ready again. False if the job already started
    /// (then it owns the outcome and nothing changes).
    pub async fn undo_relay(&self, order_id: &str, job_kind: &str, now_ms: i64) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let cancelled = tx
            .exec(
                "UPDATE jobs SET status = 'cancelled', finished_at = ?1, updated_at = ?1,
                 last_error = 'the upstream refused the order at finalize'
             WHERE kind = ?2 AND key = ?3 AND status = 'queued' AND attempts = 0",
                args![now_ms, job_kind, order_id],
            )
            .await?
            == 1;
        if !cancelled {
            return Ok(false);
        }
        tx.exec(
            "DELETE FROM upstream_orders WHERE order_id = ?1 AND status = 'processing'",
            args![order_id],
        )
        .await?;
        tx.exec(
            "UPDATE orders SET status = 'ready' WHERE id = ?1 AND status = 'processing'",
            args![order_id],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records the upstream order URL, made at `upstream`, unless one is
    /// already recorded (the job and the finalize request may both have
    /// created one; the first recorded wins). Returns the URL in force and
    /// the upstream it was made at.
    pub async fn set_upstream_url(
        &self,
        order_id: &str,
        upstream: &str,
        url: &str,
        now: i64,
    ) -> Result<Option<(String, Option<String>)>> {
        let mut conn = self.writer().await?;
        conn.exec(
            "UPDATE upstream_orders SET upstream_url = ?1, upstream = ?4, updated_at = ?2
             WHERE order_id = ?3 AND upstream_url IS NULL",
            args![url, now, order_id, upstream],
        )
        .await?;
        let found = conn
            .one(
                "SELECT upstream_url, upstream FROM upstream_orders WHERE order_id = ?1",
                args![order_id],
                |r| {
                    Ok((
                        r.get::<Option<String>>("upstream_url")?,
                        r.get::<Option<String>>("upstream")?,
                    ))
                },
            )
            .await?;
        Ok(found.and_then(|(url, upstream)| Some((url?, upstream))))
    }

    /// Records that the upstream finalize of `order_id` at its upstream
    /// order `upstream_url` is about to be sent (before it is: a crash
    /// between the two leaves an order that does not move, which is safe).
    /// From then on it stays where it is. False, and nothing written, when
    /// the order no longer waits there: a runner whose lease lapsed must
    /// not finalize at an upstream another runner has moved the order off,
    /// or after it was settled.
    pub async fn mark_upstream_finalize(
        &self,
        order_id: &str,
        upstream_url: &str,
        now_ms: i64,
    ) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE upstream_orders SET finalize_sent_at = COALESCE(finalize_sent_at, ?2)
                 WHERE order_id = ?1 AND status = 'processing' AND upstream_url = ?3",
                args![order_id, now_ms, upstream_url],
            )
            .await?
            == 1)
    }

    /// Moves the relayed order `order_id` off its upstream `from_name`
    /// (recorded on the mapping as `from`: None for one recorded before
    /// upstreams had names), in one transaction with `audit`: its upstream
    /// order, if it has one there, forgotten, its reservation given back,
    /// `moved_from` set, so that the job places it anew further down the
    /// list. Only while it is processing and its finalize was never sent;
    /// false (nothing changed) otherwise.
    pub async fn move_relay(
        &self,
        order_id: &str,
        from: Option<&str>,
        from_name: &str,
        now: i64,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let moved = tx
            .exec(
                "UPDATE upstream_orders SET upstream_url = NULL, upstream = NULL, authorizations = 0,
                     moved_from = ?2, updated_at = ?3
                 WHERE order_id = ?1 AND status = 'processing' AND finalize_sent_at IS NULL
                   AND (upstream_url IS NULL OR COALESCE(upstream, '') = ?4)",
                args![order_id, from_name, now, from.unwrap_or("")],
            )
            .await?
            == 1;
        if !moved {
            return Ok(false);
        }
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The upstream that accepted the relayed order `order_id`, if it is
    /// one and it was recorded (a read, for renewal information and
    /// revocation of its certificate).
    pub async fn relayed_by(&self, order_id: &str) -> Result<Option<String>> {
        Ok(self
            .reader()
            .await?
            .scalar::<Option<String>>(
                "SELECT upstream FROM upstream_orders WHERE order_id = ?1",
                args![order_id],
            )
            .await?
            .flatten())
    }

    pub async fn upstream_order(&self, order_id: &str) -> Result<Option<UpstreamOrderRow>> {
        self.writer()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    upstream_order_columns!(),
                    " FROM upstream_orders WHERE order_id = ?1"
                ),
                args![order_id],
                upstream_order_from_row,
            )
            .await
    }

    /// How many relayed orders are in flight (processing), and when the
    /// oldest of them was created (Unix seconds).
    pub async fn relay_in_flight(&self) -> Result<(i64, Option<i64>)> {
        self.reader()
            .await?
            .one(
                "SELECT COUNT(*), MIN(created_at) FROM upstream_orders WHERE status = 'processing'",
                &[],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .await
            .map(|found| found.unwrap_or((0, None)))
    }

    /// Mapping rows, newest first, optionally of one status.
    pub async fn upstream_orders(
        &self,
        status: Option<OrderStatus>,
        before: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<UpstreamOrderRow>> {
        let (before_at, before_id) = before.unzip();
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    upstream_order_columns!(),
                    " FROM upstream_orders WHERE (?1 IS NULL OR status = ?1)
               AND (?2 IS NULL OR created_at < ?2 OR (created_at = ?2 AND order_id < ?3))
             ORDER BY created_at DESC, order_id DESC LIMIT ?4"
                ),
                args![status.map(OrderStatus::as_str), before_at, before_id, limit],
                upstream_order_from_row,
            )
            .await
    }

    /// Reserves `count` authorizations at `profile`'s upstream `upstream`
    /// for the relayed order `order_id` before it is sent there: true when
    /// the orders in flight there hold no more than `max` with them (the
    /// order's own earlier reservation not counted twice) or hold none at
    /// all (an order bigger than the budget goes alone rather than never),
    /// false (nothing reserved) when they would hold more. Serialised per
    /// upstream, so that two jobs (of two replicas) cannot both take the
    /// last room.
    pub async fn reserve_upstream_authorizations(
        &self,
        order_id: &str,
        profile: &str,
        upstream: &str,
        count: i64,
        max: i64,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        if tx.is_postgres() {
            let lock = format!("acme_proxy.upstream_authorizations.{profile}.{upstream}");
            tx.exec("SELECT pg_advisory_xact_lock(hashtext(?1))", args![lock])
                .await?;
        }
        let held: i64 = tx
            .scalar(
                "SELECT CAST(COALESCE(SUM(authorizations), 0) AS BIGINT) FROM upstream_orders
                 WHERE profile = ?1 AND upstream = ?3 AND status = 'processing' AND order_id <> ?2",
                args![profile, order_id, upstream],
            )
            .await?
            .unwrap_or(0);
        if held > 0 && held.saturating_add(count) > max {
            return Ok(false);
        }
        tx.exec(
            "UPDATE upstream_orders SET authorizations = ?2, upstream = ?3
             WHERE order_id = ?1 AND upstream_url IS NULL",
            args![order_id, count, upstream],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Gives back what [`Self::reserve_upstream_authorizations`] reserved
    /// for an order the upstream then did not make (one it made keeps its
    /// reservation while it is processing).
    pub async fn release_upstream_authorizations(&self, order_id: &str) -> Result<()> {
        self.writer()
            .await?
            .exec(
                "UPDATE upstream_orders SET authorizations = 0
                 WHERE order_id = ?1 AND upstream_url IS NULL",
                args![order_id],
            )
            .await?;
        Ok(())
    }

    /// How many of `profile`'s relayed orders are still processing, per
    /// upstream that accepted them (None: not sent anywhere yet, or sent
    /// to the preferred upstream before upstreams had names).
    pub async fn relays_in_flight(&self, profile: &str) -> Result<Vec<(Option<String>, i64)>> {
        self.reader()
            .await?
            .all(
                "SELECT upstream, COUNT(*) AS n FROM upstream_orders
                 WHERE profile = ?1 AND status = 'processing' GROUP BY upstream ORDER BY upstream",
                args![profile],
                |r| Ok((r.get::<Option<String>>("upstream")?, r.get::<i64>("n")?)),
            )
            .await
    }

    /// Settles a relayed order in one transaction: the certificate and
    /// processing → valid, the mapping valid with the certificate URL, and
    /// the audit row. False when the order was no longer processing.
    pub async fn settle_relay(
        &self,
        cert: &NewCertificateRow<'_>,
        certificate_url: &str,
        audit: &NewAuditRow<'_>,
        notices: &[NewJob<'_>],
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        if !complete_order_in(&mut tx, cert, OrderStatus::Processing).await? {
            return Ok(false);
        }
        tx.exec(
            "UPDATE upstream_orders SET status = 'valid', certificate_url = ?1, error = NULL, updated_at = ?2
             WHERE order_id = ?3",
            args![certificate_url, cert.now, cert.order_id],
        ).await?;
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        insert_jobs_in(&mut tx, notices).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Abandons a relayed order in one transaction: processing → invalid
    /// with the client's (generic) problem, the mapping invalid with the
    /// real reason, and the audit row. Idempotent: false, and nothing
    /// written, when the order had already left processing.
    pub async fn abandon_relay(
        &self,
        order_id: &str,
        client_problem: &Problem,
        reason: &str,
        audit: &NewAuditRow<'_>,
        notices: &[NewJob<'_>],
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let failed = tx.exec(
            "UPDATE orders SET status = 'invalid', error = ?1 WHERE id = ?2 AND status = 'processing'",
            args![to_json(client_problem), order_id],
        ).await? == 1;
        if !failed {
            return Ok(false);
        }
        tx.exec(
            "UPDATE upstream_orders SET status = 'invalid', error = ?1, updated_at = ?2
             WHERE order_id = ?3 AND status = 'processing'",
            args![reason, audit.at, order_id],
        )
        .await?;
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        insert_jobs_in(&mut tx, notices).await?;
        tx.commit().await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::test_support::{ACCOUNT, TestDb};

    #[tokio::test]
    async fn upstream_authorizations_are_reserved_within_the_budget_and_kept_once_sent() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        for id in ["a", "b", "c"] {
            db.exec(&format!(
                "INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                     VALUES ('{id}', 'default', 'acct', 'processing', '[]', 100, 1);
                 INSERT INTO upstream_orders (order_id, profile, account_id, csr_der, status, created_at, updated_at)
                     VALUES ('{id}', 'default', 'acct', '\\x00', 'processing', 1, 1);"
            ))
            .await;
        }
        // An order bigger than the budget goes alone, when nothing is held.
        assert!(
            store
                .reserve_upstream_authorizations("a", "default", "A", 3, 2)
                .await
                .unwrap()
        );
        assert!(
            !store
                .reserve_upstream_authorizations("b", "default", "A", 1, 2)
                .await
                .unwrap()
        );
        // Given back by an order the upstream did not make…
        store.release_upstream_authorizations("a").await.unwrap();
        assert!(
            store
                .reserve_upstream_authorizations("b", "default", "A", 1, 2)
                .await
                .unwrap()
        );
        // …but kept by one it made, until it settles.
        store
            .set_upstream_url("b", "A", "https://ca/order/b", 2)
            .await
            .unwrap();
        store.release_upstream_authorizations("b").await.unwrap();
        assert!(
            !store
                .reserve_upstream_authorizations("c", "default", "A", 2, 2)
                .await
                .unwrap()
        );
        // Another upstream's reservations are its own.
        assert!(
            store
                .reserve_upstream_authorizations("c", "default", "B", 2, 2)
                .await
                .unwrap()
        );
        store.release_upstream_authorizations("c").await.unwrap();
        // Its own earlier reservation is not counted twice.
        assert!(
            store
                .reserve_upstream_authorizations("b", "default", "A", 1, 2)
                .await
                .unwrap()
        );
        assert!(
            store
                .reserve_upstream_authorizations("c", "default", "A", 1, 2)
                .await
                .unwrap()
        );
        store.close().await;
    }

    #[tokio::test]
    async fn an_upstream_finalize_is_marked_only_while_the_order_waits_at_that_upstream_order() {
        let (db, store) = TestDb::open().await;
        db.exec(ACCOUNT).await;
        db.exec(
            "INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('o', 'default', 'acct', 'processing', '[]', 100, 1);
             INSERT INTO upstream_orders (order_id, profile, account_id, csr_der, status, created_at, updated_at)
                 VALUES ('o', 'default', 'acct', '\\x00', 'processing', 1, 1);",
        )
        .await;
        let sent_at = |store: &crate::Store| {
            let store = store.clone();
            async move {
                store
                    .reader()
                    .await
                    .unwrap()
                    .scalar::<Option<i64>>(
                        "SELECT finalize_sent_at FROM upstream_orders WHERE order_id = 'o'",
                        crate::db::args![],
                    )
                    .await
                    .unwrap()
                    .flatten()
            }
        };
        // No upstream order yet: nothing to finalize.
        assert!(
            !store
                .mark_upstream_finalize("o", "https://a/order/1", 5)
                .await
                .unwrap()
        );
        store
            .set_upstream_url("o", "A", "https://a/order/1", 2)
            .await
            .unwrap();
        // Another upstream order's runner (one whose lease lapsed while the
        // order moved on) is refused, and nothing is written.
        assert!(
            !store
                .mark_upstream_finalize("o", "https://b/order/9", 5)
                .await
                .unwrap()
        );
        assert_eq!(sent_at(&store).await, None);
        assert!(
            store
                .mark_upstream_finalize("o", "https://a/order/1", 6)
                .await
                .unwrap()
        );
        assert_eq!(sent_at(&store).await, Some(6));
        // Sent again after a crash: still there, the first time kept.
        assert!(
            store
                .mark_upstream_finalize("o", "https://a/order/1", 9)
                .await
                .unwrap()
        );
        assert_eq!(sent_at(&store).await, Some(6));
        // Settled: no finalize any more.
        db.exec("UPDATE upstream_orders SET status = 'valid' WHERE order_id = 'o'")
            .await;
        assert!(
            !store
                .mark_upstream_finalize("o", "https://a/order/1", 9)
                .await
                .unwrap()
        );
        store.close().await;
    }
}
