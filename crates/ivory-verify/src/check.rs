//! The synchronous verification core: given an attestor plan, an image digest and the
//! signature material fetched for it, reach a verdict. No IO.

use base64::Engine as _;
use serde_json::Value;
use sigstore_verify::types::{Bundle, Sha256Hash, SignatureBytes, SignatureContent};
use sigstore_verify::{PublicKeyVerificationPolicy, VerificationPolicy};

use crate::envelope::{Envelope, RawDsse, SimpleSigning};
use crate::keys::PublicKey;
use crate::plan::{Authority, Plan};

/// The predicate type cosign v3 uses for image signatures stored as bundles.
pub const COSIGN_SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";
const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// Kyverno's texts, kept so policies' messages read the same.
pub const NO_SIGNATURES: &str = "signatures not found";
pub const TLOG_FAILED: &str = "transparency log or timestamp verification failed";
pub const NO_ATTESTATIONS: &str = "no matching attestations";
/// At most this many per-signature reasons are joined into one message.
const MAX_REASONS: usize = 5;

/// A positive verdict for one attestor.
#[derive(Clone, Debug, PartialEq)]
pub struct Accepted {
    /// The verified in-toto statement (attestations only).
    pub statement: Option<Value>,
}

/// What a verified envelope carried.
enum Content {
    /// A simple-signing payload (legacy `.sig`).
    Simple(Vec<u8>),
    /// A verified in-toto statement (DSSE).
    Statement(Value),
}

/// Checks `envelopes` for `digest` (`sha256:<hex>`); `predicate_type` selects attestation mode.
/// `Err` is the definite negative reason.
pub fn evaluate(
    plan: &Plan,
    digest: &str,
    envelopes: &[Envelope],
    predicate_type: Option<&str>,
) -> Result<Accepted, String> {
    match predicate_type {
        None => evaluate_signatures(plan, digest, envelopes),
        Some(t) => evaluate_attestations(plan, digest, envelopes, t),
    }
}

fn evaluate_signatures(
    plan: &Plan,
    digest: &str,
    envelopes: &[Envelope],
) -> Result<Accepted, String> {
    let candidates: Vec<&Envelope> = envelopes
        .iter()
        .filter(|e| !matches!(e, Envelope::Dsse(_)))
        .collect();
    if candidates.is_empty() {
        return Err(NO_SIGNATURES.into());
    }
    let mut reasons = Vec::new();
    for env in candidates {
        let outcome = verify_envelope(plan, digest, env).and_then(|content| match content {
            Content::Simple(payload) => check_simple_signing(plan, digest, &payload),
            Content::Statement(st) => {
                let found = predicate_type_of(&st);
                if found != COSIGN_SIGN_PREDICATE {
                    return Err(format!(
                        "bundle predicate type {found} is not a cosign signature"
                    ));
                }
                check_bundle_annotations(plan, &st)
            }
        });
        match outcome {
            Ok(()) => return Ok(Accepted { statement: None }),
            Err(e) => push_reason(&mut reasons, e),
        }
    }
    Err(join_reasons("no matching signatures", &reasons))
}

fn evaluate_attestations(
    plan: &Plan,
    digest: &str,
    envelopes: &[Envelope],
    wanted: &str,
) -> Result<Accepted, String> {
    let candidates: Vec<&Envelope> = envelopes
        .iter()
        .filter(|e| !matches!(e, Envelope::SimpleSigning(_)))
        .collect();
    if candidates.is_empty() {
        return Err(format!("{NO_ATTESTATIONS}: {NO_SIGNATURES}"));
    }
    let mut reasons = Vec::new();
    let mut found_types = Vec::new();
    for env in candidates {
        match verify_envelope(plan, digest, env) {
            Ok(Content::Statement(st)) => {
                let t = predicate_type_of(&st).to_owned();
                if t == wanted {
                    return Ok(Accepted {
                        statement: Some(st),
                    });
                }
                if t != COSIGN_SIGN_PREDICATE && !found_types.contains(&t) {
                    found_types.push(t);
                }
            }
            Ok(Content::Simple(_)) => push_reason(&mut reasons, "not an attestation".into()),
            Err(e) => push_reason(&mut reasons, e),
        }
    }
    if reasons.is_empty() || !found_types.is_empty() {
        return Err(format!(
            "required predicate type {wanted} not found, found [{}]",
            found_types.join(", ")
        ));
    }
    Err(join_reasons(NO_ATTESTATIONS, &reasons))
}

