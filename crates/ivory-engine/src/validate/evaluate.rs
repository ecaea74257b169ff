//! Evaluation of one prepared policy against the prefetched answers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use ivory_policy::compiled::{CompiledPolicy, CompiledValidation};
use ivory_policy::types::FailurePolicy;

use super::context::Evaluator;
use super::host::{Evidence, PolicyHost};
use super::outcome::{Evaluated, cluster_unavailable, over_budget, unverifiable};
use super::plan::Plan;
use super::prefetch::{Outcome, Prefetched};
use super::{EVAL_FAILED, result};
use crate::decision::Status;
use crate::verifier::ErrorKind;

/// What one evaluation of a prepared policy came to.
pub(super) enum Run {
    /// The policy's result.
    Done(Evaluated),
    /// Its expressions asked for the image data of these images, which nothing fetched yet
    /// (images the policy does not select, literals): fetch them and evaluate it again.
    Wants(BTreeSet<String>),
}

/// Evaluates `plan` against the answers fetched so far. With `can_ask`, an evaluation that
/// asked for image data nothing fetched yet is given up for [`Run::Wants`]; its evidence is
/// the caller's to drop (evaluated again, the policy records it anew).
pub(super) fn run(
    plan: &mut Plan<'_>,
    prefetched: &Prefetched,
    evidence: &Evidence,
    can_ask: bool,
) -> Run {
    let digest = match check_digests(plan.policy, &plan.undigested, prefetched, &plan.matched) {
        Ok(notes) => notes,
        Err(decided) => return Run::Done(*decided),
    };
    let policy = plan.policy;
    let Some(eval) = plan.evaluator() else {
        let message = format!("{EVAL_FAILED}: evaluated twice without the means to");
        return Run::Done(Evaluated::decided(result(
            policy,
            Status::Error,
            message,
            plan.matched.clone(),
        )));
    };
    let facts = std::sync::Arc::clone(&plan.facts);
    let matches = |image: &str| facts.matches_image(policy, image).unwrap_or(false);
    let host = PolicyHost {
        policy,
        matches: &matches,
        notary_attestors: &plan.notary_attestors,
        prefetched,
        keys: &plan.keys,
        image_data: &plan.image_data,
        late_image_data: &plan.late_image_data,
        evidence,
        payloads: Mutex::new(BTreeMap::new()),
        unanswered: Mutex::new(Vec::new()),
        assumed: Mutex::new(None),
        wanted: Mutex::new(BTreeSet::new()),
        cluster: Some(plan.cluster),
    };
    let mut eval = eval.with_host(&host);
    // Evaluated for the last time, the plan gives its images up to the result.
    let matched = if can_ask {
        plan.matched.clone()
    } else {
        std::mem::take(&mut plan.matched)
    };
    let evaluated = judge(policy, &mut eval, &host, matched, digest);
    let wanted = host.take_wanted();
    if can_ask && !wanted.is_empty() && eval.over_budget().is_none() {
        return Run::Wants(wanted);
    }
    Run::Done(evaluated)
}

/// The validations, in order, then the audit annotations.
fn judge(
    policy: &CompiledPolicy,
    eval: &mut Evaluator<'_>,
    host: &PolicyHost<'_>,
    matched: Vec<String>,
    digest: DigestNotes,
) -> Evaluated {
    let mut status = Status::Pass;
    let mut message = String::new();
    // An expression that needed an answer the budget did not allow: the failurePolicy applies,
    // unless a later validation fails outright (a definite denial always wins).
    let mut budget_miss = None;
    for (index, validation) in policy.validations.iter().enumerate() {
        match eval.bool(&validation.expression) {
            Ok(true) => {}
            Ok(false) => {
                status = Status::Fail;
                message = failure_message(eval, validation, index);
                budget_miss = None;
                break;
            }
            Err(e) => {
                if let Some(why) = eval.over_budget() {
                    return over_budget(policy, why, matched);
                }
                // Evaluated again with fresh variables, so that exactly the answers this
                // validation reads are recorded (memoized variables would hide them).
                let mark = host.mark();
                let cluster_mark = plan_cluster_mark(host);
                eval.forget_variables();
                let _ = eval.bool(&validation.expression);
                if let Some(err) = host.cluster.and_then(|c| c.failure_since(cluster_mark)) {
                    return cluster_unavailable(policy, &err, matched);
                }
                let message = match host.deciding_error_since(mark) {
                    Some(_) if fails_whatever_is_missing(eval, host, validation) => {
                        status = Status::Fail;
                        message = failure_message(eval, validation, index);
                        budget_miss = None;
                        break;
                    }
                    Some(err) if err.is_deadline() => {
                        budget_miss.get_or_insert(err);
                        continue;
                    }
                    // The verifier's own words, not CEL's wrapping of them.
                    Some(err) => format!("{EVAL_FAILED}: {err}"),
                    None => format!("{EVAL_FAILED}: {e}"),
                };
                return Evaluated::decided(result(policy, Status::Error, message, matched));
            }
        }
    }
    if let Some(err) = budget_miss {
        let mut evaluated = unverifiable(policy, &err, matched);
        evaluated.skipped.splice(0..0, digest.skipped);
        return evaluated;
    }
    let mut result = result(policy, status, message, matched);
    result.properties = audit_annotations(policy, eval);
    Evaluated {
        result,
        required: policy.required,
        skipped: digest.skipped,
        budget_exhausted: digest.budget_exhausted,
    }
}

