//! Cluster objects given as files (`--cluster-resources`, like `kyverno apply
//! --cluster-resources`), and GlobalContextEntries among them.
//!
//! A file names its objects by `apiVersion` and `kind`; a policy asks by `apiVersion` and the
//! plural resource name. With no API server to ask, the plural is derived from the kind the
//! way Kubernetes' default naming does ([`plural`]): `ConfigMap` → `configmaps`,
//! `NetworkPolicy` → `networkpolicies`, `Ingress` → `ingresses`.

use std::collections::BTreeMap;
use std::sync::Arc;

use ivory_policy::ResourceRead;
use ivory_policy::cluster_reads::split_api_version;
use serde_json::Value;

use super::{GlobalContextEntry, GlobalContextError, ObjectList, ResourceError, ResourceSource};

/// Objects loaded from files, kept in memory.
#[derive(Debug, Default)]
pub struct FileResources {
    /// (group, version, plural) → (kind, (namespace, name) → object).
    kinds: BTreeMap<(String, String, String), Kind>,
    entries: BTreeMap<String, Result<GlobalContextEntry, GlobalContextError>>,
}

#[derive(Debug, Default)]
struct Kind {
    kind: String,
    objects: BTreeMap<(String, String), Arc<Value>>,
}

/// A document of a resource file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster resource {index}: {reason}")]
pub struct ResourceFileError {
    /// 1-based position among the documents given.
    pub index: usize,
    /// What is wrong with it.
    pub reason: ResourceFileReason,
}

/// What is wrong with a document of a resource file ([`ResourceFileError::reason`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceFileReason {
    /// An object without `apiVersion`, `kind` or `metadata.name`.
    #[error("apiVersion, kind and metadata.name are required")]
    MissingNames,
    /// An `apiVersion` that is neither `version` nor `group/version`.
    #[error("apiVersion {api_version:?} is not `version` or `group/version`")]
    ApiVersion {
        /// The `apiVersion` given.
        api_version: String,
    },
    /// A Secret (never served to policies).
    #[error(
        "Secret {name}: ivory does not serve Secrets to policies (resource.Get of secrets is \
         refused at load)"
    )]
    Secret {
        /// The Secret's `metadata.name`.
        name: String,
    },
}

impl FileResources {
    /// Holds `documents` (objects, `kind: List` documents are expanded). Every object needs
    /// `apiVersion`, `kind` and `metadata.name`; a Secret is refused (ivory never serves
    /// Secrets to policies). A GlobalContextEntry is an entry, not an object; one ivory
    /// cannot serve is kept as the error its reads will answer.
    pub fn new(documents: Vec<Value>) -> Result<Self, ResourceFileError> {
        let mut me = Self::default();
        let mut index = 0;
        for doc in documents {
            let items = match doc {
                Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => o
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
                other => vec![other],
            };
            for object in items {
                index += 1;
                me.add(object)
                    .map_err(|reason| ResourceFileError { index, reason })?;
            }
        }
        Ok(me)
    }

    /// How many objects are held.
    pub fn len(&self) -> usize {
        self.kinds.values().map(|k| k.objects.len()).sum()
    }

    /// Whether no object is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn add(&mut self, object: Value) -> Result<(), ResourceFileReason> {
        if GlobalContextEntry::is_entry(&object) {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            self.entries
                .insert(name, GlobalContextEntry::parse(&object));
            return Ok(());
        }
        let text = |pointer: &str| {
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
        };
        let (api_version, kind, name) =
            (text("/apiVersion"), text("/kind"), text("/metadata/name"));
        if api_version.is_empty() || kind.is_empty() || name.is_empty() {
            return Err(ResourceFileReason::MissingNames);
        }
        let Some((group, version)) = split_api_version(api_version) else {
            return Err(ResourceFileReason::ApiVersion {
                api_version: api_version.to_owned(),
            });
        };
        if group.is_empty() && kind == "Secret" {
            return Err(ResourceFileReason::Secret {
                name: name.to_owned(),
            });
        }
        let key = (group.to_owned(), version.to_owned(), plural(kind));
        let namespace = text("/metadata/namespace").to_owned();
        let name = name.to_owned();
        let held = self.kinds.entry(key).or_insert_with(|| Kind {
            kind: kind.to_owned(),
            objects: BTreeMap::new(),
        });
        held.objects.insert((namespace, name), Arc::new(object));
        Ok(())
    }

    fn kind(&self, what: &ResourceRead) -> Option<&Kind> {
        self.kinds.get(&(
            what.group.clone(),
            what.version.clone(),
            what.resource.clone(),
        ))
    }
}

