//! ACME Renewal Information (RFC 9773): the window in which each
//! certificate should be renewed, and the certificate an order's
//! `replaces` names.

use acme_proxy_protocol::types::{CertId, Identifier};
use acme_proxy_protocol::{ProblemType, Subproblem};
use acme_proxy_store::{AccountRow, CertificateRow};

use super::certificates::leaf_der;
use super::{Authority, Profile};
use crate::error::{AcmeError, AcmeResult};
use crate::signer::IssuedCertificate;

/// The window of a certificate with no signer-specific one.
const DEFAULT_WINDOW: [f64; 2] = [0.6, 0.8];

/// A suggested renewal window (Unix seconds) and how long until asking again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start: i64,
    pub end: i64,
    pub retry_after: u64,
}

impl Authority {
    /// The certificate of `profile` named by `id`: its serial, and its
    /// leaf's Authority Key Identifier, must both match.
    pub(crate) async fn certificate_by_cert_id(
        &self,
        profile: &Profile,
        id: &CertId,
    ) -> AcmeResult<Option<CertificateRow>> {
        let Some(cert) = self
            .store
            .certificate_by_serial(&profile.name, &hex::encode(&id.serial))
            .await?
        else {
            return Ok(None);
        };
        let aki = leaf_der(&cert.chain_pem).and_then(|der| authority_key_id(&der));
        Ok((aki.as_deref() == Some(id.key_identifier.as_slice())).then_some(cert))
    }

    /// RFC 9773 §4: the renewal window of the certificate `id` names.
    ///
    /// The embedded CA's window is the certificate's own quarter of
    /// `renewal_window` (fractions of its lifetime), placed by a hash of its
    /// serial, so that a fleet issued together does not renew together. A
    /// revoked certificate's window is in the past: renew now.
    pub async fn renewal_info(&self, profile: &Profile, id: &str) -> AcmeResult<Window> {
        let id = CertId::parse(id).ok_or_else(|| {
            AcmeError::malformed(
                "not a certificate identifier: base64url(AKI keyIdentifier).base64url(serial) (RFC 9773 §4.1)",
            )
        })?;
        let cert = self
            .certificate_by_cert_id(profile, &id)
            .await?
            .ok_or_else(|| AcmeError::not_found("certificate"))?;
        let retry_after = profile.config.renewal_info_retry_after.as_secs().max(1);
        if let Some(revoked) = cert.revoked_at {
            return Ok(Window {
                start: revoked - 2 * 3600,
                end: revoked - 3600,
                retry_after,
            });
        }
        // An outside party's window when the signer asks one: the
        // upstream's for a certificate it issued, the operator's program's.
        let leaf = leaf_der(&cert.chain_pem);
        // A relay's certificate: the upstream that issued it is asked.
        let upstream = self.issuing_upstream(profile, &cert.order_id).await;
        let issued = IssuedCertificate {
            serial: &cert.serial,
            upstream: upstream.as_deref(),
            chain_pem: &cert.chain_pem,
            leaf_der: leaf.as_deref(),
        };
        // An upstream known to be down is not asked: the default window
        // now beats one request timeout's wait for nothing.
        let outside = match profile.signer.renewal_window(&issued) {
            Some(_)
                if self
                    .upstream_down(profile, upstream.as_deref())
                    .await
                    .is_some() =>
            {
                Some(Err("the upstream's circuit breaker is open".to_owned()))
            }
            Some(asked) => Some(asked.await),
            None => None,
        };
        match outside {
            Some(Ok(Some((start, end)))) if end > start => {
                return Ok(Window {
                    start,
                    end,
                    retry_after,
                });
            }
            Some(Err(e)) => tracing::warn!(
                event = "renewal_info",
                outcome = "failure",
                profile = %profile.name,
                serial = %cert.serial,
                error = %e,
                "no outside renewal window; answering the default window"
            ),
            _ => {}
        }
        let fractions = profile.signer.renewal_fractions().unwrap_or(DEFAULT_WINDOW);
        let (start, end) = spread_window(cert.not_before, cert.not_after, fractions, &id.serial);
        Ok(Window {
            start,
            end,
            retry_after,
        })
    }

