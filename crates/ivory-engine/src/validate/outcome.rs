//! What a policy that was judged (or could not be) comes to: its result, whether `required`
//! applies, and what its failurePolicy made of a failure to judge it.

use ivory_policy::compiled::CompiledPolicy;
use ivory_policy::types::FailurePolicy;

use super::{EVAL_FAILED, result};
use crate::decision::{PolicyResult, Status};
use crate::verifier::VerifyError;

/// One policy's result plus what `required` and the response need.
#[derive(Clone, Debug)]
pub(super) struct Evaluated {
    pub(super) result: PolicyResult,
    /// `validationConfigurations.required` of a policy that reached evaluation.
    pub(super) required: bool,
    /// What was skipped under `failurePolicy: Ignore`, and why (warnings and audit annotation).
    pub(super) skipped: Vec<String>,
    /// A failurePolicy was applied because the time budget ran out.
    pub(super) budget_exhausted: bool,
}

impl Evaluated {
    /// A result decided before evaluation (never subject to `required`).
    pub(super) fn decided(result: PolicyResult) -> Self {
        Self {
            result,
            required: false,
            skipped: Vec::new(),
            budget_exhausted: false,
        }
    }
}

/// A policy an expression of which needed an answer the time budget did not allow: the
/// policy's failurePolicy decides.
pub(super) fn unverifiable(
    policy: &CompiledPolicy,
    err: &VerifyError,
    images: Vec<String>,
) -> Evaluated {
    let outcome = FailureOutcome {
        message: err.to_string(),
        skipped: "verification skipped",
        budget_exhausted: true,
    };
    outcome.apply(policy, images)
}

/// A policy an expression of which read cluster data that is not available (a watch not
/// synced, over its bounds, not allowed): like an unreachable registry under a spent budget,
/// it follows the policy's failurePolicy, and is never judged on an empty answer.
pub(super) fn cluster_unavailable(
    policy: &CompiledPolicy,
    err: &crate::resources::ResourceError,
    images: Vec<String>,
) -> Evaluated {
    let outcome = FailureOutcome {
        message: format!("{EVAL_FAILED}: cluster data unavailable: {err}"),
        skipped: "evaluation skipped",
        budget_exhausted: false,
    };
    outcome.apply(policy, images)
}

/// A policy whose CEL was stopped by the cost limits or the request deadline: like a spent
/// verification budget, it follows the policy's failurePolicy.
pub(super) fn over_budget(policy: &CompiledPolicy, why: &str, images: Vec<String>) -> Evaluated {
    let outcome = FailureOutcome {
        message: format!("{EVAL_FAILED}: {why}"),
        skipped: "evaluation skipped",
        budget_exhausted: false,
    };
    outcome.apply(policy, images)
}

/// A policy that could not be judged, decided by its failurePolicy: Fail is an error result,
/// Ignore a skip whose reason becomes a warning and an audit annotation.
struct FailureOutcome {
    message: String,
    /// What the Ignore warning says was skipped.
    skipped: &'static str,
    /// Whether the request's time budget ran out (the deadline metric).
    budget_exhausted: bool,
}

impl FailureOutcome {
    fn apply(self, policy: &CompiledPolicy, images: Vec<String>) -> Evaluated {
        match policy.failure_policy {
            FailurePolicy::Fail => Evaluated {
                budget_exhausted: self.budget_exhausted,
                ..Evaluated::decided(result(policy, Status::Error, self.message, images))
            },
            FailurePolicy::Ignore => {
                let why = format!("{}: {} (failurePolicy Ignore)", self.skipped, self.message);
                Evaluated {
                    result: result(policy, Status::Skip, why.clone(), images),
                    required: false,
                    skipped: vec![why],
                    budget_exhausted: self.budget_exhausted,
                }
            }
        }
    }
}