fn push_reason(reasons: &mut Vec<String>, reason: String) {
    if !reasons.contains(&reason) {
        reasons.push(reason);
    }
}

fn join_reasons(prefix: &str, reasons: &[String]) -> String {
    let shown: Vec<&str> = reasons
        .iter()
        .take(MAX_REASONS)
        .map(String::as_str)
        .collect();
    let more = reasons.len().saturating_sub(MAX_REASONS);
    let tail = if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    };
    format!("{prefix}: {}{tail}", shown.join("; "))
}

fn predicate_type_of(statement: &Value) -> &str {
    statement
        .get("predicateType")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Cryptographic and trust verification of one envelope.
fn verify_envelope(plan: &Plan, digest: &str, env: &Envelope) -> Result<Content, String> {
    match (&plan.authority, plan.ignore_tlog) {
        (Authority::Key(key) | Authority::Certificate(key), true) => {
            verify_offline(key, digest, env)
        }
        _ => verify_with_sigstore(plan, digest, env),
    }
}

/// Key or certificate attestor with `insecureIgnoreTlog`: the signature alone, no Sigstore
/// trust material (Kyverno's air-gap mode).
fn verify_offline(key: &PublicKey, digest: &str, env: &Envelope) -> Result<Content, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let check = |data: &[u8], sig: &[u8]| {
        sigstore_verify::crypto::verify_signature(
            &key.der,
            data,
            &SignatureBytes::new(sig.to_vec()),
            key.scheme,
        )
        .map_err(|e| format!("invalid signature: {e}"))
    };
    match env {
        Envelope::SimpleSigning(l) => {
            let sig = l
                .signature
                .as_deref()
                .ok_or("signature layer has no signature annotation")?;
            let sig = b64
                .decode(sig.trim())
                .map_err(|e| format!("malformed signature annotation: {e}"))?;
            check(&l.blob, &sig)?;
            Ok(Content::Simple(l.blob.clone()))
        }
        Envelope::Dsse(l) => {
            let raw: RawDsse = serde_json::from_slice(&l.blob)
                .map_err(|e| format!("malformed DSSE envelope: {e}"))?;
            let payload = b64
                .decode(raw.payload.as_bytes())
                .map_err(|e| format!("malformed DSSE payload: {e}"))?;
            let pae = sigstore_verify::types::dsse::pae(&raw.payload_type, &payload);
            let any = raw.signatures.iter().any(|s| {
                b64.decode(s.sig.as_bytes())
                    .is_ok_and(|sig| check(&pae, &sig).is_ok())
            });
            if !any {
                return Err("invalid signature: no DSSE signature verifies with the key".into());
            }
            statement_content(&raw.payload_type, &payload, digest)
        }
        Envelope::Bundle(_) => {
            let bundle = env.to_bundle(true)?.ok_or("empty bundle")?;
            match &bundle.content {
                SignatureContent::DsseEnvelope(d) => {
                    check(&d.pae(), d.signature.sig.as_bytes())?;
                    statement_content(&d.payload_type, d.payload.as_bytes(), digest)
                }
                _ => Err("bundle does not carry a DSSE envelope over the image".into()),
            }
        }
    }
}

/// Everything else goes through sigstore-verify on a bundle (legacy layers are rewritten).
fn verify_with_sigstore(plan: &Plan, digest: &str, env: &Envelope) -> Result<Content, String> {
    let verifier = plan
        .verifier
        .as_ref()
        .ok_or("attestor has no trust material")?;
    let use_key = !matches!(plan.authority, Authority::Keyless(_));
    let bundle = env.to_bundle(use_key)?;
    let Some(bundle) = bundle else {
        return Err(format!(
            "{TLOG_FAILED}: signature has no transparency log entry"
        ));
    };
    let image_hash = image_digest(digest)?;
    let result = match (&plan.authority, &bundle.content, env) {
        (_, SignatureContent::MessageSignature(_), Envelope::SimpleSigning(l)) => {
            run(plan, verifier, &l.blob[..], &bundle)?
        }
        (_, SignatureContent::DsseEnvelope(_), _) => run(plan, verifier, image_hash, &bundle)?,
        _ => return Err("bundle does not sign this image (message signature over a blob)".into()),
    };
    if let (Authority::Keyless(rules), Some(id)) = (&plan.authority, &result) {
        let (subject, issuer) = id;
        if !rules.iter().any(|r| r.matches(subject, issuer)) {
            return Err(format!(
                "none of the expected identities matched what was in the certificate, got subjects [{subject}] with issuer {issuer}"
            ));
        }
    }
    match &bundle.content {
        SignatureContent::DsseEnvelope(d) => {
            statement_content(&d.payload_type, d.payload.as_bytes(), digest)
        }
        _ => match env {
            Envelope::SimpleSigning(l) => Ok(Content::Simple(l.blob.clone())),
            _ => Err("unexpected bundle content".into()),
        },
    }
}