    /// RFC 9773 §5: checks an order's `replaces`: a certificate of this
    /// profile, of the same account, sharing an identifier with the order.
    /// Returns (identifier as sent, certificate id). "Not already replaced"
    /// is the store's unique index, so that two racing orders cannot both
    /// pass.
    pub(crate) async fn replaced_certificate(
        &self,
        profile: &Profile,
        account: &AccountRow,
        replaces: &str,
        identifiers: &[Identifier],
    ) -> AcmeResult<(String, String)> {
        let id = CertId::parse(replaces).ok_or_else(|| {
            AcmeError::malformed(
                "replaces is not a certificate identifier: base64url(AKI keyIdentifier).base64url(serial) (RFC 9773 §4.1)",
            )
        })?;
        let cert = self
            .certificate_by_cert_id(profile, &id)
            .await?
            .ok_or_else(|| {
                AcmeError::malformed("replaces names no certificate this endpoint issued")
            })?;
        if cert.account_id != account.id {
            return Err(AcmeError::unauthorized(
                "replaces names a certificate of another account",
            ));
        }
        if !identifiers.iter().any(|i| cert.identifiers.contains(i)) {
            let mut e = AcmeError::malformed(
                "the order shares no identifier with the certificate it replaces",
            );
            e.subproblems = identifiers
                .iter()
                .map(|i| {
                    Subproblem::new(
                        ProblemType::Malformed,
                        "not on the replaced certificate",
                        i.clone(),
                    )
                })
                .collect();
            return Err(e);
        }
        Ok((replaces.to_owned(), cert.id))
    }
}

/// The keyIdentifier of a certificate's Authority Key Identifier.
pub(crate) fn authority_key_id(der: &[u8]) -> Option<Vec<u8>> {
    use x509_parser::prelude::{FromDer, ParsedExtension, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    cert.extensions()
        .iter()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|k| k.0.to_vec())
            }
            _ => None,
        })
}

/// The certificate's own quarter of the `[from, to]` fractions of its
/// lifetime, placed by its serial (deterministic: every replica and every
/// restart answers the same).
fn spread_window(
    not_before: i64,
    not_after: i64,
    [from, to]: [f64; 2],
    serial: &[u8],
) -> (i64, i64) {
    let lifetime = (not_after - not_before).max(4) as f64;
    let span = ((to - from) * lifetime) as i64;
    let width = (span / 4).max(1);
    let room = (span - width).max(0) as u64;
    let digest = ring::digest::digest(&ring::digest::SHA256, serial);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    let offset = if room == 0 {
        0
    } else {
        (u64::from_be_bytes(first) % (room + 1)) as i64
    };
    let start = not_before + (from * lifetime) as i64 + offset;
    (start, start + width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_fall_inside_the_configured_fractions_and_differ_by_serial() {
        let (nb, na) = (1_000_000, 1_000_000 + 90 * 86400);
        let lifetime = (na - nb) as f64;
        let mut starts = std::collections::BTreeSet::new();
        for s in 0u16..200 {
            let serial = s.to_be_bytes();
            let (start, end) = spread_window(nb, na, [0.6, 0.8], &serial);
            assert!(end > start, "RFC 9773 §4.2: end after start");
            assert!(start >= nb + (0.6 * lifetime) as i64 - 1, "{s}");
            assert!(end <= nb + (0.8 * lifetime) as i64 + 1, "{s}");
            assert_eq!(end - start, ((0.2 * lifetime) as i64) / 4);
            assert_eq!(
                (start, end),
                spread_window(nb, na, [0.6, 0.8], &serial),
                "deterministic"
            );
            starts.insert(start);
        }
        assert!(starts.len() > 150, "spread out: {} distinct", starts.len());
    }
}
