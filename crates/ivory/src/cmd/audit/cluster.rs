//! `ivory audit --kubeconfig`: the images the Pods of a cluster run, grouped by what their
//! evaluation depends on: the Pod's namespace (policies' namespaceSelector, namespaced
//! policies) and its `imagePullSecrets` (the credentials the kubelet pulls with).
//!
//! A container's image is the digest reference of its status `imageID` when it has one (what
//! the node actually pulled, so a moved tag does not hide it), else its `spec` image.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ContainerStatus, Namespace, Pod, Secret};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;

/// Pods that are evaluated alike: same namespace, same pull secrets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct PodGroup {
    pub namespace: String,
    /// `imagePullSecrets` names, in the Pod's order.
    pub pull_secrets: Vec<String>,
    pub images: BTreeSet<String>,
}

/// A client for the current context of the kubeconfig at `path`; without one, as kubectl
/// finds it: `KUBECONFIG`, `~/.kube/config`, else the in-cluster service account.
pub(super) async fn client(path: Option<&Path>) -> anyhow::Result<kube::Client> {
    let Some(path) = path else {
        return kube::Client::try_default().await.context(
            "connecting to the Kubernetes API (KUBECONFIG, ~/.kube/config or in-cluster config)",
        );
    };
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading --kubeconfig {}", path.display()))?;
    kube::Client::try_from(config)
        .with_context(|| format!("building a client from --kubeconfig {}", path.display()))
}

/// Every Pod (of `namespace`, or of all namespaces), listed in pages, grouped by namespace
/// and pull secrets, in a stable order.
pub(super) async fn pod_groups(
    client: kube::Client,
    namespace: Option<&str>,
    page_size: usize,
) -> anyhow::Result<Vec<PodGroup>> {
    let api: Api<Pod> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let where_ = namespace.map_or("all namespaces".to_owned(), |ns| format!("namespace {ns}"));
    let limit = u32::try_from(page_size).unwrap_or(u32::MAX);
    let mut params = ListParams::default().limit(limit);
    let mut out: BTreeMap<(String, Vec<String>), BTreeSet<String>> = BTreeMap::new();
    loop {
        let list = api
            .list(&params)
            .await
            .with_context(|| format!("listing the Pods of {where_}"))?;
        for pod in &list.items {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let secrets = pull_secrets_of(pod);
            out.entry((ns, secrets)).or_default().extend(images_of(pod));
        }
        match list.metadata.continue_.as_deref() {
            Some(token) if !token.is_empty() => params = params.continue_token(token),
            _ => break,
        }
    }
    Ok(out
        .into_iter()
        .filter(|(_, images)| !images.is_empty())
        .map(|((namespace, pull_secrets), images)| PodGroup {
            namespace,
            pull_secrets,
            images,
        })
        .collect())
}

fn pull_secrets_of(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.image_pull_secrets.iter().flatten())
        .map(|r| r.name.clone())
        .filter(|n| !n.is_empty())
        .collect()
}

/// The Namespace object as the API server holds it (labels for namespaceSelector). When it
/// cannot be read (RBAC), the webhook's minimal form with the name label, and a warning.
pub(super) async fn namespace_object(client: &kube::Client, name: &str) -> Value {
    let api: Api<Namespace> = Api::all(client.clone());
    match api.get(name).await.map(serde_json::to_value) {
        Ok(Ok(object)) => object,
        Ok(Err(e)) => {
            tracing::warn!(namespace = name, error = %e, "namespace not serialisable; using its name only");
            ivory_engine::pipeline::namespace_object(name)
        }
        Err(e) => {
            tracing::warn!(namespace = name, error = %e,
                "cannot read the namespace; namespaceSelector sees its name label only");
            ivory_engine::pipeline::namespace_object(name)
        }
    }
}

/// The `.dockerconfigjson` (or legacy `.dockercfg`) of each named Secret of `namespace`, as
/// `(source name, bytes)`. A missing or unreadable secret is skipped with a warning, as the
/// kubelet pulls without it.
pub(super) async fn pull_secrets(
    client: &kube::Client,
    namespace: &str,
    names: &[String],
) -> Vec<(String, Vec<u8>)> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut out = Vec::new();
    for name in names {
        let source = format!("secret {namespace}/{name}");
        let secret = match api.get(name).await {
            Ok(secret) => secret,
            Err(e) => {
                tracing::warn!(%source, error = %e, "image pull secret not readable; skipped");
                continue;
            }
        };
        let data = secret.data.unwrap_or_default();
        match data
            .get(".dockerconfigjson")
            .or_else(|| data.get(".dockercfg"))
        {
            Some(bytes) => out.push((source, bytes.0.clone())),
            None => tracing::warn!(%source, "image pull secret has no .dockerconfigjson; skipped"),
        }
    }
    out
}

