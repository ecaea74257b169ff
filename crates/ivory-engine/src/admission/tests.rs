use base64::Engine as _;
use ivory_testkit::cases::Failures;
use serde_json::json;

use super::testutil::{fixture_path, request, sent};
use super::*;
use crate::decision::{Decision, PatchOp};

/// A fixture review and what it asks: (file, operation, kind, resource, subResource,
/// namespace, has object, has oldObject).
type FixtureCase = (
    &'static str,
    Operation,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    bool,
);

/// Every fixture review and what it asks.
fn fixture_cases() -> Vec<FixtureCase> {
    vec![
        (
            "pod-create.json",
            Operation::Create,
            "Pod",
            "pods",
            "",
            "default",
            true,
            false,
        ),
        (
            "pod-update.json",
            Operation::Update,
            "Pod",
            "pods",
            "",
            "default",
            true,
            true,
        ),
        (
            "pod-delete.json",
            Operation::Delete,
            "Pod",
            "pods",
            "",
            "default",
            false,
            true,
        ),
        (
            "pod-ephemeralcontainers.json",
            Operation::Update,
            "Pod",
            "pods",
            "ephemeralcontainers",
            "default",
            true,
            true,
        ),
        (
            "deployment-create.json",
            Operation::Create,
            "Deployment",
            "deployments",
            "",
            "apps",
            true,
            false,
        ),
        (
            "statefulset-create.json",
            Operation::Create,
            "StatefulSet",
            "statefulsets",
            "",
            "apps",
            true,
            false,
        ),
        (
            "daemonset-create.json",
            Operation::Create,
            "DaemonSet",
            "daemonsets",
            "",
            "apps",
            true,
            false,
        ),
        (
            "replicaset-create.json",
            Operation::Create,
            "ReplicaSet",
            "replicasets",
            "",
            "apps",
            true,
            false,
        ),
        (
            "job-create.json",
            Operation::Create,
            "Job",
            "jobs",
            "",
            "apps",
            true,
            false,
        ),
        (
            "cronjob-create.json",
            Operation::Create,
            "CronJob",
            "cronjobs",
            "",
            "apps",
            true,
            false,
        ),
        (
            "replicationcontroller-create.json",
            Operation::Create,
            "ReplicationController",
            "replicationcontrollers",
            "",
            "apps",
            true,
            false,
        ),
        (
            "namespace-create.json",
            Operation::Create,
            "Namespace",
            "namespaces",
            "",
            "team-a",
            true,
            false,
        ),
        (
            "configmap-create.json",
            Operation::Create,
            "ConfigMap",
            "configmaps",
            "",
            "default",
            true,
            false,
        ),
    ]
}

#[test]
fn parses_every_fixture() {
    let mut failures = Failures::new();
    for (file, op, kind, resource, sub, ns, has_object, has_old) in fixture_cases() {
        let req = request(file);
        failures.check_eq(file, "operation", req.operation, op);
        failures.check_eq(file, "kind", req.kind.kind.as_str(), kind);
        failures.check_eq(file, "resource", req.resource.resource.as_str(), resource);
        failures.check_eq(file, "subResource", req.sub_resource(), sub);
        failures.check_eq(file, "namespace", req.namespace.as_str(), ns);
        failures.check_eq(file, "has object", req.object.is_some(), has_object);
        failures.check_eq(file, "has oldObject", req.old_object.is_some(), has_old);
        failures.check(file, !req.uid.is_empty(), || "empty uid".to_owned());
        failures.check_eq(file, "username", req.user_info.username.as_str(), "alice");
    }
    failures.assert_none();
}

#[test]
fn delete_subject_is_old_object() {
    let req = request("pod-delete.json");
    assert_eq!(req.subject(), req.old_object.as_ref());
    assert!(req.subject().is_some());
}

