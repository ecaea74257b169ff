//! `ivory serve` with Kyverno's PolicyExceptions (the `exceptions` conformance scenarios),
//! against the real registry: inert unless `--enable-policy-exceptions`; once enabled, a
//! matching exception skips the policy in both stages (no verification, no pin), a
//! non-matching one changes nothing, and `--exception-namespace` confines where they count.

use ivory_testkit::RegistryHarness;
use ivory_testkit::policy::NO_IMAGE_CHECKS;
use serde_json::Value;

use crate::util::{Ivory, Tls, VERIFY_SIGNED, key_attestor, pod_review, policies_dir, policy};
use ivory_testkit::fixtures_dir;

const VALIDATE: &str = "/ivpol/validate/require-signed";
const MUTATE: &str = "/ivpol/mutate/require-signed";
const DENIED: &str = "Policy require-signed failed: failed the image Signature verification";

/// A PolicyException in `namespace` exempting pods named `pod` from `require-signed`.
fn exception(namespace: &str, pod: &str) -> String {
    format!(
        "apiVersion: policies.kyverno.io/v1beta1
kind: PolicyException
metadata:
  name: allow-{pod}
  namespace: {namespace}
spec:
  policyRefs:
    - name: require-signed
      kind: ImageValidatingPolicy
  matchConditions:
    - name: by-name
      expression: \"object.metadata.name == '{pod}'\"
"
    )
}

/// A pod review named `name` (the helper's pod is `web`).
fn named_review(uid: &str, name: &str, image: &str) -> Value {
    let mut review = pod_review(uid, &[image]);
    review["request"]["name"] = name.into();
    review["request"]["object"]["metadata"]["name"] = name.into();
    review
}

