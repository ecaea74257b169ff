//! Background re-verification (`evaluation.background.enabled`, default true, as in Kyverno):
//! with `--kube`, the images running Pods actually run (the digest of
//! `status.containerStatuses[].imageID`, and of init and ephemeral containers) are verified
//! again, periodically, against the policies, and the results go to the same PolicyReports as
//! admission results (`process: background scan`). A rotated key or a revoked signature then
//! shows up without a redeploy. The first scan runs at start, which also fills the verdict
//! cache for the digests the cluster runs, so a restart does not send every admission down the
//! cold path.
//!
//! Load is bounded: Pods are scanned `concurrency` at a time, each under its own deadline, and
//! verifications go through the verifier's digest-keyed cache and coalescing, so a digest that
//! a thousand Pods run is verified once per scan: a verdict cached before the scan started is
//! reached again ([`ImageVerifier::revalidating`]), so that a signature removed from the
//! registry shows up at the next scan rather than when its cached verdict expires.
//!
//! Each Pod is judged as a CREATE of itself (Kyverno's background scanner synthesises one, with
//! an empty userInfo) in which every container image the kubelet reports a digest for is
//! written `<image as in the spec>@<running digest>`: what is verified is what runs, not what a
//! tag points to now. Containers without a reported digest keep their spec image.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use ivory_engine::admission::{
    AdmissionRequest, GroupVersionKind, GroupVersionResource, Operation,
};
use ivory_engine::exceptions::Exceptions;
use ivory_engine::pipeline::{Judged, Namespaces, Pipeline, Stage};
use ivory_engine::verifier::ImageVerifier;
use ivory_policy::CompiledPolicy;
use ivory_policy::types::PolicyKind;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::Value;

use crate::policy_results;
use crate::routes::AppState;

/// How a background scan runs.
#[derive(Clone, Debug)]
pub struct BackgroundSettings {
    /// Time between the starts of two scans (the first runs at start).
    pub interval: Duration,
    /// Pods judged at the same time.
    pub concurrency: usize,
    /// Deadline of one Pod's evaluation.
    pub pod_budget: Duration,
}

impl Default for BackgroundSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(3600),
            concurrency: 4,
            pod_budget: Duration::from_secs(30),
        }
    }
}

/// Starts the Pod reflector and the periodic scan.
pub fn start(client: Client, state: AppState, settings: BackgroundSettings) {
    let (reader, writer) = reflector::store();
    let stream = watcher(Api::<Pod>::all(client), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                tracing::warn!(error = %e, "Pod watch failed; retrying");
            }
        }
    });
    tokio::spawn(scan_forever(reader, state, settings));
}

async fn scan_forever(pods: Store<Pod>, state: AppState, settings: BackgroundSettings) {
    if pods.wait_until_ready().await.is_err() {
        tracing::error!("the Pod watch ended before its first list; no background scans");
        return;
    }
    let mut ticker = tokio::time::interval(settings.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let started = ivory_clock::now();
        let scanned = scan_once(&pods, &state, &settings).await;
        tracing::info!(
            pods = scanned,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "background scan done"
        );
    }
}

/// Judges every Pod in the store once; returns how many were judged.
pub async fn scan_once(
    pods: &Store<Pod>,
    state: &AppState,
    settings: &BackgroundSettings,
) -> usize {
    let snapshot = state.policies.snapshot();
    let policies: Vec<Arc<CompiledPolicy>> = snapshot
        .policies()
        .iter()
        .filter(|p| p.autogen_config.is_none() && p.background_enabled())
        .cloned()
        .collect();
    if policies.is_empty() {
        return 0;
    }
    let exceptions = state.exceptions.as_ref().map(|settings| Exceptions {
        exceptions: snapshot.exceptions.clone(),
        namespace: settings.namespace.clone(),
    });
    let requests: Vec<AdmissionRequest> =
        pods.state().iter().filter_map(|p| request_for(p)).collect();
    let count = requests.len();
    // Verdicts cached before this scan are reached again: a scan is how a signature removed
    // from the registry shows up before its cached verdict expires.
    let revalidating = state.verifier.revalidating(ivory_clock::now());
    let verifier = revalidating.as_deref().unwrap_or(state.verifier.as_ref());
    futures::stream::iter(requests)
        .for_each_concurrent(settings.concurrency.max(1), |req| {
            let (policies, exceptions) = (&policies, exceptions.as_ref());
            async move {
                judge(
                    state,
                    verifier,
                    policies,
                    exceptions,
                    &req,
                    settings.pod_budget,
                )
                .await
            }
        })
        .await;
    count
}

