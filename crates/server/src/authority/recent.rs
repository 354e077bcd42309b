//! What this process has just written, kept for the request that comes
//! next so that it needs no read. On PostgreSQL each read is a round
//! trip, and a round trip costs the two processes together more CPU than
//! most of the statements it carries (docs/performance.md).
//!
//! **Orders just made valid**, with their certificates: what their client
//! asks for next (the order once more, then the certificate, §7.4 and
//! §7.4.2). Both rows are final when kept, so a copy cannot disagree with
//! the database:
//!
//! - a valid order never changes: its status has no transition out
//!   (§7.1.6, and the schema's trigger refuses one), and no statement
//!   writes anything else of an order without changing its status;
//! - a certificate's chain never changes (revocation writes its own
//!   columns, which the download does not show);
//! - neither can be deleted while the certificate has not expired (the
//!   admin deletion waits for that), so a certificate that expires
//!   within [`KEEP_FOR_MS`] (a client may ask for a `notAfter` that
//!   close) is not kept.
//!
//! Another replica, or this one after [`KEEP_FOR_MS`], reads the
//! database as before. At most [`KEEP_AT_MOST`] issuances are kept.
//!
//! **Orders just created**, for their finalize ([`Recent::take_ordered`]),
//! which then signs without reading the order. Only what never changes in
//! an order is taken from the copy (its account, profile, names, requested
//! validity, expiry); what does change (its status, its authorizations'
//! status and expiry) the write that stores the certificate checks, and
//! it stores nothing unless they allow it (`Store::complete_ready_order`).
//! A copy is taken once: a finalize that finds its order not ready after
//! all has signed for nothing once, and the next one reads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use acme_proxy_store::{CertificateRow, OrderRow};

/// How long (milliseconds) a just-valid order is answered from memory: a
/// client fetches it and its certificate within moments of the finalize.
const KEEP_FOR_MS: i64 = 10_000;

/// Issuances kept at most; the oldest go first. Enough for the clients
/// of a busy server between their finalize and their download (a miss
/// is only a read). One issuance of one name is a few kilobytes (the
/// chain, mostly); of 100 long names, up to about 80 KB (the names are in
/// the order, the certificate row and the chain): 10 MB at most.
const KEEP_AT_MOST: usize = 128;

/// How long (milliseconds) a new order's copy waits for its finalize: its
/// client validates its names in between, in seconds for http-01 and
/// tls-alpn-01; a DNS record that takes longer to spread leaves the
/// finalize to read.
const ORDERED_FOR_MS: i64 = 60_000;

/// New orders kept at most, the oldest going first: more than the
/// issuances a busy server has under way (a miss is only a read).
const ORDERED_AT_MOST: usize = 512;

/// Orders of more names than this are not kept: with one name (as most
/// are) a copy is a few hundred octets, and at most [`ORDERED_AT_MOST`]
/// of about ten kilobytes each is some 5 MB.
const ORDERED_NAMES_AT_MOST: usize = 10;

#[derive(Debug)]
struct Finished {
    kept_at_ms: i64,
    order: OrderRow,
    certificate: CertificateRow,
}

#[derive(Debug, Default)]
pub(crate) struct Recent {
    inner: Mutex<Inner>,
    ordered: Mutex<Ordered>,
}

#[derive(Debug, Default)]
struct Ordered {
    /// Each with when it was kept (Unix ms).
    by_id: HashMap<String, (i64, OrderRow)>,
    /// The ids in the order kept, for the bound (a taken one stays here
    /// until its turn to go).
    kept: VecDeque<String>,
}