/// The images of a Pod's containers, init containers and ephemeral containers.
pub(super) fn images_of(pod: &Pod) -> Vec<String> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let status = pod.status.as_ref();
    let regular = spec
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.image.as_deref()));
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| (c.name.as_str(), c.image.as_deref()));
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| (c.name.as_str(), c.image.as_deref()));
    let mut out = Vec::new();
    out.extend(resolve(
        regular,
        status.and_then(|s| s.container_statuses.as_ref()),
    ));
    out.extend(resolve(
        init,
        status.and_then(|s| s.init_container_statuses.as_ref()),
    ));
    out.extend(resolve(
        ephemeral,
        status.and_then(|s| s.ephemeral_container_statuses.as_ref()),
    ));
    out
}

/// Each (name, spec image) as the digest reference of its status, else the spec image.
fn resolve<'a>(
    containers: impl Iterator<Item = (&'a str, Option<&'a str>)>,
    statuses: Option<&'a Vec<ContainerStatus>>,
) -> Vec<String> {
    let by_name: HashMap<&str, &ContainerStatus> = statuses
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s))
        .collect();
    containers
        .filter_map(|(name, spec_image)| {
            by_name
                .get(name)
                .and_then(|s| digest_reference(&s.image_id))
                .or_else(|| {
                    spec_image
                        .map(str::trim)
                        .filter(|i| !i.is_empty())
                        .map(str::to_owned)
                })
        })
        .collect()
}

/// `docker-pullable://repo@sha256:…` or `repo@sha256:…` → `repo@sha256:…`; `None` for an
/// imageID without a repository (containerd's bare `sha256:…` image id) or without a digest.
fn digest_reference(image_id: &str) -> Option<String> {
    let reference = image_id
        .split_once("://")
        .map_or(image_id, |(_, rest)| rest)
        .trim();
    let (repo, digest) = reference.split_once('@')?;
    let (algorithm, hex) = digest.split_once(':')?;
    let well_formed = !repo.is_empty()
        && !algorithm.is_empty()
        && !hex.is_empty()
        && hex.bytes().all(|b| b.is_ascii_hexdigit());
    well_formed.then(|| reference.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HEX: &str = "0e1dfb0e6a9d8ade72c3c7e96a1a79378d7fadba2f48659904af92517bbca5aa";

    #[test]
    fn digest_references_of_image_ids() {
        assert_eq!(
            digest_reference(&format!("docker-pullable://r.io/a/b@sha256:{HEX}")),
            Some(format!("r.io/a/b@sha256:{HEX}"))
        );
        assert_eq!(
            digest_reference(&format!("r.io/a@sha256:{HEX}")),
            Some(format!("r.io/a@sha256:{HEX}"))
        );
        assert_eq!(digest_reference(&format!("sha256:{HEX}")), None);
        assert_eq!(digest_reference("docker://r.io/a:v1"), None);
        assert_eq!(digest_reference(""), None);
        assert_eq!(digest_reference("r.io/a@sha256:not-hex"), None);
    }

    #[test]
    fn pod_images_prefer_status_digests() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {
                "containers": [
                    {"name": "app", "image": "r.io/app:v1"},
                    {"name": "side", "image": "r.io/side:v1"},
                    {"name": "new", "image": "r.io/new:v1"},
                ],
                "initContainers": [{"name": "init", "image": "r.io/init:v1"}],
                "ephemeralContainers": [{"name": "dbg", "image": "r.io/dbg:v1"}],
            },
            "status": {
                "containerStatuses": [
                    {"name": "app", "image": "r.io/app:v1", "ready": true, "restartCount": 0,
                     "imageID": format!("docker-pullable://r.io/app@sha256:{HEX}")},
                    {"name": "side", "image": "r.io/side:v1", "ready": true, "restartCount": 0,
                     "imageID": format!("sha256:{HEX}")},
                ],
                "initContainerStatuses": [
                    {"name": "init", "image": "r.io/init:v1", "ready": true, "restartCount": 0,
                     "imageID": format!("r.io/init@sha256:{HEX}")},
                ],
                "ephemeralContainerStatuses": [
                    {"name": "dbg", "image": "r.io/dbg:v1", "ready": true, "restartCount": 0,
                     "imageID": ""},
                ],
            },
        }))
        .unwrap();
        assert_eq!(
            images_of(&pod),
            [
                format!("r.io/app@sha256:{HEX}"),
                "r.io/side:v1".to_owned(),
                "r.io/new:v1".to_owned(),
                format!("r.io/init@sha256:{HEX}"),
                "r.io/dbg:v1".to_owned(),
            ]
        );
    }

    #[test]
    fn pods_without_spec_have_no_images() {
        assert!(images_of(&Pod::default()).is_empty());
    }
}
