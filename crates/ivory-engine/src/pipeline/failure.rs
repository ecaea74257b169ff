//! The answers the pipeline gives when the selected policies could not be evaluated: the
//! engine overran the backstop, panicked, or a policy's credentials cannot be used. Each
//! follows the policies' failurePolicy.

use std::time::Duration;

use ivory_policy::compiled::CompiledPolicy;
use ivory_policy::types::FailurePolicy;

use crate::decision::Decision;
use crate::validate::SKIPPED_ANNOTATION;

/// The answer when the engine has not returned by the backstop.
pub(super) fn backstop_decision(selected: &[&CompiledPolicy], budget: Duration) -> Decision {
    let message = format!(
        "ivory: time budget of {}ms exhausted before policies {} finished",
        budget.as_millis(),
        policy_names(selected)
    );
    failure_decision(selected, message, true)
}

/// The answer when evaluating the policies panicked (a panic is not a spent budget).
pub(super) fn panic_decision(selected: &[&CompiledPolicy]) -> Decision {
    let message = format!(
        "ivory: internal error evaluating policy {}",
        policy_names(selected)
    );
    failure_decision(selected, message, false)
}

/// The selected policies' names, each once, comma-separated.
fn policy_names(selected: &[&CompiledPolicy]) -> String {
    let mut names: Vec<&str> = selected.iter().map(|p| p.name.as_str()).collect();
    names.dedup();
    names.join(", ")
}

/// The answer when the policies could not be evaluated: a denial with `message` when any of
/// them is `failurePolicy: Fail`, else an allowance carrying `message` as a warning and as
/// the skipped-policies audit annotation. `budget_exhausted` says whether the time budget ran
/// out (the deadline metric), as opposed to a panic.
fn failure_decision(
    selected: &[&CompiledPolicy],
    message: String,
    budget_exhausted: bool,
) -> Decision {
    if selected
        .iter()
        .any(|p| p.failure_policy == FailurePolicy::Fail)
    {
        Decision {
            allowed: false,
            message: Some(message),
            budget_exhausted,
            ..Decision::default()
        }
    } else {
        let mut d = Decision {
            allowed: true,
            warnings: vec![message.clone()],
            budget_exhausted,
            ..Decision::default()
        };
        d.audit_annotations
            .insert(SKIPPED_ANNOTATION.to_owned(), message);
        d
    }
}

/// A policy whose credentials cannot be used, and why (the text names the policy and field).
pub(super) type Unusable<'p> = (&'p CompiledPolicy, String);

/// A denial when any policy with unusable credentials has `failurePolicy: Fail`; `None` when
/// all of them are `Ignore` (their reasons become warnings of the engine's answer).
pub(super) fn credentials_verdict(unusable: &[Unusable<'_>]) -> Option<Decision> {
    let failing: Vec<&str> = unusable
        .iter()
        .filter(|(p, _)| p.failure_policy == FailurePolicy::Fail)
        .map(|(_, why)| why.as_str())
        .collect();
    (!failing.is_empty()).then(|| Decision {
        allowed: false,
        message: Some(failing.join("; ")),
        ..Decision::default()
    })
}
