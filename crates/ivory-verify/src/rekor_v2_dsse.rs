//! Rekor v2 `dsse/0.0.2` entries, which sigstore-verify refuses to read: the form Rekor v2
//! logged DSSE attestations in before it logged them as `hashedrekord/0.0.2` over the
//! envelope's pre-authentication encoding (June 2026). A bundle carrying one is verified in
//! two halves:
//!
//! * here, the entry: its body names this envelope (the SHA-256 of its payload, its signature,
//!   and the bundle's certificate or the attestor's key as verifier — an entry for another
//!   artifact or key never counts); the RFC 6962 inclusion proof of the body leads to the root
//!   of a checkpoint signed by the key of the trust root's log the entry names; that log was
//!   valid at every verified signing time;
//! * sigstore-verify, on the bundle without the entry (its log check skipped, as ivory made
//!   it): every RFC 3161 timestamp against the trust root's authorities, the certificate chain
//!   and validity at each timestamp, the SCT, the identity, the DSSE signature over the PAE and
//!   the payload's binding to the artifact.
//!
//! Rekor v2 has no integrated time, so the signing time comes only from RFC 3161 timestamps:
//! a bundle without one is refused, for keys too (the log's validity needs a time).

use base64::Engine as _;
use jiff::Timestamp;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use sigstore_verify::crypto::VerificationKey;
use sigstore_verify::trust_root::TrustedRoot;
use sigstore_verify::types::bundle::InclusionProof;
use sigstore_verify::types::{Bundle, DerPublicKey, SignatureContent};

use crate::rejection::Rejection;
use crate::signed_json::parse_signed_json;

/// A `dsse/0.0.2` log entry taken out of a bundle document.
#[derive(Debug)]
pub(crate) struct Entry {
    log_index: u64,
    pub(crate) log_key_id: Vec<u8>,
    body: Vec<u8>,
    proof: InclusionProof,
}

impl Entry {
    /// The entry's index in its log (authenticated by the inclusion proof once checked).
    pub(crate) fn log_index(&self) -> u64 {
        self.log_index
    }
}

/// Who the entry must name as the envelope's verifier.
pub(crate) enum Verifier<'a> {
    /// The bundle's signing certificate (DER).
    Certificate(&'a [u8]),
    /// The attestor's public key (SPKI DER).
    Key(&'a DerPublicKey),
}

fn is_dsse_v002(entry: &Value) -> bool {
    let field = |k: &str| entry.pointer(k).and_then(Value::as_str);
    field("/kindVersion/kind") == Some("dsse") && field("/kindVersion/version") == Some("0.0.2")
}

/// Removes a `dsse/0.0.2` entry from the bundle document `doc`; `None` when it has none. A
/// bundle with such an entry and any other entry is refused: each entry must be checked, and
/// the others would only be checked by sigstore-verify's log step, which this path skips.
pub(crate) fn take_entry(doc: &mut Value) -> Result<Option<Entry>, Rejection> {
    let Some(entries) = doc
        .pointer_mut("/verificationMaterial/tlogEntries")
        .and_then(Value::as_array_mut)
    else {
        return Ok(None);
    };
    if !entries.iter().any(is_dsse_v002) {
        return Ok(None);
    }
    if entries.len() != 1 {
        return Err(Rejection::LogEntry(
            "a bundle with a dsse/0.0.2 log entry must carry no other entry".into(),
        ));
    }
    read_entry(entries.remove(0)).map(Some)
}

fn read_entry(mut raw: Value) -> Result<Entry, Rejection> {
    let proof = raw
        .get_mut("inclusionProof")
        .map(Value::take)
        .ok_or(Rejection::Tlog(
            "dsse/0.0.2 log entry has no inclusion proof".into(),
        ))
        .and_then(|p| {
            serde_json::from_value::<InclusionProof>(p).map_err(|e| {
                Rejection::Malformed(format!("malformed dsse/0.0.2 inclusion proof: {e}"))
            })
        })?;
    let text = |pointer: &str| {
        raw.pointer(pointer)
            .and_then(Value::as_str)
            .ok_or_else(|| Rejection::Malformed(format!("dsse/0.0.2 log entry has no {pointer}")))
    };
    // protojson writes 64-bit integers as strings; a number is read too.
    let log_index = match raw.get("logIndex") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        _ => None,
    }
    .ok_or(Rejection::Malformed(
        "dsse/0.0.2 log entry has no valid logIndex".into(),
    ))?;
    let log_key_id = decode_b64(text("/logId/keyId")?, "dsse/0.0.2 logId")?;
    let body = decode_b64(text("/canonicalizedBody")?, "dsse/0.0.2 canonicalizedBody")?;
    Ok(Entry {
        log_index,
        log_key_id,
        body,
        proof,
    })
}

