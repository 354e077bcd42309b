//! Rate limits: the generic cell rate algorithm's state per key, taken and
//! advanced in one transaction, so that two requests (of two replicas) can
//! never both take the last place.
//!
//! A key's row holds its theoretical arrival time `tat` (ms): with one
//! place freeing every `interval`, and at most `burst` worth of places
//! taken, a request at `now` fits when `max(tat, now) + interval - burst
//! <= now`, and then moves `tat` to `max(tat, now) + interval`. A row
//! whose `tat` has passed holds nothing back, the same as no row.

use crate::audit::insert_audit_in;
use crate::db::args;
use crate::{NewAuditRow, Result, Store};

/// The longest burst a limit may have (31 days, in ms): the configuration
/// refuses longer periods.
pub const MAX_BURST_MS: i64 = 31 * 86_400_000;

/// One limited key as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitRow {
    pub key: String,
    /// The theoretical arrival time (ms): from then on nothing is taken.
    pub tat: i64,
}

/// One key and its limit: one place freeing every `interval_ms`, at most
/// `burst_ms` worth taken (N places: `N * interval_ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitKey<'a> {
    pub key: &'a str,
    pub interval_ms: i64,
    pub burst_ms: i64,
}

/// What [`Store::take_rate_limits`] does when every key has room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateLimitTake {
    /// Takes a place of each.
    Take,
    /// Only looks: takes nothing (a refusal early, before the work that
    /// will take the places later).
    Check,
}

impl Store {
    /// Takes one place of `key` at `now_ms`: `Ok(None)` when taken,
    /// `Ok(Some(ms))` when full, with how long until a place frees.
    pub async fn take_rate_limit(
        &self,
        key: &str,
        now_ms: i64,
        interval_ms: i64,
        burst_ms: i64,
    ) -> Result<Option<i64>> {
        let key = RateLimitKey {
            key,
            interval_ms,
            burst_ms,
        };
        Ok(self
            .take_rate_limits(&[key], now_ms, RateLimitTake::Take)
            .await?
            .map(|(_, wait)| wait))
    }

    /// Takes one place of every key at `now_ms`, all or none, in one
    /// transaction: `Ok(None)` when each had room (and, with
    /// [`RateLimitTake::Take`], a place of each is taken), else the first
    /// full key's index and how long until a place of it frees (nothing
    /// taken).
    pub async fn take_rate_limits(
        &self,
        keys: &[RateLimitKey<'_>],
        now_ms: i64,
        take: RateLimitTake,
    ) -> Result<Option<(usize, i64)>> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let mut full = None;
        for (i, k) in keys.iter().enumerate() {
            let (key, interval_ms, burst_ms) = (k.key, k.interval_ms, k.burst_ms);
            // The places still taken were counted at the row's interval; a
            // limit changed since (a reload, an override) counts them
            // again at its own (at most a whole burst), so that a raised
            // limit has room at once and a refusal's wait is right. Kept
            // whatever follows, so that the wait told holds. What is taken
            // is counted as at most 31 days, so the product stays within
            // 64 bits even after the clock stepped back.
            tx.exec(
                "UPDATE rate_limits
                 SET tat = CASE WHEN tat > ?2 THEN ?2 + (
                         CASE WHEN (CASE WHEN tat - ?2 > ?5 THEN ?5 ELSE tat - ?2 END) * ?3 / interval_ms > ?4
                              THEN ?4
                              ELSE (CASE WHEN tat - ?2 > ?5 THEN ?5 ELSE tat - ?2 END) * ?3 / interval_ms
                         END)
                     ELSE tat END,
                     interval_ms = ?3
                 WHERE key = ?1 AND interval_ms <> ?3",
                args![key, now_ms, interval_ms, burst_ms, MAX_BURST_MS],
            )
            .await?;
            let fits = match take {
                // A new key starts empty (its first place always fits: the
                // interval is at most the burst).
                RateLimitTake::Take => tx
                    .one(
                        "INSERT INTO rate_limits (key, tat, interval_ms) VALUES (?1, ?2 + ?3, ?3)
                         ON CONFLICT (key) DO UPDATE
                         SET tat = (CASE WHEN rate_limits.tat > ?2 THEN rate_limits.tat ELSE ?2 END) + ?3
                         WHERE (CASE WHEN rate_limits.tat > ?2 THEN rate_limits.tat ELSE ?2 END)
                               + ?3 - ?4 <= ?2
                         RETURNING tat",
                        args![key, now_ms, interval_ms, burst_ms],
                        |row| row.get::<i64>(0),
                    )
                    .await?
                    .is_some(),
                // The same condition as the take's, read: a check writes
                // no row for a key it finds empty.
                RateLimitTake::Check => match tat_of(&mut tx, key).await? {
                    Some(tat) => tat.max(now_ms) + interval_ms - burst_ms <= now_ms,
                    None => true,
                },
            };
            if !fits {
                let tat = tat_of(&mut tx, key).await?.unwrap_or(now_ms);
                full = Some((
                    i,
                    (tat.max(now_ms) + interval_ms - burst_ms - now_ms).max(1),
                ));
                break;
            }
        }
        // All or none: the places taken before a full key are given back
        // (a key left with its time at now holds nothing back, like no row).
        if full.is_some() && take == RateLimitTake::Take {
            let taken = full.map_or(0, |(i, _)| i);
            for k in &keys[..taken] {
                tx.exec(
                    "UPDATE rate_limits SET tat = tat - ?2 WHERE key = ?1",
                    args![k.key, k.interval_ms],
                )
                .await?;
            }
        }
        tx.commit().await?;
        Ok(full)
    }

