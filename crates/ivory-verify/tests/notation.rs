//! Notation signatures made by the real notation CLI (v1.3.2, `fixtures/notation`, see
//! `fixtures/gen/gen_notation.py`) verified through a real Distribution registry with TLS
//! (ivory-testkit), which has no referrers API: signatures are found through the referrers tag
//! schema, as notation itself stores them there.

// Test helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use ivory_engine::verifier::{ImageVerifier, Verification, VerifyRequest};
use ivory_policy::notation::{Action, Check, Level, NotationTrustPolicy, VerifyTimestamp};
use ivory_policy::types::{Attestation, Attestor, Notary, StringSource, TypeRef};
use ivory_registry::{Config, Registry};
use ivory_testkit::{Harness, RegistryHarness};
use ivory_verify::{CosignVerifier, VerifierConfig};
use serde_json::Value;

/// The fixtures of this file's tests: `fixtures/notation`.
fn notation_fixtures() -> PathBuf {
    ivory_testkit::fixtures_dir().join("notation")
}

fn pem(name: &str) -> String {
    std::fs::read_to_string(notation_fixtures().join("pki").join(name)).unwrap()
}

fn manifest() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(notation_fixtures().join("manifest.json")).unwrap(),
    )
    .unwrap()
}

fn attestor(certs: &str, tsa: Option<&str>, trust: Option<NotationTrustPolicy>) -> Attestor {
    let source = |v: &str| StringSource {
        value: Some(v.to_owned()),
        expression: None,
    };
    Attestor {
        name: "notary".into(),
        cosign: None,
        notary: Some(Notary {
            certs: Some(source(certs)),
            tsa_certs: tsa.map(source),
            trust_policy: trust,
        }),
    }
}

fn level(level: Level) -> Option<NotationTrustPolicy> {
    Some(NotationTrustPolicy {
        level: Some(level),
        ..NotationTrustPolicy::default()
    })
}

fn verifier(h: &Harness) -> CosignVerifier {
    let config = Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    };
    CosignVerifier::new(
        Registry::new(config).unwrap(),
        VerifierConfig::default(),
        CosignVerifier::anonymous_credentials(),
    )
}

/// Pushes the layout of `case` and returns `host/repo@digest` of its image.
async fn push(h: &Harness, case: &str) -> String {
    let row = &manifest()["images"][case];
    let repo = row["repo"].as_str().unwrap();
    let layout = notation_fixtures().join("oci").join(repo);
    let tags = h.push_oci_layout(&layout, repo).await.unwrap();
    assert!(tags.contains_key("v1"), "{case}: {tags:?}");
    format!("{}/{repo}@{}", h.host(), row["digest"].as_str().unwrap())
}

