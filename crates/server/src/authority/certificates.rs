//! Certificate download (RFC 8555 §7.4.2).

use acme_proxy_store::{AccountRow, CertificateRow};

use super::{Authority, Profile};
use crate::error::{AcmeError, AcmeResult};

impl Authority {
    /// The certificate resource (§7.4.2), for the account that ordered it.
    /// Its chain is exact; its revocation columns may be up to ten seconds
    /// old (`recent.rs`): ask the store for those.
    pub async fn certificate(
        &self,
        profile: &Profile,
        account: &AccountRow,
        id: &str,
    ) -> AcmeResult<CertificateRow> {
        // Another account's certificate is answered as an unknown one: a
        // different answer would tell whoever asks that the id exists
        // (RFC 8555 §10.5). One this process just issued is read from
        // memory (`recent.rs`).
        let owned = |c: &CertificateRow| c.profile == profile.name && c.account_id == account.id;
        if let Some(certificate) = self
            .recent
            .certificate(id, self.clock.unix_ms())
            .filter(owned)
        {
            return Ok(certificate);
        }
        self.store
            .certificate(id)
            .await?
            .filter(owned)
            .ok_or_else(|| AcmeError::not_found("certificate"))
    }
}

pub(crate) fn leaf_der(chain_pem: &str) -> Option<Vec<u8>> {
    pem::parse_many(chain_pem)
        .ok()?
        .into_iter()
        .next()
        .map(pem::Pem::into_contents)
}
