//! The shape an admitted object must have for policies to read it.
//!
//! The image extractors and label selectors read `metadata.labels` and the pod spec's container
//! lists leniently: a field of the wrong type reads as absent. Left alone, a review whose `spec`
//! is a string or whose `containers` is an object would therefore look like a Pod without
//! images and be allowed. The API server never sends such objects, so ivory refuses them with
//! an error naming the field instead of judging them.

use serde_json::Value;
use thiserror::Error;

use super::AdmissionRequest;

/// A field of the review that cannot hold what policies read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("AdmissionReview request.{field} must be {expected}, found {found}")]
pub struct ShapeError {
    /// Dotted path from `request`, e.g. `object.spec.containers[0].image`.
    pub field: String,
    /// What policies need there.
    pub expected: &'static str,
    /// The JSON type found instead.
    pub found: &'static str,
}

/// Container lists of a pod spec.
const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

/// Checks `object` and `oldObject`: each must be a JSON object with an object `metadata`
/// whose `labels` map to strings, and, for kinds that embed a pod spec, every object on the
/// way to that spec, every container list and every container must have its type, and a
/// container's `image` must be a string. Absent and `null` fields are fine.
pub fn check_shape(req: &AdmissionRequest) -> Result<(), ShapeError> {
    let spec = pod_spec_path(req);
    for (name, object) in [("object", &req.object), ("oldObject", &req.old_object)] {
        // An object with a summary has every field the check reads in its type: only an
        // unusual one needs its tree walked (and the field named).
        if let Some(object) = object.as_ref().filter(|o| o.summary().is_none()) {
            check_object(name, object.value(), spec)?;
        }
    }
    Ok(())
}

/// Where the pod spec lives, by the object's kind or, failing that, by its resource.
fn pod_spec_path(req: &AdmissionRequest) -> &'static [&'static str] {
    const POD: &[&str] = &["spec"];
    const TEMPLATE: &[&str] = &["spec", "template", "spec"];
    const CRONJOB: &[&str] = &["spec", "jobTemplate", "spec", "template", "spec"];
    let by_kind = match req.kind.kind.as_str() {
        "Pod" => Some(POD),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => Some(TEMPLATE),
        "CronJob" => Some(CRONJOB),
        _ => None,
    };
    let by_resource = |resource: &str| match resource {
        "pods" => Some(POD),
        "deployments"
        | "statefulsets"
        | "daemonsets"
        | "replicasets"
        | "replicationcontrollers"
        | "jobs" => Some(TEMPLATE),
        "cronjobs" => Some(CRONJOB),
        _ => None,
    };
    by_kind
        .or_else(|| by_resource(&req.original_resource().resource))
        .or_else(|| by_resource(&req.resource.resource))
        .unwrap_or(&[])
}

pub(super) fn check_object(name: &str, object: &Value, spec: &[&str]) -> Result<(), ShapeError> {
    expect_object(name, object)?;
    if let Some(metadata) = present(object.get("metadata")) {
        let field = format!("{name}.metadata");
        expect_object(&field, metadata)?;
        if let Some(labels) = present(metadata.get("labels")) {
            let field = format!("{field}.labels");
            let labels = expect_object(&field, labels)?;
            for (key, value) in labels {
                if !value.is_string() {
                    return Err(mismatch(format!("{field}[{key:?}]"), "a string", value));
                }
            }
        }
    }
    let mut field = name.to_owned();
    let mut at = object;
    for step in spec {
        let Some(next) = present(at.get(*step)) else {
            return Ok(());
        };
        field = format!("{field}.{step}");
        expect_object(&field, next)?;
        at = next;
    }
    if spec.is_empty() {
        return Ok(());
    }
    for list in CONTAINER_LISTS {
        if let Some(containers) = present(at.get(list)) {
            check_containers(&format!("{field}.{list}"), containers)?;
        }
    }
    Ok(())
}

