//! `ivory serve --tuf-mirror`: the trusted root of attestors that name none, kept current from
//! a TUF repository (python-tuf built, `fixtures/tuf/`, served on loopback by
//! `ivory_testkit::TufMirror`) while the server runs. The image is signed by the tests' mock
//! Sigstore (`keyless-cosign2`: its Rekor log is in `fixtures/keyless/trusted_root.json` and
//! nowhere else): state 1's root lacks that log, state 2 (root keys rotated) adds it.

use std::time::Duration;

use ivory_testkit::eventually;
use ivory_testkit::review::pod_review_with;
use ivory_testkit::{RegistryHarness, TufMirror, fixtures_dir, tuf_fixtures_dir};
use serde_json::json;

use crate::util::Ivory;

/// A keyless policy over the harness's images, with no `trustedRoot`: the server's root decides.
fn policy(host: &str) -> String {
    let identity: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures_dir().join("keyless/identity.json")).unwrap(),
    )
    .unwrap();
    format!(
        r#"apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: keyless
spec:
  validationActions: [Deny]
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["pods"]
  matchImageReferences:
  - glob: "{host}/*"
  validationConfigurations:
    verifyDigest: false
  attestors:
  - name: mock
    cosign:
      keyless:
        identities:
        - issuer: "{}"
          subject: "{}"
  validations:
  - expression: "images.containers.all(i, verifyImageSignatures(i, [attestors.mock]) > 0)"
    message: unsigned
"#,
        identity["issuer"].as_str().unwrap(),
        identity["subject"].as_str().unwrap()
    )
}

/// The registry with the keyless image (by digest), a folder holding its CA, and a policy
/// folder with [`policy`].
struct Setup {
    h: ivory_testkit::Harness,
    pinned: String,
    dir: tempfile::TempDir,
    policies: std::path::PathBuf,
}

impl Setup {
    async fn start() -> Self {
        let h = RegistryHarness::start_default().await.unwrap();
        let (image, digest) = h.push_fixture("keyless-cosign2").await.unwrap();
        let pinned = format!("{}@{digest}", image.rsplit_once(':').unwrap().0);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("registry-ca.pem"), h.ca_pem()).unwrap();
        let policies = dir.path().join("policies");
        std::fs::create_dir(&policies).unwrap();
        std::fs::write(policies.join("keyless.yaml"), policy(h.host())).unwrap();
        Self {
            h,
            pinned,
            dir,
            policies,
        }
    }
}

