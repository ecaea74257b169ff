//! Every command (`verify`, `apply`, `audit`, `serve`) against the two registries a person
//! tries first: plain HTTP on 127.0.0.1 (no flag needed, as go-containerregistry does it) and
//! a self-signed TLS one (`--allow-insecure-registry`, or a policy's `allowInsecureRegistry`).
//! Without either, the failure is one line naming the registry and the root cause once.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ivory_testkit::{Harness, HarnessOptions, RegistryHarness};
use serde_json::{Value, json};

use crate::cli_util::{Run, ivory, push_fixture, write};
use crate::util::{Ivory, Tls, VERIFY_SIGNED, key_attestor, pod_review, policy};

/// A registry with the signed and unsigned fixtures, and a policy requiring signatures.
struct Setup {
    h: Harness,
    dir: tempfile::TempDir,
    signed: String,
    signed_digest: String,
    unsigned: String,
    policy: PathBuf,
}

impl Setup {
    /// `policy_extra` is appended to the policy's spec; the policy selects every image of the
    /// registry.
    async fn start(opts: HarnessOptions, policy_extra: &str) -> Self {
        Self::start_selecting(opts, policy_extra, "*").await
    }

    /// The same with a policy selecting `{host}/{glob}`.
    async fn start_selecting(opts: HarnessOptions, policy_extra: &str, glob: &str) -> Self {
        let h = RegistryHarness::start(opts).await.unwrap();
        let (signed, signed_digest) = push_fixture(&h, "sig-p256").await;
        let (unsigned, _) = push_fixture(&h, "unsigned").await;
        let dir = tempfile::tempdir().unwrap();
        let body = format!("{}{VERIFY_SIGNED}{policy_extra}", key_attestor());
        let text = policy("check-images", &format!("{}/{glob}", h.host()), &body);
        let policy = write(dir.path(), "policy.yaml", &text);
        Self {
            h,
            dir,
            signed,
            signed_digest,
            unsigned,
            policy,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn policy_arg(&self) -> String {
        self.policy.display().to_string()
    }
}

fn args(base: &[&str], extra: &[&str]) -> Vec<String> {
    base.iter().chain(extra).map(|s| (*s).to_owned()).collect()
}

fn explain(run: &Run) -> String {
    format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr)
}

/// `ivory verify` of the signed and the unsigned image: pass, then fail.
async fn verify_passes_signed_and_fails_unsigned(s: &Setup, extra: &[&str]) {
    let policy = s.policy_arg();
    let run = ivory(args(
        &["verify", "--policy", &policy, "-o", "json", &s.signed],
        extra,
    ))
    .await;
    assert_eq!(run.code, 0, "{}", explain(&run));
    assert_eq!(run.json()["images"][0]["digest"], s.signed_digest);
    let run = ivory(args(
        &["verify", "--policy", &policy, "-o", "json", &s.unsigned],
        extra,
    ))
    .await;
    assert_eq!(run.code, 1, "{}", explain(&run));
    assert_eq!(run.json()["images"][0]["verdict"], "fail");
}

/// `ivory apply` of an AdmissionReview file: the signed Pod is pinned and admitted, the
/// unsigned one denied.
async fn apply_reviews(s: &Setup, extra: &[&str]) {
    let signed = write(
        s.path(),
        "signed-review.json",
        &pod_review("a-1", &[&s.signed]).to_string(),
    );
    let unsigned = write(
        s.path(),
        "unsigned-review.json",
        &pod_review("a-2", &[&s.unsigned]).to_string(),
    );
    let policy = s.policy_arg();
    let run = ivory(args(
        &[
            "apply",
            "--policy",
            &policy,
            "--resource",
            signed.to_str().unwrap(),
            "-o",
            "json",
        ],
        extra,
    ))
    .await;
    assert_eq!(run.code, 0, "{}", explain(&run));
    let doc = run.json();
    let resource = &doc["resources"][0];
    assert_eq!(resource["resource"], "Pod/default/web", "{doc}");
    assert_eq!(
        resource["object"]["spec"]["containers"][0]["image"],
        format!("{}@{}", s.signed, s.signed_digest),
        "{doc}"
    );
    let run = ivory(args(
        &[
            "apply",
            "--policy",
            &policy,
            "--resource",
            unsigned.to_str().unwrap(),
            "-o",
            "json",
        ],
        extra,
    ))
    .await;
    assert_eq!(run.code, 1, "{}", explain(&run));
    let message = run.json()["resources"][0]["message"].to_string();
    assert!(
        message.contains("failed the image Signature verification"),
        "{message}"
    );
}

/// `ivory audit --registry HOST`: the catalog is listed and both images judged.
async fn audit_registry(s: &Setup, extra: &[&str]) {
    let policy = s.policy_arg();
    let run = ivory(args(
        &[
            "audit",
            "--registry",
            s.h.host(),
            "--policy",
            &policy,
            "-o",
            "json",
        ],
        extra,
    ))
    .await;
    assert_eq!(run.code, 1, "{}", explain(&run));
    let summary = &run.json()["summary"];
    assert_eq!(summary["pass"], 1, "{}", explain(&run));
    assert_eq!(summary["fail"], 1, "{}", explain(&run));
    assert_eq!(summary["error"], 0, "{}", explain(&run));
}

/// `ivory serve`: mutate pins the tag, validate admits the pinned signed Pod and denies the
/// unsigned one.
async fn serve_mutates_then_validates(s: &Setup, extra: &[&str]) {
    let tls = Tls::write(s.path(), "ivory test CA");
    let mut flags = vec!["--policies".to_owned(), s.policy_arg()];
    flags.extend(extra.iter().map(|f| (*f).to_owned()));
    let ivory = Ivory::start(&tls, &flags).await;
    let resp = ivory
        .review(
            "/ivpol/mutate/check-images",
            &pod_review("s-1", &[&s.signed]),
        )
        .await;
    assert_eq!(resp["allowed"], true, "{resp}\n{}", ivory.logs());
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap_or_default())
        .unwrap();
    let pinned = format!("{}@{}", s.signed, s.signed_digest);
    assert_eq!(
        serde_json::from_slice::<Value>(&patch).unwrap(),
        json!([{"op": "replace", "path": "/spec/containers/0/image", "value": pinned}])
    );
    let resp = ivory
        .review(
            "/ivpol/validate/check-images",
            &pod_review("s-2", &[&pinned]),
        )
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let resp = ivory
        .review(
            "/ivpol/validate/check-images",
            &pod_review("s-3", &[&s.unsigned]),
        )
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_against_a_plain_http_registry_on_loopback_without_flags() {
    let s = Setup::start(HarnessOptions::plain_http(), "").await;
    assert!(s.h.base_url().starts_with("http://"));
    verify_passes_signed_and_fails_unsigned(&s, &[]).await;
    apply_reviews(&s, &[]).await;
    audit_registry(&s, &[]).await;
    serve_mutates_then_validates(&s, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_against_a_self_signed_registry_with_allow_insecure_registry() {
    let s = Setup::start(HarnessOptions::default(), "").await;
    let flag = ["--allow-insecure-registry"];
    verify_passes_signed_and_fails_unsigned(&s, &flag).await;
    apply_reviews(&s, &flag).await;
    audit_registry(&s, &flag).await;
    serve_mutates_then_validates(&s, &flag).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_allowing_an_insecure_registry_is_honoured_by_every_command() {
    let extra = "  credentials:\n    allowInsecureRegistry: true\n";
    // The policy selects one namespace of the registry, not the whole host: the catalog and
    // each repository's tags are still listed the way verifying their images will reach them.
    let s = Setup::start_selecting(HarnessOptions::default(), extra, "ivory/*").await;
    verify_passes_signed_and_fails_unsigned(&s, &[]).await;
    apply_reviews(&s, &[]).await;
    audit_registry(&s, &[]).await;
    serve_mutates_then_validates(&s, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_one_line_naming_image_registry_and_cause() {
    let s = Setup::start(HarnessOptions::default(), "").await;
    let host = s.h.host();
    let cause = format!("cannot reach {host} (TLS certificate signed by an unknown authority)");

    // verify: one line per image that could not be checked.
    let policy = s.policy_arg();
    let run = ivory(["verify", "--policy", &policy, &s.signed, &s.unsigned]).await;
    assert_eq!(run.code, 2, "{}", explain(&run));
    assert_eq!(
        run.stdout,
        format!(
            "ERROR  {}: {cause}\nERROR  {}: {cause}\n2 images: 0 pass, 0 fail, 2 error\n",
            s.signed, s.unsigned
        )
    );

    // serve: the denial keeps Kyverno's prefix and names the image once.
    let ivory = Ivory::start_in(s.path(), &["--policies".to_owned(), policy]).await;
    let review = pod_review("e-1", &[&s.signed, &s.unsigned]);
    let resp = ivory.review("/ivpol/mutate/check-images", &review).await;
    assert_eq!(resp["allowed"], false, "{resp}");
    let message = resp["status"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        format!(
            "Policy check-images error: failed to update digest: \
             failed to resolve digest for image {}: {cause}; \
             failed to resolve digest for image {}: {cause}",
            s.signed, s.unsigned
        )
    );
}
