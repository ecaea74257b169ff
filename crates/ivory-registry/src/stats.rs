//! Per-registry counters for metrics and benchmarks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Snapshot of one registry host's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Registry host (`host[:port]`).
    pub registry: String,
    /// Calls made (one per oci-client call; auth pings are not seen separately).
    pub requests: u64,
    /// Calls that ended in an error (including deadline and throttling).
    pub errors: u64,
    /// Calls answered 429 (or 503) and retried or given up on.
    pub throttled: u64,
    /// Manifest and blob bytes received.
    pub bytes: u64,
    /// Sum of call latencies.
    pub latency_sum: Duration,
    /// Number of latencies summed.
    pub latency_count: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    errors: AtomicU64,
    throttled: AtomicU64,
    bytes: AtomicU64,
    latency_micros: AtomicU64,
    latency_count: AtomicU64,
}

impl Counters {
    pub(crate) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn throttled(&self) {
        self.throttled.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn bytes(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn latency(&self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.latency_micros.fetch_add(micros, Ordering::Relaxed);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counters per registry host.
#[derive(Default)]
pub(crate) struct StatsTable {
    hosts: Mutex<HashMap<String, Arc<Counters>>>,
}

impl StatsTable {
    pub(crate) fn for_host(&self, host: &str) -> Arc<Counters> {
        // A poisoned lock only means another thread panicked mid-insert; the map is still usable.
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        hosts.entry(host.to_string()).or_default().clone()
    }

    pub(crate) fn snapshot(&self) -> Vec<RegistryStats> {
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<RegistryStats> = hosts
            .iter()
            .map(|(host, c)| RegistryStats {
                registry: host.clone(),
                requests: c.requests.load(Ordering::Relaxed),
                errors: c.errors.load(Ordering::Relaxed),
                throttled: c.throttled.load(Ordering::Relaxed),
                bytes: c.bytes.load(Ordering::Relaxed),
                latency_sum: Duration::from_micros(c.latency_micros.load(Ordering::Relaxed)),
                latency_count: c.latency_count.load(Ordering::Relaxed),
            })
            .collect();
        out.sort_by(|a, b| a.registry.cmp(&b.registry));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_accumulate_per_host() {
        let t = StatsTable::default();
        let a = t.for_host("a:1");
        a.request();
        a.request();
        a.error();
        a.throttled();
        a.bytes(10);
        a.latency(Duration::from_millis(3));
        t.for_host("b").request();
        let snap = t.snapshot();
        assert_eq!(snap.len(), 2);
        assert_eq!(snap[0].registry, "a:1");
        assert_eq!(
            (
                snap[0].requests,
                snap[0].errors,
                snap[0].throttled,
                snap[0].bytes
            ),
            (2, 1, 1, 10)
        );
        assert_eq!(snap[0].latency_sum, Duration::from_millis(3));
        assert_eq!(snap[1].requests, 1);
    }
}
