//! A cluster policy named on the namespaced route (`/nivpol/...`): Kyverno ignores the name and
//! allows; ivory denies it as an unknown policy and says where that policy is served. This
//! cannot break a webhook configuration Kyverno (or `ivory webhooks`) generates, because both put
//! only NamespacedImageValidatingPolicy names on `/nivpol/...` paths, even when a cluster and a
//! namespaced policy share a name; the test shows that too (docs/SECURITY.md).

use std::process::Command;

use serde_json::Value;

use crate::util::{BIN, Ivory, pod_review, policies_dir};

/// A policy `shared` of `kind` for Pod CREATEs (`metadata` lines after the name), whose one
/// validation is `expression`, checking nothing about images.
fn shared(kind: &str, metadata: &str, validation: &str) -> String {
    format!(
        "apiVersion: policies.kyverno.io/v1
kind: {kind}
metadata:
  name: shared
{metadata}spec:
  matchConstraints:
    resourceRules:
      - {{apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE], resources: [pods]}}
  validationConfigurations: {{mutateDigest: false, verifyDigest: false, required: false}}
  attestors: []
  validations:
{validation}"
    )
}

/// The cluster policy `shared`: denies every Pod.
fn cluster() -> String {
    shared(
        "ImageValidatingPolicy",
        "",
        "    - expression: \"false\"\n      message: cluster policy ran\n",
    )
}

/// The NamespacedImageValidatingPolicy `shared` in `default`: admits every Pod.
fn namespaced() -> String {
    shared(
        "NamespacedImageValidatingPolicy",
        "  namespace: default\n",
        "    - expression: \"true\"\n",
    )
}

/// Every webhook path `ivory webhooks` generates for the policies in `dir`.
fn generated_paths(dir: &std::path::Path) -> Vec<String> {
    let out = Command::new(BIN)
        .args(["webhooks", "--policies"])
        .arg(dir)
        .args(["--url", "https://ivory.test"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut paths = Vec::new();
    for doc in text.split("---\n").filter(|d| !d.trim().is_empty()) {
        let value: Value = ivory_policy::yaml::from_str(doc).unwrap();
        for hook in value["webhooks"].as_array().into_iter().flatten() {
            let url = hook["clientConfig"]["url"].as_str().unwrap_or_default();
            paths.push(url.trim_start_matches("https://ivory.test").to_owned());
        }
    }
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_policy_name_on_the_namespaced_route_is_denied_and_never_generated() {
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    std::fs::write(policies.join("cluster.yaml"), cluster()).unwrap();
    std::fs::write(policies.join("namespaced.yaml"), namespaced()).unwrap();
    std::fs::write(
        policies.join("only-cluster.yaml"),
        cluster().replace("name: shared", "name: only-cluster"),
    )
    .unwrap();

    // The generated configuration: cluster names only on /ivpol, namespaced only on /nivpol.
    let paths = generated_paths(&policies);
    assert!(!paths.is_empty());
    for path in &paths {
        if path.starts_with("/nivpol/") {
            assert!(!path.contains("only-cluster"), "{paths:?}");
        }
    }
    assert!(
        paths
            .iter()
            .any(|p| p.starts_with("/nivpol/validate/") && p.contains("shared")),
        "{paths:?}"
    );
    assert!(
        paths
            .iter()
            .any(|p| p.starts_with("/ivpol/validate/") && p.contains("shared")),
        "{paths:?}"
    );

    let ivory = Ivory::start_policies(dir.path(), &policies).await;
    // Same name on both routes: each route runs its own kind.
    let resp = ivory
        .review("/nivpol/validate/shared", &pod_review("r-1", &["nginx"]))
        .await;
    assert_eq!(
        resp["allowed"], true,
        "the namespaced policy passes: {resp}"
    );
    let resp = ivory
        .review("/ivpol/validate/shared", &pod_review("r-2", &["nginx"]))
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(
        resp["status"]["message"],
        "Policy shared failed: cluster policy ran"
    );
    // A cluster policy named on the namespaced route: denied, saying where it is served.
    let resp = ivory
        .review(
            "/nivpol/validate/only-cluster",
            &pod_review("r-3", &["nginx"]),
        )
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["code"], 404);
    assert_eq!(
        resp["status"]["message"],
        "ivory: unknown NamespacedImageValidatingPolicy policies: only-cluster (the webhook \
         configuration names policies that are not loaded; loaded as ImageValidatingPolicy: \
         only-cluster, which /ivpol/... serves)"
    );
}