impl ResourceSource for FileResources {
    fn get(
        &self,
        what: &ResourceRead,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Value>>, ResourceError> {
        Ok(self.kind(what).and_then(|k| {
            k.objects
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned()
        }))
    }

    fn list(&self, what: &ResourceRead) -> Result<ObjectList, ResourceError> {
        let Some(kind) = self.kind(what) else {
            return Ok(ObjectList::default());
        };
        let items = kind
            .objects
            .iter()
            .filter(|((ns, _), _)| what.covers(ns))
            .map(|(_, o)| o.clone())
            .collect();
        Ok(ObjectList {
            kind: Some(kind.kind.clone()),
            items,
        })
    }

    fn global_context(&self, entry: &str) -> Result<Option<ObjectList>, ResourceError> {
        match self.entries.get(entry) {
            None => Ok(None),
            Some(Err(e)) => Err(ResourceError::GlobalContext {
                entry: entry.to_owned(),
                reason: e.reason.clone(),
            }),
            Some(Ok(e)) => self.list(&e.target).map(Some),
        }
    }
}

/// The plural resource name Kubernetes gives `kind` by default (lower case; `y` after a
/// consonant → `ies`; `s`, `x`, `z`, `ch`, `sh` → `es`; `Endpoints` stays).
pub fn plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    if lower == "endpoints" {
        return lower;
    }
    if let Some(stem) = lower.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        return format!("{stem}ies");
    }
    if lower.ends_with(['s', 'x', 'z']) || lower.ends_with("ch") || lower.ends_with("sh") {
        return format!("{lower}es");
    }
    format!("{lower}s")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(resource: &str, namespace: Option<&str>) -> ResourceRead {
        ResourceRead {
            group: String::new(),
            version: "v1".into(),
            resource: resource.into(),
            namespace: namespace.map(str::to_owned),
        }
    }

    fn cm(ns: &str, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}})
    }

    #[test]
    fn plurals_follow_kubernetes_default_naming() {
        let got: Vec<String> = [
            "ConfigMap",
            "NetworkPolicy",
            "Ingress",
            "Endpoints",
            "Gateway",
        ]
        .iter()
        .map(|k| plural(k))
        .collect();
        assert_eq!(
            got,
            [
                "configmaps",
                "networkpolicies",
                "ingresses",
                "endpoints",
                "gateways"
            ]
        );
    }

    #[test]
    fn objects_are_found_by_namespace_and_name_and_listed_per_namespace() {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": [cm("b", "keys")]});
        let files = FileResources::new(vec![cm("a", "keys"), list]).unwrap();
        assert_eq!(files.len(), 2);
        let got = files.get(&read("configmaps", None), "a", "keys").unwrap();
        assert_eq!(got.unwrap()["metadata"]["namespace"], "a");
        assert!(
            files
                .get(&read("configmaps", None), "c", "keys")
                .unwrap()
                .is_none()
        );
        assert_eq!(
            files
                .list(&read("configmaps", Some("b")))
                .unwrap()
                .items
                .len(),
            1
        );
        let all = files.list(&read("configmaps", None)).unwrap();
        assert_eq!(
            (all.items.len(), all.kind.as_deref()),
            (2, Some("ConfigMap"))
        );
    }

    #[test]
    fn secrets_and_incomplete_objects_are_refused() {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}});
        let err = FileResources::new(vec![cm("a", "k"), secret]).unwrap_err();
        assert_eq!(err.index, 2);
        assert_eq!(err.reason, ResourceFileReason::Secret { name: "s".into() });
        assert!(err.to_string().contains("does not serve Secrets"), "{err}");
        let err = FileResources::new(vec![json!({"kind": "ConfigMap"})]).unwrap_err();
        assert_eq!(err.reason, ResourceFileReason::MissingNames);
        assert_eq!(
            err.to_string(),
            "cluster resource 1: apiVersion, kind and metadata.name are required"
        );
        let odd = json!({"apiVersion": "a/b/c", "kind": "ConfigMap", "metadata": {"name": "x"}});
        let err = FileResources::new(vec![odd]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cluster resource 1: apiVersion \"a/b/c\" is not `version` or `group/version`"
        );
    }

    #[test]
    fn global_context_entries_name_the_objects_of_a_resource() {
        let entry = json!({"apiVersion": "kyverno.io/v2beta1", "kind": "GlobalContextEntry",
            "metadata": {"name": "keys"},
            "spec": {"kubernetesResource": {"version": "v1", "resource": "configmaps", "namespace": "a"}}});
        let api = json!({"apiVersion": "kyverno.io/v2alpha1", "kind": "GlobalContextEntry",
            "metadata": {"name": "remote"}, "spec": {"apiCall": {"urlPath": "/api/v1/pods"}}});
        let files = FileResources::new(vec![cm("a", "k1"), cm("b", "k2"), entry, api]).unwrap();
        let got = files.global_context("keys").unwrap().unwrap();
        assert_eq!(got.items.len(), 1, "namespace a only");
        assert!(files.global_context("nope").unwrap().is_none());
        let err = files.global_context("remote").unwrap_err();
        assert!(
            err.to_string().contains("apiCall is not supported"),
            "{err}"
        );
    }
}
