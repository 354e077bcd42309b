//! Configuration generations. A reload (SIGHUP) builds a whole new
//! generation — profiles and their signers, validators, notification
//! targets, the routes — from the new file, and swaps it in at once. A
//! request takes the generation current when it starts and finishes on it;
//! a job attempt likewise. What must outlive a reload (the store, the job
//! queue, nonces, account copies, metrics) is shared by every generation
//! (`authority::Lasting`).

use std::sync::Arc;

use axum::Router;
use tokio::sync::watch;

use crate::authority::Authority;
use crate::config::Config;

/// One configuration, built.
pub struct Generation {
    /// 1 for the configuration the server started with, then one more per
    /// reload.
    pub number: u64,
    pub config: Arc<Config>,
    pub authority: Arc<Authority>,
    /// The ACME routes over this generation's authority.
    pub router: Router,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("number", &self.number)
            .finish_non_exhaustive()
    }
}

/// The current generation, for whoever starts work (the listener for each
/// request, the job runner's handlers for each attempt).
#[derive(Clone, Debug)]
pub struct Generations(Arc<watch::Sender<Arc<Generation>>>);

impl Generations {
    pub fn new(first: Generation) -> Self {
        Self(Arc::new(watch::Sender::new(Arc::new(first))))
    }

    pub fn current(&self) -> Arc<Generation> {
        Arc::clone(&self.0.borrow())
    }

    /// The current generation's authority.
    pub fn authority(&self) -> Arc<Authority> {
        Arc::clone(&self.0.borrow().authority)
    }

    /// The current generation's routes (an `Arc` clone).
    pub fn router(&self) -> Router {
        self.0.borrow().router.clone()
    }

    /// Makes `next` current; work already started keeps its own.
    pub(crate) fn replace(&self, next: Generation) {
        self.0.send_replace(Arc::new(next));
    }
}
