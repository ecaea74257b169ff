//! ivory registered through the API server's static manifests (`ivory webhooks --static`,
//! Kubernetes 1.37's ManifestBasedAdmissionControlConfig) on a real kube-apiserver started with
//! the AdmissionConfiguration ivory wrote: enforcement from the API server's first request, that
//! no API call can switch off, and that follows an edit of the files without a restart.
//!
//! This module starts a cluster of its own: static webhooks apply to the whole cluster and
//! cannot be removed through the API, so no other module may share it.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ivory_e2e::{Cluster, eventually, metric_value, run_ivory, unique_name};
use ivory_server::webhooks::static_manifests::{
    ADMISSION_CONFIGURATION_FILE, MANIFEST_FILE, VALIDATING_DIR, directory_hash,
};
use ivory_testkit::RegistryHarness;
use ivory_testkit::policy::PodPolicy;
use ivory_testkit::review::{self, pod_object};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use serde_json::json;

use crate::setup::{
    POLICY_CRDS, apply_policy, create, fixture_key_attestors, install_crds, ivory_dir,
    push_signed_and_unsigned, register, serve_listening, unregister,
};

const MESSAGE: &str = "failed the image Signature verification";
/// The API server watches the folders (and re-reads them every minute besides): room for a
/// missed event and one late tick.
const RELOAD: Duration = Duration::from_secs(150);
/// The API server's metric naming the hash of the static manifests it applies.
const LAST_CONFIG: &str = "apiserver_manifest_admission_config_controller_last_config_info";

fn policy_yaml(host: &str) -> Result<String> {
    Ok(PodPolicy::new("e2e-static")
        .glob(&format!("{host}/*"))
        .spec(&format!(
            "  failurePolicy: Fail
{}  validations:
    - expression: >-
        images.containers.map(i, verifyImageSignatures(i, [attestors.key])).all(e, e > 0)
      message: {MESSAGE}
",
            fixture_key_attestors()?
        ))
        .yaml())
}

/// `ivory webhooks --static DIR` for `policy`, calling ivory at `url`, excluding `excluded`.
async fn write_static(
    dir: &Path,
    policy: &Path,
    url: &str,
    ca: &Path,
    excluded: &[&str],
) -> Result<()> {
    let mut args = vec![
        OsStr::new("webhooks"),
        OsStr::new("--policies"),
        policy.as_os_str(),
        OsStr::new("--url"),
        OsStr::new(url),
        OsStr::new("--ca-bundle"),
        ca.as_os_str(),
        OsStr::new("--static"),
        dir.as_os_str(),
    ];
    for namespace in excluded {
        args.extend([OsStr::new("--exclude-namespace"), OsStr::new(namespace)]);
    }
    let (code, _, stderr) = run_ivory(args, &[]).await?;
    ensure!(
        code == 0,
        "ivory webhooks --static failed ({code}): {stderr}"
    );
    Ok(())
}

async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    Ok(())
}

fn pod(image: &str) -> serde_json::Value {
    pod_object(
        &unique_name("pod"),
        json!({"containers": review::containers(&[image])}),
    )
}

/// The names of every webhook configuration the API lists, of both kinds.
async fn listed_configurations(client: &Client) -> Result<Vec<String>> {
    let params = ListParams::default();
    let mut names: Vec<String> = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .list(&params)
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    names.extend(
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .list(&params)
            .await?
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name),
    );
    Ok(names)
}

/// `ivory doctor --static-manifests DIR` against `cluster`: (exit code, report).
async fn doctor(cluster: &Cluster, manifests: &Path) -> Result<(i32, String)> {
    let env = [
        ("KUBECONFIG", cluster.kubeconfig().as_os_str()),
        ("IVORY_LOG", OsStr::new("warn")),
    ];
    let args = [
        OsStr::new("doctor"),
        OsStr::new("--static-manifests"),
        manifests.as_os_str(),
    ];
    let (code, stdout, stderr) = run_ivory(args, &env).await?;
    Ok((code, format!("{stdout}{stderr}")))
}

