//! http01 publication: key authorizations served verbatim at
//! `/.well-known/acme-challenge/{token}` on our root router (RFC 8555
//! §8.3), for the upstream CA to fetch.
//!
//! A publication is a guard: dropping it retracts the token, so retraction
//! happens on every exit path of an attempt, cancellation included. The
//! attempt keeps its guards until each upstream authorization is terminal,
//! because a multi-perspective CA fetches several times.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Tokens currently published, shared by every relay profile (tokens are
/// the upstream's random values, unique across orders).
#[derive(Debug, Default)]
pub struct ChallengeBoard {
    tokens: Mutex<HashMap<String, String>>,
}

impl ChallengeBoard {
    /// Publishes `key_authorization` under `token` until the guard drops.
    pub fn publish(self: &Arc<Self>, token: &str, key_authorization: &str) -> Published {
        if let Ok(mut t) = self.tokens.lock() {
            t.insert(token.to_owned(), key_authorization.to_owned());
        }
        Published {
            board: Arc::clone(self),
            token: token.to_owned(),
        }
    }

    /// The key authorization published under `token`, if any.
    pub fn get(&self, token: &str) -> Option<String> {
        self.tokens.lock().ok()?.get(token).cloned()
    }
}

/// A published token; retracted when dropped.
#[derive(Debug)]
pub struct Published {
    board: Arc<ChallengeBoard>,
    token: String,
}

impl Drop for Published {
    fn drop(&mut self) {
        if let Ok(mut t) = self.board.tokens.lock() {
            t.remove(&self.token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_served_while_its_guard_lives_and_retracted_when_it_drops() {
        let board = Arc::new(ChallengeBoard::default());
        let guard = board.publish("tok", "tok.thumb");
        assert_eq!(board.get("tok").as_deref(), Some("tok.thumb"));
        assert_eq!(board.get("other"), None);
        drop(guard);
        assert_eq!(board.get("tok"), None);
    }
}
