//! ivory-cel: the CEL dialect of Kyverno ImageValidatingPolicy on top of the `cel` crate.
//!
//! * [`compile`] parses an expression, runs the static checks cel-rust lacks (undeclared
//!   identifiers, unknown functions) and records which `variables.NAME` it reads.
//! * [`Program::evaluate`] runs it against an [`Activation`] (per-request bindings + [`Host`]).
//! * The library (k8s + Kyverno functions) is built once per process.

mod activation;
mod check;
mod convert;
mod error;
pub mod image;
mod library;

use std::collections::BTreeSet;
use std::sync::Arc;

pub use activation::{Activation, Host, NoHost};
pub use cel::Value;
pub use convert::{json_to_value, value_to_json};
pub use error::{CompileError, EvalError};

/// Longest accepted expression source; policies are small, this bounds parser work.
pub const MAX_SOURCE_LEN: usize = 100_000;

/// Declared top-level variable names an expression may reference.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    names: BTreeSet<String>,
}

impl Scope {
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        Self {
            names: names.into_iter().map(Into::into).collect(),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }
}

/// Parses `source` and checks identifiers and function names against `scope` and the library.
pub fn compile(source: &str, scope: &Scope) -> Result<Program, CompileError> {
    if source.len() > MAX_SOURCE_LEN {
        return Err(CompileError::TooLong {
            len: source.len(),
            max: MAX_SOURCE_LEN,
        });
    }
    let lib = library::get();
    let mut expr = lib
        .parser()
        .parse(source)
        .map_err(|e| CompileError::Parse(e.to_string()))?;
    let analysis = check::analyze(&mut expr, scope, lib)?;
    Ok(Program {
        inner: Arc::new(Inner {
            source: source.to_owned(),
            expr,
            variable_refs: analysis.variable_refs,
            dynamic_variables: analysis.dynamic_variables,
            functions: analysis.functions,
        }),
    })
}

/// A compiled expression; cheap to clone and shareable across threads.
#[derive(Clone, Debug)]
pub struct Program {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    source: String,
    expr: cel::IdedExpr,
    variable_refs: Vec<String>,
    dynamic_variables: bool,
    functions: BTreeSet<String>,
}

impl Program {
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    pub fn evaluate(&self, act: &Activation<'_>) -> Result<Value, EvalError> {
        activation::evaluate(&self.inner.expr, act)
    }

    pub fn evaluate_bool(&self, act: &Activation<'_>) -> Result<bool, EvalError> {
        match self.evaluate(act)? {
            Value::Bool(b) => Ok(b),
            other => Err(EvalError::unexpected("bool", &other)),
        }
    }

    pub fn evaluate_string(&self, act: &Activation<'_>) -> Result<String, EvalError> {
        match self.evaluate(act)? {
            Value::String(s) => Ok(s.as_str().to_owned()),
            other => Err(EvalError::unexpected("string", &other)),
        }
    }

    /// `null` (and an empty optional) evaluate to `None`.
    pub fn evaluate_optional_string(
        &self,
        act: &Activation<'_>,
    ) -> Result<Option<String>, EvalError> {
        match convert::unwrap_optional(self.evaluate(act)?) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str().to_owned())),
            Some(other) => Err(EvalError::unexpected("string or null", &other)),
        }
    }

    pub fn evaluate_json(&self, act: &Activation<'_>) -> Result<serde_json::Value, EvalError> {
        value_to_json(&self.evaluate(act)?)
    }

    /// Names read as `variables.NAME`, `variables[?]"NAME"]` or `has(variables.NAME)`, in
    /// first-use order, deduplicated.
    pub fn variable_refs(&self) -> &[String] {
        &self.inner.variable_refs
    }

    /// True when `variables` is used in a way whose keys cannot be known statically
    /// (e.g. `variables[expr]` or passing `variables` itself); then bind every variable.
    pub fn uses_variables_dynamically(&self) -> bool {
        self.inner.dynamic_variables
    }

    /// Whether the expression calls function `name` (global, member or namespaced name).
    pub fn calls_function(&self, name: &str) -> bool {
        self.inner.functions.contains(name)
    }
}

#[cfg(test)]
mod tests;
