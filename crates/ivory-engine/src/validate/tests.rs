//! Table-driven tests of the validating stage against an in-memory verifier.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use ivory_policy::CompiledPolicy;
use ivory_policy::types::Credentials;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{MAX_VERIFIED_ANNOTATION_BYTES, SKIPPED_ANNOTATION, VERIFIED_ANNOTATION, validate};
use crate::admission::AdmissionRequest;
use crate::decision::{Decision, Status};
use crate::resources::NoResources;
use crate::testing::{FakeVerifier, Mode};
use crate::verifier::{
    ImagePlatform, ImageReference, ImageVerifier, Verification, VerifyError, VerifyRequest,
};

const SIGNED: &str = "ghcr.io/kyverno/test-verify-image:signed";
const UNSIGNED: &str = "ghcr.io/kyverno/test-verify-image:unsigned";
const PINNED: &str =
    "ghcr.io/org/tool@sha256:abababababababababababababababababababababababababababababababab";

const KEY: &str = "        -----BEGIN PUBLIC KEY-----
        MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv
        DLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==
        -----END PUBLIC KEY-----
";

pub(super) const PODS: &str = "matchConstraints:
  resourceRules:
  - apiGroups: ['']
    apiVersions: ['v1']
    operations: ['CREATE', 'UPDATE', 'DELETE']
    resources: ['pods', 'pods/ephemeralcontainers']
";

const VERIFY_ALL: &str = "validations:
- expression: >-
    (images.containers + images.initContainers + images.ephemeralContainers)
      .map(image, verifyImageSignatures(image, [attestors.cosign])).all(e, e > 0)
  message: failed the image Signature verification
";

/// A cosign key attestor named `name`.
fn key_attestor(name: &str) -> String {
    format!("- name: {name}\n  cosign:\n    key:\n      data: |\n{KEY}")
}

pub(super) fn attestors(names: &[&str]) -> String {
    let list: String = names.iter().map(|n| key_attestor(n)).collect();
    format!("attestors:\n{list}")
}

fn load(yaml: &str) -> CompiledPolicy {
    let report = ivory_policy::load_str(yaml, "test.yaml");
    assert!(report.errors.is_empty(), "{yaml}\n{:?}", report.errors);
    report.policies.into_iter().next().expect("one policy")
}

/// An ImageValidatingPolicy `name` whose spec is `spec` (unindented YAML).
pub(super) fn policy(name: &str, spec: &str) -> CompiledPolicy {
    let body: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    load(&format!(
        "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata:\n  name: {name}\nspec:\n{body}"
    ))
}

/// A policy on pods with `matchImageReferences: ghcr.io/*`, key attestor `cosign` and `extra`.
fn pod_policy(name: &str, extra: &str) -> CompiledPolicy {
    policy(
        name,
        &format!(
            "{PODS}matchImageReferences:\n- glob: 'ghcr.io/*'\n{}{extra}",
            attestors(&["cosign"])
        ),
    )
}

fn no_digest(extra: &str) -> String {
    format!("validationConfigurations:\n  verifyDigest: false\n{extra}")
}

/// Neither `verifyDigest` nor `required`.
fn lenient(extra: &str) -> String {
    format!("validationConfigurations:\n  verifyDigest: false\n  required: false\n{extra}")
}

fn containers(images: &[&str]) -> Value {
    images
        .iter()
        .enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect()
}

/// A Pod AdmissionRequest.
fn pod(
    op: &str,
    app: &[&str],
    init: &[&str],
    ephemeral: &[&str],
    annotations: Value,
) -> AdmissionRequest {
    let object = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}, "annotations": annotations},
        "spec": {
            "containers": containers(app),
            "initContainers": containers(init),
            "ephemeralContainers": containers(ephemeral),
        },
    });
    let (object, old) = match op {
        "DELETE" => (Value::Null, object),
        _ => (object, Value::Null),
    };
    request(json!({
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "web",
        "namespace": "default",
        "operation": op,
        "userInfo": {"username": "alice"},
        "object": object,
        "oldObject": old,
    }))
}

fn create(app: &[&str]) -> AdmissionRequest {
    pod("CREATE", app, &[], &[], json!({}))
}

fn request(json: Value) -> AdmissionRequest {
    serde_json::from_value(json).expect("valid AdmissionRequest")
}

async fn run(
    verifier: &FakeVerifier,
    policies: &[&CompiledPolicy],
    req: &AdmissionRequest,
) -> Decision {
    validate(
        verifier,
        &NoResources,
        policies,
        req,
        None,
        ivory_clock::now() + Duration::from_secs(10),
    )
    .await
}

fn statuses(d: &Decision) -> Vec<(String, Status, String)> {
    d.results
        .iter()
        .map(|r| (r.policy.clone(), r.status, r.message.clone()))
        .collect()
}

#[tokio::test]
async fn signed_and_unsigned_images() {
    let pol = pod_policy("sig", &no_digest(VERIFY_ALL));
    let denied = "Policy sig failed: failed the image Signature verification";
    let cases: &[(&[&str], Option<&str>, usize)] = &[
        (&[SIGNED], None, 1),
        (&[UNSIGNED], Some(denied), 1),
        (&[SIGNED, UNSIGNED], Some(denied), 2),
        // Not selected by matchImageReferences: never verified, nothing required of it.
        (&["nginx:1.27"], None, 0),
    ];
    for (images, message, calls) in cases {
        let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
        let d = run(&verifier, &[&pol], &create(images)).await;
        assert_eq!(d.message.as_deref(), *message, "{images:?}");
        assert_eq!(d.allowed, message.is_none(), "{images:?}");
        assert_eq!(verifier.calls(), *calls, "{images:?}");
    }
}

/// Answers every verification at once from [`FakeVerifier`]'s tables, as a verifier whose
/// cache holds the verdicts does; its `verify` fails, and counts how often it was asked.
struct Knowing {
    tables: FakeVerifier,
    asked: AtomicUsize,
}

impl ImageVerifier for Knowing {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a Credentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        self.tables.resolve_digest(image, credentials, deadline)
    }

    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        _deadline: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let failed = VerifyError::Unavailable {
            image: request.image.original().to_owned(),
            registry: String::new(),
            message: "asked although the answer was known".into(),
        };
        async move { Err(failed) }.boxed()
    }

    fn verify_known(&self, request: &VerifyRequest) -> Option<Verification> {
        let deadline = ivory_clock::now() + Duration::from_secs(10);
        self.tables.verify(request, deadline).now_or_never()?.ok()
    }

    fn image_data<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a Credentials>,
        platform: &'a ImagePlatform,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        self.tables
            .image_data(image, credentials, platform, deadline)
    }
}

/// A verdict the verifier knows at once is the prefetch's answer: `verify` is not asked, and
/// the decision is the one the same verdicts reached through `verify` give.
#[tokio::test]
async fn verdicts_known_at_once_decide_as_verified_ones_without_asking_again() {
    let pol = pod_policy("sig", &no_digest(VERIFY_ALL));
    for images in [&[SIGNED][..], &[UNSIGNED], &[SIGNED, UNSIGNED]] {
        let req = create(images);
        let fresh = run(&FakeVerifier::new().sign(SIGNED, "cosign"), &[&pol], &req).await;
        let knowing = Knowing {
            tables: FakeVerifier::new().sign(SIGNED, "cosign"),
            asked: Default::default(),
        };
        let known = validate(
            &knowing,
            &NoResources,
            &[&pol],
            &req,
            None,
            ivory_clock::now() + Duration::from_secs(10),
        )
        .await;
        assert_eq!(known, fresh, "{images:?}");
        assert_eq!(knowing.asked.load(Ordering::SeqCst), 0);
        assert_eq!(knowing.tables.calls(), images.len(), "{images:?}");
    }
}

/// An admitted request carries who signed what it verified (`verified-images`), from the
/// verifier's answers only: a forged annotation on the Pod is not evidence, a denied request
/// gets none, and the value is bounded however many images a Pod names.
#[tokio::test]
async fn admitted_requests_name_the_verified_digests_and_their_signers() {
    let pol = pod_policy("sig", &no_digest(VERIFY_ALL));
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    let forged = json!({"verified-images": "[{\"image\":\"evil\"}]"});
    let d = run(
        &verifier,
        &[&pol],
        &pod("CREATE", &[SIGNED], &[], &[], forged),
    )
    .await;
    assert!(d.allowed, "{d:?}");
    let value: Value = serde_json::from_str(&d.audit_annotations[VERIFIED_ANNOTATION]).unwrap();
    assert_eq!(
        value,
        json!([{
            "image": SIGNED,
            "digest": crate::testing::DIGEST,
            "policy": "sig",
            "attestor": "cosign",
            "key": "sha256:cosign",
            "logIndex": 42,
        }])
    );

    let denied = run(&verifier, &[&pol], &create(&[SIGNED, UNSIGNED])).await;
    assert!(!denied.allowed);
    assert!(!denied.audit_annotations.contains_key(VERIFIED_ANNOTATION));

    let many: Vec<String> = (0..400)
        .map(|i| format!("ghcr.io/kyverno/{}{i}:v1", "x".repeat(200)))
        .collect();
    let verifier = many
        .iter()
        .fold(FakeVerifier::new(), |v, image| v.sign(image, "cosign"));
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let d = run(&verifier, &[&pol], &create(&refs)).await;
    assert!(d.allowed, "{d:?}");
    let text = &d.audit_annotations[VERIFIED_ANNOTATION];
    assert!(
        text.len() <= MAX_VERIFIED_ANNOTATION_BYTES,
        "{}",
        text.len()
    );
    let value: Value = serde_json::from_str(text).unwrap();
    let entries = value.as_array().unwrap();
    let omitted = entries.last().unwrap()["omitted"].as_u64().unwrap();
    assert_eq!(entries.len() - 1 + omitted as usize, 400);
    assert!(entries[0]["image"].as_str().unwrap().chars().count() <= 256);
}

