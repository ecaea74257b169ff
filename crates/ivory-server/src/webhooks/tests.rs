use ivory_policy::{default_policy, load_str};

use super::*;

fn policy(kind: &str, name: &str, extra: &str) -> CompiledPolicy {
    let ns = if kind.starts_with("Namespaced") {
        "\n  namespace: team-a"
    } else {
        ""
    };
    let text = format!(
        "apiVersion: policies.kyverno.io/v1\nkind: {kind}\nmetadata:\n  name: {name}{ns}\nspec:\n  matchConstraints:\n    resourceRules:\n      - apiGroups: [\"\"]\n        apiVersions: [v1]\n        operations: [CREATE]\n        resources: [pods]\n  attestors: []\n  validations:\n    - expression: \"true\"\n{extra}"
    );
    let report = load_str(&text, name);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().next().unwrap()
}

fn names(cfg: &Value) -> Vec<&str> {
    cfg["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect()
}

#[test]
fn default_policy_basic_webhooks() {
    let mut opts = Options::for_service("ivory", "ivory", 443);
    opts.ca_bundle_pem = Some(b"PEM".to_vec());
    let (m, v) = generate(&[default_policy()], &opts);
    assert_eq!(m["kind"], "MutatingWebhookConfiguration");
    assert_eq!(names(&m), ["ivpol.mutate.ivory.svc-fail"]);
    assert_eq!(names(&v), ["ivpol.validate.ivory.svc-fail"]);
    let hook = &m["webhooks"][0];
    assert_eq!(hook["reinvocationPolicy"], "IfNeeded");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["timeoutSeconds"], 10);
    assert_eq!(
        hook["clientConfig"],
        json!({"service": {"namespace": "ivory", "name": "ivory", "port": 443,
               "path": "/ivpol/mutate/ivory-pin-digests"}, "caBundle": "UEVN"})
    );
    assert!(v["webhooks"][0].get("reinvocationPolicy").is_none());
    // The pod rule plus the autogen rules for controllers and cronjobs.
    let rules = hook["rules"].as_array().unwrap();
    let resources: Vec<&Value> = rules.iter().map(|r| &r["resources"]).collect();
    assert!(
        resources.contains(&&json!(["pods", "pods/ephemeralcontainers"])),
        "{rules:?}"
    );
    assert!(resources.contains(&&json!(["cronjobs"])), "{rules:?}");
    assert!(
        resources.contains(&&json!([
            "daemonsets",
            "deployments",
            "replicasets",
            "statefulsets"
        ])),
        "{rules:?}"
    );
    assert!(rules.iter().all(|r| r["scope"] == "*"));
}

#[test]
fn fail_ignore_split_fine_grained_and_namespaced() {
    let a = policy("ImageValidatingPolicy", "b-pol", "  failurePolicy: Fail\n");
    let b = policy("ImageValidatingPolicy", "a-pol", "  failurePolicy: Fail\n");
    let c = policy(
        "ImageValidatingPolicy",
        "ignored",
        "  failurePolicy: Ignore\n",
    );
    let d = policy(
        "ImageValidatingPolicy",
        "slow",
        "  webhookConfiguration:\n    timeoutSeconds: 3\n",
    );
    let e = policy("NamespacedImageValidatingPolicy", "team", "");
    let mut opts = Options::for_service("ivory", "ivory", 443);
    opts.target = Target::Url("https://127.0.0.1:8443/".into());
    let (m, v) = generate(&[a, b, c, d, e], &opts);
    assert_eq!(
        names(&v),
        [
            "ivpol.validate.ivory.svc-fail",
            "ivpol.validate.ivory.svc-fail-finegrained-slow",
            "ivpol.validate.ivory.svc-ignore",
            "nivpol.validate.ivory.svc-fail",
        ]
    );
    let hooks = v["webhooks"].as_array().unwrap();
    assert_eq!(
        hooks[0]["clientConfig"]["url"],
        "https://127.0.0.1:8443/ivpol/validate/a-pol/b-pol"
    );
    assert_eq!(hooks[1]["timeoutSeconds"], 3);
    assert_eq!(
        hooks[1]["clientConfig"]["url"],
        "https://127.0.0.1:8443/ivpol/validate/slow"
    );
    assert_eq!(hooks[2]["failurePolicy"], "Ignore");
    assert_eq!(
        hooks[3]["namespaceSelector"],
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]})
    );
    assert_eq!(
        hooks[3]["clientConfig"]["url"],
        "https://127.0.0.1:8443/nivpol/validate/team"
    );
    // Policies without mutateDigest (the API default is true) still get mutating hooks.
    assert_eq!(names(&m).len(), 4);
}

