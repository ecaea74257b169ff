//! The trusted root's freshness per source: `trust_root_age_seconds{source}` (since the root in
//! force was read or verified from its source; absent for the root built into ivory),
//! `trust_root_last_refresh_success_timestamp_seconds{source}` and
//! `trust_root_refreshes_total{source,result}` (`ok`, `failed`), read at scrape time.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// One trust source's freshness, as the binary reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustRootCount {
    /// The source (`embedded`, `file /path`, `TUF https://…`).
    pub source: String,
    /// Seconds since the root in force was read or verified; `None` for the embedded root.
    pub age_seconds: Option<i64>,
    /// When a refresh last succeeded (Unix seconds).
    pub last_success_unix: Option<i64>,
    /// Refreshes that brought a root (monotonic).
    pub succeeded: u64,
    /// Refreshes that failed, the root in force kept (monotonic).
    pub failed: u64,
    /// Why the last refresh failed, when it did.
    pub last_error: Option<String>,
}

impl TrustRootCount {
    /// One line for `/readyz` (and so `ivory doctor`): the source, the root's age and how its
    /// refreshes went.
    pub fn describe(&self) -> String {
        let age = match self.age_seconds {
            Some(s) => format!("read {s}s ago"),
            None => "the root built into ivory".to_owned(),
        };
        let mut line = format!(
            "trusted root: {} ({age}; refreshes: {} ok, {} failed)",
            self.source, self.succeeded, self.failed
        );
        if let Some(e) = &self.last_error {
            line.push_str(&format!(
                "; last refresh failed, the root in force is kept: {e}"
            ));
        }
        line
    }
}

/// Where the trust sources' counts come from.
pub type TrustRootStatsSource = Arc<dyn Fn() -> Vec<TrustRootCount> + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefreshLabels {
    source: String,
    result: String,
}

/// The families, and the source they are read from.
#[derive(Default)]
pub(super) struct TrustRootMetrics {
    age: Family<SourceLabels, Gauge>,
    last_success: Family<SourceLabels, Gauge>,
    refreshes: Family<RefreshLabels, Counter>,
    pub(super) source: Option<TrustRootStatsSource>,
}

impl TrustRootMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "trust_root_age_seconds",
            "Seconds since the trusted root in force was read or verified from its source",
            self.age.clone(),
        );
        registry.register(
            "trust_root_last_refresh_success_timestamp_seconds",
            "When a refresh of the trusted root last succeeded (Unix seconds)",
            self.last_success.clone(),
        );
        registry.register(
            "trust_root_refreshes",
            "Background refreshes of the trusted root by source and result (ok, failed: the root in force kept)",
            self.refreshes.clone(),
        );
    }

    /// Reads the source into the families (before a scrape is encoded).
    pub(super) fn update(&self) {
        let Some(source) = &self.source else {
            return;
        };
        for count in source() {
            let labels = SourceLabels {
                source: count.source.clone(),
            };
            match count.age_seconds {
                Some(age) => {
                    self.age.get_or_create(&labels).set(age);
                }
                None => {
                    self.age.remove(&labels);
                }
            }
            if let Some(at) = count.last_success_unix {
                self.last_success.get_or_create(&labels).set(at);
            }
            for (result, n) in [("ok", count.succeeded), ("failed", count.failed)] {
                let labels = RefreshLabels {
                    source: count.source.clone(),
                    result: result.to_owned(),
                };
                self.refreshes
                    .get_or_create(&labels)
                    .inner()
                    .store(n, Ordering::Relaxed);
            }
        }
    }
}
