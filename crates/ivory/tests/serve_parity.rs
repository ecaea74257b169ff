//! Kyverno parity through `ivory serve` against the real registry: key hash algorithms across
//! cosign generations, legacy Rekor entry kinds, certificate constraints (`additionalExtensions`,
//! `subjectExpression`) and the fields refused at load.

use ivory_testkit::{Harness, RegistryHarness};
use serde_json::{Value, json};

use crate::util::{Ivory, pod_review, policies_dir, policy};
use ivory_testkit::fixtures_dir;

/// Pushes a layout under `fixtures/<dir>` as `ivory/<name>`; returns `host/ivory/<name>@<digest>`.
async fn push(h: &Harness, dir: &str, name: &str) -> String {
    let repo = format!("ivory/{name}");
    let tags = h
        .push_oci_layout(&fixtures_dir().join(dir), &repo)
        .await
        .unwrap();
    format!("{}/{repo}@{}", h.host(), tags["v1"])
}

fn indent(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// A key attestor named `key` with `hash` as `hashAlgorithm` (none when `None`), no tlog.
fn p384_attestor(hash: Option<&str>) -> String {
    let pem = std::fs::read_to_string(fixtures_dir().join("hash/p384.pub")).unwrap();
    let hash = hash
        .map(|h| format!("          hashAlgorithm: {h}\n"))
        .unwrap_or_default();
    format!(
        "  attestors:
    - name: key
      cosign:
        key:
{hash}          data: |
{}        ctlog:
          insecureIgnoreTlog: true
          insecureIgnoreSCT: true
  validations:
    - expression: >-
        images.containers.map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)
      message: failed the image Signature verification
",
        indent(&pem, 12)
    )
}

async fn allowed(ivory: &Ivory, policy: &str, review: &Value) -> (bool, Value) {
    let resp = ivory
        .review(&format!("/ivpol/validate/{policy}"), review)
        .await;
    (resp["allowed"].as_bool().unwrap_or(false), resp)
}

/// A P-384 key verifies the SHA-256 signature of cosign v2.5 and the SHA-384 signature of
/// cosign v2.6.5 when `hashAlgorithm` is unset; set, only signatures with that hash verify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p384_signatures_of_both_cosign_generations_follow_hash_algorithm() {
    let h = RegistryHarness::start_default().await.unwrap();
    let v25 = push(&h, "hash/oci/ivory/hash-p384-v250", "hash-p384-v250").await;
    let v26 = push(&h, "hash/oci/ivory/hash-p384-v265", "hash-p384-v265").await;
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let glob = format!("{}/*", h.host());
    for (name, hash) in [
        ("p384-unset", None),
        ("p384-sha256", Some("sha256")),
        ("p384-sha384", Some("sha384")),
    ] {
        std::fs::write(
            policies.join(format!("{name}.yaml")),
            policy(name, &glob, &p384_attestor(hash)),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("registry-ca.pem"), h.ca_pem()).unwrap();
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;
    for (i, (policy, image, want)) in [
        ("p384-unset", &v25, true),
        ("p384-unset", &v26, true),
        ("p384-sha256", &v25, true),
        ("p384-sha256", &v26, false),
        ("p384-sha384", &v25, false),
        ("p384-sha384", &v26, true),
    ]
    .into_iter()
    .enumerate()
    {
        let uid = format!("h-{i}");
        let (got, resp) = allowed(&ivory, policy, &pod_review(&uid, &[image])).await;
        assert_eq!(got, want, "{policy} {image}: {resp}\n{}", ivory.logs());
        if !want {
            assert_eq!(
                resp["status"]["message"],
                format!("Policy {policy} failed: failed the image Signature verification"),
                "{resp}"
            );
        }
    }
}

const SLSA_ATTESTATION: &str = "  attestations:
    - name: slsa
      intoto:
        type: https://slsa.dev/provenance/v0.2
  validations:
    - expression: >-
        images.containers.map(image, verifyAttestationSignatures(image, attestations.slsa, [attestors.gha])).all(e, e > 0)
      message: failed to verify SLSA provenance
