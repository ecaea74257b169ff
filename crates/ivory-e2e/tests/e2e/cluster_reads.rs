//! `resource.Get` / `resource.List` in `ivory serve --kube`, on a real kube-apiserver, with ivory
//! running as the ServiceAccount of the kustomize base (`deploy/base`: its RBAC, with the
//! ConfigMaps of the `ivory-cluster-reads` ClusterRole granted, as a user's overlay would):
//!
//! * a policy admits or denies Pods by a ConfigMap's content, read from a watch;
//! * the ConfigMap is edited and the next admissions follow the edit;
//! * a policy reading what ivory may not watch (ServiceAccounts) fails per its failurePolicy:
//!   denied under `Fail` (the reason names the refusal), admitted under `Ignore`;
//! * the watch shows in ivory's metrics, and stops when its policy is deleted.

use std::ffi::OsStr;

use anyhow::{Context, Result, bail, ensure};
use ivory_e2e::{Cluster, create_namespace, eventually, unique_name};
use ivory_testkit::policy::{NO_IMAGE_CHECKS, PodPolicy};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::setup::{
    IVPOL, POLICY_CRDS, PROPAGATION, apply, cluster_with_crds, dynamic, register, serve, tls,
    unregister, workspace,
};

const MESSAGE: &str = "not from the registry the ConfigMap allows";

/// A pod policy in namespace `ns` whose single validation is `expression`.
fn policy(name: &str, failure: &str, ns: &str, expression: &str) -> String {
    PodPolicy::new(name)
        .operations("CREATE")
        .in_namespace(ns)
        .spec(&format!(
            "  failurePolicy: {failure}
{NO_IMAGE_CHECKS}  validations:
    - expression: >-
        {expression}
      message: {MESSAGE}
"
        ))
        .yaml()
}

/// Applies the ServiceAccount and RBAC of `deploy/base` in namespace `own` (cluster-wide names
/// made unique with `suffix`), granting ConfigMaps in `ivory-cluster-reads` as a user would.
async fn base_rbac(client: &Client, own: &str, suffix: &str) -> Result<()> {
    let mut docs = Vec::new();
    for file in ["deploy/base/serviceaccount.yaml", "deploy/base/rbac.yaml"] {
        let text = std::fs::read_to_string(workspace().join(file))?;
        docs.extend(
            serde_saphyr::from_multiple::<Value>(&text)?
                .into_iter()
                .filter(|d| !d.is_null()),
        );
    }
    for mut doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        if doc["metadata"]["namespace"].is_string() {
            doc["metadata"]["namespace"] = json!(own);
        }
        if let Some(subjects) = doc.get_mut("subjects").and_then(Value::as_array_mut) {
            for s in subjects {
                s["namespace"] = json!(own);
            }
        }
        if kind.starts_with("Cluster") {
            let name = format!(
                "{}-{suffix}",
                doc["metadata"]["name"].as_str().unwrap_or_default()
            );
            doc["metadata"]["name"] = json!(name);
            if kind == "ClusterRoleBinding" {
                let role = format!(
                    "{}-{suffix}",
                    doc["roleRef"]["name"].as_str().unwrap_or_default()
                );
                doc["roleRef"]["name"] = json!(role);
            }
            if doc["metadata"]["name"] == json!(format!("ivory-cluster-reads-{suffix}"))
                && kind == "ClusterRole"
            {
                ensure!(
                    doc["rules"] == json!([]),
                    "the base grants no cluster reads"
                );
                doc["rules"] = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]);
            }
        }
        let (group, version) = match doc["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .split_once('/')
        {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (
                String::new(),
                doc["apiVersion"].as_str().unwrap_or_default().to_owned(),
            ),
        };
        let plural = format!("{}s", kind.to_lowercase());
        let namespace = doc["metadata"]["namespace"].as_str().map(str::to_owned);
        let api = dynamic(
            client,
            (&group, &version, &kind, &plural),
            namespace.as_deref(),
        );
        apply(&api, &serde_json::to_string(&doc)?).await?;
    }
    Ok(())
}

