//! Notation signatures made by the real notation CLI (`fixtures/notation`) through the three
//! front ends on the same images: `ivory serve` (AdmissionReviews), `ivory verify` and
//! `ivory audit`, with Kyverno-shaped `notary` attestors and ivory's trust-policy extension.

use std::collections::BTreeMap;

use ivory_testkit::{Harness, RegistryHarness};
use serde_json::Value;

use crate::cli_util::{ivory, policy_args, registry_and_ca, write};
use crate::util::{Ivory, pod_review, policy};
use ivory_testkit::fixtures_dir;

fn notation_fixtures() -> std::path::PathBuf {
    fixtures_dir().join("notation")
}

fn pem(name: &str) -> String {
    std::fs::read_to_string(notation_fixtures().join("pki").join(name)).unwrap()
}

/// Pushes every notation fixture image; returns case → `host/repo@digest`.
async fn push_all(h: &Harness) -> BTreeMap<String, String> {
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(notation_fixtures().join("manifest.json")).unwrap(),
    )
    .unwrap();
    let mut out = BTreeMap::new();
    for (case, row) in manifest["images"].as_object().unwrap() {
        let repo = row["repo"].as_str().unwrap();
        h.push_oci_layout(&notation_fixtures().join("oci").join(repo), repo)
            .await
            .unwrap();
        out.insert(
            case.clone(),
            format!("{}/{repo}@{}", h.host(), row["digest"].as_str().unwrap()),
        );
    }
    out
}

