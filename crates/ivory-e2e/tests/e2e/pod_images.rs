//! Every image a pod runs is judged by a real kube-apiserver's admission chain with ivory's
//! webhooks (from `ivory webhooks`) registered: `kubectl debug` containers (an UPDATE of the
//! `pods/ephemeralcontainers` subresource), OCI images mounted as volumes, pod templates with
//! image volumes (autogen), and images written in another spelling of the policy's registry.
//! The policy lists only `pods`, as most policies do.

use std::ffi::OsStr;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use ivory_e2e::{Cluster, eventually, run_ivory, unique_name};
use ivory_testkit::RegistryHarness;
use ivory_testkit::policy::PodPolicy;
use ivory_testkit::review::{self, deployment_object, pod_object};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::setup::{
    Answer, PROPAGATION, cluster_with_crds, create, fixture_key_attestors, ivory_dir, namespace,
    push_signed_and_unsigned, send, serve_policies, workspace,
};

const MESSAGE: &str = "failed the image Signature verification";

/// Pod spec with `containers` and image `volumes`.
fn pod_spec(containers: &[&str], volumes: &[&str]) -> Value {
    let volumes: Vec<Value> = volumes
        .iter()
        .enumerate()
        .map(|(i, image)| {
            json!({"name": format!("v{i}"), "image": {"reference": image, "pullPolicy": "IfNotPresent"}})
        })
        .collect();
    json!({"containers": review::containers(containers), "volumes": volumes})
}

fn pod(name: &str, containers: &[&str], volumes: &[&str]) -> Value {
    pod_object(name, pod_spec(containers, volumes))
}

fn deployment(name: &str, containers: &[&str], volumes: &[&str]) -> Value {
    deployment_object(name, pod_spec(containers, volumes))
}

/// What `kubectl debug` sends: a patch of the ephemeralcontainers subresource.
async fn debug(client: &Client, ns: &str, pod: &str, image: &str) -> Result<Answer> {
    let patch = json!({"spec": {"ephemeralContainers": [
        {"name": "debugger", "image": image, "targetContainerName": "c0", "stdin": true, "tty": true}
    ]}});
    send(
        client,
        http::Method::PATCH,
        &format!("/api/v1/namespaces/{ns}/pods/{pod}/ephemeralcontainers"),
        "application/strategic-merge-patch+json",
        Some(&patch),
    )
    .await
}

/// Verifies every image of the registry at `host` in namespace `ns` (selected by the label every
/// namespace has: ivory runs without a Namespace informer here); the rule names only `pods`.
fn policy_yaml(host: &str, ns: &str) -> String {
    PodPolicy::new("e2e-pod-images")
        .in_namespace(ns)
        .glob(&format!("{host}/*"))
        .spec(&format!(
            "  failurePolicy: Fail
{}  validations:
    - expression: >-
        (images.containers + images.initContainers + images.ephemeralContainers
          + images.imageVolumes).map(i, verifyImageSignatures(i, [attestors.key])).all(e, e > 0)
      message: {MESSAGE}
",
            fixture_key_attestors().unwrap_or_default()
        ))
        .yaml()
}