async fn judge(
    state: &AppState,
    verifier: &dyn ImageVerifier,
    policies: &[Arc<CompiledPolicy>],
    exceptions: Option<&Exceptions>,
    req: &AdmissionRequest,
    budget: Duration,
) {
    let deadline = ivory_clock::now() + budget;
    let in_scope: Vec<&CompiledPolicy> = policies
        .iter()
        .map(Arc::as_ref)
        .filter(|p| match p.kind {
            PolicyKind::ImageValidatingPolicy => true,
            PolicyKind::NamespacedImageValidatingPolicy => {
                p.namespace.as_deref() == req.namespace()
            }
        })
        .collect();
    let pipeline = Pipeline {
        verifier,
        resources: state.resources.as_ref(),
        namespaces: match &state.namespaces {
            Some(source) => Namespaces::Source(source.as_ref()),
            None => Namespaces::Unknown,
        },
        // A scan reports each policy's own result, and a policy left out for unusable Secrets
        // has none: the verifier reads with the Secrets admissions already prepared.
        credentials: None,
        exceptions,
        // Nobody waits on a scan: the per-Pod deadline is bound enough.
        backstop: None,
        memo: Some(state.memo.as_ref()),
    };
    let mut req = req.clone();
    match pipeline
        .judge(Stage::Validate, &in_scope, &mut req, deadline)
        .await
    {
        Ok(Judged { decision, panic }) => {
            if let Some(panic) = panic {
                tracing::error!(pod = %req.name, namespace = %req.namespace, %panic, "background evaluation panicked");
            }
            policy_results::after_background(
                &state.metrics,
                state.reports.as_ref(),
                &req,
                &decision.results,
            );
        }
        Err(e) => {
            tracing::warn!(pod = %req.name, namespace = %req.namespace, error = %e, "Pod not judged");
        }
    }
}

/// A CREATE of `pod` with each container image pinned to the digest it runs.
pub fn request_for(pod: &Pod) -> Option<AdmissionRequest> {
    let mut object = serde_json::to_value(pod).ok()?;
    let running = running_digests(&object);
    pin_running(&mut object, &running);
    if let Some(obj) = object.as_object_mut() {
        obj.insert("apiVersion".to_owned(), Value::from("v1"));
        obj.insert("kind".to_owned(), Value::from("Pod"));
        obj.remove("status");
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    }
    let name = pod.metadata.name.clone()?;
    Some(AdmissionRequest {
        uid: format!(
            "background-{}",
            pod.metadata.uid.clone().unwrap_or_default()
        ),
        kind: GroupVersionKind {
            group: String::new(),
            version: "v1".to_owned(),
            kind: "Pod".to_owned(),
        },
        resource: GroupVersionResource {
            group: String::new(),
            version: "v1".to_owned(),
            resource: "pods".to_owned(),
        },
        name,
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        operation: Operation::Create,
        object: Some(object.into()),
        ..AdmissionRequest::default()
    })
}

