//! `ivory serve` against costly CEL: an expression whose worst case is a cross product of
//! request lists is refused when the policy loads; one that passes that check but is costly on
//! a given request is stopped by the run-time cost limit, answered per failurePolicy, while
//! other requests are answered meanwhile.

use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Ivory, pod_review, policies_dir, policy};
use ivory_testkit::eventually;

/// No verification: the policies exercise CEL alone.
const NO_VERIFICATION: &str = "  attestors: []
  validationConfigurations:
    mutateDigest: false
    verifyDigest: false
    required: false
";

/// One pass over the items of an annotation: statically accepted (one pass over a request
/// list), costly when the annotation holds hundreds of thousands of items.
const PASS_OVER_ANNOTATION: &str = "  validations:
    - expression: \"object.metadata.annotations['list'].split(',').all(a, a != 'forbidden')\"
";

const CROSS_PRODUCT: &str = "object.spec.containers.all(a, object.spec.containers.all(b, object.spec.containers.all(c, a.name != b.name || b.name != c.name)))";

fn costly_policy(name: &str, failure: &str) -> String {
    policy(
        name,
        "*",
        &format!("  failurePolicy: {failure}\n{NO_VERIFICATION}{PASS_OVER_ANNOTATION}"),
    )
}

/// A Pod review whose annotation `list` holds `items` comma-separated items.
fn review_with_list(uid: &str, items: usize) -> Value {
    let mut review = pod_review(uid, &["registry.example/app:v1"]);
    review["request"]["object"]["metadata"]["annotations"] =
        json!({ "list": vec!["a"; items].join(",") });
    review
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costly_cel_is_stopped_per_failure_policy_and_other_requests_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    for (name, failure) in [("costly-fail", "Fail"), ("costly-ignore", "Ignore")] {
        std::fs::write(
            policies.join(format!("{name}.yaml")),
            costly_policy(name, failure),
        )
        .unwrap();
    }
    let ivory = Ivory::start_policies(dir.path(), &policies).await;
    assert_eq!(ivory.get("/readyz").await.0, 200, "{}", ivory.logs());

    // Small lists pass: the policies are enforced, not broken.
    for route in ["costly-fail", "costly-ignore"] {
        let resp = ivory
            .review(
                &format!("/ivpol/validate/{route}?timeout=10s"),
                &review_with_list(route, 10),
            )
            .await;
        assert_eq!(resp["allowed"], true, "{resp}");
        assert!(resp.get("warnings").is_none_or(Value::is_null), "{resp}");
    }

    let big = |uid: &str| review_with_list(uid, 400_000);
    let (fail_review, ignore_review) = (big("big-fail"), big("big-ignore"));
    let cheap = review_with_list("cheap", 3);
    let timed = |path: &'static str, review: &Value| {
        let ivory = &ivory;
        let review = review.clone();
        async move {
            let started = ivory_clock::now();
            let resp = ivory.review(path, &review).await;
            (resp, started.elapsed())
        }
    };
    let cheap_requests = async {
        // Sent while the costly evaluations run.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut answers = Vec::new();
        for _ in 0..3 {
            answers.push(
                timed("/ivpol/validate/costly-fail?timeout=10s", &cheap)
                    .await
                    .0,
            );
        }
        answers
    };
    let ((fail, fail_elapsed), (ignore, ignore_elapsed), cheap_answers) = tokio::join!(
        timed("/ivpol/validate/costly-fail?timeout=10s", &fail_review),
        timed("/ivpol/validate/costly-ignore?timeout=10s", &ignore_review),
        cheap_requests,
    );
    let budget = "CEL cost budget exceeded";
    assert_eq!(fail["allowed"], false, "{fail}");
    let message = fail["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("Policy costly-fail error"), "{message}");
    assert!(message.contains(budget), "{message}");
    assert!(
        message.contains("split(',')"),
        "names the expression: {message}"
    );

    assert_eq!(ignore["allowed"], true, "{ignore}");
    let warnings = ignore["warnings"].to_string();
    assert!(warnings.contains(budget), "{ignore}");

    for resp in &cheap_answers {
        assert_eq!(resp["allowed"], true, "{resp}");
    }
    // Inside the webhook's own budget: the evaluations were stopped, not run to completion.
    for elapsed in [fail_elapsed, ignore_elapsed] {
        assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_costly_expression_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cross.yaml");
    let body = format!("{NO_VERIFICATION}  validations:\n    - expression: \"{CROSS_PRODUCT}\"\n");
    std::fs::write(&file, policy("cross", "*", &body)).unwrap();
    let ivory = Ivory::start_policies(dir.path(), &file).await;
    let (status, text) = ivory.get("/readyz").await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("cross.yaml"), "{text}");
    assert!(
        text.contains("spec.validations[0].expression: policy \"cross\""),
        "{text}"
    );
    assert!(text.contains("too costly"), "{text}");
    assert!(text.contains(CROSS_PRODUCT), "{text}");

    // The same policy without the cross product loads.
    let fixed = format!("{NO_VERIFICATION}{PASS_OVER_ANNOTATION}");
    std::fs::write(&file, policy("cross", "*", &fixed)).unwrap();
    let ready = eventually("/readyz to be ready", Duration::from_secs(10), || async {
        ivory.get("/readyz").await.0 == 200
    })
    .await
    .is_ok();
    assert!(ready, "{}", ivory.logs());
}