";

/// A keyless attestor named `gha` for slsa-github-generator's container workflow; `identity`
/// and `extensions` are YAML at identity/keyless-field indentation.
fn slsa_policy(name: &str, glob: &str, identity: &str, extensions: &str) -> String {
    let body = format!(
        "  attestors:
    - name: gha
      cosign:
        keyless:
          identities:
            - issuer: https://token.actions.githubusercontent.com
{identity}{extensions}        ctlog:
          url: https://rekor.sigstore.dev
{SLSA_ATTESTATION}"
    );
    policy(name, glob, &body)
}

fn labelled(uid: &str, image: &str, generator: &str) -> Value {
    let mut review = pod_review(uid, &[image]);
    review["request"]["object"]["metadata"]["labels"] = json!({ "generator": generator });
    review
}

/// slsa-github-generator v1.4.0 and v1.8.0 provenance (Rekor `intoto/0.0.1` entries) verifies
/// like the newer kinds; `additionalExtensions` and a per-request `subjectExpression` constrain
/// the signing certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_intoto_provenance_verifies_under_certificate_constraints() {
    let h = RegistryHarness::start_default().await.unwrap();
    let layout = "captured/slsa-verifier/gha_generic_container";
    let v14 = push(
        &h,
        &format!("{layout}/v1.4.0/container_workflow_dispatch"),
        "slsa-v140",
    )
    .await;
    let v18 = push(
        &h,
        &format!("{layout}/v1.8.0/container_workflow_dispatch"),
        "slsa-v180",
    )
    .await;
    let glob = format!("{}/*", h.host());
    let generator = "https://github.com/slsa-framework/slsa-github-generator/.github/workflows/generator_container_slsa3.yml@refs/tags/";
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let any_release = format!("              subjectRegExp: '^{generator}v1\\.[0-9]+\\.0$'\n");
    let files = [
        (
            "slsa-main",
            slsa_policy(
                "slsa-main",
                &glob,
                &any_release,
                "          additionalExtensions:\n            githubWorkflowRef: refs/heads/main\n            githubWorkflowRepository: slsa-framework/example-package\n",
            ),
        ),
        (
            "slsa-release-branch",
            slsa_policy(
                "slsa-release-branch",
                &glob,
                &any_release,
                "          additionalExtensions:\n            githubWorkflowRef: refs/heads/release\n",
            ),
        ),
        (
            "slsa-by-label",
            slsa_policy(
                "slsa-by-label",
                &glob,
                &format!(
                    "              subjectExpression: >-\n                '{generator}' + object.metadata.labels.generator\n"
                ),
                "",
            ),
        ),
    ];
    for (name, text) in &files {
        std::fs::write(policies.join(format!("{name}.yaml")), text).unwrap();
    }
    std::fs::write(dir.path().join("registry-ca.pem"), h.ca_pem()).unwrap();
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;
    let cases = [
        ("slsa-main", &v14, "v1.4.0", true),
        ("slsa-main", &v18, "v1.8.0", true),
        ("slsa-release-branch", &v18, "v1.8.0", false),
        ("slsa-by-label", &v14, "v1.4.0", true),
        ("slsa-by-label", &v18, "v1.8.0", true),
        ("slsa-by-label", &v18, "v1.4.0", false),
    ];
    for (i, (policy, image, label, want)) in cases.into_iter().enumerate() {
        let uid = format!("s-{i}");
        let (got, resp) = allowed(&ivory, policy, &labelled(&uid, image, label)).await;
        assert_eq!(
            got,
            want,
            "{policy} {image} {label}: {resp}\n{}",
            ivory.logs()
        );
        if !want {
            assert_eq!(
                resp["status"]["message"],
                format!("Policy {policy} failed: failed to verify SLSA provenance"),
                "{resp}"
            );
        }
    }
}