/// The hash of a plugin's static manifest directory, as the API server computes it.
fn hash_of(dir: &Path) -> Result<String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        files.push((
            entry.file_name().to_string_lossy().into_owned(),
            std::fs::read(entry.path())?,
        ));
    }
    directory_hash(&files).context("no manifest in the directory")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_registration_enforces_from_the_first_request_and_survives_the_api() -> Result<()> {
    let registry = RegistryHarness::start_default().await?;
    let ((signed, signed_digest), (unsigned, _)) = push_signed_and_unsigned(&registry).await?;
    let (dir, ca, registry_ca) = ivory_dir(&registry)?;
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, policy_yaml(registry.host())?)?;
    // The address is chosen before the API server starts: the static manifests name it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = format!("https://127.0.0.1:{port}");
    let manifests = dir.path().join("static");
    let late = unique_name("late");
    write_static(&manifests, &policy, &url, &ca, &["kube-system", &late]).await?;
    let cluster =
        Cluster::start_with_admission_config(&manifests.join(ADMISSION_CONFIGURATION_FILE)).await?;
    let client = cluster.client().await?;
    let apiserver_log = || cluster.apiserver_log_tail(30).unwrap_or_default();
    let ns = unique_name("static");
    create_namespace(&client, &ns).await?;
    create_namespace(&client, &late).await?;
    let pods = format!("/api/v1/namespaces/{ns}/pods");

    // 1. No ivory yet, no webhook object: the API server's first Pod request is refused under
    //    Fail, a signed image too (the bootstrap gap is closed).
    ensure!(listed_configurations(&client).await?.is_empty());
    let answer = create(&client, &pods, &pod(&format!("{signed}@{signed_digest}"))).await?;
    ensure!(
        answer.denied_with("failed calling webhook"),
        "a Pod was judged before ivory listened: {answer:?}\n{}",
        apiserver_log()
    );

    // 2. ivory starts: signed Pods are admitted and pinned, unsigned ones denied.
    let listen = format!("127.0.0.1:{port}");
    let policies = [OsStr::new("--policies"), policy.as_os_str()];
    let ivory = serve_listening(&listen, dir.path(), &registry_ca, &policies, &[]).await?;
    let logs = || format!("\nivory log:\n{}", ivory.logs());
    let pinned = format!("{signed}@{signed_digest}");
    let admitted = create(&client, &pods, &pod(&signed)).await?;
    ensure!(admitted.ok(), "{admitted:?}{}", logs());
    ensure!(
        admitted.body["spec"]["containers"][0]["image"] == pinned.as_str(),
        "the signed Pod was not pinned: {admitted:?}"
    );
    let denied = create(&client, &pods, &pod(&unsigned)).await?;
    ensure!(denied.denied_with(MESSAGE), "{denied:?}{}", logs());

    // 3. `ivory doctor` reports the static registration in force, and an API registration
    //    beside it that differs (it does not exclude ivory's namespace): a warning, exit 0.
    install_crds(&client, &POLICY_CRDS).await?;
    apply_policy(&client, &std::fs::read_to_string(&policy)?).await?;
    let made = register(&client, &policy, &ivory, &ca, "api").await?;
    let (code, report) = doctor(&cluster, &manifests).await?;
    ensure!(code == 0, "ivory doctor:\n{report}");
    for expected in [
        "static manifests (ValidatingAdmissionWebhook)",
        "in force: the API server applies",
        "static webhook ivpol.validate.ivory.svc-fail in ivory-resource-validating-webhook-cfg.static.k8s.io",
        "also API webhook",
        "differ in rules, selectors, conditions or timeout",
        "no check failed; 2 warning(s)",
    ] {
        ensure!(report.contains(expected), "no {expected:?} in:\n{report}");
    }

    // 4. Every ivory webhook object the API holds is deleted (as a Helm uninstall would):
    //    enforcement stays, and doctor still finds every policy registered.
    unregister(&client, &made).await?;
    ensure!(listed_configurations(&client).await?.is_empty());
    let denied = create(&client, &pods, &pod(&unsigned)).await?;
    ensure!(denied.denied_with(MESSAGE), "{denied:?}{}", logs());
    let (code, report) = doctor(&cluster, &manifests).await?;
    ensure!(
        code == 0 && !report.contains("also API webhook"),
        "ivory doctor:\n{report}"
    );

    // 5. The API refuses the reserved names: no create, and the static ones are not there to
    //    delete.
    let impostor: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "ivory-resource-validating-webhook-cfg.static.k8s.io"},
        "webhooks": [],
    }))?;
    let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    match api.create(&PostParams::default(), &impostor).await {
        Err(kube::Error::Api(status)) if status.code == 422 => ensure!(
            status
                .message
                .contains("reserved for static manifest-based configurations"),
            "{status:?}"
        ),
        other => anyhow::bail!("the API created a .static.k8s.io name: {other:?}"),
    }
    match api
        .delete(
            "ivory-resource-validating-webhook-cfg.static.k8s.io",
            &DeleteParams::default(),
        )
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        other => anyhow::bail!("deleting the static name did not answer 404: {other:?}"),
    }
    let denied = create(&client, &pods, &pod(&unsigned)).await?;
    ensure!(denied.denied_with(MESSAGE), "{denied:?}{}", logs());

    // 6. An edit of the files is applied without a restart: namespace `late` was excluded, and
    //    rewriting the manifests without the exclusion brings it under the policy.
    let late_pods = format!("/api/v1/namespaces/{late}/pods");
    let before = create(&client, &late_pods, &pod(&unsigned)).await?;
    ensure!(before.ok(), "the excluded namespace was judged: {before:?}");
    let validating_hash = hash_of(&manifests.join(VALIDATING_DIR))?;
    let loaded = metric_value(&client, LAST_CONFIG, &[("hash", &validating_hash)]).await?;
    ensure!(
        loaded == 1.0,
        "the API server does not report the written manifests' hash {validating_hash}"
    );
    write_static(&manifests, &policy, &url, &ca, &["kube-system"]).await?;
    let edited_hash = hash_of(&manifests.join(VALIDATING_DIR))?;
    ensure!(edited_hash != validating_hash);
    ensure!(manifests.join(VALIDATING_DIR).join(MANIFEST_FILE).is_file());
    eventually("the edited static manifests to apply", RELOAD, || async {
        let answer = create(&client, &format!("{late_pods}?dryRun=All"), &pod(&unsigned)).await?;
        if answer.denied_with(MESSAGE) {
            Ok(())
        } else {
            Err(anyhow::anyhow!("{}: {}", answer.status, answer.message()))
        }
    })
    .await
    .with_context(apiserver_log)?;
    let loaded = metric_value(&client, LAST_CONFIG, &[("hash", &edited_hash)]).await?;
    ensure!(
        loaded == 1.0,
        "the API server does not report the edited manifests' hash"
    );
    let admitted = create(&client, &late_pods, &pod(&signed)).await?;
    ensure!(admitted.ok(), "{admitted:?}{}", logs());
    Ok(())
}