/// `ivory serve` arguments: the policies, the registry CA in `dir` and `extra`.
fn serve_args(dir: &std::path::Path, policies: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--policies".to_owned(),
        policies.display().to_string(),
        "--registry-ca".into(),
        dir.join("registry-ca.pem").display().to_string(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// A keyless image is denied while the TUF-served root does not know its log, with a warning
/// naming the log and the root's source and age; a rotation that adds the log is trusted by the running server within
/// a refresh period; refused metadata and a mirror gone keep the root, and say so in metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_server_follows_its_tuf_root_and_names_the_log_it_does_not_know() {
    let Setup {
        h: _registry,
        pinned,
        dir,
        policies,
    } = Setup::start().await;
    let mut mirror = TufMirror::start("state-1").await.unwrap();
    let anchor = tuf_fixtures_dir().join("root-1.json").display().to_string();
    let url = mirror.url();
    let ivory = Ivory::start_in(
        dir.path(),
        &serve_args(
            dir.path(),
            &policies,
            &[
                "--tuf-mirror",
                &url,
                "--tuf-root",
                &anchor,
                "--tuf-refresh-interval",
                "1s",
            ],
        ),
    )
    .await;
    let review = pod_review_with(
        "u1",
        "CREATE",
        "default",
        json!({"containers": [{"name": "app", "image": pinned}]}),
    );
    let judge = || async {
        let response = ivory.review("/ivpol/validate/keyless", &review).await;
        let warnings: Vec<&str> = response["warnings"]
            .as_array()
            .map(|w| w.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        (
            response["allowed"] == true,
            format!(
                "{} | {}",
                response["status"]["message"].as_str().unwrap_or_default(),
                warnings.join(" | ")
            ),
        )
    };
    let source = format!("TUF {}", mirror.url());
    // State 1: denied, naming the log and the TUF source.
    let message = eventually(
        "a denial naming the TUF root",
        Duration::from_secs(20),
        || async {
            let (allowed, message) = judge().await;
            if !allowed
                && message.contains(&format!("unknown to the trust root ({source}, updated "))
            {
                Ok(message)
            } else {
                Err(format!("allowed {allowed}: {message}"))
            }
        },
    )
    .await
    .unwrap();
    // The denial is the policy's (Kyverno's message); the warning beside it names the log.
    assert!(
        message.starts_with("Policy keyless failed: unsigned | image "),
        "{message}"
    );
    assert!(message.contains(": transparency log "), "{message}");

    // Root keys rotated and the log added: the same server admits the image, no restart.
    mirror.switch("state-2").unwrap();
    eventually(
        "the rotated root in force",
        Duration::from_secs(20),
        || async {
            let (allowed, message) = judge().await;
            if allowed { Ok(()) } else { Err(message) }
        },
    )
    .await
    .unwrap();

    // Expired metadata, then the mirror gone: the root is kept, the failures counted.
    mirror.switch("expired").unwrap();
    let failed =
        format!(r#"ivory_trust_root_refreshes_total{{source="{source}",result="failed"}}"#);
    eventually("a counted refusal", Duration::from_secs(20), || async {
        let metrics = ivory.metrics().await;
        metrics
            .lines()
            .any(|l| l.starts_with(&failed) && !l.ends_with(" 0"))
    })
    .await
    .unwrap();
    mirror.down().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (allowed, message) = judge().await;
    assert!(allowed, "the last good root was not kept: {message}");
    let metrics = ivory.metrics().await;
    assert!(
        metrics.contains(&format!(
            r#"ivory_trust_root_age_seconds{{source="{source}"}}"#
        )),
        "{metrics}"
    );
    assert!(
        ivory
            .logs()
            .contains("trusted root refresh failed; the root in force is kept"),
        "{}",
        ivory.logs()
    );
    // `/readyz` (which `ivory doctor` shows for each endpoint) names the source, the root's
    // age and the failing refreshes; the server stays ready.
    let (status, readyz) = ivory.get("/readyz").await;
    assert_eq!(status, 200, "{readyz}");
    assert!(
        readyz.contains(&format!("trusted root: {source} (read "))
            && readyz.contains("last refresh failed, the root in force is kept: TUF "),
        "{readyz}"
    );
}

/// Kyverno's `cosign.tuf` (the attestor's own repository: `mirror`, `root.data` base64 or
/// `root.path`): no server flag needed; `ivory serve` follows it in the background (the first
/// verifications may be answered "not fetched yet", never cached) and `ivory verify` waits for
/// its first fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attestors_own_tuf_repository_verifies_through_serve_and_verify() {
    use base64::Engine as _;
    let Setup {
        h,
        pinned,
        dir,
        policies,
    } = Setup::start().await;
    let mirror = TufMirror::start("state-2").await.unwrap();
    let anchor = std::fs::read(tuf_fixtures_dir().join("root-1.json")).unwrap();
    let tuf = format!(
        "      tuf:\n        mirror: \"{}\"\n        root:\n          data: \"{}\"\n",
        mirror.url(),
        base64::engine::general_purpose::STANDARD.encode(anchor)
    );
    let text = policy(h.host()).replace("      keyless:\n", &format!("{tuf}      keyless:\n"));
    assert!(text.contains("mirror:"), "{text}");
    std::fs::write(policies.join("keyless.yaml"), &text).unwrap();

    // One-shot: waits for the repository's first answer, then verifies.
    let run = crate::cli_util::ivory([
        "verify".to_owned(),
        "--policy".into(),
        policies.join("keyless.yaml").display().to_string(),
        "--registry-ca".into(),
        dir.path().join("registry-ca.pem").display().to_string(),
        "--no-cache".into(),
        pinned.clone(),
    ])
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;
    let review = pod_review_with(
        "u2",
        "CREATE",
        "default",
        json!({"containers": [{"name": "app", "image": pinned}]}),
    );
    eventually(
        "the attestor's TUF root in force",
        Duration::from_secs(20),
        || async {
            let response = ivory.review("/ivpol/validate/keyless", &review).await;
            if response["allowed"] == true {
                Ok(())
            } else {
                Err(response.to_string())
            }
        },
    )
    .await
    .unwrap();
    assert!(mirror.total_requests() > 0);
}

/// The mirror down when the server starts, no cache: the root built into ivory stays in force,
/// the server is ready at once, and an image logged under the custom log is denied in time,
/// the warning naming that log and the built-in root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_mirror_down_at_start_the_built_in_root_answers_in_time_naming_the_log() {
    let Setup {
        h: _registry,
        pinned,
        dir,
        policies,
    } = Setup::start().await;
    let mut mirror = TufMirror::start("state-2").await.unwrap();
    mirror.down().await;
    let anchor = tuf_fixtures_dir().join("root-1.json").display().to_string();
    let url = mirror.url();
    let ivory = Ivory::start_in(
        dir.path(),
        &serve_args(
            dir.path(),
            &policies,
            &["--tuf-mirror", &url, "--tuf-root", &anchor],
        ),
    )
    .await;
    let (status, _) = ivory.get("/readyz").await;
    assert_eq!(status, 200);
    let review = pod_review_with(
        "u3",
        "CREATE",
        "default",
        json!({"containers": [{"name": "app", "image": pinned}]}),
    );
    let started = ivory_clock::now();
    let response = ivory.review("/ivpol/validate/keyless", &review).await;
    assert!(ivory_clock::now() - started < Duration::from_secs(5));
    assert_eq!(response["allowed"], false, "{response}");
    let warnings = response["warnings"].to_string();
    assert!(
        warnings.contains("unknown to the trust root (embedded, built into this ivory)"),
        "{response}"
    );
}
