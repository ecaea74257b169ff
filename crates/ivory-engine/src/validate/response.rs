//! `required` across all policies of the request, then the Deny/Warn/Audit response.

use std::sync::Arc;

use super::host::{Evidence, ImageEvidence, VerifiedBy};
use super::outcome::Evaluated;
use crate::decision::{Decision, Status};

/// Audit annotation listing the policies whose verification or digest check was skipped under
/// `failurePolicy: Ignore` (the time budget ran out, or a tag's registry could not answer); the
/// API server prefixes it with the webhook name.
pub const SKIPPED_ANNOTATION: &str = "verification-skipped";

/// Audit annotation of an admitted request: a JSON list of what was verified, by which policy
/// and attestor, and who signed it (key fingerprint, or certificate subject and issuer, and the
/// transparency-log index). The API server records it in its audit event, prefixed with the
/// webhook name. Everything in it comes from verification, except the image as the request
/// names it (cut to 256 characters).
pub const VERIFIED_ANNOTATION: &str = "verified-images";

/// Longest annotation value; entries past it are counted in a last `{"omitted": N}` entry.
pub const MAX_VERIFIED_ANNOTATION_BYTES: usize = 8 * 1024;

/// [`VERIFIED_ANNOTATION`]'s value for `verified`, within [`MAX_VERIFIED_ANNOTATION_BYTES`];
/// `None` when nothing was verified.
pub(super) fn verified_annotation(verified: Vec<Arc<VerifiedBy>>) -> Option<String> {
    if verified.is_empty() {
        return None;
    }
    // Room kept for the closing `{"omitted":N}` entry, brackets and commas.
    let budget = MAX_VERIFIED_ANNOTATION_BYTES - 32;
    let mut out = String::with_capacity(
        MAX_VERIFIED_ANNOTATION_BYTES
            .min(verified.iter().map(|e| e.json().len() + 1).sum::<usize>() + 2),
    );
    out.push('[');
    let mut used = 2;
    let mut written = 0;
    for entry in &verified {
        let json = entry.json();
        if used + json.len() + 1 > budget {
            break;
        }
        used += json.len() + 1;
        if written > 0 {
            out.push(',');
        }
        out.push_str(json);
        written += 1;
    }
    let omitted = verified.len() - written;
    if omitted > 0 {
        if written > 0 {
            out.push(',');
        }
        out.push_str(&format!("{{\"omitted\":{omitted}}}"));
    }
    out.push(']');
    Some(out)
}

/// `docs/kyverno-semantics.md` §2 step 7: a passing policy with `required` fails unless each of its matched
/// images was verified by some policy of this request. Images are checked in sorted order so
/// that container order never changes the message.
pub(super) fn enforce_required(evaluated: &mut [Evaluated], evidence: &Evidence) {
    for item in evaluated.iter_mut() {
        if !item.required || item.result.status != Status::Pass {
            continue;
        }
        let mut images = item.result.images.clone();
        images.sort();
        for image in images {
            let message = match evidence.of(&image) {
                ImageEvidence::Verified => continue,
                ImageEvidence::Failed => {
                    format!("image {image} failed signature or attestation verification")
                }
                ImageEvidence::NeverAttempted => format!(
                    "image {image} is not verified: no policy performed a signature or attestation check on it"
                ),
            };
            item.result.status = Status::Fail;
            item.result.message = message;
            break;
        }
    }
}

/// Deny: fail/error denies (`Policy <name> failed|error: <msg>`, joined by `; `); Warn: the same
/// strings as warnings; Audit only: nothing in the response.
pub(super) fn decide(evaluated: Vec<Evaluated>) -> Decision {
    let mut decision = Decision {
        allowed: true,
        ..Decision::default()
    };
    let mut denials = Vec::new();
    let mut skipped = Vec::new();
    for item in evaluated {
        let result = &item.result;
        for why in &item.skipped {
            decision
                .warnings
                .push(format!("Policy {}: {why}", result.policy));
            skipped.push(format!("{}: {why}", result.policy));
        }
        decision.budget_exhausted |= item.budget_exhausted;
        let text = match result.status {
            Status::Fail => format!("Policy {} failed: {}", result.policy, result.message),
            Status::Error => format!("Policy {} error: {}", result.policy, result.message),
            Status::Pass | Status::Skip => String::new(),
        };
        if !text.is_empty() {
            if result.warn {
                decision.warnings.push(text.clone());
            }
            if result.deny {
                denials.push(text);
            }
        }
        decision.results.push(item.result);
    }
    if !skipped.is_empty() {
        decision
            .audit_annotations
            .insert(SKIPPED_ANNOTATION.to_owned(), skipped.join("; "));
    }
    if !denials.is_empty() {
        decision.allowed = false;
        decision.message = Some(denials.join("; "));
    }
    decision
}
