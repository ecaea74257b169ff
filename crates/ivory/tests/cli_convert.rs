//! `ivory convert` as a process: the legacy corpus under `fixtures/legacy/` converts, and the
//! converted policies judge every case on the real registry harness as the real Kyverno v1.19.1
//! judged it with the legacy policies (recorded by `scripts/convert-proof.sh`); refused rules
//! are named and nothing is written.

use std::collections::BTreeMap;

use ivory_testkit::RegistryHarness;
use serde_json::Value;

use crate::cli_util::{ivory, write, write_ca};
use ivory_testkit::fixtures_dir;
use ivory_testkit::review::{create_review, legacy_case_object};

/// The AdmissionReview `scripts/convert-proof.sh` sent Kyverno and ivory for `case` (a CREATE
/// by `case.user`, default alice, of the case's object running `image`).
fn review(case: &Value, image: &str) -> Value {
    let object = legacy_case_object(case, image);
    create_review(
        "0b7c1f5e-5d7a-4c59-9f3e-2a1d4c8b9e01",
        &object,
        case["user"].as_str().unwrap_or("alice"),
    )
}

fn json_file(path: &str) -> Value {
    let text = std::fs::read_to_string(fixtures_dir().join(path)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every case of `fixtures/legacy/cases.json` through `ivory convert` and `ivory apply` gives the
/// verdict (and, when admitted, the pinned image) the real Kyverno v1.19.1 gave with the legacy
/// policies, as `scripts/convert-proof.sh` recorded it in `fixtures/legacy/verdicts.json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_converted_corpus_gives_the_verdicts_kyverno_gave() {
    let h = RegistryHarness::start_default().await.unwrap();
    let host = h.host().to_owned();
    let cases = json_file("legacy/cases.json");
    let verdicts = json_file("legacy/verdicts.json");
    assert_eq!(verdicts["kyvernoVersion"], "v1.19.1");
    let dir = tempfile::tempdir().unwrap();
    let ca = write_ca(dir.path(), &h);
    let mut digests = BTreeMap::new();
    for case in cases["cases"].as_array().unwrap() {
        let Some(repo) = case["repo"].as_str() else {
            continue;
        };
        if !digests.contains_key(repo) {
            let layout = fixtures_dir()
                .join("oci/ivory")
                .join(case["layout"].as_str().unwrap());
            let tags = h.push_oci_layout(&layout, repo).await.unwrap();
            digests.insert(repo.to_owned(), tags["v1"].clone());
        }
    }
    let mut legacy = Vec::new();
    let mut corpus: Vec<_> = std::fs::read_dir(fixtures_dir().join("legacy/corpus"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    corpus.sort();
    for file in corpus {
        let text = std::fs::read_to_string(&file)
            .unwrap()
            .replace("REGISTRY_HOST", &host);
        let name = file.file_name().unwrap().to_str().unwrap();
        legacy.push(write(dir.path(), name, &text).to_str().unwrap().to_owned());
    }
    let out = dir.path().join("converted");
    let mut args = vec!["convert".to_owned()];
    args.extend(legacy);
    args.extend(["-o".to_owned(), out.to_str().unwrap().to_owned()]);
    let run = ivory(&args).await;
    assert_eq!(run.code, 0, "{}", run.stderr);

    // The ConfigMap corpus/configmap-keys.yaml reads (Kyverno read it from the proof's cluster).
    let cluster_resources = fixtures_dir().join("legacy/cluster-resources.yaml");
    let recorded = verdicts["cases"].as_array().unwrap();
    assert_eq!(recorded.len(), cases["cases"].as_array().unwrap().len());
    for case in cases["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let kyverno = recorded.iter().find(|v| v["name"] == name).unwrap();
        let repo = case["repo"].as_str().unwrap_or_default();
        let image = if let Some(image) = case["image"].as_str() {
            image.to_owned()
        } else if case["byDigest"] == true {
            format!("{host}/{repo}@{}", digests[repo])
        } else {
            format!("{host}/{repo}:v1")
        };
        let resource = write(
            dir.path(),
            &format!("{name}.json"),
            &review(case, &image).to_string(),
        );
        let run = ivory([
            "apply",
            "--policy",
            out.to_str().unwrap(),
            "--resource",
            resource.to_str().unwrap(),
            "--registry-ca",
            ca.to_str().unwrap(),
            "--cluster-resources",
            cluster_resources.to_str().unwrap(),
        ])
        .await;
        // A documented Kyverno bug: ivory's own recorded verdict is the expected one.
        let expected = if case.get("kyvernoBug").is_some() || case.get("difference").is_some() {
            assert_ne!(kyverno["kyverno"], kyverno["ivory"], "{name}");
            &kyverno["ivory"]
        } else {
            &kyverno["kyverno"]
        };
        let allowed = expected == "allow";
        // `ivory apply` exits 1 for a denial and 2 for a policy that could not be evaluated (a
        // registry that does not answer, a key the ConfigMap lacks), which the webhook turns
        // into a denial under `Deny`.
        let unevaluable = case.get("image").is_some() || case["error"] == true;
        let want = match (allowed, unevaluable) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => 2,
        };
        assert_eq!(
            run.code, want,
            "{name}: Kyverno said {} ({}); ivory:\n{}\n{}",
            kyverno["kyverno"], kyverno["kyvernoMessage"], run.stdout, run.stderr
        );
        if allowed && case.get("kyvernoBug").is_none() && case.get("difference").is_none() {
            let pinned = kyverno["kyvernoImage"]
                .as_str()
                .unwrap()
                .replace("REGISTRY_HOST", &host);
            // A case without an image (a PipelineRun without a bundle) admits nothing to pin.
            assert!(
                pinned.is_empty() || run.stdout.contains(&format!(": {pinned}\n")),
                "{name}: Kyverno admitted {pinned}; ivory:\n{}",
                run.stdout
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rules_are_named_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("converted");
    let input = fixtures_dir().join("legacy/refused.yaml");
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
        "rule jmespath-function: refused: verifyImages[0].attestations[0].conditions[0].all[0].key: {{ sha256(materials[0].uri) }}: the function sha256() is not converted",
        "rule roles: refused: match.any[0]: roles and clusterRoles",
        "nothing written",
    ] {
        assert!(run.stderr.contains(needle), "{needle}\n{}", run.stderr);
    }
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
    // Two files converting to one policy name: refused before anything is written.
    let corpus = fixtures_dir().join("legacy/corpus/digest-only.yaml");
    let copy = write(
        dir.path(),
        "copy.yaml",
        &std::fs::read_to_string(&corpus).unwrap(),
    );
    let run = ivory([
        "convert",
        corpus.to_str().unwrap(),
        copy.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ])
    .await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("both convert to a policy named \"pin-digests-pin\""),
        "{}",
        run.stderr
    );
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
    let run = ivory(["convert", dir.path().join("missing.yaml").to_str().unwrap()]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("missing.yaml"), "{}", run.stderr);
}

/// What `ivory convert --fix` does with one policy of Kyverno's library
/// (`fixtures/kyverno-library/`, the table in docs/kyverno-semantics.md §14).
enum Library {
    /// Converts (exactly or with documented differences); `fixed` when only `--fix` lets it.
    Converts { fixed: bool },
    /// Refused, naming this field.
    Refused(&'static str),
    /// Already an ImageValidatingPolicy: skipped by convert, loaded as it is.
    Native,
}

/// Every image-verification policy of Kyverno's community library, as a migrating user runs
/// it: converted with `--fix`, or refused naming the field (never a crash or an unclear error);
/// a native ImageValidatingPolicy loads unchanged. Every failing row is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kyverno_library_policies_convert_or_are_refused_naming_the_field() {
    use Library::{Converts, Native, Refused};
    let rows: [(&str, Library); 12] = [
        ("flux/verify-flux-images", Converts { fixed: false }),
        ("other/require-vulnerability-scan", Converts { fixed: true }),
        (
            "other/verify-image-cve-2022-42889",
            Converts { fixed: true },
        ),
        (
            "other/verify-image-gcpkms",
            Refused("verifyImages[0].attestors[0].entries[0].keys.kms"),
        ),
        ("other/verify-image-ivpol", Native),
        ("other/verify-image-slsa", Converts { fixed: true }),
        (
            "other/verify-image-with-multi-keys",
            Converts { fixed: false },
        ),
        ("other/verify-image", Converts { fixed: false }),
        ("other/verify-sbom-cyclonedx", Converts { fixed: true }),
        (
            "tekton/verify-tekton-pipeline-bundle-signatures",
            Converts { fixed: false },
        ),
        (
            "tekton/verify-tekton-taskrun-signatures",
            Converts { fixed: true },
        ),
        (
            "tekton/verify-tekton-taskrun-vuln-scan",
            Converts { fixed: true },
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (path, expected) in &rows {
        let name = path.rsplit('/').next().unwrap_or(path);
        let file = fixtures_dir().join(format!("kyverno-library/{path}/{name}.yaml"));
        let file = file.to_str().unwrap();
        let out = dir.path().join(name);
        let out = out.to_str().unwrap();
        let fixed = ivory(["convert", "--fix", file, "-o", out]).await;
        let plain = ivory(["convert", file, "-o", &format!("{out}-plain")]).await;
        let problem = match expected {
            Converts { fixed: needs_fix } => {
                let ok = fixed.code == 0 && fixed.stderr.contains(" -> ");
                let fix_reported = fixed.stderr.contains("fixed (--fix): ");
                let plain_ok = plain.code == 0;
                (!ok || fix_reported != *needs_fix || plain_ok == *needs_fix)
                    .then(|| format!("converts (fix needed: {needs_fix}); got {}", fixed.stderr))
            }
            Refused(field) => {
                let named = format!("refused: {field}");
                (fixed.code != 1 || !fixed.stderr.contains(&named)).then(|| {
                    format!(
                        "refused naming {field}; got {}: {}",
                        fixed.code, fixed.stderr
                    )
                })
            }
            Native => {
                let text = std::fs::read_to_string(file).unwrap();
                let loaded = ivory_policy::load_str(&text, file);
                let skipped =
                    fixed.code == 0 && fixed.stderr.contains("skipped policies.kyverno.io");
                (!skipped || !loaded.errors.is_empty() || loaded.policies.len() != 1).then(|| {
                    format!(
                        "native; loaded {:?}; convert said {}",
                        loaded.errors, fixed.stderr
                    )
                })
            }
        };
        if let Some(problem) = problem {
            failures.push(format!("{path}: expected {problem}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
