//! `ivory serve --kube`: the Kubernetes client, ivory's own namespace and the credentials
//! resolver backed by the Secret reflector.

use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use ivory_policy::types::Credentials as PolicyCredentials;
use ivory_registry::Credentials;
use ivory_server::{KubeSource, Metrics, PolicyStore};
use ivory_verify::CredentialsResolver;

/// Where Kubernetes mounts the pod's namespace.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Connects (KUBECONFIG or in-cluster), starts the reflectors and waits for their first lists.
pub(super) async fn start(
    flag_namespace: &str,
    store: &Arc<PolicyStore>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<KubeSource> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (KUBECONFIG or in-cluster config)")?;
    let namespace = own_namespace(flag_namespace);
    tracing::info!(namespace = %namespace, "watching policies, namespaces and registry secrets");
    KubeSource::start(client, namespace, store.clone(), metrics.clone())
        .await
        .context("starting the Kubernetes watches")
}

/// POD_NAMESPACE, else the service account's namespace file, else `--namespace`.
fn own_namespace(flag: &str) -> String {
    let from_env = std::env::var("POD_NAMESPACE").ok();
    let from_file = || std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok();
    from_env
        .or_else(from_file)
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| flag.to_owned())
}

/// Policy credentials resolved from the Secret reflector once `slot` holds the source; until
/// then (and without --kube) anonymous, as before.
pub(super) fn credentials_resolver(slot: Arc<OnceLock<KubeSource>>) -> CredentialsResolver {
    Arc::new(move |c: Option<&PolicyCredentials>| match slot.get() {
        Some(source) => source.credentials(c),
        None => Credentials::anonymous()
            .allow_insecure(c.and_then(|c| c.allow_insecure_registry).unwrap_or(false)),
    })
}
