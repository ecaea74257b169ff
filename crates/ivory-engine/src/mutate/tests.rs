use std::time::Duration;

use base64::Engine as _;
use ivory_policy::compiled::CompiledPolicy;
use ivory_policy::types::{Credentials, FailurePolicy, PolicySpec, ValidationAction};
use serde_json::json;
use tokio::time::Instant;

use super::*;
use crate::admission::response_from_decision;
use crate::admission::testutil::{condition, glob, pod_rule, policy, request, rule, sent};
use crate::decision::{PatchOp, Status};
use crate::resources::NoResources;
use crate::testing::{FakeVerifier, Mode};

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

/// The registry the mutating stage asks: five tags with known digests, every other tag
/// unknown (the shared fake, strict about digests).
fn standard() -> FakeVerifier {
    FakeVerifier::new()
        .digest("docker.io/nginx:latest", &digest('a'))
        .digest("docker.io/busybox:1.36", &digest('b'))
        .digest("ghcr.io/kyverno/test-verify-image:signed", &digest('c'))
        .digest("docker.io/alpine:3.20", &digest('d'))
        .digest("registry.example.com/team/api:1.0", &digest('e'))
        .only_known_digests()
}

/// `image` cannot be read from Docker Hub: the registry says `message`.
fn unavailable(image: &str, message: &str) -> VerifyError {
    VerifyError::Unavailable {
        image: image.into(),
        registry: "index.docker.io".into(),
        message: message.into(),
    }
}

fn op(path: &str, value: String) -> PatchOp {
    PatchOp {
        path: path.into(),
        value,
    }
}

fn pod_pins() -> Vec<PatchOp> {
    vec![
        op(
            "/spec/initContainers/0/image",
            format!("docker.io/busybox:1.36@{}", digest('b')),
        ),
        op(
            "/spec/containers/0/image",
            format!("docker.io/nginx:latest@{}", digest('a')),
        ),
        op(
            "/spec/containers/1/image",
            format!("ghcr.io/kyverno/test-verify-image:signed@{}", digest('c')),
        ),
    ]
}

fn pod_policy(name: &str) -> CompiledPolicy {
    policy(name, vec![pod_rule()])
}

fn later(secs: u64) -> Instant {
    ivory_clock::now() + Duration::from_secs(secs)
}

async fn run(fake: &FakeVerifier, policies: &[&CompiledPolicy], file: &str) -> Decision {
    let d = mutate(
        fake,
        &NoResources,
        policies,
        &request(file),
        None,
        later(10),
    )
    .await;
    assert_eq!(
        fake.calls(),
        0,
        "the mutating stage neither verifies nor reads image data"
    );
    d
}

#[tokio::test(start_paused = true)]
async fn pins_every_undigested_image_once() {
    let fake = standard();
    let p = pod_policy("pin");
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(d.allowed);
    assert_eq!(d.message, None);
    assert_eq!(d.patch, pod_pins());
    assert!(d.warnings.is_empty());
    assert_eq!(d.results.len(), 1);
    assert_eq!(d.results[0].status, Status::Pass);
    assert_eq!(
        fake.resolved(),
        vec![
            ("docker.io/busybox:1.36".to_owned(), false),
            ("docker.io/nginx:latest".to_owned(), false),
            ("ghcr.io/kyverno/test-verify-image:signed".to_owned(), false),
        ],
        "the digest reference is never looked up"
    );
}

