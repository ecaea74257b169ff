//! `ivory serve` against the real registry: every image of a pod is judged, whatever its
//! spelling and wherever it sits (containers, `kubectl debug` containers, image volumes), and
//! an image the mutating stage cannot parse is a policy error.

use base64::Engine as _;
use ivory_testkit::review::{self, pod_review_with};
use ivory_testkit::{Harness, RegistryHarness};
use serde_json::{Value, json};

use crate::util::{Ivory, key_attestor, policies_dir, policy};

/// Pushes fixture `layout`: (its repository `ivory/<layout>`, without the host; its digest).
async fn push(h: &Harness, layout: &str) -> (String, String) {
    let (_, digest) = h.push_fixture(layout).await.unwrap();
    (format!("ivory/{layout}"), digest)
}

/// Verifies every image a pod runs, as the shipped samples do.
const VERIFY_EVERY_IMAGE: &str = "  validations:
    - expression: >-
        (images.containers + images.initContainers + images.ephemeralContainers
          + images.imageVolumes).map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)
      message: failed the image Signature verification
";

/// A Pod review: `containers`, `ephemeral` containers and image `volumes`.
fn review(
    uid: &str,
    operation: &str,
    containers: &[&str],
    ephemeral: &[&str],
    volumes: &[&str],
) -> Value {
    let volumes: Vec<Value> = volumes
        .iter()
        .enumerate()
        .map(|(i, image)| json!({"name": format!("v{i}"), "image": {"reference": image}}))
        .collect();
    pod_review_with(
        uid,
        operation,
        "default",
        json!({
            "containers": review::containers(containers),
            "ephemeralContainers": review::containers(ephemeral),
            "volumes": volumes,
        }),
    )
}

/// `kubectl debug`: an UPDATE of the `pods/ephemeralcontainers` subresource.
fn debug_review(uid: &str, containers: &[&str], ephemeral: &[&str]) -> Value {
    let mut r = review(uid, "UPDATE", containers, ephemeral, &[]);
    r["request"]["subResource"] = json!("ephemeralcontainers");
    r["request"]["oldObject"] = r["request"]["object"].clone();
    r["request"]["oldObject"]["spec"]["ephemeralContainers"] = json!([]);
    r
}

fn patch_of(resp: &Value) -> Value {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap_or_default())
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_image_of_a_pod_is_judged_whatever_its_spelling() {
    let h = RegistryHarness::start_default().await.unwrap();
    let (signed_repo, signed_digest) = push(&h, "sig-p256").await;
    let (unsigned_repo, unsigned_digest) = push(&h, "unsigned").await;
    let host = h.host().to_owned();
    let port = host.rsplit(':').next().unwrap().to_owned();
    // The same registry, spelled with a leading zero in the port: the kubelet pulls it alike.
    let other_spelling = format!("127.0.0.1:0{port}");
    let signed = format!("{host}/{signed_repo}:v1");
    let unsigned = format!("{host}/{unsigned_repo}:v1");

    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let glob = format!("{host}/*");
    let pin = "  attestors: []\n  validations:\n    - expression: \"true\"\n";
    std::fs::write(policies.join("pin.yaml"), policy("pin", &glob, pin)).unwrap();
    // The rule names only `pods`: ivory still sees `kubectl debug`.
    let verify = format!(
        "  validationConfigurations:\n    mutateDigest: false\n    verifyDigest: false\n{}{VERIFY_EVERY_IMAGE}",
        key_attestor()
    );
    std::fs::write(
        policies.join("verify.yaml"),
        policy("require-signed", &glob, &verify),
    )
    .unwrap();
    std::fs::write(dir.path().join("registry-ca.pem"), h.ca_pem()).unwrap();
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;
    let denied = "Policy require-signed failed: failed the image Signature verification";
    let validate = "/ivpol/validate/require-signed";

    // 1. Spelling: a digest reference skips pinning, and the glob names the canonical host.
    for (uid, image, allowed) in [
        (
            "s-1",
            format!("{other_spelling}/{unsigned_repo}@{unsigned_digest}"),
            false,
        ),
        (
            "s-2",
            format!("{other_spelling}/{signed_repo}@{signed_digest}"),
            true,
        ),
    ] {
        let resp = ivory
            .review(validate, &review(uid, "CREATE", &[&image], &[], &[]))
            .await;
        assert_eq!(
            resp["allowed"],
            allowed,
            "{image}: {resp}\n{}",
            ivory.logs()
        );
        if !allowed {
            assert_eq!(resp["status"]["message"], denied, "{resp}");
        }
    }
    let resp = ivory
        .review(
            "/ivpol/mutate/pin",
            &review(
                "s-3",
                "CREATE",
                &[&format!("{other_spelling}/{signed_repo}:v1")],
                &[],
                &[],
            ),
        )
        .await;
    assert_eq!(
        patch_of(&resp),
        json!([{"op": "replace", "path": "/spec/containers/0/image",
                "value": format!("{other_spelling}/{signed_repo}:v1@{signed_digest}")}]),
        "{resp}"
    );

    // 2. kubectl debug with an unsigned image is denied; the debug container alone is pinned.
    let resp = ivory
        .review(validate, &debug_review("e-1", &[&signed], &[&unsigned]))
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["message"], denied, "{resp}");
    let resp = ivory
        .review(validate, &debug_review("e-2", &[&signed], &[&signed]))
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let resp = ivory
        .review(
            "/ivpol/mutate/pin",
            &debug_review("e-3", &[&signed], &[&signed]),
        )
        .await;
    assert_eq!(
        patch_of(&resp),
        json!([{"op": "replace", "path": "/spec/ephemeralContainers/0/image",
                "value": format!("{signed}@{signed_digest}")}]),
        "{resp}"
    );

    // 3. Image volumes: pinned on CREATE, verified like containers.
    let resp = ivory
        .review(
            "/ivpol/mutate/pin",
            &review("v-1", "CREATE", &[], &[], &[&signed]),
        )
        .await;
    assert_eq!(
        patch_of(&resp),
        json!([{"op": "replace", "path": "/spec/volumes/0/image/reference",
                "value": format!("{signed}@{signed_digest}")}]),
        "{resp}"
    );
    let resp = ivory
        .review(
            validate,
            &review("v-2", "CREATE", &[&signed], &[], &[&unsigned]),
        )
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["message"], denied, "{resp}");
    let resp = ivory
        .review(
            validate,
            &review("v-3", "CREATE", &[&signed], &[], &[&signed]),
        )
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");

    // 4. An image the mutating stage cannot parse is a policy error, not a silent allow.
    let bad = format!("{host}/ivory/Unsigned:v1");
    let resp = ivory
        .review(
            "/ivpol/mutate/pin",
            &review("m-1", "CREATE", &[&signed, &bad], &[], &[]),
        )
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(
        resp["status"]["message"],
        format!(
            "Policy pin error: failed to update digest: invalid image '{bad}' (repository can \
             only contain the characters `abcdefghijklmnopqrstuvwxyz0123456789_-./`: ivory/Unsigned)"
        ),
        "{resp}"
    );
    assert!(resp.get("patch").is_none(), "{resp}");
}
