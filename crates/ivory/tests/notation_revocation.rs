//! Notation revocation through the binary: images signed by the real notation CLI with leaves
//! naming the CRL distribution point http://127.0.0.1:39517/ivory-revocation.crl
//! (`fixtures/notation-revocation`), a Kyverno `notary` policy (strict: revocation enforced), and
//! a CRL server this test starts on that port. `ivory serve` denies the first admission (no data
//! yet, fetch queued), admits once the CRL is in and exports its age; `ivory verify` waits for
//! the fetch and judges once. One test function: the port is fixed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ivory_testkit::crl::crl_server;
use ivory_testkit::{HarnessOptions, RegistryHarness};
use serde_json::Value;

use crate::cli_util::{ivory, write, write_ca};
use crate::util::{Ivory, pod_review, policy};
use ivory_testkit::eventually;
use ivory_testkit::fixtures_dir;

fn dir() -> std::path::PathBuf {
    fixtures_dir().join("notation-revocation")
}

fn notary_policy(glob: &str) -> String {
    let root = std::fs::read_to_string(dir().join("pki/root.pem")).unwrap();
    let root: String = root.lines().map(|l| format!("            {l}\n")).collect();
    policy(
        "notary-revocation",
        glob,
        &format!(
            "  validationConfigurations:
    mutateDigest: false
    verifyDigest: false
  attestors:
    - name: notary
      notary:
        certs:
          value: |-
{root}  validations:
    - expression: >-
        images.containers.map(image, verifyImageSignatures(image, [attestors.notary])).all(e, e > 0)
      message: failed to verify image with notary cert
"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_data_is_fetched_in_the_background_by_serve_and_awaited_by_verify() {
    let h = RegistryHarness::start(HarnessOptions::default())
        .await
        .unwrap();
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("manifest.json")).unwrap())
            .unwrap();
    let mut images = std::collections::BTreeMap::new();
    for case in ["rev-good", "rev-revoked"] {
        let row = &manifest["images"][case];
        let repo = row["repo"].as_str().unwrap();
        h.push_oci_layout(&dir().join("oci").join(repo), repo)
            .await
            .unwrap();
        images.insert(
            case,
            format!("{}/{repo}@{}", h.host(), row["digest"].as_str().unwrap()),
        );
    }
    let good_crl = std::fs::read(dir().join("crl/good.crl")).unwrap();
    let served = Arc::new(Mutex::new(None));
    let server = crl_server(served.clone()).await;

    let tmp = tempfile::tempdir().unwrap();
    let policies = tmp.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    let text = notary_policy(&format!("{}/*", h.host()));
    std::fs::write(policies.join("p.yaml"), &text).unwrap();
    std::fs::write(tmp.path().join("registry-ca.pem"), h.ca_pem()).unwrap();
    let serve = Ivory::start_with_policies(tmp.path(), &policies).await;
    let route = "/ivpol/validate/notary-revocation";

    // The CRL server failing: denied (fail closed), and it stays denied.
    let review = |uid: &str, case: &str| pod_review(uid, &[images[case].as_str()]);
    let denied = serve.review(route, &review("r-0", "rev-good")).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = serve.review(route, &review("r-1", "rev-good")).await;
    assert_eq!(still["allowed"], false, "{still}");
    let logged = eventually(
        "the CRL fetch failure to be logged",
        Duration::from_secs(10),
        || {
            let seen = serve.logs().contains("CRL fetch failed");
            async move { seen }
        },
    )
    .await
    .is_ok();
    assert!(logged, "{}", serve.logs());

    // Once the CRL is served, a later admission is admitted (the unknown verdict was never
    // cached); the revoked signer's image is denied.
    *served.lock().unwrap() = Some(good_crl);
    let mut n = 2;
    let admitted = eventually(
        "the good signer's image to be admitted",
        Duration::from_secs(30),
        || {
            n += 1;
            let r = review(&format!("r-{n}"), "rev-good");
            let serve = &serve;
            async move { serve.review(route, &r).await["allowed"] == true }
        },
    )
    .await
    .is_ok();
    assert!(admitted, "{}", serve.logs());
    let revoked = serve.review(route, &review("r-rev", "rev-revoked")).await;
    assert_eq!(revoked["allowed"], false, "{revoked}");
    let metrics = serve.metrics().await;
    assert!(
        metrics.contains(
            "ivory_revocation_crl_age_seconds{url=\"http://127.0.0.1:39517/ivory-revocation.crl\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("ivory_revocation_fetches_total{result=\"ok\"} 1"),
        "{metrics}"
    );

    // `ivory verify` (one-shot): waits for the fetch it asked for, then judges.
    let file = write(tmp.path(), "verify.yaml", &text);
    let ca = write_ca(tmp.path(), &h);
    let run = ivory([
        "verify",
        "--policy",
        &file.display().to_string(),
        "--registry-ca",
        &ca.display().to_string(),
        "--no-cache",
        "-o",
        "json",
        images["rev-good"].as_str(),
        images["rev-revoked"].as_str(),
    ])
    .await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    let entry = |case: &str| {
        doc["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["image"] == images[case].as_str())
            .unwrap()
            .clone()
    };
    assert_eq!(entry("rev-good")["verdict"], "pass", "{doc}");
    let revoked = entry("rev-revoked");
    assert_eq!(revoked["verdict"], "fail", "{doc}");
    let reason = revoked["policies"][0]["attestors"][0]["reason"].to_string();
    assert!(
        reason.contains("CN=ivory notation rev-revoked signer") && reason.contains("is revoked"),
        "{revoked}"
    );

    // The CRL server gone: `ivory verify` says why it cannot tell.
    server.abort();
    let _ = server.await;
    let run = ivory([
        "verify",
        "--policy",
        &file.display().to_string(),
        "--registry-ca",
        &ca.display().to_string(),
        "--no-cache",
        "-o",
        "json",
        images["rev-good"].as_str(),
    ])
    .await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("unknown, fetching in background"),
        "{}",
        run.stdout
    );
}
