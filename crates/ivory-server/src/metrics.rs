//! Prometheus metrics (OpenMetrics text on `/metrics`).
//!
//! Families (all prefixed `ivory_`):
//! * `admission_duration_seconds{route, outcome}` histogram; route is `ivpol_mutate`,
//!   `ivpol_validate`, `nivpol_mutate` or `nivpol_validate`; outcome is `allowed`, `patched`,
//!   `denied`, `unknown_policy` or `bad_request`.
//! * `admission_in_flight` gauge.
//! * `deadline_expiries_total{route}`: requests whose budget ran out before the engine finished.
//! * `policy_load_errors` gauge (errors of the latest load) and `policy_load_failures_total`,
//!   `policies_loaded` gauge.
//! * `registry_requests_total{registry}`, `registry_errors_total{registry}`,
//!   `registry_throttled_total{registry}`: read from the registry client's counters at scrape
//!   time (the client does not record HTTP status codes, so errors are not split by status).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ivory_registry::RegistryStats;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Where registry counters come from (the verifier's registry client).
pub type RegistryStatsSource = Arc<dyn Fn() -> Vec<RegistryStats> + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    route: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryLabels {
    registry: String,
}

/// The server's metric families.
pub struct Metrics {
    registry: Registry,
    admission: Family<AdmissionLabels, Histogram>,
    in_flight: Gauge,
    deadline_expiries: Family<RouteLabels, Counter>,
    policy_load_errors: Gauge,
    policy_load_failures: Counter,
    policies_loaded: Gauge,
    registry_requests: Family<RegistryLabels, Counter>,
    registry_errors: Family<RegistryLabels, Counter>,
    registry_throttled: Family<RegistryLabels, Counter>,
    registry_source: Option<RegistryStatsSource>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All families registered, no registry counters.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ivory");
        let admission: Family<AdmissionLabels, Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16)));
        let m = Self {
            admission,
            in_flight: Gauge::default(),
            deadline_expiries: Family::default(),
            policy_load_errors: Gauge::default(),
            policy_load_failures: Counter::default(),
            policies_loaded: Gauge::default(),
            registry_requests: Family::default(),
            registry_errors: Family::default(),
            registry_throttled: Family::default(),
            registry_source: None,
            registry: Registry::default(),
        };
        registry.register(
            "admission_duration_seconds",
            "Admission request latency by route and outcome",
            m.admission.clone(),
        );
        registry.register(
            "admission_in_flight",
            "Admission requests being processed",
            m.in_flight.clone(),
        );
        registry.register(
            "deadline_expiries",
            "Admission requests whose time budget ran out",
            m.deadline_expiries.clone(),
        );
        registry.register(
            "policy_load_errors",
            "Errors of the latest policy load (0 when clean)",
            m.policy_load_errors.clone(),
        );
        registry.register(
            "policy_load_failures",
            "Policy loads that kept the previous set because of errors",
            m.policy_load_failures.clone(),
        );
        registry.register(
            "policies_loaded",
            "Policies in the active set",
            m.policies_loaded.clone(),
        );
        registry.register(
            "registry_requests",
            "Registry calls by registry host",
            m.registry_requests.clone(),
        );
        registry.register(
            "registry_errors",
            "Registry calls that failed, by registry host",
            m.registry_errors.clone(),
        );
        registry.register(
            "registry_throttled",
            "Registry calls answered 429/503, by registry host",
            m.registry_throttled.clone(),
        );
        Self { registry, ..m }
    }

    /// Adds the registry client's counters to every scrape.
    pub fn with_registry_stats(mut self, source: RegistryStatsSource) -> Self {
        self.registry_source = Some(source);
        self
    }

    /// Records one finished admission request.
    pub fn observe_admission(&self, route: &str, outcome: &str, elapsed: Duration) {
        self.admission
            .get_or_create(&AdmissionLabels {
                route: route.to_owned(),
                outcome: outcome.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Records a request whose budget expired.
    pub fn deadline_expired(&self, route: &str) {
        self.deadline_expiries
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .inc();
    }

    /// Counts a request in flight until the guard drops.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        self.in_flight.inc();
        InFlight(self.clone())
    }

    /// A clean load of `count` policies.
    pub fn policies_loaded(&self, count: usize) {
        self.policies_loaded
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        self.policy_load_errors.set(0);
    }

    /// A load with `errors` errors (the previous set stays).
    pub fn policy_load_failed(&self, errors: usize) {
        self.policy_load_errors
            .set(i64::try_from(errors).unwrap_or(i64::MAX));
        self.policy_load_failures.inc();
    }

    /// OpenMetrics text of every family.
    pub fn encode(&self) -> String {
        if let Some(source) = &self.registry_source {
            for s in source() {
                let labels = RegistryLabels {
                    registry: s.registry.clone(),
                };
                // The client's counters are monotonic: mirror them rather than add deltas.
                let set = |family: &Family<RegistryLabels, Counter>, v: u64| {
                    family
                        .get_or_create(&labels)
                        .inner()
                        .store(v, Ordering::Relaxed);
                };
                set(&self.registry_requests, s.requests);
                set(&self.registry_errors, s.errors);
                set(&self.registry_throttled, s.throttled);
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Decrements the in-flight gauge on drop (also when the request future is cancelled).
pub struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}
