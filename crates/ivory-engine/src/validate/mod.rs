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

mod calls;
mod context;
mod evaluate;
mod facts;
mod host;
mod late;
mod memo;
mod outcome;
mod plan;
mod prefetch;
mod response;
mod reuse;

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use ivory_policy::compiled::CompiledPolicy;
use ivory_policy::types::ValidationAction;
use serde_json::Value;
use tokio::time::Instant;

use self::evaluate::Run;
use self::host::Evidence;
use self::outcome::Evaluated;
use self::plan::{Plan, Prepared, RequestInputs};
use self::prefetch::{JobSet, Prefetched};
use crate::admission::AdmissionRequest;
use crate::bindings::RequestBindings;
use crate::decision::{Decision, PolicyResult, Status};
use crate::images;
use crate::resources::ResourceSource;
use crate::resources::host::ClusterHost;
use crate::verifier::ImageVerifier;

pub use self::memo::DecisionMemo;
pub use self::response::{MAX_VERIFIED_ANNOTATION_BYTES, SKIPPED_ANNOTATION, VERIFIED_ANNOTATION};

/// Prefix of every evaluation error, as Kyverno words it.
const EVAL_FAILED: &str = "failed to evaluate policy";

/// Validates one AdmissionRequest against `policies` (already selected for its route), with
/// the cluster objects the policies' `resource.*` and `globalContext.*` calls read answered
/// from `resources` (a watch cache, files, or [`NoResources`](crate::resources::NoResources)).
/// Never fails: errors become policy results, and the policies' actions and failure policies
/// decide. Returns by `deadline` (plus CPU-bound CEL evaluation).
pub async fn validate(
    verifier: &dyn ImageVerifier,
    resources: &dyn ResourceSource,
    policies: &[&CompiledPolicy],
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
    deadline: Instant,
) -> Decision {
    let decision = validate_memoized(
        verifier,
        resources,
        policies,
        req,
        namespace_object,
        deadline,
        None,
    )
    .await;
    Arc::unwrap_or_clone(decision)
}

/// [`validate`], reusing the results `memo` kept of policies that read only their images and
/// verification answers, and keeping new ones ([`DecisionMemo`]). The decision is shared: a
/// route's decision reused from the memo is the kept one itself, not a copy.
pub async fn validate_memoized(
    verifier: &dyn ImageVerifier,
    resources: &dyn ResourceSource,
    policies: &[&CompiledPolicy],
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
    deadline: Instant,
    memo: Option<&DecisionMemo>,
) -> Arc<Decision> {
    let started = ivory_clock::now();
    let route = memo.and_then(|memo| {
        let key = memo.routes().key(policies, req, namespace_object)?;
        Some((memo, key))
    });
    if let Some((memo, key)) = &route
        && let Some(decision) = memo.routes().reuse(key, verifier)
    {
        return decision;
    }
    let builtin = Arc::new(images::builtin_images(req));
    let data = RequestBindings::new(req, req.subject(), namespace_object).with_deadline(deadline);
    let inputs = RequestInputs {
        req,
        namespace_object,
        data: &data,
        builtin: &builtin,
    };
    let mut jobs = JobSet::default();
    let cluster: Vec<ClusterHost<'_>> = policies
        .iter()
        .map(|policy| ClusterHost::new(resources, policy))
        .collect();
    let prepared: Vec<Prepared<'_>> = policies
        .iter()
        .zip(&cluster)
        .map(|(policy, cluster)| plan::prepare(policy, cluster, &inputs, &mut jobs))
        .collect();
    let prefetched = if jobs.is_empty() {
        Prefetched::default()
    } else {
        let count = jobs.len();
        let prefetched = prefetch::run(verifier, &jobs, started, deadline).await;
        tracing::debug!(calls = count, elapsed = ?started.elapsed(), "verification prefetch done");
        prefetched
    };

    let evidence = Evidence::default();
    let mut evaluated: Vec<Option<Evaluated>> = Vec::with_capacity(prepared.len());
    let mut pending: Vec<(usize, Box<Plan<'_>>)> = Vec::new();
    // Whether the decision may be kept for the route: only when no policy was shaped by the
    // budget, the deadline or an error, and each policy's result could have been memoized.
    let mut keepable = route.is_some();
    for prepared in prepared {
        match prepared {
            Prepared::NotMatched => {}
            Prepared::Done(result) => evaluated.push(Some(Evaluated::decided(result))),
            Prepared::Evaluated(done) => {
                keepable = false;
                evaluated.push(Some(done));
            }
            Prepared::Ready(plan) => {
                pending.push((evaluated.len(), plan));
                evaluated.push(None);
            }
        }
    }
    // Each policy is evaluated; one that asked for image data nothing fetched yet (an image it
    // does not select, a literal) is evaluated again once that data is fetched, a bounded
    // number of times. Only the final evaluation's evidence counts.
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..=late::MAX_ROUNDS {
        let mut wants = Vec::new();
        for (position, mut plan) in std::mem::take(&mut pending) {
            // Past the deadline too: the fetch then answers "budget spent" at once, and the
            // failurePolicy decides for an expression that needed it.
            let can_ask = round < late::MAX_ROUNDS && plan.can_evaluate_again();
            let memoizable = memo.and_then(|_| memo::memoizable(&plan));
            keepable &= memoizable.is_some();
            if let (Some(memo), Some(key)) = (memo, &memoizable)
                && let Some((done, recorded)) = memo.get(key, &plan, &prefetched)
            {
                evidence.merge(recorded);
                if let Some(slot) = evaluated.get_mut(position) {
                    *slot = Some(done);
                }
                continue;
            }
            // A policy that may be evaluated again records into evidence of its own, kept
            // only from its final evaluation; one whose result may be kept too (the memo keeps
            // what it recorded); any other records directly.
            let scratch = Evidence::default();
            let records = if can_ask || memoizable.is_some() {
                &scratch
            } else {
                &evidence
            };
            match evaluate::run(&mut plan, &prefetched, records, can_ask) {
                Run::Done(done) => {
                    keepable &= memo::decided(&done);
                    if let (Some(memo), Some(key)) = (memo, memoizable) {
                        memo.put(key, &plan, &prefetched, &done, &scratch);
                    }
                    evidence.merge(scratch);
                    if let Some(slot) = evaluated.get_mut(position) {
                        *slot = Some(done);
                    }
                }
                Run::Wants(images) => wants.push((position, plan, images)),
            }
        }
        if wants.is_empty() {
            break;
        }
        keepable = false;
        let mut asks: Vec<_> = wants
            .iter_mut()
            .map(|(_, plan, images)| (&mut **plan, std::mem::take(images)))
            .collect();
        late::fetch(verifier, &mut asks, &mut seen, started, deadline).await;
        pending = wants
            .into_iter()
            .map(|(position, plan, _)| (position, plan))
            .collect();
    }
    let mut evaluated: Vec<Evaluated> = evaluated.into_iter().flatten().collect();
    response::enforce_required(&mut evaluated, &evidence);
    let mut decision = response::decide(evaluated);
    decision.warnings.extend(evidence.unknown_log_warnings());
    if decision.allowed
        && let Some(value) = response::verified_annotation(evidence.verified())
    {
        decision
            .audit_annotations
            .insert(VERIFIED_ANNOTATION.to_owned(), value);
    }
    let decision = Arc::new(decision);
    if let (Some((memo, key)), true) = (route, keepable) {
        memo.routes()
            .keep(key, verifier, &jobs, &prefetched, &decision);
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
