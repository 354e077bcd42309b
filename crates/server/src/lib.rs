//! acme-proxy: an ACME (RFC 8555) server for internal PKI.
//!
//! See ARCHITECTURE.md for the map. Layers, each using only those below:
//! `server` (assembly) → `api` (front end) → `authority` (state machine) →
//! `signer` → store (crate) → protocol (crate); `validators`, `config`,
//! `clock`, `ids`, `bounded`, `events` are leaves. `admin` (the operators'
//! operations and the CLI over them) is a front end like `api`.

/// A point where the crash harness (tests/it/crash.rs) kills the process,
/// in builds with the `failpoints` feature; nothing otherwise. Each
/// follows a transaction's commit, where a real crash leaves the state the
/// server must resume from.
macro_rules! crash_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name);
    };
}

pub mod admin;
pub mod api;
pub mod authority;
pub mod bounded;
pub mod clock;
pub mod config;
pub mod console;
pub mod dns_api;
pub mod dns_zone;
pub mod egress;
pub mod error;
pub mod events;
pub mod generation;
pub mod ids;
pub mod jobs;
pub mod listener;
pub mod lock;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod operator_program;
pub mod passwords;
pub mod policy;
pub mod private;
pub mod server;
pub mod signer;
pub mod tls;
pub mod totp;
pub mod validators;

/// The crash points, as the harness names them in `CRASH_AT`.
#[cfg(feature = "failpoints")]
pub const CRASH_POINTS: &[&str] = &[
    "order.created",
    "challenge.bypassed",
    "challenge.started",
    "challenge.settled",
    "finalize.began",
    "finalize.signed",
    "finalize.completed",
    "revocation.stored",
    "crl.number_reserved",
    "job.claimed",
    "job.ran",
    "job.settled",
    "notify.delivered",
    "relay.settled",
    "relay.abandoned",
    "relay.moved",
];

/// Arms the crash point `CRASH_AT` names: the process aborts
/// there, as a crash would end it (no destructor, no flush).
#[cfg(feature = "failpoints")]
pub fn arm_crash_point() -> Result<(), String> {
    let Ok(name) = std::env::var("CRASH_AT") else {
        return Ok(());
    };
    if !CRASH_POINTS.contains(&name.as_str()) {
        return Err(format!("CRASH_AT={name}: no such crash point"));
    }
    fail::cfg_callback(name, || std::process::abort())
}
