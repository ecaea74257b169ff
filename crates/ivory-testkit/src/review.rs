//! AdmissionReview and Pod JSON shared by the tests and benchmarks.

use serde_json::{Value, json};

/// One container per image, named `c0`, `c1`, ...
pub fn containers(images: &[&str]) -> Vec<Value> {
    images
        .iter()
        .enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect()
}

/// An AdmissionReview asking, as user `alice`, about `operation` on `object` in `namespace`:
/// its kind and resource (the kind's plural) from the object's `apiVersion` and `kind`.
pub fn object_review(uid: &str, operation: &str, namespace: &str, object: Value) -> Value {
    let api_version = object["apiVersion"].as_str().unwrap_or("v1").to_owned();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let resource = format!("{}s", kind.to_lowercase());
    let kind_ref = json!({"group": group, "version": version, "kind": kind});
    let resource_ref = json!({"group": group, "version": version, "resource": resource});
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": kind_ref,
            "resource": resource_ref,
            "name": object["metadata"]["name"],
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object,
        },
    })
}

/// An AdmissionReview asking about `operation` on the Pod `web` in `namespace` by user `alice`,
/// whose `spec` is `pod_spec`.
pub fn pod_review_with(uid: &str, operation: &str, namespace: &str, pod_spec: Value) -> Value {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": pod_spec,
    });
    object_review(uid, operation, namespace, pod)
}

/// The Pod `name` with `spec`, as a client creates it (no namespace: the request's).
pub fn pod_object(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// The Pod `name` with one container per image (see [`containers`]).
pub fn pod_object_with_images(name: &str, images: &[&str]) -> Value {
    pod_object(name, json!({"containers": containers(images)}))
}

/// The one-replica Deployment `name` (label `app: <name>`) whose Pods have `pod_spec`.
pub fn deployment_object(name: &str, pod_spec: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": pod_spec,
            },
        },
    })
}

/// A Pod CREATE review in namespace `default` with one container per image.
pub fn pod_review(uid: &str, images: &[&str]) -> Value {
    pod_review_with(
        uid,
        "CREATE",
        "default",
        json!({"containers": containers(images)}),
    )
}

/// The object of a convert-proof case (`fixtures/legacy/cases.json`) running `image`: a Pod, a
/// Deployment whose template runs it, a Tekton PipelineRun whose `pipelineRef` names it as its
/// bundle (the case's `ref` instead, when it has one: a reference without a bundle), or a
/// TaskRun whose one step runs it.
pub fn legacy_case_object(case: &Value, image: &str) -> Value {
    let name = case["name"].as_str().unwrap_or_default();
    let metadata = json!({"name": name, "namespace": case["namespace"], "labels": {"app": name}});
    let spec = json!({"containers": [{"name": "app", "image": image}]});
    match case["kind"].as_str().unwrap_or("Pod") {
        "Deployment" => json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata,
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
            },
        }),
        "PipelineRun" => {
            let reference = match case.get("ref") {
                Some(reference) => reference.clone(),
                None => json!({"name": "build", "bundle": image}),
            };
            json!({"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": metadata,
                "spec": {"pipelineRef": reference}})
        }
        "TaskRun" => json!({"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": metadata,
            "spec": {"taskSpec": {"steps": [{"name": "build", "image": image}]}}}),
        _ => json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}),
    }
}

/// The image a convert-proof case's object runs (after a mutating webhook's patch): where
/// [`legacy_case_object`] put it.
pub fn legacy_case_image(object: &Value) -> String {
    let image = match object["kind"].as_str() {
        Some("Deployment") => &object["spec"]["template"]["spec"]["containers"][0]["image"],
        Some("PipelineRun") => &object["spec"]["pipelineRef"]["bundle"],
        Some("TaskRun") => &object["spec"]["taskSpec"]["steps"][0]["image"],
        _ => &object["spec"]["containers"][0]["image"],
    };
    image.as_str().unwrap_or_default().to_owned()
}

/// The AdmissionReview of a CREATE of `object` in its namespace by `user`, with every field the
/// API server sends (`requestKind`, `userInfo.groups`, `options`…): what the convert proof sent
/// Kyverno and ivory.
pub fn create_review(uid: &str, object: &Value, user: &str) -> Value {
    let mut review = object_review(uid, "CREATE", "", object.clone());
    let request = &mut review["request"];
    request["namespace"] = object["metadata"]["namespace"].clone();
    request["requestKind"] = request["kind"].clone();
    request["requestResource"] = request["resource"].clone();
    request["userInfo"] = json!({"username": user, "groups": ["system:authenticated"]});
    request["oldObject"] = Value::Null;
    request["dryRun"] = json!(false);
    request["options"] = json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"});
    review
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_review_names_its_uid_and_images() {
        let review = pod_review("u1", &["a:1", "b:2"]);
        let request = &review["request"];
        assert_eq!(request["uid"], "u1");
        assert_eq!(request["operation"], "CREATE");
        assert_eq!(request["namespace"], "default");
        assert_eq!(request["object"]["metadata"]["namespace"], "default");
        let containers = &request["object"]["spec"]["containers"];
        assert_eq!(containers[0], json!({"name": "c0", "image": "a:1"}));
        assert_eq!(containers[1], json!({"name": "c1", "image": "b:2"}));
        assert_eq!(
            request["kind"],
            json!({"group": "", "version": "v1", "kind": "Pod"})
        );
        assert_eq!(request["resource"]["resource"], "pods");
        assert_eq!(request["name"], "web");
    }

    #[test]
    fn a_pod_object_has_one_container_per_image() {
        let pod = pod_object_with_images("p", &["a:1", "b:2"]);
        assert_eq!(pod["metadata"]["name"], "p");
        assert_eq!(
            pod["spec"]["containers"][1],
            json!({"name": "c1", "image": "b:2"})
        );
    }

    #[test]
    fn a_deployment_review_names_its_group_and_resource() {
        let review = object_review("u2", "UPDATE", "ns", deployment_object("d", json!({})));
        let request = &review["request"];
        assert_eq!(
            request["kind"],
            json!({"group": "apps", "version": "v1", "kind": "Deployment"})
        );
        assert_eq!(
            request["resource"],
            json!({"group": "apps", "version": "v1", "resource": "deployments"})
        );
        assert_eq!(request["name"], "d");
        assert_eq!(request["operation"], "UPDATE");
        assert_eq!(request["namespace"], "ns");
    }
}
