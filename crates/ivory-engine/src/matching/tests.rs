use std::collections::BTreeMap;
use std::sync::Arc;

use ivory_policy::types::{
    FailurePolicy, LabelSelector, LabelSelectorRequirement, NamedRuleWithOperations, PolicyKind,
    PolicySpec,
};
use ivory_testkit::cases::Failures;
use serde_json::{Value, json};

use super::*;
use crate::admission::testutil::{condition, pod_rule, policy, request, rule};
use crate::admission::{AdmissionRequest, GroupVersionResource};

fn later() -> tokio::time::Instant {
    ivory_clock::now() + std::time::Duration::from_secs(10)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.to_owned(),
        operator: op.to_owned(),
        values: values.iter().map(|s| (*s).to_owned()).collect(),
    }
}

fn selector(match_labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
    LabelSelector {
        match_labels: labels(match_labels),
        match_expressions: exprs,
    }
}

fn namespace(labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default", "labels": labels}})
}

fn matches_rule(r: NamedRuleWithOperations, req: &AdmissionRequest) -> bool {
    matches_constraints(&policy("p", vec![r]), req, None).unwrap()
}

/// The requests [`resource_rule_fields`] asks its rules about.
struct RuleRequests {
    pod: AdmissionRequest,
    update: AdmissionRequest,
    delete: AdmissionRequest,
    eph: AdmissionRequest,
    deploy: AdmissionRequest,
    scale: AdmissionRequest,
    ns: AdmissionRequest,
    cm: AdmissionRequest,
    clusterrole: AdmissionRequest,
}

fn rule_requests() -> RuleRequests {
    let pod = request("pod-create.json");
    let update = request("pod-update.json");
    let delete = request("pod-delete.json");
    let eph = request("pod-ephemeralcontainers.json");
    let deploy = request("deployment-create.json");
    let mut scale = request("deployment-create.json");
    scale.sub_resource = Some("scale".into());
    scale.request_sub_resource = Some("scale".into());
    let ns = request("namespace-create.json");
    let cm = request("configmap-create.json");
    let mut clusterrole = request("configmap-create.json");
    clusterrole.namespace = String::new();
    clusterrole.resource =
        GroupVersionResource::new("rbac.authorization.k8s.io", "v1", "clusterroles");
    clusterrole.request_resource = None;
    RuleRequests {
        pod,
        update,
        delete,
        eph,
        deploy,
        scale,
        ns,
        cm,
        clusterrole,
    }
}

/// One case of [`resource_rule_fields`]: whether `rule` selects `request`.
struct RuleCase<'a> {
    name: &'static str,
    rule: NamedRuleWithOperations,
    request: &'a AdmissionRequest,
    matches: bool,
}

