//! ivory-cel: the CEL dialect of Kyverno ImageValidatingPolicy on top of the `cel` crate. It
//! does no IO of any kind: what a function needs from outside it asks the [`Host`].
//!
//! * [`compile`] parses an expression, runs the static checks cel-rust lacks (undeclared
//!   identifiers, unknown functions: `static_check`) and records which `variables.NAME` it reads.
//!   It also instruments the expression for cost and refuses one whose worst-case cost
//!   exceeds [`STATIC_COST_LIMIT`] (see the `cost` module).
//! * [`Program::evaluate`] runs it against an [`Activation`] (per-request bindings + [`Host`]),
//!   under a per-evaluation cost limit, the activation's [`CostBudget`] and its deadline.
//! * The library (k8s + Kyverno functions) is built once per process: strings, lists, sets,
//!   regex (with a bounded cache of compiled regexes), url, quantity, ip and cidr, semver, image
//!   references ([`image`], ivory-reference's), Kyverno's verification and image-data functions,
//!   and `resource.Get`/`resource.List`/`globalContext.Get` ([`cluster_functions`]), the last two
//!   groups answered through the [`Host`]. The `resource.*` query is read in `activation`
//!   ([`ResourceQuery`]), not in the library that registers the functions.
//! * What a program asks is known before it runs: [`Program::literal_arguments`] (the string
//!   literals passed to a function, such as the image of `image.GetMetadata`) and
//!   [`Program::namespaced_calls`] (every call of a namespaced function with its literal
//!   arguments, from which ivory-policy learns what a policy reads from the cluster).
//! * A host's error ([`HostError`]) keeps its class (not verified, registry, budget exhausted,
//!   invalid argument, cluster data, not available) while its text is Kyverno's.

mod activation;
mod convert;
mod cost;
mod error;
mod static_check;
/// Image references (go-containerregistry rules), also used by the registry client.
pub use ivory_reference as image;
mod library;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use activation::{
    Activation, ConvertedJson, Host, JsonSource, LazyJson, NoHost, ResourceQuery,
};
pub use cel::Value;
pub use convert::{json_to_value, value_to_json};
pub use cost::{
    CostBudget, MAX_INPUT_BYTES, MIN_ELEMENT_BYTES, PER_EVALUATION_LIMIT, POLICY_BUDGET,
    POLICY_VALUE_BYTES, STATIC_COST_LIMIT,
};
pub use error::{CompileError, EvalError, HostError};

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
    /// Names bound to values the policy defines, not the request (see [`Scope::policy_defined`]).
    policy_defined: BTreeSet<String>,
}

impl Scope {
    /// Every name is bound to request data, as large as the largest accepted request.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        Self {
            names: names.into_iter().map(Into::into).collect(),
            policy_defined: BTreeSet::new(),
        }
    }

    /// Marks `names` as bound to values the policy itself defines (attestors, attestations):
    /// the cost estimate sizes them by [`POLICY_VALUE_BYTES`], not by the request.
    pub fn policy_defined<I: IntoIterator<Item = S>, S: Into<String>>(mut self, names: I) -> Self {
        self.policy_defined
            .extend(names.into_iter().map(Into::into));
        self
    }

    /// Whether `name` is a declared variable.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    pub(crate) fn is_policy_defined(&self, name: &str) -> bool {
        self.policy_defined.contains(name)
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
    let (expr, (analysis, estimated_cost)) = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("ivory-cel-compile".into())
            .stack_size(COMPILE_STACK_SIZE)
            .spawn_scoped(s, || {
                let mut expr = lib
                    .parser()
                    .parse(source)
                    .map_err(|e| CompileError::Parse(truncate(e.to_string())))?;
                let mut analysis = static_check::analyze(&mut expr, scope, lib)?;
                analysis.max_depth = cost::instrument::instrument(&mut expr, lib);
                let estimated = cost::estimate::estimate(&expr, scope);
                if estimated > STATIC_COST_LIMIT {
                    return Err(CompileError::TooCostly {
                        estimated,
                        limit: STATIC_COST_LIMIT,
                        expression: excerpt(source),
                    });
                }
                Ok::<_, CompileError>((expr, (analysis, estimated)))
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
            globals: analysis.globals,
            literal_args: analysis.literal_args,
            namespaced_calls: analysis.namespaced_calls,
            depth: analysis.max_depth,
            estimated_cost,
        }),
    })
}

/// An expression as quoted in errors: one line, bounded.
fn excerpt(source: &str) -> String {
    const MAX: usize = 200;
    let line = source.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(MAX) {
        Some((end, _)) => format!("{} …", &line[..end]),
        None => line,
    }
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
    globals: BTreeSet<String>,
    literal_args: BTreeMap<String, BTreeSet<String>>,
    namespaced_calls: BTreeMap<String, Vec<Vec<Option<String>>>>,
    depth: usize,
    estimated_cost: u64,
}