#[tokio::test]
async fn attestor_count_semantics() {
    let any = "images.containers.map(i, verifyImageSignatures(i, [attestors.a, attestors.b])).all(e, e > 0)";
    let all = "images.containers.map(i, verifyImageSignatures(i, [attestors.a, attestors.b])).all(e, e == size([attestors.a, attestors.b]))";
    let cases: &[(&str, &[&str], bool)] = &[
        (any, &["a"], true),
        (any, &["a", "b"], true),
        (any, &[], false),
        (all, &["a"], false),
        (all, &["a", "b"], true),
    ];
    for (expr, signers, allowed) in cases {
        let pol = policy(
            "count",
            &format!(
                "{PODS}{}{}validations:\n- expression: '{expr}'\n",
                attestors(&["a", "b"]),
                no_digest("")
            ),
        );
        let verifier = signers
            .iter()
            .fold(FakeVerifier::new(), |v, s| v.sign(SIGNED, s));
        let d = run(&verifier, &[&pol], &create(&[SIGNED])).await;
        assert_eq!(
            d.allowed, *allowed,
            "{expr} signed by {signers:?}: {:?}",
            d.message
        );
        // One signer is enough for `required` in every case where any attestor verified.
        if !allowed && !signers.is_empty() {
            assert_eq!(
                d.message.as_deref(),
                Some("Policy count failed: CEL expression validation failed at index 0")
            );
        }
    }
}

/// Kyverno example (d): keyless attestor, in-toto attestation, extractPayload.
const EXAMPLE_D: &str = r#"apiVersion: policies.kyverno.io/v1beta1
kind: ImageValidatingPolicy
metadata:
  name: ivpol-cosign-attestation-extract-cache
spec:
  webhookConfiguration:
    timeoutSeconds: 30
  failurePolicy: Fail
  validationActions: [Deny]
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods"]
  matchImageReferences:
    - glob: ghcr.io/kyverno/test-images/cosign:*
  validationConfigurations:
    mutateDigest: false
    verifyDigest: false
    required: false
  attestors:
    - name: cosign
      cosign:
        keyless:
          identities:
            - issuer: https://token.actions.githubusercontent.com
              subject: https://github.com/kyverno/test-images/.github/workflows/cosign.yml@refs/heads/main
        ctlog:
          url: https://rekor.sigstore.dev
          insecureIgnoreSCT: true
  attestations:
    - name: slsa
      intoto:
        type: https://slsa.dev/provenance/v1
  validations:
    - expression: >-
        images.containers.map(image, verifyAttestationSignatures(image, attestations.slsa, [attestors.cosign])).all(e, e > 0)
      message: failed to verify SLSA intoto attestation with Cosign keyless
    - expression: >-
        images.containers.map(image, has(extractPayload(image, attestations.slsa).predicate.buildDefinition)).all(e, e)
      message: failed to extract SLSA intoto attestation payload after verification
"#;

#[tokio::test]
async fn example_d_attestation_and_payload() {
    let pol = load(EXAMPLE_D);
    let image = "ghcr.io/kyverno/test-images/cosign:v3-keyless";
    let statement = |predicate: Value| json!({"_type": "https://in-toto.io/Statement/v1", "subject": [], "predicateType": "https://slsa.dev/provenance/v1", "predicate": predicate});
    let name = "Policy ivpol-cosign-attestation-extract-cache failed";
    let cases = [
        (
            FakeVerifier::new().attest(
                image,
                "cosign",
                "slsa",
                statement(json!({"buildDefinition": {}})),
            ),
            None,
        ),
        (
            FakeVerifier::new().attest(
                image,
                "cosign",
                "slsa",
                statement(json!({"runDetails": {}})),
            ),
            Some(format!(
                "{name}: failed to extract SLSA intoto attestation payload after verification"
            )),
        ),
        (
            // Signed, but the attestation is absent.
            FakeVerifier::new().sign(image, "cosign"),
            Some(format!(
                "{name}: failed to verify SLSA intoto attestation with Cosign keyless"
            )),
        ),
    ];
    for (verifier, message) in cases {
        let d = run(&verifier, &[&pol], &create(&[image])).await;
        assert_eq!(d.message, message);
        let requests = verifier.requests();
        assert_eq!(
            requests.len(),
            1,
            "one image × one attestation × one attestor"
        );
        assert_eq!(
            requests[0].attestation.as_ref().map(|a| a.name.as_str()),
            Some("slsa")
        );
    }
}

#[tokio::test]
async fn payload_is_never_returned_before_verification() {
    let image = "ghcr.io/a/b:1";
    let pol = pod_policy(
        "payload",
        &no_digest(
            "attestations:\n- name: slsa\n  intoto:\n    type: https://slsa.dev/provenance/v1\nvalidations:\n- expression: \"images.containers.all(i, extractPayload(i, attestations.slsa).predicateType != '')\"\n",
        ),
    );
    let verifier =
        FakeVerifier::new().attest(image, "cosign", "slsa", json!({"predicateType": "x"}));
    let d = run(&verifier, &[&pol], &create(&[image])).await;
    let message = d.message.unwrap();
    assert!(
        message.starts_with("Policy payload error: failed to evaluate policy: "),
        "{message}"
    );
    assert!(
        message.contains("failed to get payload: intoto attestation payload cannot be fetch before verifying intoto attestation"),
        "{message}"
    );
}

#[tokio::test]
async fn host_answers_outside_the_prefetched_set() {
    let notary = "attestors:\n- name: notary\n  notary:\n    certs:\n      value: |-\n        -----BEGIN CERTIFICATE-----\n        MIIDTTCCAjWgAwIBAgIJAPI+zAzn4s0xMA0GCSqGSIb3DQEBCwUAMEwxCzAJBgNV\n        -----END CERTIFICATE-----\n";
    let slsa = "attestations:\n- name: slsa\n  intoto:\n    type: https://slsa.dev/provenance/v1\n";
    let cases: [(String, Result<(), &str>); 4] = [
        // Images outside matchImageReferences count 0, as in Kyverno.
        (
            format!(
                "{}validations:\n- expression: \"verifyImageSignatures('docker.io/library/nginx:1', [attestors.cosign]) == 0\"\n",
                attestors(&["cosign"])
            ),
            Ok(()),
        ),
        (
            format!(
                "{}validations:\n- expression: \"verifyImageSignatures('ghcr.io/not/extracted:1', [attestors.cosign]) == 0\"\n",
                attestors(&["cosign"])
            ),
            Err("signature of image ghcr.io/not/extracted:1 was not verified by attestor cosign"),
        ),
        (
            format!(
                "{}validations:\n- expression: \"images.containers.all(i, verifyAttestationSignatures(i, 'nope', [attestors.cosign]) > 0)\"\n",
                attestors(&["cosign"])
            ),
            Err("attestation not found in policy: nope"),
        ),
        (
            format!(
                "{notary}{slsa}validations:\n- expression: \"images.containers.all(i, verifyAttestationSignatures(i, attestations.slsa, [attestors.notary]) > 0)\"\n"
            ),
            Err("notary verifier only supports oci 1.1 referrers as attestations"),
        ),
    ];
    for (spec, expected) in cases {
        let pol = policy(
            "host",
            &format!(
                "{PODS}matchImageReferences:\n- glob: 'ghcr.io/*'\n{}",
                lenient(&spec)
            ),
        );
        let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
        let d = run(&verifier, &[&pol], &create(&[SIGNED])).await;
        match expected {
            Ok(()) => assert!(d.allowed, "{spec}: {:?}", d.message),
            Err(text) => {
                let message = d.message.unwrap_or_default();
                assert!(
                    message.starts_with("Policy host error: failed to evaluate policy: "),
                    "{message}"
                );
                assert!(message.contains(text), "{message}");
            }
        }
    }
}

#[tokio::test]
async fn failure_messages() {
    let cases = [
        ("message: static text\n", "static text"),
        (
            "message: static text\n  messageExpression: \"'name is ' + object.metadata.name\"\n",
            "name is web",
        ),
        // An empty messageExpression result falls back to message.
        (
            "message: static text\n  messageExpression: \"''\"\n",
            "static text",
        ),
        ("{}\n", "CEL expression validation failed at index 1"),
    ];
    for (fields, expected) in cases {
        let fields = fields.replace("{}\n", "");
        let pol = pod_policy(
            "msg",
            &lenient(&format!(
                "validations:\n- expression: 'true'\n- expression: 'false'\n  {fields}"
            )),
        );
        let d = run(&FakeVerifier::new(), &[&pol], &create(&[SIGNED])).await;
        assert_eq!(
            d.message,
            Some(format!("Policy msg failed: {expected}")),
            "{fields}"
        );
    }
}

#[tokio::test]
async fn cel_runtime_error_is_a_policy_error() {
    let pol = pod_policy(
        "boom",
        &no_digest("validations:\n- expression: 'object.spec.nothing.here == 1'\n"),
    );
    let d = run(&FakeVerifier::new(), &[&pol], &create(&[SIGNED])).await;
    assert!(!d.allowed);
    let message = d.message.unwrap();
    assert!(
        message.starts_with("Policy boom error: failed to evaluate policy: "),
        "{message}"
    );
    assert_eq!(d.results[0].status, Status::Error);
}