#[test]
fn parse_errors_are_explicit() {
    let review = |body: serde_json::Value| body.to_string().into_bytes();
    let good_request = json!({
        "uid": "1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
    });
    let cases: Vec<(&str, Vec<u8>, AdmissionError)> = vec![
        (
            "v1beta1",
            review(
                json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": good_request}),
            ),
            AdmissionError::UnsupportedVersion {
                found: "admission.k8s.io/v1beta1".into(),
            },
        ),
        (
            "no apiVersion",
            review(json!({"kind": "AdmissionReview", "request": good_request})),
            AdmissionError::UnsupportedVersion {
                found: String::new(),
            },
        ),
        (
            "wrong kind",
            review(json!({"apiVersion": API_VERSION, "kind": "Pod", "request": good_request})),
            AdmissionError::WrongKind {
                found: "Pod".into(),
            },
        ),
        (
            "no request",
            review(json!({"apiVersion": API_VERSION, "kind": "AdmissionReview"})),
            AdmissionError::MissingRequest,
        ),
    ];
    for (name, body, want) in cases {
        assert_eq!(AdmissionReview::parse(&body).unwrap_err(), want, "{name}");
    }
    assert!(
        AdmissionReview::parse(&review(
            json!({"apiVersion": API_VERSION, "request": good_request})
        ))
        .is_ok()
    );
}

#[test]
fn bad_json_reports_line_and_column() {
    let body = b"{\n  \"apiVersion\": \"admission.k8s.io/v1\",\n  \"request\": {,}\n}";
    match AdmissionReview::parse(body).unwrap_err() {
        AdmissionError::InvalidJson { line, column, .. } => {
            assert_eq!(line, 3);
            assert_eq!(column, 15);
        }
        other => panic!("unexpected {other:?}"),
    }
    let unknown_op = json!({
        "apiVersion": API_VERSION,
        "request": {"uid": "1", "kind": {}, "resource": {}, "operation": "PATCH"},
    });
    let err = AdmissionReview::parse(unknown_op.to_string().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("unknown variant `PATCH`"), "{err}");
    let missing_uid = json!({"apiVersion": API_VERSION, "request": {"kind": {}, "resource": {}, "operation": "CREATE"}});
    let err = AdmissionReview::parse(missing_uid.to_string().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("missing field `uid`"), "{err}");
}

