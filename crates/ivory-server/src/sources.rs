//! The seams the admission pipeline reads the cluster through (defined by the engine, whose
//! `pipeline` calls them), and what `kube_source`, which implements them with watches, says
//! when a policy's registry Secret cannot be used.

pub use ivory_engine::pipeline::{CredentialProblem, CredentialSource, NamespaceSource};

/// Secret type read for registry credentials.
pub(crate) const DOCKER_CONFIG_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// Key of the docker config in such a Secret.
pub(crate) const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";

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
