//! The synchronous verification core: given an attestor plan, an image digest and the
//! signature material fetched for it, reach a verdict. No IO.

use base64::Engine as _;
use serde_json::Value;
use sigstore_verify::types::bundle::{Rfc3161Timestamp, TimestampVerificationData};
use sigstore_verify::types::{
    Bundle, Sha256Hash, SignatureBytes, SignatureContent, TimestampToken,
};
use sigstore_verify::{
    Policy, PublicKeyVerificationPolicy, TimestampError, VerificationPolicy, VerificationResult,
};

use crate::attestor_plan::{Authority, KeylessRules, Plan};
use crate::envelope::{ANNOTATION_CERTIFICATE, ANNOTATION_CHAIN, Envelope, RawDsse, SimpleSigning};
use crate::keys::{PublicKey, parse_certificates};
use crate::rejection::{Rejection, Sought};
use crate::signed_json::parse_signed_json;
use crate::signer;
use ivory_engine::verifier::Signer;

/// The predicate type cosign v3 uses for image signatures stored as bundles.
pub const COSIGN_SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";
const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// Kyverno's text, kept so messages read the same: the image has no signature to check.
pub const NO_SIGNATURES: &str = "signatures not found";
/// Kyverno's text: a signature's Rekor entry or RFC 3161 timestamp does not verify.
pub const TLOG_FAILED: &str = "transparency log or timestamp verification failed";
/// Kyverno's text, prefixing the reasons when no attestation of the wanted type verifies.
pub const NO_ATTESTATIONS: &str = "no matching attestations";
/// At most this many per-signature reasons are joined into one message.
const MAX_REASONS: usize = 5;

/// A positive verdict for one attestor.
#[derive(Clone, Debug, PartialEq)]
pub struct Accepted {
    /// The verified in-toto statement (attestations only).
    pub statement: Option<Value>,
    /// Who signed it: the key or certificate identity and the log entry that verified it.
    pub signer: Signer,
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
) -> Result<Accepted, Rejection> {
    if matches!(plan.authority, Authority::Notary(_)) {
        return Err(Rejection::Attestor(
            "a notary attestor verifies Notation signatures, not cosign ones".into(),
        ));
    }
    match predicate_type {
        None => evaluate_signatures(plan, digest, envelopes),
        Some(t) => evaluate_attestations(plan, digest, envelopes, t),
    }
}

fn evaluate_signatures(
    plan: &Plan,
    digest: &str,
    envelopes: &[Envelope],
) -> Result<Accepted, Rejection> {
    let candidates: Vec<&Envelope> = envelopes
        .iter()
        .filter(|e| !matches!(e, Envelope::Dsse(_)))
        .collect();
    if candidates.is_empty() {
        return Err(Rejection::NoSignatures);
    }
    let mut reasons = Vec::new();
    for env in candidates {
        let outcome = verify_envelope(plan, digest, env).and_then(|(content, signer)| {
            match content {
                Content::Simple(payload) => check_simple_signing(plan, digest, &payload),
                // cosign accepts any verified statement whose subject is the image as a
                // signature (Kyverno's github-attestation case), not only cosign/sign/v1.
                Content::Statement(st) => check_bundle_annotations(plan, &st),
            }
            .map(|()| signer)
        });
        match outcome {
            Ok(signer) => {
                return Ok(Accepted {
                    statement: None,
                    signer,
                });
            }
            Err(e) => push_reason(&mut reasons, e),
        }
    }
    Err(join_reasons(Sought::Signatures, &reasons))
}

fn evaluate_attestations(
    plan: &Plan,
    digest: &str,
    envelopes: &[Envelope],
    wanted: &str,
) -> Result<Accepted, Rejection> {
    let candidates: Vec<&Envelope> = envelopes
        .iter()
        .filter(|e| !matches!(e, Envelope::SimpleSigning(_)))
        .collect();
    if candidates.is_empty() {
        return Err(Rejection::NoAttestations);
    }
    let mut reasons = Vec::new();
    let mut found_types = Vec::new();
    for env in candidates {
        match verify_envelope(plan, digest, env) {
            Ok((Content::Statement(st), signer)) => {
                let t = predicate_type_of(&st).to_owned();
                if t == wanted {
                    return Ok(Accepted {
                        statement: Some(st),
                        signer,
                    });
                }
                if t != COSIGN_SIGN_PREDICATE && !found_types.contains(&t) {
                    found_types.push(t);
                }
            }
            Ok((Content::Simple(_), _)) => push_reason(
                &mut reasons,
                Rejection::Content("not an attestation".into()),
            ),
            Err(e) => push_reason(&mut reasons, e),
        }
    }
    if reasons.is_empty() || !found_types.is_empty() {
        return Err(Rejection::PredicateNotFound {
            wanted: wanted.to_owned(),
            found: found_types.join(", "),
        });
    }
    Err(join_reasons(Sought::Attestations, &reasons))
}

