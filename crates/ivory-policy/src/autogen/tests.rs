//! Autogen eligibility, the textual rewrite and the compiled variants.

use serde_json::{Value, json};

use super::*;
use crate::testutil::{base, load, patch};

fn compiled(patches: &[(&str, Option<Value>)]) -> CompiledPolicy {
    let mut doc = base();
    for (p, v) in patches {
        patch(&mut doc, p, v.clone());
    }
    let mut report = load(&doc);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.remove(0)
}

fn configs(p: &CompiledPolicy) -> Vec<&str> {
    p.autogen
        .iter()
        .filter_map(|v| v.autogen_config.as_deref())
        .collect()
}

#[test]
fn eligibility() {
    let not_eligible: Vec<Vec<(&str, Option<Value>)>> = vec![
        vec![(
            "/spec/matchConstraints/resourceRules/0/resources",
            Some(json!(["pods", "configmaps"])),
        )],
        vec![(
            "/spec/matchConstraints/resourceRules/0/resources",
            Some(json!(["pods", "services/proxy"])),
        )],
        vec![(
            "/spec/matchConstraints/resourceRules/0/resources",
            Some(json!(["pods/ephemeralcontainers"])),
        )],
        vec![(
            "/spec/matchConstraints/resourceRules/0/apiGroups",
            Some(json!(["apps"])),
        )],
        vec![(
            "/spec/matchConstraints/resourceRules/0/apiVersions",
            Some(json!(["v1", "v1beta1"])),
        )],
        vec![(
            "/spec/matchConstraints/resourceRules/0/resourceNames",
            Some(json!(["one"])),
        )],
        vec![(
            "/spec/matchConstraints/resourceRules/1",
            Some(
                json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}),
            ),
        )],
        vec![(
            "/spec/matchConstraints/excludeResourceRules",
            Some(
                json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "resourceNames": ["x"]}]),
            ),
        )],
        vec![(
            "/spec/matchConstraints/objectSelector",
            Some(json!({"matchLabels": {"a": "b"}})),
        )],
        vec![(
            "/spec/autogen",
            Some(json!({"podControllers": {"controllers": []}})),
        )],
    ];
    for patches in not_eligible {
        assert!(compiled(&patches).autogen.is_empty(), "{patches:?}");
    }
    // Pod subresources next to `pods` do not prevent autogen (Kyverno #17427).
    for resources in [
        json!(["pods", "pods/ephemeralcontainers"]),
        json!(["pods/ephemeralcontainers", "pods", "pods/status"]),
    ] {
        let p = compiled(&[(
            "/spec/matchConstraints/resourceRules/0/resources",
            Some(resources.clone()),
        )]);
        assert_eq!(configs(&p), [DEFAULTS, CRONJOBS], "{resources}");
        for variant in &p.autogen {
            assert!(
                variant
                    .match_constraints
                    .resource_rules
                    .iter()
                    .all(|r| r.resources.iter().all(|x| !x.contains('/'))),
                "controllers get no subresources: {resources}"
            );
        }
    }
    // An empty object selector does not prevent autogen.
    let p = compiled(&[("/spec/matchConstraints/objectSelector", Some(json!({})))]);
    assert_eq!(configs(&p), [DEFAULTS, CRONJOBS]);
    assert!(eligible_rule(&p.spec).is_some());
    assert!(
        autogen_rules(&p.autogen[0]).is_empty(),
        "variants have no variants"
    );
}

#[test]
fn rewrite_text() {
    let cases = [
        (
            "object.spec.containers",
            "object.spec.template.spec.containers",
            "object.spec.jobTemplate.spec.template.spec.containers",
        ),
        (
            "has(object.metadata.labels)",
            "has(object.spec.template.metadata.labels)",
            "has(object.spec.jobTemplate.spec.template.metadata.labels)",
        ),
        (
            "oldObject.spec.x == object.spec.x",
            "oldObject.spec.template.spec.x == object.spec.template.spec.x",
            "oldObject.spec.jobTemplate.spec.template.spec.x == object.spec.jobTemplate.spec.template.spec.x",
        ),
        (
            "object.metadata.namespace == 'a'",
            "object.metadata.namespace == 'a'",
            "object.metadata.namespace == 'a'",
        ),
        (
            "oldObject.metadata.namespace",
            "oldObject.metadata.namespace",
            "oldObject.metadata.namespace",
        ),
        (
            "object.metadata.namespaces",
            "object.spec.template.metadata.namespaces",
            "object.spec.jobTemplate.spec.template.metadata.namespaces",
        ),
        (
            "object.metadata",
            "object.spec.template.metadata",
            "object.spec.jobTemplate.spec.template.metadata",
        ),
        (
            "myobject.spec + object.specs + object.status",
            "myobject.spec + object.specs + object.status",
            "myobject.spec + object.specs + object.status",
        ),
        ("request.name", "request.name", "request.name"),
    ];
    for (input, defaults, cronjobs) in cases {
        assert_eq!(rewrite(input, DEFAULTS), defaults, "{input}");
        assert_eq!(rewrite(input, CRONJOBS), cronjobs, "{input}");
    }
}

