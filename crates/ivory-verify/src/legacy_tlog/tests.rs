//! Legacy Rekor entry kinds against real captured signatures (`fixtures/captured`, see its
//! PROVENANCE.md): sigstore-rs' 2021 keyless `rekord/0.0.1` signature and slsa-github-generator
//! v1.4.0 / v1.8.0 provenance (`intoto/0.0.1`), plus tampered copies of them.

use std::collections::BTreeMap;

use base64::Engine as _;
use ivory_policy::types::{Attestor, Cosign, Ctlog, Identity, Keyless};
use serde_json::{Value, json};
use sha2::Digest as _;
use sigstore_verify::crypto::KeyPair;

use crate::attestor_plan::Plan;
use crate::envelope::{Envelope, Legacy};
use crate::verdict::evaluate;

const GHA: &str = "https://token.actions.githubusercontent.com";
const SLSA_PREDICATE: &str = "https://slsa.dev/provenance/v0.2";
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn captured(path: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/../../fixtures/captured/{path}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn text(path: &str) -> String {
    String::from_utf8(captured(path)).unwrap()
}

fn keyless(identity: Identity, ignore_sct: bool) -> Attestor {
    Attestor {
        name: "keyless".into(),
        cosign: Some(Cosign {
            keyless: Some(Keyless {
                identities: vec![identity],
                ..Keyless::default()
            }),
            ctlog: Some(Ctlog {
                url: Some("https://rekor.sigstore.dev".into()),
                insecure_ignore_sct: Some(ignore_sct),
                ..Ctlog::default()
            }),
            ..Cosign::default()
        }),
        notary: None,
    }
}

fn plan(a: &Attestor) -> Plan {
    Plan::new(a, &crate::trust_source::RootState::embedded()).unwrap()
}

const FLAVIO_DIR: &str = "sigstore-rs/legacy-keyless-disallow-service-nodeport";

/// The 2021 certificate has no issuer extension, so the identity names the subject alone.
fn flavio() -> Identity {
    Identity {
        subject: Some("flavio@castelli.me".into()),
        ..Identity::default()
    }
}

fn rekord_2021() -> (Legacy, String) {
    let payload = captured(&format!("{FLAVIO_DIR}/payload.json"));
    let digest = serde_json::from_slice::<Value>(&payload).unwrap()["critical"]["image"]
        ["docker-manifest-digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let layer = Legacy {
        blob: payload,
        signature: Some(
            text(&format!("{FLAVIO_DIR}/signature.b64"))
                .trim()
                .to_owned(),
        ),
        certificate: Some(text(&format!("{FLAVIO_DIR}/cert.pem"))),
        chain: None,
        rekor_bundle: Some(text(&format!("{FLAVIO_DIR}/rekor-bundle.json"))),
    };
    (layer, digest)
}

/// The `.att` layer and image digest of one slsa-verifier container layout.
fn slsa_intoto(version: &str) -> (Legacy, String) {
    let dir = format!("slsa-verifier/gha_generic_container/{version}/container_workflow_dispatch");
    let blob = |digest: &str| captured(&format!("{dir}/blobs/sha256/{}", &digest[7..]));
    let index: Value = serde_json::from_slice(&captured(&format!("{dir}/index.json"))).unwrap();
    let atts = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["kind"] == "dev.cosignproject.cosign/atts")
        .unwrap();
    let manifest: Value = serde_json::from_slice(&blob(atts["digest"].as_str().unwrap())).unwrap();
    let layer = &manifest["layers"][0];
    let legacy = Legacy::from_annotations(
        blob(layer["digest"].as_str().unwrap()),
        layer["annotations"].as_object(),
    );
    let digest = text(&format!("{dir}.digest")).trim().to_owned();
    (legacy, digest)
}

fn slsa_identity(version: &str) -> Identity {
    Identity {
        issuer: Some(GHA.into()),
        subject: Some(format!(
            "https://github.com/slsa-framework/slsa-github-generator/.github/workflows/generator_container_slsa3.yml@refs/tags/{version}"
        )),
        ..Identity::default()
    }
}

