//! Identifier syntax (RFC 8555 §7.1.4, §9.7.7; RFC 1035 §2.3.1 preferred
//! name syntax; RFC 5890 A-labels).
//!
//! Only syntax lives here. Policy (which names a profile may issue for) is
//! the authority's.

use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};

/// Why a DNS identifier's value was refused (a `rejectedIdentifier` or
/// `malformed` problem in RFC 8555 terms, chosen by the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("the name is empty")]
    Empty,
    #[error("the name is {0} octets long; at most 253 are allowed")]
    TooLong(usize),
    #[error("the name ends with a dot; send it without the trailing dot")]
    TrailingDot,
    #[error("the name has an empty label")]
    EmptyLabel,
    #[error("the label {0:?} is longer than 63 octets")]
    LabelTooLong(String),
    #[error("the label {0:?} contains a character other than a-z, 0-9 and '-'")]
    BadCharacter(String),
    #[error("the label {0:?} starts or ends with a hyphen")]
    EdgeHyphen(String),
    #[error(
        "the label {0:?} starts with the ACE prefix \"xn--\" but is not the punycode of a valid U-label (RFC 5890 §2.3.2.1, RFC 8555 §7.1.4)"
    )]
    BadALabel(String),
    #[error("the name has a single label; a fully qualified name is required")]
    SingleLabel,
    #[error("the name looks like an IP address; use an \"ip\" identifier (RFC 8738) instead")]
    LooksLikeIp,
    #[error("the wildcard must be the whole leftmost label, as in \"*.example.com\"")]
    BadWildcard,
}

/// True when `name` matches `pattern`, ASCII case-insensitively, where `*`
/// stands for any run of characters, dots included, and everything else
/// for itself: `*.lab.test` matches `a.lab.test`, `a.b.lab.test` and the
/// wildcard `*.lab.test`, not `lab.test` or `evil-lab.test`.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    // Where the last `*` was and how much of `name` it has taken so far.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && p[pi].eq_ignore_ascii_case(&n[ni]) {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            // Let the last star take one more character and retry.
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A checked DNS name: lowercase, LDH labels, no trailing dot, and an
/// optional leading `*.` wildcard label.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DnsName {
    /// Invariant: lowercase, passes every rule of [`check_dns_name`].
    name: String,
}

impl DnsName {
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// True for `*.example.com`.
    pub fn is_wildcard(&self) -> bool {
        self.name.starts_with("*.")
    }

    /// The name without its wildcard label, i.e. what the authorization is
    /// for (RFC 8555 §7.1.3).
    pub fn base(&self) -> &str {
        self.name.strip_prefix("*.").unwrap_or(&self.name)
    }
}

/// The ASCII-Compatible Encoding prefix of an A-label (RFC 5890 §2.3.1).
const ACE_PREFIX: &str = "xn--";

/// True when `label` (lowercase, LDH, starting with [`ACE_PREFIX`]) is an
/// A-label: RFC 8555 §7.1.4 says "Servers MUST verify any identifier values
/// that begin with the ASCII-Compatible Encoding prefix "xn--" as defined in
/// [RFC5890] are properly encoded". So the rest must be valid punycode
/// (RFC 3492) that decodes to a valid U-label — NFC, not mapped or
/// disallowed, no hyphens in the third and fourth positions or at either
/// end (RFC 5891 §4.2.3.1), checked by the `idna` crate's UTS #46
/// processing with the STD3 rules — and that U-label must encode back to
/// exactly `label` (the round trip of RFC 5890 §2.3.2.1), so that one name
/// has one spelling.
fn is_a_label(label: &str) -> bool {
    let uts46 = Uts46::new();
    let (unicode, decoded) =
        uts46.to_unicode(label.as_bytes(), AsciiDenyList::STD3, Hyphens::Check);
    if decoded.is_err() || unicode.is_ascii() {
        return false;
    }
    uts46
        .to_ascii(
            unicode.as_bytes(),
            AsciiDenyList::STD3,
            Hyphens::Check,
            DnsLength::Ignore,
        )
        .is_ok_and(|back| back == label)
}

