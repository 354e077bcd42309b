//! Password hashes: argon2id (RFC 9106) with its parameters kept in the
//! PHC string, computed and verified on a blocking thread (each takes
//! tens of milliseconds of one core). The acme-dns API's account
//! passwords and the web console's operators both use this.

use argon2::password_hash::{PasswordHash, SaltString};
use argon2::{Argon2, PasswordHasher, PasswordVerifier};
use tokio::sync::OwnedSemaphorePermit;

/// The parameters new hashes get: RFC 9106's second recommended option
/// (19 MiB, 2 passes, one lane; the crate's default).
fn hasher() -> Argon2<'static> {
    Argon2::default()
}

/// Hashes `password` with a fresh salt; `slot`, when given, is held until
/// it is done (the caller's bound on hashes at once).
pub async fn hash(password: String, slot: Option<OwnedSemaphorePermit>) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let salt = SaltString::encode_b64(&crate::ids::salt())
            .map_err(|e| anyhow::anyhow!("salt: {e}"))?;
        hasher()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| anyhow::anyhow!("hashing a password: {e}"))
    })
    .await?
}

/// What checking a password found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    Wrong,
    Right,
    /// Right, and the hash was made with other parameters than today's:
    /// the caller should store a new one.
    RightOutdated,
}

/// Whether `password` is the one `stored` was made of (argon2's own
/// constant-time comparison), on a blocking thread holding `slot`.
pub async fn check(
    password: String,
    stored: String,
    slot: Option<OwnedSemaphorePermit>,
) -> anyhow::Result<Checked> {
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let parsed =
            PasswordHash::new(&stored).map_err(|e| anyhow::anyhow!("a stored hash: {e}"))?;
        // Verified with the stored hash's own parameters.
        if Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_err()
        {
            return Ok(Checked::Wrong);
        }
        Ok(if is_current(&parsed) {
            Checked::Right
        } else {
            Checked::RightOutdated
        })
    })
    .await?
}

/// Whether a hash was made with today's algorithm, version and parameters.
fn is_current(parsed: &PasswordHash<'_>) -> bool {
    let today = hasher();
    let params = today.params();
    parsed.algorithm == argon2::Algorithm::Argon2id.ident()
        && parsed.version == Some(argon2::Version::V0x13.into())
        && argon2::Params::try_from(parsed).is_ok_and(|p| {
            p.m_cost() == params.m_cost()
                && p.t_cost() == params.t_cost()
                && p.p_cost() == params.p_cost()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hash_verifies_its_password_and_no_other() {
        let stored = hash("correct horse battery".to_owned(), None)
            .await
            .unwrap();
        assert!(
            stored.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{stored}"
        );
        assert_eq!(
            check("correct horse battery".to_owned(), stored.clone(), None)
                .await
                .unwrap(),
            Checked::Right
        );
        assert_eq!(
            check("correct horse battere".to_owned(), stored, None)
                .await
                .unwrap(),
            Checked::Wrong
        );
    }

    #[tokio::test]
    async fn a_hash_made_with_weaker_parameters_is_right_but_outdated() {
        let weak = Argon2::new(
            argon2::Algorithm::Argon2id,
            argon2::Version::V0x13,
            argon2::Params::new(8 * 1024, 1, 1, None).unwrap(),
        );
        let salt = SaltString::encode_b64(&crate::ids::salt()).unwrap();
        let stored = weak
            .hash_password(b"correct horse battery", &salt)
            .unwrap()
            .to_string();
        assert_eq!(
            check("correct horse battery".to_owned(), stored.clone(), None)
                .await
                .unwrap(),
            Checked::RightOutdated
        );
        assert_eq!(
            check("wrong".to_owned(), stored, None).await.unwrap(),
            Checked::Wrong
        );
    }
}