impl Program {
    /// The expression text the program was compiled from.
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// Evaluates under the activation's cost limits (see [`CostBudget`]): an evaluation that
    /// spends them, or outlives the budget's deadline, fails with [`EvalError::CostExceeded`].
    pub fn evaluate(&self, act: &Activation<'_>) -> Result<Value, EvalError> {
        let limits = cost::Limits::of(act.budget());
        if let Some(exceeded) = limits.exhausted() {
            return Err(self.cost_exceeded(exceeded));
        }
        let (result, spent) = match limits.inline_slice() {
            Some(slice) => {
                let (result, first) = self.run_metered(act, slice)?;
                if first.exceeded == Some(cost::Exceeded::InlineSlice) {
                    // CEL is pure and host answers are prefetched: starting over off the worker
                    // gives the same result, for at most the slice's cost spent twice.
                    let rest = limits.after(first.used);
                    let (result, second) = cost::off_worker(|| self.run_metered(act, rest))?;
                    let used = first.used.saturating_add(second.used);
                    (result, cost::Spent { used, ..second })
                } else {
                    (result, first)
                }
            }
            None => self.run_metered(act, limits)?,
        };
        if let Some(budget) = act.budget() {
            budget.spend(spent.used);
        }
        // Checked before the result: an operator (`||`, `&&`) may have absorbed the error.
        match spent.exceeded {
            Some(exceeded) => Err(self.cost_exceeded(exceeded)),
            None => result,
        }
    }

    /// One metered run, on a large-stack thread for deep programs.
    fn run_metered(
        &self,
        act: &Activation<'_>,
        limits: cost::Limits,
    ) -> Result<(Result<Value, EvalError>, cost::Spent), EvalError> {
        let run = || cost::metered(limits, || activation::evaluate(&self.inner.expr, act));
        if self.inner.depth <= INLINE_EVAL_DEPTH {
            return Ok(run());
        }
        // The interpreter recurses per tree level with large frames (tens of KiB in debug
        // builds); run rare deep programs on a thread with a large stack. The thread enters the
        // caller's runtime, if any, so its deadline checks read the same (possibly paused) clock.
        let runtime = tokio::runtime::Handle::try_current().ok();
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("ivory-cel-eval".into())
                .stack_size(DEEP_EVAL_STACK_SIZE)
                .spawn_scoped(s, || {
                    let _clock = runtime.as_ref().map(tokio::runtime::Handle::enter);
                    run()
                })
                .map_err(|e| EvalError::Runtime(format!("cannot start evaluation thread: {e}")))?
                .join()
                .map_err(|_| EvalError::Runtime("evaluation thread panicked".into()))
        })
    }

    fn cost_exceeded(&self, exceeded: cost::Exceeded) -> EvalError {
        EvalError::CostExceeded {
            expression: excerpt(&self.inner.source),
            reason: exceeded.to_string(),
        }
    }

    /// Worst-case cost of one evaluation on the largest accepted request (see the `cost`
    /// module); below [`STATIC_COST_LIMIT`] for every compiled program.
    pub fn estimated_cost(&self) -> u64 {
        self.inner.estimated_cost
    }

    /// Evaluates to a boolean (conditions, validations); any other type is an error.
    pub fn evaluate_bool(&self, act: &Activation<'_>) -> Result<bool, EvalError> {
        match self.evaluate(act)? {
            Value::Bool(b) => Ok(b),
            other => Err(EvalError::unexpected("bool", &other)),
        }
    }

    /// Evaluates to a string (messages, image references); any other type is an error.
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

    /// Evaluates to any value with a JSON form (variables, audit annotations, attestors).
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

    /// The declared variables the expression reads (`object`, `images`, `variables`, ...),
    /// wherever it reads them; comprehension variables are not among them.
    pub fn globals(&self) -> impl Iterator<Item = &str> {
        self.inner.globals.iter().map(String::as_str)
    }

    /// Whether the expression calls function `name` (global, member or namespaced name).
    pub fn calls_function(&self, name: &str) -> bool {
        self.inner.functions.contains(name)
    }

    /// The string literals the expression passes directly to function `name` (e.g. the image
    /// of `image.GetMetadata('ghcr.io/acme/base:1')`): what a call can be known to ask about
    /// before the expression runs.
    pub fn literal_arguments(&self, name: &str) -> impl Iterator<Item = &str> {
        self.inner
            .literal_args
            .get(name)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// Every call of the namespaced function `name` (`resource.Get`, `globalContext.get`),
    /// each as its arguments in order: the string literal, or `None` where the argument is
    /// any other expression. What a policy reads is known from these before it runs.
    pub fn namespaced_calls(&self, name: &str) -> impl Iterator<Item = &[Option<String>]> {
        self.inner
            .namespaced_calls
            .get(name)
            .into_iter()
            .flatten()
            .map(Vec::as_slice)
    }
}

/// The names under which Kyverno's `resource.Get`, `resource.List` and `globalContext.Get` are
/// declared (PascalCase and camelCase).
pub mod cluster_functions {
    pub use crate::library::resources_names::{GLOBAL_CONTEXT_GET, RESOURCE_GET, RESOURCE_LIST};
}

/// The names of Kyverno's functions that read the wall clock (`time.now`): a program that
/// calls one gives a different answer later for the same inputs.
pub mod clock_functions {
    pub use crate::library::clock_names::TIME_NOW;
}

#[cfg(test)]
mod tests;
