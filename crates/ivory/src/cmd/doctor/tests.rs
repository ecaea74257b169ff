use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ServiceReference;

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
            .map(|c| c.status)
            .unwrap()
    };
    assert_eq!(status("a (validate)"), Status::Ok);
    assert_eq!(status("a (mutate)"), Status::Ok);
    assert_eq!(status("b (validate)"), Status::Warn);
    assert_eq!(status("b (mutate)"), Status::Fail);
    assert!(
        registration_checks(&policies, &[])
            .iter()
            .all(|c| c.status == Status::Fail)
    );
}

#[test]
fn the_table_ends_with_the_verdict() {
    let ok = [check("api", "kube-apiserver", Status::Ok, "v1.37.2")];
    let text = render(&ok);
    assert!(text.starts_with("LAYER"), "{text}");
    assert!(
        text.contains("api    kube-apiserver  ok      v1.37.2"),
        "{text}"
    );
    assert!(text.ends_with("all layers ok\n"), "{text}");
    let failed = [check("registration", "p (validate)", Status::Fail, "none")];
    assert!(render(&failed).ends_with("1 check(s) failed\n"));
}

#[test]
fn a_policy_reading_what_the_service_account_may_not_watch_fails_its_row() {
    let text = "apiVersion: policies.kyverno.io/v1
kind: NamespacedImageValidatingPolicy
metadata:
  name: keys
  namespace: team-a
spec:
  matchConstraints:
    resourceRules:
      - apiGroups: [\"\"]
        apiVersions: [v1]
        operations: [CREATE]
        resources: [pods]
  attestors: []
  validations:
    - expression: resource.get('v1', 'configmaps', 'keys') != null && globalContext.Get('trusted', '') != null
";
    let report = ivory_policy::load_str(text, "test");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let needed = reads_needed(&report.policies);
    let described: Vec<(String, String)> = needed
        .iter()
        .map(|(s, r)| (s.clone(), r.to_string()))
        .collect();
    assert_eq!(
        described,
        [
            (
                "NamespacedImageValidatingPolicy/team-a/keys".to_owned(),
                "v1 configmaps in namespace team-a".to_owned()
            ),
            (
                "NamespacedImageValidatingPolicy/team-a/keys".to_owned(),
                "kyverno.io/v2beta1 globalcontextentries in all namespaces".to_owned()
            ),
        ]
    );
    let sa = "system:serviceaccount:ivory-system:ivory";
    let (subject, read) = &needed[0];
    let all = [("get", Ok(true)), ("list", Ok(true)), ("watch", Ok(true))];
    assert_eq!(read_check(subject, read, sa, &all).status, Status::Ok);
    let no_watch = [("get", Ok(true)), ("list", Ok(false)), ("watch", Ok(false))];
    let row = read_check(subject, read, sa, &no_watch);
    assert_eq!(row.status, Status::Fail);
    assert!(
        row.detail.contains("may not list, watch it"),
        "{}",
        row.detail
    );
    let refused = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
    let unknown = [
        ("get", Err(kube::Error::Api(refused.boxed()))),
        ("list", Ok(true)),
        ("watch", Ok(true)),
    ];
    let row = read_check(subject, read, sa, &unknown);
    assert_eq!(row.status, Status::Warn);
    assert!(
        row.detail
            .contains(&format!("could not ask whether {sa} may get it: ")),
        "{}",
        row.detail
    );
}
