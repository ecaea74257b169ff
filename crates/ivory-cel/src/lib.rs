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
/// Image references (go-containerregistry rules), also used by the registry client.
pub use ivory_reference as image;
mod library;

use std::collections::BTreeSet;
use std::sync::Arc;

pub use activation::{Activation, Host, LazyJson, NoHost};
pub use cel::Value;
pub use convert::{json_to_value, value_to_json};
pub use error::{CompileError, EvalError};

/// Longest accepted expression source; policies are small, this bounds parser work.
pub const MAX_SOURCE_LEN: usize = 100_000;
/// Deepest accepted expression tree; bounds the interpreter's recursion at evaluation.
pub const MAX_AST_DEPTH: usize = 200;
const COMPILE_STACK_SIZE: usize = 256 * 1024 * 1024;
/// Programs up to this depth evaluate on the caller's stack (fits a 2 MiB thread stack).
const INLINE_EVAL_DEPTH: usize = 24;
const DEEP_EVAL_STACK_SIZE: usize = 128 * 1024 * 1024;

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
    // The parser recurses per nesting level before its own depth limit applies, so parse on
    // a thread with a large stack; the accepted AST depth is then bounded by the checker so
    // that evaluation fits ordinary thread stacks.
    let (expr, analysis) = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("ivory-cel-compile".into())
            .stack_size(COMPILE_STACK_SIZE)
            .spawn_scoped(s, || {
                let mut expr = lib
                    .parser()
                    .parse(source)
                    .map_err(|e| CompileError::Parse(truncate(e.to_string())))?;
                let analysis = check::analyze(&mut expr, scope, lib)?;
                Ok::<_, CompileError>((expr, analysis))
            })
            .map_err(|e| CompileError::Internal(format!("cannot start compiler thread: {e}")))?
            .join()
            .map_err(|_| CompileError::Internal("compiler thread panicked".into()))?
    })?;
    Ok(Program {
        inner: Arc::new(Inner {
            source: source.to_owned(),
            expr,
            variable_refs: analysis.variable_refs,
            dynamic_variables: analysis.dynamic_variables,
            functions: analysis.functions,
            depth: analysis.max_depth,
        }),
    })
}

/// Parse errors quote the source per error; keep messages readable for huge inputs.
fn truncate(mut msg: String) -> String {
    const MAX: usize = 2000;
    if msg.len() > MAX {
        let mut end = MAX;
        while !msg.is_char_boundary(end) {
            end -= 1;
        }
        msg.truncate(end);
        msg.push_str(" …");
    }
    msg
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
    depth: usize,
}

impl Program {
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    pub fn evaluate(&self, act: &Activation<'_>) -> Result<Value, EvalError> {
        if self.inner.depth <= INLINE_EVAL_DEPTH {
            return activation::evaluate(&self.inner.expr, act);
        }
        // The interpreter recurses per tree level with large frames (tens of KiB in debug
        // builds); run rare deep programs on a thread with a large stack.
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("ivory-cel-eval".into())
                .stack_size(DEEP_EVAL_STACK_SIZE)
                .spawn_scoped(s, || activation::evaluate(&self.inner.expr, act))
                .map_err(|e| EvalError::Runtime(format!("cannot start evaluation thread: {e}")))?
                .join()
                .map_err(|_| EvalError::Runtime("evaluation thread panicked".into()))?
        })
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

    /// Names read as `variables.NAME`, `variables["NAME"]`, `variables.?NAME`,
    /// `variables[?"NAME"]` or `has(variables.NAME)`, in first-use order, deduplicated.
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
