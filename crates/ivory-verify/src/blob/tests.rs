use std::path::PathBuf;

use ivory_policy::types::Attestor;
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::*;

/// A conformance case folder (fixtures/sigstore-conformance).
fn case(name: &str) -> PathBuf {
    ivory_testkit::fixtures_dir()
        .join("sigstore-conformance/test/assets/bundle-verify")
        .join(name)
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

const BEACON: &str = "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main";
const ACTIONS: &str = "https://token.actions.githubusercontent.com";

fn plan(cosign: serde_json::Value) -> Plan {
    let attestor: Attestor =
        serde_json::from_value(json!({ "name": "blob", "cosign": cosign })).unwrap();
    Plan::with_trust_root(&attestor, &crate::trust_source::RootState::embedded()).unwrap()
}

fn keyless(subject: &str, root: Option<PathBuf>) -> Plan {
    let mut cosign =
        json!({ "keyless": { "identities": [{ "subject": subject, "issuer": ACTIONS }] } });
    if let Some(root) = root {
        cosign["trustedRoot"] = json!({ "value": String::from_utf8(read(root)).unwrap() });
    }
    plan(cosign)
}

#[test]
fn rekor_v2_bundle_verifies_as_file_bytes_and_digest_and_names_its_evidence() {
    let dir = case("rekor2-happy-path");
    let plan = keyless(BEACON, Some(dir.join("trusted_root.json")));
    let bundle = read(dir.join("bundle.sigstore.json"));
    let artifact_path = case("a.txt");
    let artifact = read(artifact_path.clone());
    let digest: [u8; 32] = Sha256::digest(&artifact).into();
    for blob in [
        Blob::File(&artifact_path),
        Blob::Bytes(&artifact),
        Blob::Sha256(digest),
    ] {
        let verified = verify_blob(&plan, blob, &bundle).unwrap();
        assert_eq!(verified.signer.subject.as_deref(), Some(BEACON));
        assert!(
            verified
                .evidence
                .iter()
                .any(|l| l.contains("hashedrekord/0.0.2") && l.contains("checkpoint")),
            "{:?}",
            verified.evidence
        );
        assert!(verified.evidence.iter().any(|l| l.contains("RFC 3161")));
    }
}

#[test]
fn another_artifact_identity_or_trust_root_is_refused() {
    let dir = case("rekor2-happy-path");
    let root = Some(dir.join("trusted_root.json"));
    let bundle = read(dir.join("bundle.sigstore.json"));
    let artifact = read(case("a.txt"));
    let mut other = artifact.clone();
    other.push(b'!');
    let good = keyless(BEACON, root.clone());
    let err = verify_blob(&good, Blob::Bytes(&other), &bundle).unwrap_err();
    assert!(
        matches!(
            err,
            Rejection::InvalidSignature(_) | Rejection::Content(_) | Rejection::Tlog(_)
        ),
        "{err}"
    );
    let wrong_identity = keyless("https://github.com/someone/else", root);
    let err = verify_blob(&wrong_identity, Blob::Bytes(&artifact), &bundle).unwrap_err();
    assert!(matches!(err, Rejection::Identity { .. }), "{err}");
    // The embedded public-good root does not know this instance's TSA or log.
    let public_good = keyless(BEACON, None);
    let err = verify_blob(&public_good, Blob::Bytes(&artifact), &bundle).unwrap_err();
    assert!(
        matches!(&err, Rejection::UnknownLog { log, root, .. }
            if log == "transparency log" && root == "the trust root (embedded, built into this ivory)"),
        "{err}"
    );
}

#[test]
fn key_without_the_log_keeps_the_trusted_root_it_names_for_timestamps() {
    let dir = ivory_testkit::fixtures_dir().join("blob");
    let key = String::from_utf8(read(dir.join("key.pub"))).unwrap();
    let root = String::from_utf8(read(dir.join("tsa/trusted_root.json"))).unwrap();
    let bundle = read(dir.join("tsa/artifact.txt.sigstore.json"));
    let artifact = read(dir.join("artifact.txt"));
    let with_root = plan(json!({
        "key": { "data": key },
        "ctlog": { "insecureIgnoreTlog": true },
        "trustedRoot": { "value": root },
    }));
    let verified = verify_blob(&with_root, Blob::Bytes(&artifact), &bundle).unwrap();
    assert!(verified.signer.key.is_some());
    assert!(verified.evidence.iter().any(|l| l.contains("RFC 3161")));
    // Without it the timestamp is still checked, against the public-good TSA, and fails.
    let without_root =
        plan(json!({ "key": { "data": key }, "ctlog": { "insecureIgnoreTlog": true } }));
    let err = verify_blob(&without_root, Blob::Bytes(&artifact), &bundle).unwrap_err();
    assert!(matches!(err, Rejection::Tlog(_)), "{err}");
}

#[test]
fn oversized_or_malformed_bundles_are_refused_before_parsing() {
    let plan = keyless(BEACON, None);
    let huge = vec![b' '; MAX_BUNDLE_BYTES + 1];
    let err = verify_blob(&plan, Blob::Bytes(b"x"), &huge).unwrap_err();
    assert!(matches!(err, Rejection::Malformed(_)), "{err}");
    let err = verify_blob(&plan, Blob::Bytes(b"x"), b"{").unwrap_err();
    assert!(matches!(err, Rejection::Malformed(_)), "{err}");
}

#[test]
fn digest_text_is_sha256_and_64_hex_digits_only() {
    let hex = "a0cfc71271d6e278e57cd332ff957c3f7043fdda354c4cbb190a30d56efa01bf";
    assert!(Blob::sha256_digest(&format!("sha256:{hex}")).is_some());
    assert!(Blob::sha256_digest(hex).is_none());
    assert!(Blob::sha256_digest(&format!("sha512:{hex}")).is_none());
    assert!(Blob::sha256_digest(&format!("sha256:{}", &hex[1..])).is_none());
    assert!(Blob::sha256_digest(&format!("sha256:{hex}00")).is_none());
}

/// cosign v3 `sign-blob` with a signing config naming neither Rekor nor a TSA: what cosign's
/// `--insecure-ignore-tlog` accepts, as bytes, file and digest; never another artifact or key,
/// and never without the flag.
#[test]
fn bare_key_bundle_verifies_only_without_the_log_and_for_its_artifact_and_key() {
    let dir = ivory_testkit::fixtures_dir().join("blob");
    let key = String::from_utf8(read(dir.join("key.pub"))).unwrap();
    let other = String::from_utf8(read(dir.join("other.pub"))).unwrap();
    let bundle = read(dir.join("plain/artifact.txt.sigstore.json"));
    let path = dir.join("artifact.txt");
    let artifact = read(path.clone());
    let digest: [u8; 32] = Sha256::digest(&artifact).into();
    let ignoring = |key: &str| {
        plan(json!({ "key": { "data": key }, "ctlog": { "insecureIgnoreTlog": true } }))
    };
    for blob in [
        Blob::Bytes(&artifact),
        Blob::File(&path),
        Blob::Sha256(digest),
    ] {
        let verified = verify_blob(&ignoring(&key), blob, &bundle).unwrap();
        assert!(verified.signer.key.is_some());
        assert_eq!(verified.signer.log_index, None);
    }
    let mut tampered = artifact.clone();
    tampered.push(b'!');
    let err = verify_blob(&ignoring(&key), Blob::Bytes(&tampered), &bundle).unwrap_err();
    assert!(matches!(err, Rejection::Content(_)), "{err}");
    let err = verify_blob(&ignoring(&key), Blob::Sha256([0; 32]), &bundle).unwrap_err();
    assert!(matches!(err, Rejection::Content(_)), "{err}");
    let err = verify_blob(&ignoring(&other), Blob::Bytes(&artifact), &bundle).unwrap_err();
    assert!(matches!(err, Rejection::InvalidSignature(_)), "{err}");
    // The bundle's digest rewritten to the tampered artifact's: the signature still refuses it.
    let mut doc: serde_json::Value = serde_json::from_slice(&bundle).unwrap();
    use base64::Engine as _;
    doc["messageSignature"]["messageDigest"]["digest"] =
        json!(base64::engine::general_purpose::STANDARD.encode(Sha256::digest(&tampered)));
    let forged = serde_json::to_vec(&doc).unwrap();
    let err = verify_blob(&ignoring(&key), Blob::Bytes(&tampered), &forged).unwrap_err();
    assert!(matches!(err, Rejection::InvalidSignature(_)), "{err}");
    let with_log = plan(json!({ "key": { "data": key } }));
    let err = verify_blob(&with_log, Blob::Bytes(&artifact), &bundle).unwrap_err();
    assert!(matches!(err, Rejection::Tlog(_)), "{err}");
}

/// A key-signed DSSE bundle over `blob`'s digest, its envelope logged in a test Rekor v2 log
/// as `dsse/0.0.2`, timestamped by an OpenSSL TSA; and the trusted root of that log and TSA.
fn dsse_v002_blob_bundle(signer: &ivory_testkit::CosignSigner, blob: &[u8]) -> (Vec<u8>, String) {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    let der = |pem: &str| -> String {
        pem.lines()
            .skip_while(|l| !l.starts_with("-----BEGIN"))
            .skip(1)
            .take_while(|l| !l.starts_with("-----END"))
            .collect()
    };
    let statement = json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "blob", "digest": {"sha256": hex::encode(Sha256::digest(blob))}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {},
    })
    .to_string();
    let payload_type = "application/vnd.in-toto+json";
    let pae = sigstore_verify::types::dsse::pae(payload_type, statement.as_bytes());
    let signature = signer.sign(&pae).unwrap();
    let key = STANDARD.decode(der(&signer.public_pem)).unwrap();
    let log = ivory_testkit::RekorV2Log::generate("log2025-test.rekor.ivory.test").unwrap();
    let tsa = ivory_testkit::OpensslTsa::new(ivory_testkit::TsaKey::EcP256).unwrap();
    let body = ivory_testkit::dsse_v002_body(
        statement.as_bytes(),
        &signature,
        ivory_testkit::DsseVerifier::PublicKey(&key),
    );
    let bundle = json!({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {
            "publicKey": {"hint": "test-key"},
            "tlogEntries": [log.entry("dsse", "0.0.2", &body)],
            "timestampVerificationData": {"rfc3161Timestamps": [
                {"signedTimestamp": STANDARD.encode(tsa.response(&signature).unwrap())}
            ]},
        },
        "dsseEnvelope": {
            "payload": STANDARD.encode(&statement),
            "payloadType": payload_type,
            "signatures": [{"sig": STANDARD.encode(&signature), "keyid": ""}],
        },
    });
    let root = json!({
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": [log.trusted_root_tlog("2020-01-01T00:00:00Z", None)],
        "certificateAuthorities": [],
        "ctlogs": [],
        "timestampAuthorities": [{
            "subject": {"organization": "ivory", "commonName": "tsa"},
            "certChain": {"certificates": [
                {"rawBytes": der(&tsa.tsa_pem)}, {"rawBytes": der(&tsa.root_pem)}
            ]},
            "validFor": {"start": "2020-01-01T00:00:00Z"},
        }],
    });
    (bundle.to_string().into_bytes(), root.to_string())
}

#[test]
fn a_blob_attested_in_rekor_v2_as_dsse_v002_verifies_for_that_blob_only() {
    let signer = ivory_testkit::CosignSigner::generate().unwrap();
    let blob = b"release artefact";
    let (bundle, root) = dsse_v002_blob_bundle(&signer, blob);
    let key_plan = plan(json!({
        "key": { "data": signer.public_pem },
        "trustedRoot": { "value": root },
    }));
    let verified =
        verify_blob(&key_plan, Blob::Bytes(blob), &bundle).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        verified
            .evidence
            .iter()
            .any(|l| l.contains("dsse/0.0.2") && l.contains("signed checkpoint")),
        "{:?}",
        verified.evidence
    );
    assert_eq!(verified.signer.log_index, Some(ivory_testkit::LOGGED_INDEX));
    let other = verify_blob(&key_plan, Blob::Bytes(b"another artefact"), &bundle)
        .err()
        .unwrap()
        .to_string();
    assert!(
        other.contains("artifact hash does not match any subject"),
        "{other}"
    );
}
