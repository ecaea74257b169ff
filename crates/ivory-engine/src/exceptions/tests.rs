use std::sync::Arc;

use ivory_policy::CompiledException;
use ivory_policy::compiled::CompiledPolicy;
use tokio::time::{Duration, Instant};

use super::*;
use crate::admission::testutil::request;
use crate::matching::{Route, select_policies};

const POLICIES: &str = r#"
apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata: {name: check}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  attestors: []
  validations: [{expression: "false"}]
---
apiVersion: policies.kyverno.io/v1
kind: NamespacedImageValidatingPolicy
metadata: {name: team, namespace: apps}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  attestors: []
  validations: [{expression: "false"}]
"#;

fn load(yaml: &str) -> (Vec<Arc<CompiledPolicy>>, Vec<Arc<CompiledException>>) {
    let report = ivory_policy::load_str(yaml, "test.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    (
        report.policies.into_iter().map(Arc::new).collect(),
        report.exceptions.into_iter().map(Arc::new).collect(),
    )
}

fn exception(namespace: &str, name: &str, kind: &str, policy: &str, condition: &str) -> String {
    format!(
        r#"
---
apiVersion: policies.kyverno.io/v1beta1
kind: PolicyException
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  policyRefs: [{{name: {policy}, kind: {kind}}}]
  matchConditions: [{{name: c, expression: "{condition}"}}]
"#
    )
}

fn deadline() -> Instant {
    ivory_clock::now() + Duration::from_secs(5)
}

#[tokio::test]
async fn matching_exception_skips_with_kyvernos_text_and_property() {
    let yaml = format!(
        "{POLICIES}{}{}",
        exception(
            "kyverno",
            "allow-web",
            "ImageValidatingPolicy",
            "check",
            "object.metadata.name == 'web'"
        ),
        exception(
            "kyverno",
            "other",
            "ImageValidatingPolicy",
            "check",
            "object.metadata.name == 'api'"
        ),
    );
    let (policies, exceptions) = load(&yaml);
    let set = Exceptions {
        exceptions: Arc::new(exceptions),
        namespace: None,
    };
    let req = request("pod-create.json");
    let selected = select_policies(
        &policies,
        Route { namespaced: false },
        &["check".into()],
        req.namespace(),
    )
    .unwrap();
    let part = set.partition(&selected, &req, None, deadline());
    assert!(
        part.evaluate.iter().all(|p| p.autogen_config.is_some()),
        "only the autogen variants (which do not match a Pod) are left"
    );
    assert_eq!(part.skipped.len(), 1);
    let skipped = &part.skipped[0];
    assert_eq!(skipped.status, Status::Skip);
    assert_eq!(
        skipped.message,
        "rule is skipped due to policy exception: kyverno/allow-web"
    );
    assert_eq!(skipped.properties[EXCEPTIONS_PROPERTY], "allow-web");
}

#[tokio::test]
async fn exception_of_another_policy_kind_namespace_or_condition_does_not_skip() {
    let req = request("pod-create.json");
    for ex in [
        exception(
            "kyverno",
            "a",
            "ImageValidatingPolicy",
            "check",
            "object.metadata.name == 'api'",
        ),
        exception(
            "kyverno",
            "b",
            "NamespacedImageValidatingPolicy",
            "check",
            "true",
        ),
        exception("kyverno", "c", "ImageValidatingPolicy", "other", "true"),
    ] {
        let (policies, exceptions) = load(&format!("{POLICIES}{ex}"));
        let set = Exceptions {
            exceptions: Arc::new(exceptions),
            namespace: None,
        };
        let selected = select_policies(
            &policies,
            Route { namespaced: false },
            &["check".into()],
            req.namespace(),
        )
        .unwrap();
        let part = set.partition(&selected, &req, None, deadline());
        assert_eq!(part.evaluate.len(), selected.len(), "{ex}");
        assert!(part.skipped.is_empty(), "{ex}");
    }
    // Only exceptions in the configured exception namespace count.
    let (policies, exceptions) = load(&format!(
        "{POLICIES}{}",
        exception("default", "d", "ImageValidatingPolicy", "check", "true")
    ));
    let set = Exceptions {
        exceptions: Arc::new(exceptions),
        namespace: Some("kyverno".into()),
    };
    let selected = select_policies(
        &policies,
        Route { namespaced: false },
        &["check".into()],
        None,
    )
    .unwrap();
    assert!(set.applicable(selected[0]).is_empty());
}

#[test]
fn namespaced_policy_is_only_excepted_from_its_namespace_or_the_exception_namespace() {
    let yaml = format!(
        "{POLICIES}{}{}",
        exception(
            "apps",
            "same",
            "NamespacedImageValidatingPolicy",
            "team",
            "true"
        ),
        exception(
            "elsewhere",
            "foreign",
            "NamespacedImageValidatingPolicy",
            "team",
            "true"
        ),
    );
    let (policies, exceptions) = load(&yaml);
    let team = policies.iter().find(|p| p.name == "team").unwrap();
    let open = Exceptions {
        exceptions: Arc::new(exceptions.clone()),
        namespace: None,
    };
    let keys: Vec<String> = open.applicable(team).iter().map(|e| e.key()).collect();
    assert_eq!(keys, ["apps/same"]);
    let central = Exceptions {
        exceptions: Arc::new(exceptions),
        namespace: Some("elsewhere".into()),
    };
    let keys: Vec<String> = central.applicable(team).iter().map(|e| e.key()).collect();
    assert_eq!(keys, ["elsewhere/foreign"]);
}

#[tokio::test]
async fn failing_exception_condition_is_a_policy_error_that_denies() {
    let yaml = format!(
        "{POLICIES}{}",
        exception(
            "kyverno",
            "broken",
            "ImageValidatingPolicy",
            "check",
            "object.metadata.labels.missing == 'x'"
        ),
    );
    let (policies, exceptions) = load(&yaml);
    let set = Exceptions {
        exceptions: Arc::new(exceptions),
        namespace: None,
    };
    let req = request("pod-create.json");
    let selected = select_policies(
        &policies,
        Route { namespaced: false },
        &["check".into()],
        req.namespace(),
    )
    .unwrap();
    let part = set.partition(&selected, &req, None, deadline());
    assert_eq!(part.skipped[0].status, Status::Error);
    let mut decision = Decision {
        allowed: true,
        ..Decision::default()
    };
    merge_into(&mut decision, part.skipped);
    assert!(!decision.allowed);
    let message = decision.message.unwrap();
    assert!(
        message
            .starts_with("Policy check error: failed to evaluate policy: exception kyverno/broken"),
        "{message}"
    );
}

#[tokio::test]
async fn autogen_variants_are_excepted_too() {
    let yaml = format!(
        "{POLICIES}{}",
        exception(
            "kyverno",
            "allow-api",
            "ImageValidatingPolicy",
            "check",
            "object.metadata.name == 'api'"
        ),
    );
    let (policies, exceptions) = load(&yaml);
    let set = Exceptions {
        exceptions: Arc::new(exceptions),
        namespace: None,
    };
    let req = request("deployment-create.json");
    let selected = select_policies(
        &policies,
        Route { namespaced: false },
        &["check".into()],
        req.namespace(),
    )
    .unwrap();
    assert!(selected.len() > 1, "the policy has autogen variants");
    let part = set.partition(&selected, &req, None, deadline());
    assert_eq!(part.skipped.len(), 1, "the deployments variant is excepted");
    assert_eq!(part.skipped[0].status, Status::Skip);
    assert_eq!(
        part.skipped[0].message,
        "rule is skipped due to policy exception: kyverno/allow-api"
    );
}
