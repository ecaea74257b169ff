//! PolicyExceptions (`docs/kyverno-semantics.md` §9): a policy that matches a request, and
//! whose matchConditions hold, is skipped when an exception naming it has all its own
//! matchConditions true. The skip is a result (`skip`, `rule is skipped due to policy
//! exception: <ns>/<name>[, …]`, property `exceptions`), so reports show which exception
//! exempted what; in the mutating stage an excepted policy pins nothing.
//!
//! Which exceptions may name a policy ([`Exceptions::applicable`]): with an exception namespace
//! configured (Kyverno's `--exceptionNamespace`), only exceptions in it; a
//! NamespacedImageValidatingPolicy is further only exempted by exceptions in its own namespace
//! or in that configured namespace, so one tenant's exception cannot switch off another
//! namespace's policy (Kyverno matches on name and kind alone: stricter on purpose).

use std::collections::BTreeMap;
use std::sync::Arc;

use ivory_cel::{Activation, NoHost};
use ivory_policy::CompiledException;
use ivory_policy::compiled::CompiledPolicy;
use ivory_policy::types::{PolicyKind, ValidationAction};
use serde_json::Value;
use tokio::time::Instant;

use crate::admission::AdmissionRequest;
use crate::bindings::RequestBindings;
use crate::decision::{Decision, PolicyResult, Status};
use crate::matching::{matches_conditions, matches_constraints};

/// The report property naming the exceptions that exempted a policy (Kyverno's key).
pub const EXCEPTIONS_PROPERTY: &str = "exceptions";

/// The exceptions in force and where they may come from.
#[derive(Clone, Debug, Default)]
pub struct Exceptions {
    /// Every compiled PolicyException loaded (files or the watch).
    pub exceptions: Arc<Vec<Arc<CompiledException>>>,
    /// Kyverno's `--exceptionNamespace`: only exceptions in it count (`None`: every namespace).
    pub namespace: Option<String>,
}

/// The policies still to evaluate, and the results of those an exception exempted.
#[derive(Debug, Default)]
pub struct Partition<'a> {
    /// Policies no exception matched: they run.
    pub evaluate: Vec<&'a CompiledPolicy>,
    /// A `skip` result per excepted policy, with Kyverno's message.
    pub skipped: Vec<PolicyResult>,
}

impl Exceptions {
    /// The exceptions that may exempt `policy`.
    pub fn applicable<'e>(&'e self, policy: &CompiledPolicy) -> Vec<&'e CompiledException> {
        self.exceptions
            .iter()
            .map(Arc::as_ref)
            .filter(|e| e.refers_to(policy.kind, &policy.name))
            .filter(|e| !e.is_expired(ivory_clock::wall()))
            .filter(|e| self.namespace.as_ref().is_none_or(|ns| &e.namespace == ns))
            .filter(|e| match policy.kind {
                PolicyKind::ImageValidatingPolicy => true,
                PolicyKind::NamespacedImageValidatingPolicy => {
                    policy.namespace.as_ref() == Some(&e.namespace)
                        || self.namespace.as_ref() == Some(&e.namespace)
                }
            })
            .collect()
    }

    /// Splits `policies` into those to evaluate and skip results for those an exception
    /// exempts from `req`. A policy is only exempted when it applies to the request at all
    /// (matchConstraints and matchConditions); one whose matching errs is left to the stage,
    /// which reports that error. An exception whose condition cannot be evaluated makes the
    /// policy's result an error: it neither exempts silently nor is silently ignored.
    pub fn partition<'a>(
        &self,
        policies: &[&'a CompiledPolicy],
        req: &AdmissionRequest,
        namespace_object: Option<&Value>,
        deadline: Instant,
    ) -> Partition<'a> {
        let mut out = Partition::default();
        for &policy in policies {
            let candidates = self.applicable(policy);
            if candidates.is_empty() || !applies(policy, req, namespace_object, deadline) {
                out.evaluate.push(policy);
                continue;
            }
            match matching_exceptions(&candidates, req, namespace_object, deadline) {
                Ok(matched) if matched.is_empty() => out.evaluate.push(policy),
                Ok(matched) => out.skipped.push(skip_result(policy, &matched)),
                Err(e) => out
                    .skipped
                    .push(result(policy, Status::Error, e.to_string())),
            }
        }
        out
    }
}

