//! The validating stage with cluster reads (`resource.*`, `globalContext.*`) answered from an
//! in-memory source.

use std::sync::Arc;
use std::time::Duration;

use ivory_policy::{CompiledPolicy, ResourceRead};
use serde_json::{Value, json};

use super::validate;
use crate::admission::AdmissionRequest;
use crate::decision::{Decision, Status};
use crate::resources::{FileResources, NoResources, ObjectList, ResourceError, ResourceSource};
use crate::testing::FakeVerifier;

fn policy(kind: &str, failure: &str, expression: &str) -> CompiledPolicy {
    let namespace = if kind.starts_with("Namespaced") {
        "\n  namespace: team-a"
    } else {
        ""
    };
    let yaml = format!(
        "apiVersion: policies.kyverno.io/v1
kind: {kind}
metadata:
  name: registries{namespace}
spec:
  failurePolicy: {failure}
  matchConstraints:
    resourceRules:
    - apiGroups: ['']
      apiVersions: ['v1']
      operations: ['CREATE']
      resources: ['pods']
  validationConfigurations:
    verifyDigest: false
    required: false
  attestors: []
  validations:
  - expression: >-
      {expression}
    message: not an allowed registry
"
    );
    let report = ivory_policy::load_str(&yaml, "test.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().next().expect("one policy")
}

const BY_CONFIGMAP: &str = "images.containers.all(i, \
    i.startsWith(resource.Get('v1', 'configmaps', object.metadata.namespace, 'registries').data.allowed))";

fn pod(image: &str) -> AdmissionRequest {
    serde_json::from_value(json!({
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "userInfo": {"username": "alice"},
        "object": {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "image": image}]}},
    }))
    .expect("valid request")
}

fn registries(namespace: &str, allowed: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "registries", "namespace": namespace, "labels": {"role": "trust"}},
        "data": {"allowed": allowed}})
}

async fn run(source: &dyn ResourceSource, policy: &CompiledPolicy, image: &str) -> Decision {
    let deadline = ivory_clock::now() + Duration::from_secs(10);
    validate(
        &FakeVerifier::new(),
        source,
        &[policy],
        &pod(image),
        None,
        deadline,
    )
    .await
}

fn outcome(d: &Decision) -> (bool, Status, String) {
    let r = &d.results[0];
    (d.allowed, r.status, r.message.clone())
}

#[tokio::test]
async fn a_configmap_decides_and_a_missing_one_is_null() {
    let files = FileResources::new(vec![registries("team-a", "ghcr.io/acme/")]).unwrap();
    let p = policy("ImageValidatingPolicy", "Fail", BY_CONFIGMAP);
    assert_eq!(
        outcome(&run(&files, &p, "ghcr.io/acme/app:1").await).1,
        Status::Pass
    );
    let denied = run(&files, &p, "docker.io/evil/app:1").await;
    assert_eq!(
        outcome(&denied),
        (false, Status::Fail, "not an allowed registry".into())
    );
    // Kyverno answers null for a missing object; a policy can test for it.
    let none = FileResources::new(vec![registries("team-b", "ghcr.io/acme/")]).unwrap();
    let p = policy(
        "ImageValidatingPolicy",
        "Fail",
        "resource.Get('v1', 'configmaps', object.metadata.namespace, 'registries') == null",
    );
    assert_eq!(
        outcome(&run(&none, &p, "ghcr.io/acme/app:1").await).1,
        Status::Pass
    );
}

#[tokio::test]
async fn a_namespaced_policy_reads_its_own_namespace_only() {
    let files = FileResources::new(vec![
        registries("team-a", "ghcr.io/acme/"),
        registries("team-b", "docker.io/"),
    ])
    .unwrap();
    let p = policy(
        "NamespacedImageValidatingPolicy",
        "Fail",
        "images.containers.all(i, i.startsWith(resource.get('v1', 'configmaps', 'registries').data.allowed)) \
         && resource.list('v1', 'configmaps', {'role': 'trust'}).items.size() == 1",
    );
    assert_eq!(
        p.cluster_reads
            .resources
            .first()
            .and_then(|r| r.namespace.as_deref()),
        Some("team-a")
    );
    assert_eq!(
        outcome(&run(&files, &p, "ghcr.io/acme/app:1").await).1,
        Status::Pass
    );
    assert_eq!(
        outcome(&run(&files, &p, "docker.io/x/app:1").await).1,
        Status::Fail
    );
}

/// A source whose watch has not listed yet.
struct Unsynced;

impl ResourceSource for Unsynced {
    fn get(
        &self,
        what: &ResourceRead,
        _: &str,
        _: &str,
    ) -> Result<Option<Arc<Value>>, ResourceError> {
        Err(ResourceError::NotSynced {
            what: what.to_string(),
            detail: "listing".into(),
        })
    }
    fn list(&self, what: &ResourceRead) -> Result<ObjectList, ResourceError> {
        Err(ResourceError::NotSynced {
            what: what.to_string(),
            detail: "listing".into(),
        })
    }
    fn global_context(&self, _: &str) -> Result<Option<ObjectList>, ResourceError> {
        Ok(None)
    }
}

