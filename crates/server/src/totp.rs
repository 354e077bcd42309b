//! Time-based one-time passwords (RFC 6238) for the web console's second
//! factor: HMAC-SHA-1 (what every authenticator app takes by default), six
//! digits, 30-second steps, one step of drift either way.

use subtle::ConstantTimeEq;

/// Seconds per step (RFC 6238 §4.1's default).
pub const STEP_SECONDS: i64 = 30;
const DIGITS: u32 = 6;
/// Steps accepted on either side of now: a phone's clock a little off,
/// or a code typed as it changed.
const DRIFT: i64 = 1;

/// A new secret: 160 bits, HMAC-SHA-1's output size (RFC 4226 §4 asks
/// for at least 128).
pub fn new_secret() -> [u8; 20] {
    crate::ids::totp_secret()
}

/// The secret as authenticator apps take it typed: base32 without padding.
pub fn base32(secret: &[u8]) -> String {
    data_encoding::BASE32_NOPAD.encode(secret)
}

/// The code of `step` (RFC 4226 §5.3: HMAC, dynamic truncation, modulo).
pub fn code(secret: &[u8], step: i64) -> u32 {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret);
    let mac = ring::hmac::sign(&key, &step.to_be_bytes());
    let mac = mac.as_ref();
    let offset = usize::from(mac[mac.len() - 1] & 0x0f);
    let binary = u32::from_be_bytes([
        mac[offset] & 0x7f,
        mac[offset + 1],
        mac[offset + 2],
        mac[offset + 3],
    ]);
    binary % 10u32.pow(DIGITS)
}

/// The step `given` is the code of, within the drift of `now` and after
/// `last` (each code is taken once: RFC 6238 §5.2); none otherwise.
pub fn matching_step(secret: &[u8], given: &str, now: i64, last: Option<i64>) -> Option<i64> {
    let given: String = given.chars().filter(|c| !c.is_whitespace()).collect();
    if given.len() != DIGITS as usize || !given.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let current = now.div_euclid(STEP_SECONDS);
    let mut found = None;
    // Every candidate is computed and compared, whichever matches.
    for step in current - DRIFT..=current + DRIFT {
        let expected = format!("{:0width$}", code(secret, step), width = DIGITS as usize);
        let matches: bool = expected.as_bytes().ct_eq(given.as_bytes()).into();
        if matches && last.is_none_or(|last| step > last) {
            found = Some(step);
        }
    }
    found
}

/// The `otpauth://` URI an authenticator app reads from the QR code.
pub fn otpauth_uri(issuer: &str, account: &str, secret: &[u8]) -> String {
    let label = format!("{issuer}:{account}");
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    };
    format!(
        "otpauth://totp/{}?secret={}&issuer={}&algorithm=SHA1&digits={DIGITS}&period={STEP_SECONDS}",
        enc(&label),
        base32(secret),
        enc(issuer)
    )
}

/// The QR code of `text` as an SVG document.
pub fn qr_svg(text: &str) -> Result<String, String> {
    let code = qrcode::QrCode::new(text.as_bytes()).map_err(|e| format!("QR code: {e}"))?;
    Ok(code
        .render::<qrcode::render::svg::Color<'_>>()
        .min_dimensions(200, 200)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6238 Appendix B's SHA-1 vectors, the last six of their eight
    /// digits.
    #[test]
    fn codes_are_rfc_6238s_test_vectors() {
        let secret = b"12345678901234567890";
        for (time, expected) in [
            (59, 287_082),
            (1_111_111_109, 81_804),
            (1_111_111_111, 50_471),
            (1_234_567_890, 5_924),
            (2_000_000_000, 279_037),
            (20_000_000_000, 353_130),
        ] {
            assert_eq!(code(secret, time / STEP_SECONDS), expected, "at {time}");
        }
    }

    #[test]
    fn a_code_is_taken_one_step_either_side_and_only_after_the_last_one_used() {
        let secret = b"12345678901234567890";
        let now = 1_111_111_111;
        let step = now / STEP_SECONDS;
        let of = |s: i64| format!("{:06}", code(secret, s));
        assert_eq!(matching_step(secret, &of(step), now, None), Some(step));
        assert_eq!(
            matching_step(secret, &of(step - 1), now, None),
            Some(step - 1)
        );
        assert_eq!(
            matching_step(secret, &of(step + 1), now, None),
            Some(step + 1)
        );
        assert_eq!(matching_step(secret, &of(step - 2), now, None), None);
        assert_eq!(matching_step(secret, &of(step + 2), now, None), None);
        // Used once: the same code, or an older one, no more.
        assert_eq!(matching_step(secret, &of(step), now, Some(step)), None);
        assert_eq!(matching_step(secret, &of(step - 1), now, Some(step)), None);
        assert_eq!(
            matching_step(secret, &of(step + 1), now, Some(step)),
            Some(step + 1)
        );
        // Spaces as apps show them are fine; anything else is not a code.
        let spaced = format!("{} {}", &of(step)[..3], &of(step)[3..]);
        assert_eq!(matching_step(secret, &spaced, now, None), Some(step));
        for bad in ["", "12345", "1234567", "12a456", "１２３４５６"] {
            assert_eq!(matching_step(secret, bad, now, None), None, "{bad:?}");
        }
    }

    #[test]
    fn the_otpauth_uri_names_the_issuer_and_account_and_carries_the_secret_in_base32() {
        let uri = otpauth_uri("acme-proxy", "alice", b"12345678901234567890");
        assert_eq!(
            uri,
            "otpauth://totp/acme-proxy%3Aalice?secret=GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ&issuer=acme-proxy&algorithm=SHA1&digits=6&period=30"
        );
        let svg = qr_svg(&uri).expect("a QR code");
        assert!(svg.contains("<svg") && svg.contains("</svg>"), "{svg}");
    }
}
