use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use ivory_policy::CompiledPolicy;
use ivory_policy::types::Credentials;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::*;
use crate::decision::Status;
use crate::resources::NoResources;
use crate::testing::{FakeVerifier, Mode};

const KEY: &str = "          -----BEGIN PUBLIC KEY-----
          MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv
          DLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==
          -----END PUBLIC KEY-----
";

/// A cluster policy verifying every container image with key attestor `cosign`.
fn policy(name: &str, failure: &str, extra: &str) -> CompiledPolicy {
    let yaml = format!(
        "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata: {{name: {name}}}
spec:
  failurePolicy: {failure}
  validationActions: [Deny]
  matchConstraints:
    resourceRules:
    - {{apiGroups: [''], apiVersions: [v1], operations: [CREATE], resources: [pods]}}
  validationConfigurations: {{verifyDigest: false, mutateDigest: false}}
{extra}  attestors:
  - name: cosign
    cosign:
      key:
        data: |
{KEY}  validations:
  - expression: images.containers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0)
    message: unsigned
"
    );
    let report = ivory_policy::load_str(&yaml, "test.yaml");
    assert!(report.errors.is_empty(), "{yaml}\n{:?}", report.errors);
    report.policies.into_iter().next().expect("one policy")
}

fn pod(image: Value) -> AdmissionRequest {
    serde_json::from_value(json!({
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "web",
        "namespace": "team",
        "operation": "CREATE",
        "object": {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "web", "namespace": "team"},
                   "spec": {"containers": [{"name": "app", "image": image}]}},
    }))
    .expect("valid AdmissionRequest")
}

fn soon() -> Instant {
    ivory_clock::now() + Duration::from_secs(5)
}

async fn judge(
    pipeline: &Pipeline<'_>,
    policies: &[&CompiledPolicy],
    req: &mut AdmissionRequest,
) -> Judged {
    pipeline
        .judge(Stage::Validate, policies, req, soon())
        .await
        .expect("a well-formed request")
}

#[tokio::test]
async fn signed_images_pass_and_unsigned_ones_are_denied() {
    let verifier = FakeVerifier::new().sign("reg.example/app:1", "cosign");
    let pipeline = Pipeline::new(&verifier, &NoResources);
    let p = policy("signed", "Fail", "");
    let judged = judge(&pipeline, &[&p], &mut pod(json!("reg.example/app:1"))).await;
    assert!(judged.decision.allowed, "{:?}", judged.decision);
    assert_eq!(judged.decision.results[0].status, Status::Pass);
    let judged = judge(&pipeline, &[&p], &mut pod(json!("reg.example/app:2"))).await;
    assert!(!judged.decision.allowed);
    assert_eq!(
        judged.decision.message.as_deref(),
        Some("Policy signed failed: unsigned")
    );
}

#[tokio::test]
async fn a_misshapen_object_is_refused_naming_the_field_whatever_the_stage() {
    let verifier = FakeVerifier::new();
    let pipeline = Pipeline::new(&verifier, &NoResources);
    let p = policy("signed", "Fail", "");
    for stage in [Stage::Mutate, Stage::Validate] {
        let mut req = pod(json!(["reg.example/app:1"]));
        let err = pipeline
            .judge(stage, &[&p], &mut req, soon())
            .await
            .expect_err("a list is no image");
        assert_eq!(err.field, "object.spec.containers[0].image", "{stage:?}");
    }
    assert_eq!(verifier.calls() + verifier.resolves(), 0);
    // Without selected policies nothing reads the object: it is not judged, so not refused.
    let judged = pipeline
        .judge(Stage::Validate, &[], &mut pod(json!(7)), soon())
        .await
        .expect("nothing selected");
    assert!(judged.decision.allowed);
}

/// Answers for Namespace `known` only.
struct OneNamespace;

impl NamespaceSource for OneNamespace {
    fn namespace<'a>(&'a self, name: &'a str, _: Instant) -> BoxFuture<'a, Option<Value>> {
        let known = (name == "known").then(|| json!({"metadata": {"name": "known"}}));
        async move { known }.boxed()
    }
}