fn push_reason(reasons: &mut Vec<Rejection>, reason: Rejection) {
    if !reasons.contains(&reason) {
        reasons.push(reason);
    }
}

fn join_reasons(sought: Sought, reasons: &[Rejection]) -> Rejection {
    Rejection::NoneMatched {
        sought,
        reasons: reasons.iter().take(MAX_REASONS).cloned().collect(),
        left_out: reasons.len().saturating_sub(MAX_REASONS),
    }
}

fn predicate_type_of(statement: &Value) -> &str {
    statement
        .get("predicateType")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Cryptographic and trust verification of one envelope: what it carried and who signed it.
fn verify_envelope(
    plan: &Plan,
    digest: &str,
    env: &Envelope,
) -> Result<(Content, Signer), Rejection> {
    match (&plan.authority, plan.ignore_tlog) {
        (Authority::Key(key) | Authority::Certificate(key), true) => {
            verify_offline(key, digest, env).map(|c| (c, signer::of_key(key, None)))
        }
        _ => verify_with_sigstore(plan, digest, env),
    }
}

/// Key or certificate attestor with `insecureIgnoreTlog`: the signature alone, no Sigstore
/// trust material (Kyverno's air-gap mode).
fn verify_offline(key: &PublicKey, digest: &str, env: &Envelope) -> Result<Content, Rejection> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let check = |data: &[u8], sig: &[u8]| {
        let sig = SignatureBytes::new(sig.to_vec());
        let mut last = None;
        for scheme in &key.schemes {
            match sigstore_verify::crypto::verify_signature(&key.der, data, &sig, *scheme) {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(Rejection::InvalidSignature(match last {
            Some(e) => e.to_string(),
            None => "the key has no signing scheme".to_owned(),
        }))
    };
    match env {
        Envelope::SimpleSigning(l) => {
            let sig = l.signature.as_deref().ok_or(Rejection::Malformed(
                "signature layer has no signature annotation".into(),
            ))?;
            let sig = b64.decode(sig.trim()).map_err(|e| {
                Rejection::Malformed(format!("malformed signature annotation: {e}"))
            })?;
            check(&l.blob, &sig)?;
            Ok(Content::Simple(l.blob.clone()))
        }
        Envelope::Dsse(l) => {
            let raw: RawDsse = parse_signed_json(&l.blob, "DSSE envelope")?;
            let payload = b64
                .decode(raw.payload.as_bytes())
                .map_err(|e| Rejection::Malformed(format!("malformed DSSE payload: {e}")))?;
            let pae = sigstore_verify::types::dsse::pae(&raw.payload_type, &payload);
            let any = raw.signatures.iter().any(|s| {
                b64.decode(s.sig.as_bytes())
                    .is_ok_and(|sig| check(&pae, &sig).is_ok())
            });
            if !any {
                return Err(Rejection::InvalidSignature(
                    "no DSSE signature verifies with the key".into(),
                ));
            }
            statement_content(&raw.payload_type, &payload, digest)
        }
        Envelope::Bundle(_) => {
            // Without the log, a dsse/0.0.2 entry is no evidence: it is left unread.
            let (bundle, _) = env
                .to_bundle(true)?
                .ok_or(Rejection::Content("empty bundle".into()))?;
            match &bundle.content {
                SignatureContent::DsseEnvelope(d) => {
                    check(&d.pae(), d.signature.sig.as_bytes())?;
                    statement_content(&d.payload_type, d.payload.as_bytes(), digest)
                }
                _ => Err(Rejection::Content(
                    "bundle does not carry a DSSE envelope over the image".into(),
                )),
            }
        }
    }
}

/// Everything else goes through sigstore-verify on a bundle (legacy layers are rewritten).
fn verify_with_sigstore(
    plan: &Plan,
    digest: &str,
    env: &Envelope,
) -> Result<(Content, Signer), Rejection> {
    let verifier = plan
        .verifier
        .as_ref()
        .ok_or(Rejection::Content("attestor has no trust material".into()))?;
    if let (Envelope::SimpleSigning(l) | Envelope::Dsse(l), Some(root)) = (env, &plan.trusted_root)
        && crate::legacy_tlog::is_legacy_entry(l)
    {
        // With insecureIgnoreTlog the entry is not evidence: the keyless layer is judged as if
        // it had none.
        if let (Authority::Keyless(rules), true) = (&plan.authority, plan.ignore_tlog) {
            return verify_keyless_offline(plan, rules, digest, env);
        }
        let (key, signer) = crate::legacy_tlog::signer(plan, root, env)?;
        return verify_offline(&key, digest, env).map(|c| (c, signer));
    }
    let use_key = !matches!(plan.authority, Authority::Keyless(_));
    let Some((bundle, dsse_v002)) = env.to_bundle(use_key)? else {
        if let (Authority::Keyless(rules), true) = (&plan.authority, plan.ignore_tlog) {
            return verify_keyless_offline(plan, rules, digest, env);
        }
        return Err(Rejection::Tlog(
            "signature has no transparency log entry".into(),
        ));
    };
    let image_hash = image_digest(digest)?;
    let entry = dsse_v002.as_ref();
    let result = match (&plan.authority, &bundle.content, env) {
        (_, SignatureContent::MessageSignature(_), Envelope::SimpleSigning(l)) => {
            run(plan, verifier, &l.blob[..], &bundle, entry)?
        }
        (_, SignatureContent::DsseEnvelope(_), _) => {
            run(plan, verifier, image_hash, &bundle, entry)?
        }
        _ => {
            return Err(Rejection::Content(
                "bundle does not sign this image (message signature over a blob)".into(),
            ));
        }
    };
    let log_index = evidence_log_index(plan, &bundle, entry);
    let signer = match &plan.authority {
        Authority::Keyless(rules) => {
            let info = result.certificate().cloned().ok_or(Rejection::Malformed(
                "keyless signature has no certificate".into(),
            ))?;
            rules.check(&info)?;
            signer::of_certificate(&info, log_index)
        }
        Authority::Key(key) | Authority::Certificate(key) => signer::of_key(key, log_index),
        Authority::Notary(_) => {
            return Err(Rejection::Attestor("not a cosign attestor".into()));
        }
    };
    let content = match &bundle.content {
        SignatureContent::DsseEnvelope(d) => {
            statement_content(&d.payload_type, d.payload.as_bytes(), digest)
        }
        _ => match env {
            Envelope::SimpleSigning(l) => Ok(Content::Simple(l.blob.clone())),
            _ => Err(Rejection::Content("unexpected bundle content".into())),
        },
    }?;
    Ok((content, signer))
}

/// Keyless with `insecureIgnoreTlog` and a legacy layer without a Rekor entry: the layer's
/// certificate must chain to the trust root now and name an accepted identity; its key then
/// verifies the signature.
fn verify_keyless_offline(
    plan: &Plan,
    rules: &KeylessRules,
    digest: &str,
    env: &Envelope,
) -> Result<(Content, Signer), Rejection> {
    let (Envelope::SimpleSigning(l) | Envelope::Dsse(l)) = env else {
        return Err(Rejection::Tlog(
            "bundle has no transparency log entry".into(),
        ));
    };
    let cert = l.certificate.as_deref().ok_or(Rejection::Malformed(
        "keyless signature has no certificate".into(),
    ))?;
    let leaf = parse_certificates(cert, ANNOTATION_CERTIFICATE)?
        .into_iter()
        .next()
        .ok_or(Rejection::Malformed(
            "keyless signature has no certificate".into(),
        ))?;
    let chain = match &l.chain {
        Some(c) => parse_certificates(c, ANNOTATION_CHAIN)?,
        None => Vec::new(),
    };
    let now = ivory_clock::unix_seconds();
    crate::chain::verify_to_anchors(&leaf, &chain, &plan.ca_certs, now)?;
    let info = sigstore_verify::crypto::parse_certificate_info(&leaf).map_err(|e| {
        Rejection::Certificate(format!("signing certificate cannot be parsed: {e}"))
    })?;
    rules.check(&info)?;
    let signer = signer::of_certificate(&info, None);
    let key = PublicKey::with_default_scheme(info.public_key, info.key_algorithm);
    verify_offline(&key, digest, env).map(|c| (c, signer))
}

/// Runs sigstore-verify; returns the verified signing certificate for keyless.
///
/// sigstore-tsa 0.15.1 cannot decode an RFC 3161 `genTime` with fractional seconds (which RFC
/// 3161 allows and e.g. @sigstore/mock's TSA emits). When such a token rides along with a Rekor
/// v1 entry whose SET/inclusion proof is verified anyway, the entry alone establishes the
/// signing time, so verification is retried without the undecodable timestamps. Without a
/// checked log entry there is no retry: the timestamp was the only time evidence. Which
/// timestamps are undecodable is read from the tokens themselves (`gen_time`), never from the
/// error's text.
fn run<'a>(
    plan: &Plan,
    verifier: &sigstore_verify::Verifier,
    artifact: impl Into<sigstore_verify::types::Artifact<'a>> + Clone,
    bundle: &Bundle,
    dsse_v002: Option<&crate::rekor_v2_dsse::Entry>,
) -> Result<VerificationResult, Rejection> {
    run_with_entry(plan, bundle, dsse_v002, |bundle, policy| {
        verifier.verify(artifact.clone(), bundle, policy)
    })
}

/// The log index a verified bundle's evidence names: its first log entry's, else the Rekor v2
/// `dsse/0.0.2` entry's; none with `insecureIgnoreTlog`, where the entry was not checked and so
/// is no evidence either.
pub(crate) fn evidence_log_index(
    plan: &Plan,
    bundle: &Bundle,
    dsse_v002: Option<&crate::rekor_v2_dsse::Entry>,
) -> Option<u64> {
    if plan.ignore_tlog {
        return None;
    }
    bundle
        .verification_material
        .tlog_entries
        .first()
        .map(|e| e.log_index.get())
        .or(dsse_v002.map(crate::rekor_v2_dsse::Entry::log_index))
}

/// [`run_with_log`] for a bundle read by [`Envelope::to_bundle`]: with a Rekor v2
/// `dsse/0.0.2` entry (taken out of `bundle`), ivory checks the entry and its log
/// ([`crate::rekor_v2_dsse`]) and sigstore-verify everything else, its log step skipped. With
/// `insecureIgnoreTlog` the entry is no evidence and is not looked at.
pub(crate) fn run_with_entry(
    plan: &Plan,
    bundle: &Bundle,
    dsse_v002: Option<&crate::rekor_v2_dsse::Entry>,
    check: impl Fn(&Bundle, &dyn Policy) -> Result<VerificationResult, sigstore_verify::Error>,
) -> Result<VerificationResult, Rejection> {
    use crate::rekor_v2_dsse::{Verifier, check_entry, check_log};
    let Some(entry) = dsse_v002.filter(|_| !plan.ignore_tlog) else {
        return run_with_log(plan, bundle, LogCheck::Sigstore, check);
    };
    let root = plan.trusted_root.as_deref().ok_or(Rejection::Attestor(
        "attestor has no trust root for the dsse/0.0.2 log entry".into(),
    ))?;
    let verifier = match &plan.authority {
        Authority::Keyless(_) => Verifier::Certificate(
            bundle
                .signing_certificate()
                .ok_or(Rejection::Malformed(
                    "keyless signature has no certificate".into(),
                ))?
                .as_bytes(),
        ),
        Authority::Key(key) | Authority::Certificate(key) => Verifier::Key(&key.der),
        Authority::Notary(_) => return Err(Rejection::Attestor("not a cosign attestor".into())),
    };
    if !crate::trust::knows_tlog(root, &entry.log_key_id) {
        return Err(crate::trust::unknown_log(
            "transparency log",
            &entry.log_key_id,
            &plan.trust_described,
        ));
    }
    check_entry(entry, bundle, &verifier)?;
    let result = run_with_log(plan, bundle, LogCheck::Ivory, check)?;
    check_log(entry, root, result.verified_timestamps())?;
    Ok(result)
}

/// Every log entry of `bundle` is from a log the attestor's trust root lists: an entry from a
/// log it does not know (a new shard, a rotated key the root has not caught up with) is denied
/// naming the log and the root, before sigstore-verify's bare failure.
fn known_logs(plan: &Plan, bundle: &Bundle) -> Result<(), Rejection> {
    let Some(root) = plan.trusted_root.as_deref() else {
        return Ok(());
    };
    for entry in &bundle.verification_material.tlog_entries {
        let id = entry.log_id.key_id.as_bytes();
        if !crate::trust::knows_tlog(root, id) {
            return Err(crate::trust::unknown_log(
                "transparency log",
                id,
                &plan.trust_described,
            ));
        }
    }
    Ok(())
}

/// Who checks the bundle's log entry.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LogCheck {
    /// sigstore-verify, unless the attestor ignores the log.
    Sigstore,
    /// ivory, for an entry kind sigstore-verify does not read (taken out of the bundle).
    Ivory,
}

