//! Kyverno's published image-verification bypasses, replayed against `ivory serve` and the real
//! registry: each must fail here (docs/SECURITY.md lists them with these tests).
//!
//! * forgeable outcome annotations (Kyverno #16336): an annotation is never evidence;
//! * container order (Kyverno #6115): an unsigned image is denied wherever it stands;
//! * a cached verification skipping a deny (Kyverno #17173): the cache holds signature
//!   verdicts only, every CEL validation runs on every admission.

use ivory_testkit::{Harness, RegistryHarness};
use serde_json::{Value, json};

use crate::util::{Ivory, VERIFY_SIGNED, assert_denied, key_attestor, pod_review, policy};

/// Pushes fixture `layout`; returns `HOST/ivory/<layout>@<digest>`.
async fn push(h: &Harness, layout: &str) -> String {
    let (image, digest) = h.push_fixture(layout).await.unwrap();
    format!("{}@{digest}", image.trim_end_matches(":v1"))
}

/// A running `ivory serve` with `policies` (file name, YAML), trusting the registry's CA.
async fn serve(h: &Harness, dir: &std::path::Path, policies: &[(&str, String)]) -> Ivory {
    let folder = dir.join("policies");
    std::fs::create_dir(&folder).unwrap();
    for (file, yaml) in policies {
        std::fs::write(folder.join(file), yaml).unwrap();
    }
    std::fs::write(dir.join("registry-ca.pem"), h.ca_pem()).unwrap();
    Ivory::start_with_policies(dir, &folder).await
}

fn require_signed(glob: &str, extra_validation: &str) -> String {
    policy(
        "require-signed",
        glob,
        &format!(
            "  failurePolicy: Fail\n{}{VERIFY_SIGNED}{extra_validation}",
            key_attestor()
        ),
    )
}

/// Every outcome annotation Kyverno or ivory ever wrote, claiming the images passed.
fn forged_annotations() -> Value {
    json!({
        "kyverno.io/verify-images": "{\"ghcr.io/x\":\"pass\"}",
        "policies.kyverno.io/verify-images": "pass",
        "ivory.dev/verified": "true",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_annotations_order_and_cached_verdicts_never_admit_an_unsigned_image() {
    let h = RegistryHarness::start_default().await.unwrap();
    let signed = push(&h, "sig-p256").await;
    let unsigned = push(&h, "unsigned").await;
    let dir = tempfile::tempdir().unwrap();
    let glob = format!("{}/*", h.host());
    // A second validation that reads the live object: a cached signature verdict must not skip it.
    let labelled = "    - expression: >-\n        has(object.metadata.labels) && 'team' in object.metadata.labels\n      message: pods need a team label\n";
    let ivory = serve(
        &h,
        dir.path(),
        &[("require-signed.yaml", require_signed(&glob, labelled))],
    )
    .await;
    let path = "/ivpol/validate/require-signed";
    let labelled_pod = |uid: &str, images: &[&str]| {
        let mut review = pod_review(uid, images);
        review["request"]["object"]["metadata"]["labels"] = json!({"team": "a"});
        review
    };

    // Forged annotations: the unsigned image is verified and denied all the same.
    let mut review = labelled_pod("forged", &[&unsigned]);
    review["request"]["object"]["metadata"]["annotations"] = forged_annotations();
    let resp = ivory.review(path, &review).await;
    assert_denied(&resp, "failed the image Signature verification");

    // Container order: the unsigned image is denied first, last, or between signed ones.
    for (uid, images) in [
        ("order-first", vec![&unsigned, &signed]),
        ("order-last", vec![&signed, &unsigned]),
        ("order-middle", vec![&signed, &unsigned, &signed]),
    ] {
        let images: Vec<&str> = images.into_iter().map(String::as_str).collect();
        let resp = ivory.review(path, &labelled_pod(uid, &images)).await;
        assert_eq!(resp["allowed"], false, "{uid}: {resp}");
    }

    // Cached verdicts: the signed image is admitted, its verdict is now cached, and the same
    // image in a Pod that breaks the other validation is still denied.
    let resp = ivory
        .review(path, &labelled_pod("cached-1", &[&signed]))
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let resp = ivory
        .review(path, &pod_review("cached-2", &[&signed]))
        .await;
    assert_denied(&resp, "pods need a team label");
    // The signed image was verified once (when first seen) and answered from the cache after.
    let metrics = ivory.metrics().await;
    let hits = metrics
        .lines()
        .find(|l| l.starts_with(r#"ivory_verify_cache_hits_total{cache="results"}"#))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(hits >= 1.0, "no cached verdict was used:\n{metrics}");
}