#[tokio::test]
async fn namespace_labels_are_unknown_only_when_a_source_cannot_tell() {
    let verifier = FakeVerifier::new().sign("reg.example/app:1", "cosign");
    let p = policy("signed", "Fail", "");
    let mut pipeline = Pipeline::new(&verifier, &NoResources);
    let cases: [(Namespaces<'_>, &str, bool); 4] = [
        (Namespaces::Given(None), "team", false),
        (Namespaces::Unknown, "team", true),
        (Namespaces::Source(&OneNamespace), "known", false),
        (Namespaces::Source(&OneNamespace), "team", true),
    ];
    for (namespaces, namespace, unknown) in cases {
        pipeline.namespaces = namespaces;
        let mut req = pod(json!("reg.example/app:1"));
        req.namespace = namespace.to_owned();
        let judged = judge(&pipeline, &[&p], &mut req).await;
        assert!(judged.decision.allowed);
        assert_eq!(req.namespace_labels_unknown, unknown, "{namespace}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_backstop_answers_for_a_stage_that_overruns_by_the_failure_policy() {
    let verifier = FakeVerifier::new().mode(Mode::Hang);
    let mut pipeline = Pipeline::new(&verifier, &NoResources);
    let budget = Duration::from_secs(2);
    for (failure, allowed) in [("Fail", false), ("Ignore", true)] {
        let p = policy("hung", failure, "");
        pipeline.backstop = Some(Backstop {
            at: ivory_clock::now() + budget,
            budget,
        });
        // The deadline is later than the backstop: only the backstop can answer in time.
        let deadline = ivory_clock::now() + Duration::from_secs(3600);
        let mut req = pod(json!("reg.example/app:1"));
        let judged = pipeline
            .judge(Stage::Validate, &[&p], &mut req, deadline)
            .await
            .expect("well formed");
        let d = Arc::unwrap_or_clone(judged.decision);
        assert_eq!(d.allowed, allowed, "{failure}: {d:?}");
        assert!(d.budget_exhausted, "{failure}");
        let said = d.message.or_else(|| d.warnings.first().cloned());
        assert_eq!(
            said.as_deref(),
            Some("ivory: time budget of 2000ms exhausted before policies hung finished"),
            "{failure}"
        );
    }
}

#[tokio::test]
async fn a_panic_in_the_stage_is_contained_and_answered_by_the_failure_policy() {
    let verifier = FakeVerifier::new().mode(Mode::Panic);
    let pipeline = Pipeline::new(&verifier, &NoResources);
    for (failure, allowed) in [("Fail", false), ("Ignore", true)] {
        let p = policy("boom", failure, "");
        let judged = judge(&pipeline, &[&p], &mut pod(json!("reg.example/app:1"))).await;
        assert!(
            judged
                .panic
                .as_deref()
                .is_some_and(|t| t.contains("the fake verifier panics")),
            "{:?}",
            judged.panic
        );
        assert_eq!(judged.decision.allowed, allowed, "{failure}");
        assert!(
            !judged.decision.budget_exhausted,
            "a panic is no spent budget"
        );
    }
}

/// Refuses every Secret; counts the calls.
#[derive(Default)]
struct NoSecrets(AtomicUsize);

impl CredentialSource for NoSecrets {
    fn prepare<'a>(
        &'a self,
        _: Option<&'a str>,
        credentials: &'a Credentials,
        _: Instant,
    ) -> BoxFuture<'a, Result<(), CredentialProblem>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let name = credentials.secrets.first().cloned().unwrap_or_default();
        async move { Err(format!("Secret {name} not found").into()) }.boxed()
    }
}

#[tokio::test]
async fn unusable_credentials_follow_the_failure_policy_and_only_when_prepared() {
    let verifier = FakeVerifier::new().sign("reg.example/app:1", "cosign");
    let secrets = NoSecrets::default();
    let with_secret = "  credentials: {secrets: [pull]}\n";
    let fail = policy("fail", "Fail", with_secret);
    let ignore = policy("ignore", "Ignore", with_secret);
    let mut pipeline = Pipeline::new(&verifier, &NoResources);
    // Without a source the verifier's resolver decides alone: the policy is evaluated.
    let judged = judge(&pipeline, &[&fail], &mut pod(json!("reg.example/app:1"))).await;
    assert!(judged.decision.allowed);
    pipeline.credentials = Some(&secrets);
    let judged = judge(&pipeline, &[&fail], &mut pod(json!("reg.example/app:1"))).await;
    assert!(!judged.decision.allowed);
    assert_eq!(
        judged.decision.message.as_deref(),
        Some("ivory: ImageValidatingPolicy fail: Secret pull not found")
    );
    let judged = judge(&pipeline, &[&ignore], &mut pod(json!("reg.example/app:1"))).await;
    assert!(judged.decision.allowed);
    assert_eq!(
        judged.decision.warnings,
        ["ivory: ImageValidatingPolicy ignore: Secret pull not found"]
    );
    assert!(judged.decision.results.is_empty(), "the policy did not run");
    assert_eq!(secrets.0.load(Ordering::SeqCst), 2);
}
