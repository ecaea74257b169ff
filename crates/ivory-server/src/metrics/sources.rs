//! What the metric families read at scrape time: the counters other parts of ivory keep, as
//! the binary hands them over.

use std::sync::Arc;

use ivory_registry::RegistryStats;

/// How many client connections the webhook port holds now (its acceptor's slots in use).
pub type OpenConnectionsSource = Arc<dyn Fn() -> usize + Send + Sync>;

/// Where registry counters come from (the verifier's registry client).
pub type RegistryStatsSource = Arc<dyn Fn() -> Vec<RegistryStats> + Send + Sync>;

/// One verifier cache's counters (monotonic), as the binary reads them from the verifier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Cache name, the `cache` label.
    pub cache: String,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Of `hits`, cached negative verdicts.
    pub negative_hits: u64,
    /// Lookups that loaded the value themselves.
    pub misses: u64,
    /// Lookups that waited for another request's load of the same key.
    pub coalesced: u64,
}

/// Where verifier cache counters come from.
pub type CacheStatsSource = Arc<dyn Fn() -> Vec<CacheCounts> + Send + Sync>;

/// The shared L2 cache's counters (monotonic), as the binary reads them from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct L2Counts {
    /// `(event, count)`: the `event` label of `l2_events_total`.
    pub events: Vec<(&'static str, u64)>,
    /// Calls made to the store.
    pub calls: u64,
    /// Their total time in microseconds.
    pub call_micros: u64,
}

/// One CRL the verifier holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrlCount {
    /// The distribution point it was fetched from (the `url` label).
    pub url: String,
    /// Seconds since it was fetched.
    pub age_seconds: i64,
    /// Seconds until its `nextUpdate` (negative once passed; `None`: it has none).
    pub next_update_in_seconds: Option<i64>,
}

/// The verifier's background revocation data, as the binary reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevocationCounts {
    /// The CRLs held.
    pub crls: Vec<CrlCount>,
    /// Fetches that brought a CRL (monotonic).
    pub fetched: u64,
    /// Fetches that failed (monotonic).
    pub failed: u64,
}

/// Where the revocation data counts come from.
pub type RevocationStatsSource = Arc<dyn Fn() -> RevocationCounts + Send + Sync>;
