//! Notation revocation through real parts: images signed by the real notation CLI (v1.3.2,
//! `fixtures/notation-revocation`, see `fixtures/gen/gen_notation_revocation.py`) with leaves
//! whose certificates name the CRL distribution point http://127.0.0.1:39517/ivory-revocation.crl,
//! a real registry (ivory-testkit), and a CRL server this test starts on that port, serving the
//! CRLs the generator made (good, stale, signed by another key) or failing. One test function
//! uses the port (it is fixed: it is inside the signed certificates). The same fixtures hold a
//! signature timestamped by an RSA TSA and one of the `notary.x509.signingAuthority` scheme.

// Test helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ivory_engine::verifier::{ImageVerifier, Verification, VerifyRequest};
use ivory_policy::notation::{Action, Check, NotationTrustPolicy, TrustStore};
use ivory_policy::types::{Attestor, Notary, StringSource};
use ivory_registry::{Config, Registry};
use ivory_testkit::crl::{ServedCrl, crl_server};
use ivory_testkit::{Harness, HarnessOptions, RegistryHarness};
use ivory_verify::{CosignVerifier, RevocationConfig, VerifierConfig};
use serde_json::Value;

const CRL_URL: &str = "http://127.0.0.1:39517/ivory-revocation.crl";

/// The fixtures of this file's tests: `fixtures/notation-revocation`.
fn revocation_fixtures() -> PathBuf {
    ivory_testkit::fixtures_dir().join("notation-revocation")
}

fn manifest() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(revocation_fixtures().join("manifest.json")).unwrap(),
    )
    .unwrap()
}

fn crl(name: &str) -> Vec<u8> {
    std::fs::read(
        revocation_fixtures()
            .join("crl")
            .join(format!("{name}.crl")),
    )
    .unwrap()
}

fn attestor(trust: Option<NotationTrustPolicy>) -> Attestor {
    let root = std::fs::read_to_string(revocation_fixtures().join("pki/root.pem")).unwrap();
    Attestor {
        name: "notary".into(),
        cosign: None,
        notary: Some(Notary {
            certs: Some(StringSource {
                value: Some(root),
                expression: None,
            }),
            tsa_certs: None,
            trust_policy: trust,
        }),
    }
}

fn revocation(action: Action) -> Option<NotationTrustPolicy> {
    Some(NotationTrustPolicy {
        overrides: [(Check::Revocation, action)].into(),
        ..NotationTrustPolicy::default()
    })
}

/// A verifier with a store of its own; failed fetches retried after a second.
fn verifier(h: &Harness, settle: Option<Duration>) -> CosignVerifier {
    let config = Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    };
    CosignVerifier::new(
        Registry::new(config).unwrap(),
        VerifierConfig {
            revocation: RevocationConfig {
                retry_after: Duration::from_secs(1),
                fetch_timeout: Duration::from_secs(3),
                ..RevocationConfig::default()
            },
            revocation_settle: settle,
            ..VerifierConfig::default()
        },
        CosignVerifier::anonymous_credentials(),
    )
}

async fn push(h: &Harness, case: &str) -> String {
    let row = &manifest()["images"][case];
    let repo = row["repo"].as_str().unwrap();
    let tags = h
        .push_oci_layout(&revocation_fixtures().join("oci").join(repo), repo)
        .await
        .unwrap();
    assert!(tags.contains_key("v1"), "{case}: {tags:?}");
    format!("{}/{repo}@{}", h.host(), row["digest"].as_str().unwrap())
}

async fn verify(v: &CosignVerifier, image: &str, attestor: Attestor) -> Verification {
    let request = VerifyRequest {
        image: ivory_reference::ImageReference::parse(image).unwrap(),
        attestor,
        attestation: None,
        credentials: None,
        platforms: Default::default(),
    };
    v.verify(&request, ivory_clock::now() + Duration::from_secs(20))
        .await
        .unwrap()
}

fn reason(v: &Verification) -> String {
    match v {
        Verification::NotVerified { reason, .. } => reason.to_string(),
        other => panic!("expected not verified, got {other:?}"),
    }
}