/// Fields ivory cannot honour keep `ivory serve` from becoming ready, each named with its path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_ivory_cannot_honour_are_refused_at_load() {
    let pem = std::fs::read_to_string(fixtures_dir().join("hash/p384.pub")).unwrap();
    let body = format!(
        "  credentials:
    providers: [default, amazon]
  attestors:
    - name: kms
      cosign:
        key:
          kms: awskms:///alias/signing
    - name: sha224
      cosign:
        key:
          hashAlgorithm: sha224
          data: |
{}    - name: tuf
      cosign:
        keyless:
          identities:
            - subject: someone@example.com
        tuf:
          mirror: ftp://tuf.example.com
        ctlog:
          url: https://rekor.sigstore.dev
  validations:
    - expression: \"true\"
",
        indent(&pem, 12)
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("refused.yaml");
    std::fs::write(&file, policy("refused", "*", &body)).unwrap();
    let ivory = Ivory::start_policies(dir.path(), &file).await;
    let (status, text) = ivory.get("/readyz").await;
    assert_eq!(status, 503, "{text}");
    for want in [
        "spec.credentials.providers[1]: Forbidden: \"amazon\" is not supported: use pull secrets (spec.credentials.secrets)",
        "spec.attestors[0].cosign.key.kms: Forbidden: not supported: ivory reads no KMS; give the public key as data or expression",
        "spec.attestors[1].cosign.key.hashAlgorithm: Unsupported value: \"sha224\": supported values: \"sha256\", \"sha384\", \"sha512\"",
        "spec.attestors[2].cosign.tuf.mirror: Invalid value: must be an http or https URL",
    ] {
        assert!(text.contains(want), "{want} not in {text}");
    }
}

/// Kyverno's image-data scenario (its conformance test `context/imagedata/image-data-arch`):
/// a variable reads `image.GetMetadata` of the Pod's first image. The policy is Kyverno's,
/// with `verifyDigest` and `required` off: it verifies no signature and names the image by
/// tag, which Kyverno 1.19's defaults would refuse before the check runs
/// (`docs/kyverno-semantics.md` §2 steps 5 and 7).
const IMAGE_DATA_ARCH: &str = "  validationConfigurations:
    verifyDigest: false
    required: false
  variables:
    - name: imageRef
      expression: object.spec.containers[0].image
    - name: image
      expression: image.GetMetadata(variables.imageRef)
  attestors: []
  validations:
    - expression: variables.image.config.architecture == \"amd64\"
      messageExpression: \"'image architecture is not supported: ' + string(variables.image.config.architecture)\"
";

/// The shape of the answer: Kyverno's fields, the index beside the platform's manifest, no
/// `tag` and no `imageIndex` for a single manifest named by digest.
const IMAGE_DATA_SHAPE: &str = "  validationConfigurations:
    verifyDigest: false
    required: false
  variables:
    - name: image
      expression: image.GetMetadata(object.spec.containers[0].image)
  attestors: []
  validations:
    - expression: >-
        has(variables.image.imageIndex)
          ? size(variables.image.imageIndex.manifests) == 2
            && variables.image.tag == 'v1' && variables.image.identifier == 'v1'
            && variables.image.resolvedImage == variables.image.registry + '/'
              + variables.image.repository + ':v1@' + variables.image.digest
            && variables.image.manifest.config.digest != ''
          : !has(variables.image.tag) && variables.image.identifier == variables.image.digest
            && variables.image.resolvedImage == variables.image.registry + '/'
              + variables.image.repository + '@' + variables.image.digest
      message: image data is not in Kyverno's shape
    - expression: >-
        getImageData(object.spec.containers[0].image).manifest == variables.image.manifest
      message: getImageData and image.GetMetadata disagree
";

fn on_node(uid: &str, image: &str, selector: Value) -> Value {
    let mut review = pod_review(uid, &[image]);
    review["request"]["object"]["spec"]["nodeSelector"] = selector;
    review
}