/// Registers what `ivory webhooks` prints for the policies in `policies`.
async fn register_webhooks(client: &Client, policies: &Path, url: &str, ca: &Path) -> Result<()> {
    let (code, stdout, stderr) = run_ivory(
        [
            OsStr::new("webhooks"),
            OsStr::new("--policies"),
            policies.as_os_str(),
            OsStr::new("--url"),
            OsStr::new(url),
            OsStr::new("--ca-bundle"),
            ca.as_os_str(),
        ],
        &[],
    )
    .await?;
    ensure!(code == 0, "ivory webhooks failed ({code}): {stderr}");
    for value in serde_saphyr::from_multiple::<Value>(&stdout)? {
        let text = value.to_string();
        ensure!(
            text.contains("pods/ephemeralcontainers"),
            "the generated webhooks do not register pods/ephemeralcontainers: {text}"
        );
        match value["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => {
                let config: MutatingWebhookConfiguration = serde_json::from_value(value)?;
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .create(&PostParams::default(), &config)
                    .await?;
            }
            Some("ValidatingWebhookConfiguration") => {
                let config: ValidatingWebhookConfiguration = serde_json::from_value(value)?;
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .create(&PostParams::default(), &config)
                    .await?;
            }
            other => bail!("unexpected document kind {other:?} from ivory webhooks"),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_image_a_pod_runs_is_verified() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&[]).await?;
    let registry = RegistryHarness::start_default().await?;
    let ((signed, signed_digest), (unsigned, unsigned_digest)) =
        push_signed_and_unsigned(&registry).await?;
    let host = registry.host().to_owned();
    let pinned_signed = format!("{signed}@{signed_digest}");

    let (dir, ca, registry_ca) = ivory_dir(&registry)?;
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies)?;
    let ns = namespace(&client, "e2e-pod-images", &[]).await?;
    std::fs::write(policies.join("policy.yaml"), policy_yaml(&host, &ns))?;
    let ivory = serve_policies(dir.path(), &registry_ca, &policies).await?;
    register_webhooks(&client, &policies, &ivory.base_url(), &ca).await?;
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    let logs = || format!("\nivory log:\n{}", ivory.logs());

    // Wait until the webhooks are in the API server's chain.
    let ready = eventually("unsigned pods to be denied", PROPAGATION, || async {
        let probe = pod(&unique_name("probe"), &[&unsigned], &[]);
        let answer = create(&client, &format!("{pods}?dryRun=All"), &probe).await?;
        if answer.denied_with(MESSAGE) {
            Ok(())
        } else {
            Err(anyhow::anyhow!("{}: {}", answer.status, answer.message()))
        }
    })
    .await;
    if let Err(e) = ready {
        let apiserver = cluster.apiserver_log_tail(40).unwrap_or_default();
        bail!("{e}{}\napiserver log:\n{apiserver}", logs());
    }

    // A signed pod is admitted and pinned.
    let answer = create(&client, &pods, &pod("web", &[&signed], &[])).await?;
    ensure!(answer.ok(), "{answer:?}{}", logs());
    ensure!(
        answer.body["spec"]["containers"][0]["image"] == pinned_signed.as_str(),
        "{answer:?}"
    );
    // The API server's audit event of that create names the verified digest and its signer.
    verification_evidence_is_audited(cluster, &ns, &signed_digest).await?;

    // kubectl debug with an unsigned image: denied, nothing stored.
    let answer = debug(&client, &ns, "web", &unsigned).await?;
    ensure!(answer.denied_with(MESSAGE), "{answer:?}{}", logs());
    let stored = send(
        &client,
        http::Method::GET,
        &format!("{pods}/web"),
        "application/json",
        None,
    )
    .await?;
    ensure!(
        stored.body["spec"]["ephemeralContainers"].is_null(),
        "the debug container was stored: {stored:?}"
    );
    // A signed debug image is admitted, pinned.
    let answer = debug(&client, &ns, "web", &signed).await?;
    ensure!(answer.ok(), "{answer:?}{}", logs());
    ensure!(
        answer.body["spec"]["ephemeralContainers"][0]["image"] == pinned_signed.as_str(),
        "{answer:?}"
    );

    // Image volumes: unsigned denied; signed admitted with the reference pinned.
    let answer = create(
        &client,
        &pods,
        &pod("vol-unsigned", &[&signed], &[&unsigned]),
    )
    .await?;
    ensure!(answer.denied_with(MESSAGE), "{answer:?}{}", logs());
    let answer = create(&client, &pods, &pod("vol-signed", &[&signed], &[&signed])).await?;
    ensure!(answer.ok(), "{answer:?}{}", logs());
    ensure!(
        answer.body["spec"]["volumes"][0]["image"]["reference"] == pinned_signed.as_str(),
        "{answer:?}"
    );
    // In a pod template too (autogen).
    let deployments = format!("/apis/apps/v1/namespaces/{ns}/deployments");
    let answer = create(
        &client,
        &deployments,
        &deployment("vol-unsigned", &[&signed], &[&unsigned]),
    )
    .await?;
    ensure!(answer.denied_with(MESSAGE), "{answer:?}{}", logs());

    // Another spelling of the registry, with a digest so nothing pins it first.
    let port = host
        .rsplit(':')
        .next()
        .context("registry host without port")?;
    let respelled = format!("127.0.0.1:0{port}/ivory/unsigned@{unsigned_digest}");
    let answer = create(&client, &pods, &pod("respelled", &[&respelled], &[])).await?;
    ensure!(
        answer.denied_with(MESSAGE),
        "{respelled}: {answer:?}{}",
        logs()
    );
    Ok(())
}

/// sha256 of the DER SubjectPublicKeyInfo of the fixture key the policy trusts, computed here
/// from its PEM, independently of ivory.
fn fixture_key_fingerprint() -> Result<String> {
    use base64::Engine as _;
    let pem = std::fs::read_to_string(workspace().join("fixtures/keys/cosign-p256.pub"))?;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(body)?;
    let out = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-r"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .ok_or_else(|| std::io::Error::other("no stdin"))?
                .write_all(&der)?;
            child.wait_with_output()
        })?;
    let text = String::from_utf8(out.stdout)?;
    let hex = text
        .split_whitespace()
        .next()
        .context("openssl printed no digest")?;
    Ok(format!("sha256:{hex}"))
}

/// Reads the audit log until the event of the `web` Pod's create carries ivory's
/// `verified-images` annotation, and checks what it says.
async fn verification_evidence_is_audited(cluster: &Cluster, ns: &str, digest: &str) -> Result<()> {
    let key = fixture_key_fingerprint()?;
    let found = eventually(
        "the audit event of the admitted Pod",
        PROPAGATION,
        || async {
            let events = cluster.audit_events();
            let event = events
                .iter()
                .filter(|e| e["verb"] == "create" && e["objectRef"]["namespace"] == ns)
                .filter(|e| {
                    e["objectRef"]["name"] == "web" && e["objectRef"]["subresource"].is_null()
                })
                .find(|e| e["stage"] == "ResponseComplete")
                .ok_or_else(|| anyhow::anyhow!("no ResponseComplete event for pods/web yet"))?;
            let annotations = event["annotations"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let (name, value) = annotations
                .iter()
                .find(|(k, _)| k.ends_with("/verified-images"))
                .ok_or_else(|| anyhow::anyhow!("no verified-images annotation: {annotations:?}"))?;
            Ok::<_, anyhow::Error>((name.clone(), value.as_str().unwrap_or_default().to_owned()))
        },
    )
    .await?;
    let (name, value) = found;
    ensure!(name.starts_with("ivpol.validate."), "annotation {name}");
    let entries: Value = serde_json::from_str(&value)?;
    let entry = &entries[0];
    ensure!(entry["digest"] == digest, "{value}");
    ensure!(entry["key"] == key.as_str(), "{value} (fixture key {key})");
    ensure!(entry["policy"] == "e2e-pod-images", "{value}");
    Ok(())
}
