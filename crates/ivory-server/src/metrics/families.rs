//! The registration of the metric families: their names and help texts, in one place.

use prometheus_client::registry::Registry;

use super::Metrics;

impl Metrics {
    /// Registers the families of revocation, refusals of the webhook port, policy results and reports.
    pub(super) fn register_results(&self, registry: &mut Registry) {
        self.trust_root.register(registry);
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use by its file, Unix seconds (none without TLS)",
            self.certificate_expiry.clone(),
        );
        registry.register(
            "revocation_crl_age_seconds",
            "Age of each CRL held for Notation revocation checks (fetched in the background)",
            self.crl_age.clone(),
        );
        registry.register(
            "revocation_crl_next_update_seconds",
            "Seconds until the nextUpdate of each CRL held (negative: stale, no longer used)",
            self.crl_next_update.clone(),
        );
        registry.register(
            "revocation_fetches",
            "Background CRL fetches by result (ok, failed)",
            self.revocation_fetches.clone(),
        );
        registry.register(
            "http_connections_refused",
            "Connections closed by the server's bounds: over max_connections, or idle past the idle timeout",
            self.connections_refused.clone(),
        );
        registry.register(
            "http_connections_open",
            "Client connections the webhook port holds now (at most max_connections)",
            self.connections_open.clone(),
        );
        registry.register(
            "http_requests_refused",
            "Requests refused before judging: body too large, body budget exhausted, body too slow, unreadable",
            self.requests_refused.clone(),
        );
        registry.register(
            "policy_results",
            "Policy results by policy, result and cause (admission request or background scan)",
            self.policy_results.clone(),
        );
        registry.register(
            "reports_written",
            "PolicyReports and ClusterPolicyReports written",
            self.reports_written.clone(),
        );
        registry.register(
            "reports_dropped",
            "Report updates not written, by reason (queue_full, api_error)",
            self.reports_dropped.clone(),
        );
    }

    /// Registers the families of admission latency, in-flight requests, deadlines, panics and policy loads.
    pub(super) fn register_admission(&self, registry: &mut Registry) {
        registry.register(
            "admission_duration_seconds",
            "Admission request latency by route and outcome",
            self.admission.clone(),
        );
        registry.register(
            "admission_in_flight",
            "Admission requests being processed",
            self.in_flight.clone(),
        );
        registry.register(
            "deadline_expiries",
            "Admission requests whose time budget ran out",
            self.deadline_expiries.clone(),
        );
        registry.register(
            "admission_panics",
            "Admission requests whose handling panicked",
            self.panics.clone(),
        );
        registry.register(
            "policy_load_errors",
            "Errors of the latest policy load (0 when clean)",
            self.policy_load_errors.clone(),
        );
        registry.register(
            "policy_load_failures",
            "Policy loads that kept the previous set because of errors",
            self.policy_load_failures.clone(),
        );
        registry.register(
            "policies_loaded",
            "Policies in the active set",
            self.policies_loaded.clone(),
        );
    }

    /// Registers the families of registry calls and the verifier cache.
    pub(super) fn register_verification(&self, registry: &mut Registry) {
        registry.register(
            "registry_requests",
            "Registry calls by registry host and answer class (2xx, 4xx, 5xx, none)",
            self.registry_requests.clone(),
        );
        registry.register(
            "registry_errors",
            "Registry calls that failed, by registry host",
            self.registry_errors.clone(),
        );
        registry.register(
            "registry_throttled",
            "Registry calls answered 429/503, by registry host",
            self.registry_throttled.clone(),
        );
        for (name, help, family) in [
            (
                "verify_cache_hits",
                "Verifier cache lookups answered from the cache",
                &self.cache_hits,
            ),
            (
                "verify_cache_negative_hits",
                "Verifier cache hits that returned a cached negative verdict",
                &self.cache_negative_hits,
            ),
            (
                "verify_cache_misses",
                "Verifier cache lookups that loaded the value",
                &self.cache_misses,
            ),
            (
                "verify_cache_coalesced",
                "Verifier cache lookups that waited for an identical load in flight",
                &self.cache_coalesced,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
    }

    /// Registers the families of resource watches, dropped log lines and the shared L2 cache.
    pub(super) fn register_cluster_and_cache(&self, registry: &mut Registry) {
        registry.register(
            "resource_watch_objects",
            "Objects held by the watch of a resource policies read (resource.Get/List, globalContext)",
            self.watch_objects.clone(),
        );
        registry.register(
            "resource_watch_bytes",
            "Bytes (JSON, managedFields dropped) held by the watch of a resource policies read",
            self.watch_bytes.clone(),
        );
        registry.register(
            "resource_watch_synced",
            "1 when the watch of a resource policies read has listed it and is within its bounds",
            self.watch_synced.clone(),
        );
        registry.register(
            "resource_watch_emptied_by_total_budget",
            "1 when the watch was emptied because all watches together reached --resource-watch-max-total-bytes",
            self.watch_emptied.clone(),
        );
        registry.register(
            "resource_watch_over_total_bytes",
            "Deprecated, removed in the next release: ivory_resource_watch_emptied_by_total_budget",
            self.watch_over_total.clone(),
        );
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because the log consumer fell behind (admission never waits for it)",
            self.log_lines_dropped.clone(),
        );
        registry.register(
            "l2_events",
            "Shared L2 cache events (hits, misses, errors, skipped, rejected, leases_won, leases_waited, waits_answered)",
            self.l2_events.clone(),
        );
        registry.register(
            "l2_calls",
            "Calls to the shared L2 cache",
            self.l2_calls.clone(),
        );
        registry.register(
            "l2_call_seconds",
            "Total time of the calls to the shared L2 cache",
            self.l2_call_seconds.clone(),
        );
        registry.register(
            "l2_call_microseconds",
            "Deprecated, removed in the next release: ivory_l2_call_seconds_total",
            self.l2_call_micros.clone(),
        );
    }
}