/// An image index answers with the manifest of the Pod's platform (nodeSelector), linux/amd64
/// when the Pod pins none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kyverno_image_data_scenario_follows_the_pods_platform() {
    let h = RegistryHarness::start_default().await.unwrap();
    let index = push(&h, "oci/ivory/sig-index", "sig-index").await;
    let (index_by_tag, _) = index.split_once('@').unwrap();
    let index_by_tag = format!("{index_by_tag}:v1");
    let single = push(&h, "oci/ivory/sig-p256", "sig-p256").await;
    let glob = format!("{}/*", h.host());
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    for (name, body) in [
        ("ivpol-image-data-arch", IMAGE_DATA_ARCH),
        ("image-data-shape", IMAGE_DATA_SHAPE),
    ] {
        std::fs::write(
            policies.join(format!("{name}.yaml")),
            policy(name, &glob, body),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("registry-ca.pem"), h.ca_pem()).unwrap();
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;
    let arch = "ivpol-image-data-arch";
    let cases = [
        ("d-1", json!({}), true),
        ("d-2", json!({"kubernetes.io/arch": "amd64"}), true),
        (
            "d-3",
            json!({"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux"}),
            false,
        ),
    ];
    for (uid, selector, want) in cases {
        let (got, resp) = allowed(&ivory, arch, &on_node(uid, &index_by_tag, selector)).await;
        assert_eq!(got, want, "{uid}: {resp}\n{}", ivory.logs());
        if !want {
            assert_eq!(
                resp["status"]["message"],
                format!("Policy {arch} failed: image architecture is not supported: arm64"),
                "{resp}"
            );
        }
    }
    // A platform the index does not carry is an error, not another platform's manifest.
    let (got, resp) = allowed(
        &ivory,
        arch,
        &on_node("d-4", &index_by_tag, json!({"kubernetes.io/arch": "s390x"})),
    )
    .await;
    assert!(!got, "{resp}");
    let message = resp["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("Policy {arch} error:")) && message.contains("linux/s390x"),
        "{resp}"
    );
    for (uid, image) in [("d-5", &index_by_tag), ("d-6", &single)] {
        let (got, resp) = allowed(&ivory, "image-data-shape", &pod_review(uid, &[image])).await;
        assert!(got, "{image}: {resp}\n{}", ivory.logs());
    }
}

/// Kyverno's image-data scenarios beyond the policy's own images: an architecture check on
/// every container of the Pod, one of which the policy's globs do not select, and literal
/// images in the policy. Kyverno fetches image data for whatever image the expression names;
/// so does ivory, for the Pod's platform.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kyverno_image_data_scenarios_reach_images_outside_the_globs_and_literals() {
    let h = RegistryHarness::start_default().await.unwrap();
    let index = push(&h, "oci/ivory/sig-index", "sig-index").await;
    let (repo, _) = index.split_once('@').unwrap();
    let index_by_tag = format!("{repo}:v1");
    let single = push(&h, "oci/ivory/sig-p256", "sig-p256").await;
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let lenient = "  validationConfigurations:
    verifyDigest: false
    required: false
  attestors: []
