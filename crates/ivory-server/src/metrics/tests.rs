use std::collections::BTreeMap;
use std::sync::Mutex;

use ivory_registry::RegistryStats;

use super::*;

fn line(text: &str, start: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn registry_statuses_and_cache_counters_follow_their_sources() {
    let calls = Arc::new(Mutex::new(1u64));
    let (c1, c2) = (calls.clone(), calls.clone());
    let m = Metrics::new()
        .with_registry_stats(Arc::new(move || {
            let n = *c1.lock().unwrap();
            vec![RegistryStats {
                registry: "r:5000".into(),
                requests: n + 2,
                statuses: BTreeMap::from([("2xx".to_string(), n), ("4xx".to_string(), 2)]),
                errors: 2,
                ..RegistryStats::default()
            }]
        }))
        .with_cache_stats(Arc::new(move || {
            let n = *c2.lock().unwrap();
            vec![CacheCounts {
                cache: "results".into(),
                hits: n * 10,
                negative_hits: n,
                misses: 1,
                coalesced: n * 3,
            }]
        }));
    let text = m.encode();
    let two = r#"ivory_registry_requests_total{registry="r:5000",status="2xx"}"#;
    let four = r#"ivory_registry_requests_total{registry="r:5000",status="4xx"}"#;
    let hits = r#"ivory_verify_cache_hits_total{cache="results"}"#;
    let coalesced = r#"ivory_verify_cache_coalesced_total{cache="results"}"#;
    assert_eq!(line(&text, two), Some(1.0), "{text}");
    assert_eq!(line(&text, four), Some(2.0), "{text}");
    assert_eq!(line(&text, hits), Some(10.0), "{text}");
    assert_eq!(line(&text, coalesced), Some(3.0), "{text}");
    assert_eq!(
        line(&text, r#"ivory_verify_cache_misses_total{cache="results"}"#),
        Some(1.0)
    );
    *calls.lock().unwrap() = 5;
    let text = m.encode();
    assert_eq!(line(&text, two), Some(5.0), "{text}");
    assert_eq!(line(&text, hits), Some(50.0), "{text}");
    assert_eq!(
        line(
            &text,
            r#"ivory_verify_cache_negative_hits_total{cache="results"}"#
        ),
        Some(5.0)
    );
}

#[test]
fn the_trusted_roots_freshness_is_exported_per_source() {
    let counts = Arc::new(Mutex::new(vec![TrustRootCount {
        source: "TUF http://127.0.0.1:1".into(),
        age_seconds: Some(30),
        last_success_unix: Some(1_765_000_000),
        succeeded: 4,
        failed: 2,
        last_error: None,
    }]));
    let source = counts.clone();
    let m = Metrics::new().with_trust_root_stats(Arc::new(move || source.lock().unwrap().clone()));
    let text = m.encode();
    let src = r#"source="TUF http://127.0.0.1:1""#;
    assert_eq!(
        line(&text, &format!("ivory_trust_root_age_seconds{{{src}}}")),
        Some(30.0)
    );
    assert_eq!(
        line(
            &text,
            &format!("ivory_trust_root_last_refresh_success_timestamp_seconds{{{src}}}")
        ),
        Some(1_765_000_000.0)
    );
    assert_eq!(
        line(
            &text,
            &format!("ivory_trust_root_refreshes_total{{{src},result=\"failed\"}}")
        ),
        Some(2.0)
    );
    assert_eq!(
        line(
            &text,
            &format!("ivory_trust_root_refreshes_total{{{src},result=\"ok\"}}")
        ),
        Some(4.0)
    );
    // Back on the root built into ivory: no age.
    counts.lock().unwrap()[0].age_seconds = None;
    assert!(!m.encode().contains("trust_root_age_seconds{"));
}

#[test]
fn the_age_of_revocation_data_is_exported() {
    let counts = Arc::new(Mutex::new(RevocationCounts {
        crls: vec![CrlCount {
            url: "http://127.0.0.1:1/a.crl".into(),
            age_seconds: 42,
            next_update_in_seconds: Some(-5),
        }],
        fetched: 3,
        failed: 1,
    }));
    let source = counts.clone();
    let m = Metrics::new().with_revocation_stats(Arc::new(move || source.lock().unwrap().clone()));
    let text = m.encode();
    let url = r#"{url="http://127.0.0.1:1/a.crl"}"#;
    assert_eq!(
        line(&text, &format!("ivory_revocation_crl_age_seconds{url}")),
        Some(42.0)
    );
    assert_eq!(
        line(
            &text,
            &format!("ivory_revocation_crl_next_update_seconds{url}")
        ),
        Some(-5.0)
    );
    assert_eq!(
        line(&text, r#"ivory_revocation_fetches_total{result="ok"}"#),
        Some(3.0)
    );
    assert_eq!(
        line(&text, r#"ivory_revocation_fetches_total{result="failed"}"#),
        Some(1.0)
    );
    counts.lock().unwrap().crls.clear();
    assert!(!m.encode().contains("crl_age_seconds{"));
}

#[test]
fn watches_of_cluster_reads_are_exported_and_go_when_they_stop() {
    let held = Arc::new(Mutex::new(vec![WatchStats {
        resource: "v1 configmaps in namespace ivory".into(),
        objects: 3,
        bytes: 1200,
        synced: true,
        over_total: false,
    }]));
    let source = held.clone();
    let m = Metrics::new();
    m.set_resource_watch_stats(Arc::new(move || source.lock().unwrap().clone()));
    let text = m.encode();
    let label = r#"{resource="v1 configmaps in namespace ivory"}"#;
    assert_eq!(
        line(&text, &format!("ivory_resource_watch_objects{label}")),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        line(&text, &format!("ivory_resource_watch_bytes{label}")),
        Some(1200.0),
        "{text}"
    );
    assert_eq!(
        line(&text, &format!("ivory_resource_watch_synced{label}")),
        Some(1.0),
        "{text}"
    );
    for name in [
        "ivory_resource_watch_emptied_by_total_budget",
        "ivory_resource_watch_over_total_bytes",
    ] {
        assert_eq!(line(&text, &format!("{name}{label}")), Some(0.0), "{text}");
    }
    held.lock().unwrap().clear();
    let text = m.encode();
    assert!(!text.contains("configmaps"), "{text}");
}

#[test]
fn the_shared_caches_call_time_is_in_seconds_and_the_old_name_stays_one_release() {
    let metrics = Metrics::new().with_l2_stats(Arc::new(|| L2Counts {
        events: vec![("hits", 3)],
        calls: 4,
        call_micros: 2_500_000,
    }));
    let text = metrics.encode();
    assert_eq!(
        line(&text, "ivory_l2_call_seconds_total "),
        Some(2.5),
        "{text}"
    );
    assert_eq!(
        line(&text, "ivory_l2_call_microseconds_total "),
        Some(2_500_000.0),
        "{text}"
    );
    assert_eq!(line(&text, "ivory_l2_calls_total "), Some(4.0), "{text}");
}

/// Counts found by their label values land in the family's own series, one per label set,
/// however many times each is counted.
#[test]
fn policy_results_and_admissions_count_into_their_families_series() {
    let m = Metrics::new();
    for _ in 0..3 {
        m.policy_result("check", "", Status::Pass, "admission_request");
    }
    m.policy_result("check", "", Status::Fail, "admission_request");
    m.policy_result("check", "team", Status::Pass, "admission_request");
    m.policy_result("check", "", Status::Pass, "background_scan");
    for _ in 0..2 {
        m.observe_admission("ivpol_validate", "allowed", Duration::from_millis(2));
    }
    m.observe_admission("ivpol_validate", "denied", Duration::from_millis(2));
    let text = m.encode();
    let result = |namespace: &str, result: &str, cause: &str| {
        line(
            &text,
            &format!(
                r#"ivory_policy_results_total{{policy_name="check",policy_namespace="{namespace}",rule_result="{result}",rule_execution_cause="{cause}"}}"#
            ),
        )
    };
    assert_eq!(result("", "pass", "admission_request"), Some(3.0), "{text}");
    assert_eq!(result("", "fail", "admission_request"), Some(1.0), "{text}");
    assert_eq!(
        result("team", "pass", "admission_request"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(result("", "pass", "background_scan"), Some(1.0), "{text}");
    let admissions = |outcome: &str| {
        line(
            &text,
            &format!(
                r#"ivory_admission_duration_seconds_count{{route="ivpol_validate",outcome="{outcome}"}}"#
            ),
        )
    };
    assert_eq!(admissions("allowed"), Some(2.0), "{text}");
    assert_eq!(admissions("denied"), Some(1.0), "{text}");
}
