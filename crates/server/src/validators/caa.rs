//! CAA (RFC 8659) with the RFC 8657 `accounturi` and `validationmethods`
//! parameters, checked at validation time.
//!
//! The closest CAA RRset is found by climbing from the name towards the
//! root (RFC 8659 §3), the resolver following CNAMEs. Within it: an unknown
//! property with the critical flag forbids issuance (§4.1); a wildcard uses
//! its `issuewild` records if there are any, else `issue` (§4.3); no
//! relevant record permits any CA; otherwise one record must name one of
//! this profile's CA identities with parameters this request satisfies.

use acme_proxy_protocol::ProblemType;
use hickory_resolver::proto::rr::rdata::CAA;
use hickory_resolver::proto::rr::{RData, RecordType};

use super::{ValidationError, Validators};

/// What a CAA record must permit.
#[derive(Debug, Clone)]
pub struct CaaRequest<'a> {
    /// The name without any wildcard label.
    pub name: &'a str,
    pub wildcard: bool,
    /// The issuer domain names of this profile's CA (`caa_identities`).
    pub identities: &'a [String],
    /// This account's URL (RFC 8657 §3 `accounturi`).
    pub account_uri: &'a str,
    /// The challenge type used (RFC 8657 §4 `validationmethods`).
    pub method: &'a str,
}

const KNOWN: [&str; 3] = ["issue", "issuewild", "iodef"];

/// Looks up and evaluates CAA for `req`.
pub async fn check(v: &Validators, req: &CaaRequest<'_>) -> Result<(), ValidationError> {
    let mut domain = req.name.trim_end_matches('.').to_owned();
    loop {
        let fqdn = format!("{domain}.");
        let records: Vec<CAA> = match v.resolver.lookup(fqdn.as_str(), RecordType::CAA).await {
            Ok(lookup) => lookup
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::CAA(caa) => Some(caa.clone()),
                    _ => None,
                })
                .collect(),
            Err(e) if e.is_nx_domain() || e.is_no_records_found() => Vec::new(),
            Err(e) => {
                // §3: a CA must not issue when the lookup fails.
                return Err(ValidationError::new(
                    ProblemType::Dns,
                    v.dns_failure("CAA", &fqdn, &e),
                ));
            }
        };
        if !records.is_empty() {
            return evaluate(&records, &domain, req)
                .map_err(|detail| ValidationError::new(ProblemType::Caa, detail));
        }
        match domain.split_once('.') {
            Some((_, parent)) => domain = parent.to_owned(),
            None => return Ok(()),
        }
    }
}

/// RFC 8659 §4 on the closest non-empty RRset, found at `domain`.
pub fn evaluate(records: &[CAA], domain: &str, req: &CaaRequest<'_>) -> Result<(), String> {
    for r in records {
        if r.issuer_critical && !KNOWN.iter().any(|k| r.tag.eq_ignore_ascii_case(k)) {
            return Err(format!(
                "the CAA record at {domain} has the unknown critical property {:?}, which forbids issuance (RFC 8659 §4.1)",
                r.tag
            ));
        }
    }
    let of = |tag: &str| {
        records
            .iter()
            .filter(|r| r.tag.eq_ignore_ascii_case(tag))
            .collect::<Vec<_>>()
    };
    let issuewild = of("issuewild");
    let (tag, relevant) = if req.wildcard && !issuewild.is_empty() {
        ("issuewild", issuewild)
    } else {
        ("issue", of("issue"))
    };
    if relevant.is_empty() {
        return Ok(());
    }
    let mut shown = Vec::new();
    for r in &relevant {
        shown.push(format!(
            "{} \"{}\"",
            r.tag,
            String::from_utf8_lossy(&r.value)
        ));
        let Ok((Some(issuer), params)) = r.value_as_issue() else {
            continue;
        };
        let issuer = issuer.to_ascii();
        let issuer = issuer.trim_end_matches('.');
        if !req
            .identities
            .iter()
            .any(|i| i.eq_ignore_ascii_case(issuer))
        {
            continue;
        }
        let mut permitted = true;
        for p in &params {
            match p.key() {
                // RFC 8657 §3: only this account.
                "accounturi" => permitted &= p.value() == req.account_uri,
                // RFC 8657 §4: only these methods.
                "validationmethods" => {
                    permitted &= p.value().split(',').any(|m| m.trim() == req.method);
                }
                _ => {}
            }
        }
        if permitted {
            return Ok(());
        }
    }
    Err(format!(
        "the CAA {tag} records at {domain} ({}) do not permit this CA ({:?}) for this account and method",
        shown.join(", "),
        req.identities
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::proto::rr::Name;
    use hickory_resolver::proto::rr::rdata::caa::KeyValue;

    fn issue(tag: &str, ca: Option<&str>, params: &[(&str, &str)]) -> CAA {
        let name = ca.map(|c| Name::from_ascii(c).unwrap());
        let kv = params.iter().map(|(k, v)| KeyValue::new(*k, *v)).collect();
        if tag == "issuewild" {
            CAA::new_issuewild(false, name, kv)
        } else {
            CAA::new_issue(false, name, kv)
        }
    }

    fn verdict(records: &[CAA], wildcard: bool) -> bool {
        let ids = vec!["ca.example.test".to_owned()];
        let req = CaaRequest {
            name: "a.example.test",
            wildcard,
            identities: &ids,
            account_uri: "https://acme.test/acct/1",
            method: "http-01",
        };
        evaluate(records, "example.test", &req).is_ok()
    }

    #[test]
    fn caa_verdicts_follow_rfc_8659_and_8657() {
        let us = issue("issue", Some("ca.example.test"), &[]);
        let them = issue("issue", Some("other.example"), &[]);
        let nobody = issue("issue", None, &[]);
        assert!(verdict(std::slice::from_ref(&us), false), "issue for us");
        assert!(
            !verdict(std::slice::from_ref(&them), false),
            "issue for someone else"
        );
        assert!(!verdict(&[nobody], false), "issue \";\" forbids everyone");
        assert!(
            verdict(&[them.clone(), us.clone()], false),
            "any one record suffices"
        );
        // Wildcards use issuewild when present, else issue.
        let wild_them = issue("issuewild", Some("other.example"), &[]);
        assert!(
            !verdict(&[us.clone(), wild_them.clone()], true),
            "issuewild only for someone else"
        );
        assert!(
            verdict(&[us.clone(), wild_them], false),
            "issuewild does not concern a plain name"
        );
        assert!(
            verdict(std::slice::from_ref(&us), true),
            "no issuewild: issue applies"
        );
        // RFC 8657 parameters.
        assert!(verdict(
            &[issue(
                "issue",
                Some("ca.example.test"),
                &[("accounturi", "https://acme.test/acct/1")]
            )],
            false
        ));
        assert!(!verdict(
            &[issue(
                "issue",
                Some("ca.example.test"),
                &[("accounturi", "https://acme.test/acct/2")]
            )],
            false
        ));
        assert!(verdict(
            &[issue(
                "issue",
                Some("ca.example.test"),
                &[("validationmethods", "dns-01,http-01")]
            )],
            false
        ));
        assert!(!verdict(
            &[issue(
                "issue",
                Some("ca.example.test"),
                &[("validationmethods", "dns-01")]
            )],
            false
        ));
        // An unknown critical property forbids issuance; an unknown
        // non-critical one is ignored.
        let mut critical = CAA::new_issue(true, None, vec![]);
        critical.tag = "tbs".into();
        assert!(!verdict(&[us.clone(), critical.clone()], false));
        critical.issuer_critical = false;
        assert!(verdict(&[us, critical], false));
    }
}