/// Checks and normalises (to lowercase; DNS is case-insensitive) a DNS
/// identifier value.
pub fn check_dns_name(value: &str) -> Result<DnsName, NameError> {
    if value.is_empty() {
        return Err(NameError::Empty);
    }
    let lower = value.to_ascii_lowercase();
    if lower.len() > 253 {
        return Err(NameError::TooLong(lower.len()));
    }
    if lower.ends_with('.') {
        return Err(NameError::TrailingDot);
    }
    let rest = match lower.strip_prefix("*.") {
        Some(rest) => rest,
        None => &lower,
    };
    if rest.contains('*') {
        return Err(NameError::BadWildcard);
    }
    let labels: Vec<&str> = rest.split('.').collect();
    for label in &labels {
        if label.is_empty() {
            return Err(NameError::EmptyLabel);
        }
        if label.len() > 63 {
            return Err(NameError::LabelTooLong((*label).to_owned()));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(NameError::BadCharacter((*label).to_owned()));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(NameError::EdgeHyphen((*label).to_owned()));
        }
        if label.starts_with(ACE_PREFIX) && !is_a_label(label) {
            return Err(NameError::BadALabel((*label).to_owned()));
        }
    }
    if labels.len() < 2 {
        return Err(NameError::SingleLabel);
    }
    // A name whose last label is all digits is an IPv4 address in disguise;
    // no top-level domain is numeric (RFC 3696 §2).
    if labels
        .last()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(NameError::LooksLikeIp);
    }
    Ok(DnsName { name: lower })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, want: Result<&str, NameError>) {
        let got = check_dns_name(input);
        match want {
            Ok(name) => assert_eq!(
                got.map(|n| n.as_str().to_owned()),
                Ok(name.to_owned()),
                "{input}"
            ),
            Err(e) => assert_eq!(got, Err(e), "{input}"),
        }
    }

    #[test]
    fn a_glob_star_takes_any_run_of_characters_and_nothing_else_is_special() {
        assert!(glob_matches("*.lab.test", "a.lab.test"));
        assert!(glob_matches("*.lab.test", "a.b.lab.test"));
        assert!(glob_matches("*.lab.test", "*.lab.test"));
        assert!(glob_matches("*.LAB.test", "Host.lab.TEST"));
        assert!(glob_matches("web-*.example.com", "web-01.example.com"));
        assert!(glob_matches("*", "anything.at.all"));
        assert!(glob_matches("exact.test", "exact.test"));
        assert!(!glob_matches("*.lab.test", "lab.test"));
        assert!(!glob_matches("*.lab.test", "example.com"));
        assert!(!glob_matches("*.lab.test", "a.lab.test.evil.com"));
        assert!(!glob_matches("*.lab.test", "evil-lab.test"));
        assert!(!glob_matches("exact.test", "exact.tests"));
        assert!(!glob_matches("a*b*c", "aXbXd"));
        assert!(glob_matches("a*b*c", "aXbXbXc"));
    }

    #[test]
    fn labels_with_the_ace_prefix_must_be_punycode_of_a_valid_u_label() {
        // Valid A-labels, in any case, anywhere in the name.
        check("xn--mnchen-3ya.example", Ok("xn--mnchen-3ya.example"));
        check("XN--BCHER-KVA.example", Ok("xn--bcher-kva.example"));
        check("www.xn--d1acufc.xn--p1ai", Ok("www.xn--d1acufc.xn--p1ai"));
        check("*.xn--55qx5d.example", Ok("*.xn--55qx5d.example"));
        check("xn--zca.example", Ok("xn--zca.example"));
        let bad = |label: &str| {
            check(
                &format!("{label}.example"),
                Err(NameError::BadALabel(label.to_lowercase())),
            );
            check(
                &format!("www.{label}.example"),
                Err(NameError::BadALabel(label.to_lowercase())),
            );
        };
        // Not punycode at all: a digit where a delta must end, an overflow.
        bad("xn--0");
        bad("xn--99999999999");
        bad("xn--bcher-kva0");
        bad("xn--ab--c");
        // Punycode of something that is not a valid U-label: a C1 control
        // character, an upper-case letter (which UTS #46 maps, so it is
        // never in a U-label), a U-label with "--" in the third and fourth
        // positions.
        bad("xn--a");
        bad("xn--ber-via");
        bad(&format!(
            "xn--{}",
            idna::punycode::encode_str("ab--ü").unwrap()
        ));
        // The prefix alone is caught earlier: it ends with a hyphen.
        check("xn--.example", Err(NameError::EdgeHyphen("xn--".into())));
        // Labels without the prefix are left alone, "--" or not.
        check("ab--cd.example", Ok("ab--cd.example"));
    }

    #[test]
    fn an_a_label_is_one_that_decodes_and_encodes_back_to_itself() {
        for good in ["xn--bcher-kva", "xn--fiqs8s", "xn--tda"] {
            assert!(is_a_label(good), "{good}");
        }
        // Punycode whose decoding is ASCII only is no A-label ("abc").
        assert!(!is_a_label("xn--abc-"));
        // The empty punycode string.
        assert!(!is_a_label("xn--"));
    }

    #[test]
    fn dns_names_are_checked_and_lowercased() {
        check("www.Example.TEST", Ok("www.example.test"));
        check("*.example.test", Ok("*.example.test"));
        check("a-b.example.test", Ok("a-b.example.test"));
        check("xn--bcher-kva.example", Ok("xn--bcher-kva.example"));
        check("", Err(NameError::Empty));
        check("example.test.", Err(NameError::TrailingDot));
        check("a..example", Err(NameError::EmptyLabel));
        check(
            "under_score.example",
            Err(NameError::BadCharacter("under_score".into())),
        );
        check("-lead.example", Err(NameError::EdgeHyphen("-lead".into())));
        check("localhost", Err(NameError::SingleLabel));
        check("10.0.0.1", Err(NameError::LooksLikeIp));
        check("a.*.example", Err(NameError::BadWildcard));
        check("*example.test", Err(NameError::BadWildcard));
        check(
            &format!("{}.test", "a".repeat(64)),
            Err(NameError::LabelTooLong("a".repeat(64))),
        );
        let long = vec!["abcdefghi"; 26].join(".");
        check(&long, Err(NameError::TooLong(259)));
    }
}
