//! The mutating stage: pin matched images to digests (`docs/kyverno-semantics.md` §3). No
//! signature is verified here; the validating stage sees the pinned images.
//!
//! Differences from Kyverno, on purpose:
//! * Digests are resolved concurrently, once per distinct (image, credentials) pair, and every
//!   lookup is bounded by the request deadline.
//! * Budget exhaustion ([`VerifyError::DeadlineExceeded`], or the deadline passing while
//!   waiting) applies the policy's `failurePolicy` instead of leaking past the API server's
//!   timeout: `Fail` denies naming the image, registry and budget; `Ignore` admits the image
//!   unpinned with a warning and the audit annotation [`AUDIT_UNPINNED_IMAGES`].
//! * Image volumes (`spec.volumes[].image.reference`) are pinned like containers, except on a
//!   Pod UPDATE, where the API server keeps them immutable (they were pinned at creation).
//! * On the `pods/ephemeralcontainers` subresource only ephemeral containers are pinned: the API
//!   server drops every other change made through it.
//! * Images are matched under their canonical spellings as well as as written (see
//!   [`matches_image`]).
//! * An ivory extension chooses where pins go ([`Pinning`]): everywhere (Kyverno), in Pods
//!   only (controllers' templates stay as applied, so GitOps tools see no drift), or nowhere
//!   (the validating stage verifies the digest the tag names at admission).

use std::collections::{BTreeMap, BTreeSet};

use futures::future::join_all;
use ivory_cel::image::{ImageRefError, ImageReference, Reason};
use ivory_policy::compiled::{
    CompiledPolicy, NAMESPACE_PINNING_ANNOTATION, NAMESPACE_PINNING_LABEL, Pinning,
};
use ivory_policy::types::{Credentials, FailurePolicy, ValidationAction};
use serde_json::Value;
use tokio::time::Instant;

use crate::admission::{AdmissionRequest, Operation};
use crate::decision::{Decision, PatchOp, PolicyResult, Status};
use crate::images::{IMAGE_VOLUMES, ImageAt, image_pointers, matches_image};
use crate::matching::{matches_conditions_with, matches_constraints};
use crate::resources::ResourceSource;
use crate::resources::host::ClusterHost;
use crate::verifier::{ImageVerifier, VerifyError};

/// Audit annotation listing images admitted without a digest because the time budget ran out
/// under `failurePolicy: Ignore`. The API server prefixes audit annotation keys with the webhook
/// name (`<webhook>/unpinned-images`), so the key itself must not contain a `/`.
pub const AUDIT_UNPINNED_IMAGES: &str = "unpinned-images";

/// The subresource `kubectl debug` writes ephemeral containers through.
const EPHEMERAL_CONTAINERS_SUBRESOURCE: &str = "ephemeralcontainers";
/// The image-map key of ephemeral containers.
const EPHEMERAL_CONTAINERS: &str = "ephemeralContainers";

/// Operation reported in synthesized deadline errors.
const RESOLVE_OPERATION: &str = "resolving the image digest";

/// Pins matched images of `req` to digests for `policies` (already selected for the route),
/// with the cluster reads of the policies' matchConditions answered from `resources` (as the
/// validating stage answers them).
///
/// Never returns later than `deadline` plus local bookkeeping: every registry lookup is wrapped
/// in `tokio::time::timeout_at(deadline, …)`.
pub async fn mutate(
    verifier: &dyn ImageVerifier,
    resources: &dyn ResourceSource,
    policies: &[&CompiledPolicy],
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
    deadline: Instant,
) -> Decision {
    let allow = Decision {
        allowed: true,
        ..Decision::default()
    };
    // Kyverno's mutate route only handles CREATE, UPDATE and CONNECT; DELETE passes untouched.
    if !matches!(
        req.operation,
        Operation::Create | Operation::Update | Operation::Connect
    ) {
        return allow;
    }
    let Some(object) = req.object.as_ref() else {
        return allow;
    };
    let kind = object.kind().unwrap_or(&req.kind.kind);
    let pointers = pinnable(image_pointers(object, kind), req, kind);

    let plans: Vec<Plan<'_>> = policies
        .iter()
        .filter(|p| p.mutate_digest)
        .filter_map(|p| {
            let cluster = ClusterHost::new(resources, p);
            plan(
                p,
                req,
                (namespace_object, &cluster),
                kind,
                &pointers,
                deadline,
            )
        })
        .collect();
    let lookups = distinct_lookups(&plans);
    let started = ivory_clock::now();
    let resolved = join_all(lookups.iter().map(|(reference, credentials)| {
        resolve(verifier, reference, *credentials, deadline, started)
    }))
    .await;
    let mut decision = decide(&plans, &lookups, &resolved);
    // Said on every request it could have mattered to, so a namespace owner who set it sees
    // why the Pod was pinned anyway. Most namespaces carry no such label: nothing to look at.
    let Some(value) = Pinning::namespace_label(namespace_object) else {
        return decision;
    };
    let ignoring: BTreeSet<&str> = plans
        .iter()
        .map(|plan| plan.policy)
        .filter(|p| p.ignored_namespace_pinning(namespace_object).is_some())
        .map(|p| p.name.as_str())
        .collect();
    if !ignoring.is_empty() {
        let names: Vec<&str> = ignoring.into_iter().collect();
        decision.warnings.push(format!(
            "namespace label {NAMESPACE_PINNING_LABEL}={value} is ignored by policy {}: a namespace may choose pods-only, and no-patch only where the policy allows it ({NAMESPACE_PINNING_ANNOTATION}: any)",
            names.join(", ")
        ));
    }
    decision
}

