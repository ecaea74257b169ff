//! A blob (a file, its bytes, or only its SHA-256 digest) verified against a Sigstore bundle
//! with an attestor's plan: `ivory verify-blob`, cosign's `verify-blob --bundle`. The same
//! checks as an image's bundle (sigstore-verify: chain, SCT, Rekor v1 and v2 entries with their
//! checkpoints, inclusion proofs and promises, RFC 3161 timestamps, the entry bound to this
//! signature and artifact), the same trust roots, and the same identity rules; no IO but the
//! caller's file read.

use std::path::Path;

use serde_json::Value;
use sigstore_verify::VerificationResult;
use sigstore_verify::crypto::{verify_signature, verify_signature_prehashed};
use sigstore_verify::types::{Artifact, Bundle, HashAlgorithm, Sha256Hash, SignatureContent};

use crate::attestor_plan::{Authority, Plan};
use crate::envelope::Envelope;
use crate::keys::PublicKey;
use crate::rejection::Rejection;
use crate::signer;
use crate::verdict::run_with_entry;
use ivory_engine::verifier::Signer;

/// The largest bundle read, as the largest signature layer an image may carry.
pub const MAX_BUNDLE_BYTES: usize = 4 * 1024 * 1024;

/// What was signed: the artifact itself or only its SHA-256 digest.
#[derive(Clone, Copy, Debug)]
pub enum Blob<'a> {
    /// The artifact's bytes.
    Bytes(&'a [u8]),
    /// A file holding the artifact, hashed as it is read (never held in memory whole).
    File(&'a Path),
    /// The artifact's SHA-256 digest (32 bytes). Signatures whose scheme cannot verify a
    /// prehashed message (Ed25519 over the message itself) need the artifact.
    Sha256([u8; 32]),
}

impl Blob<'_> {
    /// The 32 bytes of `sha256:<64 hex digits>`, or `None` when `text` is not such a digest.
    pub fn sha256_digest(text: &str) -> Option<[u8; 32]> {
        let hex = text.strip_prefix("sha256:")?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(hex, &mut digest).ok()?;
        Some(digest)
    }
}

/// A bundle that verified the blob.
#[derive(Clone, Debug, PartialEq)]
pub struct BlobVerified {
    /// Who signed: the key's fingerprint, or the certificate's identity and issuer, and the
    /// log entry checked with it.
    pub signer: Signer,
    /// The verified in-toto statement when the bundle holds a DSSE envelope.
    pub statement: Option<Value>,
    /// What established the signature, one line per check, for explanations.
    pub evidence: Vec<String>,
}

/// Verifies `bundle_json` (a Sigstore bundle document, at most [`MAX_BUNDLE_BYTES`]) for
/// `blob` under `plan`. `Err` is the reason it does not verify.
pub fn verify_blob(
    plan: &Plan,
    blob: Blob<'_>,
    bundle_json: &[u8],
) -> Result<BlobVerified, Rejection> {
    if bundle_json.len() > MAX_BUNDLE_BYTES {
        return Err(Rejection::Malformed(format!(
            "the bundle is larger than {MAX_BUNDLE_BYTES} bytes"
        )));
    }
    if matches!(plan.authority, Authority::Notary(_)) {
        return Err(Rejection::Attestor(
            "a notary attestor verifies Notation signatures, not Sigstore bundles".into(),
        ));
    }
    // A key without the log (`insecureIgnoreTlog`) has no trust root of its own; a timestamp
    // the bundle carries is still checked, against the public-good root's authorities.
    let public_good;
    let verifier = match &plan.verifier {
        Some(verifier) => verifier.as_ref(),
        None => {
            public_good = crate::trust::public_good_verifier()?;
            &public_good
        }
    };
    let use_key = !matches!(plan.authority, Authority::Keyless(_));
    let (bundle, dsse_v002) = Envelope::Bundle(bundle_json.to_vec())
        .to_bundle(use_key)?
        .ok_or(Rejection::Malformed("empty bundle".into()))?;
    if let (Authority::Key(key) | Authority::Certificate(key), true) =
        (&plan.authority, plan.ignore_tlog)
        && has_no_time_evidence(&bundle)
    {
        return verify_bare(key, blob, &bundle);
    }
    let result = run_with_entry(
        plan,
        &bundle,
        dsse_v002.as_ref(),
        |bundle, policy| match blob {
            Blob::Bytes(bytes) => verifier.verify(bytes, bundle, policy),
            Blob::Sha256(digest) => {
                verifier.verify(Artifact::from(Sha256Hash::new(digest)), bundle, policy)
            }
            Blob::File(path) => {
                let file =
                    std::fs::File::open(path).map_err(sigstore_verify::Error::ArtifactRead)?;
                verifier.verify_reader(std::io::BufReader::new(file), bundle, policy)
            }
        },
    )?;
    let log_index = crate::verdict::evidence_log_index(plan, &bundle, dsse_v002.as_ref());
    let dsse_v002 = dsse_v002.filter(|_| !plan.ignore_tlog);
    let signer = match &plan.authority {
        Authority::Keyless(rules) => {
            let info = result.certificate().ok_or(Rejection::Malformed(
                "keyless signature has no certificate".into(),
            ))?;
            rules.check(info)?;
            signer::of_certificate(info, log_index)
        }
        Authority::Key(key) | Authority::Certificate(key) => signer::of_key(key, log_index),
        Authority::Notary(_) => return Err(Rejection::Attestor("not a cosign attestor".into())),
    };
    let statement = match &bundle.content {
        SignatureContent::DsseEnvelope(d) => Some(crate::signed_json::parse_signed_json::<Value>(
            d.payload.as_bytes(),
            "in-toto statement",
        )?),
        _ => None,
    };
    Ok(BlobVerified {
        signer,
        statement,
        evidence: evidence(&bundle, &result, log_index.filter(|_| dsse_v002.is_some())),
    })
}

