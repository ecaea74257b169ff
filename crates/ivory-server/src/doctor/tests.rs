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
        source: Source::Api,
        scope: "{}".into(),
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

fn static_hook(stage: &str, names: &[&str], failure: &str) -> Hook {
    Hook {
        source: Source::Static,
        config: "ivory.static.k8s.io".into(),
        ..ivory_hook(stage, names, failure)
    }
}

#[test]
fn a_static_registration_is_named_first_and_a_differing_api_one_warns() {
    let policies = [policy("a", "Fail")];
    let same = [
        static_hook("validate", &["a"], "Fail"),
        ivory_hook("validate", &["a"], "Fail"),
    ];
    let checks = registration_checks(&policies, &same);
    assert_eq!(checks.len(), 2, "{checks:?}");
    assert!(
        matches!(
            &checks[0].finding,
            Finding::Registered {
                source: Source::Static,
                also_api: Some(_),
                ..
            }
        ),
        "{checks:?}"
    );
    assert_eq!(checks[0].subject, "a (validate)");

    // Only the static one: registered, from the static source.
    let only_static = registration_checks(&policies, &same[..1]);
    assert!(matches!(
        &only_static[0].finding,
        Finding::Registered {
            source: Source::Static,
            also_api: None,
            ..
        }
    ));

    let mut api = ivory_hook("validate", &["a"], "Ignore");
    api.scope = r#"{"rules":[]}"#.into();
    let differing = [static_hook("validate", &["a"], "Fail"), api];
    let checks = registration_checks(&policies, &differing);
    let disagree = checks
        .iter()
        .find(|c| matches!(c.finding, Finding::SourcesDisagree { .. }))
        .expect("a disagreement row");
    assert_eq!(disagree.status(), Status::Warn);
    assert!(
        matches!(&disagree.finding, Finding::SourcesDisagree { differences, .. }
            if differences == &["failurePolicy", "rules, selectors, conditions or timeout"]),
        "{disagree:?}"
    );
}

const STATIC_VALIDATING: &str = "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: ivory.static.k8s.io
webhooks:
  - name: ivpol.validate.ivory.svc-fail
    admissionReviewVersions: [v1]
    sideEffects: None
    clientConfig:
      url: https://10.0.0.10/ivpol/validate/a
    rules:
      - apiGroups: [\"\"]
        apiVersions: [v1]
        operations: [CREATE]
        resources: [pods]
";

#[test]
fn static_folders_are_read_hashed_and_checked_against_what_the_api_server_applies() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("validating")).unwrap();
    std::fs::write(dir.path().join("validating/ivory.yaml"), STATIC_VALIDATING).unwrap();
    std::fs::write(dir.path().join("validating/.ivory.yaml.tmp"), "not read").unwrap();
    let folders = read_static(dir.path()).unwrap();
    let validating = &folders[0];
    assert_eq!(validating.plugin, "ValidatingAdmissionWebhook");
    assert_eq!(validating.hooks.len(), 1);
    let hook = &validating.hooks[0];
    assert_eq!(
        (hook.source, hook.failure_policy.as_str()),
        (Source::Static, "Fail")
    );
    assert!(
        hook.scope.contains(r#""matchPolicy":"Equivalent""#),
        "{}",
        hook.scope
    );
    let hash = validating.hash.clone().unwrap();
    assert_eq!(folders[1].hash, None, "no mutating manifests");

    let metrics = |hash: &str| {
        format!(
            "# HELP x\napiserver_manifest_admission_config_controller_last_config_info{{apiserver_id_hash=\"sha256:1\",hash=\"{hash}\",plugin=\"ValidatingAdmissionWebhook\"}} 1\n"
        )
    };
    let status = |text: &str| {
        let loaded = Ok(loaded_hashes(text));
        static_checks(&folders, &loaded)
            .iter()
            .map(|c| (c.subject.clone(), c.status()))
            .collect::<Vec<_>>()
    };
    let subject = "static manifests (ValidatingAdmissionWebhook)".to_owned();
    assert_eq!(status(&metrics(&hash)), [(subject.clone(), Status::Ok)]);
    assert_eq!(
        status(&metrics("sha256:old")),
        [(subject.clone(), Status::Warn)]
    );
    assert_eq!(status(""), [(subject, Status::Fail)]);
    assert!(applied(
        &folders[0],
        &Ok(loaded_hashes(&metrics("sha256:old")))
    ));
    assert!(!applied(&folders[0], &Ok(loaded_hashes(""))));

    // A mutating configuration in the validating folder fails the API server's load: refused.
    std::fs::write(
        dir.path().join("validating/other.yaml"),
        STATIC_VALIDATING.replace(
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
        ),
    )
    .unwrap();
    assert!(matches!(
        read_static(dir.path()),
        Err(StaticReadError::Kind { .. })
    ));
    std::fs::write(
        dir.path().join("validating/other.yaml"),
        STATIC_VALIDATING.replace("ivory.static.k8s.io", "ivory"),
    )
    .unwrap();
    assert!(matches!(
        read_static(dir.path()),
        Err(StaticReadError::Name { .. })
    ));
}
