//! Random identifiers, tokens, nonces and serial numbers.
//!
//! All randomness comes from the operating system through `ring`, the one
//! crypto provider of the tree.

use std::cell::RefCell;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};

/// Octets of OS randomness each thread fetches at a time.
const POOL: usize = 1024;

/// A thread's unused OS randomness: `octets[used..]` is fresh, everything
/// before it has been handed out and overwritten with zeros.
struct Pool {
    octets: [u8; POOL],
    used: usize,
}

thread_local! {
    static RANDOM: RefCell<Pool> = const {
        RefCell::new(Pool { octets: [0; POOL], used: POOL })
    };
}

/// `N` octets from the operating system's random source, each handed out
/// once. They are fetched a kilobyte at a time per thread: an issuance
/// draws some twenty values (a request id and a nonce per response, ids,
/// a token, a serial), and one `getrandom` system call each was 1 % of the
/// server's CPU (docs/performance.md). What was handed out does not stay
/// in the pool.
///
/// If the OS random source fails (it does not on supported platforms,
/// once booted), nothing is handed out: the calling request fails rather
/// than get a predictable serial, token or key.
fn random<const N: usize>() -> [u8; N] {
    const { assert!(N <= POOL) };
    RANDOM.with_borrow_mut(|pool| {
        if POOL - pool.used < N {
            #[allow(clippy::panic)]
            if SystemRandom::new().fill(&mut pool.octets).is_err() {
                // A panic ends this request's task only (tokio catches
                // it); the pool stays empty, so the next draw asks again.
                panic!("the operating system's random source failed");
            }
            pool.used = 0;
        }
        let mut out = [0u8; N];
        let taken = &mut pool.octets[pool.used..pool.used + N];
        out.copy_from_slice(taken);
        taken.fill(0);
        pool.used += N;
        out
    })
}

/// An object id for URLs (accounts, orders, authorizations, challenges,
/// certificates): the creation time in Unix milliseconds (48 bits, the first
/// 8 characters) then 80 random bits, base64url (22 characters).
///
/// Why the time first: the id is the primary key of its table and appears in
/// several indexes. Random keys put every insert on a random page of each
/// B-tree, so with a million rows an issuance dirties some ten pages spread
/// over the whole file, each copied by the next checkpoint; ids made close in
/// time share their first characters and land on the same few pages. 80
/// random bits keep ids unguessable (not that knowing one grants anything:
/// every resource is fetched with a signed POST, RFC 8555 §6.3). The first
/// character is `A` until 2109; the time is held below the value whose first
/// character would be `-` (about the year 10,600), so an id never starts
/// with `-` (operators pass ids to the command line). `unix_ms` comes from
/// the injected clock; ids are unique whatever it says.
pub fn object_id(unix_ms: i64) -> String {
    // The first character is the top six of the 48 bits; `-` is 62.
    URL_SAFE_NO_PAD.encode(time_then_random(unix_ms, (62 << 42) - 1))
}

