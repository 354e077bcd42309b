//! Rate limits: the generic cell rate algorithm's state per key, taken and
//! advanced in one statement, so that two requests (of two replicas) can
//! never both take the last place.

use crate::db::args;
use crate::{Result, Store};

/// One limited key as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitRow {
    pub key: String,
    /// The theoretical arrival time (ms): the key is full until
    /// `tat - period`, and empty from `tat` on.
    pub tat: i64,
}

impl Store {
    /// Takes one place of `key` at `now_ms` under a limit of one place per
    /// `interval_ms` with bursts of up to `period_ms` worth: `Ok(None)`
    /// when taken, `Ok(Some(ms))` when full, with how long until a place
    /// frees.
    pub async fn take_rate_limit(
        &self,
        key: &str,
        now_ms: i64,
        interval_ms: i64,
        period_ms: i64,
    ) -> Result<Option<i64>> {
        let mut conn = self.writer().await?;
        // A new key starts empty (its first place always fits: the
        // interval is at most the period); an old one moves on by one
        // interval from its arrival time or now, whichever is later, if
        // that stays within the period. The places still taken were taken
        // at the row's interval: counted again at this one, a raised
        // limit has room at once. (Periods are at most 31 days, so the
        // product stays within 64 bits.)
        let taken = conn
            .one(
                "INSERT INTO rate_limits (key, tat, interval_ms) VALUES (?1, ?2 + ?3, ?3)
                 ON CONFLICT (key) DO UPDATE
                 SET tat = (CASE WHEN rate_limits.tat > ?2
                                 THEN ?2 + (rate_limits.tat - ?2) * ?3 / rate_limits.interval_ms
                                 ELSE ?2 END) + ?3,
                     interval_ms = ?3
                 WHERE (CASE WHEN rate_limits.tat > ?2
                             THEN ?2 + (rate_limits.tat - ?2) * ?3 / rate_limits.interval_ms
                             ELSE ?2 END) + ?3 - ?4 <= ?2
                 RETURNING tat",
                args![key, now_ms, interval_ms, period_ms],
                |row| row.get::<i64>(0),
            )
            .await?;
        if taken.is_some() {
            return Ok(None);
        }
        let (tat, old_interval) = conn
            .one(
                "SELECT tat, interval_ms FROM rate_limits WHERE key = ?1",
                args![key],
                |row| Ok((row.get::<i64>(0)?, row.get::<i64>(1)?)),
            )
            .await?
            .unwrap_or((now_ms, interval_ms));
        let base = if tat > now_ms {
            now_ms + (tat - now_ms).saturating_mul(interval_ms) / old_interval.max(1)
        } else {
            now_ms
        };
        Ok(Some((base + interval_ms - period_ms - now_ms).max(1)))
    }

    /// The limited keys starting with `prefix`, in key order, at most
    /// `limit` of them.
    pub async fn rate_limits(&self, prefix: &str, limit: i64) -> Result<Vec<RateLimitRow>> {
        let pattern = format!(
            "{}%",
            prefix
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
        );
        self.reader()
            .await?
            .all(
                "SELECT key, tat FROM rate_limits WHERE key LIKE ?1 ESCAPE '\\'
                 ORDER BY key LIMIT ?2",
                args![pattern, limit],
                |row| {
                    Ok(RateLimitRow {
                        key: row.get(0)?,
                        tat: row.get(1)?,
                    })
                },
            )
            .await
    }

    /// Forgets `key` (it starts empty again), writing `audit` in the same
    /// transaction; false when it was not limited.
    pub async fn reset_rate_limit(
        &self,
        key: &str,
        audit: &crate::NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let removed = tx
            .exec("DELETE FROM rate_limits WHERE key = ?1", args![key])
            .await?;
        if removed == 0 {
            return Ok(false);
        }
        crate::audit::insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        tx.commit().await?;
        Ok(true)
    }
}