/// [`run`] over any way of reading the artifact: `check` verifies the artifact against a
/// bundle under a policy (a file is read again for the retry); `log` says who checks the
/// bundle's log entry.
fn run_with_log(
    plan: &Plan,
    bundle: &Bundle,
    log: LogCheck,
    check: impl Fn(&Bundle, &dyn Policy) -> Result<VerificationResult, sigstore_verify::Error>,
) -> Result<VerificationResult, Rejection> {
    let distinct = with_distinct_timestamp_certificates(bundle);
    let bundle = distinct.as_ref().unwrap_or(bundle);
    let skip_log = plan.ignore_tlog || log == LogCheck::Ivory;
    if !skip_log {
        known_logs(plan, bundle)?;
    }
    match run_once(plan, bundle, skip_log, &check) {
        Err(e @ sigstore_verify::Error::Timestamp(TimestampError::Invalid(_)))
            if !skip_log && has_promised_entry(bundle) =>
        {
            match without_fractional_timestamps(bundle) {
                Some(without) => run_once(plan, &without, skip_log, &check).map_err(describe),
                None => Err(describe(e)),
            }
        }
        other => other.map_err(describe),
    }
}

/// `bundle` with each RFC 3161 timestamp's certificates once (OpenSSL's TSA repeats its own, as
/// sigstore-go reads them: `timestamp_token`); `None` when no token repeats one.
fn with_distinct_timestamp_certificates(bundle: &Bundle) -> Option<Bundle> {
    let timestamps = &bundle
        .verification_material
        .timestamp_verification_data
        .rfc3161_timestamps;
    let mut changed = false;
    let distinct: Vec<Rfc3161Timestamp> = timestamps
        .iter()
        .map(|t| {
            match crate::timestamp_token::without_repeated_certificates(
                t.signed_timestamp.as_bytes(),
            ) {
                Some(token) => {
                    changed = true;
                    Rfc3161Timestamp::new(TimestampToken::new(token))
                }
                None => t.clone(),
            }
        })
        .collect();
    if !changed {
        return None;
    }
    let mut with = bundle.clone();
    with.verification_material.timestamp_verification_data =
        TimestampVerificationData::new(distinct);
    Some(with)
}