/// True when `validation` is false both with every verification the budget did not allow
/// counted as verified and with every one counted as not verified: the missing answers
/// cannot change that it fails, so it is a definite failure rather than a budget miss. (The
/// converse is never concluded: an expression true under both is still a budget miss.)
fn fails_whatever_is_missing(
    eval: &mut Evaluator<'_>,
    host: &PolicyHost<'_>,
    validation: &CompiledValidation,
) -> bool {
    let fails = [false, true].into_iter().all(|verified| {
        host.assume_missing(Some(verified));
        eval.forget_variables();
        matches!(eval.bool(&validation.expression), Ok(false))
    });
    host.assume_missing(None);
    eval.forget_variables();
    fails
}

/// What `verifyDigest` let through under `failurePolicy: Ignore`.
#[derive(Default)]
struct DigestNotes {
    skipped: Vec<String>,
    budget_exhausted: bool,
}

/// `verifyDigest` on the matched images that carry a tag only. The registry was asked for each
/// tag: if it answered, the image simply was not pinned and the policy fails. If it could not
/// answer (budget or availability), the mutating stage could not have pinned it either: the
/// failurePolicy decides (Fail denies naming the registry; Ignore lets this check pass with a
/// warning, and the image's verifications still decide the rest). A missing or malformed
/// answer is never an availability problem: it denies.
fn check_digests(
    policy: &CompiledPolicy,
    undigested: &[(String, usize)],
    prefetched: &Prefetched,
    matched: &[String],
) -> Result<DigestNotes, Box<Evaluated>> {
    let decided = |status: Status, message: String| {
        Err(Box::new(Evaluated::decided(result(
            policy,
            status,
            message,
            matched.to_vec(),
        ))))
    };
    let mut unreachable = Vec::new();
    for (image, index) in undigested {
        match prefetched.outcome(*index) {
            Some(Outcome::Resolve(Err(err)))
                if matches!(err.kind(), ErrorKind::Deadline | ErrorKind::Unavailable) =>
            {
                unreachable.push((image, err));
            }
            Some(Outcome::Resolve(Err(err))) => {
                return decided(
                    Status::Fail,
                    format!(
                        "image {image} does not have a digest and its tag could not be resolved: {}",
                        err.reason()
                    ),
                );
            }
            _ => {
                return decided(
                    Status::Fail,
                    format!("image {image} does not have a digest"),
                );
            }
        }
    }
    let mut notes = DigestNotes::default();
    for (image, err) in unreachable {
        notes.budget_exhausted |= err.is_deadline();
        match policy.failure_policy {
            FailurePolicy::Fail => {
                let mut evaluated = Evaluated::decided(result(
                    policy,
                    Status::Error,
                    format!(
                        "image {image} does not have a digest and its tag could not be resolved: {}",
                        err.reason()
                    ),
                    matched.to_vec(),
                ));
                evaluated.budget_exhausted = notes.budget_exhausted;
                return Err(Box::new(evaluated));
            }
            FailurePolicy::Ignore => notes.skipped.push(format!(
                "digest check skipped for image {image}: {} (failurePolicy Ignore)",
                err.reason()
            )),
        }
    }
    Ok(notes)
}

fn plan_cluster_mark(host: &PolicyHost<'_>) -> usize {
    host.cluster.map_or(0, |c| c.mark())
}

/// `messageExpression` if it yields a non-empty string, else `message`, else Kyverno's default.
fn failure_message(
    eval: &mut Evaluator<'_>,
    validation: &CompiledValidation,
    index: usize,
) -> String {
    if let Some(program) = &validation.message_expression {
        match eval.string(program) {
            Ok(text) if !text.trim().is_empty() => return text,
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "messageExpression failed; using message"),
        }
    }
    match &validation.message {
        Some(text) if !text.is_empty() => text.clone(),
        _ => format!("CEL expression validation failed at index {index}"),
    }
}

/// Non-empty string values of `auditAnnotations`; failing or null ones are left out.
fn audit_annotations(
    policy: &CompiledPolicy,
    eval: &mut Evaluator<'_>,
) -> BTreeMap<String, String> {
    let mut properties = BTreeMap::new();
    for annotation in &policy.audit_annotations {
        match eval.optional_string(&annotation.value_expression) {
            Ok(Some(value)) if !value.is_empty() => {
                properties.insert(annotation.key.clone(), value);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(key = %annotation.key, error = %e, "auditAnnotation failed"),
        }
    }
    properties
}
