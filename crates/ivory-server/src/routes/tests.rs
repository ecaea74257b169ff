//! Router tests through `oneshot` with an in-memory verifier (no sockets, no registry).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body as HttpBody, to_bytes};
use axum::http::Request;
use base64::Engine as _;
use futures::future::{BoxFuture, FutureExt as _};
use ivory_engine::pipeline::CredentialProblem;
use ivory_engine::testing::{DIGEST, FakeVerifier, Mode};
use ivory_policy::types::Credentials;
use ivory_policy::{default_policy, load_str};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::*;
use crate::sources::{CredentialError, SecretProblem};

/// Tags resolve to [`DIGEST`]; images on host `hung.example` never answer, those on
/// `panic.example` panic, and those on `liar.example` fail at once with a message that reads
/// like a spent budget.
fn fake_verifier() -> FakeVerifier {
    FakeVerifier::new()
        .host("hung.example", Mode::Hang)
        .host("panic.example", Mode::Panic)
        .host(
            "liar.example",
            Mode::UnavailableSaying("time budget of 1ms exhausted"),
        )
}

fn state(store: PolicyStore) -> AppState {
    AppState::new(
        Arc::new(fake_verifier()),
        Arc::new(store),
        Arc::new(Metrics::new()),
    )
}

fn ready_state() -> AppState {
    state(PolicyStore::with_policies(vec![default_policy()]))
}

fn pod_review(uid: &str, image: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "web",
            "namespace": "default",
            "operation": "CREATE",
            "dryRun": true,
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"containers": [{"name": "c0", "image": image}]},
            },
        },
    })
}

async fn post(state: &AppState, uri: &str, body: impl Into<HttpBody>) -> (StatusCode, Vec<u8>) {
    let req = Request::post(uri)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let resp = router(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    (
        status,
        to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec(),
    )
}

async fn get(state: &AppState, uri: &str) -> (StatusCode, String) {
    let req = Request::get(uri).body(HttpBody::empty()).unwrap();
    let resp = router(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let body = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn response_of(bytes: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(bytes).unwrap();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    v["response"].clone()
}

#[tokio::test]
async fn mutate_pins_and_echoes_uid() {
    let s = ready_state();
    let body = pod_review("u-1", "nginx:1.27").to_string();
    let (status, bytes) = post(&s, "/ivpol/mutate/ivory-pin-digests", body).await;
    assert_eq!(status, StatusCode::OK);
    let resp = response_of(&bytes);
    assert_eq!(resp["uid"], "u-1");
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap())
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(
        patch,
        json!([{"op": "replace", "path": "/spec/containers/0/image",
                "value": format!("docker.io/nginx:1.27@{DIGEST}")}])
    );
    let (_, metrics) = get(&s, "/metrics").await;
    assert!(
        metrics.contains(
            r#"ivory_admission_duration_seconds_count{route="ivpol_mutate",outcome="patched"} 1"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains("ivory_admission_in_flight 0"), "{metrics}");
}

#[tokio::test]
async fn validate_denies_unpinned_image() {
    let s = ready_state();
    let body = pod_review("u-2", "nginx:1.27").to_string();
    let (status, bytes) = post(&s, "/ivpol/validate/ivory-pin-digests", body).await;
    assert_eq!(status, StatusCode::OK);
    let resp = response_of(&bytes);
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["code"], 403);
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(msg.contains("ivory-pin-digests"), "{msg}");
}

#[tokio::test]
async fn unknown_policy_names_are_explicit() {
    let s = ready_state();
    let body = pod_review("u-3", "nginx:1.27").to_string();
    let (status, bytes) = post(&s, "/ivpol/validate/ivory-pin-digests/nope/gone", body).await;
    assert_eq!(status, StatusCode::OK);
    let resp = response_of(&bytes);
    assert_eq!(resp["uid"], "u-3");
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 404);
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("unknown ImageValidatingPolicy policies: nope, gone"),
        "{msg}"
    );
    // A cluster policy name is unknown on the namespaced route.
    let body = pod_review("u-4", "nginx:1.27").to_string();
    let (_, bytes) = post(&s, "/nivpol/mutate/ivory-pin-digests", body).await;
    let resp = response_of(&bytes);
    assert_eq!(resp["status"]["code"], 404);
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("unknown NamespacedImageValidatingPolicy policies: ivory-pin-digests")
            && msg.contains(
                "loaded as ImageValidatingPolicy: ivory-pin-digests, which /ivpol/... serves"
            ),
        "{msg}"
    );
}

