use std::sync::Mutex;

use ivory_engine::decision::Status;
use ivory_engine::testing::{FakeVerifier, Mode};
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;
use crate::metrics::Metrics;
use crate::policies::PolicyStore;
use crate::policy_results::{ReportSink, ReportUpdate};

const KEY: &str = include_str!("../../../../fixtures/keys/cosign-p256.pub");

fn digest(n: usize) -> String {
    format!("sha256:{n:064x}")
}

/// Digest 1 verifies; each verification takes 20 ms, so overlapping ones are seen.
fn recording() -> FakeVerifier {
    FakeVerifier::new()
        .sign_digest(&digest_one())
        .mode(Mode::Sleep(Duration::from_millis(20)))
}

fn digest_one() -> String {
    digest(1)
}

#[derive(Default)]
struct Sink(Mutex<Vec<ReportUpdate>>);

impl ReportSink for Sink {
    fn submit(&self, update: ReportUpdate) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(update);
    }
}

fn policy() -> CompiledPolicy {
    let key: String = KEY.lines().map(|l| format!("            {l}\n")).collect();
    let yaml = format!(
        "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata: {{name: signed}}
spec:
  validationActions: [Deny]
  matchConstraints:
    resourceRules: [{{apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE], resources: [pods]}}]
  attestors:
    - name: key
      cosign:
        key:
          data: |
{key}        ctlog: {{insecureIgnoreTlog: true, insecureIgnoreSCT: true}}
  validations:
    - expression: images.containers.map(i, verifyImageSignatures(i, [attestors.key])).all(e, e > 0)
      message: not signed
"
    );
    let report = ivory_policy::load_str(&yaml, "background.yaml");
    report
        .policies
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("{:?}", report.errors))
}

fn pod(n: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("p{n}"), "namespace": "team", "uid": format!("uid-{n}")},
        "spec": {"containers": [{"name": "app", "image": "reg.example/app:v1"}]},
        "status": {"containerStatuses": [{"name": "app", "image": "reg.example/app:v1",
            "imageID": format!("reg.example/app@{}", digest(n)), "ready": true, "restartCount": 0}]}
    }))
    .unwrap_or_default()
}

/// A Pod store holding `pod(1)` to `pod(count)`, and the state of a server with [`policy`],
/// `verifier` and a report sink.
fn cluster(count: usize, verifier: Arc<dyn ImageVerifier>) -> (Store<Pod>, AppState, Arc<Sink>) {
    let (pods, mut writer) = reflector::store::<Pod>();
    writer.apply_watcher_event(&Event::Init);
    for n in 1..=count {
        writer.apply_watcher_event(&Event::InitApply(pod(n)));
    }
    writer.apply_watcher_event(&Event::InitDone);
    let sink = Arc::new(Sink::default());
    let mut state = AppState::new(
        verifier,
        Arc::new(PolicyStore::with_policies(vec![policy()])),
        Arc::new(Metrics::new()),
    );
    state.reports = Some(sink.clone());
    (pods, state, sink)
}

#[tokio::test]
async fn a_scan_verifies_running_digests_bounded_and_reports_them() {
    let verifier = Arc::new(recording());
    let (pods, state, sink) = cluster(6, verifier.clone());
    let settings = BackgroundSettings {
        concurrency: 2,
        ..BackgroundSettings::default()
    };
    assert_eq!(scan_once(&pods, &state, &settings).await, 6);

    let mut asked: Vec<String> = verifier
        .requests()
        .into_iter()
        .map(|r| r.image.original().to_owned())
        .collect();
    asked.sort();
    let expected: Vec<String> = (1..=6)
        .map(|n| format!("reg.example/app:v1@{}", digest(n)))
        .collect();
    assert_eq!(asked, expected, "each Pod's running digest, not its tag");
    assert!(
        verifier.most_concurrent() <= 2,
        "at most `concurrency` at once"
    );

    let updates = sink.0.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        updates.len(),
        6,
        "Deny policies are reported by background scans"
    );
    for update in updates.iter() {
        let result = &update.results[0];
        assert_eq!(result.properties["process"], "background scan");
        let expected = if update.subject.uid == "uid-1" {
            Status::Pass
        } else {
            Status::Fail
        };
        assert_eq!(result.result, expected, "{update:?}");
    }
}

/// A verifier whose cache still says every image is verified (as after a signature was deleted
/// from the registry); its revalidating view reads the "registry", where only digest 1 is signed.
fn stale_cache() -> FakeVerifier {
    FakeVerifier::new()
        .sign_digest(&digest(1))
        .sign_digest(&digest(2))
        .revalidating_with(recording())
}

#[tokio::test]
async fn a_scan_judges_through_the_revalidating_view_not_the_cached_verdicts() {
    let verifier = Arc::new(stale_cache());
    let (pods, state, sink) = cluster(2, verifier.clone());
    let before = ivory_clock::now();
    assert_eq!(
        scan_once(&pods, &state, &BackgroundSettings::default()).await,
        2
    );
    let since = verifier
        .revalidating_since()
        .expect("the scan asked for a revalidating view");
    assert!(since >= before && since <= ivory_clock::now());
    let updates = sink.0.lock().unwrap_or_else(|e| e.into_inner());
    let result_of = |uid: &str| {
        updates
            .iter()
            .find(|u| u.subject.uid == uid)
            .map(|u| u.results[0].result)
    };
    assert_eq!(result_of("uid-1"), Some(Status::Pass));
    assert_eq!(
        result_of("uid-2"),
        Some(Status::Fail),
        "the stale cached verdict was not used"
    );
}
