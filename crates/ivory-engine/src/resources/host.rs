//! The CEL host of cluster reads for one policy: turns a `resource.*` / `globalContext.*` call
//! into a [`ResourceSource`] read, confined to what the policy declared, and records every read
//! that could not be answered so the policy's failurePolicy can decide.

use std::sync::Mutex;

use ivory_cel::{Host, HostError, ResourceQuery};
use ivory_policy::{CompiledPolicy, ResourceRead};
use serde_json::Value;

use super::{ResourceError, ResourceSource, list_object};

/// Answers the cluster-read functions of one policy's expressions; every other function is not
/// available through it.
pub(crate) struct ClusterHost<'a> {
    source: &'a dyn ResourceSource,
    policy: &'a CompiledPolicy,
    failures: Mutex<Vec<ResourceError>>,
}

impl<'a> ClusterHost<'a> {
    pub(crate) fn new(source: &'a dyn ResourceSource, policy: &'a CompiledPolicy) -> Self {
        Self {
            source,
            policy,
            failures: Mutex::new(Vec::new()),
        }
    }

    /// How many reads failed so far (for [`Self::failure_since`]).
    pub(crate) fn mark(&self) -> usize {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// The first read that failed since `mark`.
    pub(crate) fn failure_since(&self, mark: usize) -> Option<ResourceError> {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.get(mark..).and_then(|f| f.first()).cloned()
    }

    fn failed(&self, err: ResourceError) -> HostError {
        let text = err.to_string();
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(err);
        HostError::ClusterData(text)
    }

    /// The watch key of a query (the namespace it reads), checked against what the policy
    /// declared at load. A namespaced policy reads its own namespace only.
    fn target(&self, q: &ResourceQuery) -> Result<(ResourceRead, String), HostError> {
        let Some((group, version)) = ivory_policy::cluster_reads::split_api_version(&q.api_version)
        else {
            return Err(HostError::InvalidArgument(format!(
                "apiVersion {:?} is not `version` or `group/version`",
                q.api_version
            )));
        };
        let namespace = match (&self.policy.namespace, &q.namespace) {
            (Some(own), _) => own.clone(),
            (None, Some(ns)) => ns.clone(),
            (None, None) => {
                return Err(HostError::InvalidArgument(
                    "a cluster policy names the namespace it reads".into(),
                ));
            }
        };
        let read = ResourceRead {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: q.resource.clone(),
            namespace: Some(namespace.clone()).filter(|n| !n.is_empty()),
        };
        let declared = self.policy.cluster_reads.resources.iter().find(|d| {
            d.group == read.group
                && d.version == read.version
                && d.resource == read.resource
                && match (&d.namespace, &read.namespace) {
                    (None, _) => true,
                    (Some(d), Some(r)) => d == r,
                    (Some(_), None) => false,
                }
        });
        match declared {
            Some(d) => Ok((d.clone(), namespace)),
            None => Err(HostError::InvalidArgument(format!(
                "{read} is not among what the policy reads (its calls' literal arguments)"
            ))),
        }
    }
}

fn labels_match(object: &Value, labels: &std::collections::BTreeMap<String, String>) -> bool {
    labels
        .iter()
        .all(|(k, v)| object["metadata"]["labels"][k].as_str() == Some(v.as_str()))
}

impl Host for ClusterHost<'_> {
    fn verify_image_signatures(&self, _: &str, _: &[Value]) -> Result<i64, HostError> {
        Err(HostError::NotAvailable)
    }

    fn verify_attestation_signatures(
        &self,
        _: &str,
        _: &str,
        _: &[Value],
    ) -> Result<i64, HostError> {
        Err(HostError::NotAvailable)
    }

    fn extract_payload(&self, _: &str, _: &str) -> Result<Value, HostError> {
        Err(HostError::NotAvailable)
    }

    fn image_data(&self, _: &str) -> Result<Value, HostError> {
        Err(HostError::NotAvailable)
    }

    fn resource_get(&self, q: &ResourceQuery) -> Result<Option<Value>, HostError> {
        let (watch, namespace) = self.target(q)?;
        let name = q.name.as_deref().unwrap_or_default();
        match self.source.get(&watch, &namespace, name) {
            Ok(found) => Ok(found.map(|o| Value::clone(&o))),
            Err(e) => Err(self.failed(e)),
        }
    }

    fn resource_list(&self, q: &ResourceQuery) -> Result<Value, HostError> {
        let (watch, namespace) = self.target(q)?;
        let narrowed = ResourceRead {
            namespace: Some(namespace).filter(|n| !n.is_empty()),
            ..watch.clone()
        };
        match self.source.list(&watch) {
            Ok(mut list) => {
                list.items.retain(|o| {
                    narrowed.covers(o["metadata"]["namespace"].as_str().unwrap_or_default())
                        && labels_match(o, &q.labels)
                });
                Ok(list_object(&q.api_version, list))
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    fn global_context(&self, entry: &str, projection: &str) -> Result<Value, HostError> {
        if !self.policy.cluster_reads.global_context.contains(entry) {
            return Err(HostError::InvalidArgument(format!(
                "GlobalContextEntry {entry} is not among what the policy reads"
            )));
        }
        match self.source.global_context(entry) {
            Ok(None) => Ok(Value::Null),
            // Kyverno's answer for a projection the entry does not define; ivory serves none.
            Ok(Some(_)) if !projection.is_empty() => Err(HostError::InvalidArgument(format!(
                "failed to get global reference: projection {projection:?} not found"
            ))),
            Ok(Some(list)) => Ok(Value::Array(
                list.items.iter().map(|o| Value::clone(o)).collect(),
            )),
            Err(e) => Err(self.failed(e)),
        }
    }
}
