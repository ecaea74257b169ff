//! Error types of the crate.

use cel::Value;
use thiserror::Error;

/// Failure to compile an expression.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CompileError {
    /// Syntax error text from the parser.
    #[error("{0}")]
    Parse(String),
    /// A variable the policy's environment does not declare (checked before evaluation, as
    /// Kubernetes' type checker does).
    #[error("undeclared reference '{0}'")]
    UndeclaredReference(String),
    /// A function that is neither standard CEL nor in ivory's library.
    #[error("undeclared reference to function '{0}'")]
    UnknownFunction(String),
    /// Nesting deeper than the parser's recursion limit (the depth is the limit).
    #[error("expression nested too deeply (max depth {0})")]
    TooDeep(usize),
    /// The CEL parser failed in a way that is not the expression's fault.
    #[error("internal compiler error: {0}")]
    Internal(String),
    /// The expression text is longer than Kubernetes accepts.
    #[error("expression too long: {len} bytes (max {max})")]
    TooLong {
        /// Length of the expression in bytes.
        len: usize,
        /// The largest accepted length.
        max: usize,
    },
    /// The worst-case cost on the largest accepted request is over the static limit.
    #[error(
        "CEL expression `{expression}` is too costly: its estimated worst-case cost {estimated} \
         exceeds the limit of {limit} (a comprehension over request data nested in another?)"
    )]
    TooCostly {
        /// The estimated worst-case cost.
        estimated: u64,
        /// The static cost limit it exceeds.
        limit: u64,
        /// The expression's text.
        expression: String,
    },
}

/// Failure to evaluate an expression.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EvalError {
    /// A CEL runtime error (no such key, no matching overload, function error, ...).
    #[error("{0}")]
    Runtime(String),
    /// The result has the wrong type for the caller.
    #[error("expected {expected}, got {got}")]
    UnexpectedType {
        /// The CEL type the caller needs.
        expected: &'static str,
        /// The type the expression produced.
        got: String,
    },
    /// A value that has no JSON representation.
    #[error("cannot convert {0} to JSON")]
    NotJson(String),
    /// The evaluation spent its cost limit or budget, or outlived its deadline.
    #[error("CEL cost budget exceeded in `{expression}`: {reason}")]
    CostExceeded {
        /// The expression's text.
        expression: String,
        /// Which limit ran out.
        reason: String,
    },
}

impl EvalError {
    pub(crate) fn unexpected(expected: &'static str, got: &Value) -> Self {
        EvalError::UnexpectedType {
            expected,
            got: crate::library::type_name(got),
        }
    }
}

impl From<cel::ExecutionError> for EvalError {
    fn from(e: cel::ExecutionError) -> Self {
        EvalError::Runtime(e.to_string())
    }
}

/// Why a [`Host`](crate::Host) function could not answer. Its text is what the expression sees
/// (CEL's `Error executing function '<name>': <text>`), so it keeps Kyverno's wording; its
/// variant says what kind of failure it is.
///
/// The interpreter carries only the text of an error, and an operator (`||`, `.orValue`) may
/// absorb it, so a host that decides something from its failures (the engine applies the
/// failurePolicy when the budget ran out) records them itself when it returns them.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HostError {
    /// A definite "not verified" where the function needs a verified answer, e.g. the payload
    /// of an attestation that no attestor verified. A verdict, not a failure to reach one.
    #[error("{0}")]
    NotVerified(String),
    /// The registry could not give the answer: unreachable or failing, the image missing, or
    /// an answer ivory refuses to use.
    #[error("{0}")]
    Registry(String),
    /// The request's time budget ran out before the answer arrived: the policy's failurePolicy
    /// decides, not this error.
    #[error("{0}")]
    BudgetExhausted(String),
    /// A question the host does not answer: an attestor or attestation the policy does not
    /// declare, an image it does not select, an attestor kind the attestation cannot use.
    #[error("{0}")]
    InvalidArgument(String),
    /// Cluster data the expression reads (`resource.*`, `globalContext.*`) is not available:
    /// its watch has not synced, is over its bounds, is not allowed, or nothing serves cluster
    /// data here. Never answered as an empty result.
    #[error("{0}")]
    ClusterData(String),
    /// No host in this context (matchConditions, image extraction, policy loading): the
    /// verification functions cannot be answered there.
    #[error("not available in this context")]
    NotAvailable,
}
