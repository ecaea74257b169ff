//! Sigstore bundles whose DSSE attestation is logged in Rekor v2 as `dsse/0.0.2`, made with
//! real crypto: a keyless certificate of a test CA (`openssl`), a key of the testkit, an
//! RFC 3161 token from OpenSSL's TSA over the signature, and a test log ([`RekorV2Log`]) whose
//! Ed25519 checkpoint signs the root of the tree holding the entry.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ivory_policy::types::{Attestor, Cosign, CosignKey, Ctlog, Identity, Keyless, StringSource};
use ivory_testkit::{
    CosignSigner, DsseVerifier, LOGGED_INDEX, OpensslTsa, RekorV2Log, TsaKey, dsse_v002_body,
};
use serde_json::{Value, json};

use super::openssl_tsa_tests::{
    ISSUER, PREDICATE, SUBJECT, der_b64, der_of_pem, keyless_signer, openssl, tempdir,
};
use super::*;

const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
const ORIGIN: &str = "log2025-test.rekor.ivory.test";

/// What a test attestation is made of.
struct Attestation {
    digest: String,
    statement: Vec<u8>,
    signature: Vec<u8>,
    /// The signer's certificate (keyless) or public key (key), DER.
    verifier_der: Vec<u8>,
    keyless: bool,
}

impl Attestation {
    fn verifier(&self) -> DsseVerifier<'_> {
        if self.keyless {
            DsseVerifier::Certificate(&self.verifier_der)
        } else {
            DsseVerifier::PublicKey(&self.verifier_der)
        }
    }

    /// The `dsse/0.0.2` body naming this attestation.
    fn body(&self) -> Vec<u8> {
        dsse_v002_body(&self.statement, &self.signature, self.verifier())
    }
}

fn statement(digest: &str) -> Vec<u8> {
    json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "image", "digest": {"sha256": digest.trim_start_matches("sha256:")}}],
        "predicateType": PREDICATE,
        "predicate": {"builder": {"id": "ivory-test"}},
    })
    .to_string()
    .into_bytes()
}

/// A keyless attestation of `digest`, signed with `dir`'s leaf key (see `keyless_signer`).
fn keyless_attestation(dir: &Path, digest: &str) -> Attestation {
    let statement = statement(digest);
    let pae = sigstore_verify::types::dsse::pae(PAYLOAD_TYPE, &statement);
    std::fs::write(dir.join("pae"), pae).unwrap();
    openssl(
        dir,
        &["dgst", "-sha256", "-sign", "leaf.key", "-out", "sig", "pae"],
    );
    Attestation {
        digest: digest.into(),
        statement,
        signature: std::fs::read(dir.join("sig")).unwrap(),
        verifier_der: STANDARD.decode(der_b64(dir, "leaf.pem")).unwrap(),
        keyless: true,
    }
}

fn key_attestation(signer: &CosignSigner, digest: &str) -> Attestation {
    let statement = statement(digest);
    let pae = sigstore_verify::types::dsse::pae(PAYLOAD_TYPE, &statement);
    Attestation {
        digest: digest.into(),
        signature: signer.sign(&pae).unwrap(),
        statement,
        verifier_der: STANDARD.decode(der_of_pem(&signer.public_pem)).unwrap(),
        keyless: false,
    }
}

/// The bundle of `att` with `entry` and a timestamp over its signature from `tsa` (none when
/// `None`).
fn bundle(att: &Attestation, entry: Value, tsa: Option<&OpensslTsa>) -> Vec<u8> {
    let material = if att.keyless {
        json!({"certificate": {"rawBytes": STANDARD.encode(&att.verifier_der)}})
    } else {
        json!({"publicKey": {"hint": "test-key"}})
    };
    let mut material = material;
    material["tlogEntries"] = json!([entry]);
    if let Some(tsa) = tsa {
        let stamp = tsa.response(&att.signature).unwrap();
        material["timestampVerificationData"] =
            json!({"rfc3161Timestamps": [{"signedTimestamp": STANDARD.encode(stamp)}]});
    }
    json!({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": material,
        "dsseEnvelope": {
            "payload": STANDARD.encode(&att.statement),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": STANDARD.encode(&att.signature), "keyid": ""}],
        },
    })
    .to_string()
    .into_bytes()
}