/// `(field, container name) -> digest` from the Pod's container statuses.
fn running_digests(pod: &Value) -> BTreeMap<(&'static str, String), String> {
    let mut out = BTreeMap::new();
    for (statuses, field) in [
        ("containerStatuses", "containers"),
        ("initContainerStatuses", "initContainers"),
        ("ephemeralContainerStatuses", "ephemeralContainers"),
    ] {
        let list = pod
            .pointer(&format!("/status/{statuses}"))
            .and_then(Value::as_array);
        for status in list.into_iter().flatten() {
            let name = status.get("name").and_then(Value::as_str);
            let digest = status
                .get("imageID")
                .and_then(Value::as_str)
                .and_then(digest_of_image_id);
            if let (Some(name), Some(digest)) = (name, digest) {
                out.insert((field, name.to_owned()), digest);
            }
        }
    }
    out
}

/// The `sha256:…` digest of a kubelet `imageID` (`docker-pullable://repo@sha256:…`,
/// `repo@sha256:…`); `None` when it names no digest of a known algorithm.
pub fn digest_of_image_id(image_id: &str) -> Option<String> {
    let (_, digest) = image_id.rsplit_once('@')?;
    let (algorithm, hex) = digest.split_once(':')?;
    let length = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return None,
    };
    let valid = hex.len() == length
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    valid.then(|| digest.to_owned())
}

/// Writes `<spec image>@<running digest>` for every container with a running digest (the
/// spec's own digest, if any, is replaced: the running one is what counts).
fn pin_running(pod: &mut Value, running: &BTreeMap<(&'static str, String), String>) {
    for field in ["containers", "initContainers", "ephemeralContainers"] {
        let list = pod
            .pointer_mut(&format!("/spec/{field}"))
            .and_then(Value::as_array_mut);
        for container in list.into_iter().flatten() {
            let Some(name) = container.get("name").and_then(Value::as_str) else {
                continue;
            };
            let Some(digest) = running.get(&(field, name.to_owned())) else {
                continue;
            };
            let Some(image) = container.get("image").and_then(Value::as_str) else {
                continue;
            };
            let base = image.split_once('@').map_or(image, |(b, _)| b);
            container["image"] = Value::from(format!("{base}@{digest}"));
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit {
    use super::*;
    use serde_json::json;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn image_ids_yield_digests_only_when_well_formed() {
        assert_eq!(
            digest_of_image_id(&format!("docker-pullable://reg/app@{DIGEST}")).as_deref(),
            Some(DIGEST)
        );
        assert_eq!(
            digest_of_image_id(&format!("reg/app@{DIGEST}")).as_deref(),
            Some(DIGEST)
        );
        assert!(digest_of_image_id("sha256:abc").is_none());
        assert!(digest_of_image_id("reg/app@sha256:XYZ").is_none());
        assert!(digest_of_image_id("reg/app@md5:0123").is_none());
    }

    #[test]
    fn the_running_digest_is_what_is_judged() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "team", "uid": "u-1"},
            "spec": {"containers": [
                {"name": "app", "image": "reg/app:v1"},
                {"name": "side", "image": format!("reg/side@{DIGEST}")},
                {"name": "new", "image": "reg/new:v2"}
            ]},
            "status": {"containerStatuses": [
                {"name": "app", "image": "reg/app:v1", "imageID": format!("reg/app@{DIGEST}"),
                 "ready": true, "restartCount": 0},
                {"name": "side", "image": "reg/side", "imageID": "reg/side@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
                 "ready": true, "restartCount": 0}
            ]}
        }))
        .unwrap_or_default();
        let req = request_for(&pod).unwrap_or_default();
        let images: Vec<&str> = req
            .object
            .as_ref()
            .and_then(|o| o.value().pointer("/spec/containers"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c["image"].as_str())
            .collect();
        assert_eq!(
            images,
            [
                format!("reg/app:v1@{DIGEST}").as_str(),
                "reg/side@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
                "reg/new:v2",
            ]
        );
        assert_eq!(req.operation, Operation::Create);
        assert_eq!(req.namespace, "team");
        assert!(
            req.object
                .as_ref()
                .is_some_and(|o| o.value().get("status").is_none())
        );
    }
}
