//! The three front ends of the one pipeline give the same verdict for the same review and
//! policies: the webhook route (`ivory serve`), the CLI (`run_routes`: `ivory apply`,
//! `ivory test`) and the background scan, each built as in production, over the engine's
//! in-memory verifier.

use std::sync::{Arc, Mutex};

use axum::body::{Body, to_bytes};
use http::Request;
use ivory_engine::admission::AdmissionRequest;
use ivory_engine::decision::Status;
use ivory_engine::pipeline::{Routes, Stage, run_routes};
use ivory_engine::resources::NoResources;
use ivory_engine::testing::FakeVerifier;
use ivory_server::background::{BackgroundSettings, request_for, scan_once};
use ivory_server::policy_results::{ReportSink, ReportUpdate};
use ivory_server::{AppState, Metrics, PolicyStore};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::*;

const SIGNED: &str =
    "reg.example/app@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const UNSIGNED: &str =
    "reg.example/app@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const KEY: &str = "          -----BEGIN PUBLIC KEY-----
          MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv
          DLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==
          -----END PUBLIC KEY-----
";

/// A Deny policy on Pods: every container signed by attestor `key`.
fn policy() -> Arc<CompiledPolicy> {
    let yaml = format!(
        "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata: {{name: signed}}
spec:
  validationActions: [Deny]
  matchConstraints:
    resourceRules:
    - {{apiGroups: [''], apiVersions: [v1], operations: [CREATE], resources: [pods]}}
  attestors:
  - name: key
    cosign:
      key:
        data: |
{KEY}  validations:
  - expression: images.containers.map(i, verifyImageSignatures(i, [attestors.key])).all(e, e > 0)
    message: not signed
"
    );
    let report = ivory_policy::load_str(&yaml, "parity.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    Arc::new(report.policies.into_iter().next().expect("one policy"))
}

fn pod(image: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "team", "uid": "uid-web"},
        "spec": {"containers": [{"name": "app", "image": image}]},
    }))
    .expect("a Pod")
}

#[derive(Default)]
struct Sink(Mutex<Vec<ReportUpdate>>);

impl ReportSink for Sink {
    fn submit(&self, update: ReportUpdate) {
        self.0.lock().expect("sink").push(update);
    }
}

/// What the webhook answers: allowed, and the denial message.
async fn through_webhook(state: &AppState, req: &AdmissionRequest) -> (bool, Option<String>) {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "request": req.to_json()});
    let request = Request::post("/ivpol/validate/signed")
        .body(Body::from(review.to_string()))
        .expect("a request");
    let response = ivory_server::router(state.clone())
        .oneshot(request)
        .await
        .expect("an answer");
    let bytes = to_bytes(response.into_body(), 1 << 20).await.expect("body");
    let review: Value = serde_json::from_slice(&bytes).expect("a review");
    let response = &review["response"];
    let message = response["status"]["message"].as_str().map(str::to_owned);
    (response["allowed"] == true, message)
}

/// What the CLI decides: allowed, the denial message, and each policy's status.
async fn through_cli(
    verifier: &FakeVerifier,
    policies: &[Arc<CompiledPolicy>],
    req: &AdmissionRequest,
) -> (bool, Option<String>, Vec<Status>) {
    let routes = Routes {
        verifier,
        resources: &NoResources,
        policies,
        exceptions: None,
    };
    let deadline = ivory_clock::now() + Duration::from_secs(5);
    let d = run_routes(&routes, Stage::Validate, &mut req.clone(), None, deadline)
        .await
        .expect("well formed");
    let statuses = d.results.iter().map(|r| r.status).collect();
    (d.allowed, d.message, statuses)
}

/// What the background scan reports for `pod`: each policy's status.
async fn through_background(state: &AppState, pod: Pod) -> Vec<Status> {
    let (pods, mut writer) = reflector::store::<Pod>();
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitApply(pod));
    writer.apply_watcher_event(&Event::InitDone);
    let sink = Arc::new(Sink::default());
    let mut state = state.clone();
    state.reports = Some(sink.clone());
    assert_eq!(
        scan_once(&pods, &state, &BackgroundSettings::default()).await,
        1
    );
    let updates = sink.0.lock().expect("sink");
    updates
        .iter()
        .flat_map(|u| u.results.iter().map(|r| r.result))
        .collect()
}

#[tokio::test]
async fn the_webhook_the_cli_and_the_background_scan_give_the_same_verdict() {
    let policies = vec![policy()];
    let verifier = Arc::new(FakeVerifier::new().sign(SIGNED, "key"));
    let state = AppState::new(
        verifier.clone(),
        Arc::new(PolicyStore::with_policies(
            policies.iter().map(|p| (**p).clone()).collect(),
        )),
        Arc::new(Metrics::new()),
    );
    for (image, allowed, status) in [
        (SIGNED, true, Status::Pass),
        (UNSIGNED, false, Status::Fail),
    ] {
        let pod = pod(image);
        // The review the background scan judges the Pod as; the others get the same one.
        let req = request_for(&pod).expect("a named Pod");
        let (cli_allowed, cli_message, cli_statuses) =
            through_cli(&verifier, &policies, &req).await;
        let webhook = through_webhook(&state, &req).await;
        let background = through_background(&state, pod).await;
        assert_eq!(
            (cli_allowed, &cli_statuses[..]),
            (allowed, &[status][..]),
            "{image}"
        );
        assert_eq!(webhook, (cli_allowed, cli_message.clone()), "{image}");
        assert_eq!(background, cli_statuses, "{image}");
        if !allowed {
            assert_eq!(
                cli_message.as_deref(),
                Some("Policy signed failed: not signed")
            );
        }
    }
}