#[derive(Debug, Default)]
struct Inner {
    by_order: HashMap<String, Arc<Finished>>,
    by_certificate: HashMap<String, Arc<Finished>>,
    /// In the order kept, for the bound.
    kept: VecDeque<Arc<Finished>>,
}

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps an order this process made valid at `now_ms`, with its
    /// certificate.
    pub(crate) fn keep(&self, now_ms: i64, order: OrderRow, certificate: CertificateRow) {
        if certificate.not_after.saturating_mul(1000) <= now_ms.saturating_add(KEEP_FOR_MS) {
            return;
        }
        let finished = Arc::new(Finished {
            kept_at_ms: now_ms,
            order,
            certificate,
        });
        let mut inner = self.lock();
        while inner.kept.len() >= KEEP_AT_MOST
            || inner.kept.front().is_some_and(|f| !fresh(f, now_ms))
        {
            let Some(old) = inner.kept.pop_front() else {
                break;
            };
            inner.by_order.remove(&old.order.id);
            inner.by_certificate.remove(&old.certificate.id);
        }
        inner
            .by_order
            .insert(finished.order.id.clone(), Arc::clone(&finished));
        inner
            .by_certificate
            .insert(finished.certificate.id.clone(), Arc::clone(&finished));
        inner.kept.push_back(finished);
    }

    /// The valid order `id`, if this process made it valid within
    /// [`KEEP_FOR_MS`] of `now_ms`.
    pub(crate) fn order(&self, id: &str, now_ms: i64) -> Option<OrderRow> {
        let inner = self.lock();
        let f = inner.by_order.get(id)?;
        fresh(f, now_ms).then(|| f.order.clone())
    }

    /// The certificate `id`, if this process issued it within
    /// [`KEEP_FOR_MS`] of `now_ms`.
    pub(crate) fn certificate(&self, id: &str, now_ms: i64) -> Option<CertificateRow> {
        let inner = self.lock();
        let f = inner.by_certificate.get(id)?;
        fresh(f, now_ms).then(|| f.certificate.clone())
    }
}

impl Recent {
    fn ordered(&self) -> std::sync::MutexGuard<'_, Ordered> {
        self.ordered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps an order this process created at `now_ms`, for its finalize
    /// (one of more than [`ORDERED_NAMES_AT_MOST`] names is not kept).
    pub(crate) fn keep_ordered(&self, now_ms: i64, order: OrderRow) {
        if order.identifiers.len() > ORDERED_NAMES_AT_MOST {
            return;
        }
        let mut ordered = self.ordered();
        let Ordered { by_id, kept } = &mut *ordered;
        while let Some(oldest) = kept.front() {
            let goes = kept.len() >= ORDERED_AT_MOST
                || by_id
                    .get(oldest)
                    .is_none_or(|(at, _)| !waiting(*at, now_ms));
            if !goes {
                break;
            }
            if let Some(id) = kept.pop_front() {
                by_id.remove(&id);
            }
        }
        kept.push_back(order.id.clone());
        by_id.insert(order.id.clone(), (now_ms, order));
    }

    /// The order `id` as this process created it within
    /// [`ORDERED_FOR_MS`] of `now_ms`, taken: a second call answers
    /// `None`.
    pub(crate) fn take_ordered(&self, id: &str, now_ms: i64) -> Option<OrderRow> {
        let (at, order) = self.ordered().by_id.remove(id)?;
        waiting(at, now_ms).then_some(order)
    }
}

/// Kept less than [`ORDERED_FOR_MS`] ago (a clock set back makes a copy
/// too old).
fn waiting(kept_at_ms: i64, now_ms: i64) -> bool {
    (0..ORDERED_FOR_MS).contains(&(now_ms - kept_at_ms))
}

