//! AdmissionReview bodies as the API server (or anyone reaching the webhook port) sends them:
//! parsing, both image extractors, and the response built for the request.
//!
//! Checked properties: every JSON pointer the pinning extractor reports addresses the image it
//! reports, and for the built-in kinds the validating extractor (by GVR) and the pinning
//! extractor (by kind) see the same images, so no image is pinned without being verified.
//! Every response, with the request's own strings in its message, warnings and annotations,
//! is written by `ReviewResponse::to_json` exactly as serde_json writes it (no string of the
//! request can break out of its JSON string).
#![no_main]

use ivory_engine::admission::{
    AdmissionRequest, AdmissionReview, GroupVersionResource, ReviewResponse,
    response_from_decision,
};
use ivory_engine::decision::{Decision, PatchOp};
use ivory_engine::images::{IMAGE_FIELDS, builtin_images, image_pointers};
use libfuzzer_sys::fuzz_target;

/// The kind whose objects a built-in GVR serves (ReplicationController has no GVR extractor).
fn kind_of(gvr: &GroupVersionResource) -> Option<&'static str> {
    match (
        gvr.group.as_str(),
        gvr.version.as_str(),
        gvr.resource.as_str(),
    ) {
        ("", "v1", "pods") => Some("Pod"),
        ("apps", "v1", "deployments") => Some("Deployment"),
        ("apps", "v1", "statefulsets") => Some("StatefulSet"),
        ("apps", "v1", "daemonsets") => Some("DaemonSet"),
        ("apps", "v1", "replicasets") => Some("ReplicaSet"),
        ("batch", "v1", "jobs") => Some("Job"),
        ("batch", "v1", "cronjobs") => Some("CronJob"),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(review) = AdmissionReview::parse(data) else {
        return;
    };
    let req = &review.request;
    let images = builtin_images(req);
    let pointers = req
        .subject()
        .map(|object| image_pointers(object, &req.kind.kind))
        .unwrap_or_default();
    if let Some(object) = req.subject() {
        for found in &pointers {
            assert_eq!(
                object.value().pointer(&found.pointer).and_then(|v| v.as_str()),
                Some(found.image.as_str()),
                "pointer {} does not address the reported image",
                found.pointer
            );
        }
    }
    let gvr_kind = kind_of(req.original_resource()).or_else(|| kind_of(&req.resource));
    if gvr_kind.is_some_and(|k| k == req.kind.kind) {
        for field in IMAGE_FIELDS {
            let pinned: Vec<&str> = pointers
                .iter()
                .filter(|p| p.field == field)
                .map(|p| p.image.as_str())
                .collect();
            let validated: Vec<&str> = images
                .get(field)
                .map(|l| l.iter().map(String::as_str).collect())
                .unwrap_or_default();
            assert_eq!(pinned, validated, "extractors disagree on {field}");
        }
    }
    let _ = req.to_json();
    let all_images: Vec<String> = images.values().flatten().cloned().collect();
    let denied = Decision {
        allowed: false,
        message: Some(req.uid.clone()),
        warnings: all_images.clone(),
        audit_annotations: all_images
            .iter()
            .map(|image| (image.clone(), req.namespace.clone()))
            .collect(),
        ..Decision::default()
    };
    written_as_serde_writes(req, &denied);
    let pinned = Decision {
        allowed: true,
        patch: pointers
            .iter()
            .map(|p| PatchOp {
                path: p.pointer.clone(),
                value: p.image.clone(),
            })
            .collect(),
        ..Decision::default()
    };
    written_as_serde_writes(req, &pinned);
});

fn written_as_serde_writes(req: &AdmissionRequest, decision: &Decision) {
    let response = response_from_decision(req, decision);
    let review = ReviewResponse::new(&response);
    let written = review.to_json();
    assert_eq!(written, serde_json::to_string(&review).unwrap_or_default());
}