fn rekor_entry(layer: &Legacy) -> Value {
    serde_json::from_str(layer.rekor_bundle.as_deref().unwrap()).unwrap()
}

fn with_entry(mut layer: Legacy, entry: &Value) -> Legacy {
    layer.rekor_bundle = Some(entry.to_string());
    layer
}

#[test]
fn rekord_2021_keyless_signature_verifies_with_its_log_entry() {
    let (layer, digest) = rekord_2021();
    let p = plan(&keyless(flavio(), true));
    evaluate(&p, &digest, &[Envelope::SimpleSigning(layer)], None).unwrap();
}

#[test]
fn rekord_2021_without_sct_needs_insecure_ignore_sct_as_in_cosign() {
    let (layer, digest) = rekord_2021();
    let p = plan(&keyless(flavio(), false));
    let err = evaluate(&p, &digest, &[Envelope::SimpleSigning(layer)], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("embedded SCT"), "{err}");
}

#[test]
fn rekord_2021_with_another_identity_or_digest_is_rejected() {
    let (layer, digest) = rekord_2021();
    let other = Identity {
        subject: Some("someone@example.com".into()),
        ..Identity::default()
    };
    let p = plan(&keyless(other, true));
    let err = evaluate(&p, &digest, &[Envelope::SimpleSigning(layer.clone())], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected identities"), "{err}");
    let p = plan(&keyless(flavio(), true));
    let elsewhere = format!("sha256:{}", "1".repeat(64));
    let err = evaluate(&p, &elsewhere, &[Envelope::SimpleSigning(layer)], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is for digest"), "{err}");
}

#[test]
fn rekord_entry_must_log_this_payload_and_signature() {
    let (mut layer, digest) = rekord_2021();
    let p = plan(&keyless(flavio(), true));
    // The payload differs from the one logged (and signed).
    layer.blob.push(b' ');
    let err = evaluate(&p, &digest, &[Envelope::SimpleSigning(layer)], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("logs another payload"), "{err}");
}

#[test]
fn tampered_body_or_set_fails_the_set() {
    let (layer, digest) = rekord_2021();
    let p = plan(&keyless(flavio(), true));
    let mut entry = rekor_entry(&layer);
    let mut body: Value = serde_json::from_slice(
        &B64.decode(entry["Payload"]["body"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    body["spec"]["data"]["hash"]["value"] = json!("0".repeat(64));
    entry["Payload"]["body"] = json!(B64.encode(body.to_string()));
    let tampered = with_entry(layer.clone(), &entry);
    let err = evaluate(&p, &digest, &[Envelope::SimpleSigning(tampered)], None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("SignedEntryTimestamp does not verify"),
        "{err}"
    );

    let mut entry = rekor_entry(&layer);
    let mut set = B64
        .decode(entry["SignedEntryTimestamp"].as_str().unwrap())
        .unwrap();
    let last = set.len() - 1;
    set[last] ^= 1;
    entry["SignedEntryTimestamp"] = json!(B64.encode(set));
    let wrong_set = with_entry(layer.clone(), &entry);
    let err = evaluate(&p, &digest, &[Envelope::SimpleSigning(wrong_set)], None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("SignedEntryTimestamp does not verify"),
        "{err}"
    );

    let mut entry = rekor_entry(&layer);
    entry["Payload"]["integratedTime"] = json!(1_634_714_718);
    let moved = with_entry(layer, &entry);
    let err = evaluate(&p, &digest, &[Envelope::SimpleSigning(moved)], None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("SignedEntryTimestamp does not verify"),
        "{err}"
    );
}

/// The entry re-signed by a log key the test controls (given as `ctlog.rekorPubKey`), so the
/// SET verifies and only the integrated time is wrong.
#[test]
fn integrated_time_outside_the_certificate_validity_is_rejected() {
    let (layer, digest) = rekord_2021();
    let log = KeyPair::generate_ecdsa_p256().unwrap();
    let log_pem = log.public_key_der().unwrap().to_pem();
    let log_id = hex::encode(sha2::Sha256::digest(
        log.public_key_der().unwrap().as_bytes(),
    ));
    let resign = |integrated_time: i64| {
        let mut entry = rekor_entry(&layer);
        let payload = super::SetPayload {
            body: entry["Payload"]["body"].as_str().unwrap(),
            integrated_time,
            log_index: entry["Payload"]["logIndex"].as_i64().unwrap(),
            log_id: &log_id,
        };
        let set = log
            .sign(&serde_json_canonicalizer::to_vec(&payload).unwrap())
            .unwrap();
        entry["SignedEntryTimestamp"] = json!(B64.encode(set.as_bytes()));
        entry["Payload"]["integratedTime"] = json!(integrated_time);
        entry["Payload"]["logID"] = json!(log_id);
        with_entry(layer.clone(), &entry)
    };
    let mut attestor = keyless(flavio(), true);
    if let Some(ctlog) = attestor.cosign.as_mut().and_then(|c| c.ctlog.as_mut()) {
        ctlog.rekor_pub_key = Some(log_pem);
    }
    let p = plan(&attestor);
    let original = rekor_entry(&layer)["Payload"]["integratedTime"]
        .as_i64()
        .unwrap();
    // The same time, signed by this log: verifies, so the re-signing is faithful.
    evaluate(
        &p,
        &digest,
        &[Envelope::SimpleSigning(resign(original))],
        None,
    )
    .unwrap();
    // A day later the 20-minute certificate had long expired.
    let late = resign(original + 86_400);
    let err = evaluate(&p, &digest, &[Envelope::SimpleSigning(late)], None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("outside the signing certificate's validity"),
        "{err}"
    );
}

#[test]
fn slsa_generator_v1_4_and_v1_8_intoto_provenance_verifies() {
    for version in ["v1.4.0", "v1.8.0"] {
        let (layer, digest) = slsa_intoto(version);
        let p = plan(&keyless(slsa_identity(version), false));
        let got = evaluate(&p, &digest, &[Envelope::Dsse(layer)], Some(SLSA_PREDICATE))
            .unwrap_or_else(|e| panic!("{version}: {e}"));
        let statement = got.statement.unwrap();
        assert_eq!(statement["predicateType"], SLSA_PREDICATE, "{version}");
    }
}

#[test]
fn intoto_entry_must_log_this_envelope() {
    let (mut layer, digest) = slsa_intoto("v1.8.0");
    let p = plan(&keyless(slsa_identity("v1.8.0"), false));
    // Same DSSE content, different bytes: not the envelope that was logged.
    let mut envelope: Value = serde_json::from_slice(&layer.blob).unwrap();
    envelope["extra"] = json!(true);
    layer.blob = envelope.to_string().into_bytes();
    let err = evaluate(&p, &digest, &[Envelope::Dsse(layer)], Some(SLSA_PREDICATE))
        .unwrap_err()
        .to_string();
    assert!(err.contains("logs another DSSE envelope"), "{err}");
}

#[test]
fn intoto_provenance_for_another_image_or_builder_is_rejected() {
    let (layer, _) = slsa_intoto("v1.4.0");
    let p = plan(&keyless(slsa_identity("v1.4.0"), false));
    let elsewhere = format!("sha256:{}", "2".repeat(64));
    let err = evaluate(
        &p,
        &elsewhere,
        &[Envelope::Dsse(layer)],
        Some(SLSA_PREDICATE),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("does not name"), "{err}");
    let (layer, digest) = slsa_intoto("v1.4.0");
    let p = plan(&keyless(slsa_identity("v1.8.0"), false));
    let err = evaluate(&p, &digest, &[Envelope::Dsse(layer)], Some(SLSA_PREDICATE))
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected identities"), "{err}");
}

/// `additionalExtensions` and an evaluated `subjectExpression` constrain the certificate.
#[test]
fn additional_extensions_and_subject_expression_are_constraints() {
    let (layer, digest) = slsa_intoto("v1.8.0");
    let run = |identity: Identity, extensions: &[(&str, &str)]| {
        let mut attestor = keyless(identity, false);
        if let Some(k) = attestor.cosign.as_mut().and_then(|c| c.keyless.as_mut()) {
            k.additional_extensions = extensions
                .iter()
                .map(|(k, v)| ((*k).to_owned(), json!(v)))
                .collect::<BTreeMap<_, _>>();
        }
        evaluate(
            &plan(&attestor),
            &digest,
            &[Envelope::Dsse(layer.clone())],
            Some(SLSA_PREDICATE),
        )
    };
    let id = slsa_identity("v1.8.0");
    run(
        id.clone(),
        &[
            ("githubWorkflowRef", "refs/heads/main"),
            ("githubWorkflowRepository", "slsa-framework/example-package"),
            ("githubWorkflowTrigger", "workflow_dispatch"),
        ],
    )
    .unwrap();
    let err = run(id.clone(), &[("githubWorkflowRef", "refs/heads/release")])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("githubWorkflowRef is \"refs/heads/main\", expected \"refs/heads/release\""),
        "{err}"
    );
    let subject = id.subject.clone();
    let mut by_expression = Identity {
        issuer: Some(GHA.into()),
        subject_reg_exp: Some("slsa-github-generator".into()),
        subject_expression: subject,
        ..Identity::default()
    };
    run(by_expression.clone(), &[]).unwrap();
    by_expression.subject_expression = Some("https://github.com/acme/other".into());
    let err = run(by_expression, &[]).unwrap_err().to_string();
    assert!(err.contains("expected identities"), "{err}");
}

#[test]
fn sct_from_a_log_the_trust_root_does_not_know_is_rejected() {
    let (layer, digest) = slsa_intoto("v1.8.0");
    let mut attestor = keyless(slsa_identity("v1.8.0"), false);
    let stranger = KeyPair::generate_ecdsa_p256().unwrap();
    if let Some(ctlog) = attestor.cosign.as_mut().and_then(|c| c.ctlog.as_mut()) {
        ctlog.ct_log_pub_key = Some(stranger.public_key_der().unwrap().to_pem());
    }
    let err = evaluate(
        &plan(&attestor),
        &digest,
        &[Envelope::Dsse(layer)],
        Some(SLSA_PREDICATE),
    )
    .unwrap_err()
    .to_string();
    // The certificate's SCT comes from the public-good CT log, which the attestor's own CT
    // log key replaced: the denial names that log and where the attestor's trust came from.
    assert!(
        err.contains(": CT log ")
            && err.contains(
                " unknown to the trust root (embedded, built into this ivory), its CT log from \
                 ctlog.ctLogPubKey"
            ),
        "{err}"
    );
}

/// The reasons are typed where they are decided; the text is only how they read.
#[test]
fn rejections_are_classified() {
    use crate::rejection::Rejection;
    let (layer, digest) = rekord_2021();
    let p = plan(&keyless(flavio(), true));
    assert_eq!(
        evaluate(&p, &digest, &[], None),
        Err(Rejection::NoSignatures)
    );
    let mut entry = rekor_entry(&layer);
    entry["SignedEntryTimestamp"] = json!(B64.encode([0u8; 70]));
    let wrong_set = Envelope::SimpleSigning(with_entry(layer.clone(), &entry));
    let err = evaluate(&p, &digest, &[wrong_set], None).unwrap_err();
    let Rejection::NoneMatched { reasons, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(&reasons[..], [Rejection::Tlog(d)] if d.starts_with("Rekor SignedEntryTimestamp")),
        "{err:?}"
    );
    let other = Identity {
        subject: Some("someone@example.com".into()),
        ..Identity::default()
    };
    let only = plan(&keyless(other, true));
    let err = evaluate(&only, &digest, &[Envelope::SimpleSigning(layer)], None).unwrap_err();
    let Rejection::NoneMatched { reasons, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(
        reasons,
        &[Rejection::Identity {
            subject: "flavio@castelli.me".into(),
            issuer: String::new(),
        }]
    );
}