#[tokio::test]
async fn bad_bodies_are_400_and_oversize_is_413() {
    let s = ready_state();
    let (status, bytes) = post(&s, "/ivpol/validate/x", "{not json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let text = String::from_utf8(bytes).unwrap();
    assert!(
        text.starts_with("invalid AdmissionReview JSON at line 1 column 2"),
        "{text}"
    );
    let (status, bytes) = post(
        &s,
        "/ivpol/validate/x",
        r#"{"apiVersion":"admission.k8s.io/v1beta1"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8(bytes).unwrap().contains("v1beta1"));

    let small = ready_state().with_limits(crate::HttpLimits {
        body_limit: 1024,
        ..crate::HttpLimits::default()
    });
    let mut review = pod_review("u-5", "nginx");
    review["request"]["object"]["metadata"]["annotations"] = json!({"big": "x".repeat(4096)});
    let (status, _) = post(
        &small,
        "/ivpol/validate/ivory-pin-digests",
        review.to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    // The same server still answers afterwards.
    let (status, _) = post(
        &small,
        "/ivpol/validate/ivory-pin-digests",
        pod_review("u-6", "nginx").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, metrics) = get(&small, "/metrics").await;
    assert!(
        metrics.contains(r#"ivory_http_requests_refused_total{reason="body_too_large"} 1"#),
        "{metrics}"
    );
}

/// Bodies still arriving hold their bytes of the shared budget: past it a body is refused at
/// once (503), and the budget comes back when the request is answered.
#[tokio::test]
async fn the_body_budget_is_shared_by_requests_in_flight() {
    let review = pod_review("u-7", "nginx").to_string();
    let s = ready_state().with_limits(crate::HttpLimits {
        body_limit: 2 * review.len(),
        body_budget: 2 * review.len(),
        ..crate::HttpLimits::default()
    });
    let (tx, rx) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let mut tx = tx;
    let pending = Request::post("/ivpol/validate/ivory-pin-digests")
        .header("content-type", "application/json")
        .header("content-length", (2 * review.len()).to_string())
        .body(HttpBody::from_stream(rx))
        .unwrap();
    let stalled = tokio::spawn(router(s.clone()).oneshot(pending));
    tokio::task::yield_now().await;
    while s.body_budget.available() > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (status, text) = post(&s, "/ivpol/validate/ivory-pin-digests", review.clone()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        String::from_utf8_lossy(&text).contains("budget"),
        "{text:?}"
    );
    // The stalled client gives up: its bytes return to the budget.
    futures::SinkExt::send(&mut tx, Err(std::io::Error::other("reset")))
        .await
        .unwrap();
    let _ = stalled.await.unwrap();
    assert_eq!(s.body_budget.available(), 2 * review.len());
    let (status, _) = post(&s, "/ivpol/validate/ivory-pin-digests", review).await;
    assert_eq!(status, StatusCode::OK);
    let (_, metrics) = get(&s, "/metrics").await;
    assert!(
        metrics.contains(r#"reason="body_budget_exhausted"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn health_and_readiness() {
    let s = state(PolicyStore::default());
    assert_eq!(get(&s, "/healthz").await.0, StatusCode::OK);
    let (status, text) = get(&s, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    let (status, _) = post(
        &s,
        "/ivpol/validate/x",
        pod_review("u", "nginx").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    let s = ready_state();
    let (status, text) = get(&s, "/readyz").await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::OK, "ready: 1 policies loaded\n")
    );
}

fn hung_policy(failure: &str) -> CompiledPolicy {
    let text =
        default_policy_text().replace("failurePolicy: Fail", &format!("failurePolicy: {failure}"));
    let report = load_str(&text, "hung.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().next().unwrap()
}

fn default_policy_text() -> String {
    ivory_policy::DEFAULT_POLICY_YAML.to_owned()
}

#[tokio::test]
async fn hung_registry_is_answered_inside_the_timeout() {
    for (failure, allowed) in [("Fail", false), ("Ignore", true)] {
        let s = state(PolicyStore::with_policies(vec![hung_policy(failure)]));
        let started = ivory_clock::now();
        let body = pod_review("u-h", "hung.example/app:v1").to_string();
        let (status, bytes) = post(&s, "/ivpol/mutate/ivory-pin-digests?timeout=1s", body).await;
        let elapsed = started.elapsed();
        assert_eq!(status, StatusCode::OK);
        assert!(
            elapsed < Duration::from_millis(1000),
            "{failure}: took {elapsed:?}"
        );
        assert!(
            elapsed >= Duration::from_millis(850),
            "{failure}: took {elapsed:?}"
        );
        let resp = response_of(&bytes);
        assert_eq!(resp["allowed"], allowed, "{resp}");
        let text = resp.to_string();
        assert!(
            text.contains("hung.example/app:v1") && text.contains("registry hung.example"),
            "{text}"
        );
        assert!(
            text.contains("time budget of 89") || text.contains("time budget of 900ms"),
            "{text}"
        );
        let (_, metrics) = get(&s, "/metrics").await;
        assert!(
            metrics.contains(r#"ivory_deadline_expiries_total{route="ivpol_mutate"} 1"#),
            "{metrics}"
        );
    }
}

fn namespaced_policy(namespace: &str) -> CompiledPolicy {
    let text = ivory_policy::DEFAULT_POLICY_YAML
        .replace(
            "kind: ImageValidatingPolicy",
            "kind: NamespacedImageValidatingPolicy",
        )
        .replace(
            "name: ivory-pin-digests",
            &format!("name: team-pin\n  namespace: {namespace}"),
        );
    let report = load_str(&text, "team.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().next().unwrap()
}

#[tokio::test]
async fn namespaced_route_applies_only_in_the_policy_namespace() {
    let store = PolicyStore::with_policies(vec![
        namespaced_policy("default"),
        namespaced_policy("other"),
    ]);
    let s = state(store);
    let body = pod_review("n-1", "nginx:1.27").to_string();
    let (_, bytes) = post(&s, "/nivpol/mutate/team-pin", body).await;
    assert_eq!(response_of(&bytes)["patchType"], "JSONPatch");
    // Same name in another namespace only: known, not applied.
    let s = state(PolicyStore::with_policies(vec![namespaced_policy("other")]));
    let body = pod_review("n-2", "nginx:1.27").to_string();
    let (_, bytes) = post(&s, "/nivpol/mutate/team-pin", body).await;
    assert_eq!(response_of(&bytes), json!({"uid": "n-2", "allowed": true}));
    // The cluster route does not know namespaced policies.
    let body = pod_review("n-3", "nginx:1.27").to_string();
    let (_, bytes) = post(&s, "/ivpol/mutate/team-pin", body).await;
    assert_eq!(response_of(&bytes)["status"]["code"], 404);
}

/// `default` is labelled `tier: prod`, `dev` `tier: dev`; other namespaces are unknown.
struct Labelled;

impl NamespaceSource for Labelled {
    fn namespace<'a>(&'a self, name: &'a str, _: Instant) -> BoxFuture<'a, Option<Value>> {
        let tier = match name {
            "default" => Some("prod"),
            "dev" => Some("dev"),
            _ => None,
        };
        let object = tier.map(|t| json!({"metadata": {"name": name, "labels": {"tier": t}}}));
        async move { object }.boxed()
    }
}

fn in_namespace(uid: &str, namespace: &str) -> String {
    let mut review = pod_review(uid, "nginx:1.27");
    review["request"]["namespace"] = json!(namespace);
    review.to_string()
}

#[tokio::test]
async fn namespace_selectors_use_known_labels_and_trust_the_api_server_otherwise() {
    let text = ivory_policy::DEFAULT_POLICY_YAML.replace(
        "  matchConstraints:\n",
        "  matchConstraints:\n    namespaceSelector:\n      matchLabels: {tier: prod}\n",
    );
    let report = load_str(&text, "prod.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let path = "/ivpol/mutate/ivory-pin-digests";
    let patched = |bytes: &[u8]| response_of(bytes).get("patch").is_some();
    // Without a Namespace source (file mode) the labels are unknown: the API server, whose
    // webhook for this policy carries the selector, chose to call, so the policy applies.
    let s = state(PolicyStore::with_policies(report.policies.clone()));
    let (_, bytes) = post(&s, path, in_namespace("s-1", "default")).await;
    assert!(patched(&bytes), "{}", response_of(&bytes));
    // With a source, known labels decide; unknown ones are again left to the API server.
    let mut s = state(PolicyStore::with_policies(report.policies));
    s.namespaces = Some(Arc::new(Labelled));
    let (_, bytes) = post(&s, path, in_namespace("s-2", "default")).await;
    assert!(patched(&bytes));
    let (_, bytes) = post(&s, path, in_namespace("s-3", "dev")).await;
    assert_eq!(response_of(&bytes), json!({"uid": "s-3", "allowed": true}));
    let (_, bytes) = post(&s, path, in_namespace("s-4", "created-a-moment-ago")).await;
    assert!(patched(&bytes));
}

#[tokio::test]
async fn paths_without_policy_names_are_400() {
    let s = ready_state();
    for path in [
        "/ivpol/validate//",
        "/ivpol/validate/%2F",
        "/nivpol/mutate///",
    ] {
        let (status, bytes) = post(&s, path, pod_review("p", "nginx").to_string()).await;
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {text}");
        assert!(
            text.starts_with("ivory: the webhook path names no policy (expected /"),
            "{path}: {text}"
        );
    }
}

#[tokio::test]
async fn objects_policies_cannot_read_are_400_naming_the_field() {
    let s = ready_state();
    let cases = [
        (
            "/object",
            json!("a pod"),
            "request.object must be an object, found a string",
        ),
        (
            "/object",
            json!([1, 2]),
            "request.object must be an object, found a list",
        ),
        (
            "/object/spec",
            json!("x"),
            "request.object.spec must be an object",
        ),
        (
            "/object/spec/containers",
            json!({"image": "nginx"}),
            "request.object.spec.containers must be a list, found an object",
        ),
        (
            "/object/spec/containers/0/image",
            json!(["nginx"]),
            "request.object.spec.containers[0].image must be a string, found a list",
        ),
    ];
    for (pointer, value, expected) in cases {
        let mut review = pod_review("bad", "nginx:1.27");
        *review["request"].pointer_mut(pointer).unwrap() = value;
        for path in [
            "/ivpol/validate/ivory-pin-digests",
            "/ivpol/mutate/ivory-pin-digests",
        ] {
            let (status, bytes) = post(&s, path, review.to_string()).await;
            let text = String::from_utf8(bytes).unwrap();
            assert_eq!(status, StatusCode::BAD_REQUEST, "{pointer}: {text}");
            assert!(text.contains(expected), "{pointer}: {text}");
        }
    }
}

#[tokio::test]
async fn huge_timeouts_saturate() {
    let s = ready_state();
    let body = pod_review("t", "nginx:1.27").to_string();
    for query in [
        "timeout=10000000000000000000s",
        "timeout=99999999999999999999999h",
    ] {
        let path = format!("/ivpol/mutate/ivory-pin-digests?{query}");
        let (status, bytes) = post(&s, &path, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{query}");
        assert_eq!(response_of(&bytes)["patchType"], "JSONPatch");
    }
}

#[tokio::test]
async fn a_panic_is_answered_by_the_failure_policy_and_counted() {
    for (failure, allowed) in [("Fail", false), ("Ignore", true)] {
        let s = state(PolicyStore::with_policies(vec![hung_policy(failure)]));
        let body = pod_review("u-p", "panic.example/app:v1").to_string();
        let (status, bytes) = post(&s, "/ivpol/mutate/ivory-pin-digests", body).await;
        assert_eq!(status, StatusCode::OK);
        let resp = response_of(&bytes);
        assert_eq!(resp["uid"], "u-p");
        assert_eq!(resp["allowed"], allowed, "{resp}");
        assert!(
            resp.to_string()
                .contains("ivory: internal error evaluating policy ivory-pin-digests"),
            "{resp}"
        );
        let (_, metrics) = get(&s, "/metrics").await;
        assert!(
            metrics.contains(r#"ivory_admission_panics_total{route="ivpol_mutate"} 1"#),
            "{metrics}"
        );
        // A panic is no spent budget, whatever the failurePolicy answered.
        assert!(
            metrics.contains(r#"ivory_deadline_expiries_total{route="ivpol_mutate"} 0"#),
            "{metrics}"
        );
        // The server keeps serving.
        let body = pod_review("u-q", "nginx:1.27").to_string();
        let (_, bytes) = post(&s, "/ivpol/mutate/ivory-pin-digests", body).await;
        assert_eq!(response_of(&bytes)["patchType"], "JSONPatch");
    }
}

/// Secrets named `good` can be used; any other name cannot.
struct OnlyGood;

impl CredentialSource for OnlyGood {
    fn prepare<'a>(
        &'a self,
        policy_namespace: Option<&'a str>,
        credentials: &'a Credentials,
        _: Instant,
    ) -> BoxFuture<'a, Result<(), CredentialProblem>> {
        let bad = credentials
            .secrets
            .iter()
            .enumerate()
            .find(|(_, s)| s.as_str() != "good")
            .map(|(index, s)| CredentialError {
                index,
                reference: s.clone(),
                problem: SecretProblem::NotFound {
                    namespace: policy_namespace.unwrap_or("ivory").to_owned(),
                    name: s.clone(),
                    namespaced_policy: policy_namespace.is_some(),
                },
            });
        async move { bad.map_or(Ok(()), |e| Err(e.into())) }.boxed()
    }
}

fn with_secrets(name: &str, failure: &str, secret: &str) -> CompiledPolicy {
    let text = default_policy_text()
        .replace("name: ivory-pin-digests", &format!("name: {name}"))
        .replace("failurePolicy: Fail", &format!("failurePolicy: {failure}"))
        + &format!("  credentials:\n    secrets: [{secret}]\n");
    let report = load_str(&text, "creds.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().next().unwrap()
}

#[tokio::test]
async fn unusable_credentials_are_an_explicit_answer() {
    let policies = vec![
        with_secrets("fine", "Fail", "good"),
        with_secrets("strict", "Fail", "gone"),
        with_secrets("lenient", "Ignore", "gone"),
    ];
    let mut s = state(PolicyStore::with_policies(policies));
    s.credentials = Some(Arc::new(OnlyGood));
    let body = pod_review("c-1", "nginx:1.27").to_string();
    let (_, bytes) = post(&s, "/ivpol/mutate/fine/strict/lenient", body.clone()).await;
    let resp = response_of(&bytes);
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(
        resp["status"]["message"],
        "ivory: ImageValidatingPolicy strict: spec.credentials.secrets[0] \"gone\": Secret ivory/gone of type kubernetes.io/dockerconfigjson not found"
    );
    // An Ignore policy is skipped with a warning; the others still run.
    let (_, bytes) = post(&s, "/ivpol/mutate/fine/lenient", body).await;
    let resp = response_of(&bytes);
    assert_eq!(resp["allowed"], true, "{resp}");
    assert_eq!(resp["patchType"], "JSONPatch", "{resp}");
    assert_eq!(
        resp["warnings"],
        json!([
            "ivory: ImageValidatingPolicy lenient: spec.credentials.secrets[0] \"gone\": Secret ivory/gone of type kubernetes.io/dockerconfigjson not found"
        ])
    );
}

#[tokio::test]
async fn the_deadline_metric_follows_the_error_type_not_its_text() {
    let s = state(PolicyStore::with_policies(vec![hung_policy("Fail")]));
    let body = pod_review("u-l", "liar.example/app:v1").to_string();
    let (_, bytes) = post(&s, "/ivpol/mutate/ivory-pin-digests?timeout=5s", body).await;
    let resp = response_of(&bytes);
    assert_eq!(resp["allowed"], false, "{resp}");
    assert!(resp.to_string().contains("time budget of 1ms"), "{resp}");
    let (_, metrics) = get(&s, "/metrics").await;
    assert!(
        !metrics.contains(r#"ivory_deadline_expiries_total{route="ivpol_mutate"} 1"#),
        "{metrics}"
    );
}

/// Records every report update the router hands over.
#[derive(Default)]
struct RecordingSink(std::sync::Mutex<Vec<crate::policy_results::ReportUpdate>>);

impl crate::policy_results::ReportSink for RecordingSink {
    fn submit(&self, update: crate::policy_results::ReportUpdate) {
        self.0.lock().unwrap().push(update);
    }
}

/// A policy on `resources` with `actions` whose one validation holds, and whose
/// matchConditions are `condition`.
fn report_policy(name: &str, actions: &str, resources: &str, condition: &str) -> CompiledPolicy {
    let text = format!(
        "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata: {{name: {name}}}
spec:
  validationActions: [{actions}]
  matchConstraints:
    resourceRules: [{{apiGroups: [\"\", apps], apiVersions: [v1], operations: [CREATE], resources: [{resources}]}}]
  matchConditions: [{{name: gate, expression: \"{condition}\"}}]
  attestors: []
  validationConfigurations: {{verifyDigest: false, required: false, mutateDigest: false}}
  validations: [{{expression: \"true\"}}]
"
    );
    let report = load_str(&text, &format!("{name}.yaml"));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().next().unwrap()
}

#[tokio::test]
async fn only_deny_policies_that_produced_a_result_suppress_the_admission_report() {
    // Kyverno reports when no *evaluated* policy has Deny: a Deny policy on the same route that
    // does not match the object, or whose matchConditions are false, produces no result.
    let cases = [
        ("deployments", "true", true),
        ("pods", "false", true),
        ("pods", "true", false),
    ];
    for (deny_resources, deny_condition, reported) in cases {
        let mut s = state(PolicyStore::with_policies(vec![
            report_policy("audited", "Audit", "pods", "true"),
            report_policy("denying", "Deny", deny_resources, deny_condition),
        ]));
        let sink = Arc::new(RecordingSink::default());
        s.reports = Some(sink.clone());
        let mut review = pod_review("u-r", "nginx:1.27");
        review["request"]["dryRun"] = json!(false);
        review["request"]["object"]["metadata"]["uid"] = json!("uid-web");
        let (status, bytes) = post(&s, "/ivpol/validate/audited/denying", review.to_string()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(response_of(&bytes)["allowed"], true);
        let updates = sink.0.lock().unwrap();
        let case = format!("Deny policy on {deny_resources} with condition {deny_condition}");
        assert_eq!(updates.len(), usize::from(reported), "{case}");
        if reported {
            let policies: Vec<&str> = updates[0]
                .results
                .iter()
                .map(|r| r.policy.as_str())
                .collect();
            assert_eq!(policies, ["audited"], "{case}");
        }
    }
}

#[test]
fn outcomes_tell_a_failure_to_judge_from_a_judgement() {
    let result = |status: Status, exempted: bool| PolicyResult {
        policy: "p".into(),
        namespace: None,
        status,
        message: String::new(),
        properties: if exempted {
            BTreeMap::from([(EXCEPTIONS_PROPERTY.to_owned(), "e".to_owned())])
        } else {
            BTreeMap::new()
        },
        images: Vec::new(),
        deny: true,
        warn: false,
        audit: false,
    };
    let decision = |allowed: bool, results: Vec<PolicyResult>, warnings: Vec<String>| Decision {
        allowed,
        results,
        warnings,
        ..Decision::default()
    };
    let denied_error = decision(false, vec![result(Status::Error, false)], vec![]);
    assert_eq!(outcome(&denied_error, false), "failed_closed");
    let denied_both = decision(
        false,
        vec![result(Status::Error, false), result(Status::Fail, false)],
        vec![],
    );
    assert_eq!(outcome(&denied_both, false), "denied");
    let ignored = decision(true, vec![result(Status::Skip, false)], vec!["w".into()]);
    assert_eq!(outcome(&ignored, true), "failed_open");
    let exempted = decision(true, vec![result(Status::Skip, true)], vec![]);
    assert_eq!(
        outcome(&exempted, true),
        "patched",
        "an exception is a judgement"
    );
    let warned = decision(true, vec![result(Status::Pass, false)], vec!["w".into()]);
    assert_eq!(outcome(&warned, false), "warned");
    let plain = decision(true, vec![result(Status::Pass, false)], vec![]);
    assert_eq!(outcome(&plain, false), "allowed");
}

/// What a path and method that are not an admission route get, with the routes told apart by
/// hand: as axum's wildcard routes answered them.
#[tokio::test]
async fn paths_and_methods_are_answered_as_axums_routes_answered_them() {
    let s = ready_state();
    let cases: [(&str, &str, StatusCode, &str, &str); 10] = [
        (
            "GET",
            "/ivpol/validate/x",
            StatusCode::METHOD_NOT_ALLOWED,
            "POST",
            "",
        ),
        (
            "PUT",
            "/nivpol/mutate/x",
            StatusCode::METHOD_NOT_ALLOWED,
            "POST",
            "",
        ),
        ("POST", "/ivpol/validate/", StatusCode::NOT_FOUND, "", ""),
        ("GET", "/ivpol/validate/", StatusCode::NOT_FOUND, "", ""),
        ("POST", "/ivpol/validate", StatusCode::NOT_FOUND, "", ""),
        ("POST", "/ivpol/valid/x", StatusCode::NOT_FOUND, "", ""),
        ("POST", "//ivpol/validate/x", StatusCode::NOT_FOUND, "", ""),
        (
            "POST",
            "/healthz",
            StatusCode::METHOD_NOT_ALLOWED,
            "GET,HEAD",
            "",
        ),
        (
            "POST",
            "/ivpol/validate/%FF",
            StatusCode::BAD_REQUEST,
            "",
            "Invalid URL: Invalid UTF-8 in `names`",
        ),
        (
            "POST",
            "/ivpol/validate/x/",
            StatusCode::OK,
            "",
            "{\"apiVersion\"",
        ),
    ];
    for (method, path, status, allow, body) in cases {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(HttpBody::from(pod_review("p", "nginx").to_string()))
            .unwrap();
        let resp = router(s.clone()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), status, "{method} {path}");
        let allowed = resp
            .headers()
            .get("allow")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(allowed.unwrap_or_default(), allow, "{method} {path}");
        let text = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let text = String::from_utf8_lossy(&text);
        assert!(text.starts_with(body), "{method} {path}: {text}");
        if body.is_empty() {
            assert!(text.is_empty(), "{method} {path}: {text}");
        }
    }
    // Percent-encoded names are decoded, as the wildcard decoded them: the default policy is
    // found by its encoded name, and an unknown name is reported decoded.
    let (status, bytes) = post(
        &s,
        "/ivpol/mutate/ivory%2Dpin%2Ddigests",
        pod_review("p", "nginx").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let resp = response_of(&bytes);
    assert_eq!(
        (resp["uid"].as_str(), resp["allowed"].as_bool()),
        (Some("p"), Some(true))
    );
    assert!(resp["patch"].is_string(), "{resp}");
    let (_, bytes) = post(
        &s,
        "/ivpol/mutate/no%20such",
        pod_review("q", "nginx").to_string(),
    )
    .await;
    let resp = response_of(&bytes);
    assert_eq!(resp["status"]["code"], 404, "{resp}");
    let msg = resp["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("policies: no such"), "{msg}");
}