#[tokio::test]
async fn unavailable_cluster_data_follows_the_failure_policy_never_an_empty_answer() {
    // `== null` would be true on an empty answer: it must not be given one.
    let reads_null =
        "resource.Get('v1', 'configmaps', object.metadata.namespace, 'registries') == null";
    for source in [&Unsynced as &dyn ResourceSource, &NoResources] {
        let fail = policy("ImageValidatingPolicy", "Fail", reads_null);
        let (allowed, status, message) = outcome(&run(source, &fail, "ghcr.io/acme/app:1").await);
        assert_eq!((allowed, status), (false, Status::Error), "{message}");
        assert!(message.contains("cluster data unavailable"), "{message}");
        let ignore = policy("ImageValidatingPolicy", "Ignore", reads_null);
        let decision = run(source, &ignore, "ghcr.io/acme/app:1").await;
        let (allowed, status, message) = outcome(&decision);
        assert_eq!((allowed, status), (true, Status::Skip), "{message}");
        assert!(message.contains("failurePolicy Ignore"), "{message}");
    }
    let message = outcome(
        &run(
            &Unsynced,
            &policy("ImageValidatingPolicy", "Fail", BY_CONFIGMAP),
            "x",
        )
        .await,
    )
    .2;
    assert!(
        message.contains("v1 configmaps in all namespaces is not synced yet"),
        "{message}"
    );
}

#[tokio::test]
async fn a_variable_read_for_an_attestor_follows_the_failure_policy_too() {
    let yaml = "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: key-from-configmap
spec:
  failurePolicy: Ignore
  matchConstraints:
    resourceRules:
    - apiGroups: ['']
      apiVersions: ['v1']
      operations: ['CREATE']
      resources: ['pods']
  variables:
  - name: cm
    expression: resource.get('v1', 'configmaps', 'ivory', 'keys')
  attestors:
  - name: cosign
    cosign:
      key:
        expression: variables.cm.data.key
  validations:
  - expression: images.containers.all(i, verifyImageSignatures(i, [attestors.cosign]) > 0)
";
    let report = ivory_policy::load_str(yaml, "test.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let p = &report.policies[0];
    let decision = run(&Unsynced, p, "ghcr.io/acme/app:1").await;
    let (allowed, status, message) = outcome(&decision);
    assert_eq!((allowed, status), (true, Status::Skip), "{message}");
    assert!(
        message.contains("v1 configmaps in namespace ivory is not synced yet"),
        "{message}"
    );
}

#[tokio::test]
async fn global_context_entries_answer_their_objects() {
    let entry = json!({"apiVersion": "kyverno.io/v2beta1", "kind": "GlobalContextEntry",
        "metadata": {"name": "trusted"},
        "spec": {"kubernetesResource": {"version": "v1", "resource": "configmaps"}}});
    let files = FileResources::new(vec![registries("team-a", "ghcr.io/acme/"), entry]).unwrap();
    let p = policy(
        "ImageValidatingPolicy",
        "Fail",
        "images.containers.all(i, i.startsWith(globalContext.Get('trusted', '')[0].data.allowed))",
    );
    assert_eq!(
        outcome(&run(&files, &p, "ghcr.io/acme/app:1").await).1,
        Status::Pass
    );
    assert_eq!(
        outcome(&run(&files, &p, "quay.io/acme/app:1").await).1,
        Status::Fail
    );
}

/// A policy pinning only where a ConfigMap of ivory's namespace says so (its matchConditions
/// read the cluster in the mutating stage too).
fn pinning_policy(failure: &str) -> CompiledPolicy {
    let yaml = format!(
        "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: pin-where-told
spec:
  failurePolicy: {failure}
  matchConstraints:
    resourceRules:
    - apiGroups: ['']
      apiVersions: ['v1']
      operations: ['CREATE']
      resources: ['pods']
  matchConditions:
  - name: told
    expression: resource.Get('v1', 'configmaps', 'ivory', 'pinning').data.pin == 'yes'
  attestors: []
  validations:
  - expression: 'true'
"
    );
    let report = ivory_policy::load_str(&yaml, "test.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().next().expect("one policy")
}

#[tokio::test]
async fn the_mutating_stage_reads_the_cluster_in_match_conditions() {
    let told = |pin: &str| {
        FileResources::new(vec![json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "pinning", "namespace": "ivory"}, "data": {"pin": pin}})])
        .unwrap()
    };
    let deadline = || ivory_clock::now() + Duration::from_secs(10);
    let verifier = FakeVerifier::new();
    let p = pinning_policy("Fail");
    let req = pod("ghcr.io/acme/app:1");
    let pinned =
        crate::mutate::mutate(&verifier, &told("yes"), &[&p], &req, None, deadline()).await;
    assert!(pinned.allowed && pinned.patch.len() == 1, "{pinned:?}");
    let left = crate::mutate::mutate(&verifier, &told("no"), &[&p], &req, None, deadline()).await;
    assert!(left.allowed && left.patch.is_empty(), "{left:?}");
    // Unavailable: Fail denies, Ignore leaves the policy out; never "not matched" by accident.
    let failed = crate::mutate::mutate(&verifier, &Unsynced, &[&p], &req, None, deadline()).await;
    assert!(!failed.allowed, "{failed:?}");
    let ignore = pinning_policy("Ignore");
    let skipped =
        crate::mutate::mutate(&verifier, &Unsynced, &[&ignore], &req, None, deadline()).await;
    assert!(skipped.allowed && skipped.patch.is_empty(), "{skipped:?}");
}
