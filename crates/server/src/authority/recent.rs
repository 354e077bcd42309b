//! Orders this process has just made valid, with their certificates: what
//! their client asks for next (the order once more, then the certificate,
//! §7.4 and §7.4.2), answered without a read. On PostgreSQL each read is a
//! round trip, and a round trip costs the two processes together more
//! CPU than most of the statements it carries (docs/performance.md).
//!
//! Both rows are final when kept here, so a copy cannot disagree with the
//! database:
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

#[derive(Debug)]
struct Finished {
    kept_at_ms: i64,
    order: OrderRow,
    certificate: CertificateRow,
}

#[derive(Debug, Default)]
pub(crate) struct Recent {
    inner: Mutex<Inner>,
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
