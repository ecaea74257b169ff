//! Dogfood: ivory's own image as `scripts/image.sh` builds it (packaging the binary under test),
//! pushed to the real registry, signed and attested with real cosign v2, then judged by
//! `ivory verify` and `ivory serve` with `policies/samples/verify-ivory.yaml`.

use std::path::{Path, PathBuf};
use std::process::Output;

use base64::Engine as _;
use ivory_testkit::{Harness, RegistryHarness};
use serde_json::Value;

use crate::cli_util::{ivory, write, write_ca};
use crate::util::{BIN, Ivory, pod_review};

const SIGNED: &str = "ivory's image must be signed with the ivory release key";
const SBOM: &str =
    "ivory's image needs a CycloneDX SBOM attestation signed with the ivory release key";
const COMMIT: &str = "ivory's provenance must be for the commit the image was built from";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The commit `scripts/image.sh` builds from.
fn head_commit() -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo_root())
        .args(["rev-parse", "HEAD"])
        .output()
        .expect("git runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A tool built by `scripts/install-tools.sh image` (scripts/test.sh runs it); missing fails.
fn tool(name: &str) -> PathBuf {
    let path = repo_root().join(".tools/bin").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/install-tools.sh image",
        path.display()
    );
    path
}

fn check(what: &str, out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The Go tools and image.sh trust only the harness CA.
fn command(program: &Path, dir: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.current_dir(dir)
        .env("SSL_CERT_FILE", dir.join("registry-ca.pem"))
        .env("COSIGN_PASSWORD", "")
        .env("COSIGN_YES", "true");
    cmd
}

/// `scripts/image.sh --binary <the ivory under test> <args>`; returns stdout.
async fn image_sh(dir: &Path, args: &[&str], epoch: Option<&str>) -> String {
    let mut cmd = command(Path::new("bash"), dir);
    cmd.arg(repo_root().join("scripts/image.sh"))
        .args(["--binary", BIN])
        .args(args);
    if let Some(e) = epoch {
        cmd.env("SOURCE_DATE_EPOCH", e);
    }
    check(&format!("image.sh {args:?}"), cmd.output().await.unwrap())
}

/// `cosign sign` of `image` with the options `sign`, then `cosign attest` of each
/// (predicate type, predicate file) of `predicates` with the same options.
async fn sign_and_attest(dir: &Path, sign: &[&str], image: &str, predicates: &[(&str, &String)]) {
    cosign(dir, &[&["sign"][..], sign, &[image]].concat()).await;
    for (kind, predicate) in predicates {
        let attest = ["--type", kind, "--predicate", predicate.as_str(), image];
        cosign(dir, &[&["attest"][..], sign, &attest].concat()).await;
    }
}

async fn cosign(dir: &Path, args: &[&str]) -> String {
    let out = command(&tool("cosign2"), dir)
        .args(args)
        .output()
        .await
        .unwrap();
    check(&format!("cosign {args:?}"), out)
}

/// The sample policy, pointed at the harness repository and the test's release key.
fn policy(dir: &Path, h: &Harness) -> PathBuf {
    let sample =
        std::fs::read_to_string(repo_root().join("policies/samples/verify-ivory.yaml")).unwrap();
    let start = sample.find("          data: |\n").unwrap();
    let end =
        sample.find("-----END PUBLIC KEY-----\n").unwrap() + "-----END PUBLIC KEY-----\n".len();
    let pem = std::fs::read_to_string(dir.join("cosign.pub")).unwrap();
    let key: String = pem.lines().map(|l| format!("            {l}\n")).collect();
    let text = format!(
        "{}          data: |\n{key}{}",
        &sample[..start],
        &sample[end..]
    )
    .replace("ghcr.io/ivory/ivory*", &format!("{}/ivory/*", h.host()));
    write(dir, "verify-ivory.yaml", &text)
}

/// Replaces the SBOM in the image's attestation manifest with a different one, keeping the DSSE
/// signature: what an attacker with write access to the registry, but not the key, can do.
async fn tamper_sbom(h: &Harness, repo: &str, digest: &str) {
    let tag = format!("{}.att", digest.replace(':', "-"));
    let client = h.http_client().unwrap();
    let get = |path: String, accept: &'static str| {
        let client = client.clone();
        let url = format!("{}/v2/{repo}/{path}", h.base_url());
        async move {
            let resp = client
                .get(&url)
                .header("accept", accept)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 200, "GET {url}");
            resp.bytes().await.unwrap().to_vec()
        }
    };
    let mut manifest: Value = serde_json::from_slice(
        &get(
            format!("manifests/{tag}"),
            "application/vnd.oci.image.manifest.v1+json",
        )
        .await,
    )
    .unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let layers = manifest["layers"].as_array_mut().unwrap();
    let layer = layers
        .iter_mut()
        .find(|l| l["annotations"]["predicateType"] == "https://cyclonedx.org/bom")
        .expect("an SBOM attestation layer");
    let blob = get(
        format!("blobs/{}", layer["digest"].as_str().unwrap()),
        "*/*",
    )
    .await;
    let mut envelope: Value = serde_json::from_slice(&blob).unwrap();
    let mut statement: Value =
        serde_json::from_slice(&b64.decode(envelope["payload"].as_str().unwrap()).unwrap())
            .unwrap();
    statement["predicate"]["components"] = serde_json::json!([]);
    envelope["payload"] = b64.encode(statement.to_string()).into();
    let tampered = envelope.to_string().into_bytes();
    let new_digest = h.push_blob(repo, &tampered).await.unwrap();
    layer["digest"] = new_digest.into();
    layer["size"] = tampered.len().into();
    h.push_manifest(
        repo,
        &tag,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.to_string().as_bytes(),
    )
    .await
    .unwrap();
}