/// A body that is not UTF-8 is refused with where it breaks, whichever of the object's strings
/// holds the bad byte (the one-pass parse reads text, the second pass says why it is not).
#[test]
fn a_body_that_is_not_utf8_is_refused_with_its_position() {
    let good = std::fs::read(super::testutil::fixture_path("pod-create.json")).unwrap();
    assert!(AdmissionReview::parse(&good).is_ok());
    let at = good.windows(5).position(|w| w == b"nginx").unwrap();
    let mut bad = good.clone();
    bad[at] = 0xff;
    let line = 1 + good[..at].iter().filter(|&&b| b == b'\n').count();
    match AdmissionReview::parse(&bad).unwrap_err() {
        AdmissionError::InvalidJson {
            line: l, message, ..
        } => {
            assert_eq!(l, line, "{message}");
            assert!(message.contains("unicode"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn request_json_is_the_cel_request_variable() {
    let req = request("pod-ephemeralcontainers.json");
    let v = req.to_json();
    assert_eq!(v["operation"], "UPDATE");
    assert_eq!(v["subResource"], "ephemeralcontainers");
    assert_eq!(v["requestResource"]["resource"], "pods");
    assert_eq!(v["userInfo"]["groups"][1], "devs");
    assert_eq!(v["object"]["metadata"]["name"], "web");
    assert_eq!(v["dryRun"], false);
    let del = request("pod-delete.json").to_json();
    assert!(del["object"].is_null());
}

fn ops() -> Vec<PatchOp> {
    vec![
        PatchOp {
            path: "/spec/containers/0/image".into(),
            value: format!("docker.io/nginx:latest@sha256:{}", "a".repeat(64)),
        },
        PatchOp {
            path: "/spec/initContainers/0/image".into(),
            value: format!("docker.io/busybox:1.36@sha256:{}", "b".repeat(64)),
        },
    ]
}

#[test]
fn allowed_response_carries_base64_json_patch() {
    let req = request("pod-create.json");
    let decision = Decision {
        allowed: true,
        patch: ops(),
        warnings: vec!["w1".into()],
        ..Decision::default()
    };
    let resp = response_from_decision(&req, &decision);
    assert_eq!(resp.uid, "pod-create-uid");
    assert!(resp.allowed);
    assert!(resp.status.is_none());
    assert_eq!(resp.patch_type.as_deref(), Some("JSONPatch"));
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(resp.patch.as_deref().unwrap())
        .unwrap();
    let patch: serde_json::Value = serde_json::from_slice(&decoded).unwrap();
    assert_eq!(
        patch,
        json!([
            {"op": "replace", "path": "/spec/containers/0/image", "value": ops()[0].value},
            {"op": "replace", "path": "/spec/initContainers/0/image", "value": ops()[1].value},
        ])
    );
    // The patch applies cleanly to the request object.
    let mut object = req.object.as_ref().unwrap().value().clone();
    let parsed: json_patch::Patch = serde_json::from_value(patch).unwrap();
    json_patch::patch(&mut object, &parsed).unwrap();
    assert_eq!(
        object["spec"]["containers"][0]["image"],
        ops()[0].value.as_str()
    );

    // What the server writes, byte for byte as serde writes the same review.
    let wire = sent(&resp);
    assert_eq!(wire["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(wire["kind"], "AdmissionReview");
    assert_eq!(wire["response"]["uid"], "pod-create-uid");
    assert_eq!(wire["response"]["allowed"], true);
    assert_eq!(wire["response"]["patchType"], "JSONPatch");
    assert!(wire["response"]["patch"].is_string());
    assert_eq!(wire["response"]["warnings"], json!(["w1"]));
    assert!(wire["response"].get("status").is_none());
    assert!(wire["response"].get("auditAnnotations").is_none());
}

#[test]
fn denied_response_has_status_and_no_patch() {
    let req = request("pod-create.json");
    let mut decision = Decision {
        allowed: false,
        message: Some("Policy a failed: nope; Policy b error: boom".into()),
        patch: ops(),
        warnings: vec!["Policy c failed: meh".into()],
        ..Decision::default()
    };
    decision
        .audit_annotations
        .insert("unpinned-images".into(), "docker.io/nginx:latest".into());
    let resp = response_from_decision(&req, &decision);
    let wire = sent(&resp);
    assert_eq!(
        wire,
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": "pod-create-uid",
                "allowed": false,
                "status": {
                    "status": "Failure",
                    "message": "Policy a failed: nope; Policy b error: boom",
                    "code": 403,
                    "reason": "Forbidden",
                },
                "warnings": ["Policy c failed: meh"],
                "auditAnnotations": {"unpinned-images": "docker.io/nginx:latest"},
            }
        })
    );
}

#[test]
fn plain_allow_is_minimal() {
    let req = request("configmap-create.json");
    let decision = Decision {
        allowed: true,
        ..Decision::default()
    };
    let wire = sent(&response_from_decision(&req, &decision));
    assert_eq!(
        wire,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "response": {"uid": "cm-create-uid", "allowed": true}})
    );
}

#[test]
fn fixtures_live_in_the_workspace() {
    assert!(fixture_path("pod-create.json").is_file());
}

fn text() -> impl proptest::strategy::Strategy<Value = String> {
    proptest::string::string_regex("([a-z:/ ._-]{0,12}[\"\\\\\u{0}-\u{1f}é]?){0,4}").unwrap()
}

proptest::proptest! {
    /// Any response, allowed or denied, with or without each optional part, is written as
    /// serde writes it.
    #[test]
    fn any_response_is_written_as_serde_writes_it(
        uid in text(),
        allowed in proptest::bool::ANY,
        status in proptest::option::of((text(), text(), proptest::option::of(0u16..600), proptest::option::of(text()))),
        warnings in proptest::collection::vec(text(), 0..3),
        audit_annotations in proptest::collection::btree_map(text(), text(), 0..3),
        patch_type in proptest::option::of(text()),
        patch in proptest::option::of(text()),
    ) {
        let resp = AdmissionResponse {
            uid,
            allowed,
            status: status.map(|(status, message, code, reason)| ResponseStatus { status, message, code, reason }),
            warnings,
            audit_annotations,
            patch_type,
            patch,
        };
        let review = ReviewResponse::new(&resp);
        proptest::prop_assert_eq!(review.to_json(), serde_json::to_string(&review).unwrap());
    }
}