";
    // Selects only sig-p256 (its config names no architecture); the index is another
    // container of the same Pod.
    let every_container = format!(
        "{lenient}  validations:
    - expression: >-
        object.spec.containers.all(c, image.GetMetadata(c.image).config.architecture != 'arm64')
      messageExpression: \"'image architecture is not supported: ' + object.spec.containers.map(c, image.GetMetadata(c.image).config.architecture).filter(a, a != '').join(',')\"
"
    );
    let host = h.host();
    let literal = format!(
        "{lenient}  validations:
    - expression: image.GetMetadata('{index_by_tag}').config.os == 'linux'
      message: the base image is not linux
    - expression: getImageData('{single}').digest == '{}'
      message: getImageData disagrees with the registry
",
        single.split_once('@').unwrap().1
    );
    let missing = format!(
        "{lenient}  validations:
    - expression: image.GetMetadata('{host}/ivory/missing:v1').config.os == 'linux'
"
    );
    let scoped = format!("{host}/ivory/sig-p256*");
    let nothing = format!("{host}/nothing/*");
    for (name, glob, body) in [
        ("arch-every-container", &scoped, &every_container),
        ("literal-image", &nothing, &literal),
        ("literal-missing", &nothing, &missing),
    ] {
        std::fs::write(
            policies.join(format!("{name}.yaml")),
            policy(name, glob, body),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("registry-ca.pem"), h.ca_pem()).unwrap();
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;

    let arch = "arch-every-container";
    let pod = |uid: &str, selector: Value| {
        let mut review = pod_review(uid, &[&single, &index_by_tag]);
        review["request"]["object"]["spec"]["nodeSelector"] = selector;
        review
    };
    let (got, resp) = allowed(&ivory, arch, &pod("o-1", json!({}))).await;
    assert!(got, "{resp}\n{}", ivory.logs());
    // On an arm64 node the index's arm64 manifest is read, though the policy does not select it.
    let (got, resp) = allowed(
        &ivory,
        arch,
        &pod("o-2", json!({"kubernetes.io/arch": "arm64"})),
    )
    .await;
    assert!(!got, "{resp}");
    assert_eq!(
        resp["status"]["message"],
        format!("Policy {arch} failed: image architecture is not supported: arm64"),
        "{resp}"
    );

    h.reset_requests();
    let (got, resp) = allowed(&ivory, "literal-image", &pod_review("l-1", &[&single])).await;
    assert!(got, "{resp}\n{}", ivory.logs());
    let asked: Vec<String> = h.requests().into_iter().map(|(_, path, _)| path).collect();
    assert!(
        asked
            .iter()
            .any(|p| p.starts_with("/v2/ivory/sig-index/manifests/")),
        "the literal was fetched: {asked:?}"
    );

    let (got, resp) = allowed(&ivory, "literal-missing", &pod_review("l-2", &[&single])).await;
    assert!(!got, "{resp}");
    let message = resp["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Policy literal-missing error: failed to evaluate policy: ")
            && message.contains(&format!("{host}/ivory/missing:v1")),
        "{resp}"
    );
}

/// A policy whose signature checks cover the platforms `annotation` names (ivory's
/// `ivory.dev/verify-platforms`; none: Kyverno's index).
fn platforms_policy(name: &str, glob: &str, annotation: Option<&str>, attestor: &str) -> String {
    let text = policy(
        name,
        glob,
        &format!(
            "  validationConfigurations:\n    verifyDigest: false\n{attestor}  validations:\n    - expression: >-\n        images.containers.map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)\n      message: failed the image Signature verification\n"
        ),
    );
    match annotation {
        None => text,
        Some(value) => text.replacen(
            &format!("  name: {name}\n"),
            &format!("  name: {name}\n  annotations:\n    ivory.dev/verify-platforms: {value}\n"),
            1,
        ),
    }
}