#[tokio::test]
async fn match_condition_errors_follow_failure_policy() {
    for (failure_policy, matched) in [("Ignore", false), ("Fail", true)] {
        let pol = pod_policy(
            "cond",
            &format!(
                "failurePolicy: {failure_policy}\nmatchConditions:\n- name: broken\n  expression: \"object.metadata.labels.missing == 'x'\"\n{}",
                no_digest(VERIFY_ALL)
            ),
        );
        let d = run(&FakeVerifier::new(), &[&pol], &create(&[UNSIGNED])).await;
        if matched {
            assert!(!d.allowed);
            let message = d.message.unwrap();
            assert!(
                message.starts_with("Policy cond error: failed to evaluate policy: "),
                "{message}"
            );
            assert!(message.contains("broken"), "{message}");
        } else {
            assert!(d.allowed);
            assert!(d.results.is_empty(), "not matched is not listed");
        }
    }
    // A false condition skips the policy even when another condition errors.
    let pol = pod_policy(
        "cond",
        &format!(
            "matchConditions:\n- name: broken\n  expression: \"object.metadata.labels.missing == 'x'\"\n- name: never\n  expression: 'false'\n{}",
            no_digest(VERIFY_ALL)
        ),
    );
    let d = run(&FakeVerifier::new(), &[&pol], &create(&[UNSIGNED])).await;
    assert!(d.allowed && d.results.is_empty());
}

#[tokio::test]
async fn variables_are_lazy() {
    let cases = [
        // An erroring variable nobody reads is harmless.
        (
            "validations:\n- expression: 'variables.good == \"web\"'\n",
            true,
            None,
        ),
        // Variables may use other variables.
        (
            "validations:\n- expression: 'variables.both == \"web!\"'\n",
            true,
            None,
        ),
        (
            "validations:\n- expression: 'variables.bad == 1'\n",
            false,
            Some("bad"),
        ),
    ];
    for (validations, allowed, error) in cases {
        let pol = pod_policy(
            "vars",
            &lenient(&format!(
                "variables:\n- name: bad\n  expression: object.spec.nothing.here\n- name: good\n  expression: object.metadata.name\n- name: both\n  expression: \"variables.good + '!'\"\n{validations}"
            )),
        );
        let d = run(&FakeVerifier::new(), &[&pol], &create(&[SIGNED])).await;
        assert_eq!(d.allowed, allowed, "{validations}: {:?}", d.message);
        if let Some(name) = error {
            let message = d.message.unwrap();
            assert!(
                message.contains("error: failed to evaluate policy"),
                "{message}"
            );
            assert!(message.contains(name), "{message}");
        }
    }
}

#[tokio::test]
async fn verify_digest() {
    let pol = pod_policy("digest", VERIFY_ALL);
    let cases: &[(&[&str], Option<String>)] = &[
        (&[PINNED], None),
        (
            &[PINNED, SIGNED],
            Some(format!(
                "Policy digest failed: image {SIGNED} does not have a digest"
            )),
        ),
    ];
    for (images, message) in cases {
        let verifier = FakeVerifier::new()
            .sign(PINNED, "cosign")
            .sign(SIGNED, "cosign");
        let d = run(&verifier, &[&pol], &create(images)).await;
        assert_eq!(&d.message, message);
        let tags = usize::from(message.is_some());
        assert_eq!(
            verifier.resolves(),
            tags,
            "the tag is resolved, the digest not"
        );
        assert!(!d.budget_exhausted);
    }
}

/// A pod with the tag-only image `image` (and `others`) under a verifyDigest policy on
/// `ghcr.io/*` and `hung.example/*` with `failurePolicy`.
async fn digest_check(failure_policy: &str, verifier: &FakeVerifier, images: &[&str]) -> Decision {
    let pol = policy(
        "digest",
        &format!(
            "{PODS}matchImageReferences:\n- glob: 'ghcr.io/*'\n- glob: 'hung.example/*'\n{}failurePolicy: {failure_policy}\n{VERIFY_ALL}",
            attestors(&["cosign"])
        ),
    );
    run(verifier, &[&pol], &create(images)).await
}

const HUNG: &str = "hung.example/app:1";

#[tokio::test]
async fn verify_digest_on_an_unreachable_registry_follows_the_failure_policy() {
    // Fail: denied, naming the image and the registry.
    let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
    let d = digest_check("Fail", &verifier, &[HUNG]).await;
    assert!(!d.allowed);
    let message = d.message.clone().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "Policy digest error: image {HUNG} does not have a digest and its tag could not be resolved: time budget of 2000ms"
        )) && message.contains("at registry hung.example"),
        "{message}"
    );
    assert!(d.budget_exhausted);

    let verifier = FakeVerifier::new().host("hung.example", Mode::Unavailable);
    let d = digest_check("Fail", &verifier, &[HUNG]).await;
    assert_eq!(
        d.message.as_deref(),
        Some(
            "Policy digest error: image hung.example/app:1 does not have a digest and its tag could not be resolved: 503 Service Unavailable"
        )
    );
    assert!(!d.budget_exhausted);

    // Ignore: the digest check and the image's verification are skipped, with warnings.
    let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
    let d = digest_check("Ignore", &verifier, &[HUNG]).await;
    assert!(d.allowed, "{:?}", d.message);
    assert!(d.budget_exhausted);
    assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
    assert!(
        d.warnings[0].starts_with(&format!(
            "Policy digest: digest check skipped for image {HUNG}: time budget of 2000ms"
        )),
        "{:?}",
        d.warnings
    );
    assert!(
        d.warnings[1].starts_with("Policy digest: verification skipped: "),
        "{:?}",
        d.warnings
    );
    assert!(d.audit_annotations.contains_key(SKIPPED_ANNOTATION));
}

#[tokio::test]
async fn verify_digest_under_ignore_never_hides_an_unsigned_image() {
    let verifier = FakeVerifier::new()
        .host("hung.example", Mode::Deadline)
        .sign(PINNED, "cosign");
    let unsigned_pinned =
        "ghcr.io/org/other@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd";
    let d = digest_check("Ignore", &verifier, &[HUNG, unsigned_pinned]).await;
    assert!(!d.allowed);
    assert_eq!(
        d.message.as_deref(),
        Some("Policy digest failed: failed the image Signature verification")
    );
    // A tag the registry does answer for was simply not pinned: denied whatever the policy.
    let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
    let d = digest_check("Ignore", &verifier, &[HUNG, SIGNED]).await;
    assert_eq!(
        d.message,
        Some(format!(
            "Policy digest failed: image {SIGNED} does not have a digest"
        ))
    );
}

/// A policy on `ghcr.io/*` that checks signatures and reads every container's image data.
fn scoped_image_data_policy(failure_policy: &str) -> CompiledPolicy {
    pod_policy(
        "scoped",
        &no_digest(&format!(
            "failurePolicy: {failure_policy}\n{VERIFY_ALL}- expression: images.containers.all(i, image.GetMetadata(i).config.os == 'linux')\n"
        )),
    )
}

