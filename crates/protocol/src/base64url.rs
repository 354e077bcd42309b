//! The one base64url decoder for what clients send (RFC 8555 §6.1).
//!
//! RFC 8555 §6.1 encodes binary fields as base64url per RFC 7515 §2:
//! "Trailing '=' characters MUST be stripped. Encoded values that include
//! trailing '=' characters MUST be rejected as improperly encoded." Every
//! client value — the JWS parts, JWK members, the external account
//! binding, the finalize `csr`, the revoked `certificate` — is decoded
//! here, so no caller can loosen that by trimming or by another engine.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A value that is not unpadded base64url.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not unpadded base64url (RFC 8555 §6.1)")]
pub struct NotBase64Url;

/// Decodes unpadded base64url, refusing padding (`=`), the standard
/// alphabet's `+` and `/`, whitespace and any other character, and
/// non-zero trailing bits (so each value has exactly one encoding).
pub fn decode(s: &str) -> Result<Vec<u8>, NotBase64Url> {
    // base64 0.22's URL_SAFE_NO_PAD requires no padding
    // (`DecodePaddingMode::RequireNone`) and refuses non-canonical
    // trailing bits; the tests below hold it to that.
    URL_SAFE_NO_PAD.decode(s).map_err(|_| NotBase64Url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpadded_base64url_decodes() {
        assert_eq!(decode(""), Ok(Vec::new()));
        assert_eq!(decode("AQAB"), Ok(vec![1, 0, 1]));
        assert_eq!(decode("-_8"), Ok(vec![0xfb, 0xff]));
        assert_eq!(decode("YQ"), Ok(b"a".to_vec()));
    }

    #[test]
    fn trailing_padding_is_refused_as_rfc_8555_section_6_1_requires() {
        for padded in ["YQ==", "YQ=", "YWI=", "AQAB=", "=", "===="] {
            assert_eq!(decode(padded), Err(NotBase64Url), "{padded:?}");
        }
    }

    #[test]
    fn characters_outside_the_base64url_alphabet_are_refused() {
        for bad in ["+_8", "-/8", "YW I", "YWI\n", "YW.I", "YWI*", "é"] {
            assert_eq!(decode(bad), Err(NotBase64Url), "{bad:?}");
        }
    }

    #[test]
    fn a_final_character_with_non_zero_trailing_bits_is_refused() {
        // "YQ" is 'a'; "YR" carries the same octet with a stray low bit.
        assert_eq!(decode("YR"), Err(NotBase64Url));
        // A lone character cannot encode a whole octet.
        assert_eq!(decode("Y"), Err(NotBase64Url));
    }
}
