//! Kyverno-compatible reports on a real kube-apiserver with the vendored wgpolicyk8s and
//! PolicyException CRDs (deploy/crds/kyverno), through webhooks registered from `ivory webhooks`
//! and the real registry:
//!
//! * an `Audit` policy's results reach a PolicyReport named by the Pod's UID: `pass` for a
//!   signed image, `fail` for an unsigned one (admitted: Audit does not deny), with the
//!   auditAnnotations as properties and `process: admission review`;
//! * a PolicyException created through the API (in the `--exception-namespace`) exempts a
//!   Pod: `skip` with Kyverno's message, rule `exception` and property `exceptions`; once the
//!   exception is deleted, the watch drops it and such Pods are judged again;
//! * the background scan judges the digest a Pod runs (`status.containerStatuses[].imageID`,
//!   set through the status subresource: the test cluster has no kubelet): a Pod admitted with
//!   a signed tag but running an unsigned digest turns `fail` with `process: background scan`;
//! * the first scan runs at start and warms the verdict cache: a Pod running the signed digest
//!   before ivory starts is verified once by the scan, and the first admission of that image is
//!   a cache hit.

use std::ffi::OsStr;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use ivory_e2e::{create_namespace, eventually, unique_name};
use ivory_testkit::RegistryHarness;
use ivory_testkit::policy::PodPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::setup::{
    IVPOL, apply, cluster_with_crds, dynamic, fixture_key_attestors, ivory_dir,
    push_signed_and_unsigned, register, serve, set_running_digest, unregister,
};

const CRDS: [&str; 5] = [
    "deploy/crds/policies.kyverno.io_imagevalidatingpolicies.yaml",
    "deploy/crds/policies.kyverno.io_namespacedimagevalidatingpolicies.yaml",
    "deploy/crds/kyverno/policies.kyverno.io_policyexceptions.yaml",
    "deploy/crds/kyverno/wgpolicyk8s.io_policyreports.yaml",
    "deploy/crds/kyverno/wgpolicyk8s.io_clusterpolicyreports.yaml",
];
const MESSAGE: &str = "failed the image Signature verification";
/// Reports are written asynchronously, background scans every 2 s here.
const REPORTED: Duration = Duration::from_secs(45);

/// An Audit-only policy verifying images of `host` in namespace `ns`, with or without
/// background scans (a result from one replaces the other's for the same policy, so the test
/// keeps them on two policies).
fn audit_policy(name: &str, host: &str, ns: &str, background: bool) -> Result<String> {
    Ok(PodPolicy::new(name)
        .namespace_selector(&format!(
            "      matchLabels:\n        kubernetes.io/metadata.name: {ns}\n"
        ))
        .glob(&format!("{host}/*"))
        .spec(&format!(
            "  validationActions: [Audit]
  evaluation:
    background:
      enabled: {background}
  validationConfigurations:
    mutateDigest: false
    verifyDigest: false
{}  validations:
    - expression: >-
        images.containers.map(i, verifyImageSignatures(i, [attestors.key])).all(e, e > 0)
      message: {MESSAGE}
  auditAnnotations:
    - key: label
      valueExpression: \"'prod'\"
",
            fixture_key_attestors()?
        ))
        .yaml())
}

fn exception(namespace: &str, policy: &str) -> String {
    format!(
        "apiVersion: policies.kyverno.io/v1
kind: PolicyException
metadata:
  name: allow-exempt
  namespace: {namespace}
spec:
  policyRefs:
    - name: {policy}
      kind: ImageValidatingPolicy
  matchConditions:
    - name: by-name
      expression: \"object.metadata.name.startsWith('exempt')\"
"
    )
}

async fn create_pod(client: &Client, ns: &str, name: &str, image: &str) -> Result<Pod> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": image}]}
    }))?;
    Ok(Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?)
}