#[tokio::test(start_paused = true)]
async fn controllers_are_pinned_in_their_template() {
    let fake = standard();
    let p = policy(
        "pin",
        vec![rule(&["CREATE"], &["apps"], &["v1"], &["deployments"])],
    );
    let d = run(&fake, &[&p], "deployment-create.json").await;
    assert_eq!(
        d.patch,
        vec![
            op(
                "/spec/template/spec/initContainers/0/image",
                format!("docker.io/alpine:3.20@{}", digest('d'))
            ),
            op(
                "/spec/template/spec/containers/0/image",
                format!("registry.example.com/team/api:1.0@{}", digest('e'))
            ),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn replication_controllers_are_pinned() {
    let fake = standard();
    let fake = fake.digest("docker.io/httpd:2.4", &digest('9'));
    let p = policy(
        "rc",
        vec![rule(
            &["CREATE"],
            &[""],
            &["v1"],
            &["replicationcontrollers"],
        )],
    );
    let d = run(&fake, &[&p], "replicationcontroller-create.json").await;
    assert_eq!(
        d.patch,
        vec![op(
            "/spec/template/spec/containers/0/image",
            format!("docker.io/httpd:2.4@{}", digest('9'))
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn match_image_references_use_the_normalized_string() {
    let fake = standard();
    let mut p = pod_policy("docker-hub");
    p.image_matchers = vec![glob("docker.io/*")];
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert_eq!(d.patch, pod_pins()[..2].to_vec());
    assert_eq!(
        d.results[0].images,
        vec!["docker.io/busybox:1.36", "docker.io/nginx:latest"]
    );
}

#[tokio::test(start_paused = true)]
async fn patches_are_deduplicated_across_policies() {
    let fake = standard();
    let mut nginx = pod_policy("nginx-only");
    nginx.image_matchers = vec![glob("docker.io/nginx*")];
    let all = pod_policy("all");
    let d = run(&fake, &[&nginx, &all], "pod-create.json").await;
    // nginx (first policy) comes first; the second policy adds only the other paths.
    assert_eq!(
        d.patch,
        vec![
            pod_pins()[1].clone(),
            pod_pins()[0].clone(),
            pod_pins()[2].clone()
        ]
    );
    assert_eq!(fake.resolved().len(), 3, "one lookup per distinct image");
    assert_eq!(d.results.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn different_credentials_are_looked_up_separately() {
    let fake = standard();
    let plain = pod_policy("plain");
    let mut creds = pod_policy("creds");
    creds = creds.with_spec(PolicySpec {
        credentials: Some(Credentials {
            secrets: vec!["regcred".into()],
            ..Credentials::default()
        }),
        ..PolicySpec::default()
    });
    let d = run(&fake, &[&plain, &creds], "pod-create.json").await;
    assert_eq!(d.patch, pod_pins());
    assert_eq!(fake.resolved().len(), 6);
    assert_eq!(fake.resolved().iter().filter(|(_, c)| *c).count(), 3);
}

#[tokio::test(start_paused = true)]
async fn resolution_failure_with_deny_denies_without_patch() {
    let fake = standard().fail(
        "docker.io/nginx:latest",
        unavailable("docker.io/nginx:latest", "503 Service Unavailable"),
    );
    let p = pod_policy("pin");
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(!d.allowed);
    assert!(d.patch.is_empty());
    assert_eq!(
        d.message.as_deref(),
        Some(
            "Policy pin error: failed to update digest: failed to resolve digest for image \
             docker.io/nginx:latest: 503 Service Unavailable"
        )
    );
    assert_eq!(d.results[0].status, Status::Error);
    assert!(d.warnings.is_empty());
}

#[tokio::test(start_paused = true)]
async fn failures_are_joined_per_policy_and_across_policies() {
    let fake = standard()
        .fail(
            "docker.io/nginx:latest",
            unavailable("docker.io/nginx:latest", "boom"),
        )
        .fail(
            "docker.io/busybox:1.36",
            unavailable("docker.io/busybox:1.36", "bang"),
        );
    let a = pod_policy("a");
    let b = pod_policy("b");
    let d = run(&fake, &[&a, &b], "pod-create.json").await;
    let one = "failed to update digest: failed to resolve digest for image docker.io/busybox:1.36: bang; \
               failed to resolve digest for image docker.io/nginx:latest: boom";
    assert_eq!(
        d.message.unwrap(),
        format!("Policy a error: {one}; Policy b error: {one}")
    );
}

#[tokio::test(start_paused = true)]
async fn resolution_failure_with_warn_warns_and_pins_the_rest() {
    let fake = standard().fail(
        "docker.io/nginx:latest",
        unavailable("docker.io/nginx:latest", "503"),
    );
    let mut p = pod_policy("pin");
    p.actions = vec![ValidationAction::Warn];
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(d.allowed);
    assert_eq!(d.patch, vec![pod_pins()[0].clone(), pod_pins()[2].clone()]);
    assert_eq!(
        d.warnings,
        vec![
            "Policy pin error: failed to update digest: failed to resolve digest for image \
             docker.io/nginx:latest: 503"
        ]
    );

    // Audit only: no warning, no denial, the result still records the error.
    p.actions = vec![ValidationAction::Audit];
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(d.allowed);
    assert!(d.warnings.is_empty());
    assert_eq!(d.patch.len(), 2);
    assert_eq!(d.results[0].status, Status::Error);
    assert!(d.results[0].message.contains("503"));
}

#[tokio::test(start_paused = true)]
async fn invalid_digest_from_the_registry_is_an_error() {
    let fake = standard();
    let fake = fake.digest("docker.io/nginx:latest", "latest");
    let p = pod_policy("pin");
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(!d.allowed);
    assert!(
        d.message.unwrap().contains("invalid digest \"latest\""),
        "a bad answer never reaches the patch"
    );
}

#[tokio::test(start_paused = true)]
async fn lookups_run_concurrently() {
    let fake = standard()
        .image(
            "docker.io/nginx:latest",
            Mode::Sleep(Duration::from_secs(1)),
        )
        .image(
            "docker.io/busybox:1.36",
            Mode::Sleep(Duration::from_secs(1)),
        )
        .image(
            "ghcr.io/kyverno/test-verify-image:signed",
            Mode::Sleep(Duration::from_secs(1)),
        );
    let p = pod_policy("pin");
    let start = ivory_clock::now();
    let d = mutate(
        &fake,
        &NoResources,
        &[&p],
        &request("pod-create.json"),
        None,
        later(5),
    )
    .await;
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(d.patch, pod_pins());
}

#[tokio::test(start_paused = true)]
async fn deadline_with_failure_policy_fail_denies() {
    let fake = standard().image(
        "docker.io/nginx:latest",
        Mode::Sleep(Duration::from_secs(30)),
    );
    let mut p = pod_policy("pin");
    p.actions = vec![ValidationAction::Warn]; // budget exhaustion denies regardless of actions
    let start = ivory_clock::now();
    let deadline = later(2);
    let d = mutate(
        &fake,
        &NoResources,
        &[&p],
        &request("pod-create.json"),
        None,
        deadline,
    )
    .await;
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "never waits past the deadline"
    );
    assert!(!d.allowed);
    assert!(d.patch.is_empty());
    let message = d.message.unwrap();
    assert_eq!(
        message,
        "Policy pin error: failed to update digest: failed to resolve digest for image \
         docker.io/nginx:latest: time budget of 2000ms exhausted while resolving the image \
         digest at registry index.docker.io"
    );
    assert_eq!(d.warnings, vec![message]);
    assert!(d.audit_annotations.is_empty());
}

#[tokio::test(start_paused = true)]
async fn deadline_with_failure_policy_ignore_admits_unpinned() {
    let fake = standard().image(
        "docker.io/nginx:latest",
        Mode::Sleep(Duration::from_secs(30)),
    );
    let mut p = pod_policy("pin");
    p.failure_policy = FailurePolicy::Ignore;
    let start = ivory_clock::now();
    let d = mutate(
        &fake,
        &NoResources,
        &[&p],
        &request("pod-create.json"),
        None,
        later(2),
    )
    .await;
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert!(d.allowed);
    assert_eq!(d.patch, vec![pod_pins()[0].clone(), pod_pins()[2].clone()]);
    assert_eq!(d.warnings.len(), 1);
    assert!(
        d.warnings[0].starts_with(
            "Policy pin: image docker.io/nginx:latest admitted without a pinned digest"
        ),
        "{}",
        d.warnings[0]
    );
    assert_eq!(
        d.audit_annotations
            .get(AUDIT_UNPINNED_IMAGES)
            .map(String::as_str),
        Some("docker.io/nginx:latest")
    );
    assert_eq!(d.results[0].status, Status::Error);
}

#[tokio::test(start_paused = true)]
async fn verifier_deadline_error_applies_failure_policy() {
    let fake = standard().fail(
        "docker.io/nginx:latest",
        VerifyError::DeadlineExceeded {
            image: "docker.io/nginx:latest".into(),
            registry: "index.docker.io".into(),
            operation: "fetching the manifest".into(),
            budget_ms: 1500,
        },
    );
    let mut p = pod_policy("pin");
    p.actions = vec![ValidationAction::Audit];
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(!d.allowed);
    assert!(d.message.unwrap().contains(
        "docker.io/nginx:latest: time budget of 1500ms exhausted while fetching the manifest \
         at registry index.docker.io"
    ));
    p.failure_policy = FailurePolicy::Ignore;
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(d.allowed);
    assert_eq!(d.patch.len(), 2);
    assert!(d.audit_annotations.contains_key(AUDIT_UNPINNED_IMAGES));
}

#[tokio::test(start_paused = true)]
async fn skipped_requests_and_policies() {
    let fake = standard();
    let p = policy("pin", vec![rule(&["*"], &["*"], &["*"], &["*"])]);
    let mut off = pod_policy("off");
    off.mutate_digest = false;
    let cases = [
        ("pod-delete.json", vec![&p]),
        ("configmap-create.json", vec![&p]),
        ("namespace-create.json", vec![&p]),
        ("pod-create.json", vec![&off]),
    ];
    for (file, policies) in cases {
        let d = run(&fake, &policies, file).await;
        assert!(d.allowed, "{file}");
        assert!(d.patch.is_empty(), "{file}");
        assert!(d.message.is_none(), "{file}");
    }
    // A policy that does not match the request (rule for deployments) is silent.
    let deploy_only = policy(
        "d",
        vec![rule(&["CREATE"], &["apps"], &["v1"], &["deployments"])],
    );
    let d = run(&fake, &[&deploy_only], "pod-create.json").await;
    assert!(d.results.is_empty());
    assert!(fake.resolved().is_empty());
}

#[tokio::test(start_paused = true)]
async fn ephemeral_containers_are_pinned() {
    let fake = standard();
    let fake = fake.digest("docker.io/busybox:debug", &digest('f'));
    let p = policy(
        "debug",
        vec![rule(
            &["UPDATE"],
            &[""],
            &["v1"],
            &["pods/ephemeralcontainers"],
        )],
    );
    let d = run(&fake, &[&p], "pod-ephemeralcontainers.json").await;
    // Only the ephemeral container: the subresource cannot change any other field.
    assert_eq!(
        d.patch,
        vec![op(
            "/spec/ephemeralContainers/0/image",
            format!("docker.io/busybox:debug@{}", digest('f'))
        )]
    );
    assert_eq!(
        fake.resolved(),
        vec![("docker.io/busybox:debug".to_owned(), false)]
    );
}

/// A request whose pod spec (at `spec`) has `images` as containers and `volumes` as image
/// volumes.
fn pod_with(
    file: &str,
    containers: &[&str],
    volumes: &[&str],
) -> crate::admission::AdmissionRequest {
    let mut req = request(file);
    req.object.as_mut().unwrap().edit(|object| {
        let spec = object.pointer_mut("/spec").unwrap();
        spec["initContainers"] = json!([]);
        spec["containers"] = containers
            .iter()
            .enumerate()
            .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
            .collect();
        spec["volumes"] = volumes
            .iter()
            .enumerate()
            .map(|(i, image)| json!({"name": format!("v{i}"), "image": {"reference": image}}))
            .collect();
    });
    req
}

#[tokio::test(start_paused = true)]
async fn canonical_spellings_are_pinned() {
    let fake = standard();
    let fake = fake.digest("GHCR.IO:443/acme/app:v1", &digest('1'));
    let fake = fake.digest("index.docker.io/library/busybox:1.36", &digest('2'));
    let mut p = pod_policy("p");
    p.image_matchers = vec![glob("ghcr.io/acme/*"), glob("docker.io/library/*")];
    let req = pod_with(
        "pod-create.json",
        &[
            "GHCR.IO:443/acme/app:v1",
            "index.docker.io/library/busybox:1.36",
        ],
        &[],
    );
    let d = mutate(&fake, &NoResources, &[&p], &req, None, later(10)).await;
    assert!(d.allowed, "{:?}", d.message);
    assert_eq!(
        d.patch,
        vec![
            op(
                "/spec/containers/0/image",
                format!("GHCR.IO:443/acme/app:v1@{}", digest('1'))
            ),
            op(
                "/spec/containers/1/image",
                format!("index.docker.io/library/busybox:1.36@{}", digest('2'))
            ),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn image_volumes_are_pinned_on_create_only() {
    let fake = standard();
    let fake = fake.digest("ghcr.io/acme/models:v1", &digest('7'));
    let p = pod_policy("p");
    let req = pod_with("pod-create.json", &[], &["ghcr.io/acme/models:v1"]);
    let d = mutate(&fake, &NoResources, &[&p], &req, None, later(10)).await;
    assert_eq!(
        d.patch,
        vec![op(
            "/spec/volumes/0/image/reference",
            format!("ghcr.io/acme/models:v1@{}", digest('7'))
        )]
    );
    // Pod volumes are immutable: a Pod UPDATE cannot change them, so none is patched.
    let req = pod_with("pod-update.json", &[], &["ghcr.io/acme/models:v1"]);
    let d = mutate(&fake, &NoResources, &[&p], &req, None, later(10)).await;
    assert!(d.allowed && d.patch.is_empty(), "{d:?}");
}

#[tokio::test(start_paused = true)]
async fn malformed_images_are_a_policy_error_per_failure_policy() {
    let fake = standard();
    let mut p = pod_policy("pin");
    // Not matched by the glob, and still an error: Kyverno fails the whole extraction.
    p.image_matchers = vec![glob("ghcr.io/acme/*")];
    let req = pod_with(
        "pod-create.json",
        &["nginx", "GHCR.IO/Acme/App:v1"],
        &["bad image"],
    );
    let d = mutate(&fake, &NoResources, &[&p], &req, None, later(10)).await;
    assert!(!d.allowed);
    assert!(d.patch.is_empty());
    assert_eq!(
        d.message.as_deref(),
        Some(
            "Policy pin error: failed to update digest: invalid image 'GHCR.IO/Acme/App:v1' \
             (repository can only contain the characters `abcdefghijklmnopqrstuvwxyz0123456789_-./`: Acme/App); \
             invalid image 'bad image' (repository can only contain the characters \
             `abcdefghijklmnopqrstuvwxyz0123456789_-./`: bad image)"
        )
    );
    assert_eq!(d.results[0].status, Status::Error);

    p.failure_policy = FailurePolicy::Ignore;
    let d = mutate(&fake, &NoResources, &[&p], &req, None, later(10)).await;
    assert!(d.allowed);
    assert_eq!(
        d.audit_annotations
            .get(AUDIT_UNPINNED_IMAGES)
            .map(String::as_str),
        Some("GHCR.IO/Acme/App:v1,bad image")
    );
    assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
    assert!(d.warnings[0].starts_with(
        "Policy pin: image GHCR.IO/Acme/App:v1 admitted without a pinned digest \
         (failurePolicy Ignore): failed to update digest: invalid image 'GHCR.IO/Acme/App:v1'"
    ));
    assert_eq!(d.results[0].status, Status::Error);
}

#[tokio::test(start_paused = true)]
async fn match_conditions_gate_mutation() {
    let fake = standard();
    let mut p = pod_policy("pin");
    p.match_conditions = vec![condition("only-api", "object.metadata.name == 'api'")];
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(d.patch.is_empty() && d.results.is_empty());

    p.match_conditions = vec![condition("broken", "object.spec.nothere")];
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(!d.allowed);
    assert!(d.message.unwrap().starts_with(
        "Policy pin error: failed to evaluate match conditions: matchCondition \"broken\""
    ));

    p.failure_policy = FailurePolicy::Ignore;
    let d = run(&fake, &[&p], "pod-create.json").await;
    assert!(d.allowed && d.patch.is_empty() && d.results.is_empty());
    assert!(fake.resolved().is_empty());
}

#[tokio::test(start_paused = true)]
async fn response_patch_decodes_to_the_ops() {
    let fake = standard();
    let p = pod_policy("pin");
    let req = request("pod-create.json");
    let d = mutate(&fake, &NoResources, &[&p], &req, None, later(10)).await;
    let wire = sent(&response_from_decision(&req, &d));
    assert_eq!(wire["response"]["uid"], "pod-create-uid");
    assert_eq!(wire["response"]["allowed"], true);
    assert_eq!(wire["response"]["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(wire["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        patch,
        json!([
            {"op": "replace", "path": "/spec/initContainers/0/image",
             "value": format!("docker.io/busybox:1.36@{}", digest('b'))},
            {"op": "replace", "path": "/spec/containers/0/image",
             "value": format!("docker.io/nginx:latest@{}", digest('a'))},
            {"op": "replace", "path": "/spec/containers/1/image",
             "value": format!("ghcr.io/kyverno/test-verify-image:signed@{}", digest('c'))},
        ])
    );
}

/// Policies as users write them, through ivory-policy's loader (autogen included).
fn load(yaml: &str) -> Vec<std::sync::Arc<CompiledPolicy>> {
    let report = ivory_policy::load_str(yaml, "test.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report
        .policies
        .into_iter()
        .map(std::sync::Arc::new)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn default_policy_pins_controllers_through_autogen() {
    use crate::matching::{Route, select_policies};
    let fake = standard();
    let all = vec![std::sync::Arc::new(ivory_policy::default_policy())];
    let selected = select_policies(
        &all,
        Route { namespaced: false },
        &["ivory-pin-digests".to_owned()],
        Some("apps"),
    )
    .unwrap();
    assert_eq!(selected.len(), 3, "the policy and its two autogen variants");
    let d = run(&fake, &selected, "deployment-create.json").await;
    assert!(d.allowed);
    assert_eq!(d.patch.len(), 2);
    assert_eq!(d.patch[1].path, "/spec/template/spec/containers/0/image");
    assert_eq!(d.results.len(), 1, "only the deployments variant matched");
    assert_eq!(d.results[0].policy, "ivory-pin-digests");
    let d = run(&fake, &selected, "pod-create.json").await;
    assert_eq!(d.patch, pod_pins());
}

#[tokio::test(start_paused = true)]
async fn loaded_policy_with_cel_image_reference() {
    let fake = standard();
    let policies = load(
        r#"
apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: ghcr-only
spec:
  validationActions: [Warn]
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods"]
  matchImageReferences:
    - expression: "parseImageReference(ref).registry() == 'ghcr.io'"
  attestors: []
  validations:
    - expression: "true"
"#,
    );
    let p = &policies[0];
    assert_eq!(p.actions, vec![ValidationAction::Warn]);
    let d = run(&fake, &[p], "pod-create.json").await;
    assert_eq!(d.patch, vec![pod_pins()[2].clone()]);
    assert_eq!(fake.resolved().len(), 1);
}

/// `pod_policy` with the ivory pinning annotation, through the loader, with its autogen variants.
fn pinning_policies(mode: &str) -> Vec<CompiledPolicy> {
    pinning_policies_with(mode, "pods-only")
}

/// [`pinning_policies`] with `ivory.dev/namespace-digest-pinning: namespaces` too.
fn pinning_policies_with(mode: &str, namespaces: &str) -> Vec<CompiledPolicy> {
    let p = load(&format!(
        r#"
apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: pin
  annotations:
    ivory.dev/digest-pinning: {mode}
    ivory.dev/namespace-digest-pinning: {namespaces}
spec:
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["pods"]
  attestors: []
  validations:
    - expression: "true"
"#
    ))
    .remove(0);
    let mut all = vec![(*p).clone()];
    all.extend(p.autogen.iter().cloned());
    all
}

async fn run_in(
    fake: &FakeVerifier,
    policies: &[CompiledPolicy],
    file: &str,
    namespace: Option<&serde_json::Value>,
) -> Decision {
    let refs: Vec<&CompiledPolicy> = policies.iter().collect();
    mutate(
        fake,
        &NoResources,
        &refs,
        &request(file),
        namespace,
        later(10),
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn pods_only_leaves_templates_as_applied_and_no_patch_pins_nothing() {
    let all = pinning_policies("all");
    let pods_only = pinning_policies("pods-only");
    let no_patch = pinning_policies("no-patch");
    let fake = standard();
    assert_eq!(
        run_in(&fake, &all, "deployment-create.json", None)
            .await
            .patch
            .len(),
        2,
        "Kyverno's behaviour pins the template"
    );
    for file in [
        "deployment-create.json",
        "cronjob-create.json",
        "replicaset-create.json",
    ] {
        let fake = standard();
        let d = run_in(&fake, &pods_only, file, None).await;
        assert!(d.allowed && d.patch.is_empty(), "{file}: {:?}", d.patch);
        assert!(fake.resolved().is_empty(), "{file}: nothing to resolve");
    }
    let d = run_in(&standard(), &pods_only, "pod-create.json", None).await;
    assert_eq!(d.patch, pod_pins(), "every Pod is still pinned");
    for file in ["pod-create.json", "deployment-create.json"] {
        let fake = standard();
        let d = run_in(&fake, &no_patch, file, None).await;
        assert!(d.allowed && d.patch.is_empty(), "{file}: {:?}", d.patch);
        assert!(d.results.is_empty() && fake.resolved().is_empty(), "{file}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_namespace_label_chooses_pods_only_and_no_patch_only_with_the_policys_consent() {
    let all = pinning_policies("all");
    let ns = |value: &str| {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "team", "labels": {"ivory.dev/digest-pinning": value}}})
    };
    let pods_only = ns("pods-only");
    let d = run_in(
        &standard(),
        &all,
        "deployment-create.json",
        Some(&pods_only),
    )
    .await;
    assert!(d.patch.is_empty() && d.warnings.is_empty(), "{d:?}");
    let d = run_in(&standard(), &all, "pod-create.json", Some(&pods_only)).await;
    assert_eq!(d.patch, pod_pins());
    // A namespace cannot switch pinning off unless the policy lets it: the template and the
    // Pod are pinned, and the ignored label named.
    let no_patch = ns("no-patch");
    for file in ["deployment-create.json", "pod-create.json"] {
        let d = run_in(&standard(), &all, file, Some(&no_patch)).await;
        assert!(!d.patch.is_empty(), "{file}");
        assert_eq!(
            d.warnings,
            [
                "namespace label ivory.dev/digest-pinning=no-patch is ignored by policy pin: a namespace may choose pods-only, and no-patch only where the policy allows it (ivory.dev/namespace-digest-pinning: any)"
            ]
        );
    }
    // With the policy's consent, nothing is patched and nothing is said.
    let consenting = pinning_policies_with("all", "any");
    for file in ["deployment-create.json", "pod-create.json"] {
        let fake = standard();
        let d = run_in(&fake, &consenting, file, Some(&no_patch)).await;
        assert!(d.patch.is_empty() && d.warnings.is_empty(), "{file}: {d:?}");
        assert!(fake.resolved().is_empty(), "{file}");
    }
}
