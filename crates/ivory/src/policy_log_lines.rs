//! The lines the server writes through `json_members` (policy results, admissions), read back
//! from this binary's log format: each a JSON object with each field once.

use crate::json_log::tests::{Captured, fast_subscriber};

/// The policy-result lines' fields are written by the server and put in the line as they
/// are: a JSON object with each field once (the result's message as `policy_message`).
#[test]
fn policy_result_lines_carry_their_fields_once_each() {
    use ivory_engine::decision::{PolicyResult, Status};
    use ivory_server::policy_results::{Cause, log_results};
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-\"1\"", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "web", "namespace": "team", "operation": "CREATE",
            "object": {"metadata": {"name": "web"}}
        }
    });
    let req = ivory_engine::admission::AdmissionReview::parse(review.to_string().as_bytes())
        .unwrap()
        .request;
    let result = |policy: &str, properties: &[(&str, &str)], images: &[&str]| PolicyResult {
        policy: policy.into(),
        namespace: Some("team".into()),
        status: Status::Fail,
        message: "image \"x\" is\nunsigned".into(),
        properties: properties
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        images: images.iter().map(|i| (*i).to_owned()).collect(),
        deny: true,
        warn: false,
        audit: false,
    };
    let results = [
        result(
            "signed",
            &[("a", "1"), ("b", "x=y")],
            &["ghcr.io/a:1", "ghcr.io/b@sha256:00"],
        ),
        result("none", &[], &[]),
    ];
    let fast = Captured::default();
    tracing::subscriber::with_default(fast_subscriber(&fast), || {
        log_results(&req, &results, Cause::Admission);
    });
    let lines = fast.lines();
    assert_eq!(lines.len(), 2);
    let fields = &lines[0]["fields"];
    assert_eq!(
        fields,
        &serde_json::json!({
            "message": "policy result", "cause": "admission_request", "uid": "u-\"1\"",
            "kind": "Pod", "namespace": "team", "name": "web", "operation": "CREATE",
            "policy": "signed", "policy_namespace": "team", "result": "fail",
            "policy_message": "image \"x\" is\nunsigned", "properties": "a=1,b=x=y",
            "images": "ghcr.io/a:1,ghcr.io/b@sha256:00",
        })
    );
    assert_eq!(lines[0]["target"], "ivory::audit");
    assert_eq!(lines[1]["fields"]["properties"], "");
    assert_eq!(lines[1]["fields"]["images"], "");
    let text = String::from_utf8(fast.0.lock().unwrap().clone()).unwrap();
    for line in text.lines() {
        assert_eq!(line.matches("\"message\":").count(), 1, "{line}");
        // The message first, as a format string's message was written.
        assert!(
            line.contains(r#""fields":{"message":"policy result","cause":"admission_request","#),
            "{line}"
        );
    }
    // The text format shows it as the line's message, not as a field.
    let plain = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(plain.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        log_results(&req, &results[..1], Cause::Admission);
    });
    let text = String::from_utf8(plain.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("ivory::audit: policy result json_members="),
        "{text}"
    );
}