/// `bundle` without its RFC 3161 timestamps whose `genTime` has fractional seconds; `None`
/// when it has none (nothing to retry without).
fn without_fractional_timestamps(bundle: &Bundle) -> Option<Bundle> {
    let timestamps = &bundle
        .verification_material
        .timestamp_verification_data
        .rfc3161_timestamps;
    let decodable: Vec<_> = timestamps
        .iter()
        .filter(|t| !gen_time::has_fractional_gen_time(t.signed_timestamp.as_bytes()))
        .cloned()
        .collect();
    if decodable.len() == timestamps.len() {
        return None;
    }
    let mut without = bundle.clone();
    without.verification_material.timestamp_verification_data =
        TimestampVerificationData::new(decodable);
    Some(without)
}

/// A Rekor v1 entry with an inclusion promise: it carries its own verified integrated time.
fn has_promised_entry(bundle: &Bundle) -> bool {
    bundle
        .verification_material
        .tlog_entries
        .iter()
        .any(|e| e.inclusion_promise.is_some() && e.integrated_time.is_some())
}

/// The plan's authority as a sigstore-verify policy (its log step skipped when `skip_log`),
/// then `check`.
fn run_once(
    plan: &Plan,
    bundle: &Bundle,
    skip_log: bool,
    check: &impl Fn(&Bundle, &dyn Policy) -> Result<VerificationResult, sigstore_verify::Error>,
) -> Result<VerificationResult, sigstore_verify::Error> {
    match &plan.authority {
        Authority::Key(key) | Authority::Certificate(key) => {
            let mut policy = PublicKeyVerificationPolicy::new(key.der.clone());
            if skip_log {
                policy = policy.skip_tlog_unsafe();
            }
            check(bundle, &policy)
        }
        Authority::Notary(_) => Err(sigstore_verify::Error::SignatureInvalid(
            "not a cosign attestor".into(),
        )),
        Authority::Keyless(_) => {
            let mut policy = VerificationPolicy::any_identity();
            if plan.ignore_sct {
                policy = policy.skip_sct();
            }
            if skip_log {
                policy = policy.skip_tlog_unsafe();
            }
            check(bundle, &policy)
        }
    }
}

