//! Registry answers: image manifests, indexes and manifest lists as the registry client reads
//! them (mode byte even), and OCI referrers responses as oci-client decodes them (odd).
//!
//! Checked properties: an accepted manifest has one of the accepted media types, keeps the
//! exact bytes served (what signatures cover), and is an index exactly when it lists
//! manifests; the annotations of every layer can be read as cosign's.
#![no_main]

use ivory_registry::{ACCEPTED_MEDIA_TYPES, Manifest};
use ivory_verify::Legacy;
use libfuzzer_sys::fuzz_target;
use oci_client::manifest::OciImageIndex;
use serde_json::Value;

const DIGEST: &str = "sha256:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501";

fn manifest(body: &[u8]) {
    let Ok(m) = Manifest::from_served("r.example/x:1", "r.example", DIGEST.into(), body.to_vec())
    else {
        return;
    };
    assert!(ACCEPTED_MEDIA_TYPES.contains(&m.media_type.as_str()));
    assert_eq!(m.bytes, body, "manifest bytes differ from the bytes served");
    assert_eq!(
        m.is_index(),
        m.json.get("manifests").is_some(),
        "index shape mismatch"
    );
    let listed = m.json.get("manifests").and_then(Value::as_array);
    let children = m.children();
    assert!(
        children.len() <= listed.map_or(0, Vec::len),
        "more children than entries"
    );
    for (digest, _platform) in &children {
        assert!(
            listed.is_some_and(|l| l.iter().any(|e| e["digest"] == *digest.as_str())),
            "child {digest} is not listed"
        );
    }
    if let Some(layers) = m.json.get("layers").and_then(Value::as_array) {
        for layer in layers {
            let _ = Legacy::from_annotations(
                Vec::new(),
                layer.get("annotations").and_then(Value::as_object),
            );
        }
    }
}

fn referrers(body: &[u8]) {
    let Ok(index) = serde_json::from_slice::<OciImageIndex>(body) else {
        return;
    };
    let value = serde_json::to_value(&index).expect("a decoded index serializes");
    if let Some(entries) = value.get("manifests").and_then(Value::as_array) {
        for entry in entries {
            let _ = entry.get("artifactType").and_then(Value::as_str);
            let _ = entry.get("digest").and_then(Value::as_str);
        }
    }
    let _ = Manifest::from_served(
        "r.example/x@sha256:0",
        "r.example",
        DIGEST.into(),
        value.to_string().into_bytes(),
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        manifest(body);
    } else {
        referrers(body);
    }
});
