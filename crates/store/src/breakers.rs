//! The relay's circuit breakers: one row per relay profile and upstream
//! directory, shared by every job and replica. Each change is one
//! transaction that reads the row and writes its successor, so two jobs
//! (of two replicas) reporting at once count two failures and only one of
//! them claims a probe. Times are Unix milliseconds.

use crate::db::{Row, args};
use crate::{Result, Store, StoreError, parse_text};

acme_proxy_protocol::string_enum! {
    /// Where an upstream's breaker is: `closed` (requests go), `open`
    /// (they wait until `retry_at`), `probing` (one job asks whether the
    /// upstream is back; the claim lapses at `retry_at`).
    pub enum BreakerState {
        Closed = "closed",
        Open = "open",
        Probing = "probing",
    }
}

/// One upstream's breaker as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerRow {
    pub profile: String,
    /// The upstream's directory URL: what names the upstream.
    pub directory: String,
    pub state: BreakerState,
    /// Requests in a row that found the upstream down.
    pub failures: i64,
    /// Closed: when it closed. Open or probing: when it opened (a failed
    /// probe does not move it: the outage goes on).
    pub since: i64,
    /// Open: when a probe may go. Probing: when the probe's claim lapses.
    pub retry_at: i64,
    pub last_error: Option<String>,
    pub last_error_at: Option<i64>,
}

/// A request that found an upstream down, and the breaker's settings.
#[derive(Clone, Copy, Debug)]
pub struct BreakerFailure<'a> {
    pub profile: &'a str,
    pub directory: &'a str,
    pub now_ms: i64,
    pub error: &'a str,
    /// Failures in a row that open a closed breaker.
    pub threshold: i64,
    /// When an opening (or a failed probe) lets the next probe go.
    pub open_until_ms: i64,
}

macro_rules! breaker_columns {
    () => {
        "profile, directory, state, failures, since, retry_at, last_error, last_error_at"
    };
}

fn breaker_from_row(row: Row<'_>) -> Result<BreakerRow> {
    Ok(BreakerRow {
        profile: row.get("profile")?,
        directory: row.get("directory")?,
        state: parse_text(&row.get::<String>("state")?, "upstream_breakers.state")?,
        failures: row.get("failures")?,
        since: row.get("since")?,
        retry_at: row.get("retry_at")?,
        last_error: row.get("last_error")?,
        last_error_at: row.get("last_error_at")?,
    })
}

