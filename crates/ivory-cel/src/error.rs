//! Error types of the crate.

use cel::Value;
use thiserror::Error;

/// Failure to compile an expression.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CompileError {
    /// Syntax error text from the parser.
    #[error("{0}")]
    Parse(String),
    #[error("undeclared reference '{0}'")]
    UndeclaredReference(String),
    #[error("undeclared reference to function '{0}'")]
    UnknownFunction(String),
    #[error("expression nested too deeply (max depth {0})")]
    TooDeep(usize),
    #[error("internal compiler error: {0}")]
    Internal(String),
    #[error("expression too long: {len} bytes (max {max})")]
    TooLong { len: usize, max: usize },
    /// The worst-case cost on the largest accepted request is over the static limit.
    #[error(
        "CEL expression `{expression}` is too costly: its estimated worst-case cost {estimated} \
         exceeds the limit of {limit} (a comprehension over request data nested in another?)"
    )]
    TooCostly {
        estimated: u64,
        limit: u64,
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
    UnexpectedType { expected: &'static str, got: String },
    /// A value that has no JSON representation.
    #[error("cannot convert {0} to JSON")]
    NotJson(String),
    /// The evaluation spent its cost limit or budget, or outlived its deadline.
    #[error("CEL cost budget exceeded in `{expression}`: {reason}")]
    CostExceeded { expression: String, reason: String },
}

impl EvalError {
    pub(crate) fn unexpected(expected: &'static str, got: &Value) -> Self {
        EvalError::UnexpectedType {
            expected,
            got: crate::convert::type_name(got),
        }
    }
}

impl From<cel::ExecutionError> for EvalError {
    fn from(e: cel::ExecutionError) -> Self {
        EvalError::Runtime(e.to_string())
    }
}
