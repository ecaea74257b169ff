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

/// An AdmissionReview asking about `operation` on the Pod `web` in `namespace` by user `alice`,
/// whose `spec` is `pod_spec`.
pub fn pod_review_with(uid: &str, operation: &str, namespace: &str, pod_spec: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "web",
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "web", "namespace": namespace},
                "spec": pod_spec,
            },
        },
    })
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
    }
}
