//! The validating stage (Kyverno 1.19 `HandleValidating`, single phase): match, extract and
//! filter images, prefetch every verification the policies' CEL can ask for about the images
//! each policy selects (concurrently, under the request deadline) and the digests `verifyDigest`
//! needs, decide `verifyDigest`, evaluate the validations synchronously against those answers,
//! enforce `required` across all policies, then apply Deny/Warn/Audit.
//!
//! A prefetched answer that is an error only matters to an expression that reads it: the
//! verification host records it when asked, and only then does the failurePolicy (for a spent
//! budget) or a policy error follow.
//!
//! Annotations on the object are never evidence: verification always happens here.

mod context;
mod evaluate;
mod host;
mod plan;
mod prefetch;
mod response;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

use ivory_policy::compiled::CompiledPolicy;
use ivory_policy::types::ValidationAction;
use serde_json::Value;
use tokio::time::Instant;

use self::evaluate::Evaluated;
use self::host::Evidence;
use self::plan::{Prepared, RequestInputs};
use self::prefetch::{JobSet, Prefetched};
use crate::admission::AdmissionRequest;
use crate::bindings::RequestBindings;
use crate::decision::{Decision, PolicyResult, Status};
use crate::images;
use crate::verifier::ImageVerifier;

pub use self::response::{MAX_VERIFIED_ANNOTATION_BYTES, SKIPPED_ANNOTATION, VERIFIED_ANNOTATION};

/// Prefix of every evaluation error, as Kyverno words it.
const EVAL_FAILED: &str = "failed to evaluate policy";

/// Validates one AdmissionRequest against `policies` (already selected for its route). Never
/// fails: errors become policy results, and the policies' actions and failure policies decide.
/// Returns by `deadline` (plus CPU-bound CEL evaluation).
pub async fn validate(
    verifier: &dyn ImageVerifier,
    policies: &[&CompiledPolicy],
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
    deadline: Instant,
) -> Decision {
    let started = Instant::now();
    let data = RequestBindings::new(req, req.subject(), namespace_object).with_deadline(deadline);
    let builtin = images::builtin_images(req);
    let inputs = RequestInputs {
        req,
        namespace_object,
        data: &data,
        builtin: &builtin,
    };
    let mut jobs = JobSet::default();
    let prepared: Vec<Prepared<'_>> = policies
        .iter()
        .map(|policy| plan::prepare(policy, &inputs, &mut jobs))
        .collect();
    let prefetched = if jobs.is_empty() {
        Prefetched::default()
    } else {
        let count = jobs.len();
        let prefetched = prefetch::run(verifier, jobs, started, deadline).await;
        tracing::debug!(calls = count, elapsed = ?started.elapsed(), "verification prefetch done");
        prefetched
    };

    let evidence = Evidence::default();
    let mut evaluated = Vec::with_capacity(prepared.len());
    for prepared in prepared {
        match prepared {
            Prepared::NotMatched => {}
            Prepared::Done(result) => evaluated.push(Evaluated::decided(result)),
            Prepared::Evaluated(done) => evaluated.push(done),
            Prepared::Ready(plan) => {
                evaluated.push(evaluate::run(*plan, &prefetched, &evidence));
            }
        }
    }
    response::enforce_required(&mut evaluated, &evidence);
    let mut decision = response::decide(evaluated);
    if decision.allowed
        && let Some(value) = response::verified_annotation(evidence.verified())
    {
        decision
            .audit_annotations
            .insert(VERIFIED_ANNOTATION.to_owned(), value);
    }
    decision
}

/// A result of `policy` with its actions filled in.
fn result(
    policy: &CompiledPolicy,
    status: Status,
    message: String,
    images: Vec<String>,
) -> PolicyResult {
    PolicyResult {
        policy: policy.name.clone(),
        namespace: policy.namespace.clone(),
        status,
        message,
        properties: Default::default(),
        images,
        deny: policy.actions.contains(&ValidationAction::Deny),
        warn: policy.actions.contains(&ValidationAction::Warn),
        audit: policy.actions.contains(&ValidationAction::Audit),
    }
}
