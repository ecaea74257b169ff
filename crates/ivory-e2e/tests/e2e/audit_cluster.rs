//! `ivory audit --kubeconfig` against a real kube-apiserver: Pods whose status carries the
//! image digest (set through the pods/status subresource, as no kubelet runs) or not, images in
//! a real registry with the signed fixtures, verdicts and namespaced PolicyReports; each Pod
//! evaluated in its own namespace (namespaceSelector) with its own imagePullSecrets, the cluster
//! found through KUBECONFIG when --kubeconfig has no file.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use ivory_e2e::{Cluster, create_namespace, run_ivory};
use ivory_testkit::policy::PodPolicy;
use ivory_testkit::policy::VERIFY_SIGNATURES;
use ivory_testkit::{HarnessOptions, RegistryHarness};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::setup::{
    cluster_with_crds, fixture_key_attestors, push_signed_and_unsigned, set_running_digest,
    workspace,
};

/// The digest `fixtures/manifest.json` records for `ivory/<layout>:v1`.
fn manifest_digest(layout: &str) -> Result<String> {
    let text = std::fs::read_to_string(workspace().join("fixtures/manifest.json"))?;
    let manifest: Value = serde_json::from_str(&text)?;
    let repo = format!("ivory/{layout}");
    manifest["images"]
        .as_array()
        .and_then(|images| {
            images
                .iter()
                .find(|i| i["repo"] == repo.as_str() && i["tag"] == "v1")
        })
        .and_then(|i| i["digest"].as_str())
        .map(str::to_owned)
        .with_context(|| format!("no digest for {repo}:v1 in fixtures/manifest.json"))
}

/// A key policy: the fixture cosign key must have signed every image of `host`.
fn policy_yaml(host: &str) -> Result<String> {
    Ok(PodPolicy::new("audit-signed")
        .glob(&format!("{host}/*"))
        .spec(&format!(
            "{}  validations:
    - expression: >-
        {VERIFY_SIGNATURES}
      message: unsigned image
",
            fixture_key_attestors()?
        ))
        .yaml())
}

/// Creates a one-container Pod, then sets its container status with `image_id` (what a kubelet
/// would report).
async fn pod_with_status(
    client: &Client,
    ns: &str,
    name: &str,
    image: &str,
    image_id: &str,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": image}]},
    }))?;
    pods.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating Pod {ns}/{name}"))?;
    let patched = set_running_digest(client, ns, name, image, image_id)
        .await
        .with_context(|| format!("setting the status of Pod {ns}/{name}"))?;
    let stored = patched
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|s| s.into_iter().next())
        .map(|s| s.image_id);
    ensure!(
        stored.as_deref() == Some(image_id),
        "status of {name} not stored: {stored:?}"
    );
    Ok(())
}

fn entry<'a>(doc: &'a Value, image: &str) -> Result<&'a Value> {
    doc["images"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["image"] == image))
        .with_context(|| format!("{image} not in the audit output: {doc}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_cluster_pods() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&[]).await?;
    let registry = RegistryHarness::start_default().await?;
    let ((signed, signed_digest), (unsigned, unsigned_digest)) =
        push_signed_and_unsigned(&registry).await?;
    let recorded = manifest_digest("sig-p256")?;
    ensure!(
        recorded == signed_digest,
        "pushed sig-p256 digest {signed_digest} differs from manifest.json {recorded}"
    );
    let host = registry.host().to_owned();
    let signed_ref = format!("{host}/ivory/sig-p256@{signed_digest}");

    let ns = create_namespace(&client, "e2e-audit").await?;
    // A runtime-reported digest (docker's form) for the signed image; containerd's bare image
    // id for the unsigned one, which falls back to the spec image.
    pod_with_status(
        &client,
        &ns,
        "signed",
        &signed,
        &format!("docker-pullable://{signed_ref}"),
    )
    .await?;
    let bare_id = format!("sha256:{}", "0".repeat(64));
    pod_with_status(&client, &ns, "unsigned", &unsigned, &bare_id).await?;

    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, policy_yaml(&host)?)?;
    let ca = dir.path().join("registry-ca.pem");
    std::fs::write(&ca, registry.ca_pem())?;
    let report = dir.path().join("report.yaml");
    let (code, stdout, stderr) = run_ivory(
        [
            "audit".as_ref(),
            "--kubeconfig".as_ref(),
            cluster.kubeconfig().as_os_str(),
            "--namespace".as_ref(),
            ns.as_ref(),
            "--policy".as_ref(),
            policy.as_os_str(),
            "--registry-ca".as_ref(),
            ca.as_os_str(),
            "--output".as_ref(),
            "json".as_ref(),
            "--policy-report".as_ref(),
            report.as_os_str(),
        ],
        &[],
    )
    .await?;
    ensure!(
        code == 1,
        "exit {code} (want 1: an image failed)\n{stdout}\n{stderr}"
    );
    let doc: Value =
        serde_json::from_str(&stdout).with_context(|| format!("stdout: {stdout}\n{stderr}"))?;
    ensure!(
        doc["summary"]["images"] == 2 && doc["summary"]["digests"] == 2,
        "summary: {}",
        doc["summary"]
    );
    let pass = entry(&doc, &signed_ref)?;
    ensure!(pass["verdict"] == "pass", "signed image: {pass}");
    ensure!(pass["digest"] == signed_digest.as_str(), "signed: {pass}");
    let fail = entry(&doc, &unsigned)?;
    ensure!(fail["verdict"] == "fail", "unsigned image: {fail}");
    ensure!(
        fail["digest"] == unsigned_digest.as_str(),
        "unsigned: {fail}"
    );

    let yaml = std::fs::read_to_string(&report)?;
    let reports: Vec<Value> = serde_saphyr::from_multiple(&yaml)?;
    ensure!(reports.len() == 1, "want one PolicyReport:\n{yaml}");
    let r = &reports[0];
    ensure!(
        r["apiVersion"] == "wgpolicyk8s.io/v1alpha2"
            && r["kind"] == "PolicyReport"
            && r["metadata"]["namespace"] == ns.as_str(),
        "report:\n{yaml}"
    );
    ensure!(
        r["summary"]["pass"] == 1 && r["summary"]["fail"] == 1,
        "report summary:\n{yaml}"
    );
    Ok(())
}

