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

/// Tokens currently published, shared by every relay profile. One token
/// may be held by several attempts at once (an upstream that hands the same
/// pending authorization to two of our orders): it is retracted when the
/// last holder lets go.
#[derive(Debug, Default)]
pub struct ChallengeBoard {
    tokens: Mutex<HashMap<String, (String, usize)>>,
}

impl ChallengeBoard {
    /// Publishes `key_authorization` under `token` until the guard drops.
    pub fn publish(self: &Arc<Self>, token: &str, key_authorization: &str) -> Published {
        if let Ok(mut t) = self.tokens.lock() {
            let entry = t
                .entry(token.to_owned())
                .or_insert_with(|| (key_authorization.to_owned(), 0));
            entry.1 += 1;
        }
        Published {
            board: Arc::clone(self),
            token: token.to_owned(),
        }
    }

    /// The key authorization published under `token`, if any.
    pub fn get(&self, token: &str) -> Option<String> {
        self.tokens.lock().ok()?.get(token).map(|(k, _)| k.clone())
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
        if let Ok(mut t) = self.board.tokens.lock()
            && let Some(entry) = t.get_mut(&self.token)
        {
            entry.1 -= 1;
            if entry.1 == 0 {
                t.remove(&self.token);
            }
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

    #[test]
    fn a_token_held_twice_stays_until_the_last_holder_lets_go() {
        let board = Arc::new(ChallengeBoard::default());
        let first = board.publish("tok", "tok.thumb");
        let second = board.publish("tok", "tok.thumb");
        drop(first);
        assert_eq!(board.get("tok").as_deref(), Some("tok.thumb"));
        drop(second);
        assert_eq!(board.get("tok"), None);
    }
}
