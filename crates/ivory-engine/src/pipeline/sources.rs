//! The seams the pipeline reads the cluster through before a stage runs: the request's
//! Namespace and the Secrets a policy's `credentials` names. `ivory-server` implements them
//! with watches (`kube_source`); the one-shot commands have neither.

use std::sync::{Arc, LazyLock, RwLock};

use futures::future::BoxFuture;
use ivory_plumbing::keyed::KeyedMap;
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

/// Synthesized Namespace objects kept at most; past that all are forgotten and built again as
/// they come (a cost, never a different object: each is a function of its name alone).
const MAX_SYNTHESIZED: usize = 1024;

/// [`namespace_object`], built once per name and shared: building it was ~1.7 k instructions of
/// every warm admission without a Namespace source (BENCHMARKS.md, issue 47).
pub(crate) fn shared_namespace_object(namespace: &str) -> Arc<Value> {
    static BUILT: LazyLock<RwLock<KeyedMap<String, Arc<Value>>>> = LazyLock::new(Default::default);
    if let Some(object) = BUILT
        .read()
        .ok()
        .and_then(|built| built.get(namespace).cloned())
    {
        return object;
    }
    let object = Arc::new(namespace_object(namespace));
    if let Ok(mut built) = BUILT.write() {
        if built.len() >= MAX_SYNTHESIZED {
            built.clear();
        }
        built.insert(namespace.to_owned(), Arc::clone(&object));
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synthesized_namespace_is_built_once_and_is_the_same_object() {
        let first = shared_namespace_object("team-a");
        assert_eq!(*first, namespace_object("team-a"));
        assert!(Arc::ptr_eq(&first, &shared_namespace_object("team-a")));
        assert_eq!(
            *shared_namespace_object("team-b"),
            namespace_object("team-b")
        );
        // Past the bound, all are forgotten and built again: the same object, a new allocation.
        for n in 0..MAX_SYNTHESIZED {
            shared_namespace_object(&format!("ns-{n}"));
        }
        let again = shared_namespace_object("team-a");
        assert_eq!(again, first);
    }
}
