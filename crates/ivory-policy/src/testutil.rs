//! Shared helpers for unit tests: a valid base policy and JSON-pointer patching.

use serde_json::{Value, json};

use crate::load::{LoadReport, load_str};

/// A real (generated) P-256 public key.
pub(crate) const PUBLIC_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEhbS8w3a/kQKdFKjMg4VPuaCXR1Zn\nL/Wxk7TEN31y0hO0B/FU0FEcNGwV1bdofn3IornpW18biLnjvzWDZH7sRA==\n-----END PUBLIC KEY-----\n";

/// A valid policy exercising most fields; tests patch it into invalid shapes.
pub(crate) fn base() -> Value {
    json!({
        "apiVersion": "policies.kyverno.io/v1",
        "kind": "ImageValidatingPolicy",
        "metadata": {"name": "base"},
        "spec": {
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["pods"]
                }]
            },
            "matchConditions": [{"name": "not-system", "expression": "request.namespace != 'kube-system'"}],
            "matchImageReferences": [{"glob": "ghcr.io/*"}],
            "variables": [
                {"name": "first", "expression": "object.metadata.name"},
                {"name": "second", "expression": "variables.first + '-x'"}
            ],
            "attestors": [{"name": "cosign", "cosign": {"key": {"data": PUBLIC_KEY}}}],
            "attestations": [{"name": "slsa", "intoto": {"type": "https://slsa.dev/provenance/v1"}}],
            "validations": [{
                "expression": "images.containers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0)",
                "message": "not signed"
            }]
        }
    })
}

/// Sets (`Some`) or removes (`None`) the value at a JSON pointer whose parent exists.
pub(crate) fn patch(doc: &mut Value, pointer: &str, value: Option<Value>) {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = doc
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no parent for {pointer}"));
    match (parent, value) {
        (Value::Object(map), Some(v)) => {
            map.insert(key.to_owned(), v);
        }
        (Value::Object(map), None) => {
            map.remove(key);
        }
        (Value::Array(items), Some(v)) => {
            let i: usize = key.parse().unwrap();
            if i == items.len() {
                items.push(v);
            } else {
                items[i] = v;
            }
        }
        (Value::Array(items), None) => {
            items.remove(key.parse::<usize>().unwrap());
        }
        _ => panic!("parent of {pointer} is not a container"),
    }
}

/// Loads `doc` as JSON text.
pub(crate) fn load(doc: &Value) -> LoadReport {
    load_str(&doc.to_string(), "t.json")
}

/// The `field: reason` of every error of loading the patched base policy.
pub(crate) fn errors_after(patches: &[(&str, Option<Value>)]) -> Vec<String> {
    let mut doc = base();
    for (pointer, value) in patches {
        patch(&mut doc, pointer, value.clone());
    }
    let report = load(&doc);
    report
        .errors
        .iter()
        .map(|e| {
            assert_eq!(e.location, "t.json (doc 1)");
            if e.field.is_empty() {
                e.reason.clone()
            } else {
                format!("{}: {}", e.field, e.reason)
            }
        })
        .collect()
}
