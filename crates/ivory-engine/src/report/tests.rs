use std::sync::Arc;
use std::time::Duration;

use ivory_policy::CompiledPolicy;
use serde_json::json;

use super::*;
use crate::testing::{FakeVerifier, Mode};

#[test]
fn pinning_keeps_the_tag() {
    assert_eq!(pinned("r/a:v1", "sha256:ab"), "r/a:v1@sha256:ab");
    assert_eq!(pinned("r/a@sha256:ab", "sha256:ab"), "r/a@sha256:ab");
}

#[test]
fn repositories_of_references() {
    assert_eq!(repository("h:5000/a/b:v1"), "h:5000/a/b");
    assert_eq!(repository("h:5000/a/b"), "h:5000/a/b");
    assert_eq!(repository("h:5000/a/b:v1@sha256:aa"), "h:5000/a/b");
    assert_eq!(repository("h/a@sha256:aa"), "h/a");
    assert_eq!(verification_key("h/a:v1", "sha256:aa"), "h/a@sha256:aa");
}

/// A policy requiring a signature by a key on every image, with `failurePolicy` (the one
/// `ivory verify --key` builds).
fn key_policy(failure_policy: &str) -> Vec<Arc<CompiledPolicy>> {
    let pem = include_str!("../../../../fixtures/keys/cosign-p256.pub");
    let doc = json!({
        "apiVersion": "policies.kyverno.io/v1",
        "kind": "ImageValidatingPolicy",
        "metadata": {"name": "key-policy"},
        "spec": {
            "failurePolicy": failure_policy,
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["pods"],
            }]},
            "matchImageReferences": [{"glob": "*"}],
            "attestors": [{
                "name": "key",
                "cosign": {"key": {"data": pem}, "ctlog": {"url": "https://rekor.sigstore.dev"}},
            }],
            "validations": [{
                "expression": "images.containers.map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)",
                "message": "failed the image signature verification with the --key flags",
            }],
        },
    });
    let report = ivory_policy::load_str(&doc.to_string(), "test");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().map(Arc::new).collect()
}

#[tokio::test]
async fn the_verdict_follows_the_answers_type_not_its_text() {
    let image = "r.test/app:1";
    // A registry failure worded like a spent budget is still a registry failure.
    let lookalike =
        Mode::UnavailableSaying("time budget of 5ms exhausted while verifying signatures");
    let cases = [
        // (how verifications answer, failurePolicy, verdict, policy status, attestor result)
        (
            Mode::Answer,
            "Fail",
            Verdict::Fail,
            Status::Fail,
            AttestorResult::Failed,
        ),
        (
            Mode::Answer,
            "Ignore",
            Verdict::Fail,
            Status::Fail,
            AttestorResult::Failed,
        ),
        (
            Mode::Deadline,
            "Fail",
            Verdict::Error,
            Status::Error,
            AttestorResult::Error,
        ),
        // Only a spent budget goes through the failurePolicy: Ignore skips the policy.
        (
            Mode::Deadline,
            "Ignore",
            Verdict::Pass,
            Status::Skip,
            AttestorResult::Error,
        ),
        (
            lookalike,
            "Fail",
            Verdict::Error,
            Status::Error,
            AttestorResult::Error,
        ),
        (
            lookalike,
            "Ignore",
            Verdict::Error,
            Status::Error,
            AttestorResult::Error,
        ),
    ];
    for (answer, failure_policy, verdict, status, attestor) in cases {
        let case = format!("{answer:?} under {failure_policy}");
        let checker = ImageChecker {
            verifier: Arc::new(FakeVerifier::new().verifying(answer)),
            policies: key_policy(failure_policy),
            timeout: Duration::from_secs(5),
            namespace: "default".into(),
            exceptions: None,
            resources: Arc::new(crate::resources::NoResources),
            namespace_object: None,
        };
        let report = checker.check(image).await;
        assert_eq!(report.verdict, verdict, "{case}: {report:?}");
        assert_eq!(report.policies.len(), 1, "{case}: {report:?}");
        assert_eq!(report.policies[0].result, status, "{case}: {report:?}");
        if status != Status::Skip {
            assert_eq!(
                report.policies[0].attestors[0].result, attestor,
                "{case}: {report:?}"
            );
        }
    }
}