/// A trusted root with the test CA of `dir` (if any), `tsa` and the `tlogs`.
fn trusted_root(dir: Option<&Path>, tsa: &OpensslTsa, tlogs: &[Value]) -> String {
    let authority = |subject: &str, chain: Vec<String>| {
        json!({
            "subject": {"organization": "ivory", "commonName": subject},
            "uri": "https://ivory.test",
            "certChain": {"certificates": chain.into_iter().map(|c| json!({"rawBytes": c})).collect::<Vec<_>>()},
            "validFor": {"start": "2020-01-01T00:00:00Z"},
        })
    };
    let cas: Vec<Value> = dir
        .map(|d| authority("fulcio", vec![der_b64(d, "ca.pem")]))
        .into_iter()
        .collect();
    json!({
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": tlogs,
        "certificateAuthorities": cas,
        "ctlogs": [],
        "timestampAuthorities": [authority("tsa", vec![der_of_pem(&tsa.tsa_pem), der_of_pem(&tsa.root_pem)])],
    })
    .to_string()
}

fn root_source(root: &str) -> Option<StringSource> {
    Some(StringSource {
        value: Some(root.into()),
        expression: None,
    })
}

fn keyless_plan(root: &str) -> Plan {
    let attestor = Attestor {
        name: "keyless".into(),
        cosign: Some(Cosign {
            keyless: Some(Keyless {
                identities: vec![Identity {
                    subject: Some(SUBJECT.into()),
                    issuer: Some(ISSUER.into()),
                    ..Identity::default()
                }],
                ..Keyless::default()
            }),
            // The test CA has no CT log; the SCT stays sigstore-verify's check.
            ctlog: Some(Ctlog {
                insecure_ignore_sct: Some(true),
                ..Ctlog::default()
            }),
            trusted_root: root_source(root),
            ..Cosign::default()
        }),
        notary: None,
    };
    Plan::new(&attestor, &crate::trust_source::RootState::embedded()).unwrap()
}

fn key_plan(pem: &str, root: &str) -> Plan {
    let attestor = Attestor {
        name: "key".into(),
        cosign: Some(Cosign {
            key: Some(CosignKey {
                data: Some(pem.into()),
                ..CosignKey::default()
            }),
            trusted_root: root_source(root),
            ..Cosign::default()
        }),
        notary: None,
    };
    Plan::new(&attestor, &crate::trust_source::RootState::embedded()).unwrap()
}

fn attest(plan: &Plan, att: &Attestation, bundle: Vec<u8>) -> Result<Accepted, Rejection> {
    evaluate(
        plan,
        &att.digest,
        &[Envelope::Bundle(bundle)],
        Some(PREDICATE),
    )
}

/// The refusal's text, which must name `needle`.
fn refused(outcome: Result<Accepted, Rejection>, needle: &str) {
    match outcome {
        Ok(a) => panic!("accepted, expected a refusal naming {needle:?}: {a:?}"),
        Err(e) => assert!(e.to_string().contains(needle), "{needle:?} not in: {e}"),
    }
}

/// A keyless signer in a fresh directory, a TSA and a log.
struct Keyless_ {
    dir: PathBuf,
    tsa: OpensslTsa,
    log: RekorV2Log,
    att: Attestation,
}

fn keyless_setup() -> Keyless_ {
    let dir = tempdir();
    keyless_signer(&dir);
    let att = keyless_attestation(&dir, &format!("sha256:{}", "cd".repeat(32)));
    Keyless_ {
        tsa: OpensslTsa::new(TsaKey::EcP256).unwrap(),
        log: RekorV2Log::generate(ORIGIN).unwrap(),
        dir,
        att,
    }
}

impl Keyless_ {
    fn root(&self) -> String {
        trusted_root(
            Some(&self.dir),
            &self.tsa,
            &[self.log.trusted_root_tlog("2020-01-01T00:00:00Z", None)],
        )
    }

    fn entry(&self, body: &[u8]) -> Value {
        self.log.entry("dsse", "0.0.2", body)
    }

    fn check(&self, entry: Value) -> Result<Accepted, Rejection> {
        attest(
            &keyless_plan(&self.root()),
            &self.att,
            bundle(&self.att, entry, Some(&self.tsa)),
        )
    }
}

