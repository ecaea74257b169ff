//! Kyverno GlobalContextEntries (`kyverno.io` v2alpha1, v2beta1, v2) of the
//! `kubernetesResource` kind: a name for the objects of one resource, read in CEL as
//! `globalContext.Get(name, '')` (the list of objects). `apiCall` entries (an HTTP call ivory
//! would make for the policy) and `projections` (JMESPath) are refused with a clear error.

use ivory_policy::ResourceRead;
use serde_json::Value;

/// API group of GlobalContextEntry.
pub const GROUP: &str = "kyverno.io";
/// Kind of a GlobalContextEntry.
pub const KIND: &str = "GlobalContextEntry";
/// Versions Kyverno 1.19 serves.
const VERSIONS: [&str; 3] = ["v2alpha1", "v2beta1", "v2"];

/// A `kubernetesResource` GlobalContextEntry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalContextEntry {
    /// `metadata.name`.
    pub name: String,
    /// What it names: group, version, resource and (optionally) namespace.
    pub target: ResourceRead,
}

/// Why a GlobalContextEntry cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GlobalContextEntry {name}: {reason}")]
pub struct GlobalContextError {
    /// The entry's name (`?` when it has none).
    pub name: String,
    /// Why.
    pub reason: String,
}

impl GlobalContextEntry {
    /// Whether `object` is a GlobalContextEntry (any served version).
    pub fn is_entry(object: &Value) -> bool {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        object["kind"] == KIND
            && api_version
                .split_once('/')
                .is_some_and(|(g, v)| g == GROUP && VERSIONS.contains(&v))
    }

    /// Reads an entry; `apiCall` entries, projections and malformed ones are errors.
    pub fn parse(object: &Value) -> Result<Self, GlobalContextError> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let fail = |reason: &str| GlobalContextError {
            name: if name.is_empty() { "?" } else { name }.to_owned(),
            reason: reason.to_owned(),
        };
        if name.is_empty() {
            return Err(fail("metadata.name is required"));
        }
        let spec = &object["spec"];
        if !spec["apiCall"].is_null() {
            return Err(fail(
                "spec.apiCall is not supported by ivory: an admission never makes an HTTP call \
                 a policy chooses (use spec.kubernetesResource)",
            ));
        }
        if spec["projections"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
        {
            return Err(fail(
                "spec.projections (JMESPath) are not supported by ivory: read the objects with \
                 globalContext.Get(name, '') and select in CEL",
            ));
        }
        let k = &spec["kubernetesResource"];
        let field = |f: &str| k[f].as_str().unwrap_or_default().to_owned();
        let (version, resource) = (field("version"), field("resource"));
        if version.is_empty() || resource.is_empty() {
            return Err(fail(
                "spec.kubernetesResource with version and resource is required",
            ));
        }
        if field("group").is_empty() && resource == "secrets" {
            return Err(fail("ivory does not read Secrets for policies"));
        }
        let namespace = Some(field("namespace")).filter(|n| !n.is_empty());
        Ok(Self {
            name: name.to_owned(),
            target: ResourceRead {
                group: field("group"),
                version,
                resource,
                namespace,
            },
        })
    }
}