pub(crate) fn describe(e: sigstore_verify::Error) -> Rejection {
    use sigstore_verify::Error as E;
    match e {
        E::TransparencyLog(_) | E::Timestamp(_) | E::Bundle(_) => Rejection::Tlog(e.to_string()),
        E::Certificate(_) => Rejection::Certificate(e.to_string()),
        E::SignatureInvalid(_) => Rejection::InvalidSignature(e.to_string()),
        E::InvalidBundle(_) | E::UnsupportedBundle(_) => Rejection::Malformed(e.to_string()),
        other => Rejection::Content(other.to_string()),
    }
}

fn image_digest(digest: &str) -> Result<Sha256Hash, Rejection> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| Rejection::Content(format!("image digest {digest} is not sha256")))?;
    Sha256Hash::from_hex(hex)
        .map_err(|e| Rejection::Content(format!("image digest {digest} is malformed: {e}")))
}

/// Decodes a DSSE payload as an in-toto statement bound to `digest`.
fn statement_content(
    payload_type: &str,
    payload: &[u8],
    digest: &str,
) -> Result<Content, Rejection> {
    if payload_type != IN_TOTO_PAYLOAD_TYPE {
        return Err(Rejection::Content(format!(
            "DSSE payload type {payload_type} is not in-toto"
        )));
    }
    let st: Value = parse_signed_json(payload, "in-toto statement")?;
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
        return Err(Rejection::Content(format!(
            "in-toto statement subject does not name {digest}"
        )));
    }
    Ok(Content::Statement(st))
}

