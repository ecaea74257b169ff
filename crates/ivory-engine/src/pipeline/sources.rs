//! The seams the pipeline reads the cluster through before a stage runs: the request's
//! Namespace and the Secrets a policy's `credentials` names. `ivory-server` implements them
//! with watches (`kube_source`); the one-shot commands have neither.

use futures::future::BoxFuture;
use ivory_policy::types::Credentials;
use serde_json::{Value, json};
use tokio::time::Instant;

/// Where `namespaceObject` comes from (the server's Namespace reflector with `--kube`). When
/// it cannot tell, the pipeline synthesizes the object with [`namespace_object`] and leaves
/// namespaceSelectors to the API server (see `AdmissionRequest::namespace_labels_unknown`).
pub trait NamespaceSource: Send + Sync {
    /// The Namespace object named `name` as the API server has it, found by `deadline`, or
    /// `None` when its labels cannot be known in time.
    fn namespace<'a>(&'a self, name: &'a str, deadline: Instant) -> BoxFuture<'a, Option<Value>>;
}

/// Why a Secret named by a policy's `credentials.secrets` cannot be used: the source's own
/// error (the server's `CredentialError`), shown as it words itself.
pub type CredentialProblem = Box<dyn std::error::Error + Send + Sync>;

/// Where the Secrets of a policy's `credentials` come from (the Kubernetes API with `--kube`).
pub trait CredentialSource: Send + Sync {
    /// Makes every Secret `credentials` names available to the verifier's credentials resolver
    /// by `deadline`, or says which one cannot be used and why. `policy_namespace` is the
    /// namespace of a NamespacedImageValidatingPolicy (`None` for a cluster policy).
    fn prepare<'a>(
        &'a self,
        policy_namespace: Option<&'a str>,
        credentials: &'a Credentials,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<(), CredentialProblem>>;
}

/// Without the Namespace's real object, `namespaceObject` is synthesized from the request's
/// namespace with the one label the API server guarantees on every Namespace
/// (`kubernetes.io/metadata.name`).
pub fn namespace_object(namespace: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "labels": {"kubernetes.io/metadata.name": namespace},
        },
    })
}