impl Drop for Keyless_ {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_keyless_dsse_v002_attestation_with_its_proof_checkpoint_and_timestamp_verifies() {
    let k = keyless_setup();
    let accepted = k
        .check(k.entry(&k.att.body()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(accepted.signer.subject.as_deref(), Some(SUBJECT));
    assert_eq!(accepted.signer.log_index, Some(LOGGED_INDEX));
    assert_eq!(
        accepted.statement.unwrap()["predicate"]["builder"]["id"],
        "ivory-test"
    );
}

#[test]
fn a_dsse_v002_entry_for_another_payload_signature_or_certificate_never_counts() {
    let k = keyless_setup();
    let other_payload = dsse_v002_body(
        &statement(&format!("sha256:{}", "ee".repeat(32))),
        &k.att.signature,
        k.att.verifier(),
    );
    refused(
        k.check(k.entry(&other_payload)),
        "logs another payload than the envelope's",
    );
    let mut other_sig = k.att.signature.clone();
    let last = other_sig.len() - 1;
    other_sig[last] ^= 1;
    let other_signature = dsse_v002_body(&k.att.statement, &other_sig, k.att.verifier());
    refused(
        k.check(k.entry(&other_signature)),
        "logs another signature than the envelope's",
    );
    let other_dir = tempdir();
    keyless_signer(&other_dir);
    let other_cert = STANDARD.decode(der_b64(&other_dir, "leaf.pem")).unwrap();
    let other_certificate = dsse_v002_body(
        &k.att.statement,
        &k.att.signature,
        DsseVerifier::Certificate(&other_cert),
    );
    refused(
        k.check(k.entry(&other_certificate)),
        "names another certificate than the bundle's",
    );
    // A body of another kind relabelled as dsse/0.0.2.
    let relabelled = String::from_utf8(k.att.body())
        .unwrap()
        .replace("\"kind\":\"dsse\"", "\"kind\":\"intoto\"");
    refused(
        k.check(k.entry(relabelled.as_bytes())),
        "not of kind dsse/0.0.2",
    );
    // A body that names a field twice, the second time rightly: refused, not read as its last.
    let repeated = String::from_utf8(k.att.body()).unwrap().replacen(
        "\"payloadHash\":",
        "\"payloadHash\":{\"algorithm\":\"SHA2_256\",\"digest\":\"AAAA\"},\"payloadHash\":",
        1,
    );
    refused(
        k.check(k.entry(repeated.as_bytes())),
        "malformed dsse/0.0.2 log entry body",
    );
    let _ = std::fs::remove_dir_all(&other_dir);
}

#[test]
fn a_corrupted_inclusion_proof_or_a_checkpoint_of_another_key_is_refused() {
    let k = keyless_setup();
    let body = k.att.body();
    let mut entry = k.entry(&body);
    let first = entry["inclusionProof"]["hashes"][0].as_str().unwrap();
    let mut hash = STANDARD.decode(first).unwrap();
    hash[0] ^= 1;
    entry["inclusionProof"]["hashes"][0] = json!(STANDARD.encode(hash));
    refused(k.check(entry), "inclusion proof does not verify");
    let mut entry = k.entry(&body);
    entry.as_object_mut().unwrap().remove("inclusionProof");
    refused(k.check(entry), "has no inclusion proof");
    // Another index than the one proven.
    let mut entry = k.entry(&body);
    entry["logIndex"] = json!((LOGGED_INDEX - 1).to_string());
    refused(k.check(entry), "inclusion proof does not verify");
    // A log of the same name with another key signs the checkpoint; the entry names the
    // trusted log.
    let impostor = RekorV2Log::generate(ORIGIN).unwrap();
    let mut entry = impostor.entry("dsse", "0.0.2", &body);
    entry["logId"]["keyId"] = json!(STANDARD.encode(k.log.key_id()));
    refused(k.check(entry.clone()), "not signed by the named log's key");
    // The impostor's signature line relabelled with the trusted log's key hint.
    let envelope = entry["inclusionProof"]["checkpoint"]["envelope"]
        .as_str()
        .unwrap()
        .to_owned();
    let (note, line) = envelope.trim_end().rsplit_once('\n').unwrap();
    let sig_b64 = line.rsplit_once(' ').unwrap().1;
    let mut sig = STANDARD.decode(sig_b64).unwrap();
    sig[..4].copy_from_slice(&k.log.key_id()[..4]);
    let forged = format!("{note}\n\u{2014} {ORIGIN} {}\n", STANDARD.encode(&sig));
    entry["inclusionProof"]["checkpoint"]["envelope"] = json!(forged);
    refused(k.check(entry), "not signed by the named log's key");
    // The entry names a log the trust root does not hold: the denial names the log and the
    // root, so that an operator sees a root that has not caught up (a new shard).
    refused(
        k.check(impostor.entry("dsse", "0.0.2", &body)),
        &format!(
            "transparency log {} unknown to the attestor's trustedRoot",
            hex::encode(impostor.key_id())
        ),
    );
}

#[test]
fn a_dsse_v002_attestation_needs_a_trusted_timestamp_inside_the_logs_validity() {
    let k = keyless_setup();
    let plan = keyless_plan(&k.root());
    let entry = k.entry(&k.att.body());
    refused(
        attest(&plan, &k.att, bundle(&k.att, entry.clone(), None)),
        "timestamp",
    );
    let untrusted = OpensslTsa::new(TsaKey::EcP256).unwrap();
    refused(
        attest(
            &plan,
            &k.att,
            bundle(&k.att, entry.clone(), Some(&untrusted)),
        ),
        "TSA",
    );
    // The log's key was retired before the signature was timestamped.
    let retired = trusted_root(
        Some(&k.dir),
        &k.tsa,
        &[k.log
            .trusted_root_tlog("2020-01-01T00:00:00Z", Some("2021-01-01T00:00:00Z"))],
    );
    refused(
        attest(
            &keyless_plan(&retired),
            &k.att,
            bundle(&k.att, entry.clone(), Some(&k.tsa)),
        ),
        "while that log was valid",
    );
    // A second entry beside the dsse/0.0.2 one.
    let mut two =
        serde_json::from_slice::<Value>(&bundle(&k.att, entry.clone(), Some(&k.tsa))).unwrap();
    two["verificationMaterial"]["tlogEntries"] = json!([entry.clone(), entry]);
    refused(
        attest(&plan, &k.att, two.to_string().into_bytes()),
        "must carry no other entry",
    );
}

#[test]
fn a_key_signed_dsse_v002_attestation_verifies_with_its_key_only() {
    let signer = CosignSigner::generate().unwrap();
    let att = key_attestation(&signer, &format!("sha256:{}", "ab".repeat(32)));
    let tsa = OpensslTsa::new(TsaKey::EcP256).unwrap();
    let log = RekorV2Log::generate(ORIGIN).unwrap();
    let root = trusted_root(
        None,
        &tsa,
        &[log.trusted_root_tlog("2020-01-01T00:00:00Z", None)],
    );
    let plan = key_plan(&signer.public_pem, &root);
    let good = bundle(&att, log.entry("dsse", "0.0.2", &att.body()), Some(&tsa));
    let accepted = attest(&plan, &att, good).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(accepted.signer.log_index, Some(LOGGED_INDEX));
    // The entry names another key.
    let other = CosignSigner::generate().unwrap();
    let other_der = STANDARD.decode(der_of_pem(&other.public_pem)).unwrap();
    let body = dsse_v002_body(
        &att.statement,
        &att.signature,
        DsseVerifier::PublicKey(&other_der),
    );
    refused(
        attest(
            &plan,
            &att,
            bundle(&att, log.entry("dsse", "0.0.2", &body), Some(&tsa)),
        ),
        "names another key than the attestor's",
    );
    // Another attestor key: the entry and the signature are the first key's.
    refused(
        attest(
            &key_plan(&other.public_pem, &root),
            &att,
            bundle(&att, log.entry("dsse", "0.0.2", &att.body()), Some(&tsa)),
        ),
        "names another key than the attestor's",
    );
    // Keys need a timestamp too: the log's validity is judged at the signing time.
    refused(
        attest(
            &plan,
            &att,
            bundle(&att, log.entry("dsse", "0.0.2", &att.body()), None),
        ),
        "needs an RFC 3161 timestamp",
    );
}