/// Creates a Pod (no status) running `image`, pulling with `pull_secrets`.
async fn pod(
    client: &Client,
    ns: &str,
    name: &str,
    image: &str,
    pull_secrets: &[&str],
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let secrets: Vec<Value> = pull_secrets.iter().map(|s| json!({"name": s})).collect();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": image}], "imagePullSecrets": secrets},
    }))?;
    pods.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating Pod {ns}/{name}"))?;
    Ok(())
}

/// A `kubernetes.io/dockerconfigjson` Secret `regcred` in `ns` with the login for `host`.
async fn pull_secret(
    client: &Client,
    ns: &str,
    host: &str,
    user: &str,
    password: &str,
) -> Result<()> {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let config = json!({"auths": {host: {"auth": auth}}}).to_string();
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "regcred"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config},
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("creating Secret {ns}/regcred"))?;
    Ok(())
}

/// Runs `ivory audit --kubeconfig` (no file: found through `KUBECONFIG`, as kubectl does) on
/// the Pods of `ns`; returns the JSON output.
async fn audit_namespace(cluster: &Cluster, ns: &str, policy: &Path, ca: &Path) -> Result<Value> {
    let (code, stdout, stderr) = run_ivory(
        [
            "audit".as_ref(),
            "--policy".as_ref(),
            policy.as_os_str(),
            "--registry-ca".as_ref(),
            ca.as_os_str(),
            "--namespace".as_ref(),
            ns.as_ref(),
            "--output".as_ref(),
            "json".as_ref(),
            "--kubeconfig".as_ref(),
        ],
        &[("KUBECONFIG", cluster.kubeconfig().as_os_str())],
    )
    .await?;
    ensure!((0..=2).contains(&code), "exit {code}\n{stdout}\n{stderr}");
    serde_json::from_str(&stdout).with_context(|| format!("stdout: {stdout}\n{stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_evaluates_pods_in_their_namespace_with_their_pull_secrets() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&[]).await?;
    let (user, password) = ("puller", "pull-secret-password");
    let registry = RegistryHarness::start(HarnessOptions::basic(user, password)).await?;
    let ((signed, _), (unsigned, _)) = push_signed_and_unsigned(&registry).await?;
    let host = registry.host().to_owned();

    // The policy applies only in namespaces labelled ivory-audit=enforce.
    let enforced = create_namespace(&client, "e2e-audit-enforced").await?;
    let label = json!({"metadata": {"labels": {"ivory-audit": "enforce"}}});
    Api::<Namespace>::all(client.clone())
        .patch(&enforced, &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let other = create_namespace(&client, "e2e-audit-other").await?;
    for ns in [&enforced, &other] {
        pull_secret(&client, ns, &host, user, password).await?;
    }
    pod(&client, &enforced, "signed", &signed, &["regcred"]).await?;
    pod(&client, &enforced, "unsigned", &unsigned, &["regcred"]).await?;
    pod(
        &client,
        &enforced,
        "no-secret",
        &format!("{host}/ivory/sig-p256:nosecret"),
        &[],
    )
    .await?;
    pod(&client, &other, "unsigned", &unsigned, &["regcred"]).await?;

    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("policy.yaml");
    let yaml = policy_yaml(&host)?.replace(
        "  matchConstraints:\n",
        "  matchConstraints:\n    namespaceSelector:\n      matchLabels:\n        ivory-audit: enforce\n",
    );
    std::fs::write(&policy, yaml)?;
    let ca = dir.path().join("registry-ca.pem");
    std::fs::write(&ca, registry.ca_pem())?;

    let doc = audit_namespace(cluster, &enforced, &policy, &ca).await?;
    let signed_entry = entry(&doc, &signed)?;
    ensure!(
        signed_entry["verdict"] == "pass" && signed_entry["namespace"] == enforced.as_str(),
        "signed image read with the Pod's pull secret: {signed_entry}"
    );
    let unsigned_entry = entry(&doc, &unsigned)?;
    ensure!(
        unsigned_entry["verdict"] == "fail",
        "unsigned in the enforced namespace: {unsigned_entry}"
    );
    let no_secret = entry(&doc, &format!("{host}/ivory/sig-p256:nosecret"))?;
    ensure!(
        no_secret["verdict"] == "error"
            && no_secret["message"]
                .as_str()
                .unwrap_or_default()
                .contains("HTTP 401"),
        "without a pull secret the registry refuses: {no_secret}"
    );

    // The same unsigned image in a namespace outside the policy's namespaceSelector: no
    // policy result at all (audit reports such images as not covered).
    let doc = audit_namespace(cluster, &other, &policy, &ca).await?;
    let outside = entry(&doc, &unsigned)?;
    ensure!(
        outside["namespace"] == other.as_str()
            && outside["policies"] == json!([])
            && outside["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with("no policy applies"),
        "outside the namespaceSelector the policy does not apply: {outside}"
    );
    Ok(())
}