/// Each field of a resource rule, matching and not.
fn rule_cases(r: &RuleRequests) -> Vec<RuleCase<'_>> {
    let all = &["*"][..];
    let with_scope = |scope: &str, resources: &[&str]| NamedRuleWithOperations {
        scope: Some(scope.to_owned()),
        ..rule(all, all, all, resources)
    };
    let with_names = |names: &[&str]| NamedRuleWithOperations {
        resource_names: names.iter().map(|s| (*s).to_owned()).collect(),
        ..pod_rule()
    };
    let cases: Vec<(&str, NamedRuleWithOperations, &AdmissionRequest, bool)> = vec![
        // operations
        (
            "create op",
            rule(&["CREATE"], &[""], &["v1"], &["pods"]),
            &r.pod,
            true,
        ),
        (
            "create op vs update",
            rule(&["CREATE"], &[""], &["v1"], &["pods"]),
            &r.update,
            false,
        ),
        (
            "update op",
            rule(&["UPDATE"], &[""], &["v1"], &["pods"]),
            &r.update,
            true,
        ),
        (
            "delete op",
            rule(&["DELETE"], &[""], &["v1"], &["pods"]),
            &r.delete,
            true,
        ),
        (
            "wildcard op",
            rule(all, &[""], &["v1"], &["pods"]),
            &r.delete,
            true,
        ),
        ("no op", rule(&[], &[""], &["v1"], &["pods"]), &r.pod, false),
        // apiGroups
        ("core group", pod_rule(), &r.pod, true),
        (
            "apps group vs pod",
            rule(all, &["apps"], &["v1"], &["pods"]),
            &r.pod,
            false,
        ),
        (
            "apps group",
            rule(all, &["apps"], &["v1"], &["deployments"]),
            &r.deploy,
            true,
        ),
        (
            "wildcard group",
            rule(all, all, &["v1"], &["deployments"]),
            &r.deploy,
            true,
        ),
        // apiVersions
        (
            "v1beta1 vs v1",
            rule(all, &[""], &["v1beta1"], &["pods"]),
            &r.pod,
            false,
        ),
        (
            "wildcard version",
            rule(all, &[""], all, &["pods"]),
            &r.pod,
            true,
        ),
        // resources and subresources
        (
            "pods vs subresource",
            rule(all, &[""], &["v1"], &["pods"]),
            &r.eph,
            false,
        ),
        (
            "explicit subresource",
            rule(all, &[""], &["v1"], &["pods/ephemeralcontainers"]),
            &r.eph,
            true,
        ),
        (
            "explicit subresource vs pod",
            rule(all, &[""], &["v1"], &["pods/ephemeralcontainers"]),
            &r.pod,
            false,
        ),
        (
            "pods/*",
            rule(all, &[""], &["v1"], &["pods/*"]),
            &r.eph,
            true,
        ),
        // As in k8s: a `*` sub-resource also matches the main resource.
        (
            "pods/* vs pod",
            rule(all, &[""], &["v1"], &["pods/*"]),
            &r.pod,
            true,
        ),
        (
            "pods/* vs configmap",
            rule(all, &[""], &["v1"], &["pods/*"]),
            &r.cm,
            false,
        ),
        ("* vs pod", rule(all, all, all, &["*"]), &r.pod, true),
        (
            "* vs subresource",
            rule(all, all, all, &["*"]),
            &r.eph,
            false,
        ),
        (
            "*/* vs subresource",
            rule(all, all, all, &["*/*"]),
            &r.eph,
            true,
        ),
        ("*/* vs pod", rule(all, all, all, &["*/*"]), &r.pod, true),
        ("*/scale", rule(all, all, all, &["*/scale"]), &r.scale, true),
        (
            "*/scale vs deployment",
            rule(all, all, all, &["*/scale"]),
            &r.deploy,
            false,
        ),
        (
            "deployments/scale",
            rule(all, &["apps"], &["v1"], &["deployments/scale"]),
            &r.scale,
            true,
        ),
        (
            "deployments vs scale",
            rule(all, &["apps"], &["v1"], &["deployments"]),
            &r.scale,
            false,
        ),
        (
            "two resources",
            rule(all, all, all, &["configmaps", "pods"]),
            &r.pod,
            true,
        ),
        // scope
        (
            "Namespaced pod",
            with_scope("Namespaced", &["*"]),
            &r.pod,
            true,
        ),
        ("Cluster pod", with_scope("Cluster", &["*"]), &r.pod, false),
        (
            "Cluster namespace",
            with_scope("Cluster", &["*"]),
            &r.ns,
            true,
        ),
        (
            "Namespaced namespace",
            with_scope("Namespaced", &["*"]),
            &r.ns,
            false,
        ),
        (
            "Cluster clusterrole",
            with_scope("Cluster", &["*"]),
            &r.clusterrole,
            true,
        ),
        (
            "Namespaced clusterrole",
            with_scope("Namespaced", &["*"]),
            &r.clusterrole,
            false,
        ),
        ("* scope", with_scope("*", &["*"]), &r.clusterrole, true),
        ("bogus scope", with_scope("Galaxy", &["*"]), &r.pod, false),
        // resourceNames
        (
            "resourceNames hit",
            with_names(&["other", "web"]),
            &r.pod,
            true,
        ),
        ("resourceNames miss", with_names(&["other"]), &r.pod, false),
    ];
    cases
        .into_iter()
        .map(|(name, rule, request, matches)| RuleCase {
            name,
            rule,
            request,
            matches,
        })
        .collect()
}