fn check_containers(field: &str, containers: &Value) -> Result<(), ShapeError> {
    let Some(items) = containers.as_array() else {
        return Err(mismatch(field.to_owned(), "a list", containers));
    };
    for (i, container) in items.iter().enumerate() {
        let field = format!("{field}[{i}]");
        expect_object(&field, container)?;
        if let Some(image) = present(container.get("image"))
            && !image.is_string()
        {
            return Err(mismatch(format!("{field}.image"), "a string", image));
        }
    }
    Ok(())
}

/// `None` for absent and `null`.
fn present(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

fn expect_object<'v>(
    field: &str,
    value: &'v Value,
) -> Result<&'v serde_json::Map<String, Value>, ShapeError> {
    value
        .as_object()
        .ok_or_else(|| mismatch(field.to_owned(), "an object", value))
}

fn mismatch(field: String, expected: &'static str, found: &Value) -> ShapeError {
    ShapeError {
        field,
        expected,
        found: json_type(found),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::GroupVersionResource;

    fn pod(object: Value) -> AdmissionRequest {
        AdmissionRequest {
            kind: crate::admission::GroupVersionKind {
                group: String::new(),
                version: "v1".into(),
                kind: "Pod".into(),
            },
            resource: GroupVersionResource::new("", "v1", "pods"),
            object: Some(object.into()),
            ..AdmissionRequest::default()
        }
    }

    fn field_of(object: Value) -> String {
        check_shape(&pod(object)).unwrap_err().field
    }

    #[test]
    fn well_formed_pods_pass() {
        let ok = json!({"metadata": {"labels": {"a": "b"}},
                        "spec": {"containers": [{"name": "c", "image": "nginx"}, {"name": "d"}],
                                 "initContainers": null}});
        assert_eq!(check_shape(&pod(ok)), Ok(()));
        assert_eq!(check_shape(&pod(json!({}))), Ok(()));
    }

    #[test]
    fn each_misshapen_field_is_named() {
        assert_eq!(field_of(json!("pod")), "object");
        assert_eq!(field_of(json!([1])), "object");
        assert_eq!(field_of(json!({"metadata": 1})), "object.metadata");
        assert_eq!(
            field_of(json!({"metadata": {"labels": {"a": 1}}})),
            "object.metadata.labels[\"a\"]"
        );
        assert_eq!(field_of(json!({"spec": "x"})), "object.spec");
        assert_eq!(
            field_of(json!({"spec": {"containers": {"image": "x"}}})),
            "object.spec.containers"
        );
        assert_eq!(
            field_of(json!({"spec": {"initContainers": ["nginx"]}})),
            "object.spec.initContainers[0]"
        );
        assert_eq!(
            field_of(json!({"spec": {"ephemeralContainers": [{"image": ["nginx"]}]}})),
            "object.spec.ephemeralContainers[0].image"
        );
        let err = check_shape(&pod(json!({"spec": {"containers": "nginx"}}))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "AdmissionReview request.object.spec.containers must be a list, found a string"
        );
    }

    #[test]
    fn controllers_and_old_objects_are_checked() {
        let mut req = pod(json!({}));
        req.kind.kind = "CronJob".into();
        req.object = Some(json!({"spec": {"jobTemplate": {"spec": {"template": 7}}}}).into());
        assert_eq!(
            check_shape(&req).unwrap_err().field,
            "object.spec.jobTemplate.spec.template"
        );
        let mut req = pod(json!({}));
        req.object = None;
        req.old_object = Some(json!({"spec": {"containers": 1}}).into());
        assert_eq!(
            check_shape(&req).unwrap_err().field,
            "oldObject.spec.containers"
        );
        // Kinds without a pod spec only need to be objects.
        let mut req = pod(json!({"spec": "anything"}));
        req.kind.kind = "ConfigMap".into();
        req.resource = GroupVersionResource::new("", "v1", "configmaps");
        assert_eq!(check_shape(&req), Ok(()));
    }
}