/// The pointers a patch may change: the API server refuses or drops changes to the others.
fn pinnable(pointers: Vec<ImageAt>, req: &AdmissionRequest, kind: &str) -> Vec<ImageAt> {
    let ephemeral_only = req.sub_resource() == EPHEMERAL_CONTAINERS_SUBRESOURCE;
    let volumes_immutable = kind == "Pod" && req.operation == Operation::Update;
    pointers
        .into_iter()
        .filter(|at| !ephemeral_only || at.field == EPHEMERAL_CONTAINERS)
        .filter(|at| !(volumes_immutable && at.field == IMAGE_VOLUMES))
        .collect()
}

/// One image a policy wants pinned.
struct Target {
    pointer: String,
    /// Parsed from Kyverno's normalized form (`docker.io/nginx:latest`).
    reference: ImageReference,
    normalized: String,
}

/// What one matching policy wants, or why it could not be evaluated.
struct Plan<'p> {
    policy: &'p CompiledPolicy,
    targets: Vec<Target>,
    error: Option<String>,
    /// `(image, reason)` of images that cannot be parsed, so cannot be pinned or matched on
    /// their canonical form: a policy error under `failurePolicy: Fail` (Kyverno fails the
    /// whole extraction on them), a warning under `Ignore`; never a silent allow.
    malformed: Vec<(String, Reason)>,
}

/// `None` when the policy does not apply to the request, or pins nothing in an object of
/// `kind` in its [`Pinning`] mode for this namespace.
fn plan<'p>(
    policy: &'p CompiledPolicy,
    req: &AdmissionRequest,
    (namespace_object, cluster): (Option<&Value>, &ClusterHost<'_>),
    kind: &str,
    pointers: &[ImageAt],
    deadline: Instant,
) -> Option<Plan<'p>> {
    let failed = |error: String| {
        Some(Plan {
            policy,
            targets: Vec::new(),
            error: Some(error),
            malformed: Vec::new(),
        })
    };
    match matches_constraints(policy, req, namespace_object) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => return failed(format!("failed to execute matching: {e}")),
    }
    match matches_conditions_with(policy, req, namespace_object, deadline, cluster) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => return failed(format!("failed to evaluate match conditions: {e}")),
    }
    if !policy.pinning_for(namespace_object).pins(kind) {
        return None;
    }
    let mut targets = Vec::new();
    let mut malformed = Vec::new();
    for at in pointers {
        let (reference, normalized) = match normalize(&at.image) {
            Ok(parsed) => parsed,
            Err(e) => {
                malformed.push((at.image.clone(), e.reason));
                continue;
            }
        };
        if reference.digest().is_some() {
            continue;
        }
        match matches_image(policy, &at.image) {
            Ok(true) => targets.push(Target {
                pointer: at.pointer.clone(),
                reference,
                normalized,
            }),
            Ok(false) => {}
            Err(e) => return failed(format!("failed to update digest: {e}")),
        }
    }
    Some(Plan {
        policy,
        targets,
        error: None,
        malformed,
    })
}