#[test]
fn a_policy_with_a_namespace_selector_gets_its_own_webhook() {
    let with_selector = |kind: &str, name: &str| {
        let mut p = policy(kind, name, "");
        p.match_constraints.namespace_selector = Some(LabelSelector {
            match_labels: [("env".to_owned(), "prod".to_owned())].into(),
            ..LabelSelector::default()
        });
        p
    };
    let prod_a = with_selector("ImageValidatingPolicy", "prod-a");
    let prod_b = with_selector("ImageValidatingPolicy", "prod-b");
    let plain = policy("ImageValidatingPolicy", "plain", "");
    let team = with_selector("NamespacedImageValidatingPolicy", "team");
    let opts = Options::for_service("ivory", "ivory", 443);
    let (_, v) = generate(&[prod_a, prod_b, plain, team], &opts);
    assert_eq!(
        names(&v),
        [
            "ivpol.validate.ivory.svc-fail",
            "ivpol.validate.ivory.svc-fail-finegrained-prod-a",
            "ivpol.validate.ivory.svc-fail-finegrained-prod-b",
            "nivpol.validate.ivory.svc-fail-finegrained-team-a-team",
        ]
    );
    let hooks = v["webhooks"].as_array().unwrap();
    assert_eq!(
        hooks[0]["clientConfig"]["service"]["path"],
        "/ivpol/validate/plain"
    );
    assert_eq!(
        hooks[1]["clientConfig"]["service"]["path"],
        "/ivpol/validate/prod-a"
    );
    assert_eq!(
        hooks[1]["namespaceSelector"],
        json!({"matchLabels": {"env": "prod"}})
    );
    assert_eq!(
        hooks[3]["namespaceSelector"],
        json!({"matchLabels": {"env": "prod"}, "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]})
    );
}

#[test]
fn compatible_match_conditions_are_offloaded_with_autogen() {
    let p = policy(
        "ImageValidatingPolicy",
        "cond",
        "  matchConditions:\n    - name: not-system\n      expression: \"object.metadata.namespace != 'kube-system'\"\n",
    );
    let (_, v) = generate(&[p], &Options::for_service("ivory", "ivory", 443));
    let hook = &v["webhooks"][0];
    assert_eq!(
        hook["name"],
        "ivpol.validate.ivory.svc-fail-finegrained-cond"
    );
    let conds = hook["matchConditions"].as_array().unwrap();
    let names: Vec<&str> = conds.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "autogen-not-system",
            "autogen-cronjobs-not-system",
            "autogen-defaults-not-system"
        ]
    );
    assert!(
        conds[1]["expression"]
            .as_str()
            .unwrap()
            .contains("object.kind =='CronJob'"),
        "{conds:?}"
    );

    let q = policy(
        "ImageValidatingPolicy",
        "nsobj",
        "  matchConditions:\n    - name: labelled\n      expression: \"has(namespaceObject.metadata.labels)\"\n",
    );
    let (_, v) = generate(&[q], &Options::for_service("ivory", "ivory", 443));
    assert_eq!(names_of(&v), ["ivpol.validate.ivory.svc-fail"]);
}

fn names_of(v: &Value) -> Vec<String> {
    names(v).into_iter().map(str::to_owned).collect()
}

/// `kubectl debug` (UPDATE of pods/ephemeralcontainers) reaches ivory for every policy that
/// selects pods, in both stages, even when the policy lists only `pods`.
#[test]
fn pod_policies_register_the_ephemeral_containers_subresource() {
    let opts = Options::for_service("ivory", "ivory", 443);
    let basic = policy("ImageValidatingPolicy", "basic", "");
    let fine = policy(
        "NamespacedImageValidatingPolicy",
        "fine",
        "  webhookConfiguration:\n    timeoutSeconds: 5\n",
    );
    let (m, v) = generate(&[basic, fine], &opts);
    for cfg in [&m, &v] {
        let hooks = cfg["webhooks"].as_array().unwrap();
        assert_eq!(hooks.len(), 2, "{cfg:#}");
        for hook in hooks {
            let rules = hook["rules"].as_array().unwrap();
            assert!(
                rules.contains(&json!({
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE"],
                    "resources": ["pods/ephemeralcontainers"],
                    "scope": "*",
                })),
                "{}: {rules:#?}",
                hook["name"]
            );
        }
    }
}

#[test]
fn no_patch_policies_get_no_mutating_webhook() {
    let with_annotation = |name: &str, mode: &str| {
        let text = format!(
            "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata:\n  name: {name}\n  annotations:\n    ivory.dev/digest-pinning: {mode}\nspec:\n  matchConstraints:\n    resourceRules:\n      - apiGroups: [\"\"]\n        apiVersions: [v1]\n        operations: [CREATE, UPDATE]\n        resources: [pods]\n  attestors: []\n  validations:\n    - expression: \"true\"\n"
        );
        let report = load_str(&text, name);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        report.policies.into_iter().next().unwrap()
    };
    let opts = Options::for_service("ivory", "ivory", 443);
    let (m, v) = generate(&[with_annotation("verify-only", "no-patch")], &opts);
    assert!(names(&m).is_empty(), "{m}");
    assert_eq!(names(&v), ["ivpol.validate.ivory.svc-fail"]);
    // pods-only still pins Pods, so it keeps its mutating webhook.
    let (m, _) = generate(&[with_annotation("pods", "pods-only")], &opts);
    assert_eq!(names(&m), ["ivpol.mutate.ivory.svc-fail"]);
}