/// Adds the results of excepted policies to a stage's `decision`: a skip is only recorded; an
/// exception that could not be evaluated denies under `Deny` (dropping any patch, as a failed
/// mutating stage does) and warns under `Warn`, worded like every policy error.
pub fn merge_into(decision: &mut Decision, results: Vec<PolicyResult>) {
    for result in results {
        if result.status == Status::Error {
            let text = format!("Policy {} error: {}", result.policy, result.message);
            if result.warn {
                decision.warnings.push(text.clone());
            }
            if result.deny {
                decision.allowed = false;
                decision.patch.clear();
                decision.message = Some(match decision.message.take() {
                    Some(previous) => format!("{previous}; {text}"),
                    None => text,
                });
            }
        }
        decision.results.push(result);
    }
}

fn applies(
    policy: &CompiledPolicy,
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
    deadline: Instant,
) -> bool {
    matches!(matches_constraints(policy, req, namespace_object), Ok(true))
        && matches!(
            matches_conditions(policy, req, namespace_object, deadline),
            Ok(true)
        )
}

/// An exception's matchCondition that could not be evaluated: the excepted policy's result
/// is an error with this text.
#[derive(Debug, thiserror::Error)]
#[error("failed to evaluate policy: exception {exception}: matchCondition {condition:?}: {source}")]
struct ExceptionError {
    /// `<namespace>/<name>` of the exception.
    exception: String,
    /// The condition's name.
    condition: String,
    source: ivory_cel::EvalError,
}

/// The exceptions whose conditions all hold, or the first evaluation error.
fn matching_exceptions<'e>(
    candidates: &[&'e CompiledException],
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
    deadline: Instant,
) -> Result<Vec<&'e CompiledException>, ExceptionError> {
    let bindings =
        RequestBindings::new(req, req.object.as_ref(), namespace_object).with_deadline(deadline);
    let mut act = Activation::new(&NoHost);
    bindings.bind(&mut act, false);
    let mut matched = Vec::new();
    'exceptions: for &exception in candidates {
        for condition in &exception.match_conditions {
            match condition.program.evaluate_bool(&act) {
                Ok(true) => {}
                Ok(false) => continue 'exceptions,
                Err(source) => {
                    return Err(ExceptionError {
                        exception: exception.key(),
                        condition: condition.name.clone(),
                        source,
                    });
                }
            }
        }
        matched.push(exception);
    }
    Ok(matched)
}

fn skip_result(policy: &CompiledPolicy, matched: &[&CompiledException]) -> PolicyResult {
    let keys: Vec<String> = matched.iter().map(|e| e.key()).collect();
    let names: Vec<&str> = matched.iter().map(|e| e.name.as_str()).collect();
    let mut skipped = result(
        policy,
        Status::Skip,
        format!(
            "rule is skipped due to policy exception: {}",
            keys.join(", ")
        ),
    );
    skipped.properties = BTreeMap::from([(EXCEPTIONS_PROPERTY.to_owned(), names.join(","))]);
    skipped
}

fn result(policy: &CompiledPolicy, status: Status, message: String) -> PolicyResult {
    PolicyResult {
        policy: policy.name.clone(),
        namespace: policy.namespace.clone(),
        status,
        message,
        properties: BTreeMap::new(),
        images: Vec::new(),
        deny: policy.actions.contains(&ValidationAction::Deny),
        warn: policy.actions.contains(&ValidationAction::Warn),
        audit: policy.actions.contains(&ValidationAction::Audit),
    }
}

#[cfg(test)]
mod tests;