    /// Holds `key` back until at least `until_ms` (a pause: nothing fits
    /// before then when checked with an interval and burst of 1 ms); a
    /// later hold already there stays.
    pub async fn hold_rate_limit(&self, key: &str, until_ms: i64) -> Result<()> {
        self.writer()
            .await?
            .exec(
                "INSERT INTO rate_limits (key, tat, interval_ms) VALUES (?1, ?2, 1)
                 ON CONFLICT (key) DO UPDATE
                 SET tat = CASE WHEN rate_limits.tat > ?2 THEN rate_limits.tat ELSE ?2 END,
                     interval_ms = 1",
                args![key, until_ms],
            )
            .await?;
        Ok(())
    }

    /// When `key` holds nothing back any more (its `tat`), if it has a row:
    /// a read, for a check that must not queue behind the writer.
    pub async fn rate_limit_tat(&self, key: &str) -> Result<Option<i64>> {
        tat_of(&mut self.reader().await?, key).await
    }

    /// Gives back a place taken at `now_ms` for something that was then
    /// not done (an order the store refused to make).
    pub async fn give_back_rate_limit(&self, key: &str, interval_ms: i64) -> Result<()> {
        self.writer()
            .await?
            .exec(
                "UPDATE rate_limits SET tat = tat - ?2 WHERE key = ?1 AND interval_ms = ?2",
                args![key, interval_ms],
            )
            .await?;
        Ok(())
    }

