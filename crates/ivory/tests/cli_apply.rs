//! `ivory apply` as a process: a Kyverno-style test case (policy + resources + expected
//! results) gives the same verdicts, patches and messages as `ivory serve` does for the same
//! objects through its mutating and validating webhooks.

use base64::Engine as _;
use ivory_testkit::review::object_review;
use serde_json::{Value, json};

use crate::cli_util::{
    check_images_policies, ivory, ivory_stdin, push_fixture, registry_and_ca, write,
};
use crate::util::Ivory;

/// The AdmissionReview the API server would send for `object`.
fn review(uid: &str, object: &Value) -> Value {
    object_review(uid, "CREATE", "default", object.clone())
}

/// Mutate, apply the patch, validate: what the API server does with ivory's two webhooks.
async fn through_serve(ivory: &Ivory, uid: &str, object: &Value) -> (Value, Value) {
    let resp = ivory
        .review("/ivpol/mutate/check-images", &review(uid, object))
        .await;
    let mut object = object.clone();
    if let Some(patch) = resp["patch"].as_str() {
        let ops: Value = serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(patch)
                .unwrap(),
        )
        .unwrap();
        for op in ops.as_array().unwrap() {
            *object.pointer_mut(op["path"].as_str().unwrap()).unwrap() = op["value"].clone();
        }
    }
    let resp = ivory
        .review("/ivpol/validate/check-images", &review(uid, &object))
        .await;
    (object, resp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kyverno_style_test_case_matches_serve() {
    let (h, dir, ca) = registry_and_ca().await;
    let (signed, signed_digest) = push_fixture(&h, "sig-p256").await;
    let (unsigned, unsigned_digest) = push_fixture(&h, "unsigned").await;
    let policies = check_images_policies(dir.path(), &h);
    // The test case: a signed Pod passes, an unsigned Deployment (autogen) fails.
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "signed", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": signed}]},
    });
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "unsigned", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {"containers": [{"name": "app", "image": unsigned}]},
            },
        },
    });
    let resources = format!(
        "{}---\n{}",
        serde_saphyr::to_string(&pod).unwrap(),
        serde_saphyr::to_string(&deployment).unwrap()
    );
    let resources = write(dir.path(), "resources.yaml", &resources);
    let expected = [
        (
            "Pod/default/signed",
            true,
            format!("{signed}@{signed_digest}"),
        ),
        (
            "Deployment/default/unsigned",
            false,
            format!("{unsigned}@{unsigned_digest}"),
        ),
    ];

    let run = ivory([
        "apply",
        "--policy",
        policies.to_str().unwrap(),
        "--resource",
        resources.to_str().unwrap(),
        "--registry-ca",
        ca.to_str().unwrap(),
        "-o",
        "json",
    ])
    .await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    assert_eq!(
        doc["summary"],
        json!({"resources": 2, "allowed": 1, "denied": 1, "error": 0})
    );
    let applied = doc["resources"].as_array().unwrap();
    for ((id, allowed, pinned), got) in expected.iter().zip(applied) {
        assert_eq!(got["resource"], *id);
        assert_eq!(got["allowed"], *allowed, "{got}");
        // The mutating stage pinned the image; the validating stage saw the pinned object.
        assert_eq!(got["patch"][0]["value"], *pinned, "{got}");
    }
    assert_eq!(
        applied[0]["object"]["spec"]["containers"][0]["image"],
        expected[0].2
    );
    assert_eq!(
        applied[1]["object"]["spec"]["template"]["spec"]["containers"][0]["image"],
        expected[1].2
    );
    assert_eq!(
        applied[1]["message"],
        "Policy check-images failed: failed the image Signature verification"
    );
    assert!(applied[0]["message"].is_null(), "{}", applied[0]);

    // The default output is the patched resource as YAML plus the decision; the policy
    // positional, as `kyverno apply <policy>` takes it.
    let run = ivory([
        "apply",
        policies.to_str().unwrap(),
        "--resource",
        resources.to_str().unwrap(),
        "--registry-ca",
        ca.to_str().unwrap(),
    ])
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stdout.contains(&format!("image: {}", expected[0].2)),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("# ALLOWED Pod/default/signed"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("# DENIED Deployment/default/unsigned"));
    assert!(run.stdout.contains("2 resources: 1 allowed, 1 denied"));

    // UPDATE from stdin: the policy's rules cover UPDATE, so the verdicts are the same.
    let pod_yaml = serde_saphyr::to_string(&pod).unwrap();
    let run = ivory_stdin(
        &[
            "apply",
            "--policy",
            policies.to_str().unwrap(),
            "--resource",
            "-",
            "--operation",
            "UPDATE",
            "--registry-ca",
            ca.to_str().unwrap(),
            "-o",
            "yaml",
        ],
        &pod_yaml,
    )
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let doc: Value = serde_saphyr::from_str(&run.stdout).unwrap();
    assert_eq!(doc["resources"][0]["object"], applied[0]["object"]);
    assert_eq!(doc["resources"][0]["policies"][0]["stage"], "mutate");

    // A policy that does not load is a configuration error naming the file.
    let broken = write(
        dir.path(),
        "broken.yaml",
        "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata: {name: b}\nspec: {}\n",
    );
    let run = ivory([
        "apply",
        "--policy",
        broken.to_str().unwrap(),
        "--resource",
        resources.to_str().unwrap(),
    ])
    .await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("broken.yaml"), "{}", run.stderr);

    // The same objects through `ivory serve`.
    let server = Ivory::start_in(
        dir.path(),
        &[
            "--policies".into(),
            policies.display().to_string(),
            "--registry-ca".into(),
            ca.display().to_string(),
        ],
    )
    .await;
    for (i, object) in [pod, deployment].iter().enumerate() {
        let (patched, resp) = through_serve(&server, &format!("uid-{i}"), object).await;
        assert_eq!(resp["allowed"], applied[i]["allowed"], "{resp}");
        assert_eq!(patched, applied[i]["object"]);
        let message = resp["status"]["message"].clone();
        assert_eq!(message, applied[i]["message"], "{resp}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_without_a_policy_is_a_usage_error_naming_both_forms() {
    let dir = tempfile::tempdir().unwrap();
    let resource = write(dir.path(), "pod.yaml", "apiVersion: v1\nkind: Pod\n");
    let run = ivory(["apply", "--resource", resource.to_str().unwrap()]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("<POLICY|--policy <FILE>>"),
        "{}",
        run.stderr
    );
}

/// The chainsaw test of Kyverno's library policy `other/verify-image-ivpol`
/// (`fixtures/kyverno-library/other/verify-image-ivpol/.chainsaw-test/`: in a cluster, `good.yaml`
/// is admitted and `bad.yaml` refused), run offline with `ivory apply` (both webhooks, as the
/// API server calls them): its images are on ghcr.io, signed by a Notation test certificate
/// whose private key is not public, so the registry harness serves, through
/// `--registry-mirror ghcr.io=<harness>`, `ghcr.io/kyverno/test-verify-image:signed` signed by the
/// tests' Notation PKI (`fixtures/notation`: JWS, P-256 leaf) and `:unsigned` without a
/// signature, and the policy's `certs` is that PKI's root. The policy's other fields and the
/// Pods are the library's, unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kyverno_library_ivpol_chainsaw_steps_pass_offline_with_the_tests_notation_signer() {
    let library = ivory_testkit::fixtures_dir().join("kyverno-library/other/verify-image-ivpol");
    let notation = ivory_testkit::fixtures_dir().join("notation");
    let (h, dir, ca) = registry_and_ca().await;
    let repo = "kyverno/test-verify-image";
    for (layout, tag) in [
        ("notation-jws", "signed"),
        ("notation-unsigned", "unsigned"),
    ] {
        let layout = notation.join("oci/ivory").join(layout);
        let tags = h.push_oci_layout(&layout, repo).await.unwrap();
        crate::cli_util::retag_layout(&h, &layout, repo, &tags["v1"], tag).await;
    }
    let text = std::fs::read_to_string(library.join("verify-image-ivpol.yaml")).unwrap();
    let with_root = |pem_file: &str| {
        let (head, rest) = text
            .split_once("        certs:\n          value: |-\n")
            .unwrap();
        let end = rest.find("-----END CERTIFICATE-----").unwrap() + 25;
        let pem = std::fs::read_to_string(notation.join("pki").join(pem_file)).unwrap();
        let indented: Vec<String> = pem
            .trim()
            .lines()
            .map(|l| format!("            {l}"))
            .collect();
        format!(
            "{head}        certs:\n          value: |-\n{}{}",
            indented.join("\n"),
            &rest[end..]
        )
    };
    let mirror = format!("ghcr.io={}", h.host());
    let apply = |policy: std::path::PathBuf, pod: &str| {
        let pod = library.join(".chainsaw-test").join(pod);
        let args = [
            "apply".to_owned(),
            "--policy".into(),
            policy.display().to_string(),
            "--resource".into(),
            pod.display().to_string(),
            "--registry-ca".into(),
            ca.display().to_string(),
            "--registry-mirror".into(),
            mirror.clone(),
            "--no-cache".into(),
        ];
        async move { ivory(args).await }
    };
    let policy = write(dir.path(), "policy.yaml", &with_root("root.pem"));
    let good = apply(policy.clone(), "good.yaml").await;
    assert_eq!(good.code, 0, "{}\n{}", good.stdout, good.stderr);
    assert!(
        good.stdout
            .contains("ghcr.io/kyverno/test-verify-image:signed@sha256:"),
        "{}",
        good.stdout
    );
    let bad = apply(policy, "bad.yaml").await;
    assert_eq!(bad.code, 1, "{}\n{}", bad.stdout, bad.stderr);
    assert!(
        bad.stdout.contains("failed the verification"),
        "{}\n{}",
        bad.stdout,
        bad.stderr
    );
    // The signature is what admits the good Pod: another root refuses it.
    let other = write(dir.path(), "other.yaml", &with_root("other-root.pem"));
    let refused = apply(other, "good.yaml").await;
    assert_eq!(refused.code, 1, "{}\n{}", refused.stdout, refused.stderr);
}
