//! `ivory convert` as a process: the legacy corpus under `fixtures/legacy/` converts, the
//! output loads, and the converted policy judges Pods on the real registry harness as Kyverno's
//! legacy rule is documented to (signed passes, wrong key and unsigned fail, a skipped image
//! passes); refused rules are named and nothing is written.

use ivory_testkit::{HarnessOptions, RegistryHarness};

use crate::cli_util::{ivory, push_fixture, write, write_ca};
use crate::util::fixtures;

fn pod(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  containers:\n  - name: app\n    image: {image}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_signed_legacy_policy_converts_and_judges_like_kyverno() {
    let h = RegistryHarness::start(HarnessOptions::default())
        .await
        .unwrap();
    let (signed, _) = push_fixture(&h, "sig-p256").await;
    let (wrong_key, _) = push_fixture(&h, "sig-wrong-key").await;
    let (unsigned, _) = push_fixture(&h, "unsigned").await;
    let dir = tempfile::tempdir().unwrap();
    let ca = write_ca(dir.path(), &h);
    let legacy = std::fs::read_to_string(fixtures().join("legacy/key-signed.yaml"))
        .unwrap()
        .replace("REGISTRY_HOST", &h.host());
    let input = write(dir.path(), "legacy.yaml", &legacy);
    let out = dir.path().join("converted");
    let run = ivory([
        "convert",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("rule verify-signature -> check-image-keys-verify-signature"),
        "{}",
        run.stderr
    );
    let policy = out.join("check-image-keys-verify-signature.yaml");
    assert!(policy.exists(), "{}", run.stderr);

    // (image, allowed): Kyverno's legacy rule verifies imageReferences minus the skipped ones.
    let cases = [(&signed, true), (&wrong_key, false), (&unsigned, true)];
    for (i, (image, allowed)) in cases.into_iter().enumerate() {
        let resource = write(
            dir.path(),
            &format!("pod-{i}.yaml"),
            &pod(&format!("p{i}"), image),
        );
        let run = ivory([
            "apply",
            "--policy",
            policy.to_str().unwrap(),
            "--resource",
            resource.to_str().unwrap(),
            "--registry-ca",
            ca.to_str().unwrap(),
        ])
        .await;
        let want = if allowed { 0 } else { 1 };
        assert_eq!(run.code, want, "{image}: {}\n{}", run.stdout, run.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rules_are_named_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("converted");
    let input = fixtures().join("legacy/refused.yaml");
    let run = ivory([
        "convert",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ])
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    for needle in [
        "ClusterPolicy/refused-forms, rule kms-key: refused: verifyImages[0].attestors[0].entries[0].keys.kms",
        "rule jmespath-function: refused: verifyImages[0].attestations[0].conditions[0].all[0].key",
        "rule roles: refused: match.any[0]: roles and clusterRoles",
        "nothing written",
    ] {
        assert!(run.stderr.contains(needle), "{needle}\n{}", run.stderr);
    }
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
    let run = ivory(["convert", dir.path().join("missing.yaml").to_str().unwrap()]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("missing.yaml"), "{}", run.stderr);
}
