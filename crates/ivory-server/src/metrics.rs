//! Prometheus metrics (OpenMetrics text on `/metrics`).
//!
//! Families (all prefixed `ivory_`):
//! * `admission_duration_seconds{route, outcome}` histogram; route is `ivpol_mutate`,
//!   `ivpol_validate`, `nivpol_mutate` or `nivpol_validate`; outcome is `allowed`, `patched`,
//!   `warned` (allowed with warnings), `denied` (a policy failed on the image's merits),
//!   `failed_closed` (denied only because policies could not be judged), `failed_open` (allowed
//!   although a policy could not be judged), `unknown_policy`, `bad_request`, `not_ready` or
//!   `internal_error` (a panic before any policy was selected).
//! * `admission_in_flight` gauge.
//! * `deadline_expiries_total{route}`: requests whose budget ran out before the engine finished.
//! * `admission_panics_total{route}`: requests whose handling panicked (answered by the
//!   selected policies' failurePolicy, or 500 before any policy was selected).
//! * `policy_load_errors` gauge (errors of the latest load) and `policy_load_failures_total`,
//!   `policies_loaded` gauge.
//! * `registry_requests_total{registry, status}` (status class `2xx`, `4xx`, `5xx`, or `none`
//!   when no HTTP answer came), `registry_errors_total{registry}`,
//!   `registry_throttled_total{registry}`: read from the registry client's counters at scrape
//!   time. Registry hosts are chosen by the images requests name, so the client keeps its own
//!   counters for the first `ivory_registry::MAX_NAMED_HOSTS` hosts it calls and counts every
//!   later one under `registry="other"`: the series stay bounded and monotonic.
//! * `policy_results_total{policy_name, policy_namespace, rule_result, rule_execution_cause}`:
//!   one per policy result (Kyverno's `kyverno_policy_results_total`); `rule_result` is `pass`,
//!   `fail`, `error` or `skip`, the cause `admission_request` or `background_scan`.
//!   `admission_duration_seconds` is the counterpart of `kyverno_admission_review_duration_seconds`.
//! * `reports_written_total`, `reports_dropped_total{reason}`: PolicyReport writes with
//!   `--kube` (dropped when the queue is full or the API refused them).
//! * `verify_cache_hits_total{cache}`, `verify_cache_negative_hits_total{cache}`,
//!   `verify_cache_misses_total{cache}`, `verify_cache_coalesced_total{cache}`: the verifier's
//!   `tags` and `results` caches (coalesced = waited for another request's identical load),
//!   read at scrape time.
//! * `l2_events_total{event}` (`hits`, `misses`, `errors`, `skipped`, `rejected`,
//!   `leases_won`, `leases_waited`, `waits_answered`), `l2_calls_total` and
//!   `l2_call_seconds_total` (their sum: the mean L2 latency; `l2_call_microseconds_total`, in
//!   microseconds, stays one release for dashboards that read it): the cache shared by the
//!   replicas (`--cache-redis`), read at scrape time. `rejected` counts entries that did not
//!   verify (HMAC, name, size or format).
//! * `revocation_crl_age_seconds{url}`, `revocation_crl_next_update_seconds{url}` gauges (the
//!   age of each CRL the verifier holds for Notation chains, the 100 oldest, and the time left to its
//!   `nextUpdate`, negative once passed: data past it no longer counts), and
//!   `revocation_fetches_total{result}` (`ok`, `failed`): the background revocation data, read
//!   at scrape time.
//! * `trust_root_age_seconds{source}`, `trust_root_last_refresh_success_timestamp_seconds{source}`
//!   gauges and `trust_root_refreshes_total{source,result}`: the trusted root's freshness
//!   (`metrics/trust_root.rs`).
//! * `resource_watch_objects{resource}`, `_bytes`, `_synced`, `_emptied_by_total_budget` gauges:
//!   what each watch of the policies' cluster reads holds; `_emptied_by_total_budget` is 1 for a
//!   watch emptied because all watches together reached `--resource-watch-max-total-bytes`
//!   (`_over_total_bytes`, the same flag under a name that said bytes, stays one release).
//! * `http_connections_open` gauge: client connections the webhook port holds (read at scrape).
//! * Unprefixed, as every Prometheus client writes them (`metrics/process.rs`):
//!   `process_resident_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds`,
//!   `process_max_fds`, `process_start_time_seconds`.
//! * `tls_certificate_expiry_timestamp_seconds{file}` gauge: the serving certificate's
//!   `notAfter`, set when it is loaded and reloaded (no series without TLS).
//! * `log_lines_dropped_total`: `ivory serve` writes its log from a thread of its own, so an
//!   admission never waits for a slow log consumer; lines that do not fit its buffer are dropped
//!   and counted here.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ivory_engine::decision::Status;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