#[test]
fn resource_rule_fields() {
    let requests = rule_requests();
    let mut failures = Failures::new();
    for case in rule_cases(&requests) {
        let got = matches_rule(case.rule, case.request);
        failures.check_eq(case.name, "matches", got, case.matches);
    }
    failures.assert_none();
}

#[test]
fn exclude_resource_rules_win() {
    let mut p = policy("p", vec![pod_rule()]);
    p.match_constraints.exclude_resource_rules = vec![rule(&["UPDATE"], &[""], &["v1"], &["pods"])];
    assert!(matches_constraints(&p, &request("pod-create.json"), None).unwrap());
    assert!(!matches_constraints(&p, &request("pod-update.json"), None).unwrap());
    // No resourceRules: everything not excluded matches.
    p.match_constraints.resource_rules.clear();
    assert!(matches_constraints(&p, &request("configmap-create.json"), None).unwrap());
}

#[test]
fn match_policy_equivalent_and_exact() {
    // A request made against apps/v1beta1 that the API server converted to apps/v1.
    let mut req = request("deployment-create.json");
    req.request_resource = Some(GroupVersionResource::new("apps", "v1beta1", "deployments"));
    let v1 = rule(&["CREATE"], &["apps"], &["v1"], &["deployments"]);
    let v1beta1 = rule(&["CREATE"], &["apps"], &["v1beta1"], &["deployments"]);
    let cases = [
        (None, v1.clone(), true),
        (Some("Equivalent"), v1.clone(), true),
        (Some("Equivalent"), v1beta1.clone(), true),
        (Some("Exact"), v1, false),
        (Some("Exact"), v1beta1, true),
    ];
    for (mp, r, want) in cases {
        let mut p = policy("p", vec![r.clone()]);
        p.match_constraints.match_policy = mp.map(str::to_owned);
        assert_eq!(
            matches_constraints(&p, &req, None).unwrap(),
            want,
            "{mp:?} {:?}",
            r.api_versions
        );
    }
}

#[test]
fn namespace_selector() {
    let pod = request("pod-create.json");
    let prod = namespace(json!({"env": "prod"}));
    let dev = namespace(json!({"env": "dev"}));
    let mut p = policy("p", vec![rule(&["*"], &["*"], &["*"], &["*"])]);
    p.match_constraints.namespace_selector = Some(selector(&[("env", "prod")], vec![]));

    assert!(matches_constraints(&p, &pod, Some(&prod)).unwrap());
    assert!(!matches_constraints(&p, &pod, Some(&dev)).unwrap());
    assert_eq!(
        matches_constraints(&p, &pod, None).unwrap_err(),
        MatchError::NamespaceUnavailable {
            namespace: "default".into()
        }
    );

    // Cluster-scoped, non-Namespace requests always pass the namespaceSelector.
    let mut clusterrole = request("configmap-create.json");
    clusterrole.namespace = String::new();
    clusterrole.resource =
        GroupVersionResource::new("rbac.authorization.k8s.io", "v1", "clusterroles");
    assert!(matches_constraints(&p, &clusterrole, None).unwrap());

    // A Namespace is judged by its own labels (env=prod in the fixture), not a lookup.
    let ns = request("namespace-create.json");
    assert!(matches_constraints(&p, &ns, None).unwrap());
    p.match_constraints.namespace_selector = Some(selector(&[("env", "dev")], vec![]));
    assert!(!matches_constraints(&p, &ns, Some(&prod)).unwrap());

    // Deleting a Namespace: its labels come from oldObject.
    let mut ns_delete = request("namespace-create.json");
    ns_delete.operation = crate::admission::Operation::Delete;
    ns_delete.old_object = ns_delete.object.take();
    p.match_constraints.namespace_selector = Some(selector(&[("env", "prod")], vec![]));
    assert!(matches_constraints(&p, &ns_delete, None).unwrap());

    // An empty selector matches without needing the namespace.
    p.match_constraints.namespace_selector = Some(LabelSelector::default());
    assert!(matches_constraints(&p, &pod, None).unwrap());
}