impl Store {
    /// The breaker of `profile`'s upstream at `directory`, if it ever saw
    /// a failure (a read: every relay attempt asks).
    pub async fn breaker(&self, profile: &str, directory: &str) -> Result<Option<BreakerRow>> {
        self.reader()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    breaker_columns!(),
                    " FROM upstream_breakers WHERE profile = ?1 AND directory = ?2"
                ),
                args![profile, directory],
                breaker_from_row,
            )
            .await
    }

    /// Every breaker, by profile and directory.
    pub async fn breakers(&self) -> Result<Vec<BreakerRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    breaker_columns!(),
                    " FROM upstream_breakers ORDER BY profile, directory"
                ),
                &[],
                breaker_from_row,
            )
            .await
    }

    /// Counts a request that found the upstream down: a closed breaker
    /// opens at `threshold` failures in a row, a probing one opens again.
    /// Returns the state before and the row after.
    pub async fn breaker_failed(
        &self,
        f: &BreakerFailure<'_>,
    ) -> Result<(BreakerState, BreakerRow)> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        // The row is made first, so that there is one to lock: two first
        // failures (on PostgreSQL, where a lock on no row waits for
        // nothing) are then counted one after the other.
        tx.exec(
            "INSERT INTO upstream_breakers (profile, directory, state, failures, since, retry_at)
             VALUES (?1, ?2, 'closed', 0, ?3, ?3) ON CONFLICT (profile, directory) DO NOTHING",
            args![f.profile, f.directory, f.now_ms],
        )
        .await?;
        let Some(before) = lock_breaker(&mut tx, f.profile, f.directory).await? else {
            return Err(StoreError::Corrupt(
                "the upstream breaker's row vanished inside its transaction".into(),
            ));
        };
        let failures = before.failures.saturating_add(1);
        let was = before.state;
        let (state, since, retry_at) = match was {
            BreakerState::Closed if failures < f.threshold => {
                (BreakerState::Closed, before.since, before.retry_at)
            }
            BreakerState::Closed => (BreakerState::Open, f.now_ms, f.open_until_ms),
            // A request sent before it opened: the outage goes on.
            BreakerState::Open => (BreakerState::Open, before.since, before.retry_at),
            // The probe (or a request beside it) found it still down.
            BreakerState::Probing => (BreakerState::Open, before.since, f.open_until_ms),
        };
        tx.exec(
            "UPDATE upstream_breakers
             SET state = ?3, failures = ?4, since = ?5, retry_at = ?6, last_error = ?7,
                 last_error_at = ?8
             WHERE profile = ?1 AND directory = ?2",
            args![
                f.profile,
                f.directory,
                state.as_str(),
                failures,
                since,
                retry_at,
                f.error,
                f.now_ms
            ],
        )
        .await?;
        tx.commit().await?;
        Ok((
            was,
            BreakerRow {
                profile: f.profile.to_owned(),
                directory: f.directory.to_owned(),
                state,
                failures,
                since,
                retry_at,
                last_error: Some(f.error.to_owned()),
                last_error_at: Some(f.now_ms),
            },
        ))
    }

    /// Records that the upstream answered (whatever it said: it is up):
    /// the breaker closes and its count starts again. Returns the state
    /// before when anything changed; a closed breaker with no failures is
    /// not written.
    pub async fn breaker_answered(
        &self,
        profile: &str,
        directory: &str,
        now_ms: i64,
    ) -> Result<Option<BreakerState>> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let Some(before) = lock_breaker(&mut tx, profile, directory).await? else {
            return Ok(None);
        };
        if before.state == BreakerState::Closed && before.failures == 0 {
            return Ok(None);
        }
        let since = if before.state == BreakerState::Closed {
            before.since
        } else {
            now_ms
        };
        tx.exec(
            "UPDATE upstream_breakers SET state = 'closed', failures = 0, since = ?3, retry_at = ?4
             WHERE profile = ?1 AND directory = ?2",
            args![profile, directory, since, now_ms],
        )
        .await?;
        tx.commit().await?;
        Ok(Some(before.state))
    }

    /// Claims the probe of an open breaker whose time has come (or whose
    /// last probe's claim lapsed) until `lease_until_ms`: true for the one
    /// caller that gets it.
    pub async fn claim_breaker_probe(
        &self,
        profile: &str,
        directory: &str,
        now_ms: i64,
        lease_until_ms: i64,
    ) -> Result<bool> {
        let claimed = self
            .writer()
            .await?
            .exec(
                "UPDATE upstream_breakers SET state = 'probing', retry_at = ?4
                 WHERE profile = ?1 AND directory = ?2 AND state <> 'closed' AND retry_at <= ?3",
                args![profile, directory, now_ms, lease_until_ms],
            )
            .await?;
        Ok(claimed == 1)
    }
}

