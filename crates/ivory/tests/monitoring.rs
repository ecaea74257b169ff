//! The monitoring assets (deploy/monitoring/) against a live `ivory serve` scraped by a real
//! Prometheus (Debian's `prometheus`) on loopback, with the alert rules loaded: admissions that
//! are allowed, denied, patched and sent to an unknown policy, images on a registry that does
//! not answer, and a flush of the shared cache. Every query of `queries.json` (each panel's and
//! each alert's) is evaluated: it parses, names only metrics ivory serves (or declared external
//! or not exported yet), and returns series when what it reads was exercised; the registry
//! outage alert fires and the certificate alert does not.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ivory_testkit::review::pod_review;
use ivory_testkit::{
    RedisServer, RegistryHarness, TufMirror, eventually, free_port, tuf_fixtures_dir,
};
use serde_json::Value;
use tokio::process::{Child, Command};

use ivory_testkit::policy::PodPolicy;

use crate::cli_util::{push_fixture, write_ca};
use crate::util::{Ivory, Tls, VERIFY_SIGNED, key_attestor};

/// Families this set-up gives no sample, so they are not served yet (prometheus-client writes
/// a family once it has a series): each with why. Any other metric a query names must be served.
const NOT_EXERCISED: [(&str, &str); 10] = [
    (
        "ivory_http_connections_refused_total",
        "only once a bound of the webhook port refuses",
    ),
    (
        "ivory_http_requests_refused_total",
        "only once a bound of the webhook port refuses",
    ),
    (
        "ivory_reports_dropped_total",
        "PolicyReports are written with --kube only",
    ),
    (
        "ivory_resource_watch_bytes",
        "resource watches run with --kube only",
    ),
    (
        "ivory_resource_watch_synced",
        "resource watches run with --kube only",
    ),
    (
        "ivory_revocation_crl_age_seconds",
        "CRLs are held for Notation policies only",
    ),
    (
        "ivory_revocation_crl_next_update_seconds",
        "CRLs are held for Notation policies only",
    ),
    (
        "ivory_trust_root_age_seconds",
        "the built-in trusted root has no age (TUF or a file has)",
    ),
    (
        "ivory_trust_root_last_refresh_success_timestamp_seconds",
        "the built-in trusted root is never refreshed",
    ),
    (
        "ivory_trust_root_refreshes_total",
        "the built-in trusted root is never refreshed",
    ),
];

/// Selections of label values this set-up does not produce, each with why.
const NOT_EXERCISED_SELECTIONS: [(&str, &str); 2] = [
    (
        "rule_execution_cause=\"background_scan\"",
        "background scans run with --kube only",
    ),
    (
        "rule_result=\"skip\"",
        "a skip is a CEL failure or a spent budget under failurePolicy Ignore; an unreachable \
         registry under Ignore is an `error` result whose request is allowed",
    ),
];

/// An image on a port nothing listens on: its registry is unreachable.
const UNREACHABLE: &str = "127.0.0.1:1/gone/app:v1";

fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The alert rules with every `for:` at 0s, so an expression that holds fires at the next
/// evaluation (the durations themselves are promtool's unit tests').
fn rules_without_hold(dir: &Path) -> std::path::PathBuf {
    let text =
        std::fs::read_to_string(repo_root().join("deploy/monitoring/ivory-alerts.rules.yaml"))
            .unwrap();
    let held: String = text
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 0s", &line[..line.len() - line.trim_start().len()]),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, held).unwrap();
    path
}

/// Prometheus scraping ivory (https, trusting its test CA) every second, evaluating the rules
/// every second.
fn start_prometheus(dir: &Path, ivory: &Ivory, ca: &Path, rules: &Path, port: u16) -> Child {
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [{rules}]
scrape_configs:
  - job_name: ivory
    scheme: https
    tls_config: {{ca_file: {ca}}}
    static_configs: [{{targets: ['{addr}'], labels: {{namespace: ivory-system}}}}]
",
        rules = rules.display(),
        ca = ca.display(),
        addr = ivory.addr,
    );
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    Command::new("prometheus")
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus (Debian's package) must be installed: scripts/test.sh installs it")
}