/// Runs sigstore-verify; returns the certificate identity (subject, issuer) for keyless.
fn run<'a>(
    plan: &Plan,
    verifier: &sigstore_verify::Verifier,
    artifact: impl Into<sigstore_verify::types::Artifact<'a>>,
    bundle: &Bundle,
) -> Result<Option<(String, String)>, String> {
    let result = match &plan.authority {
        Authority::Key(key) | Authority::Certificate(key) => {
            let policy = PublicKeyVerificationPolicy::new(key.der.clone());
            verifier.verify(artifact, bundle, &policy).map(|_| None)
        }
        Authority::Keyless(_) => {
            let mut policy = VerificationPolicy::any_identity();
            if plan.ignore_sct {
                policy = policy.skip_sct();
            }
            if plan.ignore_tlog {
                policy = policy.skip_tlog_unsafe();
            }
            verifier.verify(artifact, bundle, &policy).map(|r| {
                Some((
                    r.identity()
                        .map(|i| i.as_str().to_owned())
                        .unwrap_or_default(),
                    r.issuer().unwrap_or_default().to_owned(),
                ))
            })
        }
    };
    result.map_err(describe)
}

fn describe(e: sigstore_verify::Error) -> String {
    use sigstore_verify::Error as E;
    match e {
        E::TransparencyLog(_) | E::Timestamp(_) | E::Bundle(_) => format!("{TLOG_FAILED}: {e}"),
        other => other.to_string(),
    }
}

fn image_digest(digest: &str) -> Result<Sha256Hash, String> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("image digest {digest} is not sha256"))?;
    Sha256Hash::from_hex(hex).map_err(|e| format!("image digest {digest} is malformed: {e}"))
}

/// Decodes a DSSE payload as an in-toto statement bound to `digest`.
fn statement_content(payload_type: &str, payload: &[u8], digest: &str) -> Result<Content, String> {
    if payload_type != IN_TOTO_PAYLOAD_TYPE {
        return Err(format!("DSSE payload type {payload_type} is not in-toto"));
    }
    let st: Value =
        serde_json::from_slice(payload).map_err(|e| format!("malformed in-toto statement: {e}"))?;
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let bound = st
        .get("subject")
        .and_then(Value::as_array)
        .is_some_and(|subjects| {
            subjects.iter().any(|s| {
                s.pointer("/digest/sha256")
                    .and_then(Value::as_str)
                    .is_some_and(|d| d.eq_ignore_ascii_case(hex))
            })
        });
    if !bound {
        return Err(format!("in-toto statement subject does not name {digest}"));
    }
    Ok(Content::Statement(st))
}

/// The simple-signing payload must name this digest and carry the attestor's annotations.
fn check_simple_signing(plan: &Plan, digest: &str, payload: &[u8]) -> Result<(), String> {
    let ss: SimpleSigning = serde_json::from_slice(payload)
        .map_err(|e| format!("malformed simple-signing payload: {e}"))?;
    let signed = &ss.critical.image.docker_manifest_digest;
    if signed != digest {
        return Err(format!("signature is for digest {signed}, not {digest}"));
    }
    check_annotations(plan, ss.optional.as_ref())
}

/// cosign v3 bundles carry no simple-signing `optional` map; annotations can only be satisfied
/// when the attestor asks for none or the predicate carries them.
fn check_bundle_annotations(plan: &Plan, statement: &Value) -> Result<(), String> {
    let map = statement.get("predicate").and_then(Value::as_object);
    check_annotations(plan, map)
}

fn check_annotations(
    plan: &Plan,
    optional: Option<&serde_json::Map<String, Value>>,
) -> Result<(), String> {
    for (k, v) in &plan.annotations {
        let got = optional.and_then(|m| m.get(k));
        let matches = match got {
            Some(Value::String(s)) => s == v,
            Some(other) => other.to_string().as_str() == v.as_str(),
            None => false,
        };
        if !matches {
            return Err(format!(
                "annotation {k}={v} is not in the signature payload"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
