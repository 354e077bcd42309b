//! Anti-replay nonces (RFC 8555 §6.5), shared by every replica through the
//! database.

use crate::{Result, Store};

impl Store {
    /// Records a freshly issued nonce.
    pub async fn insert_nonce(&self, value: &str, expires_at: i64) -> Result<()> {
        sqlx::query("INSERT INTO nonces (value, expires_at) VALUES ($1, $2)")
            .bind(value)
            .bind(expires_at)
            .execute(&mut *self.writer().await?)
            .await?;
        Ok(())
    }

    /// Consumes a nonce: true exactly once per issued, unexpired nonce, even
    /// under concurrent replays (one `DELETE`; its row count is the answer).
    pub async fn consume_nonce(&self, value: &str, now: i64) -> Result<bool> {
        Ok(
            sqlx::query("DELETE FROM nonces WHERE value = $1 AND expires_at > $2")
                .bind(value)
                .bind(now)
                .execute(&mut *self.writer().await?)
                .await?
                .rows_affected()
                == 1,
        )
    }

    /// Deletes expired nonces; returns how many.
    pub async fn sweep_nonces(&self, now: i64) -> Result<u64> {
        Ok(sqlx::query("DELETE FROM nonces WHERE expires_at <= $1")
            .bind(now)
            .execute(&mut *self.writer().await?)
            .await?
            .rows_affected())
    }

    /// Nonces currently stored (for metrics and tests).
    pub async fn nonce_count(&self) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM nonces")
            .fetch_one(&mut *self.reader().await?)
            .await?)
    }
}