fn no_time() -> Rejection {
    Rejection::Tlog(
        "a dsse/0.0.2 log entry has no integrated time: the bundle needs an RFC 3161 timestamp"
            .into(),
    )
}

fn decode_b64(text: &str, what: &str) -> Result<Vec<u8>, Rejection> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| Rejection::Malformed(format!("malformed {what}: {e}")))
}

/// The bundle has a timestamp (the only signing time a Rekor v2 entry can have), the entry's
/// body names the bundle's envelope and `verifier`, and its inclusion proof leads to its
/// checkpoint's root hash (the checkpoint itself is checked by [`check_log`]).
pub(crate) fn check_entry(
    entry: &Entry,
    bundle: &Bundle,
    verifier: &Verifier<'_>,
) -> Result<(), Rejection> {
    if bundle
        .verification_material
        .timestamp_verification_data
        .rfc3161_timestamps
        .is_empty()
    {
        return Err(no_time());
    }
    let SignatureContent::DsseEnvelope(envelope) = &bundle.content else {
        return Err(Rejection::LogEntry(
            "a dsse/0.0.2 log entry cannot log a message signature".into(),
        ));
    };
    // Typed, so a body repeating a field is refused rather than read one way here and
    // another elsewhere.
    let body: Body = parse_signed_json(&entry.body, "dsse/0.0.2 log entry body")?;
    if body.kind != "dsse" || body.api_version != "0.0.2" {
        return Err(Rejection::LogEntry(
            "the log entry body is not of kind dsse/0.0.2".into(),
        ));
    }
    let spec = body.spec.dsse_v002;
    if spec.payload_hash.algorithm != "SHA2_256" {
        return Err(Rejection::LogEntry(
            "dsse/0.0.2 body hashes the payload with another algorithm than SHA2_256".into(),
        ));
    }
    let logged_hash = decode_b64(&spec.payload_hash.digest, "dsse/0.0.2 payload hash")?;
    if logged_hash != Sha256::digest(envelope.payload.as_bytes()).as_slice() {
        return Err(Rejection::LogEntry(
            "dsse/0.0.2 log entry logs another payload than the envelope's".into(),
        ));
    }
    // sigstore-types reads an envelope with exactly one signature; the entry must log that
    // one and nothing else.
    let [logged] = spec.signatures.as_slice() else {
        return Err(Rejection::LogEntry(format!(
            "dsse/0.0.2 log entry logs {} signatures, the envelope carries one",
            spec.signatures.len()
        )));
    };
    if decode_b64(&logged.content, "dsse/0.0.2 signature")? != envelope.signature.sig.as_bytes() {
        return Err(Rejection::LogEntry(
            "dsse/0.0.2 log entry logs another signature than the envelope's".into(),
        ));
    }
    if !names_verifier(&logged.verifier, verifier)? {
        return Err(Rejection::LogEntry(match verifier {
            Verifier::Certificate(_) => {
                "dsse/0.0.2 log entry names another certificate than the bundle's".into()
            }
            Verifier::Key(_) => "dsse/0.0.2 log entry names another key than the attestor's".into(),
        }));
    }
    check_inclusion(entry)
}

/// The `dsse/0.0.2` canonicalized body (Rekor v2's `DSSELogEntryV002`); `keyDetails` is not
/// read: the key's algorithm comes from the key.
#[derive(Deserialize)]
struct Body {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    spec: Spec,
}

#[derive(Deserialize)]
struct Spec {
    #[serde(rename = "dsseV002")]
    dsse_v002: DsseV002,
}

#[derive(Deserialize)]
struct DsseV002 {
    #[serde(rename = "payloadHash")]
    payload_hash: LoggedHash,
    signatures: Vec<LoggedSignature>,
}

#[derive(Deserialize)]
struct LoggedHash {
    algorithm: String,
    digest: String,
}