/// Neither a log entry nor a timestamp: nothing but the signature to check.
fn has_no_time_evidence(bundle: &Bundle) -> bool {
    let material = &bundle.verification_material;
    material.tlog_entries.is_empty()
        && material
            .timestamp_verification_data
            .rfc3161_timestamps
            .is_empty()
}

/// A key with `insecureIgnoreTlog` and a bundle with neither log entry nor timestamp (`cosign
/// sign-blob` with a signing config naming no Rekor and no TSA), which sigstore-verify does not
/// read: what cosign's `--insecure-ignore-tlog` checks, the signature with the key (tried with
/// each of its schemes) over the artifact, its digest or the DSSE envelope, bound to the artifact.
fn verify_bare(
    key: &PublicKey,
    blob: Blob<'_>,
    bundle: &Bundle,
) -> Result<BlobVerified, Rejection> {
    let statement = match &bundle.content {
        SignatureContent::MessageSignature(ms) => {
            if let Some(declared) = &ms.message_digest {
                let actual = artifact_digest(blob, declared.algorithm)?;
                if declared.digest.as_bytes() != actual.as_slice() {
                    return Err(Rejection::Content(
                        "the bundle's message digest is not the artifact's".into(),
                    ));
                }
            }
            let verified = key
                .schemes
                .iter()
                .any(|scheme| match (scheme.hash_algorithm(), blob) {
                    (_, Blob::Bytes(bytes)) => {
                        verify_signature(&key.der, bytes, &ms.signature, *scheme).is_ok()
                    }
                    (Some(algorithm), _) => artifact_digest(blob, algorithm).is_ok_and(|digest| {
                        verify_signature_prehashed(&key.der, &digest, &ms.signature, *scheme)
                            .is_ok()
                    }),
                    (None, _) => false,
                });
            if !verified {
                return Err(Rejection::InvalidSignature(
                    "the signature does not verify with the key over this artifact".into(),
                ));
            }
            None
        }
        SignatureContent::DsseEnvelope(d) => {
            let pae = d.pae();
            if !key
                .schemes
                .iter()
                .any(|scheme| verify_signature(&key.der, &pae, &d.signature.sig, *scheme).is_ok())
            {
                return Err(Rejection::InvalidSignature(
                    "the DSSE signature does not verify with the key".into(),
                ));
            }
            let statement: Value =
                crate::signed_json::parse_signed_json(d.payload.as_bytes(), "in-toto statement")?;
            let digest = hex::encode(artifact_digest(blob, HashAlgorithm::Sha2256)?);
            let named = statement["subject"].as_array().is_some_and(|subjects| {
                subjects.iter().any(|s| {
                    s.pointer("/digest/sha256").and_then(Value::as_str) == Some(digest.as_str())
                })
            });
            if !named {
                return Err(Rejection::Content(
                    "the in-toto statement's subjects do not name the artifact".into(),
                ));
            }
            Some(statement)
        }
        _ => return Err(Rejection::Malformed("the bundle has no signature".into())),
    };
    Ok(BlobVerified {
        signer: signer::of_key(key, None),
        statement,
        evidence: vec![
            format!("bundle {}", bundle.media_type),
            "signature verified with the key; no transparency log entry or timestamp (--insecure-ignore-tlog)".into(),
        ],
    })
}