/// Kept less than [`KEEP_FOR_MS`] ago; a clock set back makes every
/// copy too old rather than young for longer.
fn fresh(f: &Finished, now_ms: i64) -> bool {
    (0..KEEP_FOR_MS).contains(&(now_ms - f.kept_at_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use acme_proxy_protocol::types::OrderStatus;

    fn issuance(n: usize) -> (OrderRow, CertificateRow) {
        let order = OrderRow {
            id: format!("o{n}"),
            profile: "default".into(),
            account_id: "a".into(),
            status: OrderStatus::Valid,
            identifiers: Vec::new(),
            not_before: None,
            not_after: None,
            expires_at: 1,
            error: None,
            created_at: 0,
            certificate_id: Some(format!("c{n}")),
            certificate_profile: None,
            replaces: None,
            authorization_ids: Vec::new(),
        };
        let certificate = CertificateRow {
            id: format!("c{n}"),
            profile: "default".into(),
            order_id: format!("o{n}"),
            account_id: "a".into(),
            serial: format!("{n:x}"),
            chain_pem: format!("chain {n}"),
            key_thumbprint: None,
            identifiers: Vec::new(),
            not_before: 0,
            not_after: 1_000_000,
            revoked_at: None,
            revocation_reason: None,
            created_at: 0,
        };
        (order, certificate)
    }

    fn ordered(n: usize, names: usize) -> OrderRow {
        let (mut order, _) = issuance(n);
        order.status = OrderStatus::Pending;
        order.certificate_id = None;
        order.identifiers = (0..names)
            .map(|i| acme_proxy_protocol::types::Identifier {
                kind: acme_proxy_protocol::types::IdentifierType::Dns,
                value: format!("n{i}.example"),
            })
            .collect();
        order
    }

    #[test]
    fn a_new_order_is_taken_once_within_its_time_and_never_after() {
        let recent = Recent::default();
        recent.keep_ordered(1_000, ordered(1, 1));
        recent.keep_ordered(1_000, ordered(2, 1));
        recent.keep_ordered(1_000, ordered(3, 1));
        let taken = recent.take_ordered("o1", 1_000 + ORDERED_FOR_MS - 1);
        assert_eq!(taken.map(|o| o.identifiers.len()), Some(1));
        assert!(recent.take_ordered("o1", 1_000).is_none(), "taken once");
        assert!(
            recent.take_ordered("o2", 1_000 + ORDERED_FOR_MS).is_none(),
            "too old"
        );
        assert!(
            recent.take_ordered("o3", 999).is_none(),
            "the clock set back"
        );
        assert!(recent.take_ordered("c3", 1_000).is_none(), "never kept");
    }

    #[test]
    fn an_order_of_many_names_is_not_kept_and_past_the_bound_the_oldest_go() {
        let recent = Recent::default();
        recent.keep_ordered(0, ordered(0, ORDERED_NAMES_AT_MOST + 1));
        assert!(recent.take_ordered("o0", 0).is_none());
        recent.keep_ordered(0, ordered(0, ORDERED_NAMES_AT_MOST));
        assert!(recent.take_ordered("o0", 0).is_some());
        for n in 1..=ORDERED_AT_MOST + 1 {
            recent.keep_ordered(0, ordered(n, 1));
        }
        assert!(recent.take_ordered("o1", 0).is_none(), "the oldest went");
        assert!(recent.take_ordered("o2", 0).is_some());
        assert_eq!(recent.ordered().kept.len(), ORDERED_AT_MOST);
        // Kept once the others are too old: every old one goes.
        recent.keep_ordered(ORDERED_FOR_MS, ordered(9_999, 1));
        let ordered = recent.ordered();
        assert_eq!((ordered.kept.len(), ordered.by_id.len()), (1, 1));
    }

    #[test]
    fn a_kept_issuance_is_answered_by_order_and_by_certificate_until_it_is_too_old() {
        let recent = Recent::default();
        let (order, certificate) = issuance(1);
        recent.keep(1_000, order, certificate);
        assert_eq!(recent.order("o1", 1_000).map(|o| o.id), Some("o1".into()));
        assert_eq!(
            recent
                .certificate("c1", 1_000 + KEEP_FOR_MS - 1)
                .map(|c| c.chain_pem),
            Some("chain 1".into())
        );
        assert!(recent.order("o2", 1_000).is_none(), "never kept");
        assert!(recent.certificate("o1", 1_000).is_none(), "an order id");
        assert!(recent.order("o1", 1_000 + KEEP_FOR_MS).is_none(), "too old");
        assert!(recent.certificate("c1", 1_000 + KEEP_FOR_MS).is_none());
        assert!(recent.order("o1", 999).is_none(), "the clock set back");
    }

    #[test]
    fn a_certificate_that_expires_within_the_keeping_time_is_not_kept() {
        let recent = Recent::default();
        let (order, mut certificate) = issuance(1);
        certificate.not_after = (1_000 + KEEP_FOR_MS) / 1000;
        recent.keep(1_000, order.clone(), certificate.clone());
        assert!(recent.order("o1", 1_000).is_none());
        certificate.not_after += 1;
        recent.keep(1_000, order, certificate);
        assert!(recent.order("o1", 1_000).is_some());
    }

    #[test]
    fn past_the_bound_the_oldest_issuances_go_and_old_ones_go_when_another_is_kept() {
        let recent = Recent::default();
        for n in 0..KEEP_AT_MOST + 2 {
            let (order, certificate) = issuance(n);
            recent.keep(0, order, certificate);
        }
        assert!(recent.order("o0", 0).is_none());
        assert!(recent.certificate("c1", 0).is_none());
        assert!(recent.order("o2", 0).is_some());
        assert_eq!(recent.lock().kept.len(), KEEP_AT_MOST);
        // Kept once they are too old: every old one goes.
        let (order, certificate) = issuance(9_999);
        recent.keep(KEEP_FOR_MS, order, certificate);
        let inner = recent.lock();
        assert_eq!(
            (
                inner.kept.len(),
                inner.by_order.len(),
                inner.by_certificate.len()
            ),
            (1, 1, 1)
        );
    }
}