/// The breaker's row, locked for the transaction on PostgreSQL (SQLite's
/// `IMMEDIATE` transaction holds the write lock already).
async fn lock_breaker(
    tx: &mut crate::db::Conn<'_>,
    profile: &str,
    directory: &str,
) -> Result<Option<BreakerRow>> {
    if tx.is_postgres() {
        tx.one(
            concat!(
                "SELECT ",
                breaker_columns!(),
                " FROM upstream_breakers WHERE profile = ?1 AND directory = ?2 FOR UPDATE"
            ),
            args![profile, directory],
            breaker_from_row,
        )
        .await
    } else {
        tx.one(
            concat!(
                "SELECT ",
                breaker_columns!(),
                " FROM upstream_breakers WHERE profile = ?1 AND directory = ?2"
            ),
            args![profile, directory],
            breaker_from_row,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::{BreakerFailure, BreakerState};
    use crate::test_support::TestDb;

    const DIR: &str = "https://ca.test/dir";

    fn failure(now_ms: i64) -> BreakerFailure<'static> {
        BreakerFailure {
            profile: "relay",
            directory: DIR,
            now_ms,
            error: "the upstream answered 502",
            threshold: 3,
            open_until_ms: now_ms + 30_000,
        }
    }

    #[tokio::test]
    async fn three_failures_in_a_row_open_the_breaker_and_an_answer_between_them_starts_the_count_again()
     {
        let (_db, store) = TestDb::open().await;
        let t = 1_000_000_000_000;
        assert_eq!(store.breaker_answered("relay", DIR, t).await.unwrap(), None);
        assert_eq!(store.breaker("relay", DIR).await.unwrap(), None);
        for i in 0..2 {
            let (was, row) = store.breaker_failed(&failure(t + i)).await.unwrap();
            assert_eq!(
                (was, row.state, row.failures),
                (BreakerState::Closed, BreakerState::Closed, i + 1)
            );
        }
        // An answer: the count starts again, and it stays closed.
        assert_eq!(
            store.breaker_answered("relay", DIR, t + 5).await.unwrap(),
            Some(BreakerState::Closed)
        );
        assert_eq!(
            store.breaker("relay", DIR).await.unwrap().unwrap().failures,
            0
        );
        for i in 0..3 {
            store.breaker_failed(&failure(t + 10 + i)).await.unwrap();
        }
        let row = store.breaker("relay", DIR).await.unwrap().unwrap();
        assert_eq!(row.state, BreakerState::Open);
        assert_eq!((row.since, row.retry_at), (t + 12, t + 12 + 30_000));
        assert_eq!(row.last_error.as_deref(), Some("the upstream answered 502"));
        // A request sent before it opened fails too: the time it may be
        // probed stays.
        let (was, row) = store.breaker_failed(&failure(t + 20)).await.unwrap();
        assert_eq!(
            (was, row.state, row.retry_at),
            (BreakerState::Open, BreakerState::Open, t + 12 + 30_000)
        );
        assert_eq!(store.breakers().await.unwrap(), vec![row]);
    }

    #[tokio::test]
    async fn one_caller_claims_the_probe_once_its_time_came_and_its_answer_closes_or_reopens_the_breaker()
     {
        let (_db, store) = TestDb::open().await;
        let t = 1_000_000_000_000;
        for i in 0..3 {
            store.breaker_failed(&failure(t + i)).await.unwrap();
        }
        let opened = t + 2 + 30_000;
        assert!(
            !store
                .claim_breaker_probe("relay", DIR, opened - 1, opened + 5_000)
                .await
                .unwrap()
        );
        assert!(
            store
                .claim_breaker_probe("relay", DIR, opened, opened + 5_000)
                .await
                .unwrap()
        );
        assert!(
            !store
                .claim_breaker_probe("relay", DIR, opened, opened + 5_000)
                .await
                .unwrap(),
            "claimed twice"
        );
        // The probe fails: open again from then, since the same outage.
        let (was, row) = store.breaker_failed(&failure(opened + 100)).await.unwrap();
        assert_eq!(was, BreakerState::Probing);
        assert_eq!(
            (row.state, row.since, row.retry_at),
            (BreakerState::Open, t + 2, opened + 100 + 30_000)
        );
        // A claim that lapsed may be taken again; its answer closes it.
        let next = opened + 100 + 30_000;
        assert!(
            store
                .claim_breaker_probe("relay", DIR, next, next + 5_000)
                .await
                .unwrap()
        );
        assert!(
            store
                .claim_breaker_probe("relay", DIR, next + 5_000, next + 10_000)
                .await
                .unwrap()
        );
        assert_eq!(
            store
                .breaker_answered("relay", DIR, next + 6_000)
                .await
                .unwrap(),
            Some(BreakerState::Probing)
        );
        let row = store.breaker("relay", DIR).await.unwrap().unwrap();
        assert_eq!(
            (row.state, row.failures, row.since),
            (BreakerState::Closed, 0, next + 6_000)
        );
        assert!(
            !store
                .claim_breaker_probe("relay", DIR, next + 60_000, next + 65_000)
                .await
                .unwrap()
        );
        // Another profile's breaker is its own.
        assert_eq!(store.breaker("other", DIR).await.unwrap(), None);
    }
}