/// `ivory verify --policy … -o json IMAGE`: exit code and the JSON report (stdout and stderr).
async fn verify(image: &str, policy: &Path, ca: &Path) -> (i32, String) {
    let run = ivory([
        "verify",
        "--policy",
        &policy.display().to_string(),
        "--registry-ca",
        &ca.display().to_string(),
        "-o",
        "json",
        image,
    ])
    .await;
    let doc = run.json();
    assert_eq!(doc["images"][0]["image"], image, "{doc}");
    (run.code, format!("{doc}\n{}", run.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ivory_verifies_its_own_signed_attested_image_and_denies_forgeries() {
    let h = RegistryHarness::start_default().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = write_ca(dir, &h);
    cosign(dir, &["generate-key-pair"]).await;
    let key = dir.join("cosign.key").display().to_string();

    // Reproducible: two builds of the same commit and binary are the same image, byte for byte.
    let repo = format!("{}/ivory/ivory", h.host());
    let out_a = dir.join("a").display().to_string();
    let out_b = dir.join("b").display().to_string();
    let head_before = head_commit();
    let pushed = image_sh(
        dir,
        &["--out", &out_a, "--push", &repo, "--sign-key", &key],
        None,
    )
    .await;
    image_sh(dir, &["--out", &out_b], None).await;
    // The image records the commit and its time: a commit made while this test runs changes
    // them between the two builds, which is not a reproducibility failure.
    assert_eq!(
        head_before,
        head_commit(),
        "HEAD moved while the two builds ran (a commit was made during the test): rerun"
    );
    let digest_a = std::fs::read_to_string(dir.join("a/digest")).unwrap();
    let digest_b = std::fs::read_to_string(dir.join("b/digest")).unwrap();
    println!("reproducibility: build a {digest_a}build b {digest_b}");
    assert_eq!(digest_a, digest_b);
    for file in ["oci/index.json", "oci/oci-layout"] {
        assert_eq!(
            std::fs::read(dir.join("a").join(file)).unwrap(),
            std::fs::read(dir.join("b").join(file)).unwrap(),
            "{file}"
        );
    }
    let digest = digest_a.trim();
    let good = format!("{repo}@{digest}");
    assert_eq!(pushed.trim(), good);

    // The provenance names this script, the commit, and the toolchain.
    let provenance: Value =
        serde_json::from_slice(&std::fs::read(dir.join("a/provenance.json")).unwrap()).unwrap();
    let commit = check(
        "git rev-parse",
        std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(repo_root())
            .output()
            .unwrap(),
    );
    assert_eq!(
        provenance["buildDefinition"]["externalParameters"]["source"]["digest"]["gitCommit"],
        commit.trim()
    );
    assert!(
        provenance["runDetails"]["builder"]["version"]["rustc"]
            .as_str()
            .unwrap()
            .starts_with("rustc 1."),
        "{provenance}"
    );
    let sbom: Value =
        serde_json::from_slice(&std::fs::read(dir.join("a/sbom.cdx.json")).unwrap()).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(
        sbom["metadata"]["component"]["name"], "ivory",
        "{}",
        sbom["metadata"]
    );
    let components = sbom["components"].as_array().unwrap();
    assert!(
        components.iter().any(|c| c["name"] == "rustls"),
        "the SBOM lists the binary's crates"
    );

    // An unsigned rebuild (another SOURCE_DATE_EPOCH: another digest).
    let unsigned_repo = format!("{}/ivory/unsigned", h.host());
    let out_c = dir.join("c").display().to_string();
    let unsigned = image_sh(dir, &["--out", &out_c, "--push", &unsigned_repo], Some("1")).await;
    let unsigned = unsigned.trim().to_owned();
    assert!(!unsigned.ends_with(digest), "{unsigned}");

    // The same image, signed and attested, but with its SBOM rewritten after signing.
    let tampered_repo = "ivory/tampered";
    h.push_oci_layout(&dir.join("a/oci"), tampered_repo)
        .await
        .unwrap();
    let tampered = format!("{}/{tampered_repo}@{digest}", h.host());
    let sbom_path = dir.join("a/sbom.cdx.json").display().to_string();
    let prov_path = dir.join("a/provenance.json").display().to_string();
    let sign = ["--key", &key, "--tlog-upload=false"];
    sign_and_attest(
        dir,
        &sign,
        &tampered,
        &[("cyclonedx", &sbom_path), ("slsaprovenance1", &prov_path)],
    )
    .await;
    tamper_sbom(&h, tampered_repo, digest).await;

    // The same image, signed and attested, with a provenance for another commit.
    let other_repo = "ivory/other-commit";
    h.push_oci_layout(&dir.join("a/oci"), other_repo)
        .await
        .unwrap();
    let other = format!("{}/{other_repo}@{digest}", h.host());
    let mut foreign = provenance.clone();
    foreign["buildDefinition"]["externalParameters"]["source"]["digest"]["gitCommit"] =
        "1111111111111111111111111111111111111111".into();
    let foreign_path = write(dir, "foreign.json", &foreign.to_string())
        .display()
        .to_string();
    sign_and_attest(
        dir,
        &sign,
        &other,
        &[
            ("cyclonedx", &sbom_path),
            ("slsaprovenance1", &foreign_path),
        ],
    )
    .await;

    // ivory verify: the real image passes, each forgery fails with its reason.
    let policy = policy(dir, &h);
    let (code, message) = verify(&good, &policy, &ca).await;
    assert_eq!(code, 0, "{message}");
    let cases = [(&unsigned, SIGNED), (&tampered, SBOM), (&other, COMMIT)];
    for (image, reason) in cases {
        let (code, message) = verify(image, &policy, &ca).await;
        assert_eq!(code, 1, "{image}: {message}");
        assert!(message.contains(reason), "{image}: {message}");
    }

    // ivory serve: the same answers as an admission webhook.
    let server = Ivory::start_with_policies(dir, &policy).await;
    let path = "/ivpol/validate/verify-ivory";
    let resp = server.review(path, &pod_review("good", &[&good])).await;
    assert_eq!(resp["allowed"], true, "{resp}\n{}", server.logs());
    for (i, (image, reason)) in cases.iter().enumerate() {
        let resp = server
            .review(path, &pod_review(&format!("bad-{i}"), &[image]))
            .await;
        assert_eq!(resp["allowed"], false, "{image}: {resp}");
        let message = resp["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("Policy verify-ivory failed: ") && message.contains(reason),
            "{image}: {message}"
        );
    }
}
