//! The core against real captured signatures (`fixtures/captured`, see its PROVENANCE.md).

use std::collections::BTreeMap;

use ivory_policy::types::{Attestor, Cosign, CosignKey, Ctlog, Identity, Keyless};
use serde_json::Value;

use base64::Engine as _;

use super::*;
use crate::envelope::Legacy;

const GHA: &str = "https://token.actions.githubusercontent.com";

fn key_attestor(pem: &str, ignore_tlog: bool) -> Attestor {
    Attestor {
        name: "key".into(),
        cosign: Some(Cosign {
            key: Some(CosignKey {
                data: Some(pem.into()),
                ..CosignKey::default()
            }),
            ctlog: Some(Ctlog {
                insecure_ignore_tlog: Some(ignore_tlog),
                ..Ctlog::default()
            }),
            ..Cosign::default()
        }),
        notary: None,
    }
}

fn keyless_attestor(subject: &str, issuer: &str) -> Attestor {
    Attestor {
        name: "keyless".into(),
        cosign: Some(Cosign {
            keyless: Some(Keyless {
                identities: vec![Identity {
                    subject: Some(subject.into()),
                    issuer: Some(issuer.into()),
                    ..Identity::default()
                }],
                ..Keyless::default()
            }),
            ..Cosign::default()
        }),
        notary: None,
    }
}

fn plan(a: &Attestor) -> Plan {
    Plan::new(a, &crate::trust_source::RootState::embedded()).unwrap()
}

