//! Tests against a real kube-apiserver (see scripts/e2e.sh): the machinery the webhook failure
//! matrix builds on. Needs `--features e2e` and the binaries from scripts/e2e/build.sh.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use ivory_e2e::{Cluster, create_namespace, eventually, metric_value, unique_name};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// How long the API server may take to put a new webhook configuration in its admission chain.
const WEBHOOK_PROPAGATION: Duration = Duration::from_secs(30);

fn pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name },
        "spec": { "containers": [{ "name": "app", "image": "registry.ivory.test/app:1.0" }] }
    }))?)
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// The API error of a call, or a failure when the call succeeded or failed otherwise.
fn api_error<T: std::fmt::Debug>(result: kube::Result<T>) -> Result<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => Ok(*status),
        Err(other) => bail!("expected an API error, got {other}"),
        Ok(value) => bail!("expected an API error, got success: {value:?}"),
    }
}

async fn setup(prefix: &str) -> Result<(Client, String)> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = create_namespace(&client, prefix).await?;
    Ok((client, ns))
}

#[tokio::test]
async fn pods_are_stored_read_back_and_dry_runs_are_not_stored() -> Result<()> {
    let (client, ns) = setup("e2e-pods").await?;
    let pods: Api<Pod> = Api::namespaced(client, &ns);

    let created = pods.create(&PostParams::default(), &pod("stored")?).await?;
    let uid = created
        .metadata
        .uid
        .clone()
        .context("created pod has no uid")?;
    let read = pods.get("stored").await?;
    assert_eq!(read.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(read.metadata.namespace.as_deref(), Some(ns.as_str()));

    let dry = pods.create(&dry_run(), &pod("dry")?).await?;
    assert_eq!(dry.metadata.name.as_deref(), Some("dry"));
    assert!(
        pods.get_opt("dry").await?.is_none(),
        "a dry-run pod was stored"
    );

    let names: Vec<String> = pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names, ["stored"]);
    Ok(())
}

/// A validating webhook for pods in namespace `ns` only, at a loopback URL where nothing listens.
fn unreachable_webhook(
    config: &str,
    hook: &str,
    ns: &str,
    port: u16,
    policy: &str,
) -> Result<ValidatingWebhookConfiguration> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": { "name": config },
        "webhooks": [{
            "name": hook,
            "clientConfig": { "url": format!("https://127.0.0.1:{port}/validate") },
            "rules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods"], "scope": "Namespaced"
            }],
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } },
            "failurePolicy": policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5
        }]
    }))?)
}

#[tokio::test]
async fn unreachable_webhook_rejects_with_fail_and_is_skipped_with_ignore() -> Result<()> {
    let (client, ns) = setup("e2e-hook").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let config = unique_name("e2e-unreachable");
    let hook = format!("{config}.ivory-e2e.test");
    // Nothing listens there: a webhook URL on it gets "connection refused".
    let port = ivory_testkit::free_port()?;

    // failurePolicy Fail: once the configuration is active, pod creation is refused.
    configs
        .create(
            &PostParams::default(),
            &unreachable_webhook(&config, &hook, &ns, port, "Fail")?,
        )
        .await?;
    eventually(
        "the Fail webhook to reject dry-run pods",
        WEBHOOK_PROPAGATION,
        || {
            let pods = pods.clone();
            async move { api_error(pods.create(&dry_run(), &pod("probe")?).await) }
        },
    )
    .await?;
    let status = api_error(pods.create(&PostParams::default(), &pod("refused")?).await)?;
    ensure!(
        status.message.contains("failed calling webhook") && status.message.contains(&hook),
        "unexpected rejection: {status:?}"
    );
    assert_eq!(status.code, 500, "{status:?}");
    assert!(
        pods.get_opt("refused").await?.is_none(),
        "a refused pod was stored"
    );

    // failurePolicy Ignore: the call still fails, the pod is stored, and the API server counts
    // the fail-open.
    let mut current = configs.get(&config).await?;
    let webhooks = current
        .webhooks
        .as_mut()
        .context("configuration has no webhooks")?;
    webhooks[0].failure_policy = Some("Ignore".to_owned());
    configs
        .replace(&config, &PostParams::default(), &current)
        .await?;
    eventually(
        "the Ignore webhook to admit dry-run pods",
        WEBHOOK_PROPAGATION,
        || {
            let pods = pods.clone();
            async move {
                pods.create(&dry_run(), &pod("probe")?)
                    .await
                    .map_err(anyhow::Error::from)
            }
        },
    )
    .await?;
    let labels = [("name", hook.as_str()), ("type", "validating")];
    let metric = "apiserver_admission_webhook_fail_open_count";
    let before = metric_value(&client, metric, &labels).await?;
    let stored = pods
        .create(&PostParams::default(), &pod("admitted")?)
        .await?;
    let read = pods.get("admitted").await?;
    assert_eq!(read.metadata.uid, stored.metadata.uid);
    let after = metric_value(&client, metric, &labels).await?;
    assert!(
        after > before,
        "{metric} for {hook}: {before} before, {after} after"
    );

    configs.delete(&config, &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn an_owned_cluster_runs_the_pinned_version_and_stops_on_drop() -> Result<()> {
    let cluster = Cluster::start().await?;
    let version = cluster.client().await?.apiserver_version().await?;
    assert_eq!(version.git_version, "v1.37.2");

    let dir = cluster
        .dir()
        .context("a started cluster has a folder")?
        .to_owned();
    let port: u16 = std::fs::read_to_string(dir.join("apiserver.port"))?
        .trim()
        .parse()?;
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());

    drop(cluster);
    // IVORY_E2E_KEEP asks to keep the folder for a look after the run.
    let keep = std::env::var_os(ivory_e2e::KEEP_ENV).is_some_and(|v| !v.is_empty());
    assert_eq!(dir.exists(), keep, "{} exists after drop", dir.display());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "kube-apiserver still listens on {port}"
    );
    Ok(())
}
