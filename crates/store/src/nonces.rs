//! Anti-replay nonces (RFC 8555 §6.5), shared by every replica through the
//! database.

use crate::db::args;
use crate::{Result, Store};

impl Store {
    /// Records a freshly issued nonce.
    pub async fn insert_nonce(&self, value: &str, expires_at: i64) -> Result<()> {
        self.writer()
            .await?
            .exec(
                "INSERT INTO nonces (value, expires_at) VALUES (?1, ?2)",
                args![value, expires_at],
            )
            .await?;
        Ok(())
    }

    /// Consumes a nonce: true exactly once per issued, unexpired nonce, even
    /// under concurrent replays (one `DELETE`; its row count is the answer).
    pub async fn consume_nonce(&self, value: &str, now: i64) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "DELETE FROM nonces WHERE value = ?1 AND expires_at > ?2",
                args![value, now],
            )
            .await?
            == 1)
    }

    /// Deletes expired nonces; returns how many.
    pub async fn sweep_nonces(&self, now: i64) -> Result<u64> {
        Ok(self
            .writer()
            .await?
            .exec("DELETE FROM nonces WHERE expires_at <= ?1", args![now])
            .await? as u64)
    }

    /// Nonces currently stored (for metrics and tests).
    pub async fn nonce_count(&self) -> Result<i64> {
        Ok(self
            .reader()
            .await?
            .scalar("SELECT COUNT(*) FROM nonces", &[])
            .await?
            .unwrap_or(0))
    }
}