#[tokio::test]
async fn images_outside_the_policy_scope_are_never_fetched_for_it() {
    for failure_policy in ["Ignore", "Fail"] {
        let pol = scoped_image_data_policy(failure_policy);
        let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
        let d = run(&verifier, &[&pol], &create(&[UNSIGNED, HUNG])).await;
        assert!(!d.allowed, "{failure_policy}: an unsigned image in scope");
        assert_eq!(
            d.message.as_deref(),
            Some("Policy scoped failed: failed the image Signature verification")
        );
        assert!(!d.budget_exhausted);
        assert_eq!(verifier.fetched(), [UNSIGNED], "no image data for {HUNG}");
        assert!(
            verifier
                .requests()
                .iter()
                .all(|r| r.image.original() != HUNG),
            "no verification of {HUNG}"
        );
    }
    // Signed in scope, hung out of scope: nothing of the hung registry is needed.
    let pol = scoped_image_data_policy("Fail");
    let verifier = FakeVerifier::new()
        .host("hung.example", Mode::Deadline)
        .sign(SIGNED, "cosign");
    let d = run(&verifier, &[&pol], &create(&[SIGNED, HUNG])).await;
    assert!(d.allowed, "{:?}", d.message);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

/// Kyverno's image-data scenarios: an architecture check on every container (images outside
/// the policy's globs included) and a literal image in the policy.
const ARCH_EVERY_CONTAINER: &str = "validations:
- expression: object.spec.containers.all(c, image.GetMetadata(c.image).config.architecture == 'amd64')
  message: image architecture is not supported
- expression: getImageData('docker.io/library/base:1').config.os == 'linux'
  message: the base image is not linux
";

#[tokio::test]
async fn image_data_of_any_image_an_expression_names_is_fetched_with_kyvernos_answer() {
    const NGINX: &str = "docker.io/library/nginx:1";
    let pol = pod_policy("arch", &lenient(ARCH_EVERY_CONTAINER));
    let verifier = FakeVerifier::new();
    let d = run(&verifier, &[&pol], &create(&[SIGNED, NGINX])).await;
    assert!(d.allowed, "{:?}", d.message);
    assert_eq!(statuses(&d)[0].1, Status::Pass);
    // The policy's own image and its literal with the prefetch, then the other container.
    assert_eq!(
        verifier.fetched(),
        [SIGNED, "docker.io/library/base:1", NGINX]
    );

    let verifier = FakeVerifier::new().arch(NGINX, "arm64");
    let d = run(&verifier, &[&pol], &create(&[SIGNED, NGINX])).await;
    assert_eq!(
        d.message.as_deref(),
        Some("Policy arch failed: image architecture is not supported")
    );

    // Evaluated again, a policy that also verifies records its evidence once.
    let both = pod_policy(
        "both",
        &no_digest(&format!("{VERIFY_ALL}{}", &ARCH_EVERY_CONTAINER[13..])),
    );
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    let d = run(&verifier, &[&both], &create(&[SIGNED, NGINX])).await;
    assert!(d.allowed, "{:?}", d.message);
    let verified: Value = serde_json::from_str(&d.audit_annotations[VERIFIED_ANNOTATION]).unwrap();
    assert_eq!(verified.as_array().map(Vec::len), Some(1), "{verified}");
    assert_eq!(
        verifier.calls(),
        4,
        "one verification, three image data fetches"
    );
}

#[tokio::test]
async fn an_image_outside_the_scope_that_cannot_be_fetched_fails_only_the_expression_reading_it() {
    let arch = |failure_policy: &str| {
        pod_policy(
            "arch",
            &no_digest(&format!(
                "failurePolicy: {failure_policy}\n{VERIFY_ALL}- expression: object.spec.containers.all(c, image.GetMetadata(c.image).config.architecture == 'amd64')\n"
            )),
        )
    };
    // A hung registry an expression reads: the failurePolicy decides, as for a budget miss.
    let verifier = FakeVerifier::new()
        .host("hung.example", Mode::Deadline)
        .sign(SIGNED, "cosign");
    let d = run(&verifier, &[&arch("Ignore")], &create(&[SIGNED, HUNG])).await;
    assert!(d.allowed, "{:?}", d.message);
    assert!(d.budget_exhausted);
    assert!(
        d.warnings.iter().any(|w| w.contains(HUNG)),
        "{:?}",
        d.warnings
    );
    let d = run(&verifier, &[&arch("Fail")], &create(&[SIGNED, HUNG])).await;
    assert!(!d.allowed);
    assert!(d.message.unwrap_or_default().contains(HUNG));

    // An unsigned image in scope is denied whatever the hung registry would have said.
    let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
    let d = run(&verifier, &[&arch("Ignore")], &create(&[UNSIGNED, HUNG])).await;
    assert_eq!(
        d.message.as_deref(),
        Some("Policy arch failed: failed the image Signature verification")
    );

    // An unreachable registry is an error of the expression reading it, naming the image.
    let verifier = FakeVerifier::new()
        .host("hung.example", Mode::Unavailable)
        .sign(SIGNED, "cosign");
    let d = run(&verifier, &[&arch("Ignore")], &create(&[SIGNED, HUNG])).await;
    let message = d.message.unwrap_or_default();
    assert!(
        message.starts_with("Policy arch error: failed to evaluate policy: ")
            && message.contains(HUNG),
        "{message}"
    );
    // A policy that does not read it never asks (the same Pod, signatures only).
    let verify = pod_policy("verify", &no_digest(VERIFY_ALL));
    let verifier = FakeVerifier::new()
        .host("hung.example", Mode::Deadline)
        .sign(SIGNED, "cosign");
    let d = run(&verifier, &[&verify], &create(&[SIGNED, HUNG])).await;
    assert!(d.allowed && d.warnings.is_empty(), "{d:?}");
    assert!(verifier.fetched().is_empty());
}

#[tokio::test]
async fn image_data_the_request_chooses_is_bounded_and_never_from_a_metadata_address() {
    let metadata = pod_policy(
        "metadata",
        &lenient(
            "validations:\n- expression: object.spec.containers.all(c, image.GetMetadata(c.image).config.os == 'linux')\n",
        ),
    );
    let verifier = FakeVerifier::new();
    let imds = "169.254.169.254/latest/meta-data:1";
    let d = run(&verifier, &[&metadata], &create(&[imds])).await;
    let message = d.message.unwrap_or_default();
    assert!(
        message.starts_with("Policy metadata error: failed to evaluate policy: ")
            && message.contains("link-local"),
        "{message}"
    );
    assert!(verifier.fetched().is_empty());

    // Every container of a Pod larger than the bound: the images past it are not fetched.
    let many: Vec<String> = (0..40).map(|n| format!("r.example/app{n}:1")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let verifier = FakeVerifier::new();
    let d = run(&verifier, &[&metadata], &create(&many)).await;
    let message = d.message.unwrap_or_default();
    assert!(
        message.contains(&format!("at most {} images", super::late::MAX_LATE_IMAGES)),
        "{message}"
    );
    assert_eq!(verifier.fetched().len(), super::late::MAX_LATE_IMAGES);
}

#[tokio::test]
async fn failure_policy_follows_the_error_type_not_its_text() {
    let pol = pod_policy(
        "typed",
        &no_digest(&format!("failurePolicy: Ignore\n{VERIFY_ALL}")),
    );
    let verifier = FakeVerifier::new().host(
        "ghcr.io",
        Mode::UnavailableSaying("time budget of 1ms exhausted"),
    );
    let d = run(&verifier, &[&pol], &create(&[SIGNED])).await;
    assert!(!d.allowed, "an unavailable registry is no spent budget");
    assert!(!d.budget_exhausted);
    assert!(d.audit_annotations.is_empty());
}

#[tokio::test]
async fn a_budget_miss_matters_only_to_an_expression_that_reads_it() {
    // Both images in scope; the hung one's answers are missing. The unsigned one still fails
    // the signature check outright (CEL's `all` is false whatever the error), so Ignore does
    // not admit it.
    let in_scope = |failure_policy: &str| {
        policy(
            "both",
            &format!(
                "{PODS}matchImageReferences:\n- glob: 'ghcr.io/*'\n- glob: 'hung.example/*'\n{}failurePolicy: {failure_policy}\n{}",
                attestors(&["cosign"]),
                no_digest(VERIFY_ALL)
            ),
        )
    };
    let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
    let d = run(
        &verifier,
        &[&in_scope("Ignore")],
        &create(&[UNSIGNED, HUNG]),
    )
    .await;
    assert!(!d.allowed);
    assert_eq!(
        d.message.as_deref(),
        Some("Policy both failed: failed the image Signature verification")
    );
    // A later validation's outright failure wins over an earlier one's budget miss.
    let pol = policy(
        "later",
        &format!(
            "{PODS}matchImageReferences:\n- glob: 'ghcr.io/*'\n- glob: 'hung.example/*'\n{}failurePolicy: Ignore\n{}",
            attestors(&["cosign"]),
            no_digest(
                "validations:\n- expression: images.containers.all(i, image.GetMetadata(i).config.os == 'linux')\n- expression: images.containers.all(i, verifyImageSignatures(i, [attestors.cosign]) > 0)\n  message: unsigned\n"
            )
        ),
    );
    let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
    let d = run(&verifier, &[&pol], &create(&[UNSIGNED, HUNG])).await;
    assert_eq!(d.message.as_deref(), Some("Policy later failed: unsigned"));
    // A later validation's own evaluation error is a policy error, not hidden by an earlier
    // validation's budget miss.
    let broken = policy(
        "broken",
        &format!(
            "{PODS}matchImageReferences:\n- glob: 'hung.example/*'\n{}failurePolicy: Ignore\n{}",
            attestors(&["cosign"]),
            no_digest(
                "variables:\n- name: counts\n  expression: images.containers.map(i, verifyImageSignatures(i, [attestors.cosign]))\nvalidations:\n- expression: variables.counts.all(c, c >= 0)\n- expression: object.spec.noSuchField == 'x'\n"
            )
        ),
    );
    let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
    let d = run(&verifier, &[&broken], &create(&[HUNG])).await;
    assert!(!d.allowed, "{:?}", d.warnings);
    assert!(
        d.message
            .as_deref()
            .is_some_and(|m| m.starts_with("Policy broken error: failed to evaluate policy: ")),
        "{:?}",
        d.message
    );
    // Several validations reading one memoized variable of missing answers: a budget miss.
    let shared = policy(
        "shared",
        &format!(
            "{PODS}matchImageReferences:\n- glob: 'hung.example/*'\n{}failurePolicy: Ignore\n{}",
            attestors(&["cosign"]),
            no_digest(
                "variables:\n- name: counts\n  expression: images.containers.map(i, verifyImageSignatures(i, [attestors.cosign]))\nvalidations:\n- expression: variables.counts.all(c, c > 0)\n- expression: variables.counts.size() > 0\n"
            )
        ),
    );
    let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
    let d = run(&verifier, &[&shared], &create(&[HUNG])).await;
    assert!(d.allowed, "{:?}", d.message);
    assert_eq!(d.results[0].status, Status::Skip);
    // Only the hung image, signed or not: the failurePolicy decides.
    let verifier = FakeVerifier::new().host("hung.example", Mode::Deadline);
    let d = run(&verifier, &[&pol], &create(&[HUNG])).await;
    assert!(d.allowed, "{:?}", d.message);
    assert!(d.budget_exhausted);
    assert_eq!(d.results[0].status, Status::Skip);
}

/// A policy that checks something else and requires its images to be verified.
fn requiring(name: &str) -> CompiledPolicy {
    pod_policy(name, &no_digest("validations:\n- expression: 'true'\n"))
}

#[tokio::test]
async fn required_across_policies() {
    let verifying = pod_policy(
        "verifier",
        "validationConfigurations:\n  verifyDigest: false\n  required: false\nvalidations:\n- expression: images.containers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e >= 0)\n",
    );
    let pinned = requiring("pinned");
    let not_verified = format!(
        "Policy pinned failed: image {SIGNED} is not verified: no policy performed a signature or attestation check on it"
    );
    let failed = format!(
        "Policy pinned failed: image {UNSIGNED} failed signature or attestation verification"
    );
    let cases: Vec<(Vec<&CompiledPolicy>, &str, Option<String>)> = vec![
        (vec![&pinned], SIGNED, Some(not_verified)),
        (vec![&pinned, &verifying], SIGNED, None),
        // Evidence from a policy evaluated later counts too.
        (vec![&verifying, &pinned], SIGNED, None),
        (vec![&pinned, &verifying], UNSIGNED, Some(failed)),
    ];
    for (policies, image, message) in cases {
        let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
        let d = run(&verifier, &policies, &create(&[image])).await;
        assert_eq!(d.message, message, "{image}");
    }
}

#[tokio::test]
async fn validation_actions() {
    let failing = |actions: &str| {
        pod_policy(
            "act",
            &no_digest(&format!("validationActions: {actions}\n{VERIFY_ALL}")),
        )
    };
    let text = "Policy act failed: failed the image Signature verification".to_owned();
    let cases = [
        ("[Deny]", false, Some(text.clone()), vec![]),
        ("[Warn]", true, None, vec![text.clone()]),
        ("[Audit]", true, None, vec![]),
        (
            "[Deny, Warn]",
            false,
            Some(text.clone()),
            vec![text.clone()],
        ),
    ];
    for (actions, allowed, message, warnings) in cases {
        let pol = failing(actions);
        let d = run(&FakeVerifier::new(), &[&pol], &create(&[UNSIGNED])).await;
        assert_eq!(d.allowed, allowed, "{actions}");
        assert_eq!(d.message, message, "{actions}");
        assert_eq!(d.warnings, warnings, "{actions}");
        assert_eq!(
            d.results.len(),
            1,
            "{actions}: the result is listed for reports"
        );
        assert_eq!(d.results[0].status, Status::Fail);
    }
}

#[tokio::test]
async fn errors_of_several_deny_policies_are_joined() {
    let a = pod_policy("a", &no_digest(VERIFY_ALL));
    let b = pod_policy(
        "b",
        &no_digest("validations:\n- expression: 'object.nothing.x'\n"),
    );
    let d = run(&FakeVerifier::new(), &[&a, &b], &create(&[UNSIGNED])).await;
    let message = d.message.unwrap();
    assert!(
        message.starts_with("Policy a failed: failed the image Signature verification; Policy b error: failed to evaluate policy: "),
        "{message}"
    );
}

/// Kyverno example (f): JSON mode, custom extractor, notary attestor.
const EXAMPLE_F: &str = r#"apiVersion: policies.kyverno.io/v1beta1
kind: ImageValidatingPolicy
metadata:
  name: ivpol-cli-sample
spec:
  evaluation:
    mode: JSON
  validationConfigurations:
    verifyDigest: false
  matchImageReferences:
    - glob: ghcr.io/*
  images:
  - name: "bar"
    expression: "[object.foo.bar,]"
  attestors:
    - name: notary
      notary:
        certs:
          value: |-
            -----BEGIN CERTIFICATE-----
            MIIDTTCCAjWgAwIBAgIJAPI+zAzn4s0xMA0GCSqGSIb3DQEBCwUAMEwxCzAJBgNV
            -----END CERTIFICATE-----
  attestations:
    - name: sbom
      referrer:
        type: sbom/cyclone-dx
  validations:
    - expression: >-
        images.bar.map(image, verifyImageSignatures(image, [attestors.notary])).all(e, e > 0)
      message: failed to verify image with notary cert
"#;

fn json_payload(payload: Value) -> AdmissionRequest {
    request(json!({
        "uid": "json",
        "kind": {"group": "", "version": "v1", "kind": "Payload"},
        "resource": {"group": "", "version": "v1", "resource": "payloads"},
        "operation": "CREATE",
        "object": payload,
    }))
}

#[tokio::test]
async fn example_f_json_mode_with_custom_extractor() {
    let payload = json!({"foo": {"bar": SIGNED}});
    // The fake verifier holds no Notation signatures: it answers NotVerified (ivory-verify's
    // `notation` tests verify real ones).
    let notary = load(EXAMPLE_F);
    let verifier = FakeVerifier::new().sign(SIGNED, "notary");
    let d = run(&verifier, &[&notary], &json_payload(payload.clone())).await;
    assert_eq!(
        d.message.as_deref(),
        Some("Policy ivpol-cli-sample failed: failed to verify image with notary cert")
    );
    assert_eq!(d.results[0].images, [SIGNED]);
    let requests = verifier.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].image.original(), SIGNED);

    // The same policy with a cosign attestor passes, and `required` is met by that check.
    let cosign = load(
        &EXAMPLE_F
            .replace("attestors.notary", "attestors.cosign")
            .replace(
                "    - name: notary\n      notary:\n        certs:\n          value: |-\n            -----BEGIN CERTIFICATE-----\n            MIIDTTCCAjWgAwIBAgIJAPI+zAzn4s0xMA0GCSqGSIb3DQEBCwUAMEwxCzAJBgNV\n            -----END CERTIFICATE-----\n",
                &key_attestor("cosign").lines().map(|l| format!("    {l}\n")).collect::<String>(),
            ),
    );
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    let d = run(&verifier, &[&cosign], &json_payload(payload)).await;
    assert!(d.allowed, "{:?}", d.message);
    assert_eq!(d.results[0].status, Status::Pass);
}

#[tokio::test]
async fn json_mode_binds_only_object() {
    let pol = policy(
        "json",
        "evaluation:\n  mode: JSON\nimages:\n- name: all\n  expression: '[object.image]'\nattestors: []\nvalidationConfigurations:\n  verifyDigest: false\n  required: false\nvalidations:\n- expression: \"images.all == [object.image] && size(images) == 1\"\n",
    );
    let d = run(
        &FakeVerifier::new(),
        &[&pol],
        &json_payload(json!({"image": SIGNED})),
    )
    .await;
    assert!(d.allowed, "{:?}", d.results);
    assert_eq!(d.results[0].status, Status::Pass);
}

/// Kyverno example (l): Audit only, messageExpression and auditAnnotations on a Deployment.
fn example_l() -> CompiledPolicy {
    policy(
        "check-env",
        &format!(
            r#"validationActions: [Audit]
matchConstraints:
  resourceRules:
  - apiGroups:   [apps]
    apiVersions: [v1]
    operations:  [CREATE, UPDATE]
    resources:   [deployments]
{}validationConfigurations:
  verifyDigest: false
variables:
  - name: environment
    expression: >-
      has(object.metadata.labels) && 'env' in object.metadata.labels && object.metadata.labels['env'] == 'prod'
validations:
  - expression: >-
      variables.environment == true
    messageExpression: >-
      'Deployment labels must be env=prod' + (has(object.metadata.labels) && 'env' in object.metadata.labels ? ' but found env=' + string(object.metadata.labels['env']) : ' but no env label is present')
  - expression: >-
      images.containers.map(image, verifyImageSignatures(image, [attestors.notary])).all(e, e > 0)
    message: failed to verify image with notary cert
auditAnnotations:
  - key: label
    valueExpression: >-
      has(object.metadata.labels) && 'env' in object.metadata.labels ? string(object.metadata.labels['env']) : ''
"#,
            attestors(&["notary"])
        ),
    )
}

fn deployment(labels: Value, image: &str) -> AdmissionRequest {
    request(json!({
        "uid": "d",
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "requestResource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "name": "web",
        "namespace": "default",
        "operation": "CREATE",
        "object": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": labels},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}},
        },
    }))
}

#[tokio::test]
async fn example_l_audit_annotations_and_message_expression() {
    let pol = example_l();
    let cases = [
        (
            json!({"env": "staging"}),
            Status::Fail,
            "Deployment labels must be env=prod but found env=staging",
            Some("staging"),
        ),
        (
            json!({"app": "web"}),
            Status::Fail,
            "Deployment labels must be env=prod but no env label is present",
            None,
        ),
        (json!({"env": "prod"}), Status::Pass, "", Some("prod")),
    ];
    for (labels, status, message, label) in cases {
        let verifier = FakeVerifier::new().sign(SIGNED, "notary");
        let d = run(&verifier, &[&pol], &deployment(labels.clone(), SIGNED)).await;
        // Audit only: the response is untouched.
        assert!(
            d.allowed && d.message.is_none() && d.warnings.is_empty(),
            "{labels}"
        );
        let r = &d.results[0];
        assert_eq!(
            (r.status, r.message.as_str()),
            (status, message),
            "{labels}"
        );
        assert_eq!(
            r.properties.get("label").map(String::as_str),
            label,
            "{labels}"
        );
        assert!(r.audit && !r.deny && !r.warn);
    }
}

#[tokio::test]
async fn delete_requests_see_the_old_object_as_object() {
    let pol = pod_policy(
        "del",
        &lenient(
            "validations:\n- expression: \"request.operation == 'DELETE' && object.metadata.name == 'web' && oldObject.metadata.name == 'web' && images.containers == ['ghcr.io/kyverno/test-verify-image:signed']\"\n",
        ),
    );
    let d = run(
        &FakeVerifier::new(),
        &[&pol],
        &pod("DELETE", &[SIGNED], &[], &[], json!({})),
    )
    .await;
    assert_eq!(
        statuses(&d),
        [("del".to_owned(), Status::Pass, String::new())]
    );
}

#[tokio::test]
async fn request_and_namespace_bindings() {
    let pol = pod_policy(
        "bindings",
        &lenient(
            "validations:\n- expression: \"request.userInfo.username == 'alice' && request.namespace == 'default' && namespaceObject.metadata.labels.env == 'prod' && oldObject == null\"\n",
        ),
    );
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default", "labels": {"env": "prod"}}});
    let deadline = ivory_clock::now() + Duration::from_secs(10);
    let req = create(&[SIGNED]);
    let d = validate(
        &FakeVerifier::new(),
        &NoResources,
        &[&pol],
        &req,
        Some(&namespace),
        deadline,
    )
    .await;
    assert_eq!(d.results[0].status, Status::Pass, "{:?}", d.results);
    // Without the Namespace object the same expression cannot evaluate.
    let d = validate(
        &FakeVerifier::new(),
        &NoResources,
        &[&pol],
        &req,
        None,
        deadline,
    )
    .await;
    assert_eq!(d.results[0].status, Status::Error);
}

#[tokio::test]
async fn matching_errors_are_policy_errors() {
    let pol = policy(
        "ns",
        &format!(
            "{PODS}  namespaceSelector:\n    matchLabels:\n      env: prod\nattestors: []\n{}",
            lenient("validations:\n- expression: 'true'\n")
        ),
    );
    let d = run(&FakeVerifier::new(), &[&pol], &create(&[SIGNED])).await;
    let message = d.message.unwrap_or_default();
    assert!(
        message.starts_with("Policy ns error: failed to execute matching: "),
        "{message}"
    );
    assert_eq!(d.results[0].status, Status::Error);
}

#[tokio::test]
async fn budget_exhaustion_follows_failure_policy() {
    for failure_policy in ["Fail", "Ignore"] {
        let pol = pod_policy(
            "budget",
            &no_digest(&format!("failurePolicy: {failure_policy}\n{VERIFY_ALL}")),
        );
        let verifier = FakeVerifier::new().mode(Mode::Deadline);
        let d = run(&verifier, &[&pol], &create(&[SIGNED])).await;
        let why = format!(
            "{SIGNED}: time budget of 2000ms exhausted while fetching the manifest at registry ghcr.io"
        );
        if failure_policy == "Fail" {
            assert!(!d.allowed);
            assert_eq!(d.message, Some(format!("Policy budget error: {why}")));
            assert!(d.audit_annotations.is_empty());
        } else {
            assert!(d.allowed, "{:?}", d.message);
            let skipped = format!("verification skipped: {why} (failurePolicy Ignore)");
            assert_eq!(d.warnings, [format!("Policy budget: {skipped}")]);
            assert_eq!(
                d.audit_annotations.get(SKIPPED_ANNOTATION),
                Some(&format!("budget: {skipped}"))
            );
            assert_eq!(d.results[0].status, Status::Skip);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_verifier_that_outlives_the_deadline_is_cut_off() {
    for failure_policy in ["Fail", "Ignore"] {
        let pol = pod_policy(
            "slow",
            &no_digest(&format!("failurePolicy: {failure_policy}\n{VERIFY_ALL}")),
        );
        let verifier = FakeVerifier::new()
            .sign(SIGNED, "cosign")
            .mode(Mode::Sleep(Duration::from_secs(60)));
        let start = ivory_clock::now();
        let deadline = start + Duration::from_secs(2);
        let d = validate(
            &verifier,
            &NoResources,
            &[&pol],
            &create(&[SIGNED]),
            None,
            deadline,
        )
        .await;
        assert_eq!(
            ivory_clock::now() - start,
            Duration::from_secs(2),
            "returns at the deadline"
        );
        let why = format!(
            "{SIGNED}: time budget of 2000ms exhausted while verifying the signature with attestor cosign at registry ghcr.io"
        );
        if failure_policy == "Fail" {
            assert_eq!(d.message, Some(format!("Policy slow error: {why}")));
        } else {
            assert!(d.allowed);
            assert_eq!(
                d.warnings,
                [format!(
                    "Policy slow: verification skipped: {why} (failurePolicy Ignore)"
                )]
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn prefetch_runs_concurrently() {
    let pol = policy(
        "many",
        &format!(
            "{PODS}{}{}validations:\n- expression: '(images.containers + images.initContainers).all(i, verifyImageSignatures(i, [attestors.a, attestors.b]) == 2)'\n",
            attestors(&["a", "b"]),
            no_digest("")
        ),
    );
    let images = ["ghcr.io/aa:1", "ghcr.io/bb:1", "ghcr.io/cc:1"];
    let verifier = images
        .iter()
        .fold(FakeVerifier::new(), |v, i| v.sign(i, "a").sign(i, "b"))
        .mode(Mode::Sleep(Duration::from_secs(1)));
    let start = ivory_clock::now();
    let req = pod("CREATE", &images[..2], &images[2..], &[], json!({}));
    let d = validate(
        &verifier,
        &NoResources,
        &[&pol],
        &req,
        None,
        start + Duration::from_secs(10),
    )
    .await;
    assert!(d.allowed, "{:?}", d.message);
    assert_eq!(verifier.calls(), 6, "3 images × 2 attestors");
    assert_eq!(
        ivory_clock::now() - start,
        Duration::from_secs(1),
        "calls overlap"
    );
}

#[tokio::test]
async fn identical_questions_are_asked_once_per_request() {
    let a = pod_policy("a", &no_digest(VERIFY_ALL));
    let b = pod_policy("b", &no_digest(VERIFY_ALL));
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    let d = run(&verifier, &[&a, &b], &create(&[SIGNED])).await;
    assert!(d.allowed);
    assert_eq!(verifier.calls(), 1);
}

#[tokio::test]
async fn questions_that_differ_in_attestor_or_credentials_are_asked_each() {
    let with = |name: &str, attestor_extra: &str, spec_extra: &str| {
        policy(
            name,
            &format!(
                "{PODS}matchImageReferences:\n- glob: 'ghcr.io/*'\n{spec_extra}attestors:\n{}{attestor_extra}{}",
                key_attestor("cosign"),
                no_digest(VERIFY_ALL)
            ),
        )
    };
    let base = with("a", "", "");
    let twin = with("twin", "", "");
    let annotated = with("annotated", "    annotations:\n      team: shop\n", "");
    let credentials = with(
        "credentials",
        "",
        "credentials:\n  allowInsecureRegistry: true\n",
    );
    for (others, calls) in [
        (vec![&twin], 1),
        (vec![&annotated], 2),
        (vec![&credentials], 2),
        (vec![&twin, &annotated, &credentials], 3),
    ] {
        let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
        let policies: Vec<&CompiledPolicy> = std::iter::once(&base).chain(others).collect();
        let d = run(&verifier, &policies, &create(&[SIGNED])).await;
        assert!(d.allowed, "{:?}", d.message);
        assert_eq!(verifier.calls(), calls, "{}", policies.len());
    }
}

#[tokio::test]
async fn unreachable_registry_is_a_policy_error() {
    let pol = pod_policy("down", &no_digest(VERIFY_ALL));
    let verifier = FakeVerifier::new().mode(Mode::Unavailable);
    let d = run(&verifier, &[&pol], &create(&[SIGNED])).await;
    assert_eq!(
        d.message,
        Some(format!(
            "Policy down error: failed to evaluate policy: {SIGNED}: 503 Service Unavailable"
        ))
    );
}

#[tokio::test]
async fn policies_without_verification_calls_do_not_prefetch() {
    let pol = pod_policy("plain", &lenient("validations:\n- expression: 'true'\n"));
    let verifier = FakeVerifier::new();
    let d = run(&verifier, &[&pol], &create(&[SIGNED])).await;
    assert!(d.allowed);
    assert_eq!(verifier.calls(), 0);
}

#[tokio::test]
async fn attestor_expressions_are_evaluated_into_place() {
    let key = KEY.lines().map(str::trim).collect::<Vec<_>>().join("\n");
    let pol = policy(
        "dyn",
        &format!(
            "{PODS}attestors:\n- name: cosign\n  cosign:\n    key:\n      expression: object.metadata.annotations['key']\n{}",
            no_digest(VERIFY_ALL)
        ),
    );
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    let d = run(
        &verifier,
        &[&pol],
        &pod("CREATE", &[SIGNED], &[], &[], json!({"key": key})),
    )
    .await;
    assert!(d.allowed, "{:?}", d.message);
    let requests = verifier.requests();
    let data = requests[0]
        .attestor
        .cosign
        .as_ref()
        .and_then(|c| c.key.as_ref())
        .and_then(|k| k.data.clone());
    assert_eq!(data.as_deref(), Some(key.as_str()));
}

#[tokio::test]
async fn attestor_expressions_are_evaluated_only_for_requests_with_selected_images() {
    // The key is read from an annotation the Pod may lack: Kyverno evaluates an attestor only
    // when CEL reads it, so a Pod whose images the policy does not select is not judged by it.
    let pol = policy(
        "dyn",
        &format!(
            "{PODS}matchImageReferences:\n- glob: 'ghcr.io/*'\nattestors:\n- name: cosign\n  cosign:\n    key:\n      expression: object.metadata.annotations['key']\n{}",
            no_digest(VERIFY_ALL)
        ),
    );
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    let elsewhere =
        "quay.io/other/app@sha256:1111111111111111111111111111111111111111111111111111111111111111";
    let d = run(&verifier, &[&pol], &create(&[elsewhere])).await;
    assert!(d.allowed, "{:?}", d.message);
    assert_eq!(verifier.calls(), 0);
    // A selected image still needs the key, and a key that cannot be read is the policy's error.
    let d = run(&verifier, &[&pol], &create(&[SIGNED])).await;
    assert!(!d.allowed);
    let statuses = statuses(&d);
    assert_eq!(statuses[0].1, Status::Error, "{statuses:?}");
}

// --- security ---------------------------------------------------------------------------

#[tokio::test]
async fn forged_outcome_annotations_are_never_evidence() {
    let pol = pod_policy("sec", &no_digest(VERIFY_ALL));
    let forged = json!({
        "kyverno.io/image-verification-outcomes": format!("{{\"sec\":{{\"{UNSIGNED}\":\"pass\"}}}}"),
        "kyverno.io/verify-images": format!("{{\"{UNSIGNED}\":\"pass\"}}"),
    });
    let verifier = FakeVerifier::new();
    let d = run(
        &verifier,
        &[&pol],
        &pod("CREATE", &[UNSIGNED], &[], &[], forged),
    )
    .await;
    assert!(!d.allowed);
    assert_eq!(
        verifier.calls(),
        1,
        "verification happened despite the annotation"
    );

    // Nor does an annotation satisfy `required`.
    let pinned = requiring("req");
    let forged = json!({"kyverno.io/verify-images": format!("{{\"{SIGNED}\":\"pass\"}}")});
    let d = run(
        &FakeVerifier::new(),
        &[&pinned],
        &pod("CREATE", &[SIGNED], &[], &[], forged),
    )
    .await;
    assert!(!d.allowed);
}

#[tokio::test]
async fn container_order_never_changes_the_outcome() {
    let pol = pod_policy("order", &no_digest(VERIFY_ALL));
    let pinned = requiring("pinned");
    let orders: [&[&str]; 3] = [
        &[SIGNED, UNSIGNED, "ghcr.io/zz:1"],
        &[UNSIGNED, "ghcr.io/zz:1", SIGNED],
        &["ghcr.io/zz:1", SIGNED, UNSIGNED],
    ];
    let mut seen = Vec::new();
    for order in orders {
        let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
        let d = run(&verifier, &[&pol, &pinned], &create(order)).await;
        seen.push((d.allowed, d.message.clone()));
    }
    assert!(seen.iter().all(|s| s == &seen[0]), "{seen:#?}");
    assert!(!seen[0].0);
}

#[tokio::test]
async fn every_container_kind_is_subject_to_required() {
    // The validation only looks at `containers`; the other kinds must still be verified.
    let pol = pod_policy(
        "containers-only",
        &no_digest(
            "validations:\n- expression: images.containers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0)\n",
        ),
    );
    let other = "ghcr.io/sneaky/tool:1";
    // `kubectl debug`: an UPDATE on the pods/ephemeralcontainers subresource.
    let mut debug = pod("UPDATE", &[SIGNED], &[], &[other], json!({}));
    debug.sub_resource = Some("ephemeralcontainers".to_owned());
    debug.request_sub_resource = Some("ephemeralcontainers".to_owned());
    let cases = [
        pod("CREATE", &[SIGNED], &[other], &[], json!({})),
        pod("UPDATE", &[SIGNED], &[], &[other], json!({})),
        debug,
    ];
    for req in cases {
        let verifier = FakeVerifier::new()
            .sign(SIGNED, "cosign")
            .sign(other, "cosign");
        let d = run(&verifier, &[&pol], &req).await;
        assert_eq!(
            d.message,
            Some(format!(
                "Policy containers-only failed: image {other} is not verified: no policy performed a signature or attestation check on it"
            ))
        );
    }
    // Verifying every kind satisfies it.
    let all = pod_policy("all", &no_digest(VERIFY_ALL));
    let verifier = FakeVerifier::new()
        .sign(SIGNED, "cosign")
        .sign(other, "cosign");
    let d = run(
        &verifier,
        &[&all],
        &pod("CREATE", &[SIGNED], &[other], &[other], json!({})),
    )
    .await;
    assert!(d.allowed, "{:?}", d.message);
}

#[test]
fn the_validate_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let verifier = FakeVerifier::new();
    let pol = pod_policy("send", VERIFY_ALL);
    let req = create(&[SIGNED]);
    let policies = [&pol];
    let future = validate(
        &verifier,
        &NoResources,
        &policies,
        &req,
        None,
        ivory_clock::now(),
    );
    assert_send(&future);
}

/// Kyverno example (o): image metadata through `image.GetMetadata` in a variable.
#[tokio::test]
async fn example_o_image_metadata() {
    let cases = [("amd64", true), ("arm64", false)];
    for (arch, allowed) in cases {
        let pol = policy(
            "arch",
            &format!(
                "{PODS}attestors: []\n{}",
                lenient(&format!(
                    "variables:\n  - name: imageRef\n    expression: object.spec.containers[0].image\n  - name: image\n    expression: image.GetMetadata(variables.imageRef)\nvalidations:\n  - expression: variables.image.config.architecture == \"{arch}\"\n    messageExpression: \"'image architecture is not supported: ' + string(variables.image.config.architecture)\"\n"
                ))
            ),
        );
        let verifier = FakeVerifier::new();
        let d = run(&verifier, &[&pol], &create(&["nginx:1.27"])).await;
        assert_eq!(d.allowed, allowed, "{arch}: {:?}", d.message);
        if !allowed {
            assert_eq!(
                d.message.as_deref(),
                Some("Policy arch failed: image architecture is not supported: amd64")
            );
        }
        assert_eq!(
            verifier.calls(),
            1,
            "image data fetched once, before evaluation"
        );
    }
}

#[tokio::test]
async fn other_spellings_of_a_matched_image_are_verified() {
    let pol = pod_policy("sig", &no_digest(VERIFY_ALL));
    let denied = "Policy sig failed: failed the image Signature verification";
    for image in [
        "GHCR.IO/kyverno/test-verify-image:unsigned",
        "ghcr.io:443/kyverno/test-verify-image:unsigned",
        "ghcr.io:0443/kyverno/test-verify-image@sha256:abababababababababababababababababababababababababababababababab",
    ] {
        let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
        let d = run(&verifier, &[&pol], &create(&[image])).await;
        assert_eq!(d.message.as_deref(), Some(denied), "{image}");
        assert_eq!(verifier.calls(), 1, "{image}");
        // The verifier is asked about the image as written: that is what the kubelet pulls.
        let asked = verifier.requests()[0].image.original().to_owned();
        assert_eq!(asked, image);
    }
    // Docker Hub aliases and `library/` against a glob naming docker.io.
    let hub = policy(
        "hub",
        &format!(
            "{PODS}matchImageReferences:\n- glob: 'docker.io/library/*'\n{}{}",
            attestors(&["cosign"]),
            no_digest(VERIFY_ALL)
        ),
    );
    for image in [
        "busybox@sha256:abababababababababababababababababababababababababababababababab",
        "library/busybox:1",
        "index.docker.io/library/busybox:1",
        "registry-1.docker.io/library/busybox:1",
    ] {
        let verifier = FakeVerifier::new();
        let d = run(&verifier, &[&hub], &create(&[image])).await;
        assert!(!d.allowed, "{image}");
        assert_eq!(verifier.calls(), 1, "{image}");
    }
}

/// A Pod CREATE with `app` containers and `volumes` as image volumes.
fn pod_with_volumes(app: &[&str], volumes: &[&str]) -> AdmissionRequest {
    let mut req = create(app);
    req.object.as_mut().expect("object").edit(|object| {
        let spec = object.pointer_mut("/spec").expect("spec");
        spec["volumes"] = volumes
            .iter()
            .enumerate()
            .map(|(i, image)| json!({"name": format!("v{i}"), "image": {"reference": image}}))
            .collect();
    });
    req
}

#[tokio::test]
async fn image_volumes_are_verified_and_required() {
    // CEL sees them under Kyverno's key.
    let all = pod_policy(
        "volumes",
        &no_digest(
            "validations:\n- expression: (images.containers + images.imageVolumes).map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0)\n  message: unsigned\n",
        ),
    );
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    let d = run(
        &verifier,
        &[&all],
        &pod_with_volumes(&[SIGNED], &[UNSIGNED]),
    )
    .await;
    assert_eq!(
        d.message.as_deref(),
        Some("Policy volumes failed: unsigned")
    );
    let d = run(&verifier, &[&all], &pod_with_volumes(&[SIGNED], &[SIGNED])).await;
    assert!(d.allowed, "{:?}", d.message);
    // A policy that only looks at containers still needs the volume verified (`required`).
    let containers_only = pod_policy(
        "containers-only",
        &no_digest(
            "validations:\n- expression: images.containers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0)\n",
        ),
    );
    let d = run(
        &verifier,
        &[&containers_only],
        &pod_with_volumes(&[SIGNED], &[UNSIGNED]),
    )
    .await;
    assert_eq!(
        d.message,
        Some(format!(
            "Policy containers-only failed: image {UNSIGNED} is not verified: no policy performed a signature or attestation check on it"
        ))
    );
    // verifyDigest covers them too.
    let digests = pod_policy(
        "digests",
        "validationConfigurations:\n  verifyDigest: true\n  required: false\nvalidations:\n- expression: 'true'\n",
    );
    let d = run(
        &FakeVerifier::new(),
        &[&digests],
        &pod_with_volumes(&[PINNED], &[UNSIGNED]),
    )
    .await;
    assert_eq!(
        d.message,
        Some(format!(
            "Policy digests failed: image {UNSIGNED} does not have a digest"
        ))
    );
}

#[tokio::test]
async fn a_pods_rule_covers_kubectl_debug() {
    // The rule names only `pods`; `kubectl debug` writes the ephemeralcontainers subresource.
    let pol = policy(
        "pods-only",
        &format!(
            "matchConstraints:\n  resourceRules:\n  - apiGroups: ['']\n    apiVersions: ['v1']\n    operations: ['CREATE']\n    resources: ['pods']\nmatchImageReferences:\n- glob: 'ghcr.io/*'\n{}{}",
            attestors(&["cosign"]),
            no_digest(VERIFY_ALL)
        ),
    );
    let mut debug = pod("UPDATE", &[SIGNED], &[], &[UNSIGNED], json!({}));
    debug.sub_resource = Some("ephemeralcontainers".to_owned());
    debug.request_sub_resource = Some("ephemeralcontainers".to_owned());
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    let d = run(&verifier, &[&pol], &debug).await;
    assert_eq!(
        d.message.as_deref(),
        Some("Policy pods-only failed: failed the image Signature verification")
    );
    // A plain Pod UPDATE is still outside a CREATE-only rule.
    let d = run(
        &verifier,
        &[&pol],
        &pod("UPDATE", &[UNSIGNED], &[], &[], json!({})),
    )
    .await;
    assert!(d.allowed && d.results.is_empty());
}

/// A Pod whose annotation `list` holds `n` comma-separated items.
fn pod_with_long_list(n: usize) -> AdmissionRequest {
    let list = vec!["a"; n].join(",");
    pod("CREATE", &[SIGNED], &[], &[], json!({ "list": list }))
}

const SPLIT_LIST: &str = "validations:
- expression: \"object.metadata.annotations['list'].split(',').all(a, a != 'forbidden')\"
";

#[tokio::test]
async fn cel_cost_budget_follows_failure_policy() {
    for failure_policy in ["Fail", "Ignore"] {
        let pol = pod_policy(
            "costly",
            &format!("failurePolicy: {failure_policy}\n{}", lenient(SPLIT_LIST)),
        );
        let cheap = run(&FakeVerifier::new(), &[&pol], &pod_with_long_list(10)).await;
        assert!(cheap.allowed, "{:?}", statuses(&cheap));
        assert_eq!(cheap.results[0].status, Status::Pass);

        let d = run(&FakeVerifier::new(), &[&pol], &pod_with_long_list(400_000)).await;
        let budget = "CEL cost budget exceeded";
        if failure_policy == "Fail" {
            assert!(!d.allowed);
            let message = d.message.clone().unwrap_or_default();
            assert!(message.starts_with("Policy costly error: "), "{message}");
            assert!(message.contains(budget), "{message}");
            assert_eq!(d.results[0].status, Status::Error);
        } else {
            assert!(d.allowed, "{:?}", statuses(&d));
            assert_eq!(d.results[0].status, Status::Skip);
            assert!(
                d.warnings.iter().any(|w| w.contains(budget)),
                "{:?}",
                d.warnings
            );
        }
    }
}

#[tokio::test]
async fn cel_evaluation_stops_at_the_request_deadline() {
    let pol = pod_policy("late", &lenient(SPLIT_LIST));
    let d = validate(
        &FakeVerifier::new(),
        &NoResources,
        &[&pol],
        &pod_with_long_list(10_000),
        None,
        ivory_clock::now(),
    )
    .await;
    assert!(!d.allowed);
    let message = d.message.unwrap_or_default();
    assert!(message.contains("deadline has passed"), "{message}");
}

/// `pod_policy` with the ivory pinning annotation set to `mode` (`None`: no annotation), and
/// its variants for controllers (autogen), in the order the routes select them.
fn pinned_policies(mode: Option<&str>) -> Vec<CompiledPolicy> {
    let annotation = mode
        .map(|m| format!("  annotations:\n    ivory.dev/digest-pinning: {m}\n"))
        .unwrap_or_default();
    pinned_policies_annotated(&annotation)
}

/// [`pinned_policies`] with `annotation` (YAML lines under `metadata`).
fn pinned_policies_annotated(annotation: &str) -> Vec<CompiledPolicy> {
    let body: String = format!(
        "matchConstraints:\n  resourceRules:\n  - apiGroups: ['']\n    apiVersions: ['v1']\n    operations: ['CREATE', 'UPDATE']\n    resources: ['pods']\nmatchImageReferences:\n- glob: 'ghcr.io/*'\n{}{VERIFY_ALL}",
        attestors(&["cosign"])
    )
    .lines()
    .map(|l| format!("  {l}\n"))
    .collect();
    let p = load(&format!(
        "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata:\n  name: pin\n{annotation}spec:\n{body}"
    ));
    assert!(!p.autogen.is_empty(), "a pod policy has autogen variants");
    let mut all = vec![p.clone()];
    all.extend(p.autogen.iter().cloned());
    all
}

async fn judged(
    policies: &[CompiledPolicy],
    req: &AdmissionRequest,
    namespace: Option<&Value>,
) -> (Decision, usize, usize) {
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    let refs: Vec<&CompiledPolicy> = policies.iter().collect();
    let d = validate(
        &verifier,
        &NoResources,
        &refs,
        req,
        namespace,
        ivory_clock::now() + Duration::from_secs(10),
    )
    .await;
    (d, verifier.calls(), verifier.resolves())
}

#[tokio::test]
async fn verify_digest_follows_the_pinning_mode_and_every_tag_is_still_verified() {
    let no_digest =
        |image: &str| format!("Policy pin failed: image {image} does not have a digest");
    let denied = "Policy pin failed: failed the image Signature verification";
    // (mode, request, expected message); a tag the mode leaves unpinned is verified as is
    // (the verifier resolves it and verifies that digest).
    let cases: Vec<(Option<&str>, AdmissionRequest, Option<String>)> = vec![
        // Kyverno's behaviour: both the Pod and the template must carry digests.
        (None, create(&[SIGNED]), Some(no_digest(SIGNED))),
        (None, deployment(json!({}), SIGNED), Some(no_digest(SIGNED))),
        // pods-only: the template is left as applied, so its tags are verified; Pods are pinned.
        (Some("pods-only"), deployment(json!({}), SIGNED), None),
        (
            Some("pods-only"),
            deployment(json!({}), UNSIGNED),
            Some(denied.to_owned()),
        ),
        (
            Some("pods-only"),
            create(&[SIGNED]),
            Some(no_digest(SIGNED)),
        ),
        (
            Some("pods-only"),
            create(&[PINNED]),
            Some(denied.to_owned()),
        ),
        // no-patch: nothing is pinned, every tag is verified, an unsigned one denied.
        (Some("no-patch"), create(&[SIGNED]), None),
        (
            Some("no-patch"),
            create(&[UNSIGNED]),
            Some(denied.to_owned()),
        ),
        (Some("no-patch"), deployment(json!({}), SIGNED), None),
        (
            Some("no-patch"),
            deployment(json!({}), UNSIGNED),
            Some(denied.to_owned()),
        ),
    ];
    for (mode, req, message) in cases {
        let (d, calls, _) = judged(&pinned_policies(mode), &req, None).await;
        let what = format!("{mode:?} {:?}", req.kind.kind);
        assert_eq!(d.message, message, "{what}");
        assert_eq!(d.allowed, message.is_none(), "{what}");
        assert_eq!(calls, 1, "{what}: the image is verified in every mode");
    }
}

#[tokio::test]
async fn a_namespace_label_narrows_to_pods_only_and_to_no_patch_only_with_the_policys_consent() {
    let policies = pinned_policies(None);
    let ns = |value: &str| {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "default", "labels": {"ivory.dev/digest-pinning": value}}})
    };
    let no_digest = format!("Policy pin failed: image {SIGNED} does not have a digest");
    let pods_only = ns("pods-only");
    let (d, _, _) = judged(&policies, &deployment(json!({}), SIGNED), Some(&pods_only)).await;
    assert!(d.allowed, "{:?}", d.message);
    let (d, _, _) = judged(&policies, &create(&[SIGNED]), Some(&pods_only)).await;
    assert_eq!(d.message.as_deref(), Some(no_digest.as_str()));
    // `no-patch` is the policy author's choice: a namespace asking for it changes nothing...
    let no_patch = ns("no-patch");
    for req in [create(&[SIGNED]), deployment(json!({}), SIGNED)] {
        let (d, _, _) = judged(&policies, &req, Some(&no_patch)).await;
        assert_eq!(d.message.as_deref(), Some(no_digest.as_str()));
    }
    // ...unless the policy lets namespaces choose it; the tag is still verified.
    let consenting =
        pinned_policies_annotated("  annotations:\n    ivory.dev/namespace-digest-pinning: any\n");
    let denied = "Policy pin failed: failed the image Signature verification";
    for (req, message) in [
        (create(&[SIGNED]), None),
        (deployment(json!({}), SIGNED), None),
        (create(&[UNSIGNED]), Some(denied)),
    ] {
        let (d, calls, _) = judged(&consenting, &req, Some(&no_patch)).await;
        assert_eq!(d.message.as_deref(), message);
        assert_eq!(calls, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn image_data_asked_for_after_the_deadline_is_a_spent_budget_not_an_error() {
    let pol = pod_policy(
        "late",
        &lenient(
            "failurePolicy: Ignore\nvalidations:\n- expression: object.spec.containers.all(c, image.GetMetadata(c.image).config.os == 'linux')\n",
        ),
    );
    // The policy's own image answers only after the request's 10 s budget.
    let verifier = FakeVerifier::new().host("ghcr.io", Mode::Sleep(Duration::from_secs(20)));
    let d = run(
        &verifier,
        &[&pol],
        &create(&[SIGNED, "docker.io/library/nginx:1"]),
    )
    .await;
    assert!(d.allowed, "{:?}", d.message);
    assert!(d.budget_exhausted);
    assert_eq!(statuses(&d)[0].1, Status::Skip, "{:?}", d.results);
}

#[tokio::test]
async fn an_unparseable_image_is_answered_where_it_is_parsed_and_never_reaches_the_verifier() {
    let pol = pod_policy("refs", &no_digest(VERIFY_ALL));
    let verifier = FakeVerifier::new().sign(SIGNED, "cosign");
    // ggcr's grammar wants a repository of at least two characters.
    let d = run(&verifier, &[&pol], &create(&[SIGNED, "ghcr.io/x:1"])).await;
    assert!(!d.allowed);
    let message = d.message.unwrap_or_default();
    assert!(
        message.contains(
            "ghcr.io/x:1: invalid image reference (repository must be between 2 and 255 characters in length: x)"
        ),
        "{message}"
    );
    // The verifier got parsed references only: the valid image, never the invalid one.
    let asked: Vec<String> = verifier
        .requests()
        .iter()
        .map(|r| r.image.original().to_owned())
        .collect();
    assert_eq!(asked, vec![SIGNED.to_owned()]);
}
