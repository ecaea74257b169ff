//! One admission pipeline behind every front end: a review whose object policies cannot read
//! gets the same refusal, naming the field, from `ivory apply` as from `ivory serve`'s
//! webhooks (the engine's `pipeline::Pipeline::judge` checks the shape for both).

use ivory_testkit::review::pod_review_with;
use serde_json::{Value, json};

use crate::cli_util::{ivory, write};
use crate::util::{Ivory, Tls, VERIFY_SIGNED, key_attestor, policy};

/// A Pod CREATE review whose first container's `image` is `image`.
fn review(image: Value) -> Value {
    pod_review_with(
        "shape-1",
        "CREATE",
        "default",
        json!({"containers": [{"name": "app", "image": image}]}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misshapen_review_is_refused_naming_the_field_by_apply_as_by_the_webhook() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "  validationActions: [Deny]\n{}{VERIFY_SIGNED}",
        key_attestor()
    );
    let policies = write(
        dir.path(),
        "check-images.yaml",
        &policy("check-images", "*", &body),
    );
    let field = "AdmissionReview request.object.spec.containers[0].image must be a string, \
                 found a list";
    let malformed = write(
        dir.path(),
        "review.json",
        &review(json!(["reg.example/app:1"])).to_string(),
    );

    let run = ivory([
        "apply",
        "--policy",
        policies.to_str().unwrap(),
        "--resource",
        malformed.to_str().unwrap(),
    ])
    .await;
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("resource Pod/default/web") && run.stderr.contains(field),
        "{}",
        run.stderr
    );
    assert!(run.stdout.is_empty(), "nothing judged: {}", run.stdout);

    let tls = Tls::write(dir.path(), "ivory pipeline test CA");
    let server = Ivory::start(&tls, &["--policies".into(), policies.display().to_string()]).await;
    for path in ["/ivpol/mutate/check-images", "/ivpol/validate/check-images"] {
        let (status, text) = server
            .post(path, review(json!(["reg.example/app:1"])).to_string())
            .await;
        assert_eq!(status, 400, "{path}: {text}");
        assert_eq!(text, format!("ivory: {field}"), "{path}");
    }
}