/// The result of `policy` in the PolicyReport of the Pod with `uid`, once it is there.
async fn reported(
    client: &Client,
    ns: &str,
    uid: &str,
    policy: &str,
    process: &str,
) -> Result<Value> {
    let reports = dynamic(
        client,
        (
            "wgpolicyk8s.io",
            "v1alpha2",
            "PolicyReport",
            "policyreports",
        ),
        Some(ns),
    );
    let report = reports.get_opt(uid).await?.context("no report yet")?;
    let results = report.data["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let result = results
        .into_iter()
        .find(|r| r["policy"] == policy && r["properties"]["process"] == process)
        .with_context(|| format!("no {process} result of {policy} yet: {}", report.data))?;
    ensure!(
        report.data["scope"]["uid"] == uid,
        "scope: {}",
        report.data["scope"]
    );
    ensure!(
        report.data["scope"]["kind"] == "Pod",
        "scope: {}",
        report.data["scope"]
    );
    Ok(result)
}

/// GET `path` from ivory with curl (the server's CA in `ca`).
async fn ivory_get(base_url: &str, ca: &std::path::Path, path: &str) -> Result<String> {
    let out = tokio::process::Command::new("curl")
        .args(["-sf", "--cacert"])
        .arg(ca)
        .arg(format!("{base_url}{path}"))
        .output()
        .await?;
    ensure!(out.status.success(), "curl {path} failed: {out:?}");
    Ok(String::from_utf8(out.stdout)?)
}

/// The sum of ivory's metric samples whose line starts with `prefix`.
async fn ivory_metric(base_url: &str, ca: &std::path::Path, prefix: &str) -> Result<f64> {
    let text = ivory_get(base_url, ca, "/metrics").await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// POSTs an AdmissionReview to ivory with curl; the answer review.
async fn post_review(
    base_url: &str,
    ca: &std::path::Path,
    path: &str,
    review: &Value,
) -> Result<Value> {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sf",
            "-H",
            "content-type: application/json",
            "--data-binary",
        ])
        .arg(review.to_string())
        .arg("--cacert")
        .arg(ca)
        .arg(format!("{base_url}{path}"))
        .output()
        .await?;
    ensure!(out.status.success(), "curl {path} failed: {out:?}");
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn uid(pod: &Pod) -> Result<String> {
    pod.metadata.uid.clone().context("pod without uid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_results_exceptions_and_background_scans_reach_policy_reports() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&CRDS).await?;
    let registry = RegistryHarness::start_default().await?;
    let host = registry.host().to_owned();
    let ((signed, signed_digest), (unsigned, unsigned_digest)) =
        push_signed_and_unsigned(&registry).await?;
    let signed_repo = signed.trim_end_matches(":v1").to_owned();

    let (dir, ca, registry_ca) = ivory_dir(&registry)?;
    let own_ns = create_namespace(&client, "e2e-ivory").await?;
    let ns = create_namespace(&client, "e2e-reports").await?;
    let exceptions_ns = create_namespace(&client, "e2e-exceptions").await?;
    let policy = unique_name("e2e-audit");
    let yaml = audit_policy(&policy, &host, &ns, false)?;
    let scanned = unique_name("e2e-scan");
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies)?;
    std::fs::write(policies.join("policy.yaml"), &yaml)?;
    apply(&dynamic(&client, IVPOL, None), &yaml).await?;
    // Only in the cluster, not registered as a webhook: it judges running Pods.
    apply(
        &dynamic(&client, IVPOL, None),
        &audit_policy(&scanned, &host, &ns, true)?,
    )
    .await?;
    let polex = (
        "policies.kyverno.io",
        "v1",
        "PolicyException",
        "policyexceptions",
    );
    apply(
        &dynamic(&client, polex, Some(&exceptions_ns)),
        &exception(&exceptions_ns, &policy),
    )
    .await?;

    // A Pod already running the signed image before ivory starts (no webhook yet).
    create_pod(&client, &ns, "running", &signed).await?;
    set_running_digest(
        &client,
        &ns,
        "running",
        &signed,
        &format!("{signed_repo}@{signed_digest}"),
    )
    .await?;

    let kubeconfig = cluster.kubeconfig().as_os_str().to_owned();
    let envs = [
        ("KUBECONFIG", kubeconfig.as_os_str()),
        ("POD_NAMESPACE", OsStr::new(&own_ns)),
    ];
    let ivory = serve(
        dir.path(),
        &registry_ca,
        &[
            OsStr::new("--kube"),
            OsStr::new("--enable-policy-exceptions"),
            OsStr::new("--exception-namespace"),
            OsStr::new(&exceptions_ns),
            OsStr::new("--background-scan-interval"),
            OsStr::new("2s"),
        ],
        &envs,
    )
    .await?;
    let logs = || format!("\nivory log:\n{}", ivory.logs());
    let results_misses = "ivory_verify_cache_misses_total{cache=\"results\"}";
    let results_hits = "ivory_verify_cache_hits_total{cache=\"results\"}";
    // The first scan runs at start and verifies what runs: the verdict cache is warm before
    // any admission.
    eventually(
        "the first background scan to verify the running pod",
        REPORTED,
        || async {
            let misses = ivory_metric(&ivory.base_url(), &ca, results_misses).await?;
            if misses >= 1.0 {
                Ok(())
            } else {
                Err(anyhow::anyhow!("no verification yet"))
            }
        },
    )
    .await
    .with_context(logs)?;
    // The first admission of that image (sent straight to ivory, before any other Pod exists,
    // so no other verification can move the counters) is answered from the cache.
    let misses_before = ivory_metric(&ivory.base_url(), &ca, results_misses).await?;
    let hits_before = ivory_metric(&ivory.base_url(), &ca, results_hits).await?;
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "warm-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "warm", "namespace": ns, "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "warm", "namespace": ns},
                "spec": {"containers": [{"name": "app", "image": signed}]}},
        },
    });
    let answer = post_review(
        &ivory.base_url(),
        &ca,
        &format!("/ivpol/validate/{scanned}"),
        &review,
    )
    .await?;
    ensure!(answer["response"]["allowed"] == true, "{answer}");
    let misses_after = ivory_metric(&ivory.base_url(), &ca, results_misses).await?;
    let hits_after = ivory_metric(&ivory.base_url(), &ca, results_hits).await?;
    ensure!(
        misses_after == misses_before && hits_after > hits_before,
        "the first admission of the running digest was not a cache hit (misses {misses_before} -> \
         {misses_after}, hits {hits_before} -> {hits_after}){}",
        logs()
    );
    let hooks = register(&client, &policies, &ivory, &ca, &unique_name("reports")).await?;

    // Audit does not deny: an unsigned Pod is created and reported `fail`, once the webhook is
    // in the API server's chain (each attempt is a new Pod).
    let failed = eventually("an unsigned pod to be reported fail", REPORTED, || async {
        let pod = create_pod(&client, &ns, &unique_name("unsigned"), &unsigned).await?;
        let uid = uid(&pod)?;
        let found = eventually("its report", Duration::from_secs(5), || {
            reported(&client, &ns, &uid, &policy, "admission review")
        })
        .await?;
        Ok::<_, anyhow::Error>(found)
    })
    .await;
    let failed = match failed {
        Ok(result) => result,
        Err(e) => bail!("{e}{}", logs()),
    };
    ensure!(failed["result"] == "fail", "{failed}");
    ensure!(failed["message"] == MESSAGE, "{failed}");
    ensure!(
        failed["source"] == "KyvernoImageValidatingPolicy",
        "{failed}"
    );
    ensure!(failed["rule"] == policy.as_str(), "{failed}");
    ensure!(failed["properties"]["label"] == "prod", "{failed}");

    // A signed Pod: pass, with the audit annotation.
    let pod = create_pod(&client, &ns, "signed", &signed).await?;
    let signed_uid = uid(&pod)?;
    let passed = eventually("the signed pod's report", REPORTED, || {
        reported(&client, &ns, &signed_uid, &policy, "admission review")
    })
    .await
    .with_context(logs)?;
    ensure!(passed["result"] == "pass", "{passed}");
    ensure!(passed["properties"]["label"] == "prod", "{passed}");

    // The exception from the API: skip, Kyverno's message and property.
    let pod = create_pod(&client, &ns, "exempt-1", &unsigned).await?;
    let exempt_uid = uid(&pod)?;
    let skipped = eventually("the exempt pod's report", REPORTED, || {
        reported(&client, &ns, &exempt_uid, &policy, "admission review")
    })
    .await
    .with_context(logs)?;
    ensure!(skipped["result"] == "skip", "{skipped}");
    ensure!(skipped["rule"] == "exception", "{skipped}");
    ensure!(
        skipped["message"]
            == format!("rule is skipped due to policy exception: {exceptions_ns}/allow-exempt")
                .as_str(),
        "{skipped}"
    );
    ensure!(
        skipped["properties"]["exceptions"] == "allow-exempt",
        "{skipped}"
    );

    // The exception is watched: once deleted, the next such Pod is judged again.
    dynamic(&client, polex, Some(&exceptions_ns))
        .delete("allow-exempt", &Default::default())
        .await?;
    let judged = eventually(
        "a pod the deleted exception exempted to fail",
        REPORTED,
        || async {
            let pod = create_pod(&client, &ns, &unique_name("exempt"), &unsigned).await?;
            let uid = uid(&pod)?;
            let result = eventually("its report", Duration::from_secs(5), || {
                reported(&client, &ns, &uid, &policy, "admission review")
            })
            .await?;
            if result["result"] == "fail" {
                Ok(result)
            } else {
                Err(anyhow::anyhow!("still {result}"))
            }
        },
    )
    .await
    .with_context(logs)?;
    ensure!(judged["message"] == MESSAGE, "{judged}");

    // An exception ivory refuses (the schema accepts `images`; Kyverno's image engine would
    // ignore them and exempt the whole policy) exempts nothing and shows on /readyz.
    let refused = exception(&exceptions_ns, &policy)
        .replace("allow-exempt", "refused")
        .replace(
            "  matchConditions:",
            "  images: [\"ghcr.io/*\"]\n  matchConditions:",
        );
    apply(&dynamic(&client, polex, Some(&exceptions_ns)), &refused).await?;
    eventually(
        "/readyz to show the refused exception",
        REPORTED,
        || async {
            let text = ivory_get(&ivory.base_url(), &ca, "/readyz").await?;
            if text.contains("PolicyException errors") && text.contains("spec.images: Forbidden") {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{text}"))
            }
        },
    )
    .await
    .with_context(logs)?;

    // Background: the signed Pod runs the unsigned digest (as the kubelet reports it).
    set_running_digest(
        &client,
        &ns,
        "signed",
        &signed,
        &format!("{signed_repo}@{unsigned_digest}"),
    )
    .await?;
    let rescanned = eventually("the background result of what runs", REPORTED, || async {
        let result = reported(&client, &ns, &signed_uid, &scanned, "background scan").await?;
        if result["result"] == "fail" {
            Ok(result)
        } else {
            Err(anyhow::anyhow!("not failed yet: {result}"))
        }
    })
    .await
    .with_context(logs)?;
    ensure!(rescanned["message"] == MESSAGE, "{rescanned}");

    // Every background result is also an audit log line.
    let logged = ivory.logs();
    ensure!(
        logged.contains("\"cause\":\"background_scan\""),
        "no background result logged{}",
        logs()
    );
    unregister(&client, &hooks).await?;
    Ok(())
}
