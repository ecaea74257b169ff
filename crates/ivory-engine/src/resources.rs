//! Cluster objects for Kyverno's `resource` and `globalContext` CEL libraries.
//!
//! The engine reads them through [`ResourceSource`], synchronously and from memory: a source
//! is a cache kept current in the background (`ivory serve --kube`: one watch per kind of
//! object the policies read) or objects loaded from files (`--cluster-resources`,
//! [`FileResources`]), never an API call per admission. What a policy may read is fixed when
//! it is compiled ([`ivory_policy::ClusterReads`]); an expression that reads data the source
//! cannot give (not watched, not synced yet, over its bounds, not allowed) fails with
//! [`ResourceError`], and the policy's failurePolicy decides; it is never answered empty.
//!
//! Entry point for other front ends (`ivory test`): build a [`FileResources`] from the
//! documents of the resource files and pass it to [`crate::validate::validate`].

mod file;
pub mod global_context;
pub(crate) mod host;

use std::sync::Arc;

use ivory_policy::ResourceRead;
use serde_json::Value;

pub use self::file::{FileResources, ResourceFileError, ResourceFileReason, plural};
pub use self::global_context::{GlobalContextEntry, GlobalContextError};

/// Objects of one kind, as a [`ResourceSource`] answers a list.
#[derive(Debug, Clone, Default)]
pub struct ObjectList {
    /// The objects' `kind` (`ConfigMap`), when known: the list is then a `<kind>List`.
    pub kind: Option<String>,
    /// The objects, in a stable order (namespace, name).
    pub items: Vec<Arc<Value>>,
}

/// Cluster objects held in memory, for the CEL `resource` and `globalContext` libraries.
pub trait ResourceSource: Send + Sync {
    /// The object `name` in `namespace` (`""`: a cluster-scoped object) of the kind `what`
    /// names (`what.namespace` says which watch or file set answers: `None` for all
    /// namespaces). `Ok(None)` when it does not exist.
    fn get(
        &self,
        what: &ResourceRead,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Value>>, ResourceError>;

    /// Every object of the kind `what` names in `what.namespace` (`None`: every namespace,
    /// and cluster-scoped objects).
    fn list(&self, what: &ResourceRead) -> Result<ObjectList, ResourceError>;

    /// The objects of the GlobalContextEntry `entry` (its `kubernetesResource`), or `None`
    /// when no such entry exists.
    fn global_context(&self, entry: &str) -> Result<Option<ObjectList>, ResourceError>;
}

/// Why cluster data could not be given. Its text is what the policy's result says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// Nothing serves cluster data here (no `--kube`, no `--cluster-resources`).
    #[error(
        "no cluster resources here (ivory serve --kube, or --cluster-resources FILE for the \
         CLI and file mode)"
    )]
    NoSource,
    /// The kind is not watched (or not in the files): no loaded policy declared it, or the
    /// data was given for other kinds only.
    #[error("{what} is not available: no watch or resource file covers it")]
    NotWatched {
        /// What was asked.
        what: String,
    },
    /// The watch has not listed its objects yet (or lost them and is listing again).
    #[error("{what} is not synced yet: {detail}")]
    NotSynced {
        /// What was asked.
        what: String,
        /// The watch's state (its last error, when it has one: forbidden, not found).
        detail: String,
    },
    /// The watch holds more than its bounds allow: it serves nothing rather than a part.
    #[error("{what} exceeds the bounds of ivory's watch cache ({detail})")]
    OverLimit {
        /// What was asked.
        what: String,
        /// Which bound and its value.
        detail: String,
    },
    /// A GlobalContextEntry that cannot be served (an `apiCall` entry, projections).
    #[error("GlobalContextEntry {entry}: {reason}")]
    GlobalContext {
        /// The entry's name.
        entry: String,
        /// Why.
        reason: String,
    },
}

/// The source where nothing is available: every read fails with [`ResourceError::NoSource`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoResources;

impl ResourceSource for NoResources {
    fn get(&self, _: &ResourceRead, _: &str, _: &str) -> Result<Option<Arc<Value>>, ResourceError> {
        Err(ResourceError::NoSource)
    }

    fn list(&self, _: &ResourceRead) -> Result<ObjectList, ResourceError> {
        Err(ResourceError::NoSource)
    }

    fn global_context(&self, _: &str) -> Result<Option<ObjectList>, ResourceError> {
        Err(ResourceError::NoSource)
    }
}

/// `kind` of the objects of `what` as a list: `ConfigMapList`, or `List` when unknown.
pub(crate) fn list_object(api_version: &str, list: ObjectList) -> Value {
    let kind = list
        .kind
        .map_or_else(|| "List".to_owned(), |k| format!("{k}List"));
    let items: Vec<Value> = list.items.iter().map(|o| Value::clone(o)).collect();
    serde_json::json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {},
        "items": items,
    })
}