    /// The keys starting with `prefix` that hold something back at
    /// `now_ms`, in key order, at most `limit` of them.
    pub async fn rate_limits(
        &self,
        prefix: &str,
        now_ms: i64,
        limit: i64,
    ) -> Result<Vec<RateLimitRow>> {
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
                "SELECT key, tat FROM rate_limits WHERE key LIKE ?1 ESCAPE '\\' AND tat > ?2
                 ORDER BY key LIMIT ?3",
                args![pattern, now_ms, limit],
                |row| {
                    Ok(RateLimitRow {
                        key: row.get(0)?,
                        tat: row.get(1)?,
                    })
                },
            )
            .await
    }

    /// Forgets the keys that hold nothing back any more (the periodic
    /// sweep: one row per client address and account would otherwise
    /// stay for ever); returns how many.
    pub async fn sweep_rate_limits(&self, now_ms: i64) -> Result<u64> {
        self.writer()
            .await?
            .exec("DELETE FROM rate_limits WHERE tat <= ?1", args![now_ms])
            .await
    }

    /// Forgets `key` (it starts empty again), writing `audit` in the same
    /// transaction; false when it held nothing back at `now_ms`.
    pub async fn reset_rate_limit(
        &self,
        key: &str,
        now_ms: i64,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let removed = tx
            .exec(
                "DELETE FROM rate_limits WHERE key = ?1 AND tat > ?2",
                args![key, now_ms],
            )
            .await?;
        if removed == 0 {
            return Ok(false);
        }
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// The theoretical arrival time of `key`, if it has a row.
async fn tat_of(tx: &mut crate::db::Conn<'_>, key: &str) -> Result<Option<i64>> {
    tx.one(
        "SELECT tat FROM rate_limits WHERE key = ?1",
        args![key],
        |row| row.get::<i64>(0),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::{RateLimitKey, RateLimitTake};
    use crate::test_support::TestDb;

    const MIN: i64 = 60_000;

    #[tokio::test]
    async fn a_hold_pauses_a_key_until_its_time_and_an_earlier_hold_does_not_shorten_it() {
        let (_db, store) = TestDb::open().await;
        let now = 1_000_000_000_000;
        let paused = |at: i64| {
            let store = store.clone();
            async move {
                let key = RateLimitKey {
                    key: "pause",
                    interval_ms: 1,
                    burst_ms: 1,
                };
                store
                    .take_rate_limits(&[key], at, RateLimitTake::Check)
                    .await
                    .unwrap()
                    .map(|(_, wait)| wait)
            }
        };
        assert_eq!(paused(now).await, None);
        store.hold_rate_limit("pause", now + 20_000).await.unwrap();
        assert_eq!(paused(now).await, Some(20_000));
        store.hold_rate_limit("pause", now + 5_000).await.unwrap();
        assert_eq!(paused(now + 19_999).await, Some(1));
        assert_eq!(paused(now + 20_000).await, None);
        assert_eq!(store.rate_limits("pause", now, 10).await.unwrap().len(), 1);
        assert_eq!(store.sweep_rate_limits(now + 20_000).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn five_an_hour_take_five_at_once_then_one_every_twelve_minutes_and_a_changed_limit_recounts()
     {
        let (_db, store) = TestDb::open().await;
        let (t, burst) = (12 * MIN, 60 * MIN);
        let now = 1_000_000_000_000;
        for i in 0..5 {
            assert_eq!(
                store.take_rate_limit("k", now, t, burst).await.unwrap(),
                None,
                "place {i}"
            );
        }
        // Full: the next place frees one interval on.
        assert_eq!(
            store.take_rate_limit("k", now, t, burst).await.unwrap(),
            Some(t)
        );
        assert_eq!(
            store
                .take_rate_limit("k", now + t - 1, t, burst)
                .await
                .unwrap(),
            Some(1)
        );
        assert_eq!(
            store.take_rate_limit("k", now + t, t, burst).await.unwrap(),
            None
        );
        // A refusal takes nothing: still one place every interval.
        assert_eq!(
            store.take_rate_limit("k", now + t, t, burst).await.unwrap(),
            Some(t)
        );
        // Another key is its own.
        assert_eq!(
            store.take_rate_limit("other", now, t, burst).await.unwrap(),
            None
        );
        // The same five places, counted at a hundred an hour (36 s each):
        // room at once for 95 more.
        let fast = 36_000;
        for i in 0..95 {
            assert_eq!(
                store
                    .take_rate_limit("k", now + t, fast, burst)
                    .await
                    .unwrap(),
                None,
                "{i}"
            );
        }
        assert_eq!(
            store
                .take_rate_limit("k", now + t, fast, burst)
                .await
                .unwrap(),
            Some(fast)
        );
        // Back at five an hour, those hundred places are five again: the
        // wait is one interval of that limit.
        assert_eq!(
            store.take_rate_limit("k", now + t, t, burst).await.unwrap(),
            Some(t)
        );
        // A place given back is free again.
        store.give_back_rate_limit("k", t).await.unwrap();
        assert_eq!(
            store.take_rate_limit("k", now + t, t, burst).await.unwrap(),
            None
        );
        // Listing shows what holds something back; the sweep forgets the rest.
        let keys: Vec<String> = store
            .rate_limits("", now, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.key)
            .collect();
        assert_eq!(keys, ["k", "other"]);
        assert!(
            store
                .rate_limits("", now + 2 * burst, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.sweep_rate_limits(now).await.unwrap(), 0);
        assert_eq!(store.sweep_rate_limits(now + 2 * burst).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn several_keys_are_taken_all_or_none_and_a_check_takes_nothing() {
        let (_db, store) = TestDb::open().await;
        let now = 1_000_000_000_000;
        let two = |key| RateLimitKey {
            key,
            interval_ms: 30 * MIN,
            burst_ms: 60 * MIN,
        };
        let (a, b) = (two("a"), two("b"));
        // b is full; a has both places.
        for _ in 0..2 {
            assert_eq!(
                store
                    .take_rate_limits(&[b], now, RateLimitTake::Take)
                    .await
                    .unwrap(),
                None
            );
        }
        // The pair is refused on b, the second key, and a keeps its places.
        for _ in 0..3 {
            assert_eq!(
                store
                    .take_rate_limits(&[a, b], now, RateLimitTake::Take)
                    .await
                    .unwrap(),
                Some((1, 30 * MIN))
            );
        }
        // A check of a alone has room and takes nothing, however often.
        for _ in 0..3 {
            assert_eq!(
                store
                    .take_rate_limits(&[a], now, RateLimitTake::Check)
                    .await
                    .unwrap(),
                None
            );
        }
        assert!(store.rate_limits("a", now, 10).await.unwrap().is_empty());
        for _ in 0..2 {
            assert_eq!(
                store
                    .take_rate_limit("a", now, 30 * MIN, 60 * MIN)
                    .await
                    .unwrap(),
                None
            );
        }
        assert_eq!(
            store
                .take_rate_limits(&[a], now, RateLimitTake::Check)
                .await
                .unwrap(),
            Some((0, 30 * MIN))
        );
    }
}
