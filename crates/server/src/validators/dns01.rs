//! dns-01 (RFC 8555 §8.4): a TXT record at `_acme-challenge.<name>` whose
//! value is base64url(SHA-256(key authorization)).
//!
//! CNAMEs are followed by the resolver (the answer carries the chain and
//! the target's TXT records); a record split into several strings is
//! joined (RFC 7208 §3.3 practice, which ACME clients rely on); any one
//! matching record passes. Nothing is cached between attempts (see
//! `Validators::new`).

use acme_proxy_protocol::ProblemType;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hickory_resolver::proto::rr::{RData, RecordType};
use subtle::ConstantTimeEq;

use super::{ValidationError, ValidationTarget, Validators};

/// The TXT value a client must publish for `key_authorization`.
pub fn txt_value(key_authorization: &str) -> String {
    URL_SAFE_NO_PAD.encode(ring::digest::digest(
        &ring::digest::SHA256,
        key_authorization.as_bytes(),
    ))
}

pub async fn validate(v: &Validators, t: &ValidationTarget) -> Result<(), ValidationError> {
    // Absolute, so no search domain is ever appended.
    let name = format!("_acme-challenge.{}.", t.identifier);
    let want = txt_value(&t.key_authorization);
    let lookup = v
        .resolver
        .lookup(name.as_str(), RecordType::TXT)
        .await
        .map_err(|e| {
            if e.is_nx_domain() || e.is_no_records_found() {
                ValidationError::new(
                    ProblemType::Unauthorized,
                    format!("no TXT record found at {name}"),
                )
            } else {
                ValidationError::new(ProblemType::Dns, v.dns_failure("TXT", &name, &e))
            }
        })?;
    let mut seen = Vec::new();
    for record in lookup.answers() {
        if let RData::TXT(txt) = &record.data {
            let joined: Vec<u8> = txt
                .txt_data
                .iter()
                .flat_map(|s| s.iter().copied())
                .collect();
            if joined.len() == want.len() && bool::from(joined.as_slice().ct_eq(want.as_bytes())) {
                return Ok(());
            }
            seen.push(
                String::from_utf8_lossy(&joined)
                    .chars()
                    .take(100)
                    .collect::<String>(),
            );
        }
    }
    if seen.is_empty() {
        return Err(ValidationError::new(
            ProblemType::Unauthorized,
            format!("no TXT record found at {name}"),
        ));
    }
    Err(ValidationError::new(
        ProblemType::IncorrectResponse,
        format!("the TXT records at {name} are {seen:?}; none is the expected {want:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_txt_value_is_the_rfc_8555_digest_of_the_key_authorization() {
        // SHA-256("abc") in base64url.
        assert_eq!(
            txt_value("abc"),
            "ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0"
        );
    }
}