#[test]
fn variants_for_selected_controllers() {
    let p = compiled(&[
        (
            "/spec/autogen",
            Some(json!({"podControllers": {"controllers": ["deployments", "cronjobs"]}})),
        ),
        (
            "/spec/matchConditions/0/expression",
            Some(json!(
                "has(object.metadata.labels) && object.metadata.namespace != 'x'"
            )),
        ),
        (
            "/spec/matchConstraints/namespaceSelector",
            Some(json!({"matchLabels": {"env": "prod"}})),
        ),
        (
            "/spec/validations/0/message",
            Some(json!("object.spec must be signed")),
        ),
    ]);
    assert_eq!(configs(&p), [DEFAULTS, CRONJOBS]);
    let (defaults, cronjobs) = (&p.autogen[0], &p.autogen[1]);

    assert_eq!(
        defaults.match_constraints.resource_rules,
        [NamedRuleWithOperations {
            operations: vec!["CREATE".into(), "UPDATE".into()],
            api_groups: vec!["apps".into()],
            api_versions: vec!["v1".into()],
            resources: vec!["deployments".into()],
            ..Default::default()
        }]
    );
    assert_eq!(
        cronjobs.match_constraints.resource_rules,
        [NamedRuleWithOperations {
            operations: vec!["CREATE".into(), "UPDATE".into()],
            api_groups: vec!["batch".into()],
            api_versions: vec!["v1".into()],
            resources: vec!["cronjobs".into()],
            ..Default::default()
        }]
    );
    for v in [defaults, cronjobs] {
        assert_eq!(
            v.match_constraints.namespace_selector,
            p.match_constraints.namespace_selector
        );
        assert_eq!(
            (&v.name, &v.hash, &v.actions),
            (&p.name, &p.hash, &p.actions)
        );
        assert_eq!(v.origin, p.origin);
        assert!(v.autogen.is_empty());
    }
    assert_eq!(
        defaults.match_conditions[0].program.source(),
        "has(object.spec.template.metadata.labels) && object.metadata.namespace != 'x'"
    );
    assert_eq!(
        cronjobs.match_conditions[0].program.source(),
        "has(object.spec.jobTemplate.spec.template.metadata.labels) && object.metadata.namespace != 'x'"
    );
    assert_eq!(
        defaults.variables[0].program.source(),
        "object.spec.template.metadata.name"
    );
    // The whole spec text is rewritten, messages included (as Kyverno does).
    assert_eq!(
        defaults.validations[0].message.as_deref(),
        Some("object.spec.template.spec must be signed")
    );
    // The parent keeps what was written.
    assert_eq!(
        p.match_conditions[0].program.source(),
        "has(object.metadata.labels) && object.metadata.namespace != 'x'"
    );

    assert_eq!(
        autogen_rules(&p),
        [
            defaults.match_constraints.resource_rules.clone(),
            cronjobs.match_constraints.resource_rules.clone()
        ]
        .concat()
    );
}

#[test]
fn default_controllers_group_by_api_group() {
    let p = compiled(&[(
        "/spec/matchConstraints/resourceRules/0/scope",
        Some(json!("Namespaced")),
    )]);
    let rules = autogen_rules(&p);
    let summary: Vec<(String, Vec<String>, Option<String>)> = rules
        .iter()
        .map(|r| (r.api_groups.join(","), r.resources.clone(), r.scope.clone()))
        .collect();
    let ns = Some("Namespaced".to_owned());
    assert_eq!(
        summary,
        [
            (
                "apps".into(),
                vec![
                    "daemonsets".into(),
                    "deployments".into(),
                    "replicasets".into(),
                    "statefulsets".into()
                ],
                ns.clone()
            ),
            ("batch".into(), vec!["jobs".into()], ns.clone()),
            ("batch".into(), vec!["cronjobs".into()], ns),
        ]
    );
}