mod families;
mod process;
mod series;
mod sources;
mod trust_root;
pub use sources::{
    CacheCounts, CacheStatsSource, CrlCount, L2Counts, OpenConnectionsSource, RegistryStatsSource,
    RevocationCounts, RevocationStatsSource,
};
pub use trust_root::{TrustRootCount, TrustRootStatsSource};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UrlLabels {
    url: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// Where the L2 counters come from.
pub type L2StatsSource = Arc<dyn Fn() -> L2Counts + Send + Sync>;

/// How many log lines were dropped because the log consumer fell behind (monotonic).
pub type LogDropsSource = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Called with `true` when an admission starts while none ran, and with `false` when the last
/// one in flight ends: the serve log batches its lines while admissions run and writes them when
/// none does.
pub type ActivityHook = Arc<dyn Fn(bool) + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct L2Labels {
    event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    route: String,
    outcome: String,
}

impl series::StrLabels<2> for AdmissionLabels {
    fn of([route, outcome]: [&str; 2]) -> Self {
        Self {
            route: route.to_owned(),
            outcome: outcome.to_owned(),
        }
    }

    fn is(&self, [route, outcome]: &[&str; 2]) -> bool {
        self.route == *route && self.outcome == *outcome
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    file: String,
}

/// The `route` label's values: the webhook's four routes.
const ROUTES: [&str; 4] = [
    "ivpol_mutate",
    "ivpol_validate",
    "nivpol_mutate",
    "nivpol_validate",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryLabels {
    registry: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryStatusLabels {
    registry: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyResultLabels {
    policy_name: String,
    policy_namespace: String,
    rule_result: String,
    rule_execution_cause: String,
}

impl series::StrLabels<4> for PolicyResultLabels {
    fn of(
        [
            policy_name,
            policy_namespace,
            rule_result,
            rule_execution_cause,
        ]: [&str; 4],
    ) -> Self {
        Self {
            policy_name: policy_name.to_owned(),
            policy_namespace: policy_namespace.to_owned(),
            rule_result: rule_result.to_owned(),
            rule_execution_cause: rule_execution_cause.to_owned(),
        }
    }

    fn is(&self, [policy, namespace, result, cause]: &[&str; 4]) -> bool {
        self.policy_name == *policy
            && self.policy_namespace == *namespace
            && self.rule_result == *result
            && self.rule_execution_cause == *cause
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    resource: String,
}

/// What the watches of the policies' cluster reads hold, read when the metrics are served.
pub type ResourceWatchStatsSource = Arc<dyn Fn() -> Vec<WatchStats> + Send + Sync>;

/// What one watch holds, for metrics and `ivory doctor`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchStats {
    /// The watched kind and namespace.
    pub resource: String,
    /// Objects held.
    pub objects: usize,
    /// Their bytes.
    pub bytes: usize,
    /// Whether the first list completed (and the watch is within its bounds).
    pub synced: bool,
    /// Emptied because all watches together reached the process-wide bound of bytes.
    pub over_total: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    cache: String,
}

/// The server's metric families.
pub struct Metrics {
    registry: Registry,
    admission: Family<AdmissionLabels, Histogram>,
    admission_series: series::Series<AdmissionLabels, Histogram>,
    in_flight: Gauge,
    deadline_expiries: Family<RouteLabels, Counter>,
    panics: Family<RouteLabels, Counter>,
    policy_load_errors: Gauge,
    certificate_expiry: Family<CertificateLabels, Gauge>,
    policy_load_failures: Counter,
    policies_loaded: Gauge,
    registry_requests: Family<RegistryStatusLabels, Counter>,
    registry_errors: Family<RegistryLabels, Counter>,
    registry_throttled: Family<RegistryLabels, Counter>,
    registry_source: Option<RegistryStatsSource>,
    cache_hits: Family<CacheLabels, Counter>,
    cache_negative_hits: Family<CacheLabels, Counter>,
    cache_misses: Family<CacheLabels, Counter>,
    cache_coalesced: Family<CacheLabels, Counter>,
    cache_source: Option<CacheStatsSource>,
    policy_results: Family<PolicyResultLabels, Counter>,
    policy_result_series: series::Series<PolicyResultLabels, Counter>,
    reports_written: Counter,
    reports_dropped: Family<ReasonLabels, Counter>,
    connections_refused: Family<ReasonLabels, Counter>,
    requests_refused: Family<ReasonLabels, Counter>,
    l2_events: Family<L2Labels, Counter>,
    l2_calls: Counter,
    l2_call_micros: Counter,
    l2_call_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    l2_source: Option<L2StatsSource>,
    log_lines_dropped: Counter,
    log_drops_source: Option<LogDropsSource>,
    activity_hook: Option<ActivityHook>,
    watch_objects: Family<WatchLabels, Gauge>,
    watch_bytes: Family<WatchLabels, Gauge>,
    watch_synced: Family<WatchLabels, Gauge>,
    watch_over_total: Family<WatchLabels, Gauge>,
    watch_emptied: Family<WatchLabels, Gauge>,
    watch_source: std::sync::OnceLock<ResourceWatchStatsSource>,
    connections_open: Gauge,
    connections_source: std::sync::OnceLock<OpenConnectionsSource>,
    crl_age: Family<UrlLabels, Gauge>,
    crl_next_update: Family<UrlLabels, Gauge>,
    revocation_fetches: Family<ResultLabels, Counter>,
    revocation_source: Option<RevocationStatsSource>,
    trust_root: trust_root::TrustRootMetrics,
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
        let m = Self::unregistered();
        // Counted per route from zero, so that rates and the alerts' ratios read 0 instead of
        // nothing before the first expiry or panic.
        for route in ROUTES {
            let labels = RouteLabels {
                route: route.to_owned(),
            };
            let _ = m.deadline_expiries.get_or_create(&labels);
            let _ = m.panics.get_or_create(&labels);
        }
        m.register_results(&mut registry);
        m.register_admission(&mut registry);
        m.register_verification(&mut registry);
        m.register_cluster_and_cache(&mut registry);
        Self { registry, ..m }
    }

    /// Every family empty, none registered yet.
    fn unregistered() -> Self {
        let admission: Family<AdmissionLabels, Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16)));
        Self {
            admission,
            admission_series: series::Series::default(),
            in_flight: Gauge::default(),
            deadline_expiries: Family::default(),
            panics: Family::default(),
            policy_load_errors: Gauge::default(),
            certificate_expiry: Family::default(),
            policy_load_failures: Counter::default(),
            policies_loaded: Gauge::default(),
            registry_requests: Family::default(),
            registry_errors: Family::default(),
            registry_throttled: Family::default(),
            registry_source: None,
            cache_hits: Family::default(),
            cache_negative_hits: Family::default(),
            cache_misses: Family::default(),
            cache_coalesced: Family::default(),
            cache_source: None,
            policy_results: Family::default(),
            policy_result_series: series::Series::default(),
            reports_written: Counter::default(),
            reports_dropped: Family::default(),
            connections_refused: Family::default(),
            requests_refused: Family::default(),
            l2_events: Family::default(),
            l2_calls: Counter::default(),
            l2_call_micros: Counter::default(),
            l2_call_seconds: Counter::default(),
            l2_source: None,
            log_lines_dropped: Counter::default(),
            log_drops_source: None,
            activity_hook: None,
            watch_objects: Family::default(),
            watch_bytes: Family::default(),
            watch_synced: Family::default(),
            watch_over_total: Family::default(),
            watch_emptied: Family::default(),
            watch_source: std::sync::OnceLock::new(),
            connections_open: Gauge::default(),
            connections_source: std::sync::OnceLock::new(),
            crl_age: Family::default(),
            crl_next_update: Family::default(),
            revocation_fetches: Family::default(),
            revocation_source: None,
            trust_root: trust_root::TrustRootMetrics::default(),
            registry: Registry::default(),
        }
    }

    /// Adds the shared L2 cache's counters to every scrape.
    pub fn with_l2_stats(mut self, source: L2StatsSource) -> Self {
        self.l2_source = Some(source);
        self
    }

    /// Adds the count of log lines the non-blocking log writer dropped to every scrape.
    pub fn with_log_drops(mut self, source: LogDropsSource) -> Self {
        self.log_drops_source = Some(source);
        self
    }

    /// Calls `hook` when admissions start running and when they stop ([`ActivityHook`]).
    pub fn with_activity_hook(mut self, hook: ActivityHook) -> Self {
        self.activity_hook = Some(hook);
        self
    }

    /// Adds the verifier's cache counters to every scrape.
    pub fn with_cache_stats(mut self, source: CacheStatsSource) -> Self {
        self.cache_source = Some(source);
        self
    }

    /// The trusted root's freshness per source (empty when no source was given).
    pub fn trust_roots(&self) -> Vec<TrustRootCount> {
        self.trust_root
            .source
            .as_ref()
            .map(|s| s())
            .unwrap_or_default()
    }

    /// Adds the trusted root's freshness per source to every scrape.
    pub fn with_trust_root_stats(mut self, source: TrustRootStatsSource) -> Self {
        self.trust_root.source = Some(source);
        self
    }

    /// Adds the verifier's background revocation data to every scrape.
    pub fn with_revocation_stats(mut self, source: RevocationStatsSource) -> Self {
        self.revocation_source = Some(source);
        self
    }

    /// Adds the registry client's counters to every scrape.
    pub fn with_registry_stats(mut self, source: RegistryStatsSource) -> Self {
        self.registry_source = Some(source);
        self
    }

    /// Exports what the watches of the policies' cluster reads hold (set once, by `--kube`).
    pub fn set_resource_watch_stats(&self, source: ResourceWatchStatsSource) {
        let _ = self.watch_source.set(source);
    }

    /// Records one finished admission request.
    pub fn observe_admission(&self, route: &str, outcome: &str, elapsed: Duration) {
        self.admission_series
            .get(&self.admission, [route, outcome])
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one policy result; the `rule_result` label is the engine's status, `cause` is
    /// `admission_request` or `background_scan`.
    pub fn policy_result(&self, policy: &str, namespace: &str, result: Status, cause: &str) {
        self.policy_result_series
            .get(
                &self.policy_results,
                [policy, namespace, result.as_str(), cause],
            )
            .inc();
    }

    /// Counts written reports.
    pub fn report_written(&self) {
        self.reports_written.inc();
    }

    /// Counts a report update that was not written.
    pub fn report_dropped(&self, reason: &str) {
        self.reports_dropped
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts a connection closed by a bound (`max_connections`, `idle_timeout`).
    pub fn connection_refused(&self, reason: &str) {
        self.connections_refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts a request refused before it was judged (its body's bound).
    pub fn request_refused(&self, reason: &str) {
        self.requests_refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Records a request whose budget expired.
    pub fn deadline_expired(&self, route: &str) {
        self.deadline_expiries
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .inc();
    }

    /// Records a request whose handling panicked.
    pub fn panicked(&self, route: &str) {
        self.panics
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .inc();
    }

    /// Counts a request in flight until the guard drops.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        if self.in_flight.inc() <= 0
            && let Some(hook) = &self.activity_hook
        {
            hook(true);
        }
        InFlight(self.clone())
    }

    /// A clean load of `count` policies.
    pub fn policies_loaded(&self, count: usize) {
        self.policies_loaded
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        self.policy_load_errors.set(0);
    }

    /// A published set of `count` policies beside `errors` errors of objects that keep their
    /// last good version (or none): the gauge says so for as long as they last.
    pub fn policies_published(&self, count: usize, errors: usize) {
        self.policies_loaded
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        self.policy_load_errors
            .set(i64::try_from(errors).unwrap_or(i64::MAX));
    }

    /// Reads the open connections from `source` at every scrape (the first source set stays).
    pub fn count_open_connections(&self, source: OpenConnectionsSource) {
        let _ = self.connections_source.set(source);
    }

    /// The serving certificate in use now, read from `file`, expires at `not_after` (Unix
    /// seconds). No series before: a server without TLS has no certificate to expire.
    pub fn certificate_expires(&self, file: &str, not_after: i64) {
        self.certificate_expiry
            .get_or_create(&CertificateLabels {
                file: file.to_owned(),
            })
            .set(not_after);
    }

    /// A load with `errors` errors (the previous set stays).
    pub fn policy_load_failed(&self, errors: usize) {
        self.policy_load_errors
            .set(i64::try_from(errors).unwrap_or(i64::MAX));
        self.policy_load_failures.inc();
    }

    /// OpenMetrics text of every family.
    pub fn encode(&self) -> String {
        // Sources' counters are monotonic: mirror them rather than add deltas.
        fn set<L: Clone + std::hash::Hash + Eq>(family: &Family<L, Counter>, labels: &L, v: u64) {
            family
                .get_or_create(labels)
                .inner()
                .store(v, Ordering::Relaxed);
        }
        if let Some(source) = &self.registry_source {
            for s in source() {
                let labels = RegistryLabels {
                    registry: s.registry.clone(),
                };
                for (status, n) in &s.statuses {
                    let labels = RegistryStatusLabels {
                        registry: s.registry.clone(),
                        status: status.clone(),
                    };
                    set(&self.registry_requests, &labels, *n);
                }
                set(&self.registry_errors, &labels, s.errors);
                set(&self.registry_throttled, &labels, s.throttled);
            }
        }
        if let Some(source) = &self.cache_source {
            for c in source() {
                let labels = CacheLabels {
                    cache: c.cache.clone(),
                };
                set(&self.cache_hits, &labels, c.hits);
                set(&self.cache_negative_hits, &labels, c.negative_hits);
                set(&self.cache_misses, &labels, c.misses);
                set(&self.cache_coalesced, &labels, c.coalesced);
            }
        }
        if let Some(source) = &self.l2_source {
            let counts = source();
            for (event, n) in counts.events {
                let labels = L2Labels {
                    event: event.to_owned(),
                };
                set(&self.l2_events, &labels, n);
            }
            self.l2_calls.inner().store(counts.calls, Ordering::Relaxed);
            self.l2_call_micros
                .inner()
                .store(counts.call_micros, Ordering::Relaxed);
            let seconds = counts.call_micros as f64 / 1e6;
            self.l2_call_seconds
                .inner()
                .store(seconds.to_bits(), Ordering::Relaxed);
        }
        if let Some(source) = &self.log_drops_source {
            self.log_lines_dropped
                .inner()
                .store(source(), Ordering::Relaxed);
        }
        if let Some(source) = self.connections_source.get() {
            self.connections_open
                .set(i64::try_from(source()).unwrap_or(i64::MAX));
        }
        if let Some(source) = self.watch_source.get() {
            // Watches stop when no policy reads them: their series go with them.
            self.watch_objects.clear();
            self.watch_bytes.clear();
            self.watch_synced.clear();
            self.watch_over_total.clear();
            self.watch_emptied.clear();
            let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            for w in source() {
                let labels = WatchLabels {
                    resource: w.resource.clone(),
                };
                self.watch_objects
                    .get_or_create(&labels)
                    .set(gauge(w.objects));
                self.watch_bytes.get_or_create(&labels).set(gauge(w.bytes));
                self.watch_synced
                    .get_or_create(&labels)
                    .set(i64::from(w.synced));
                self.watch_over_total
                    .get_or_create(&labels)
                    .set(i64::from(w.over_total));
                self.watch_emptied
                    .get_or_create(&labels)
                    .set(i64::from(w.over_total));
            }
        }
        if let Some(source) = &self.revocation_source {
            let counts = source();
            // CRLs dropped from the store go with their series.
            self.crl_age.clear();
            self.crl_next_update.clear();
            for crl in &counts.crls {
                let labels = UrlLabels {
                    url: crl.url.clone(),
                };
                self.crl_age.get_or_create(&labels).set(crl.age_seconds);
                if let Some(left) = crl.next_update_in_seconds {
                    self.crl_next_update.get_or_create(&labels).set(left);
                }
            }
            for (result, n) in [("ok", counts.fetched), ("failed", counts.failed)] {
                let labels = ResultLabels {
                    result: result.to_owned(),
                };
                set(&self.revocation_fetches, &labels, n);
            }
        }
        self.trust_root.update();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        // The unprefixed process_* families go before the closing `# EOF`.
        if let Some(stats) = process::read()
            && let Some(body) = out.strip_suffix("# EOF\n")
        {
            out = format!("{body}{}# EOF\n", process::encode(&stats));
        }
        out
    }
}

/// Decrements the in-flight gauge on drop (also when the request future is cancelled).
pub struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let before = self.0.in_flight.dec();
        if before <= 1
            && let Some(hook) = &self.0.activity_hook
        {
            hook(false);
        }
    }
}

#[cfg(test)]
mod tests;
