//! `ivory serve` as a process: requests ivory cannot judge are refused with a clear error,
//! never allowed by accident (paths naming no policy, objects of the wrong shape, absurd
//! timeouts), namespaceSelectors are not silently skipped, and a namespaced policy cannot
//! borrow Secrets outside its namespace. Against the real registry (ivory-testkit).

use ivory_testkit::{Harness, RegistryHarness};
use serde_json::{Value, json};

use crate::util::{Ivory, pod_review, policy};
use ivory_testkit::fixtures_dir;

/// A digest-pinning policy for `glob` applying only in namespaces labelled `tier: prod`.
fn prod_pin_policy(glob: &str) -> String {
    policy(
        "prod-pin",
        glob,
        "  attestors: []\n  validations:\n    - expression: \"true\"\n",
    )
    .replace(
        "  matchConstraints:\n",
        "  matchConstraints:\n    namespaceSelector:\n      matchLabels: {tier: prod}\n",
    )
}

/// Starts the real registry with the unsigned fixture pushed, and `ivory serve` over
/// `policies` (file name, text) trusting it. Returns ivory, the image and the harness.
async fn serve_with(policies: &[(&str, String)]) -> (Ivory, String, Harness, tempfile::TempDir) {
    let h = RegistryHarness::start_default().await.unwrap();
    let tags = h
        .push_oci_layout(&fixtures_dir().join("oci/ivory/unsigned"), "ivory/unsigned")
        .await
        .unwrap();
    assert!(tags.contains_key("v1"));
    let image = format!("{}/ivory/unsigned:v1", h.host());
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("policies");
    std::fs::create_dir(&folder).unwrap();
    for (file, text) in policies {
        std::fs::write(folder.join(file), text).unwrap();
    }
    std::fs::write(dir.path().join("registry-ca.pem"), h.ca_pem()).unwrap();
    let ivory = Ivory::start_with_policies(dir.path(), &folder).await;
    (ivory, image, h, dir)
}

fn in_namespace(uid: &str, image: &str, namespace: &str) -> Value {
    let mut review = pod_review(uid, &[image]);
    review["request"]["namespace"] = json!(namespace);
    review["request"]["object"]["metadata"]["namespace"] = json!(namespace);
    review
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_mode_trusts_the_webhooks_namespace_selector() {
    let glob = "127.0.0.1*/*".to_owned();
    let (ivory, image, _h, _dir) = serve_with(&[("prod.yaml", prod_pin_policy(&glob))]).await;
    // The API server calls /ivpol/mutate/prod-pin only for namespaces its webhook's selector
    // (tier: prod) matches; ivory cannot see the labels in file mode and must not skip.
    let resp = ivory
        .review(
            "/ivpol/mutate/prod-pin",
            &in_namespace("ns-1", &image, "payments"),
        )
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert_eq!(resp["patchType"], "JSONPatch", "{resp}\n{}", ivory.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_reviews_paths_and_timeouts_get_clear_answers() {
    let pin = policy(
        "pin",
        "127.0.0.1*/*",
        "  attestors: []\n  validations:\n    - expression: \"true\"\n",
    );
    let (ivory, image, _h, _dir) = serve_with(&[("pin.yaml", pin)]).await;
    let review = pod_review("m", &[&image]);

    for path in [
        "/ivpol/validate//",
        "/ivpol/validate/%2F",
        "/ivpol/mutate/%2F%2F",
    ] {
        let (status, text) = ivory.post(path, review.to_string()).await;
        assert_eq!(status, 400, "{path}: {text}");
        assert!(text.contains("names no policy"), "{path}: {text}");
    }

    let cases = [
        (
            "/object",
            json!("pod"),
            "request.object must be an object, found a string",
        ),
        (
            "/object/spec",
            json!(["x"]),
            "request.object.spec must be an object, found a list",
        ),
        (
            "/object/spec/containers",
            json!({"c0": {"image": image}}),
            "request.object.spec.containers must be a list, found an object",
        ),
        (
            "/object/spec/containers/0/image",
            json!(7),
            "request.object.spec.containers[0].image must be a string, found a number",
        ),
    ];
    for (pointer, value, expected) in cases {
        let mut bad = review.clone();
        *bad["request"].pointer_mut(pointer).unwrap() = value;
        for path in ["/ivpol/validate/pin", "/ivpol/mutate/pin"] {
            let (status, text) = ivory.post(path, bad.to_string()).await;
            assert_eq!(status, 400, "{path} {pointer}: {text}");
            assert!(text.contains(expected), "{path} {pointer}: {text}");
        }
    }

    // A timeout past any Duration arithmetic is answered (a panic in the handler would drop the
    // connection), and the server keeps serving.
    for query in [
        "timeout=10000000000000000000s",
        "timeout=99999999999999999999999999h",
    ] {
        let resp = ivory
            .review(&format!("/ivpol/mutate/pin?{query}"), &review)
            .await;
        assert_eq!(resp["patchType"], "JSONPatch", "{query}: {resp}");
    }
    let metrics = ivory.metrics().await;
    // Counted from zero per route: every series still reads 0.
    let panics: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("ivory_admission_panics_total{"))
        .collect();
    assert!(
        !panics.is_empty() && panics.iter().all(|l| l.ends_with(" 0")),
        "no panic expected: {metrics}"
    );
    assert!(
        metrics.contains(r#"ivory_admission_duration_seconds_count{route="ivpol_validate",outcome="bad_request"} "#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_policy_naming_another_namespaces_secret_does_not_load() {
    let text = policy(
        "borrow",
        "*",
        "  attestors: []\n  credentials:\n    secrets: [team-pull, ivory-system/ivory-pull]\n  validations:\n    - expression: \"true\"\n",
    )
    .replace(
        "kind: ImageValidatingPolicy\nmetadata:\n  name: borrow",
        "kind: NamespacedImageValidatingPolicy\nmetadata:\n  name: borrow\n  namespace: team",
    );
    assert!(text.contains("namespace: team"), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("borrow.yaml");
    std::fs::write(&file, text).unwrap();
    let ivory = Ivory::start_policies(dir.path(), &file).await;
    let (status, text) = ivory.get("/readyz").await;
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains(
            "spec.credentials.secrets[1]: Invalid value: \"ivory-system/ivory-pull\": a \
             NamespacedImageValidatingPolicy may only use Secrets of its own namespace \"team\""
        ),
        "{text}"
    );
}
