//! Signatures wherever cosign v3 and the writers after it put them (`fixtures/discovery`: real
//! cosign v3.1.3 signing and attesting against Distribution 2.8, which has no referrers API, so
//! cosign writes the `sha256-<hex>` fallback index): that index as cosign writes it, relabelled
//! `application/vnd.oci.empty.v1+json`, unlabelled, and in another repository are admitted; an
//! index listing another image's bundles is denied. Through `ivory serve` and `ivory verify`.

use std::collections::BTreeMap;

use ivory_testkit::Harness;
use serde_json::Value;

use crate::cli_util::{ivory, registry_and_ca, write};
use crate::util::{BIN, Ivory, pod_review, policies_dir, policy};
use ivory_testkit::fixtures_dir;

const SLSA1: &str = "https://slsa.dev/provenance/v1";

/// The fixture images, pushed: repository name → `host/ivory/<name>@<digest>`.
struct Pushed {
    images: BTreeMap<String, String>,
    digests: BTreeMap<String, String>,
}

impl Pushed {
    fn image(&self, name: &str) -> &str {
        &self.images[name]
    }

    fn hex(&self, name: &str) -> String {
        self.digests[name].replace(':', "-")
    }
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(fixtures_dir().join("discovery/manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Pushes every layout of `fixtures/discovery` under its own repository name, checking that
/// each image's digest and fallback labels are the generator's.
async fn push_all(h: &Harness) -> Pushed {
    let manifest = manifest();
    let mut pushed = Pushed {
        images: BTreeMap::new(),
        digests: BTreeMap::new(),
    };
    let oci = fixtures_dir().join("discovery/oci/ivory");
    let signatures = h
        .push_oci_layout(
            &oci.join("discovery-signatures"),
            "ivory/discovery-signatures",
        )
        .await
        .unwrap();
    for row in manifest["images"].as_array().unwrap() {
        let repo = row["repo"].as_str().unwrap();
        let name = repo.trim_start_matches("ivory/");
        let tags = h.push_oci_layout(&oci.join(name), repo).await.unwrap();
        let digest = row["digest"].as_str().unwrap();
        assert_eq!(tags["v1"], digest, "{repo}");
        pushed
            .images
            .insert(name.to_owned(), format!("{}/{repo}@{digest}", h.host()));
        pushed.digests.insert(name.to_owned(), digest.to_owned());
    }
    let labels = |name: &str| {
        manifest["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["repo"] == format!("ivory/{name}"))
            .unwrap()["descriptorArtifactTypes"]
            .clone()
    };
    let bundle = Value::from("application/vnd.dev.sigstore.bundle.v0.3+json");
    let empty = Value::from("application/vnd.oci.empty.v1+json");
    assert_eq!(
        labels("discovery-labelled"),
        Value::from(vec![bundle.clone(), bundle])
    );
    assert_eq!(
        labels("discovery-empty"),
        Value::from(vec![empty.clone(), empty])
    );
    assert_eq!(
        labels("discovery-unlabelled"),
        Value::from(vec![Value::Null, Value::Null])
    );
    // The other repository holds the elsewhere image's fallback index, not the image.
    let fallback = pushed.hex("discovery-elsewhere");
    assert!(signatures.contains_key(&fallback), "{signatures:?}");
    assert!(!signatures.contains_key("v1"), "{signatures:?}");
    pushed
}

/// The fixture key as an attestor named `key` (no transparency log), its signatures read from
/// `repository` when given.
fn attestor(repository: Option<&str>) -> String {
    let pem = std::fs::read_to_string(fixtures_dir().join("discovery/cosign.pub")).unwrap();
    let key: String = pem.lines().map(|l| format!("            {l}\n")).collect();
    let source = repository
        .map(|r| format!("        source:\n          repository: {r}\n"))
        .unwrap_or_default();
    format!(
        "  attestors:
    - name: key
      cosign:
{source}        key:
          data: |
{key}        ctlog:
          insecureIgnoreTlog: true
          insecureIgnoreSCT: true
  attestations:
    - name: slsa
      intoto:
        type: {SLSA1}
  validations:
    - expression: >-
        images.containers.map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)
      message: failed the image Signature verification
    - expression: >-
        images.containers.map(image, verifyAttestationSignatures(image, attestations.slsa, [attestors.key])).all(e, e > 0)
      message: failed to verify SLSA provenance
"
    )
}

/// The signature and the SLSA v1 attestation cosign v3 wrote are found and verified behind the
/// fallback index whatever its descriptors say, and in the repository `source.repository`
/// names; bundles made for another image, listed under this image's fallback tag, never count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_admits_cosign_v3_behind_any_fallback_index_and_in_another_repository() {
    let (h, dir, _ca) = registry_and_ca().await;
    let pushed = push_all(&h).await;
    let policies = policies_dir(dir.path());
    let glob = format!("{}/*", h.host());
    let elsewhere = format!("{}/ivory/discovery-signatures", h.host());
    write(
        &policies,
        "discovery.yaml",
        &policy("discovery", &glob, &attestor(None)),
    );
    write(
        &policies,
        "discovery-elsewhere.yaml",
        &policy("discovery-elsewhere", &glob, &attestor(Some(&elsewhere))),
    );
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;
    let cases = [
        ("discovery", "discovery-labelled", true),
        ("discovery", "discovery-empty", true),
        ("discovery", "discovery-unlabelled", true),
        ("discovery-elsewhere", "discovery-elsewhere", true),
        ("discovery", "discovery-elsewhere", false),
        ("discovery", "discovery-crossed", false),
    ];
    for (i, (policy, name, want)) in cases.into_iter().enumerate() {
        let review = pod_review(&format!("d-{i}"), &[pushed.image(name)]);
        let resp = ivory
            .review(&format!("/ivpol/validate/{policy}"), &review)
            .await;
        assert_eq!(
            resp["allowed"].as_bool(),
            Some(want),
            "{policy} {name}: {resp}\n{}",
            ivory.logs()
        );
        if !want {
            assert_eq!(
                resp["status"]["message"],
                format!("Policy {policy} failed: failed the image Signature verification"),
                "{resp}"
            );
        }
    }

    // `--signature-repository` names that repository for every cosign attestor without a
    // `source.repository` of its own, in place of the image's (as COSIGN_REPOSITORY does).
    drop(ivory);
    let served = tempfile::tempdir().unwrap();
    let ivory = Ivory::start_in(
        served.path(),
        &[
            "--policies".into(),
            policies.display().to_string(),
            "--registry-ca".into(),
            dir.path().join("registry-ca.pem").display().to_string(),
            "--signature-repository".into(),
            elsewhere.clone(),
        ],
    )
    .await;
    for (i, (name, want)) in [("discovery-elsewhere", true), ("discovery-labelled", false)]
        .into_iter()
        .enumerate()
    {
        let review = pod_review(&format!("f-{i}"), &[pushed.image(name)]);
        let resp = ivory.review("/ivpol/validate/discovery", &review).await;
        assert_eq!(
            resp["allowed"].as_bool(),
            Some(want),
            "{name}: {resp}\n{}",
            ivory.logs()
        );
    }
}

/// Every attestor reason `ivory verify -o json` gives for `image`, joined.
fn reasons(doc: &Value, image: &str) -> String {
    let img = doc["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"] == image)
        .unwrap_or_else(|| panic!("{image} not in {doc:#}"));
    img["policies"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["attestors"].as_array().unwrap().iter())
        .map(|a| format!("{}: {}", a["result"], a["reason"].as_str().unwrap_or("")))
        .collect::<Vec<_>>()
        .join("\n")
}

fn verdict(doc: &Value, image: &str) -> String {
    doc["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"] == image)
        .map(|i| i["verdict"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default()
}

/// `ivory verify` admits the same images (the other repository named by
/// `--signature-repository`), and its denials say which layouts were read and what each held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_cosign_v3_signatures_everywhere_and_says_where_it_looked() {
    let (h, dir, ca) = registry_and_ca().await;
    let pushed = push_all(&h).await;
    let glob = format!("{}/*", h.host());
    let file = write(
        dir.path(),
        "discovery.yaml",
        &policy("discovery", &glob, &attestor(None)),
    );
    let args = |extra: &[&str], images: &[&str]| {
        let mut args: Vec<String> = vec![
            "verify".into(),
            "--policy".into(),
            file.display().to_string(),
            "--registry-ca".into(),
            ca.display().to_string(),
            "-o".into(),
            "json".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(images.iter().map(|s| s.to_string()));
        args
    };
    let names = [
        "discovery-labelled",
        "discovery-empty",
        "discovery-unlabelled",
        "discovery-crossed",
    ];
    let images: Vec<&str> = names.iter().map(|n| pushed.image(n)).collect();
    let run = ivory(args(&[], &images)).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    for name in &names[..3] {
        let image = pushed.image(name);
        assert_eq!(
            verdict(&doc, image),
            "pass",
            "{name}: {}",
            reasons(&doc, image)
        );
    }
    // Two bundles found, both cosign's, both for the other image: each names the digest it
    // is not for, and the account says what the fallback index held.
    let crossed = pushed.image("discovery-crossed");
    assert_eq!(verdict(&doc, crossed), "fail");
    let why = reasons(&doc, crossed);
    let digest = &pushed.digests["discovery-crossed"];
    assert!(
        why.contains(&format!("in-toto statement subject does not name {digest}")),
        "{why}"
    );
    assert!(
        why.contains(&format!(
            "referrers API: unsupported (404); fallback tag {}: 2 manifests, 2 Sigstore bundles, 0 others",
            pushed.hex("discovery-crossed")
        )),
        "{why}"
    );

    // `-o json` lists the same layouts per attestor.
    let looked = doc["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"] == crossed)
        .map(|i| i["policies"][0]["attestors"][0]["looked"].clone())
        .unwrap();
    assert_eq!(
        looked,
        serde_json::json!([
            format!(".sig tag {}.sig: absent", pushed.hex("discovery-crossed")),
            "referrers API: unsupported (404)",
            format!(
                "fallback tag {}: 2 manifests, 2 Sigstore bundles, 0 others",
                pushed.hex("discovery-crossed")
            ),
        ]),
        "{doc:#}"
    );

    // Signatures in another repository: not found beside the image (and the account says
    // where it looked), found with --signature-repository, or cosign's COSIGN_REPOSITORY.
    let elsewhere = pushed.image("discovery-elsewhere");
    let run = ivory(args(&[], &[elsewhere])).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let why = reasons(&run.json(), elsewhere);
    let hex = pushed.hex("discovery-elsewhere");
    assert!(
        why.contains(&format!(
            "signatures not found (looked at: .sig tag {hex}.sig: absent; referrers API: unsupported (404); fallback tag {hex}: absent)"
        )),
        "{why}"
    );
    // --explain: the reason alone, then one row per layout read.
    let mut explained = args(&["--explain"], &[elsewhere]);
    explained.retain(|a| a != "-o" && a != "json");
    let run = ivory(explained).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let rows: Vec<&str> = run.stdout.lines().map(str::trim).collect();
    for row in [
        "attestor key (signature) failed: signatures not found".to_owned(),
        format!("looked at .sig tag {hex}.sig: absent"),
        "looked at referrers API: unsupported (404)".to_owned(),
        format!("looked at fallback tag {hex}: absent"),
        format!("looked at .att tag {hex}.att: absent"),
    ] {
        assert!(
            rows.contains(&row.as_str()),
            "{row:?} not in\n{}",
            run.stdout
        );
    }
    let repository = format!("{}/ivory/discovery-signatures", h.host());
    let run = ivory(args(&["--signature-repository", &repository], &[elsewhere])).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    // cosign's own variable gives the flag's value; empty, it is no repository (as for cosign).
    for (value, want) in [(repository.as_str(), 0), ("", 1)] {
        let cache = tempfile::tempdir().unwrap();
        let out = tokio::process::Command::new(BIN)
            .args(args(&[], &[elsewhere]))
            .env("IVORY_LOG", "warn")
            .env("IVORY_CACHE_DIR", cache.path())
            .env("COSIGN_REPOSITORY", value)
            .output()
            .await
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(want),
            "COSIGN_REPOSITORY={value:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let run = ivory(args(&["--signature-repository", "bad repo"], &[elsewhere])).await;
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("--signature-repository"),
        "{}",
        run.stderr
    );
}
