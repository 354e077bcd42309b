//! Bounds on client-supplied text kept by the server: what a request may
//! put into an audit row or a log line is cut to a documented length here,
//! and only here, so that no request — however large its body, path or
//! headers — writes more than a known amount per row or line.
//!
//! A cut value keeps its start, cut on a character boundary, followed by a
//! marker with its full length: `"aaaa…(45000 octets)"`. A marker adds at
//! most [`MARKER_OCTETS`] to the bound. A value within its bound is kept as
//! it is, so a valid identifier (RFC 1035 §2.3.4: at most 253 octets in
//! text form) is never cut.

use std::borrow::Cow;

use acme_proxy_protocol::types::{Identifier, RawIdentifier};

/// Octets kept of one identifier's type or value: the longest DNS name
/// (RFC 1035 §2.3.4, 253 octets without the trailing dot). An IP address
/// is shorter.
pub const VALUE_OCTETS: usize = 253;

/// Identifiers kept of a list that is not known to be valid (a refused
/// newOrder's, in its audit row), or of any list written to a log line.
/// The number left out is kept beside them.
pub const IDENTIFIERS: usize = 10;

/// Octets kept of a free text: a problem detail (which may quote a CSR's
/// names, a contact URL, a certificate profile's name or an identifier), an
/// internal cause, an operator-only audit detail.
pub const TEXT_OCTETS: usize = 1024;

/// Octets kept of a `User-Agent` header (RFC 9110 §10.1.5).
pub const USER_AGENT_OCTETS: usize = 128;

/// Octets kept of a request's path in its log span.
pub const PATH_OCTETS: usize = 256;

/// The most a marker adds: `…` (3 octets), `(`, at most 20 digits, and
/// ` octets)`.
pub const MARKER_OCTETS: usize = 3 + 1 + 20 + 8;

/// `text` cut to at most `max` octets (on a character boundary) plus a
/// marker with its full length, or `text` itself when it is that short.
pub fn truncate(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let cut = text.floor_char_boundary(max);
    Cow::Owned(format!("{}…({} octets)", &text[..cut], text.len()))
}

/// One identifier's value (or type), cut to [`VALUE_OCTETS`].
pub fn value(text: &str) -> Cow<'_, str> {
    truncate(text, VALUE_OCTETS)
}

/// A free text, cut to [`TEXT_OCTETS`].
pub fn text(text: &str) -> Cow<'_, str> {
    truncate(text, TEXT_OCTETS)
}

/// A list of identifiers as kept: at most `keep` of them, each type and
/// value cut to [`VALUE_OCTETS`], and how many there were.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identifiers {
    pub kept: Vec<RawIdentifier>,
    pub total: usize,
}

impl Identifiers {
    /// How many were left out.
    pub fn omitted(&self) -> usize {
        self.total - self.kept.len()
    }

    /// What a reader must be told when some were left out, e.g. "101
    /// identifiers; the first 10 are recorded".
    pub fn note(&self) -> Option<String> {
        (self.omitted() > 0).then(|| {
            format!(
                "{} identifiers; the first {} are recorded",
                self.total,
                self.kept.len()
            )
        })
    }
}

/// Whether [`identifiers`] with `keep` would change `ids`.
pub fn needs_bounding(ids: &[RawIdentifier], keep: usize) -> bool {
    ids.len() > keep
        || ids
            .iter()
            .any(|i| i.kind.len() > VALUE_OCTETS || i.value.len() > VALUE_OCTETS)
}

/// The first `keep` of `ids`, each type and value cut to
/// [`VALUE_OCTETS`], with their number.
pub fn identifiers(ids: &[RawIdentifier], keep: usize) -> Identifiers {
    Identifiers {
        kept: ids
            .iter()
            .take(keep)
            .map(|i| RawIdentifier {
                kind: value(&i.kind).into_owned(),
                value: value(&i.value).into_owned(),
            })
            .collect(),
        total: ids.len(),
    }
}

/// Identifier values for a log line: the first [`IDENTIFIERS`], each cut to
/// [`VALUE_OCTETS`], comma-separated, then "and N more" when there were
/// more.
pub fn identifier_list(ids: &[Identifier]) -> String {
    let mut out = ids
        .iter()
        .take(IDENTIFIERS)
        .map(|i| value(&i.value))
        .collect::<Vec<_>>()
        .join(",");
    if ids.len() > IDENTIFIERS {
        out.push_str(&format!(" and {} more", ids.len() - IDENTIFIERS));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_as_it_is_and_long_text_is_cut_on_a_character_boundary_with_its_length() {
        assert!(matches!(truncate("abc", 3), Cow::Borrowed("abc")));
        assert_eq!(truncate("abcdef", 3), "abc…(6 octets)");
        // "é" is two octets: a cut inside it moves back to its start.
        let s = "aé".repeat(100);
        let cut = truncate(&s, 2);
        assert_eq!(cut, "a…(300 octets)");
        let long = "x".repeat(45_000);
        let cut = truncate(&long, VALUE_OCTETS);
        assert!(cut.len() <= VALUE_OCTETS + MARKER_OCTETS, "{}", cut.len());
        assert!(cut.ends_with("…(45000 octets)"), "{cut}");
        let huge = truncate(&long, 0);
        assert!(huge.len() <= MARKER_OCTETS);
    }

    #[test]
    fn a_list_keeps_its_first_identifiers_cut_and_says_how_many_there_were() {
        let mut checked: Vec<Identifier> = (0..100)
            .map(|n| Identifier::dns(format!("{n}.example.test")))
            .collect();
        checked.push(Identifier::dns("y".repeat(45_000)));
        let ids: Vec<RawIdentifier> = checked.iter().map(RawIdentifier::from).collect();
        assert!(needs_bounding(&ids, IDENTIFIERS));
        assert!(!needs_bounding(&ids[..10], IDENTIFIERS));
        let kept = identifiers(&ids, IDENTIFIERS);
        assert_eq!(kept.kept, ids[..10]);
        assert_eq!((kept.total, kept.omitted()), (101, 91));
        assert_eq!(
            kept.note().as_deref(),
            Some("101 identifiers; the first 10 are recorded")
        );
        let all = identifiers(&ids, usize::MAX);
        assert_eq!(all.kept.len(), 101);
        assert!(all.kept[100].value.ends_with("…(45000 octets)"));
        assert_eq!(all.note(), None);
        assert_eq!(
            identifier_list(&checked[..2]),
            "0.example.test,1.example.test"
        );
        assert!(identifier_list(&checked).ends_with("9.example.test and 91 more"));
    }
}