/// Verifies until the verdict is not "unknown" any more (the background fetch landed), at
/// most 10 s; returns the last verdict.
async fn once_known(v: &CosignVerifier, image: &str, attestor: &Attestor) -> Verification {
    let until = ivory_clock::now() + Duration::from_secs(10);
    loop {
        let got = verify(v, image, attestor.clone()).await;
        let unknown =
            matches!(&got, Verification::NotVerified { reason, .. } if reason.is_transient());
        if !unknown || ivory_clock::now() > until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Verifies once (which queues a fetch), waits for that fetch to end, and verifies again.
async fn after_fetch(v: &CosignVerifier, image: &str, attestor: &Attestor) -> Verification {
    let count = |v: &CosignVerifier| {
        let s = v.revocation_stats();
        s.fetched + s.failed
    };
    let before = count(v);
    let first = verify(v, image, attestor.clone()).await;
    let until = ivory_clock::now() + Duration::from_secs(10);
    while count(v) == before && ivory_clock::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(count(v) > before, "no fetch after {first:?}");
    verify(v, image, attestor.clone()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crls_fetched_in_the_background_decide_revocation() {
    let h = RegistryHarness::start(HarnessOptions::default())
        .await
        .unwrap();
    assert_eq!(manifest()["crlUrl"], CRL_URL);
    let good = push(&h, "rev-good").await;
    let revoked = push(&h, "rev-revoked").await;
    let strict = attestor(None);
    let served: ServedCrl = Arc::new(Mutex::new(Some(crl("good"))));
    let server = crl_server(served.clone()).await;

    // Strict (Kyverno's level) checks revocation. The first admission finds no data: denied
    // (fail closed), naming why, and the fetch is queued, never waited for.
    let v = verifier(&h, None);
    let first = verify(&v, &good, strict.clone()).await;
    let why = reason(&first);
    assert!(
        why.contains("revocation status of certificate")
            && why.contains("unknown, fetching in background")
            && why.contains(CRL_URL),
        "{why}"
    );
    // Not cached: once the CRL is in, the same image is admitted.
    let later = once_known(&v, &good, &strict).await;
    assert!(later.is_verified(), "{later:?}");
    // Revoked: denied, naming the certificate.
    let denied = once_known(&v, &revoked, &strict).await;
    let why = reason(&denied);
    assert!(
        why.contains("CN=ivory notation rev-revoked signer") && why.contains("is revoked since"),
        "{why}"
    );
    // The data's age is exported.
    let stats = v.revocation_stats();
    assert_eq!(stats.crls.len(), 1, "{stats:?}");
    assert_eq!(stats.crls[0].url, CRL_URL);
    assert!(stats.crls[0].age_seconds >= 0 && stats.crls[0].age_seconds < 60);
    assert!(stats.crls[0].next_update_in_seconds.unwrap() > 86_400);
    assert!(stats.fetched >= 1, "{stats:?}");

    // A one-shot command (revocation_settle) waits for the fetch it asked for and judges once.
    let cli = verifier(&h, Some(Duration::from_secs(5)));
    assert!(verify(&cli, &good, strict.clone()).await.is_verified());

    // The CRL signed by another key: unusable, so unknown (never "not revoked"); once the right
    // CRL is served, a later admission passes (the unknown verdict was not cached).
    *served.lock().unwrap() = Some(crl("wrong-key"));
    let v = verifier(&h, None);
    let wrong = after_fetch(&v, &good, &strict).await;
    let why = reason(&wrong);
    assert!(
        why.contains("does not verify with the issuer's key") && why.contains("unknown"),
        "{why}"
    );
    *served.lock().unwrap() = Some(crl("good"));
    let until = ivory_clock::now() + Duration::from_secs(10);
    let mut now_good = verify(&v, &good, strict.clone()).await;
    while !now_good.is_verified() && ivory_clock::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        now_good = verify(&v, &good, strict.clone()).await;
    }
    assert!(now_good.is_verified(), "{now_good:?}");

    // A CRL whose nextUpdate has passed: unknown, naming it stale.
    *served.lock().unwrap() = Some(crl("stale"));
    let v = verifier(&h, None);
    let stale = after_fetch(&v, &revoked, &strict).await;
    assert!(reason(&stale).contains("is stale"), "{stale:?}");

    // The server failing (503), then gone: enforce denies with the reason, log admits, skip
    // never asks.
    *served.lock().unwrap() = None;
    let v = verifier(&h, None);
    let failing = after_fetch(&v, &good, &strict).await;
    assert!(
        reason(&failing).contains("unknown, fetching in background"),
        "{failing:?}"
    );
    server.abort();
    let _ = server.await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let down = verify(&v, &good, attestor(revocation(Action::Enforce))).await;
    assert!(
        reason(&down).contains("no CRL fetched yet from"),
        "{down:?}"
    );
    assert!(v.revocation_stats().failed >= 1);
    let logged = verify(&v, &good, attestor(revocation(Action::Log))).await;
    assert!(logged.is_verified(), "{logged:?}");
    let skipped = verifier(&h, None);
    assert!(
        verify(&skipped, &revoked, attestor(revocation(Action::Skip)))
            .await
            .is_verified()
    );
    assert!(skipped.revocation_stats().fetched + skipped.revocation_stats().failed == 0);
}

fn attestor_with_tsa(tsa_root: &str) -> Attestor {
    let mut a = attestor(None);
    if let Some(n) = a.notary.as_mut() {
        n.tsa_certs = Some(StringSource {
            value: Some(tsa_root.to_owned()),
            expression: None,
        });
    }
    a
}

/// A signature timestamped by an RSA 3072 TSA (notation CLI, `rsa-tsa`): verified to the RSA
/// TSA's root, not to another TSA root; without `tsaCerts` the timestamp is not needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa_tsa_timestamps_verify_to_their_root() {
    let h = RegistryHarness::start(HarnessOptions::default())
        .await
        .unwrap();
    let image = push(&h, "rsa-tsa").await;
    let v = verifier(&h, None);
    let rsa_root =
        std::fs::read_to_string(revocation_fixtures().join("pki/rsa-tsa-root.pem")).unwrap();
    let ec_root =
        std::fs::read_to_string(revocation_fixtures().join("../notation/pki/tsa-root.pem"))
            .unwrap();
    let ok = verify(&v, &image, attestor_with_tsa(&rsa_root)).await;
    assert!(ok.is_verified(), "{ok:?}");
    let other = verify(&v, &image, attestor_with_tsa(&ec_root)).await;
    assert!(
        reason(&other).contains("does not verify to tsaCerts"),
        "{other:?}"
    );
    let plain = verify(&v, &image, attestor(None)).await;
    assert!(plain.is_verified(), "{plain:?}");
}

/// A `notary.x509.signingAuthority` signature (notation-core-go, `signing-authority`; notation
/// verify passes it with a signingAuthority store and fails it with a ca store): verified only
/// when the attestor's certs are a `signingAuthority` trust store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_authority_signatures_verify_only_under_a_signing_authority_store() {
    let h = RegistryHarness::start(HarnessOptions::default())
        .await
        .unwrap();
    let row = &manifest()["images"]["signing-authority"]["oracle"];
    assert_eq!(row["signingAuthority-store"]["verdict"], "pass");
    assert_eq!(row["ca-store"]["verdict"], "fail");
    let image = push(&h, "signing-authority").await;
    let v = verifier(&h, None);
    let as_authority = Some(NotationTrustPolicy {
        certs_trust_store: Some(TrustStore::SigningAuthority),
        ..NotationTrustPolicy::default()
    });
    let ok = verify(&v, &image, attestor(as_authority)).await;
    let Verification::Verified { signer, .. } = &ok else {
        panic!("{ok:?}");
    };
    let subject = signer.as_ref().and_then(|s| s.subject.clone()).unwrap();
    assert!(subject.contains("signing authority signer"), "{subject}");
    let as_ca = verify(&v, &image, attestor(None)).await;
    assert!(
        reason(&as_ca).contains("needs a signingAuthority trust store"),
        "{as_ca:?}"
    );
}