fn simple(dir: &str) -> (Envelope, String) {
    let read = |f: &str| {
        std::fs::read(format!(
            "{}/../../fixtures/captured/{dir}/{f}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .ok()
    };
    let payload = read("payload.json").unwrap();
    let digest = serde_json::from_slice::<Value>(&payload).unwrap()["critical"]["image"]["docker-manifest-digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let text = |f: &str| read(f).map(|b| String::from_utf8(b).unwrap());
    let legacy = Legacy {
        blob: payload,
        signature: text("signature.b64").map(|s| s.trim().to_owned()),
        certificate: text("cert.pem"),
        chain: text("chain.pem"),
        rekor_bundle: text("rekor-bundle.json"),
    };
    (Envelope::SimpleSigning(legacy), digest)
}

fn data(path: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/../../fixtures/captured/{path}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// The signer is the key's fingerprint: sha256 of its DER SubjectPublicKeyInfo, as
/// `openssl pkey -pubin -outform DER | sha256sum` prints it (no log entry was checked).
#[test]
fn keys_of_every_type_verify_offline() {
    for (dir, fingerprint) in [
        (
            "ratify/legacy-key-ecdsa-p256",
            "ddfe255211b47f74169079c1e7611e6fa39ec7286895ad2cc8a87dfa0221348c",
        ),
        (
            "ratify/legacy-key-rsa2048",
            "4e1cb757a70fd3378e56625c04b368797d9f0d9283e062db21295ba4c40e1765",
        ),
        (
            "sigstore-rs/legacy-key-busybox",
            "622601a9e498c09004d82cfb8879122e780c0813a0ba350edd3eefa73097605a",
        ),
    ] {
        let (env, digest) = simple(dir);
        let p = plan(&key_attestor(&data(&format!("{dir}/pubkey.pem")), true));
        let signer = ivory_engine::verifier::Signer {
            key: Some(format!("sha256:{fingerprint}")),
            ..Default::default()
        };
        assert_eq!(
            evaluate(&p, &digest, &[env], None),
            Ok(Accepted {
                statement: None,
                signer
            }),
            "{dir}"
        );
    }
}

#[test]
fn wrong_key_and_other_digest_are_rejected() {
    let (env, digest) = simple("ratify/legacy-key-ecdsa-p256");
    let wrong = plan(&key_attestor(
        &data("connaisseur/cosign/keys/alice.key"),
        true,
    ));
    let err = evaluate(&wrong, &digest, std::slice::from_ref(&env), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("invalid signature"), "{err}");
    let right = plan(&key_attestor(
        &data("ratify/legacy-key-ecdsa-p256/pubkey.pem"),
        true,
    ));
    let other = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let err = evaluate(&right, other, &[env], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("signature is for digest"), "{err}");
}

#[test]
fn key_without_tlog_entry_fails_when_tlog_is_required() {
    let (env, digest) = simple("ratify/legacy-key-ecdsa-p256");
    let p = plan(&key_attestor(
        &data("ratify/legacy-key-ecdsa-p256/pubkey.pem"),
        false,
    ));
    let err = evaluate(&p, &digest, &[env], None).unwrap_err().to_string();
    assert!(err.contains(TLOG_FAILED), "{err}");
}

#[test]
fn no_signatures_is_named() {
    let p = plan(&key_attestor(
        &data("connaisseur/cosign/keys/alice.key"),
        true,
    ));
    assert_eq!(
        evaluate(&p, "sha256:00", &[], None)
            .unwrap_err()
            .to_string(),
        NO_SIGNATURES
    );
}

fn connaisseur_layers() -> Vec<Envelope> {
    let manifest: Value = serde_json::from_str(&data("connaisseur/cosign/registry/securesystemsengineering/testimage/manifests/sha256-bfec161fecb0a887df7cb85e4da327c65986ccda7060cf3cd92171c6c90d7533.sig.json")).unwrap();
    let payload = data("connaisseur/cosign/registry/securesystemsengineering/testimage/blobs/sha256:7248e52a7da336ff63192f2c0a8f12562b0d5368e9cde6ab292cbb4604074f28.json").into_bytes();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            Envelope::SimpleSigning(Legacy::from_annotations(
                payload.clone(),
                l["annotations"].as_object(),
            ))
        })
        .collect()
}

#[test]
fn each_of_several_signatures_in_one_sig_manifest_verifies() {
    let digest = "sha256:bfec161fecb0a887df7cb85e4da327c65986ccda7060cf3cd92171c6c90d7533";
    let layers = connaisseur_layers();
    for who in ["alice", "bob", "charlie"] {
        let p = plan(&key_attestor(
            &data(&format!("connaisseur/cosign/keys/{who}.key")),
            true,
        ));
        assert!(evaluate(&p, digest, &layers, None).is_ok(), "{who}");
    }
    let other = plan(&key_attestor(
        &data("ratify/legacy-key-ecdsa-p256/pubkey.pem"),
        true,
    ));
    assert!(evaluate(&other, digest, &layers, None).is_err());
}

#[test]
fn annotations_must_be_in_the_payload() {
    let (env, digest) = simple("ratify/legacy-key-ecdsa-p256");
    let mut a = key_attestor(&data("ratify/legacy-key-ecdsa-p256/pubkey.pem"), true);
    if let Some(c) = a.cosign.as_mut() {
        c.annotations = BTreeMap::from([("env".to_owned(), "prod".to_owned())]);
    }
    let err = evaluate(&plan(&a), &digest, &[env], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("annotation env=prod"), "{err}");
}

#[test]
fn legacy_keyless_with_rekor_set_and_sct_verifies_identity() {
    let (env, digest) = simple("ratify/legacy-keyless-wabbitnetworks-cosign-image");
    let ok = plan(&keyless_attestor(
        "sozercan@gmail.com",
        "https://github.com/login/oauth",
    ));
    let accepted = evaluate(&ok, &digest, std::slice::from_ref(&env), None).unwrap();
    // The signer is the verified certificate's identity and the checked entry's log index
    // (logIndex of the signature's dev.sigstore.cosign/bundle annotation).
    assert_eq!(
        accepted.signer,
        ivory_engine::verifier::Signer {
            subject: Some("sozercan@gmail.com".into()),
            issuer: Some("https://github.com/login/oauth".into()),
            log_index: Some(13452680),
            key: None,
        }
    );
    let wrong = plan(&keyless_attestor(
        "someone@else.com",
        "https://github.com/login/oauth",
    ));
    let err = evaluate(&wrong, &digest, std::slice::from_ref(&env), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected identities"), "{err}");
}

#[test]
fn legacy_keyless_with_tampered_set_fails_tlog() {
    let (env, digest) = simple("ratify/legacy-keyless-wabbitnetworks-cosign-image");
    let Envelope::SimpleSigning(mut l) = env else {
        unreachable!()
    };
    let mut rb: Value = serde_json::from_str(l.rekor_bundle.as_deref().unwrap()).unwrap();
    rb["Payload"]["integratedTime"] =
        Value::from(rb["Payload"]["integratedTime"].as_i64().unwrap() + 1);
    l.rekor_bundle = Some(rb.to_string());
    let ok = plan(&keyless_attestor(
        "sozercan@gmail.com",
        "https://github.com/login/oauth",
    ));
    let err = evaluate(&ok, &digest, &[Envelope::SimpleSigning(l)], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains(TLOG_FAILED), "{err}");
}

fn slsa_att() -> (Envelope, String) {
    let manifest: Value = serde_json::from_str(&data("slsa-verifier/gha_generic_container/v2.0.0/container_workflow_dispatch/blobs/sha256/a3e4bf251423a455ad90c3d706f95f133ed11a8e81e3f34e6fa6d056a1c15529")).unwrap();
    let layer = &manifest["layers"][0];
    let blob = data("slsa-verifier/gha_generic_container/v2.0.0/container_workflow_dispatch/blobs/sha256/1a16dff13cea8be5dd3e4d31640da5f9b6c8a3ff879f728ec8be5d9e2b17499f").into_bytes();
    (
        Envelope::Dsse(Legacy::from_annotations(
            blob,
            layer["annotations"].as_object(),
        )),
        data("slsa-verifier/gha_generic_container/v2.0.0/container_workflow_dispatch.digest")
            .trim()
            .to_owned(),
    )
}

const SLSA_ID: &str = "https://github.com/slsa-framework/slsa-github-generator/.github/workflows/generator_container_slsa3.yml@refs/tags/v2.0.0";

#[test]
fn legacy_att_yields_the_verified_statement() {
    let (env, digest) = slsa_att();
    let p = plan(&keyless_attestor(SLSA_ID, GHA));
    let got = evaluate(
        &p,
        &digest,
        std::slice::from_ref(&env),
        Some("https://slsa.dev/provenance/v0.2"),
    )
    .unwrap();
    let st = got.statement.unwrap();
    assert_eq!(st["predicateType"], "https://slsa.dev/provenance/v0.2");
    assert!(st["predicate"]["builder"]["id"].is_string());
    let err = evaluate(
        &p,
        &digest,
        std::slice::from_ref(&env),
        Some("https://cyclonedx.org/bom"),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "required predicate type https://cyclonedx.org/bom not found, found [https://slsa.dev/provenance/v0.2]"
    );
    // An attestation is not an image signature.
    assert_eq!(
        evaluate(&p, &digest, &[env], None).unwrap_err().to_string(),
        NO_SIGNATURES
    );
}

#[test]
fn legacy_att_for_another_image_or_identity_is_rejected() {
    let (env, _) = slsa_att();
    let p = plan(&keyless_attestor(SLSA_ID, GHA));
    let other = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    assert!(
        evaluate(
            &p,
            other,
            std::slice::from_ref(&env),
            Some("https://slsa.dev/provenance/v0.2")
        )
        .is_err()
    );
    let (env, digest) = slsa_att();
    let wrong = plan(&keyless_attestor(&SLSA_ID.replace("v2.0.0", "v1.0.0"), GHA));
    let err = evaluate(
        &wrong,
        &digest,
        &[env],
        Some("https://slsa.dev/provenance/v0.2"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("expected identities"), "{err}");
}

const BEACON: &str = "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main";
const A_TXT: &str = "sha256:a0cfc71271d6e278e57cd332ff957c3f7043fdda354c4cbb190a30d56efa01bf";

#[test]
fn bundle_v03_dsse_verifies_and_mismatched_signature_fails() {
    let p = plan(&keyless_attestor(BEACON, GHA));
    let ok = Envelope::Bundle(
        data(
            "sigstore-conformance/bundle-verify/happy-path-intoto-in-dsse-v3/bundle.sigstore.json",
        )
        .into_bytes(),
    );
    let got = evaluate(&p, A_TXT, &[ok], Some("https://slsa.dev/provenance/v1")).unwrap();
    assert_eq!(got.statement.unwrap()["subject"][0]["name"], "a.txt");
    assert_eq!(got.signer.subject.as_deref(), Some(BEACON));
    assert_eq!(got.signer.issuer.as_deref(), Some(GHA));
    assert!(got.signer.log_index.is_some(), "{:?}", got.signer);
    let bad = Envelope::Bundle(
        data("sigstore-conformance/bundle-verify/dsse-mismatch-sig_fail/bundle.sigstore.json")
            .into_bytes(),
    );
    assert!(evaluate(&p, A_TXT, &[bad], Some("https://slsa.dev/provenance/v1")).is_err());
}

pub(super) fn workspace_fixture(path: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/../../fixtures/{path}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn mock_keyless() -> Plan {
    let mut a = keyless_attestor(
        "https://github.com/ivory-test/app/.github/workflows/release.yml@refs/heads/main",
        GHA,
    );
    if let Some(c) = a.cosign.as_mut() {
        c.trusted_root = Some(ivory_policy::types::StringSource {
            value: Some(workspace_fixture("keyless/trusted_root.json")),
            expression: None,
        });
    }
    plan(&a)
}

fn subject_of(bundle: &Value) -> String {
    let payload = base64::engine::general_purpose::STANDARD
        .decode(bundle["dsseEnvelope"]["payload"].as_str().unwrap())
        .unwrap();
    let st: Value = serde_json::from_slice(&payload).unwrap();
    format!(
        "sha256:{}",
        st["subject"][0]["digest"]["sha256"].as_str().unwrap()
    )
}

#[test]
fn undecodable_tsa_token_is_dropped_only_when_a_log_entry_vouches_for_the_time() {
    let p = mock_keyless();
    let text = workspace_fixture("keyless/keyless-js-tsa.bundle.json");
    let bundle: Value = serde_json::from_str(&text).unwrap();
    let digest = subject_of(&bundle);
    let slsa = Some("https://slsa.dev/provenance/v1");
    assert!(evaluate(&p, &digest, &[Envelope::Bundle(text.into_bytes())], slsa).is_ok());
    // Without its log entry the timestamp is the only time evidence: no retry, a named failure.
    let mut no_log = bundle.clone();
    no_log["verificationMaterial"]["tlogEntries"] = Value::Array(Vec::new());
    let mut p_no_tlog = mock_keyless();
    p_no_tlog.ignore_tlog = true;
    let err = evaluate(
        &p_no_tlog,
        &digest,
        &[Envelope::Bundle(no_log.to_string().into_bytes())],
        slsa,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("RFC 3161"), "{err}");
}
