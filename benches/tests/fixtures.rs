//! The harness's AdmissionReview and policy are what ivory's own loaders accept.

use ivory_bench::policy::key_policy;
use ivory_bench::review::pod_review;
use ivory_engine::admission::AdmissionReview;
use ivory_engine::images::image_pointers;

const KEY: &str = include_str!("../../fixtures/keys/cosign-p256.pub");

#[test]
fn review_is_a_three_container_pod_create() {
    let images: Vec<String> = (0..3).map(|i| format!("r.example/app{i}:v1")).collect();
    let review = AdmissionReview::parse(&pod_review("u-1", &images)).unwrap();
    assert_eq!(review.request.uid, "u-1");
    assert_eq!(review.request.namespace, "shop");
    let object = review.request.object.unwrap();
    let found: Vec<String> = image_pointers(&object, "Pod")
        .into_iter()
        .map(|p| p.image)
        .collect();
    assert_eq!(found, images);
}

#[test]
fn key_policy_loads_and_compiles() {
    let report = ivory_policy::load_str(&key_policy("bench", "r.example/*", KEY), "bench.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.policies.len(), 1);
    assert_eq!(report.policies[0].name, "bench");
}