async fn start(dir: &std::path::Path, extra: &[&str]) -> Ivory {
    let tls = Tls::write(dir, "ivory test CA");
    let mut args: Vec<String> = vec![
        "--policies".into(),
        dir.join("policies").display().to_string(),
    ];
    let registry_ca = dir.join("registry-ca.pem");
    if registry_ca.exists() {
        args.extend(["--registry-ca".into(), registry_ca.display().to_string()]);
    }
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Ivory::start(&tls, &args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matching_exception_skips_the_policy_only_when_enabled() {
    let h = RegistryHarness::start_default().await.unwrap();
    let tags = h
        .push_oci_layout(&fixtures_dir().join("oci/ivory/unsigned"), "ivory/unsigned")
        .await
        .unwrap();
    let tagged = format!("{}/ivory/unsigned:v1", h.host());
    let pinned = format!("{}/ivory/unsigned@{}", h.host(), tags["v1"]);

    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let body = format!("{}{VERIFY_SIGNED}", key_attestor());
    let glob = format!("{}/*", h.host());
    std::fs::write(
        policies.join("policy.yaml"),
        policy("require-signed", &glob, &body),
    )
    .unwrap();
    std::fs::write(policies.join("exception.yaml"), exception("team", "web")).unwrap();
    std::fs::write(dir.path().join("registry-ca.pem"), h.ca_pem()).unwrap();

    // Off by default: the exception is loaded but inert, as in Kyverno without
    // --enablePolicyException (policy-exceptions-disabled conformance test).
    let off = start(dir.path(), &[]).await;
    let resp = off
        .review(VALIDATE, &named_review("d-1", "web", &pinned))
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["message"], DENIED, "{resp}");
    let resp = off
        .review(MUTATE, &named_review("d-2", "web", &tagged))
        .await;
    assert!(
        resp["patch"].is_string(),
        "pinned without exceptions: {resp}"
    );
    drop(off);

    let on = start(dir.path(), &["--enable-policy-exceptions"]).await;
    // The exempted pod: allowed without verification, and not pinned.
    let resp = on
        .review(VALIDATE, &named_review("e-1", "web", &pinned))
        .await;
    assert_eq!(resp["allowed"], true, "{resp}\n{}", on.logs());
    let resp = on
        .review(MUTATE, &named_review("e-2", "web", &tagged))
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert!(
        resp.get("patch").is_none_or(Value::is_null),
        "no pin for an excepted pod: {resp}"
    );
    // Another pod: the policy still applies.
    let resp = on
        .review(VALIDATE, &named_review("e-3", "api", &pinned))
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["message"], DENIED, "{resp}");
    let resp = on
        .review(MUTATE, &named_review("e-4", "api", &tagged))
        .await;
    assert!(resp["patch"].is_string(), "{resp}");
    // The skip is logged with Kyverno's text.
    assert!(
        ivory_testkit::eventually(
            "the exception's skip to be logged",
            std::time::Duration::from_secs(10),
            || async {
                on.logs()
                    .contains("rule is skipped due to policy exception: team/allow-web")
            }
        )
        .await
        .is_ok(),
        "{}",
        on.logs()
    );
    // Results are counted per policy, result and cause (kyverno_policy_results_total).
    let metrics = on.metrics().await;
    for result in ["skip", "fail"] {
        let line = format!(
            "ivory_policy_results_total{{policy_name=\"require-signed\",policy_namespace=\"\",rule_result=\"{result}\",rule_execution_cause=\"admission_request\"}} 1"
        );
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    drop(on);

    // --exception-namespace: an exception elsewhere does not count.
    let confined = start(
        dir.path(),
        &[
            "--enable-policy-exceptions",
            "--exception-namespace",
            "kyverno",
        ],
    )
    .await;
    let resp = confined
        .review(VALIDATE, &named_review("n-1", "web", &pinned))
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
}

/// Kyverno's scenario files (`tests/data/kyverno-exceptions/`, see its README).
fn scenario(path: &str) -> String {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kyverno-exceptions")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// Kyverno's scenario policy `name` with its match rules, condition and actions, its notary
/// check replaced by one that fails with the same message (see the data README).
fn stand_in(name: &str, resources: &str, condition: bool, action: &str) -> String {
    let condition = if condition {
        "  matchConditions:
    - name: check-prod-label
      expression: >-
        has(object.metadata.labels) && has(object.metadata.labels.prod) && object.metadata.labels.prod == 'true'
"
    } else {
        ""
    };
    format!(
        "apiVersion: policies.kyverno.io/v1beta1
kind: ImageValidatingPolicy
metadata:
  name: {name}
spec:
  failurePolicy: Ignore
  validationActions: [{action}]
  matchConstraints:
    resourceRules:
      - {resources}
{condition}  matchImageReferences:
    - glob: ghcr.io/*
{NO_IMAGE_CHECKS}  validations:
    - expression: \"false\"
      message: failed to verify image with notary cert
"
    )
}

/// `yaml` (one object without a namespace) placed in `namespace`.
fn in_namespace(yaml: &str, namespace: &str) -> String {
    yaml.replacen(
        "metadata:\n",
        &format!("metadata:\n  namespace: {namespace}\n"),
        1,
    )
}

/// A CREATE review in namespace `default` of every object in a scenario file.
fn reviews_of(yaml: &str) -> Vec<(String, Value)> {
    yaml.split("\n---")
        .filter_map(|doc| ivory_policy::yaml::from_str::<Value>(doc).ok())
        .filter(|v| !v.is_null())
        .map(|object| {
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let (group, resource) = match kind.as_str() {
                "Pod" => ("", "pods"),
                "Deployment" => ("apps", "deployments"),
                "StatefulSet" => ("apps", "statefulsets"),
                "CronJob" => ("batch", "cronjobs"),
                other => panic!("no resource for kind {other}"),
            };
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let review = serde_json::json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": format!("{kind}-{name}"),
                    "kind": {"group": group, "version": "v1", "kind": kind},
                    "resource": {"group": group, "version": "v1", "resource": resource},
                    "name": name, "namespace": "default", "operation": "CREATE",
                    "userInfo": {"username": "alice"},
                    "object": object,
                },
            });
            (format!("{kind}/{name}"), review)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kyvernos_exception_scenarios_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let pods = "{apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE], resources: [pods]}";
    let deployments = "{apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments]}";
    for (file, text) in [
        ("regular.yaml", stand_in("ivpol-sample", pods, true, "Deny")),
        ("regular-exception.yaml", scenario("regular/exception.yaml")),
        (
            "autogen.yaml",
            stand_in("ivpol-autogen-sample", pods, false, "Deny"),
        ),
        // Kyverno runs each scenario in its own namespace: the two `check-name` exceptions
        // would clash in one.
        (
            "autogen-exception.yaml",
            in_namespace(&scenario("autogen/exception.yaml"), "autogen"),
        ),
        (
            "report.yaml",
            stand_in(
                "ivpol-report-background-sample",
                deployments,
                false,
                "Audit",
            ),
        ),
        (
            "report-exception.yaml",
            scenario("report-with-exception/exception.yaml"),
        ),
    ] {
        std::fs::write(policies.join(file), text).unwrap();
    }
    let ivory = start(dir.path(), &["--enable-policy-exceptions"]).await;
    let denied =
        |policy: &str| format!("Policy {policy} failed: failed to verify image with notary cert");

    // exceptions/regular: the bad pod is denied, the skipped pod is not.
    for (what, review) in reviews_of(&scenario("regular/bad-pod.yaml")) {
        let resp = ivory.review("/ivpol/validate/ivpol-sample", &review).await;
        assert_eq!(resp["allowed"], false, "{what}: {resp}");
        assert_eq!(resp["status"]["message"], denied("ivpol-sample"), "{what}");
    }
    for (what, review) in reviews_of(&scenario("regular/skipped-pod.yaml")) {
        let resp = ivory.review("/ivpol/validate/ivpol-sample", &review).await;
        assert_eq!(resp["allowed"], true, "{what}: {resp}\n{}", ivory.logs());
    }
    // exceptions/autogen: the exception covers the autogen variants of the pod policy.
    for (what, review) in reviews_of(&scenario("autogen/bad-resources.yaml")) {
        let resp = ivory
            .review("/ivpol/validate/ivpol-autogen-sample", &review)
            .await;
        assert_eq!(resp["allowed"], false, "{what}: {resp}");
    }
    let skipped = reviews_of(&scenario("autogen/skipped-resources.yaml"));
    assert_eq!(skipped.len(), 3);
    for (what, review) in skipped {
        let resp = ivory
            .review("/ivpol/validate/ivpol-autogen-sample", &review)
            .await;
        assert_eq!(resp["allowed"], true, "{what}: {resp}\n{}", ivory.logs());
    }
    // exceptions/wrong-exception: an exception naming another policy changes nothing.
    std::fs::write(
        policies.join("wrong-exception.yaml"),
        in_namespace(&scenario("wrong-exception/exception.yaml"), "wrong"),
    )
    .unwrap();
    let logs_before = ivory.logs().len();
    assert!(
        ivory_testkit::eventually(
            "the policies to be reloaded",
            std::time::Duration::from_secs(10),
            || async { ivory.logs()[logs_before..].contains("policies loaded") }
        )
        .await
        .is_ok(),
        "{}",
        ivory.logs()
    );
    for (what, review) in reviews_of(&scenario("wrong-exception/skipped-deployment.yaml")) {
        let resp = ivory.review("/ivpol/validate/ivpol-sample", &review).await;
        assert_eq!(resp["allowed"], false, "{what}: {resp}");
        assert_eq!(resp["status"]["message"], denied("ivpol-sample"), "{what}");
    }
    // report/with-exception: Audit admits both; the skipped Deployment's result is `skip`
    // naming the exception, the bad one's `fail` (what the scenario's reports assert).
    for (file, result) in [
        ("report-with-exception/skipped-deployment.yaml", "skip"),
        ("report-with-exception/bad-deployment.yaml", "fail"),
    ] {
        for (what, review) in reviews_of(&scenario(file)) {
            let resp = ivory
                .review("/ivpol/validate/ivpol-report-background-sample", &review)
                .await;
            assert_eq!(resp["allowed"], true, "{what}: {resp}");
            let uid = review["request"]["uid"].as_str().unwrap().to_owned();
            // The log is read from ivory's stderr as it comes: wait for the line.
            let find = || {
                ivory
                    .logs()
                    .lines()
                    .find(|l| {
                        l.contains("policy result")
                            && l.contains(&uid)
                            && l.contains("ivpol-report-background-sample")
                    })
                    .map(str::to_owned)
            };
            // Found or not, the asserts below say what was logged.
            let _found = ivory_testkit::eventually(
                "the result to be logged",
                std::time::Duration::from_secs(10),
                || async { find().is_some() },
            )
            .await;
            let line = find().unwrap_or_default();
            let line: Value = serde_json::from_str(&line).unwrap_or_default();
            assert_eq!(
                line["fields"]["result"],
                result,
                "{what}: {line}\n{}",
                ivory.logs()
            );
            if result == "skip" {
                assert_eq!(
                    line["fields"]["properties"],
                    "exceptions=exclude-skipped-deployment"
                );
                assert_eq!(
                    line["fields"]["policy_message"],
                    "rule is skipped due to policy exception: default/exclude-skipped-deployment"
                );
            }
            // One `message` per line: the line's own.
            assert_eq!(line["fields"]["message"], "policy result", "{line}");
            // The admission's own line, written the same way, with its fields typed: the last
            // one of this uid (earlier routes judged the same review), written with the result's
            // before the answer left.
            let admission = ivory
                .logs()
                .lines()
                .rev()
                .find(|l| l.contains("\"message\":\"admission\"") && l.contains(&uid))
                .map(str::to_owned)
                .unwrap_or_default();
            let line: Value = serde_json::from_str(&admission).unwrap_or_default();
            let fields = &line["fields"];
            assert_eq!(fields["outcome"], "allowed", "{line}");
            assert_eq!(fields["route"], "ivpol_validate", "{line}");
            assert_eq!(fields["dry_run"], false, "{line}");
            assert!(fields["elapsed_ms"].is_u64(), "{line}");
            assert_eq!(fields["warnings"].as_u64(), Some(0), "{line}");
        }
    }
}