/// The artifact's digest by `algorithm`: hashed from its bytes or its file, or the given SHA-256.
fn artifact_digest(blob: Blob<'_>, algorithm: HashAlgorithm) -> Result<Vec<u8>, Rejection> {
    match (blob, algorithm) {
        (Blob::Sha256(digest), HashAlgorithm::Sha2256) => Ok(digest.to_vec()),
        (Blob::Sha256(_), other) => Err(Rejection::Content(format!(
            "the signature needs the artifact's {other} digest; only its SHA-256 was given"
        ))),
        (_, HashAlgorithm::Sha2256) => hash::<sha2::Sha256>(blob),
        (_, HashAlgorithm::Sha2384) => hash::<sha2::Sha384>(blob),
        (_, HashAlgorithm::Sha2512) => hash::<sha2::Sha512>(blob),
        (_, other) => Err(Rejection::Content(format!(
            "the bundle's digest algorithm {other} is not supported"
        ))),
    }
}

/// `blob`'s bytes or file hashed with `D` (a file read a buffer at a time).
fn hash<D: sha2::Digest>(blob: Blob<'_>) -> Result<Vec<u8>, Rejection> {
    use std::io::Read as _;
    let unreadable =
        |e: std::io::Error| Rejection::Content(format!("the artifact cannot be read: {e}"));
    let mut hasher = D::new();
    match blob {
        Blob::Bytes(bytes) => hasher.update(bytes),
        Blob::File(path) => {
            let mut file = std::fs::File::open(path).map_err(unreadable)?;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = file.read(&mut buf).map_err(unreadable)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
            }
        }
        Blob::Sha256(_) => {
            return Err(Rejection::Content(
                "only the artifact's SHA-256 digest was given".into(),
            ));
        }
    }
    Ok(hasher.finalize().to_vec())
}

/// One line per check that established the signature.
/// `dsse_v002` is the index of a Rekor v2 `dsse/0.0.2` entry ivory checked itself.
fn evidence(bundle: &Bundle, result: &VerificationResult, dsse_v002: Option<u64>) -> Vec<String> {
    let mut lines = vec![format!("bundle {}", bundle.media_type)];
    if let Some(index) = dsse_v002 {
        lines.push(format!(
            "transparency log entry dsse/0.0.2 at index {index}: inclusion proof and signed checkpoint verified"
        ));
    }
    if result.certificate_verified() {
        lines.push("signing certificate chains to the trusted root at every verified time".into());
    }
    if result.sct_verified() {
        lines.push("certificate transparency SCT verified".into());
    }
    if result.tlog_verified() {
        for entry in &bundle.verification_material.tlog_entries {
            let kind = entry.kind_version;
            let proof = match (&entry.inclusion_proof, &entry.inclusion_promise) {
                (Some(_), Some(_)) => "inclusion proof, signed checkpoint and promise",
                (Some(_), None) => "inclusion proof and signed checkpoint",
                (None, Some(_)) => "inclusion promise",
                (None, None) => "no proof",
            };
            lines.push(format!(
                "transparency log entry {}/{} at index {}: {proof} verified",
                kind.kind(),
                kind.version(),
                entry.log_index.get()
            ));
        }
    }
    let tsa = bundle
        .verification_material
        .timestamp_verification_data
        .rfc3161_timestamps
        .len();
    if tsa > 0 {
        lines.push(format!("{tsa} RFC 3161 timestamp(s) verified"));
    }
    let mut times: Vec<String> = result
        .verified_timestamps()
        .iter()
        .map(ToString::to_string)
        .collect();
    times.dedup();
    if !times.is_empty() {
        lines.push(format!("verified signing time {}", times.join(", ")));
    }
    lines
}

#[cfg(test)]
mod tests;
