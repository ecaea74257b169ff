//! Per-registry counters for metrics and benchmarks.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Snapshot of one registry host's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Registry host (`host[:port]`).
    pub registry: String,
    /// Calls made: one per operation attempt plus one per auth probe. (Requests inside a
    /// call, such as the GET after a HEAD without digest or a token fetch, are not counted.)
    pub requests: u64,
    /// Calls by answer class: `2xx`, `4xx`, `5xx`, or `none` (no HTTP answer: connection
    /// failure or deadline). An answer whose content was refused (too large, bad digest)
    /// counts as `2xx`; an auth probe's challenge (401) as `4xx`. Sums to `requests` once
    /// every call has finished.
    pub statuses: BTreeMap<String, u64>,
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

/// Answer class of one call, for [`RegistryStats::statuses`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatusClass {
    Success,
    Client,
    Server,
    NoAnswer,
}

impl StatusClass {
    const ALL: [StatusClass; 4] = [
        StatusClass::Success,
        StatusClass::Client,
        StatusClass::Server,
        StatusClass::NoAnswer,
    ];

    /// The class of an HTTP status code.
    pub(crate) fn of_code(code: u16) -> Self {
        match code {
            200..=399 => StatusClass::Success,
            500..=599 => StatusClass::Server,
            _ => StatusClass::Client,
        }
    }

    fn label(self) -> &'static str {
        match self {
            StatusClass::Success => "2xx",
            StatusClass::Client => "4xx",
            StatusClass::Server => "5xx",
            StatusClass::NoAnswer => "none",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    statuses: [AtomicU64; 4],
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
    pub(crate) fn status(&self, class: StatusClass) {
        self.statuses[class.index()].fetch_add(1, Ordering::Relaxed);
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

/// Registry hosts counted under their own name; calls to any later host count under
/// [`OTHER_HOSTS`]. Hosts come from the images requests name, so without this bound every
/// Pod naming a new registry would add counters (and metric series) that are never released.
/// The first hosts keep their slots for the process's life, so every series stays monotonic.
pub const MAX_NAMED_HOSTS: usize = 100;

/// The `registry` of the counters shared by the hosts past [`MAX_NAMED_HOSTS`] (no registry
/// host parses as this: a host has a dot, a port or is `localhost`).
pub const OTHER_HOSTS: &str = "other";

/// Counters per registry host: at most [`MAX_NAMED_HOSTS`] of them, then one shared bucket.
#[derive(Default)]
pub(crate) struct StatsTable {
    hosts: Mutex<HashMap<String, Arc<Counters>>>,
    other: Arc<Counters>,
}

impl StatsTable {
    pub(crate) fn for_host(&self, host: &str) -> Arc<Counters> {
        // A poisoned lock only means another thread panicked mid-insert; the map is still usable.
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(counters) = hosts.get(host) {
            return counters.clone();
        }
        if hosts.len() >= MAX_NAMED_HOSTS {
            return self.other.clone();
        }
        hosts.entry(host.to_string()).or_default().clone()
    }

    pub(crate) fn snapshot(&self) -> Vec<RegistryStats> {
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        let other =
            (self.other.requests.load(Ordering::Relaxed) > 0).then_some((OTHER_HOSTS, &self.other));
        let mut out: Vec<RegistryStats> = hosts
            .iter()
            .map(|(host, c)| (host.as_str(), c))
            .chain(other)
            .map(|(host, c)| RegistryStats {
                registry: host.to_string(),
                requests: c.requests.load(Ordering::Relaxed),
                statuses: StatusClass::ALL
                    .iter()
                    .map(|class| {
                        let n = c.statuses[class.index()].load(Ordering::Relaxed);
                        (class.label().to_string(), n)
                    })
                    .filter(|(_, n)| *n > 0)
                    .collect(),
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
        a.status(StatusClass::Success);
        a.status(StatusClass::of_code(404));
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
        let statuses: Vec<_> = snap[0]
            .statuses
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(statuses, [("2xx", 1), ("4xx", 1)]);
        assert_eq!(StatusClass::of_code(503), StatusClass::Server);
    }

    #[test]
    fn hosts_past_the_bound_share_one_bucket() {
        let t = StatsTable::default();
        for i in 0..MAX_NAMED_HOSTS + 500 {
            t.for_host(&format!("r{i}.example:5000")).request();
        }
        // A named host keeps its own counters after the bound is reached.
        t.for_host("r0.example:5000").request();
        let snap = t.snapshot();
        assert_eq!(snap.len(), MAX_NAMED_HOSTS + 1);
        let other = snap.iter().find(|s| s.registry == OTHER_HOSTS).unwrap();
        assert_eq!(other.requests, 500);
        let first = snap
            .iter()
            .find(|s| s.registry == "r0.example:5000")
            .unwrap();
        assert_eq!(first.requests, 2);
        assert!(t.hosts.lock().unwrap().len() <= MAX_NAMED_HOSTS);
    }
}
