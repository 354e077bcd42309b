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
    match check(v, t).await {
        Err(mut e) if e.kind != ProblemType::Dns => {
            if let Some(zone) = &v.delegation_zone {
                let name = format!("_acme-challenge.{}.", t.identifier);
                e.detail.push_str(&delegation_hint(v, &name, zone).await);
            }
            Err(e)
        }
        other => other,
    }
}

/// Where `name` is delegated, when it is not answered: the one thing a
/// client publishing through our zone (the acme-dns API, `dns txt`) gets
/// wrong, said with the record to create. Nothing when the lookup fails.
async fn delegation_hint(v: &Validators, name: &str, zone: &str) -> String {
    let target = match v.resolver.lookup(name, RecordType::CNAME).await {
        Ok(lookup) => lookup.answers().iter().find_map(|r| match &r.data {
            RData::CNAME(c) => Some(c.0.to_ascii().to_ascii_lowercase()),
            _ => None,
        }),
        Err(e) if e.is_nx_domain() || e.is_no_records_found() => None,
        Err(_) => return String::new(),
    };
    let Some(target) = target else {
        return format!(
            "; no CNAME delegates it to this server's zone {zone}: to publish there, the DNS of {} needs `{name} CNAME <the account's fulldomain>.` (`acme-proxy dns account add --for NAME` prints it)",
            name.trim_start_matches("_acme-challenge.")
                .trim_end_matches('.')
        );
    };
    let bare = target.trim_end_matches('.');
    if bare == zone || bare.ends_with(&format!(".{zone}")) {
        format!(
            "; it is delegated by CNAME to {target} in this server's zone, where the client must publish its value (acme-dns update, or `acme-proxy dns txt add`)"
        )
    } else {
        format!("; it is delegated by CNAME to {target}, outside this server's zone {zone}")
    }
}

async fn check(v: &Validators, t: &ValidationTarget) -> Result<(), ValidationError> {
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
