//! `ivory webhooks`: configurations for the loaded policies, as YAML on stdout.

use std::process::Command;

use base64::Engine as _;
use serde_json::Value;

use crate::util::{BIN, policy};

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("webhooks")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn documents(text: &str) -> Vec<Value> {
    text.split("---\n")
        .map(|doc| serde_saphyr::from_str(doc).unwrap())
        .collect()
}

#[test]
fn prints_both_configurations_for_the_policies() {
    let dir = tempfile::tempdir().unwrap();
    let body = "  failurePolicy: Ignore\n  webhookConfiguration:\n    timeoutSeconds: 5\n  attestors: []\n  validations:\n    - expression: \"true\"\n";
    std::fs::write(dir.path().join("p.yaml"), policy("slow-one", "*", body)).unwrap();
    std::fs::write(dir.path().join("ca.pem"), "CA PEM").unwrap();
    let policies = dir.path().display().to_string();
    let ca = dir.path().join("ca.pem").display().to_string();
    let (code, stdout, stderr) = run(&[
        "--policies",
        &policies,
        "--url",
        "https://ivory.example:8443",
        "--ca-bundle",
        &ca,
    ]);
    assert_eq!(code, 0, "{stderr}");
    let docs = documents(&stdout);
    assert_eq!(docs.len(), 2, "{stdout}");
    assert_eq!(docs[0]["kind"], "MutatingWebhookConfiguration");
    assert_eq!(docs[1]["kind"], "ValidatingWebhookConfiguration");
    for (doc, stage) in docs.iter().zip(["mutate", "validate"]) {
        let hook = &doc["webhooks"][0];
        assert_eq!(
            hook["name"],
            format!("ivpol.{stage}.ivory.svc-ignore-finegrained-slow-one")
        );
        assert_eq!(
            hook["clientConfig"]["url"],
            format!("https://ivory.example:8443/ivpol/{stage}/slow-one")
        );
        assert_eq!(
            hook["clientConfig"]["caBundle"],
            base64::engine::general_purpose::STANDARD.encode("CA PEM")
        );
        assert_eq!(hook["timeoutSeconds"], 5);
        assert_eq!(hook["failurePolicy"], "Ignore");
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(
            hook["namespaceSelector"],
            serde_json::json!({"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
            ]})
        );
    }
    assert_eq!(docs[0]["webhooks"][0]["reinvocationPolicy"], "IfNeeded");
}

#[test]
fn default_policy_and_errors() {
    let (code, stdout, _) = run(&["--service-namespace", "sec", "--service-port", "8443"]);
    assert_eq!(code, 0);
    let docs = documents(&stdout);
    let service = &docs[1]["webhooks"][0]["clientConfig"]["service"];
    assert_eq!(service["namespace"], "sec");
    assert_eq!(service["port"], 8443);
    assert_eq!(service["path"], "/ivpol/validate/ivory-pin-digests");
    // kube-system and ivory's own namespace are never gated.
    let excluded: Vec<&Value> = docs[0]["webhooks"][0]["namespaceSelector"]["matchExpressions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["values"][0])
        .collect();
    assert_eq!(excluded, ["kube-system", "sec"]);

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata: {name: x}\nspec: {validations: 1}\n").unwrap();
    let (code, stdout, stderr) = run(&["--policies", &bad.display().to_string()]);
    assert_eq!(code, 2);
    assert!(stdout.is_empty());
    assert!(stderr.contains("bad.yaml"), "{stderr}");
}

/// What the printed webhooks will never send to ivory is said on stderr: the default
/// kube-system exclusion (removable), and a policy's CREATE-only rule.
#[test]
fn exclusions_and_create_only_rules_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let body = "  attestors: []\n  validations:\n    - expression: \"true\"\n";
    let create_only = policy("create-only", "*", body)
        .replace("operations: [CREATE, UPDATE]", "operations: [CREATE]");
    std::fs::write(dir.path().join("p.yaml"), create_only).unwrap();
    let policies = dir.path().display().to_string();
    let (code, stdout, stderr) = run(&["--policies", &policies]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("exclude namespace(s) kube-system"),
        "{stderr}"
    );
    assert!(
        stderr.contains("create-only: spec.matchConstraints.resourceRules[0] selects pods for CREATE but not UPDATE"),
        "{stderr}"
    );
    assert!(stdout.contains("kube-system"), "{stdout}");

    let (code, stdout, stderr) = run(&["--policies", &policies, "--exclude-namespace="]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("exclude namespace"), "{stderr}");
    assert!(!stdout.contains("kube-system"), "{stdout}");
    // ivory's own namespace stays excluded.
    assert!(stdout.contains("- ivory"), "{stdout}");
}