/// 16 octets: `unix_ms` (held to `0..=max`) in the first six, big-endian,
/// then 80 random bits.
fn time_then_random(unix_ms: i64, max: i64) -> [u8; 16] {
    let mut raw = [0u8; 16];
    let ms = unix_ms.clamp(0, max) as u64;
    raw[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    raw[6..].copy_from_slice(&random::<10>());
    raw
}

/// A challenge token: 128 random bits as RFC 8555 §8.3 requires (at least).
pub fn token() -> String {
    URL_SAFE_NO_PAD.encode(random::<16>())
}

/// A nonce (RFC 8555 §6.5): 128 random bits, base64url.
pub fn nonce() -> String {
    URL_SAFE_NO_PAD.encode(nonce_octets())
}

/// The 128 random bits of a nonce, for one that carries more (a signed
/// nonce, `authority/nonces.rs`).
pub fn nonce_octets() -> [u8; 16] {
    random::<16>()
}

/// A 256-bit secret key (the one nonces are signed with).
pub fn secret_key() -> [u8; 32] {
    random::<32>()
}

/// A certificate serial number: the time in Unix milliseconds (6 octets,
/// the top bit clear so the DER INTEGER is positive without padding) then 80
/// random bits — more than the 64 bits of CSPRNG output the CA/Browser
/// Forum's Baseline Requirements (§7.1) ask for, and not sequential.
///
/// Why the time first: the serial is a UNIQUE index of the certificates
/// table (and the key ARI and revocation look certificates up by); random
/// serials put each issuance on a random page of that index, which with a
/// million certificates is a page read and a scattered page write each.
/// The first octet is never 0 (a 15-octet serial would print shorter), even
/// for a clock before 2004.
pub fn serial(unix_ms: i64) -> [u8; 16] {
    let mut s = time_then_random(unix_ms, (1 << 47) - 1);
    if s[0] == 0 {
        s[0] = 0x01;
    }
    s
}

/// Random octets whose base64url text does not start with `-`: command
/// lines take such a value for an option (`certbot --eab-hmac-key -Ab…`
/// stops with a usage error), and EAB values are pasted into command lines.
/// Drawing again costs 1/64 of the space (under 0.03 bits).
fn no_leading_dash<const N: usize>() -> [u8; N] {
    loop {
        let raw = random::<N>();
        // The first character encodes the top six bits; `-` is value 62.
        if N == 0 || raw[0] >> 2 != 62 {
            return raw;
        }
    }
}

/// An External Account Binding key id: 96 random bits, base64url (16
/// characters), short enough to paste.
pub fn eab_kid() -> String {
    URL_SAFE_NO_PAD.encode(no_leading_dash::<12>())
}

/// An External Account Binding HMAC key: 256 bits (HS256's block-size
/// recommendation, RFC 7518 §3.2, asks for at least the hash size).
pub fn eab_hmac_key() -> [u8; 32] {
    no_leading_dash::<32>()
}

/// A random UUID (version 4, RFC 9562 §5.4): how acme-dns names an API
/// account's user and subdomain, which clients may expect.
pub fn uuid_v4() -> String {
    let mut b = random::<16>();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// An acme-dns API account's password: 240 random bits, base64url (40
/// characters, acme-dns's length).
pub fn dns_api_password() -> String {
    URL_SAFE_NO_PAD.encode(random::<30>())
}

/// A password hash's salt: 128 bits (RFC 9106 §3.1 recommends 128).
pub fn salt() -> [u8; 16] {
    random::<16>()
}

/// A web console session's cookie token: 256 random bits, base64url
/// (only its SHA-256 is stored).
pub fn session_token() -> String {
    URL_SAFE_NO_PAD.encode(random::<32>())
}

/// A web console session's CSRF token: 256 random bits, base64url.
pub fn csrf_token() -> String {
    URL_SAFE_NO_PAD.encode(random::<32>())
}

/// A TOTP secret: 160 random bits.
pub fn totp_secret() -> [u8; 20] {
    random::<20>()
}

/// A recovery code for a console operator's second factor: 50 random
/// bits as ten base32 letters, shown `xxxxx-xxxxx`.
pub fn recovery_code() -> String {
    let text = data_encoding::BASE32_NOPAD
        .encode(&random::<8>())
        .to_ascii_lowercase();
    format!("{}-{}", &text[..5], &text[5..10])
}

/// A web console session's name for operators: 64 random bits, hex.
pub fn session_id() -> String {
    hex::encode(random::<8>())
}

/// A request id for logs and the `X-Request-Id` header: 48 random bits, hex.
pub fn request_id() -> String {
    hex::encode(random::<6>())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn ids_made_in_the_same_millisecond_share_their_time_and_differ_in_the_rest() {
        let ms = 1_796_000_000_123; // 2026-11-29
        let (a, b) = (object_id(ms), object_id(ms));
        assert_eq!(a.len(), 22);
        assert_eq!(a[..8], b[..8], "{a} {b}");
        assert_ne!(a[8..], b[8..], "{a} {b}");
        let later = object_id(ms + 1);
        assert_eq!(a[..7], later[..7], "{a} {later}");
        assert_ne!(a[..8], later[..8], "{a} {later}");
        // The time reads back from the first six octets.
        let raw = URL_SAFE_NO_PAD.decode(&a).unwrap();
        let mut t = [0u8; 8];
        t[2..].copy_from_slice(&raw[..6]);
        assert_eq!(u64::from_be_bytes(t), ms as u64);
    }

    #[test]
    fn serials_are_positive_sixteen_octets_ordered_by_time_and_random_after_it() {
        let ms = 1_796_000_000_123;
        let (a, b, later) = (serial(ms), serial(ms), serial(ms + 1));
        assert_eq!(a[..6], b[..6]);
        assert_ne!(a[6..], b[6..]);
        assert!(hex::encode(a) < hex::encode(later));
        for s in [a, serial(0), serial(i64::MAX)] {
            assert!(s[0] != 0 && s[0] & 0x80 == 0, "{}", hex::encode(s));
        }
    }

    #[test]
    fn random_values_are_handed_out_once_across_refills_and_threads_and_leave_no_copy_in_the_pool()
    {
        // Three pools' worth on each of four threads: a pool that did not
        // advance, or started over without fetching, would repeat values;
        // one that zeroed before copying would hand out zeros.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    // Sizes that do not divide the pool, as the real ones
                    // (6, 10, 12, 16, 32): the tail left at a refill is
                    // skipped, never handed out with the next fetch.
                    let mut drawn: Vec<Vec<u8>> = Vec::new();
                    for i in 0..3 * POOL / 16 {
                        drawn.push(random::<16>().to_vec());
                        if i % 3 == 0 {
                            drawn.push(random::<10>().to_vec());
                        }
                        if i % 7 == 0 {
                            drawn.push(random::<32>().to_vec());
                        }
                    }
                    let left_clean = RANDOM.with_borrow(|pool| {
                        pool.used > 0 && pool.octets[..pool.used].iter().all(|&b| b == 0)
                    });
                    (drawn, left_clean)
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for thread in threads {
            let (drawn, left_clean) = thread.join().unwrap();
            assert!(left_clean, "octets handed out are still in the pool");
            for value in drawn {
                assert!(value.iter().any(|&b| b != 0), "an all-zero value");
                // Any 8 octets seen twice would mean octets handed out
                // twice (by chance: 2^-64 per pair).
                for window in value.chunks(8).filter(|c| c.len() == 8) {
                    assert!(
                        seen.insert(window.to_vec()),
                        "{} handed out twice",
                        hex::encode(window)
                    );
                }
            }
        }
    }

    #[test]
    fn no_object_id_eab_key_id_or_key_starts_with_a_dash() {
        // Without the redraw (the EAB values) or the time's bound (ids), one
        // in 64 would: 4,000 of each all but certainly include some.
        for i in 0..4000 {
            let id =
                object_id([1_796_000_000_000 + i, 0, i64::MAX, (62 << 42) + i][i as usize % 4]);
            let kid = eab_kid();
            let key = URL_SAFE_NO_PAD.encode(eab_hmac_key());
            assert!(!id.starts_with('-'), "{id}");
            assert!(!kid.starts_with('-'), "{kid}");
            assert!(!key.starts_with('-'), "{key}");
        }
    }
}
