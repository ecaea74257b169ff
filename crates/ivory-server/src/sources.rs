//! The seams the admission routes read the cluster through, and what they answer when a
//! policy's registry Secret cannot be used. `kube_source` implements them with watches; the
//! routes, the background scan and the CLI know only these.

use futures::future::BoxFuture;
use ivory_policy::types::Credentials;
use serde_json::Value;
use tokio::time::Instant;

/// Secret type read for registry credentials.
pub(crate) const DOCKER_CONFIG_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// Key of the docker config in such a Secret.
pub(crate) const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";
/// Where `namespaceObject` comes from (the Namespace reflector with `--kube`). Without one, or
/// when it cannot tell, the server synthesizes the object with [`namespace_object`](crate::namespace_object) and leaves
/// namespaceSelectors to the API server (see `AdmissionRequest::namespace_labels_unknown`).
pub trait NamespaceSource: Send + Sync {
    /// The Namespace object named `name` as the API server has it, found by `deadline`, or
    /// `None` when its labels cannot be known in time.
    fn namespace<'a>(&'a self, name: &'a str, deadline: Instant) -> BoxFuture<'a, Option<Value>>;
}

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
    ) -> BoxFuture<'a, Result<(), CredentialError>>;
}

/// Why a Secret named by a policy's `credentials.secrets` cannot be used for a request: the
/// policy's failurePolicy decides what the request gets.
#[derive(Debug, thiserror::Error)]
#[error("spec.credentials.secrets[{index}] {reference:?}: {problem}")]
pub struct CredentialError {
    /// Position of the entry in `credentials.secrets`.
    pub index: usize,
    /// The entry as written (`name` or `namespace/name`).
    pub reference: String,
    /// What is wrong with it.
    pub problem: SecretProblem,
}

/// What keeps a `credentials.secrets` entry from being used.
#[derive(Debug, thiserror::Error)]
pub enum SecretProblem {
    /// A NamespacedImageValidatingPolicy names a Secret of another namespace.
    #[error("a NamespacedImageValidatingPolicy may only use Secrets of its own namespace {own:?}")]
    OtherNamespace {
        /// The policy's namespace.
        own: String,
    },
    /// No reflector watches the Secret's namespace, and none can be started.
    #[error("Secrets of namespace {namespace} are not watched")]
    NotWatched {
        /// The Secret's namespace.
        namespace: String,
    },
    /// The Secrets of the namespace were not listed by the request's deadline.
    #[error(
        "the Secrets of namespace {namespace} could not be listed in time (may ivory list and \
         watch Secrets there? the watch errors are in the log)"
    )]
    NotListed {
        /// The Secret's namespace.
        namespace: String,
    },
    /// No Secret of that name and type.
    #[error(
        "Secret {namespace}/{name} of type {} not found{}",
        DOCKER_CONFIG_TYPE,
        own_namespace_note(*.namespaced_policy)
    )]
    NotFound {
        /// The Secret's namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
        /// Whether a NamespacedImageValidatingPolicy asked (it reads its own namespace only).
        namespaced_policy: bool,
    },
    /// The Secret has no `.dockerconfigjson` key.
    #[error("Secret {namespace}/{name} has no {}", DOCKER_CONFIG_KEY)]
    NoDockerConfig {
        /// The Secret's namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
    },
    /// The Secret's `.dockerconfigjson` is not usable (never quotes it).
    #[error("Secret {namespace}/{name}: {source}")]
    Invalid {
        /// The Secret's namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
        /// Why its content was refused.
        source: ivory_registry::Error,
    },
}

fn own_namespace_note(namespaced_policy: bool) -> &'static str {
    if namespaced_policy {
        "; a NamespacedImageValidatingPolicy reads Secrets of its own namespace only"
    } else {
        ""
    }
}