async fn query(port: u16, promql: &str) -> Value {
    let url = reqwest::Url::parse_with_params(
        &format!("http://127.0.0.1:{port}/api/v1/query"),
        &[("query", promql)],
    )
    .unwrap();
    reqwest::Client::new()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// One round of admissions of every kind.
async fn traffic(ivory: &Ivory, signed: &str, unsigned: &str, n: usize) {
    for (path, image) in [
        ("/ivpol/validate/require-signed", signed),
        ("/ivpol/validate/require-signed", unsigned),
        ("/ivpol/mutate/require-signed", signed),
        ("/ivpol/validate/no-such-policy", signed),
        ("/ivpol/validate/require-signed", UNREACHABLE),
        ("/ivpol/validate/ignore-unreachable", UNREACHABLE),
    ] {
        let review = pod_review(&format!("uid-{n}"), &[image]);
        ivory.review(path, &review).await;
    }
}

/// The metric families ivory serves, and those with samples now.
async fn served(ivory: &Ivory) -> (BTreeSet<String>, BTreeSet<String>) {
    let text = ivory.metrics().await;
    let mut families = BTreeSet::new();
    let mut sampled = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            families.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            sampled.insert(name.to_owned());
        }
    }
    (families, sampled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_answers_every_query_and_the_outage_alert_fires() {
    let h = RegistryHarness::start_default().await.unwrap();
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (signed, _) = push_fixture(&h, "sig-p256").await;
    let (unsigned, _) = push_fixture(&h, "unsigned").await;
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    // The fixtures' registry and one that does not answer, both under the policy.
    let body = format!("{}{}", key_attestor(), VERIFY_SIGNED);
    let yaml = PodPolicy::new("require-signed")
        .glob(&format!("{}/*", h.host()))
        .glob("127.0.0.1:1/*")
        .spec(&body)
        .yaml();
    std::fs::write(policies.join("signed.yaml"), yaml).unwrap();
    // The unreachable registry under failurePolicy Ignore: as Kyverno, a refused connection is a
    // policy error that denies (docs/kyverno-semantics.md §14), so this is `failed_closed` too.
    let lenient = PodPolicy::new("ignore-unreachable")
        .glob("127.0.0.1:1/*")
        .spec(&format!("  failurePolicy: Ignore\n{body}"))
        .yaml();
    std::fs::write(policies.join("lenient.yaml"), lenient).unwrap();
    let key = dir.path().join("cache.key");
    std::fs::write(&key, "k".repeat(40)).unwrap();
    // A TUF trusted root, so the trust material's panels have data.
    let mirror = TufMirror::start("state-1").await.unwrap();
    let anchor = tuf_fixtures_dir().join("root-1.json");
    let tls = Tls::write(dir.path(), "ivory monitoring CA");
    let ca = dir.path().join("ivory-ca.pem");
    std::fs::write(&ca, &tls.ca_pem).unwrap();
    let ivory = Ivory::start(
        &tls,
        &[
            "--policies".into(),
            policies.display().to_string(),
            "--registry-ca".into(),
            write_ca(dir.path(), &h).display().to_string(),
            "--cache-redis".into(),
            redis.url(),
            "--cache-redis-key".into(),
            key.display().to_string(),
            "--tuf-mirror".into(),
            mirror.url(),
            "--tuf-root".into(),
            anchor.display().to_string(),
            "--tuf-refresh-interval".into(),
            "2s".into(),
        ],
    )
    .await;
    let port = free_port().unwrap();
    let rules = rules_without_hold(dir.path());
    let _prometheus = start_prometheus(dir.path(), &ivory, &ca, &rules, port);

    // Traffic for a while, the shared cache flushed half-way.
    for round in 0..12 {
        traffic(&ivory, &signed, &unsigned, round).await;
        if round == 3 {
            // A body over the limit: refused before it is judged.
            let (status, _) = ivory
                .post("/ivpol/validate/require-signed", vec![b' '; 8 << 20])
                .await;
            assert_eq!(status, 413);
        }
        if round == 6 {
            let flushed = Command::new("redis-cli")
                .args(["-p", &redis.port().to_string(), "flushall"])
                .status()
                .await
                .unwrap();
            assert!(flushed.success());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eventually(
        "prometheus to hold ivory's samples",
        Duration::from_secs(30),
        || async {
            let answer = query(port, "ivory_admission_duration_seconds_count").await;
            if answer["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
            {
                Ok(())
            } else {
                Err(format!("{answer}"))
            }
        },
    )
    .await
    .unwrap();
    // Keep traffic up while the rules evaluate.
    for round in 12..20 {
        traffic(&ivory, &signed, &unsigned, round).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let queries: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/monitoring/queries.json")).unwrap(),
    )
    .unwrap();
    let (families, sampled) = served(&ivory).await;
    let mut empty_but_exercised = Vec::new();
    let mut unknown = BTreeSet::new();
    for q in queries["queries"].as_array().unwrap() {
        let id = q["id"].as_str().unwrap();
        let promql = q["promql"].as_str().unwrap();
        let answer = query(port, promql).await;
        assert_eq!(answer["status"], "success", "{id}: {promql}: {answer}");
        let metrics: Vec<&str> = q["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let declared: Vec<&str> = ["external", "not_exported_yet"]
            .iter()
            .flat_map(|k| q[*k].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        for metric in metrics.iter().filter(|m| m.starts_with("ivory_")) {
            let not_exercised = NOT_EXERCISED.iter().any(|(name, _)| name == metric);
            if !(families.contains(*metric) || declared.contains(metric) || not_exercised) {
                unknown.insert(format!("{metric} ({id})"));
            }
        }
        let exercised = declared.is_empty()
            && metrics
                .iter()
                .all(|m| sampled.contains(*m) || !m.starts_with("ivory_"));
        let has_series = answer["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty());
        let selects_unexercised = NOT_EXERCISED_SELECTIONS
            .iter()
            .any(|(selection, _)| promql.contains(selection));
        if exercised && !selects_unexercised && !has_series && !id.starts_with("alert:") {
            empty_but_exercised.push(format!("{id}: {promql}"));
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics ivory does not serve (misspelt?):\n{}",
        unknown.into_iter().collect::<Vec<_>>().join("\n")
    );
    assert!(
        empty_but_exercised.is_empty(),
        "panels whose metrics have samples but that show nothing:\n{}",
        empty_but_exercised.join("\n")
    );

    // The registry outage fires its alert (for the unreachable registry only); the certificate,
    // valid for years, does not fire.
    let firing = eventually(
        "IvoryRegistryUnreachable to fire",
        Duration::from_secs(30),
        || async {
            let alerts: Value = reqwest::get(format!("http://127.0.0.1:{port}/api/v1/alerts"))
                .await
                .map_err(|e| e.to_string())?
                .json()
                .await
                .map_err(|e| e.to_string())?;
            let list = alerts["data"]["alerts"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let fired: Vec<Value> = list
                .into_iter()
                .filter(|a| a["state"] == "firing")
                .collect();
            if fired
                .iter()
                .any(|a| a["labels"]["alertname"] == "IvoryRegistryUnreachable")
            {
                Ok(fired)
            } else {
                Err(format!("firing: {fired:?}"))
            }
        },
    )
    .await
    .unwrap();
    // scripts/monitoring/render-dashboard.sh: the panels drawn from this Prometheus.
    if let Some(png) = std::env::var_os("IVORY_MONITORING_PNG") {
        let drawn = Command::new("/usr/bin/python3")
            .arg("scripts/monitoring/render-panels.py")
            .arg(format!("http://127.0.0.1:{port}"))
            .arg(png)
            .arg("0.5")
            .current_dir(repo_root())
            .status()
            .await
            .unwrap();
        assert!(drawn.success(), "render-panels.py failed");
    }
    for alert in &firing {
        if alert["labels"]["alertname"] == "IvoryRegistryUnreachable" {
            assert_eq!(alert["labels"]["registry"], "127.0.0.1:1", "{alert}");
        }
        assert_ne!(
            alert["labels"]["alertname"], "IvoryServingCertificateExpiringSoon",
            "{alert}"
        );
    }
}
