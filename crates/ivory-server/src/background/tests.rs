use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt as _;
use futures::future::BoxFuture;
use ivory_engine::decision::Status;
use ivory_engine::verifier::{ImageVerifier, Verification, VerifyError, VerifyRequest};
use ivory_policy::types::Credentials;
use kube::runtime::watcher::Event;
use serde_json::json;
use tokio::time::Instant;

use super::*;
use crate::audit::{ReportSink, ReportUpdate};
use crate::metrics::Metrics;
use crate::policies::PolicyStore;

const KEY: &str = include_str!("../../../../fixtures/keys/cosign-p256.pub");

fn digest(n: usize) -> String {
    format!("sha256:{n:064x}")
}

/// Records what is asked and how many verifications ran at once; digest 1 verifies.
#[derive(Default)]
struct Recording {
    asked: Mutex<Vec<String>>,
    running: AtomicUsize,
    most: AtomicUsize,
}

impl ImageVerifier for Recording {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a str,
        _: Option<&'a Credentials>,
        _: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        async move {
            Ok(image
                .rsplit_once('@')
                .map(|(_, d)| d.to_owned())
                .unwrap_or_default())
        }
        .boxed()
    }

    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        _: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        async move {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            self.asked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(request.image.clone());
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            let digest = request.image.rsplit_once('@').map(|(_, d)| d.to_owned());
            Ok(if digest.as_deref() == Some(digest_one().as_str()) {
                Verification::Verified {
                    digest: digest.unwrap_or_default(),
                    payload: None,
                    signer: None,
                }
            } else {
                Verification::NotVerified {
                    digest,
                    reason: "no signature".into(),
                }
            })
        }
        .boxed()
    }

    fn image_data<'a>(
        &'a self,
        _: &'a str,
        _: Option<&'a Credentials>,
        _: &'a ivory_engine::verifier::ImagePlatform,
        _: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        async { Ok(json!({})) }.boxed()
    }
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
    let verifier = Arc::new(Recording::default());
    let (pods, state, sink) = cluster(6, verifier.clone());
    let settings = BackgroundSettings {
        concurrency: 2,
        ..BackgroundSettings::default()
    };
    assert_eq!(scan_once(&pods, &state, &settings).await, 6);

    let mut asked = verifier
        .asked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    asked.sort();
    let expected: Vec<String> = (1..=6)
        .map(|n| format!("reg.example/app:v1@{}", digest(n)))
        .collect();
    assert_eq!(asked, expected, "each Pod's running digest, not its tag");
    assert!(
        verifier.most.load(Ordering::SeqCst) <= 2,
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
/// from the registry); its revalidating view is `fresh`, which reads the "registry".
#[derive(Default)]
struct StaleCache {
    fresh: Recording,
    since: Mutex<Option<Instant>>,
}

/// `StaleCache`'s revalidating view.
struct Fresh<'a>(&'a Recording);

impl ImageVerifier for Fresh<'_> {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a str,
        credentials: Option<&'a Credentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        self.0.resolve_digest(image, credentials, deadline)
    }

    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        self.0.verify(request, deadline)
    }

    fn image_data<'a>(
        &'a self,
        image: &'a str,
        credentials: Option<&'a Credentials>,
        platform: &'a ivory_engine::verifier::ImagePlatform,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        self.0.image_data(image, credentials, platform, deadline)
    }
}

impl ImageVerifier for StaleCache {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a str,
        credentials: Option<&'a Credentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        self.fresh.resolve_digest(image, credentials, deadline)
    }

    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        _: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        let digest = request.image.rsplit_once('@').map(|(_, d)| d.to_owned());
        async move {
            Ok(Verification::Verified {
                digest: digest.unwrap_or_default(),
                payload: None,
                signer: None,
            })
        }
        .boxed()
    }

    fn image_data<'a>(
        &'a self,
        image: &'a str,
        credentials: Option<&'a Credentials>,
        platform: &'a ivory_engine::verifier::ImagePlatform,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        self.fresh
            .image_data(image, credentials, platform, deadline)
    }

    fn revalidating(&self, since: Instant) -> Option<Box<dyn ImageVerifier + '_>> {
        *self.since.lock().unwrap_or_else(|e| e.into_inner()) = Some(since);
        Some(Box::new(Fresh(&self.fresh)))
    }
}

#[tokio::test]
async fn a_scan_judges_through_the_revalidating_view_not_the_cached_verdicts() {
    let verifier = Arc::new(StaleCache::default());
    let (pods, state, sink) = cluster(2, verifier.clone());
    let before = ivory_clock::now();
    assert_eq!(
        scan_once(&pods, &state, &BackgroundSettings::default()).await,
        2
    );
    let since = verifier
        .since
        .lock()
        .unwrap_or_else(|e| e.into_inner())
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
