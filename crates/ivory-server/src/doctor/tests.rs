use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ServiceReference;

use ivory_policy::{CompiledPolicy, ResourceRead};
use k8s_openapi::api::admissionregistration::v1::WebhookClientConfig;

use super::*;

fn url_config(url: &str) -> WebhookClientConfig {
    WebhookClientConfig {
        url: Some(url.to_owned()),
        ca_bundle: Some(ByteString(b"PEM".to_vec())),
        ..WebhookClientConfig::default()
    }
}

#[test]
fn hooks_are_read_from_urls_and_services() {
    let h = hook(
        "cfg",
        "ivpol.validate.x-fail",
        &url_config("https://127.0.0.1:9443/ivpol/validate/a/b?timeout=5s"),
        Some("Ignore"),
    )
    .unwrap();
    assert_eq!(h.stage, "validate");
    assert_eq!(h.prefix, "ivpol");
    assert_eq!(h.policies, ["a", "b"]);
    assert_eq!(h.failure_policy, "Ignore");
    assert_eq!(
        h.endpoint,
        Endpoint::Url {
            base: "https://127.0.0.1:9443".into(),
            ca: b"PEM".to_vec()
        }
    );

    let service = WebhookClientConfig {
        service: Some(ServiceReference {
            namespace: "ivory".into(),
            name: "ivory".into(),
            path: Some("/nivpol/mutate/p".into()),
            port: None,
        }),
        ..WebhookClientConfig::default()
    };
    let h = hook("cfg", "n", &service, None).unwrap();
    assert_eq!((h.prefix.as_str(), h.stage.as_str()), ("nivpol", "mutate"));
    assert_eq!(h.failure_policy, "Fail", "the API server's default");
    assert_eq!(h.endpoint.describe(), "service ivory/ivory:443");

    // Webhooks of other software are not ivory's.
    assert!(
        hook(
            "cfg",
            "o",
            &url_config("https://example.test/validate"),
            None
        )
        .is_none()
    );
    assert!(
        hook(
            "cfg",
            "o",
            &url_config("https://example.test/ivpol/other/a"),
            None
        )
        .is_none()
    );
}

fn policy(name: &str, failure: &str) -> CompiledPolicy {
    let text = format!(
        "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: {name}
spec:
  failurePolicy: {failure}
  matchConstraints:
    resourceRules:
      - apiGroups: [\"\"]
        apiVersions: [v1]
        operations: [CREATE]
        resources: [pods]
  matchImageReferences:
    - glob: \"*\"
  attestors: []
  validations:
    - expression: \"true\"
"
    );
    let report = ivory_policy::load_str(&text, "test");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().next().unwrap()
}

fn ivory_hook(stage: &str, names: &[&str], failure: &str) -> Hook {
    Hook {
        config: "cfg".into(),
        name: format!("ivpol.{stage}"),
        stage: stage.into(),
        prefix: "ivpol".into(),
        policies: names.iter().map(|n| n.to_string()).collect(),
        failure_policy: failure.into(),
        endpoint: Endpoint::Url {
            base: "https://127.0.0.1:1".into(),
            ca: Vec::new(),
        },
    }
}

#[test]
fn unregistered_policies_fail_and_mismatched_failure_policies_warn() {
    let policies = [policy("a", "Fail"), policy("b", "Ignore")];
    let hooks = [
        ivory_hook("validate", &["a", "b"], "Fail"),
        ivory_hook("mutate", &["a"], "Fail"),
    ];
    let checks = registration_checks(&policies, &hooks);
    let status = |subject: &str| {
        checks
            .iter()
            .find(|c| c.subject == subject)
            .map(Check::status)
            .unwrap()
    };
    assert_eq!(status("a (validate)"), Status::Ok);
    assert_eq!(status("a (mutate)"), Status::Ok);
    assert_eq!(status("b (validate)"), Status::Warn);
    assert_eq!(status("b (mutate)"), Status::Fail);
    assert!(
        registration_checks(&policies, &[])
            .iter()
            .all(|c| c.status() == Status::Fail)
    );
}

#[test]
fn reads_are_allowed_denied_or_unknown_by_the_answers() {
    let read = ResourceRead {
        group: String::new(),
        version: "v1".into(),
        resource: "configmaps".into(),
        namespace: Some("team-a".into()),
    };
    let sa = "system:serviceaccount:ivory-system:ivory";
    let all = [("get", Ok(true)), ("list", Ok(true)), ("watch", Ok(true))];
    let row = read_check("p", &read, sa, all);
    assert_eq!((row.layer(), row.status()), (Layer::Reads, Status::Ok));
    let no_watch = [("get", Ok(true)), ("list", Ok(false)), ("watch", Ok(false))];
    let row = read_check("p", &read, sa, no_watch);
    assert_eq!(row.status(), Status::Fail);
    assert!(
        matches!(&row.finding, Finding::ReadDenied { verbs, .. } if verbs == &["list", "watch"]),
        "{row:?}"
    );
    // A failed review makes the row unknown, even beside a refusal.
    let refused = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
    let unknown = [
        ("get", Ok(false)),
        ("list", Err(kube::Error::Api(refused.boxed()))),
        ("watch", Ok(true)),
    ];
    let row = read_check("p", &read, sa, unknown);
    assert_eq!(row.status(), Status::Warn);
    assert!(
        matches!(&row.finding, Finding::ReadUnknown { verb: "list", .. }),
        "{row:?}"
    );
}

#[test]
fn endpoints_with_policy_errors_warn() {
    let ready = |policy_errors| Finding::EndpointReady {
        readyz: "ok".into(),
        policy_errors,
    };
    assert_eq!(ready(0).status(), Status::Ok);
    assert_eq!(ready(2).status(), Status::Warn);
    assert_eq!(ready(2).layer(), Layer::Endpoint);
    let silent = Finding::EndpointSilent {
        timeout: PROBE_TIMEOUT,
    };
    assert_eq!(silent.status(), Status::Fail);
}
