//! Anti-replay nonces (RFC 8555 §6.5) shared by every process on the
//! database: the key their MACs are made with, and the nonces already used.
//! Issuing one writes nothing; using one is one `INSERT`.

use crate::db::args;
use crate::{Result, Store};

impl Store {
    /// The key nonces are signed with: `candidate` if no process stored one
    /// before, else the stored one (one statement decides, so processes
    /// starting together agree).
    pub async fn nonce_key(&self, candidate: &[u8]) -> Result<Vec<u8>> {
        let mut conn = self.writer().await?;
        conn.exec(
            "INSERT INTO nonce_key (id, key) VALUES (1, ?1) ON CONFLICT (id) DO NOTHING",
            args![candidate],
        )
        .await?;
        conn.one("SELECT key FROM nonce_key WHERE id = 1", &[], |row| {
            row.get(0)
        })
        .await?
        .ok_or_else(|| crate::StoreError::Corrupt("the nonce key is missing".into()))
    }

    /// Records that a nonce was used: true the first time, false for a
    /// replay, even when two uses race (one `INSERT`; its row count is the
    /// answer). `expires_at` is when the record may go.
    ///
    /// On PostgreSQL the record's commit does not wait for its WAL flush
    /// (`synchronous_commit` off for this one statement's transaction):
    /// seven of an issuance's eleven commits are nonce records. That loses
    /// nothing that matters. WAL is one ordered stream, so the durable
    /// commit of any write the request then makes flushes the record with
    /// it; a crash can take the record only together with that write, or
    /// from a request that wrote nothing, and a replay after it then does
    /// what a retry would.
    pub async fn use_nonce(&self, value: &str, expires_at: i64) -> Result<bool> {
        let mut conn = self.writer().await?;
        let sql = if conn.is_postgres() {
            "INSERT INTO used_nonces (value, expires_at)
             SELECT ?1, ?2 FROM (SELECT set_config('synchronous_commit', 'off', true)) AS no_wait
             ON CONFLICT (value) DO NOTHING"
        } else {
            "INSERT INTO used_nonces (value, expires_at) VALUES (?1, ?2)
             ON CONFLICT (value) DO NOTHING"
        };
        Ok(conn.exec(sql, args![value, expires_at]).await? == 1)
    }

    /// Forgets used nonces that have expired (they are refused for their
    /// expiry anyway); returns how many.
    pub async fn sweep_nonces(&self, now: i64) -> Result<u64> {
        Ok(self
            .writer()
            .await?
            .exec("DELETE FROM used_nonces WHERE expires_at <= ?1", args![now])
            .await? as u64)
    }

    /// Used, unexpired nonces recorded (for the CLI and tests).
    pub async fn used_nonce_count(&self) -> Result<i64> {
        Ok(self
            .reader()
            .await?
            .scalar("SELECT COUNT(*) FROM used_nonces", &[])
            .await?
            .unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::test_support::TestDb;

    #[tokio::test]
    async fn the_first_nonce_key_stored_is_the_one_every_process_reads() {
        let (_db, store) = TestDb::open().await;
        assert_eq!(store.nonce_key(b"first").await.unwrap(), b"first");
        assert_eq!(store.nonce_key(b"second").await.unwrap(), b"first");
    }

    #[tokio::test]
    async fn a_nonce_is_used_once_and_its_record_goes_when_it_expires() {
        let (_db, store) = TestDb::open().await;
        assert!(store.use_nonce("n", 10).await.unwrap());
        assert!(!store.use_nonce("n", 10).await.unwrap(), "replayed");
        assert!(store.use_nonce("m", 20).await.unwrap());
        assert_eq!(store.sweep_nonces(10).await.unwrap(), 1);
        assert_eq!(store.used_nonce_count().await.unwrap(), 1);
    }
}