/// Kyverno's `GetImageInfo().String()` for `image`, parsed back.
fn normalize(image: &str) -> Result<(ImageReference, String), ImageRefError> {
    let normalized = ImageReference::parse(image)?.kyverno_normalized();
    let reference = ImageReference::parse(&normalized)?;
    Ok((reference, normalized))
}

/// Kyverno's extraction error for an image it cannot parse.
fn invalid_image(image: &str, reason: &Reason) -> String {
    format!("invalid image '{image}' ({reason})")
}

/// One tag to resolve: the normalized reference (parsed once, when the plan was made) and the
/// credentials to ask with.
type Lookup<'p> = (ImageReference, Option<&'p Credentials>);

fn distinct_lookups<'p>(plans: &[Plan<'p>]) -> Vec<Lookup<'p>> {
    let mut lookups: Vec<Lookup<'p>> = Vec::new();
    for plan in plans {
        let credentials = plan.policy.credentials();
        for t in &plan.targets {
            if !lookups
                .iter()
                .any(|(r, c)| r.original() == t.normalized && *c == credentials)
            {
                lookups.push((t.reference.clone(), credentials));
            }
        }
    }
    lookups
}

fn lookup_index(
    lookups: &[Lookup<'_>],
    image: &str,
    credentials: Option<&Credentials>,
) -> Option<usize> {
    lookups
        .iter()
        .position(|(r, c)| r.original() == image && *c == credentials)
}

async fn resolve(
    verifier: &dyn ImageVerifier,
    image: &ImageReference,
    credentials: Option<&Credentials>,
    deadline: Instant,
    started: Instant,
) -> Result<String, VerifyError> {
    let outcome = tokio::time::timeout_at(
        deadline,
        verifier.resolve_digest(image, credentials, deadline),
    )
    .await;
    let digest = match outcome {
        Ok(result) => result?,
        Err(_elapsed) => {
            let budget = deadline.saturating_duration_since(started);
            return Err(VerifyError::deadline_exceeded(
                image,
                RESOLVE_OPERATION,
                budget,
            ));
        }
    };
    if is_digest(&digest) {
        Ok(digest)
    } else {
        Err(VerifyError::Unavailable {
            image: image.original().to_owned(),
            registry: image.registry().to_owned(),
            message: format!("registry returned an invalid digest {digest:?}"),
        })
    }
}

/// `algorithm:hex` with a lowercase-alphanumeric algorithm and a non-empty hex part, so a bad
/// answer can never produce a broken image string in the patch.
fn is_digest(s: &str) -> bool {
    s.split_once(':').is_some_and(|(alg, hex)| {
        !alg.is_empty()
            && alg.bytes().all(|b| {
                b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'+'
                    || b == b'.'
                    || b == b'_'
                    || b == b'-'
            })
            && hex.len() >= 32
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// What happened to one policy.
#[derive(Default)]
struct Outcome {
    /// Errors that count as a policy error under Kyverno rules (actions decide).
    errors: Vec<String>,
    /// Budget exhaustion under `failurePolicy: Fail` (always denies).
    budget_failures: Vec<String>,
    /// Budget exhaustion under `failurePolicy: Ignore`: (image, reason).
    unpinned: Vec<(String, String)>,
    patch: Vec<PatchOp>,
}

fn decide(
    plans: &[Plan<'_>],
    lookups: &[Lookup<'_>],
    resolved: &[Result<String, VerifyError>],
) -> Decision {
    let mut decision = Decision {
        allowed: true,
        ..Decision::default()
    };
    let mut denials = Vec::new();
    let mut patch: Vec<PatchOp> = Vec::new();
    let mut unpinned_images = BTreeSet::new();
    for plan in plans {
        let policy = plan.policy;
        let outcome = evaluate_plan(plan, lookups, resolved);
        decision.budget_exhausted |=
            !outcome.budget_failures.is_empty() || !outcome.unpinned.is_empty();
        let deny = policy.actions.contains(&ValidationAction::Deny);
        let warn = policy.actions.contains(&ValidationAction::Warn);
        let mut message = String::new();
        if !outcome.errors.is_empty() || !outcome.budget_failures.is_empty() {
            let all: Vec<&str> = outcome
                .errors
                .iter()
                .chain(&outcome.budget_failures)
                .map(String::as_str)
                .collect();
            message = all.join("; ");
            let line = format!("Policy {} error: {message}", policy.name);
            if (deny && !outcome.errors.is_empty()) || !outcome.budget_failures.is_empty() {
                denials.push(line.clone());
            }
            if warn {
                decision.warnings.push(line);
            }
        }
        for (image, reason) in &outcome.unpinned {
            decision.warnings.push(format!(
                "Policy {}: image {image} admitted without a pinned digest (failurePolicy Ignore): {reason}",
                policy.name
            ));
            unpinned_images.insert(image.clone());
        }
        for op in outcome.patch {
            if !patch.iter().any(|p| p.path == op.path) {
                patch.push(op);
            }
        }
        let errored = !message.is_empty() || !outcome.unpinned.is_empty();
        if message.is_empty() {
            let reasons: Vec<&str> = outcome.unpinned.iter().map(|(_, r)| r.as_str()).collect();
            message = reasons.join("; ");
        }
        decision.results.push(result_for(plan, errored, message));
    }
    if !unpinned_images.is_empty() {
        decision.audit_annotations.insert(
            AUDIT_UNPINNED_IMAGES.to_owned(),
            unpinned_images.into_iter().collect::<Vec<_>>().join(","),
        );
    }
    if denials.is_empty() {
        decision.patch = patch;
    } else {
        decision.allowed = false;
        decision.message = Some(denials.join("; "));
    }
    decision
}

fn result_for(plan: &Plan<'_>, errored: bool, message: String) -> PolicyResult {
    let policy = plan.policy;
    PolicyResult {
        policy: policy.name.clone(),
        namespace: policy.namespace.clone(),
        status: if errored { Status::Error } else { Status::Pass },
        message,
        properties: BTreeMap::new(),
        images: plan.targets.iter().map(|t| t.normalized.clone()).collect(),
        deny: policy.actions.contains(&ValidationAction::Deny),
        warn: policy.actions.contains(&ValidationAction::Warn),
        audit: policy.actions.contains(&ValidationAction::Audit),
    }
}

fn evaluate_plan(
    plan: &Plan<'_>,
    lookups: &[Lookup<'_>],
    resolved: &[Result<String, VerifyError>],
) -> Outcome {
    let mut outcome = Outcome::default();
    if let Some(error) = &plan.error {
        outcome.errors.push(error.clone());
        return outcome;
    }
    if !plan.malformed.is_empty() {
        match plan.policy.failure_policy {
            FailurePolicy::Fail => {
                let all: Vec<String> = plan
                    .malformed
                    .iter()
                    .map(|(image, reason)| invalid_image(image, reason))
                    .collect();
                outcome
                    .errors
                    .push(format!("failed to update digest: {}", all.join("; ")));
            }
            FailurePolicy::Ignore => {
                for (image, reason) in &plan.malformed {
                    let why = format!("failed to update digest: {}", invalid_image(image, reason));
                    outcome.unpinned.push((image.clone(), why));
                }
            }
        }
    }
    let credentials = plan.policy.credentials();
    let mut digest_errors = Vec::new();
    let mut budget_errors = Vec::new();
    for t in &plan.targets {
        let result =
            lookup_index(lookups, &t.normalized, credentials).and_then(|i| resolved.get(i));
        match result {
            Some(Ok(digest)) => outcome.patch.push(PatchOp {
                path: t.pointer.clone(),
                value: t.reference.with_digest(digest),
            }),
            Some(Err(e)) if e.is_deadline() => match plan.policy.failure_policy {
                FailurePolicy::Fail => budget_errors.push(resolve_failure(&t.normalized, e)),
                FailurePolicy::Ignore => {
                    outcome.unpinned.push((t.normalized.clone(), e.to_string()))
                }
            },
            Some(Err(e)) => digest_errors.push(resolve_failure(&t.normalized, e)),
            // Every target was registered as a lookup; this is unreachable but must not panic.
            None => digest_errors.push(format!(
                "failed to resolve digest for image {}: no lookup was made",
                t.normalized
            )),
        }
    }
    if !digest_errors.is_empty() {
        outcome.errors.push(format!(
            "failed to update digest: {}",
            digest_errors.join("; ")
        ));
    }
    if !budget_errors.is_empty() {
        outcome.budget_failures.push(format!(
            "failed to update digest: {}",
            budget_errors.join("; ")
        ));
    }
    outcome
}

fn resolve_failure(image: &str, e: &VerifyError) -> String {
    format!("failed to resolve digest for image {image}: {}", e.reason())
}

#[cfg(test)]
mod tests;