fn indent(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// Kyverno's notary attestor (`certs`, optional `tsaCerts`) and signature check.
fn notary_body(tsa: bool) -> String {
    let tsa = if tsa {
        format!(
            "        tsaCerts:\n          value: |-\n{}",
            indent(&pem("tsa-root.pem"), 12)
        )
    } else {
        String::new()
    };
    format!(
        "  validationConfigurations:
    mutateDigest: false
    verifyDigest: false
  attestors:
    - name: notary
      notary:
        certs:
          value: |-
{}{tsa}  validations:
    - expression: >-
        images.containers.map(image, verifyImageSignatures(image, [attestors.notary])).all(e, e > 0)
      message: failed to verify image with notary cert
",
        indent(&pem("root.pem"), 12)
    )
}

/// Kyverno's notary-basic scenario: the signed SBOM referrer...
const SBOM_ATTESTATION: &str = "  attestations:
    - name: sbom
      referrer:
        type: sbom/cyclone-dx
";

/// ... and its checks, after the signature's.
const SBOM_CHECKS: &str = "    - expression: >-
        images.containers.map(image, verifyAttestationSignatures(image, attestations.sbom ,[attestors.notary])).all(e, e > 0)
      message: failed to verify attestation with notary cert
    - expression: >-
        images.containers.map(image, extractPayload(image, attestations.sbom).bomFormat == 'CycloneDX').all(e, e)
      message: sbom is not a cyclone dx sbom
";

fn with_annotation(policy: &str, name: &str, value: &str) -> String {
    policy.replacen(
        &format!("metadata:\n  name: {name}\n"),
        &format!("metadata:\n  name: {name}\n  annotations:\n    ivory.dev/notation-trust-policy: '{value}'\n"),
        1,
    )
}

/// The policies of this file, by name.
fn policies(glob: &str) -> Vec<(&'static str, String)> {
    let strict = policy("notary-strict", glob, &notary_body(false));
    // The attestations block goes before the validations; the extra checks after the first.
    let sbom = policy("notary-sbom", glob, &notary_body(false)).replacen(
        "  validations:\n",
        &format!("{SBOM_ATTESTATION}  validations:\n"),
        1,
    ) + SBOM_CHECKS;
    let tsa = policy("notary-tsa", glob, &notary_body(true));
    let permissive = with_annotation(
        &policy("notary-permissive", glob, &notary_body(false)),
        "notary-permissive",
        r#"{"notary": {"level": "permissive"}}"#,
    );
    let pinned = with_annotation(
        &policy("notary-pinned", glob, &notary_body(false)),
        "notary-pinned",
        r#"{"notary": {"trustedIdentities": ["x509.subject: O=ivory tests, CN=release bot"]}}"#,
    );
    // Kyverno's expression form (`certs.expression`, here from a variable) with the extension.
    let from_variable = with_annotation(
        &policy(
            "notary-expression",
            glob,
            &notary_body(false).replacen(
                &format!("          value: |-\n{}", indent(&pem("root.pem"), 12)),
                "          expression: variables.root\n",
                1,
            ),
        ),
        "notary-expression",
        r#"{"notary": {"level": "permissive"}}"#,
    )
    .replacen(
        "  validationConfigurations:",
        &format!(
            "  variables:\n    - name: root\n      expression: |-\n        '''{}'''\n  validationConfigurations:",
            pem("root.pem").trim().replace('\n', "\n        ")
        ),
        1,
    );
    vec![
        ("notary-expression", from_variable),
        ("notary-strict", strict),
        ("notary-sbom", sbom),
        ("notary-tsa", tsa),
        ("notary-permissive", permissive),
        ("notary-pinned", pinned),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_admits_notation_signed_images_and_denies_the_bad_ones() {
    let h = RegistryHarness::start_default().await.unwrap();
    let images = push_all(&h).await;
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path();
    let policy_dir = dir_path.join("policies");
    std::fs::create_dir(&policy_dir).unwrap();
    for (name, text) in policies(&format!("{}/*", h.host())) {
        std::fs::write(policy_dir.join(format!("{name}.yaml")), text).unwrap();
    }
    std::fs::write(dir_path.join("registry-ca.pem"), h.ca_pem()).unwrap();
    let ivory = Ivory::start_with_policies(dir_path, &policy_dir).await;

    let cases = [
        ("notary-strict", "jws", true),
        ("notary-strict", "cose", true),
        ("notary-strict", "unsigned", false),
        ("notary-strict", "tampered", false),
        ("notary-strict", "other-digest", false),
        ("notary-strict", "expired", false),
        ("notary-strict", "expired-tsa", false),
        ("notary-strict", "many", false),
        ("notary-tsa", "expired-tsa", true),
        ("notary-tsa", "jws", false),
        ("notary-permissive", "expired", true),
        ("notary-strict", "sig-expired", false),
        ("notary-permissive", "sig-expired", true),
        ("notary-permissive", "tampered", false),
        ("notary-pinned", "jws", false),
        ("notary-expression", "jws", true),
        ("notary-expression", "expired", true),
        ("notary-expression", "unsigned", false),
        ("notary-sbom", "sbom", true),
        ("notary-sbom", "sbom-unsigned", false),
        ("notary-sbom", "jws", false),
    ];
    for (i, (policy, case, want)) in cases.into_iter().enumerate() {
        let review = pod_review(&format!("n-{i}"), &[images[case].as_str()]);
        let resp = ivory
            .review(&format!("/ivpol/validate/{policy}"), &review)
            .await;
        let allowed = resp["allowed"].as_bool().unwrap_or(false);
        assert_eq!(allowed, want, "{policy} {case}: {resp}\n{}", ivory.logs());
        if !want && policy == "notary-strict" {
            assert_eq!(
                resp["status"]["message"],
                "Policy notary-strict failed: failed to verify image with notary cert",
                "{resp}"
            );
        }
    }
    // The admitted review names the signer in its audit annotation.
    let resp = ivory
        .review(
            "/ivpol/validate/notary-strict",
            &pod_review("n-signer", &[images["jws"].as_str()]),
        )
        .await;
    let annotations = resp["auditAnnotations"].to_string();
    assert!(annotations.contains("ivory notation signer"), "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_and_audit_judge_the_same_images() {
    let (h, dir, ca) = registry_and_ca().await;
    let images = push_all(&h).await;
    let glob = format!("{}/*", h.host());
    let strict = policies(&glob)
        .into_iter()
        .find(|(name, _)| *name == "notary-strict")
        .unwrap()
        .1;
    let file = write(dir.path(), "strict.yaml", &strict);
    let judged = ["jws", "cose", "unsigned", "tampered", "expired"];
    let expected = |case: &str| {
        if matches!(case, "jws" | "cose") {
            "pass"
        } else {
            "fail"
        }
    };

    let mut args = policy_args("verify", &file, &ca);
    args.extend(["--no-cache".into(), "-o".into(), "json".into()]);
    args.extend(judged.iter().map(|c| images[*c].clone()));
    let run = ivory(args).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    for case in judged {
        let entry = doc["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["image"] == images[case].as_str())
            .unwrap();
        assert_eq!(entry["verdict"], expected(case), "{case}: {entry}");
    }
    let tampered = doc["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"] == images["tampered"].as_str())
        .unwrap();
    let reason = tampered["policies"][0]["attestors"][0]["reason"].to_string();
    assert!(reason.contains("does not verify"), "{tampered}");

    // Through the persistent cache (the SharedCache seam, as the L2): a second run reads no
    // signature of the verified images.
    let cache = dir.path().join("cache");
    let cached = |image: &str| {
        let mut args = policy_args("verify", &file, &ca);
        args.extend([
            "--cache-dir".into(),
            cache.display().to_string(),
            image.to_owned(),
        ]);
        ivory(args)
    };
    assert_eq!(cached(&images["cose"]).await.code, 0);
    h.reset_requests();
    let run = cached(&images["cose"]).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let reads = h.requests();
    assert!(
        !reads
            .iter()
            .any(|(_, uri, _)| uri.contains("/manifests/sha256-")),
        "{reads:?}"
    );

    let list = write(
        dir.path(),
        "images.txt",
        &judged
            .iter()
            .map(|c| format!("{}\n", images[*c]))
            .collect::<String>(),
    );
    let mut args = policy_args("audit", &file, &ca);
    args.extend([
        "--no-cache".into(),
        "--images-from".into(),
        list.display().to_string(),
        "-o".into(),
        "json".into(),
    ]);
    let run = ivory(args).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    assert_eq!(doc["summary"]["pass"], 2, "{doc}");
    assert_eq!(doc["summary"]["fail"], 3, "{doc}");
    for entry in doc["images"].as_array().unwrap() {
        let case = judged
            .iter()
            .find(|c| images[**c] == entry["image"].as_str().unwrap())
            .unwrap();
        assert_eq!(entry["verdict"], expected(case), "{case}: {entry}");
    }
}