/// Multi-platform images (ivory extension): the policy chooses what must be signed — the index
/// (Kyverno's default), every platform manifest, or the platforms the Pod can run on — and an
/// arm64-only or Windows-only image is verified and its image data read for its platform.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_platform_images_verify_what_the_policy_chooses() {
    let h = RegistryHarness::start_default().await.unwrap();
    let signer = ivory_testkit::CosignSigner::generate().unwrap();
    let host = h.host().to_owned();
    // arm64 only and Windows only: the platform manifest is signed, the index is not.
    let mut images = std::collections::BTreeMap::new();
    for (repo, platforms) in [
        ("ivory/arm-only", &[("linux", "arm64")][..]),
        ("ivory/windows-only", &[("windows", "amd64")][..]),
    ] {
        let (_, children) = h.push_platform_index(repo, "v1", platforms).await.unwrap();
        h.push_cosign_signature(repo, &children[0], &signer)
            .await
            .unwrap();
        images.insert(repo, format!("{host}/{repo}:v1"));
    }
    // Two platforms: the index and its amd64 manifest are signed, the arm64 manifest is not.
    let (index, children) = h
        .push_platform_index(
            "ivory/multi",
            "v1",
            &[("linux", "amd64"), ("linux", "arm64")],
        )
        .await
        .unwrap();
    for digest in [&index, &children[0]] {
        h.push_cosign_signature("ivory/multi", digest, &signer)
            .await
            .unwrap();
    }
    let multi = format!("{host}/ivory/multi:v1");
    let (arm, windows) = (&images["ivory/arm-only"], &images["ivory/windows-only"]);

    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let glob = format!("{host}/*");
    let attestor = ivory_testkit::policy::key_attestor_yaml(&signer.public_pem);
    for (name, annotation) in [
        ("platforms-index", None),
        ("platforms-index-named", Some("index")),
        ("platforms-all", Some("allPlatforms")),
        ("platforms-pod", Some("podPlatform")),
    ] {
        std::fs::write(
            policies.join(format!("{name}.yaml")),
            platforms_policy(name, &glob, annotation, &attestor),
        )
        .unwrap();
    }
    // Image data of a single-platform index is its platform's, where Kyverno asks for
    // linux/amd64 and fails.
    let data = "  validationConfigurations:\n    verifyDigest: false\n    required: false\n  attestors: []\n  validations:\n    - expression: >-\n        object.spec.containers.all(c, image.GetMetadata(c.image).config.os + '/' + image.GetMetadata(c.image).config.architecture == c.name)\n      messageExpression: \"object.spec.containers.map(c, image.GetMetadata(c.image).config.os + '/' + image.GetMetadata(c.image).config.architecture).join(',')\"\n";
    std::fs::write(
        policies.join("platform-data.yaml"),
        policy("platform-data", &glob, data),
    )
    .unwrap();
    std::fs::write(dir.path().join("registry-ca.pem"), h.ca_pem()).unwrap();
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;

    let review = |uid: &str, image: &str, selector: Value| {
        let mut review = pod_review(uid, &[image]);
        if !selector.is_null() {
            review["request"]["object"]["spec"]["nodeSelector"] = selector;
        }
        review
    };
    let amd64 = json!({"kubernetes.io/arch": "amd64"});
    let arm64 = json!({"kubernetes.io/arch": "arm64"});
    let cases = [
        // Kyverno's default: the index's own signature.
        ("platforms-index", arm, Value::Null, false),
        ("platforms-index-named", arm, Value::Null, false),
        ("platforms-index", &multi, Value::Null, true),
        // Every platform manifest.
        ("platforms-all", arm, Value::Null, true),
        ("platforms-all", windows, Value::Null, true),
        ("platforms-all", &multi, Value::Null, false),
        // The platforms the Pod can run on: all of them when it pins none.
        ("platforms-pod", arm, Value::Null, true),
        (
            "platforms-pod",
            windows,
            json!({"kubernetes.io/os": "windows"}),
            true,
        ),
        ("platforms-pod", &multi, amd64.clone(), true),
        ("platforms-pod", &multi, arm64.clone(), false),
        ("platforms-pod", &multi, Value::Null, false),
        // A platform the index does not carry: nothing of it verifies.
        ("platforms-pod", arm, amd64, false),
    ];
    for (n, (policy, image, selector, want)) in cases.iter().enumerate() {
        let (got, resp) = allowed(
            &ivory,
            policy,
            &review(&format!("p-{n}"), image, selector.clone()),
        )
        .await;
        assert_eq!(
            got,
            *want,
            "{policy} on {image} ({selector}): {resp}\n{}",
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
    // The container's name says the platform its image data must describe.
    for (uid, image, platform, selector) in [
        ("d-1", arm, "linux/arm64", Value::Null),
        ("d-2", windows, "windows/amd64", Value::Null),
        ("d-3", &multi, "linux/amd64", Value::Null),
        ("d-4", &multi, "linux/arm64", arm64.clone()),
    ] {
        let mut review = review(uid, image, selector);
        review["request"]["object"]["spec"]["containers"][0]["name"] = json!(platform);
        let (got, resp) = allowed(&ivory, "platform-data", &review).await;
        assert!(got, "{image} on {platform}: {resp}\n{}", ivory.logs());
    }
}