#[test]
fn unknown_namespace_labels_leave_the_selector_to_the_api_server() {
    let mut pod = request("pod-create.json");
    let name_only = namespace(json!({"kubernetes.io/metadata.name": "default"}));
    let mut p = policy("p", vec![rule(&["*"], &["*"], &["*"], &["*"])]);
    p.match_constraints.namespace_selector = Some(selector(&[("env", "prod")], vec![]));
    // Known labels are judged by ivory.
    assert!(!matches_constraints(&p, &pod, Some(&name_only)).unwrap());
    // Unknown labels: the API server selected the request for this policy's webhook.
    pod.namespace_labels_unknown = true;
    assert!(matches_constraints(&p, &pod, Some(&name_only)).unwrap());
    assert!(matches_constraints(&p, &pod, None).unwrap());
    // The other constraints still apply.
    p.match_constraints.resource_rules = vec![rule(&["*"], &["apps"], &["v1"], &["deployments"])];
    assert!(!matches_constraints(&p, &pod, Some(&name_only)).unwrap());
}

#[test]
fn object_selector_uses_object_or_old_object() {
    let mut p = policy("p", vec![rule(&["*"], &[""], &["v1"], &["pods"])]);
    p.match_constraints.object_selector = Some(selector(&[("app", "web")], vec![]));
    assert!(matches_constraints(&p, &request("pod-create.json"), None).unwrap());
    assert!(matches_constraints(&p, &request("pod-delete.json"), None).unwrap());

    let mut relabelled = request("pod-update.json");
    (relabelled.object.as_mut().unwrap())
        .edit(|o| o["metadata"]["labels"] = json!({"app": "other"}));
    assert!(
        matches_constraints(&p, &relabelled, None).unwrap(),
        "old object still matches"
    );
    (relabelled.old_object.as_mut().unwrap()).edit(|o| o["metadata"]["labels"] = json!({}));
    assert!(!matches_constraints(&p, &relabelled, None).unwrap());

    p.match_constraints.object_selector = Some(selector(&[("app", "api")], vec![]));
    assert!(!matches_constraints(&p, &request("pod-create.json"), None).unwrap());

    p.match_constraints.object_selector = Some(selector(&[], vec![expr("app", "Bogus", &[])]));
    assert!(matches!(
        matches_constraints(&p, &request("pod-create.json"), None),
        Err(MatchError::InvalidSelector { .. })
    ));
}

#[test]
fn label_selector_operators() {
    let l = labels(&[("app", "web"), ("tier", "frontend")]);
    let cases: Vec<(&str, LabelSelector, bool)> = vec![
        ("empty", selector(&[], vec![]), true),
        ("matchLabels hit", selector(&[("app", "web")], vec![]), true),
        (
            "matchLabels miss",
            selector(&[("app", "api")], vec![]),
            false,
        ),
        (
            "matchLabels missing key",
            selector(&[("team", "a")], vec![]),
            false,
        ),
        (
            "In hit",
            selector(&[], vec![expr("app", "In", &["api", "web"])]),
            true,
        ),
        (
            "In miss",
            selector(&[], vec![expr("app", "In", &["api"])]),
            false,
        ),
        (
            "In missing key",
            selector(&[], vec![expr("team", "In", &["a"])]),
            false,
        ),
        (
            "NotIn hit",
            selector(&[], vec![expr("app", "NotIn", &["web"])]),
            false,
        ),
        (
            "NotIn miss",
            selector(&[], vec![expr("app", "NotIn", &["api"])]),
            true,
        ),
        (
            "NotIn missing key",
            selector(&[], vec![expr("team", "NotIn", &["a"])]),
            true,
        ),
        (
            "Exists",
            selector(&[], vec![expr("tier", "Exists", &[])]),
            true,
        ),
        (
            "Exists missing",
            selector(&[], vec![expr("team", "Exists", &[])]),
            false,
        ),
        (
            "DoesNotExist",
            selector(&[], vec![expr("team", "DoesNotExist", &[])]),
            true,
        ),
        (
            "DoesNotExist present",
            selector(&[], vec![expr("app", "DoesNotExist", &[])]),
            false,
        ),
        (
            "all must hold",
            selector(&[("app", "web")], vec![expr("tier", "In", &["backend"])]),
            false,
        ),
        (
            "all hold",
            selector(
                &[("app", "web")],
                vec![
                    expr("tier", "In", &["frontend"]),
                    expr("x", "DoesNotExist", &[]),
                ],
            ),
            true,
        ),
    ];
    for (name, s, want) in cases {
        assert_eq!(selector_matches(&s, &l, "sel").unwrap(), want, "{name}");
    }
    let invalid = [
        expr("app", "Equals", &["web"]),
        expr("app", "In", &[]),
        expr("app", "NotIn", &[]),
        expr("app", "Exists", &["web"]),
        expr("app", "DoesNotExist", &["web"]),
    ];
    for e in invalid {
        let err = selector_matches(&selector(&[], vec![e.clone()]), &l, "spec.x").unwrap_err();
        match err {
            MatchError::InvalidSelector { field, .. } => assert_eq!(field, "spec.x"),
            other => panic!("{e:?}: {other:?}"),
        }
    }
}