/// The simple-signing payload must name this digest and carry the attestor's annotations.
fn check_simple_signing(plan: &Plan, digest: &str, payload: &[u8]) -> Result<(), Rejection> {
    let ss: SimpleSigning = parse_signed_json(payload, "simple-signing payload")?;
    let signed = &ss.critical.image.docker_manifest_digest;
    if signed != digest {
        return Err(Rejection::Content(format!(
            "signature is for digest {signed}, not {digest}"
        )));
    }
    check_annotations(plan, ss.optional.as_ref())
}

/// cosign v3 bundles carry no simple-signing `optional` map; annotations can only be satisfied
/// when the attestor asks for none or the predicate carries them.
fn check_bundle_annotations(plan: &Plan, statement: &Value) -> Result<(), Rejection> {
    let map = statement.get("predicate").and_then(Value::as_object);
    check_annotations(plan, map)
}

fn check_annotations(
    plan: &Plan,
    optional: Option<&serde_json::Map<String, Value>>,
) -> Result<(), Rejection> {
    for (k, v) in &plan.annotations {
        let got = optional.and_then(|m| m.get(k));
        let matches = match got {
            Some(Value::String(s)) => s == v,
            Some(other) => other.to_string().as_str() == v.as_str(),
            None => false,
        };
        if !matches {
            return Err(Rejection::Content(format!(
                "annotation {k}={v} is not in the signature payload"
            )));
        }
    }
    Ok(())
}

mod gen_time;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod balloon_tests;

#[cfg(test)]
mod openssl_tsa_tests;

#[cfg(test)]
mod rekor_v2_dsse_tests;
