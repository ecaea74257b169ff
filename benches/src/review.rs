//! A realistic AdmissionReview: a Pod CREATE with three containers (ports, env, resources,
//! probes, volume mounts), labels, an owner reference and a service-account user, ~4 KiB.

use ivory_testkit::review::pod_review_with;
use serde_json::{Value, json};

/// The AdmissionReview JSON for a Pod running `images` (one container each).
pub fn pod_review(uid: &str, images: &[String]) -> Vec<u8> {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, image)| container(i, image))
        .collect();
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-7d9f8b6c5-",
            "namespace": "shop",
            "labels": {"app": "web", "tier": "frontend", "pod-template-hash": "7d9f8b6c5"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8b6c5",
                "uid": "6b1f9f0e-3c1a-4a53-9d0e-8d7b8f1c2a11", "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "serviceAccountName": "web",
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": containers,
            "volumes": [
                {"name": "config", "configMap": {"name": "web-config"}},
                {"name": "cache", "emptyDir": {"sizeLimit": "256Mi"}},
            ],
        },
    });
    // ivory-testkit's Pod review, with what a controller's request carries besides.
    let mut review = pod_review_with(uid, "CREATE", "shop", Value::Null);
    let request = &mut review["request"];
    request["object"] = pod;
    if let Some(fields) = request.as_object_mut() {
        fields.remove("name");
    }
    request["requestKind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    request["requestResource"] = json!({"group": "", "version": "v1", "resource": "pods"});
    request["userInfo"] = json!({
        "username": "system:serviceaccount:kube-system:replicaset-controller",
        "uid": "0d5c3b8e-6f2a-4c1e-9a7b-2e4f6d8c0a13",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
    });
    request["oldObject"] = Value::Null;
    request["dryRun"] = json!(false);
    request["options"] = json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"});
    review.to_string().into_bytes()
}

fn container(i: usize, image: &str) -> Value {
    json!({
        "name": format!("c{i}"),
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": 8080 + i, "protocol": "TCP"}],
        "env": [
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        },
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080 + i}, "periodSeconds": 5},
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/web", "readOnly": true},
            {"name": "cache", "mountPath": "/var/cache/web"},
        ],
        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true},
    })
}