fn named(kind: PolicyKind, name: &str, ns: Option<&str>) -> CompiledPolicy {
    let mut p = policy(name, vec![pod_rule()]);
    p.kind = kind;
    p.namespace = ns.map(str::to_owned);
    p
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn select_policies_by_route() {
    use PolicyKind::{ImageValidatingPolicy as Ivp, NamespacedImageValidatingPolicy as Nivp};
    let mut with_autogen = named(Ivp, "a", None);
    let mut variant = named(Ivp, "a", None);
    variant.autogen_config = Some("defaults".into());
    with_autogen.autogen = vec![variant];
    let mut disabled = named(Ivp, "off", None);
    disabled = disabled.with_spec(PolicySpec {
        evaluation: Some(ivory_policy::types::Evaluation {
            admission: Some(ivory_policy::types::Enabled {
                enabled: Some(false),
            }),
            ..Default::default()
        }),
        ..PolicySpec::default()
    });
    let all: Vec<Arc<CompiledPolicy>> = vec![
        Arc::new(with_autogen),
        Arc::new(named(Ivp, "b", None)),
        Arc::new(named(Nivp, "a", Some("default"))),
        Arc::new(named(Nivp, "n", Some("default"))),
        Arc::new(named(Nivp, "n", Some("other"))),
        Arc::new(named(Nivp, "elsewhere", Some("other"))),
        Arc::new(disabled),
    ];
    let cluster = Route { namespaced: false };
    let namespaced = Route { namespaced: true };
    let describe = |v: Vec<&CompiledPolicy>| -> Vec<String> {
        v.iter()
            .map(|p| {
                format!(
                    "{}:{}:{}:{}",
                    p.kind.as_str(),
                    p.namespace.as_deref().unwrap_or("-"),
                    p.name,
                    p.autogen_config.as_deref().unwrap_or("-")
                )
            })
            .collect()
    };

    let got = select_policies(&all, cluster, &names(&["b", "a", "a"]), Some("default")).unwrap();
    assert_eq!(
        describe(got),
        vec![
            "ImageValidatingPolicy:-:b:-",
            "ImageValidatingPolicy:-:a:-",
            "ImageValidatingPolicy:-:a:defaults",
        ]
    );
    let got = select_policies(
        &all,
        namespaced,
        &names(&["n", "a", "elsewhere"]),
        Some("default"),
    )
    .unwrap();
    assert_eq!(
        describe(got),
        vec![
            "NamespacedImageValidatingPolicy:default:n:-",
            "NamespacedImageValidatingPolicy:default:a:-",
        ]
    );
    let got = select_policies(&all, namespaced, &names(&["n"]), None).unwrap();
    assert!(
        got.is_empty(),
        "cluster-scoped request on the namespaced route"
    );
    assert!(
        select_policies(&all, cluster, &names(&["off"]), None)
            .unwrap()
            .is_empty()
    );
    assert!(
        select_policies(&all, cluster, &[], None)
            .unwrap()
            .is_empty()
    );

    let err = select_policies(&all, cluster, &names(&["a", "n", "zz"]), None).unwrap_err();
    assert_eq!(err.names, names(&["n", "zz"]));
    assert_eq!(
        err.to_string(),
        "unknown ImageValidatingPolicy policies: n, zz"
    );
    let err = select_policies(&all, namespaced, &names(&["b"]), Some("default")).unwrap_err();
    assert_eq!(err.names, names(&["b"]));

    // Every policy of a route, as the one-shot commands take them.
    assert_eq!(
        describe(route_policies(&all, cluster, Some("default"))),
        vec![
            "ImageValidatingPolicy:-:a:-",
            "ImageValidatingPolicy:-:a:defaults",
            "ImageValidatingPolicy:-:b:-",
        ]
    );
    assert_eq!(
        describe(route_policies(&all, namespaced, Some("default"))),
        vec![
            "NamespacedImageValidatingPolicy:default:a:-",
            "NamespacedImageValidatingPolicy:default:n:-",
        ]
    );
    assert!(route_policies(&all, namespaced, None).is_empty());
}

/// A path naming a few policies (compared directly) and one naming many (looked up in a map)
/// select alike: in the path's order, repeats once, unknown names reported in order.
#[test]
fn few_and_many_names_select_alike() {
    use PolicyKind::ImageValidatingPolicy as Ivp;
    let all: Vec<Arc<CompiledPolicy>> = (0..20)
        .map(|i| Arc::new(named(Ivp, &format!("p{i}"), None)))
        .collect();
    let cluster = Route { namespaced: false };
    let selected = |path: &[&str]| {
        select_policies(&all, cluster, &names(path), None)
            .map(|v| v.iter().map(|p| p.name.clone()).collect::<Vec<_>>())
            .map_err(|e| e.names)
    };
    for many in [false, true] {
        let mut path = vec!["p7", "p2", "p7", "p0"];
        if many {
            path.extend(["p11", "p12", "p13", "p14", "p15", "p2", "p19"]);
        }
        assert_eq!(path.len() > super::FEW_NAMES, many);
        let mut expected = names(&["p7", "p2", "p0"]);
        if many {
            expected.extend(names(&["p11", "p12", "p13", "p14", "p15", "p19"]));
        }
        assert_eq!(selected(&path), Ok(expected), "many: {many}");
        path.extend(["zz", "p3", "yy", "zz"]);
        assert_eq!(selected(&path), Err(names(&["zz", "yy"])), "many: {many}");
    }
}

#[test]
fn match_conditions_bind_admission_variables() {
    let pod = request("pod-create.json");
    let prod = namespace(json!({"env": "prod"}));
    let cases = [
        ("object.metadata.name == 'web'", true),
        ("object.metadata.name == 'api'", false),
        ("request.operation == 'CREATE'", true),
        ("request.userInfo.username == 'alice'", true),
        ("oldObject == null", true),
        ("namespaceObject.metadata.labels.env == 'prod'", true),
    ];
    for (e, want) in cases {
        let mut p = policy("p", vec![pod_rule()]);
        p.match_conditions = vec![condition("c", e)];
        assert_eq!(
            matches_conditions(&p, &pod, Some(&prod), later()).unwrap(),
            want,
            "{e}"
        );
    }
    // All conditions must hold.
    let mut p = policy("p", vec![pod_rule()]);
    p.match_conditions = vec![
        condition("a", "true"),
        condition("b", "object.metadata.name == 'api'"),
    ];
    assert!(!matches_conditions(&p, &pod, None, later()).unwrap());
}

#[test]
fn match_condition_errors_follow_failure_policy() {
    let pod = request("pod-create.json");
    let mut p = policy("p", vec![pod_rule()]);
    p.match_conditions = vec![condition("broken", "object.spec.nothere == 1")];
    match matches_conditions(&p, &pod, None, later()).unwrap_err() {
        MatchError::Condition { name, .. } => assert_eq!(name, "broken"),
        other => panic!("{other:?}"),
    }
    p.failure_policy = FailurePolicy::Ignore;
    assert!(!matches_conditions(&p, &pod, None, later()).unwrap());
}