#[derive(Deserialize)]
struct LoggedSignature {
    content: String,
    verifier: LoggedVerifier,
}

#[derive(Deserialize)]
struct LoggedVerifier {
    #[serde(rename = "x509Certificate")]
    x509_certificate: Option<RawBytes>,
    #[serde(rename = "publicKey")]
    public_key: Option<RawBytes>,
}

#[derive(Deserialize)]
struct RawBytes {
    #[serde(rename = "rawBytes")]
    raw_bytes: String,
}

/// The logged verifier is `verifier`: the same certificate, or the same key (given as a key
/// or as a certificate for it).
fn names_verifier(logged: &LoggedVerifier, verifier: &Verifier<'_>) -> Result<bool, Rejection> {
    let raw = |field: &Option<RawBytes>| {
        field
            .as_ref()
            .map(|r| decode_b64(&r.raw_bytes, "dsse/0.0.2 verifier"))
            .transpose()
    };
    let certificate = raw(&logged.x509_certificate)?;
    let key = raw(&logged.public_key)?;
    Ok(match (verifier, certificate, key) {
        (Verifier::Certificate(der), Some(logged), None) => logged == *der,
        (Verifier::Key(der), None, Some(logged)) => logged == der.as_bytes(),
        (Verifier::Key(der), Some(logged), None) => {
            let cert = sigstore_verify::types::DerCertificate::new(logged);
            sigstore_verify::crypto::parse_certificate_info(&cert)
                .is_ok_and(|info| info.public_key.as_bytes() == der.as_bytes())
        }
        _ => false,
    })
}

/// RFC 6962: the leaf hash of the body, at the entry's index, leads to the root hash of the
/// checkpoint (Rekor v2 takes index, size and root from the entry and the signed checkpoint,
/// never from the proof's unauthenticated copies).
fn check_inclusion(entry: &Entry) -> Result<(), Rejection> {
    let checkpoint = entry.proof.checkpoint.checkpoint().ok_or(Rejection::Tlog(
        "dsse/0.0.2 inclusion proof has no checkpoint".into(),
    ))?;
    let leaf = sigstore_merkle::hash_leaf(&entry.body);
    sigstore_merkle::verify_inclusion_proof(
        &leaf,
        entry.log_index,
        checkpoint.tree_size(),
        &entry.proof.hashes,
        checkpoint.root_hash(),
    )
    .map_err(|e| Rejection::Tlog(format!("dsse/0.0.2 inclusion proof does not verify: {e}")))
}

/// The checkpoint is signed by the key of a log of `root` the entry names (its log ID, whose
/// first four bytes are the signed note's key hint), valid at every time in `times` (the
/// verified RFC 3161 times; at least one).
pub(crate) fn check_log(
    entry: &Entry,
    root: &TrustedRoot,
    times: &[Timestamp],
) -> Result<(), Rejection> {
    if times.is_empty() {
        return Err(no_time());
    }
    let checkpoint = entry.proof.checkpoint.checkpoint().ok_or(Rejection::Tlog(
        "dsse/0.0.2 inclusion proof has no checkpoint".into(),
    ))?;
    let hint = entry.log_key_id.get(..4).ok_or(Rejection::Malformed(
        "dsse/0.0.2 logId is shorter than a key hint".into(),
    ))?;
    let mut named = false;
    for log in root
        .tlogs
        .iter()
        .filter(|l| l.log_id.key_id.as_bytes() == entry.log_key_id.as_slice())
    {
        named = true;
        let in_window = times.iter().all(|t| {
            log.public_key
                .valid_for
                .is_none_or(|window| window.contains(*t))
        });
        let Ok(key) = VerificationKey::from_spki(&log.public_key.raw_bytes) else {
            continue;
        };
        let signed = checkpoint
            .signatures()
            .iter()
            .filter(|s| s.key_id.as_bytes() == hint)
            .any(|s| key.verify(checkpoint.signed_data(), &s.signature).is_ok());
        if signed && in_window {
            return Ok(());
        }
    }
    Err(Rejection::Tlog(if named {
        "dsse/0.0.2 checkpoint is not signed by the named log's key while that log was valid".into()
    } else {
        "dsse/0.0.2 log entry names a log the trust root does not hold".into()
    }))
}
