//! A blob (a file, its bytes, or only its SHA-256 digest) verified against a Sigstore bundle
//! with an attestor's plan: `ivory verify-blob`, cosign's `verify-blob --bundle`. The same
//! checks as an image's bundle (sigstore-verify: chain, SCT, Rekor v1 and v2 entries with their
//! checkpoints, inclusion proofs and promises, RFC 3161 timestamps, the entry bound to this
//! signature and artifact), the same trust roots, and the same identity rules; no IO but the
//! caller's file read.

use std::path::Path;

use serde_json::Value;
use sigstore_verify::VerificationResult;
use sigstore_verify::types::{Artifact, Bundle, Sha256Hash, SignatureContent};

use crate::attestor_plan::{Authority, Plan};
use crate::envelope::Envelope;
use crate::rejection::Rejection;
use crate::signer;
use crate::verdict::run_with;
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
    let bundle = Envelope::Bundle(bundle_json.to_vec())
        .to_bundle(use_key)?
        .ok_or(Rejection::Malformed("empty bundle".into()))?;
    let result = run_with(plan, &bundle, |bundle, policy| match blob {
        Blob::Bytes(bytes) => verifier.verify(bytes, bundle, policy),
        Blob::Sha256(digest) => {
            verifier.verify(Artifact::from(Sha256Hash::new(digest)), bundle, policy)
        }
        Blob::File(path) => {
            let file = std::fs::File::open(path).map_err(sigstore_verify::Error::ArtifactRead)?;
            verifier.verify_reader(std::io::BufReader::new(file), bundle, policy)
        }
    })?;
    let log_index = (!plan.ignore_tlog)
        .then(|| bundle.verification_material.tlog_entries.first())
        .flatten()
        .map(|e| e.log_index.get());
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
        SignatureContent::DsseEnvelope(d) => Some(crate::envelope::parse_signed_json::<Value>(
            d.payload.as_bytes(),
            "in-toto statement",
        )?),
        _ => None,
    };
    Ok(BlobVerified {
        signer,
        statement,
        evidence: evidence(&bundle, &result),
    })
}

/// One line per check that established the signature.
fn evidence(bundle: &Bundle, result: &VerificationResult) -> Vec<String> {
    let mut lines = vec![format!("bundle {}", bundle.media_type)];
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