async fn verify(
    v: &CosignVerifier,
    image: &str,
    attestor: Attestor,
    attestation: Option<Attestation>,
) -> Verification {
    let request = VerifyRequest {
        image: ivory_engine::verifier::ImageReference::parse(image).unwrap(),
        attestor,
        attestation,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notation_cli_signatures_through_a_real_registry() {
    let h = RegistryHarness::start_default().await.unwrap();
    let v = verifier(&h);
    let (root, other, tsa) = (pem("root.pem"), pem("other-root.pem"), pem("tsa-root.pem"));
    let mut images = std::collections::BTreeMap::new();
    for case in [
        "jws",
        "cose",
        "unsigned",
        "tampered",
        "other-digest",
        "expired",
        "expired-tsa",
        "many",
        "sig-expired",
        "cose-tsa",
        "alg-ps256-jws",
        "alg-ps512-cose",
        "alg-es384-cose",
        "alg-es512-jws",
    ] {
        images.insert(case, push(&h, case).await);
    }

    // Signed, JWS and COSE, with every algorithm of the specification (ES256, PS384 COSE,
    // PS256, PS512 COSE, ES384 COSE, ES512): verified with Kyverno's strict policy, and the
    // signer is a leaf of the fixture CA.
    for case in [
        "jws",
        "cose",
        "alg-ps256-jws",
        "alg-ps512-cose",
        "alg-es384-cose",
        "alg-es512-jws",
    ] {
        let ok = verify(&v, &images[case], attestor(&root, None, None), None).await;
        let Verification::Verified { signer, digest, .. } = &ok else {
            panic!("{case}: {ok:?}");
        };
        assert!(images[case].ends_with(digest.as_str()));
        let signer = signer.as_ref().unwrap();
        assert!(
            signer
                .subject
                .as_deref()
                .unwrap()
                .contains("ivory notation"),
            "{signer:?}"
        );
        assert!(signer.issuer.as_deref().unwrap().contains("test root"));
    }

    // Unsigned: Kyverno's words.
    let unsigned = verify(&v, &images["unsigned"], attestor(&root, None, None), None).await;
    assert_eq!(reason(&unsigned), "signatures not found");

    // Another CA.
    let wrong = verify(&v, &images["jws"], attestor(&other, None, None), None).await;
    assert!(
        reason(&wrong).contains("does not chain to the attestor's certs"),
        "{wrong:?}"
    );

    // Tampered payload: the signature no longer verifies.
    let tampered = verify(&v, &images["tampered"], attestor(&root, None, None), None).await;
    assert!(
        reason(&tampered).contains("does not verify with the signing certificate's key"),
        "{tampered:?}"
    );

    // Another image's signature: its targetArtifact names that image.
    let copied = verify(
        &v,
        &images["other-digest"],
        attestor(&root, None, None),
        None,
    )
    .await;
    let jws_digest = images["jws"].split_once('@').unwrap().1;
    assert!(
        reason(&copied).contains(&format!("the signature is for {jws_digest}")),
        "{copied:?}"
    );

    // Expired certificate, no timestamp: denied when strict, admitted (logged) when
    // permissive, denied again when permissive overrides authenticTimestamp to enforce.
    let expired = verify(&v, &images["expired"], attestor(&root, None, None), None).await;
    assert!(reason(&expired).contains("is not valid at"), "{expired:?}");
    let permissive = verify(
        &v,
        &images["expired"],
        attestor(&root, None, level(Level::Permissive)),
        None,
    )
    .await;
    assert!(permissive.is_verified(), "{permissive:?}");
    let overridden = NotationTrustPolicy {
        level: Some(Level::Permissive),
        overrides: [(Check::AuthenticTimestamp, Action::Enforce)].into(),
        ..NotationTrustPolicy::default()
    };
    let enforced = verify(
        &v,
        &images["expired"],
        attestor(&root, None, Some(overridden)),
        None,
    )
    .await;
    assert!(!enforced.is_verified(), "{enforced:?}");

    // The signature's own expiry (notation sign --expiry) has passed: denied when strict, logged
    // when permissive, denied again when permissive enforces expiry.
    let sig_expired = verify(
        &v,
        &images["sig-expired"],
        attestor(&root, None, None),
        None,
    )
    .await;
    assert!(
        reason(&sig_expired).contains("the signature expired at"),
        "{sig_expired:?}"
    );
    let logged = verify(
        &v,
        &images["sig-expired"],
        attestor(&root, None, level(Level::Permissive)),
        None,
    )
    .await;
    assert!(logged.is_verified(), "{logged:?}");
    let expiry_enforced = NotationTrustPolicy {
        level: Some(Level::Permissive),
        overrides: [(Check::Expiry, Action::Enforce)].into(),
        ..NotationTrustPolicy::default()
    };
    let denied = verify(
        &v,
        &images["sig-expired"],
        attestor(&root, None, Some(expiry_enforced)),
        None,
    )
    .await;
    assert!(!denied.is_verified(), "{denied:?}");

    // Timestamped before the certificate expired: admitted with tsaCerts, not without, and
    // not with another TSA root.
    let stamped = verify(
        &v,
        &images["expired-tsa"],
        attestor(&root, Some(&tsa), None),
        None,
    )
    .await;
    assert!(stamped.is_verified(), "{stamped:?}");
    let cose_stamped = verify(
        &v,
        &images["cose-tsa"],
        attestor(&root, Some(&tsa), None),
        None,
    )
    .await;
    assert!(cose_stamped.is_verified(), "{cose_stamped:?}");
    let cose_unstamped = verify(&v, &images["cose-tsa"], attestor(&root, None, None), None).await;
    assert!(!cose_unstamped.is_verified(), "{cose_unstamped:?}");
    let unstamped = verify(
        &v,
        &images["expired-tsa"],
        attestor(&root, None, None),
        None,
    )
    .await;
    assert!(
        reason(&unstamped).contains("is not valid at"),
        "{unstamped:?}"
    );
    let wrong_tsa = verify(
        &v,
        &images["expired-tsa"],
        attestor(&root, Some(&other), None),
        None,
    )
    .await;
    assert!(
        reason(&wrong_tsa).contains("does not verify to tsaCerts"),
        "{wrong_tsa:?}"
    );
    // tsaCerts given: a signature without a timestamp fails, as notation's does.
    let needs_stamp = verify(&v, &images["jws"], attestor(&root, Some(&tsa), None), None).await;
    assert!(
        reason(&needs_stamp).contains("no timestamp countersignature"),
        "{needs_stamp:?}"
    );
    // verifyTimestamp: afterCertExpiry (notation's option): while the chain is valid the
    // timestamp is not needed; once a certificate has expired it is, and is verified.
    let after_expiry = || {
        Some(NotationTrustPolicy {
            verify_timestamp: Some(VerifyTimestamp::AfterCertExpiry),
            ..NotationTrustPolicy::default()
        })
    };
    let unexpired = verify(
        &v,
        &images["jws"],
        attestor(&root, Some(&tsa), after_expiry()),
        None,
    )
    .await;
    assert!(unexpired.is_verified(), "{unexpired:?}");
    let expired_stamped = verify(
        &v,
        &images["expired-tsa"],
        attestor(&root, Some(&tsa), after_expiry()),
        None,
    )
    .await;
    assert!(expired_stamped.is_verified(), "{expired_stamped:?}");
    let expired_unstamped = verify(
        &v,
        &images["expired"],
        attestor(&root, Some(&tsa), after_expiry()),
        None,
    )
    .await;
    assert!(
        reason(&expired_unstamped).contains("no timestamp countersignature"),
        "{expired_unstamped:?}"
    );
    let expired_other_tsa = verify(
        &v,
        &images["expired-tsa"],
        attestor(&root, Some(&other), after_expiry()),
        None,
    )
    .await;
    assert!(
        reason(&expired_other_tsa).contains("does not verify to tsaCerts"),
        "{expired_other_tsa:?}"
    );

    // Audit level: a wrong CA is only logged; integrity still holds (tampered denied).
    let audited = verify(
        &v,
        &images["jws"],
        attestor(&other, None, level(Level::Audit)),
        None,
    )
    .await;
    assert!(audited.is_verified(), "{audited:?}");
    let tampered_audit = verify(
        &v,
        &images["tampered"],
        attestor(&other, None, level(Level::Audit)),
        None,
    )
    .await;
    assert!(!tampered_audit.is_verified(), "{tampered_audit:?}");

    // trustedIdentities: the leaf's subject pinned, and a mismatch.
    let pinned = |dn: &str| {
        Some(NotationTrustPolicy {
            trusted_identities: vec![format!("x509.subject: {dn}")],
            ..NotationTrustPolicy::default()
        })
    };
    let ok = verify(
        &v,
        &images["jws"],
        attestor(
            &root,
            None,
            pinned("C=US, O=ivory tests, CN=ivory notation signer"),
        ),
        None,
    )
    .await;
    assert!(ok.is_verified(), "{ok:?}");
    let mismatch = verify(
        &v,
        &images["jws"],
        attestor(&root, None, pinned("O=ivory tests, CN=someone else")),
        None,
    )
    .await;
    assert!(
        reason(&mismatch).contains("none of the expected identities"),
        "{mismatch:?}"
    );

    // The attestor's certs as a signingAuthority store: a notary.x509 signature needs a ca one.
    let authority = NotationTrustPolicy {
        certs_trust_store: Some(ivory_policy::notation::TrustStore::SigningAuthority),
        ..NotationTrustPolicy::default()
    };
    let store = verify(
        &v,
        &images["jws"],
        attestor(&root, None, Some(authority)),
        None,
    )
    .await;
    assert!(
        reason(&store).contains("needs a ca trust store"),
        "{store:?}"
    );

    // More signatures than the cap (all by another CA): 10 tried, the verdict says so.
    let many = verify(&v, &images["many"], attestor(&root, None, None), None).await;
    assert!(
        reason(&many).contains("limit of 10 signature attempts"),
        "{many:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notation_signed_sbom_referrers_are_attestations() {
    let h = RegistryHarness::start_default().await.unwrap();
    let v = verifier(&h);
    let root = pem("root.pem");
    let signed = push(&h, "sbom").await;
    let unsigned = push(&h, "sbom-unsigned").await;
    let sbom = |t: &str| {
        Some(Attestation {
            name: "sbom".into(),
            intoto: None,
            referrer: Some(TypeRef { type_: t.into() }),
        })
    };

    let ok = verify(
        &v,
        &signed,
        attestor(&root, None, None),
        sbom("sbom/cyclone-dx"),
    )
    .await;
    let Verification::Verified { payload, .. } = &ok else {
        panic!("{ok:?}");
    };
    assert_eq!(payload.as_ref().unwrap()["bomFormat"], "CycloneDX");
    // The image's own signature still verifies on its own.
    assert!(
        verify(&v, &signed, attestor(&root, None, None), None)
            .await
            .is_verified()
    );

    let not_signed = verify(
        &v,
        &unsigned,
        attestor(&root, None, None),
        sbom("sbom/cyclone-dx"),
    )
    .await;
    assert!(
        reason(&not_signed).contains("failed to verify attestation sbom/cyclone-dx"),
        "{not_signed:?}"
    );
    let absent = verify(
        &v,
        &signed,
        attestor(&root, None, None),
        sbom("application/spdx+json"),
    )
    .await;
    assert!(
        reason(&absent).contains("no attestations found for type: application/spdx+json"),
        "{absent:?}"
    );
    let intoto = Attestation {
        name: "slsa".into(),
        intoto: Some(TypeRef {
            type_: "https://slsa.dev/provenance/v1".into(),
        }),
        referrer: None,
    };
    let refused = verify(&v, &signed, attestor(&root, None, None), Some(intoto)).await;
    assert_eq!(
        reason(&refused),
        "notary verifier only supports oci 1.1 referrers as attestations"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notation_verdicts_are_cached_and_concurrent_misses_coalesced() {
    let h = RegistryHarness::start_default().await.unwrap();
    let v = verifier(&h);
    let root = pem("root.pem");
    let image = push(&h, "cose").await;
    h.reset_requests();
    // Eight concurrent identical misses: one set of registry reads.
    let all = futures::future::join_all(
        (0..8).map(|_| verify(&v, &image, attestor(&root, None, None), None)),
    )
    .await;
    assert!(all.iter().all(Verification::is_verified), "{all:?}");
    let reads = h.requests();
    let referrer_tags = reads
        .iter()
        .filter(|(m, uri, _)| m == "GET" && uri.contains("/manifests/sha256-"))
        .count();
    assert_eq!(referrer_tags, 1, "{reads:?}");
    // Warm: nothing asked of the registry.
    h.reset_requests();
    assert!(
        verify(&v, &image, attestor(&root, None, None), None)
            .await
            .is_verified()
    );
    assert!(h.requests().is_empty(), "{:?}", h.requests());
    // Another trust policy is another verdict (the attestor hash includes it).
    let audit = attestor(&root, None, level(Level::Audit));
    assert!(verify(&v, &image, audit, None).await.is_verified());
    assert!(!h.requests().is_empty());
}

/// Gives the `jws` image's Notation signature the timestamp `stamp` makes over its signature
/// bytes (the countersignature is in the JWS unprotected header, which the signature does not
/// cover, as `notation sign --timestamp-url` puts it there): the envelope, its signature
/// manifest and the referrers fallback index pushed again. Returns the image.
async fn push_jws_stamped_by(h: &Harness, tsa: &ivory_testkit::OpensslTsa) -> String {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let image = push(h, "jws").await;
    let repo = manifest()["images"]["jws"]["repo"]
        .as_str()
        .unwrap()
        .to_owned();
    let blobs = notation_fixtures()
        .join("oci")
        .join(&repo)
        .join("blobs/sha256");
    let blob = |digest: &str| -> Value {
        let hex = digest.trim_start_matches("sha256:");
        serde_json::from_slice(&std::fs::read(blobs.join(hex)).unwrap()).unwrap()
    };
    let subject = image.rsplit_once('@').unwrap().1;
    let fallback_tag = subject.replace(':', "-");
    let layout_index: Value =
        serde_json::from_slice(&std::fs::read(blobs.join("../../index.json")).unwrap()).unwrap();
    let fallback_digest = layout_index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == fallback_tag.as_str())
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut fallback = blob(&fallback_digest);
    let mut signature = blob(fallback["manifests"][0]["digest"].as_str().unwrap());
    let mut envelope = blob(signature["layers"][0]["digest"].as_str().unwrap());
    let signed = URL_SAFE_NO_PAD
        .decode(envelope["signature"].as_str().unwrap())
        .unwrap();
    let token = tsa.token(&signed).unwrap();
    envelope["header"]["io.cncf.notary.timestampSignature"] = STANDARD.encode(token).into();
    let envelope = envelope.to_string();
    let layer = h.push_blob(&repo, envelope.as_bytes()).await.unwrap();
    signature["layers"][0]["digest"] = layer.into();
    signature["layers"][0]["size"] = envelope.len().into();
    let signature = signature.to_string();
    let digest = ivory_testkit::sha256_digest(signature.as_bytes());
    h.push_manifest(
        &repo,
        &digest,
        ivory_testkit::OCI_MANIFEST,
        signature.as_bytes(),
    )
    .await
    .unwrap();
    fallback["manifests"][0]["digest"] = digest.into();
    fallback["manifests"][0]["size"] = signature.len().into();
    h.push_manifest(
        &repo,
        &fallback_tag,
        ivory_testkit::OCI_INDEX,
        fallback.to_string().as_bytes(),
    )
    .await
    .unwrap();
    image
}

/// A timestamp made by OpenSSL's own TSA (`openssl ts -reply` with its `certs` chain file, so
/// the token repeats the TSA certificate), RSA and ECDSA, as `notation verify` accepts it:
/// verified to the TSA's root; a token whose signer does not chain to `tsaCerts` (another
/// OpenSSL TSA's root, the fixtures' TSA root) stays refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_tsa_timestamps_verify_as_notation_verifies_them() {
    use ivory_testkit::{OpensslTsa, TsaKey};
    let root = pem("root.pem");
    let other = OpensslTsa::new(TsaKey::EcP256).unwrap();
    for key in [TsaKey::Rsa, TsaKey::EcP256] {
        let h = RegistryHarness::start_default().await.unwrap();
        let tsa = OpensslTsa::new(key).unwrap();
        let image = push_jws_stamped_by(&h, &tsa).await;
        let v = verifier(&h);
        let stamped = verify(&v, &image, attestor(&root, Some(&tsa.root_pem), None), None).await;
        assert!(stamped.is_verified(), "{key:?}: {stamped:?}");
        for (name, untrusted) in [
            ("another TSA", &other.root_pem),
            ("fixtures' TSA", &pem("tsa-root.pem")),
        ] {
            let refused = verify(&v, &image, attestor(&root, Some(untrusted), None), None).await;
            assert!(
                reason(&refused).contains("does not verify to tsaCerts"),
                "{key:?}, {name}: {refused:?}"
            );
        }
    }
}
