//! Evaluation of one prepared policy against the prefetched answers.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ivory_policy::compiled::{CompiledPolicy, CompiledValidation};
use ivory_policy::types::FailurePolicy;

use super::context::Evaluator;
use super::host::{Evidence, PolicyHost};
use super::plan::Plan;
use super::prefetch::{Prefetched, VerifyKey};
use super::{EVAL_FAILED, result};
use crate::decision::{PolicyResult, Status};
use crate::images;
use crate::verifier::VerifyError;

/// One policy's result plus what `required` and the response need.
#[derive(Debug)]
pub(super) struct Evaluated {
    pub(super) result: PolicyResult,
    /// `validationConfigurations.required` of a policy that reached evaluation.
    pub(super) required: bool,
    /// Why verification was skipped under `failurePolicy: Ignore`.
    pub(super) skipped: Option<String>,
}

impl Evaluated {
    /// A result decided before evaluation (never subject to `required`).
    pub(super) fn decided(result: PolicyResult) -> Self {
        Self {
            result,
            required: false,
            skipped: None,
        }
    }
}

pub(super) fn run(plan: Plan<'_>, prefetched: &Prefetched, evidence: &Evidence) -> Evaluated {
    let Plan {
        policy,
        eval,
        matched,
        notary_attestors,
        keys,
        image_data,
    } = plan;
    if let Some(err) = prefetch_error(&keys, &image_data, prefetched) {
        return unverifiable(policy, err, matched);
    }
    let matches = |image: &str| images::matches_image(policy, image).unwrap_or(false);
    let host = PolicyHost {
        policy,
        matches: &matches,
        notary_attestors: &notary_attestors,
        prefetched,
        keys: &keys,
        image_data: &image_data,
        evidence,
        payloads: Mutex::new(BTreeMap::new()),
    };
    let mut eval = eval.with_host(&host);

    let mut status = Status::Pass;
    let mut message = String::new();
    for (index, validation) in policy.validations.iter().enumerate() {
        match eval.bool(&validation.expression) {
            Ok(true) => {}
            Ok(false) => {
                status = Status::Fail;
                message = failure_message(&mut eval, validation, index);
                break;
            }
            Err(e) => {
                if let Some(why) = eval.over_budget() {
                    return over_budget(policy, why, matched);
                }
                let result = result(
                    policy,
                    Status::Error,
                    format!("{EVAL_FAILED}: {e}"),
                    matched,
                );
                return Evaluated::decided(result);
            }
        }
    }
    let mut result = result(policy, status, message, matched);
    result.properties = audit_annotations(policy, &mut eval);
    Evaluated {
        result,
        required: policy.required,
        skipped: None,
    }
}

/// The first error among this policy's prefetched answers; a spent budget wins over others.
fn prefetch_error<'p>(
    keys: &BTreeMap<VerifyKey, usize>,
    image_data: &BTreeMap<String, usize>,
    prefetched: &'p Prefetched,
) -> Option<&'p VerifyError> {
    let errors: Vec<&VerifyError> = keys
        .values()
        .chain(image_data.values())
        .filter_map(|&i| prefetched.outcome(i).and_then(|o| o.error()))
        .collect();
    errors
        .iter()
        .find(|e| e.is_deadline())
        .or_else(|| errors.first())
        .copied()
}

/// A policy whose verifications could not be answered. A spent budget follows the policy's
/// failurePolicy; any other failure is an evaluation error, as in Kyverno.
fn unverifiable(policy: &CompiledPolicy, err: &VerifyError, images: Vec<String>) -> Evaluated {
    if !err.is_deadline() {
        let result = result(
            policy,
            Status::Error,
            format!("{EVAL_FAILED}: {err}"),
            images,
        );
        return Evaluated::decided(result);
    }
    match policy.failure_policy {
        FailurePolicy::Fail => {
            Evaluated::decided(result(policy, Status::Error, err.to_string(), images))
        }
        FailurePolicy::Ignore => {
            let why = format!("verification skipped: {err} (failurePolicy Ignore)");
            Evaluated {
                result: result(policy, Status::Skip, why.clone(), images),
                required: false,
                skipped: Some(why),
            }
        }
    }
}

/// A policy whose CEL was stopped by the cost limits or the request deadline: like a spent
/// verification budget, it follows the policy's failurePolicy.
pub(super) fn over_budget(policy: &CompiledPolicy, why: &str, images: Vec<String>) -> Evaluated {
    let message = format!("{EVAL_FAILED}: {why}");
    match policy.failure_policy {
        FailurePolicy::Fail => Evaluated::decided(result(policy, Status::Error, message, images)),
        FailurePolicy::Ignore => {
            let why = format!("evaluation skipped: {message} (failurePolicy Ignore)");
            Evaluated {
                result: result(policy, Status::Skip, why.clone(), images),
                required: false,
                skipped: Some(why),
            }
        }
    }
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
