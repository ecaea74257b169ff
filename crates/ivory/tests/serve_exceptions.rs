//! `ivory serve` with Kyverno's PolicyExceptions (the `exceptions` conformance scenarios),
//! against the real registry: inert unless `--enable-policy-exceptions`; once enabled, a
//! matching exception skips the policy in both stages (no verification, no pin), a
//! non-matching one changes nothing, and `--exception-namespace` confines where they count.

use ivory_testkit::{HarnessOptions, RegistryHarness};
use serde_json::Value;

use crate::util::{Ivory, Tls, VERIFY_SIGNED, fixtures, key_attestor, pod_review, policy};

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
        "--registry-ca".into(),
        dir.join("registry-ca.pem").display().to_string(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Ivory::start(&tls, &args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matching_exception_skips_the_policy_only_when_enabled() {
    let h = RegistryHarness::start(HarnessOptions::default())
        .await
        .unwrap();
    let tags = h
        .push_oci_layout(&fixtures().join("oci/ivory/unsigned"), "ivory/unsigned")
        .await
        .unwrap();
    let tagged = format!("{}/ivory/unsigned:v1", h.host());
    let pinned = format!("{}/ivory/unsigned@{}", h.host(), tags["v1"]);

    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
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
        on.logs()
            .contains("rule is skipped due to policy exception: team/allow-web"),
        "{}",
        on.logs()
    );
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