/// A kubeconfig for the ServiceAccount `ivory` of `own` (a TokenRequest), beside the admin's.
async fn service_account_kubeconfig(
    client: &Client,
    cluster: &Cluster,
    own: &str,
) -> Result<std::path::PathBuf> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), own)
        .create_token_request("ivory", &PostParams::default(), &request)
        .await?
        .status
        .context("TokenRequest without a status")?
        .token;
    let admin: Value = serde_saphyr::from_str(&std::fs::read_to_string(cluster.kubeconfig())?)?;
    let cluster_name = admin["clusters"][0]["name"].clone();
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "ivory", "user": {"token": token}}],
        "contexts": [{"name": "ivory", "context": {"cluster": cluster_name, "user": "ivory"}}],
        "current-context": "ivory",
    });
    let path = cluster
        .kubeconfig()
        .with_file_name(format!("kubeconfig-{own}"));
    std::fs::write(&path, serde_json::to_string(&config)?)?;
    Ok(path)
}

/// A dry-run Pod creation of `image` in `ns`.
async fn admit(client: &Client, ns: &str, image: &str) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": unique_name("reads")},
        "spec": {"containers": [{"name": "app", "image": image}]},
    }))?;
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&params, &pod)
        .await?;
    Ok(())
}

/// Ok when the Pod is denied and the reason contains `needle`.
async fn denied_with(client: &Client, ns: &str, image: &str, needle: &str) -> Result<()> {
    match admit(client, ns, image).await {
        Err(e) if format!("{e:#}").contains(needle) => Ok(()),
        Err(e) => bail!("denied for another reason: {e:#}"),
        Ok(()) => bail!("{image} admitted in {ns}"),
    }
}

async fn set_prefix(client: &Client, ns: &str, prefix: &str) -> Result<()> {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "registries", "namespace": ns}, "data": {"prefix": prefix}});
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            "registries",
            &PatchParams::apply("ivory-e2e").force(),
            &Patch::Apply(&cm),
        )
        .await?;
    Ok(())
}

