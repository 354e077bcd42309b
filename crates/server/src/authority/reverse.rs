//! Best-effort reverse names for audit rows: a
//! PTR lookup bounded in time and cached per address, so a slow or absent
//! DNS server costs one bounded wait per address per cache period and never
//! fails or holds up a request for longer than the bound.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::proto::rr::RData;

/// How long an answer (or the lack of one) is reused.
const CACHE_FOR: Duration = Duration::from_secs(600);
/// Addresses remembered at most; the cache starts over beyond this.
const CACHE_MAX: usize = 4096;

pub struct ReverseNames {
    resolver: Option<Arc<TokioResolver>>,
    timeout: Duration,
    cache: Mutex<HashMap<IpAddr, (Option<String>, Instant)>>,
}

impl std::fmt::Debug for ReverseNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReverseNames")
            .field("enabled", &self.resolver.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl ReverseNames {
    /// `resolver` None: lookups are off.
    pub fn new(resolver: Option<Arc<TokioResolver>>, timeout: Duration) -> Self {
        Self {
            resolver,
            timeout,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The address's PTR name (without the trailing dot), or None when
    /// there is none, lookups are off, or no answer came within the bound.
    pub async fn lookup(&self, ip: IpAddr) -> Option<String> {
        let resolver = self.resolver.as_ref()?;
        if let Some((name, at)) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip)
            && at.elapsed() < CACHE_FOR
        {
            return name.clone();
        }
        let name = match tokio::time::timeout(self.timeout, resolver.reverse_lookup(ip)).await {
            Ok(Ok(lookup)) => lookup.answers().iter().find_map(|r| match &r.data {
                RData::PTR(ptr) => Some(ptr.0.to_utf8().trim_end_matches('.').to_owned()),
                _ => None,
            }),
            _ => None,
        };
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(ip, (name.clone(), Instant::now()));
        name
    }
}