/// ivory's `/metrics`, read with curl (trusting `ca`).
async fn ivory_metrics(base: &str, ca: &std::path::Path) -> Result<String> {
    let out = tokio::process::Command::new("curl")
        .args(["-fsS", "--max-time", "5", "--cacert"])
        .arg(ca)
        .arg(format!("{base}/metrics"))
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "curl /metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_read_configmaps_from_watches_within_rbac() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&POLICY_CRDS).await?;
    let own = create_namespace(&client, "e2e-reads-ivory").await?;
    let app = create_namespace(&client, "e2e-reads-app").await?;
    let forbidden = create_namespace(&client, "e2e-reads-fail").await?;
    let ignored = create_namespace(&client, "e2e-reads-ignore").await?;
    let suffix = unique_name("r");
    base_rbac(&client, &own, &suffix).await?;
    let kubeconfig = service_account_kubeconfig(&client, cluster, &own).await?;
    set_prefix(&client, &own, "registry.example/good/").await?;

    let dir = tempfile::tempdir()?;
    let (_, _, ca) = tls(dir.path())?;
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies)?;
    let by_configmap = unique_name("e2e-reads-cm");
    let reads_sa = format!("resource.List('v1', 'serviceaccounts', '{own}').items.size() >= 0");
    let cases = [
        (
            by_configmap.clone(),
            policy(
                &by_configmap,
                "Fail",
                &app,
                &format!(
                    "images.containers.all(i, i.startsWith(resource.Get('v1', 'configmaps', '{own}', 'registries').data.prefix))"
                ),
            ),
        ),
        (unique_name("e2e-reads-fail"), String::new()),
        (unique_name("e2e-reads-ignore"), String::new()),
    ];
    let (fail_name, ignore_name) = (cases[1].0.clone(), cases[2].0.clone());
    let texts = [
        cases[0].1.clone(),
        policy(&fail_name, "Fail", &forbidden, &reads_sa),
        policy(&ignore_name, "Ignore", &ignored, &reads_sa),
    ];
    for (name, yaml) in [&by_configmap, &fail_name, &ignore_name]
        .into_iter()
        .zip(&texts)
    {
        std::fs::write(policies.join(format!("{name}.yaml")), yaml)?;
        apply(&dynamic(&client, IVPOL, None), yaml).await?;
    }

    let envs = [
        ("KUBECONFIG", kubeconfig.as_os_str()),
        ("POD_NAMESPACE", OsStr::new(&own)),
    ];
    let extra = [
        OsStr::new("--kube"),
        OsStr::new("--disable-policy-reports"),
        OsStr::new("--disable-background-scans"),
    ];
    let ivory = serve(dir.path(), &ca, &extra, &envs).await?;
    let logs = || format!("\nivory log:\n{}", ivory.logs());
    let hooks = register(&client, &policies, &ivory, &ca, &unique_name("reads")).await?;
    let result = async {
        // The ConfigMap's prefix decides (once the webhook is in the chain and the watch synced).
        eventually(
            "a Pod outside the ConfigMap's registry to be denied",
            PROPAGATION,
            || denied_with(&client, &app, "registry.example/bad/app:1", MESSAGE),
        )
        .await?;
        admit(&client, &app, "registry.example/good/app:1")
            .await
            .context("a Pod of the ConfigMap's registry")?;

        // The ConfigMap is edited: the next admissions follow it (the watch, not a restart).
        set_prefix(&client, &own, "registry.example/bad/").await?;
        eventually("the edit to be followed", PROPAGATION, || async {
            admit(&client, &app, "registry.example/bad/app:1").await
        })
        .await?;
        denied_with(&client, &app, "registry.example/good/app:1", MESSAGE).await?;

        // What ivory may not watch: the failurePolicy decides, never an empty answer.
        eventually(
            "a read ivory may not make to deny under Fail",
            PROPAGATION,
            || {
                denied_with(
                    &client,
                    &forbidden,
                    "registry.example/good/app:1",
                    "cluster data unavailable",
                )
            },
        )
        .await?;
        let reason = match admit(&client, &forbidden, "registry.example/good/app:1").await {
            Err(e) => format!("{e:#}"),
            Ok(()) => bail!("admitted"),
        };
        ensure!(reason.contains("serviceaccounts"), "{reason}");
        eventually(
            "the same read under Ignore to be skipped",
            PROPAGATION,
            || async {
                admit(&client, &ignored, "registry.example/good/app:1").await?;
                let log = ivory.logs();
                ensure!(
                    log.lines()
                        .any(|l| l.contains(&ignore_name) && l.contains("failurePolicy Ignore")),
                    "no skip logged yet"
                );
                Ok::<_, anyhow::Error>(())
            },
        )
        .await?;

        // Metrics: what the ConfigMap watch holds.
        let label = format!("resource=\"v1 configmaps in namespace {own}\"");
        let metrics = ivory_metrics(&ivory.base_url(), &ca).await?;
        for (name, value) in [
            ("ivory_resource_watch_synced", "1"),
            ("ivory_resource_watch_objects", "1"),
        ] {
            ensure!(
                metrics.lines().any(|l| l.starts_with(name)
                    && l.contains(&label)
                    && l.ends_with(&format!(" {value}"))),
                "{name}{{{label}}} {value} missing from:\n{metrics}"
            );
        }

        // Hot reload: the policy is deleted, its watch stops.
        dynamic(&client, IVPOL, None)
            .delete(&by_configmap, &DeleteParams::default())
            .await?;
        eventually("the ConfigMap watch to stop", PROPAGATION, || async {
            let metrics = ivory_metrics(&ivory.base_url(), &ca).await?;
            ensure!(!metrics.contains(&label), "still watched");
            Ok::<_, anyhow::Error>(())
        })
        .await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    unregister(&client, &hooks).await?;
    for name in [&fail_name, &ignore_name] {
        let _ = dynamic(&client, IVPOL, None)
            .delete(name, &DeleteParams::default())
            .await;
    }
    result.map_err(|e| anyhow::anyhow!("{e:#}{}", logs()))
}
