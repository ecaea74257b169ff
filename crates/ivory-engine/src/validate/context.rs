//! The CEL activation of one policy evaluation: the request's bindings, the lazily evaluated
//! `variables`, and the policy's `images`, `attestors` and `attestations`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ivory_cel::{Activation, ConvertedJson, CostBudget, EvalError, Host, Program, Value};
use ivory_policy::compiled::{CompiledPolicy, NamedProgram};
use serde_json::Value as Json;

use crate::bindings::RequestBindings;

/// The `attestors` binding of one request: shared by every request when all attestors are
/// static, built per request otherwise.
#[derive(Clone)]
pub(super) enum AttestorsBinding {
    /// Converted once per policy version.
    Shared(Arc<ConvertedJson>),
    /// With the CEL-sourced fields of this request filled in.
    Json(Json),
}

/// Why a program of the policy could not be evaluated; its text becomes the policy result's
/// message (after `failed to evaluate policy: `).
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum ExprError {
    /// The program itself failed.
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// A variable the program reads failed.
    #[error("composited variable {name:?} fails to evaluate: {source}")]
    Variable {
        /// The variable's name.
        name: String,
        /// Why it failed.
        #[source]
        source: Box<ExprError>,
    },
    /// A variable that reads itself, directly or through others.
    #[error("variable {0:?} refers to itself")]
    Cycle(String),
}

/// Evaluates a policy's programs against one request, memoizing variables. The request's
/// bindings are shared by all evaluators of the request; only `variables` is rebound per program.
pub(super) struct Evaluator<'a> {
    data: &'a RequestBindings<'a>,
    json_mode: bool,
    variables: &'a [NamedProgram],
    memo: HashMap<String, Result<Value, ExprError>>,
    act: Activation<'a>,
    /// The first evaluation stopped by the CEL cost limits or the deadline.
    over_budget: Option<String>,
}

impl<'a> Evaluator<'a> {
    pub(super) fn new(
        data: &'a RequestBindings<'a>,
        policy: &'a CompiledPolicy,
        host: &'a dyn Host,
    ) -> Self {
        Self {
            data,
            json_mode: policy.json_mode,
            variables: &policy.variables,
            memo: HashMap::new(),
            act: base_activation(data, policy.json_mode, host),
            over_budget: None,
        }
    }

    /// Binds `images`, `attestors` (name → object) and `attestations` (name → name).
    pub(super) fn bind_policy(
        &mut self,
        images: &BTreeMap<String, Vec<String>>,
        attestors: &AttestorsBinding,
        attestations: Arc<ConvertedJson>,
    ) {
        self.act.bind_string_lists("images", images);
        match attestors {
            AttestorsBinding::Shared(shared) => {
                self.act.bind_converted("attestors", Arc::clone(shared));
            }
            AttestorsBinding::Json(json) => self.act.bind_json("attestors", json),
        }
        self.act.bind_converted("attestations", attestations);
    }

    /// The same evaluator with another host (the verification host after prefetch); the
    /// variable memo starts afresh so that variables may call verification functions.
    pub(super) fn with_host<'b>(self, host: &'b dyn Host) -> Evaluator<'b>
    where
        'a: 'b,
    {
        Evaluator {
            data: self.data,
            json_mode: self.json_mode,
            variables: self.variables,
            memo: HashMap::new(),
            act: self.act.with_host(host),
            over_budget: self.over_budget,
        }
    }

    /// The cost budget this evaluator charges, for an evaluator of the same policy built later.
    pub(super) fn shared_budget(&self) -> Option<Arc<CostBudget>> {
        self.act.shared_budget()
    }

    /// Charges every evaluation to `budget` instead of the one [`Evaluator::new`] gave.
    pub(super) fn share_budget(&mut self, budget: Arc<CostBudget>) {
        self.act.set_budget(budget);
    }

    /// Drops the memoized variables, so that they are evaluated again on next use.
    pub(super) fn forget_variables(&mut self) {
        self.memo.clear();
    }

    pub(super) fn bool(&mut self, program: &Program) -> Result<bool, ExprError> {
        self.eval(program, |p, a| p.evaluate_bool(a))
    }

    pub(super) fn string(&mut self, program: &Program) -> Result<String, ExprError> {
        self.eval(program, |p, a| p.evaluate_string(a))
    }

    pub(super) fn optional_string(
        &mut self,
        program: &Program,
    ) -> Result<Option<String>, ExprError> {
        self.eval(program, |p, a| p.evaluate_optional_string(a))
    }

    pub(super) fn json(&mut self, program: &Program) -> Result<Json, ExprError> {
        self.eval(program, |p, a| p.evaluate_json(a))
    }

    /// Evaluates `program` after evaluating (once) the variables it needs.
    fn eval<T>(
        &mut self,
        program: &Program,
        run: impl Fn(&Program, &Activation<'_>) -> Result<T, EvalError>,
    ) -> Result<T, ExprError> {
        let vars = self.resolve(&self.needed(program), &mut Vec::new())?;
        self.bind_variables(vars);
        let result = run(program, &self.act);
        result.map_err(|e| self.note(e))
    }

    /// Why an evaluation stopped on the CEL cost limits or the deadline, if one did: such a
    /// policy follows its failurePolicy rather than reporting an evaluation error.
    pub(super) fn over_budget(&self) -> Option<&str> {
        self.over_budget.as_deref()
    }

    /// Remembers the first evaluation the cost limits stopped (decided by the error's variant).
    fn note(&mut self, e: EvalError) -> ExprError {
        if matches!(e, EvalError::CostExceeded { .. }) && self.over_budget.is_none() {
            self.over_budget = Some(e.to_string());
        }
        ExprError::Eval(e)
    }

    fn needed(&self, program: &Program) -> Vec<String> {
        if self.json_mode {
            return Vec::new();
        }
        if program.uses_variables_dynamically() {
            return self.variables.iter().map(|v| v.name.clone()).collect();
        }
        program.variable_refs().to_vec()
    }

    /// Evaluates the named variables (and theirs, transitively), memoized. A variable's error
    /// surfaces only when a program needs it. Undeclared names are left for CEL to report.
    fn resolve(
        &mut self,
        names: &[String],
        stack: &mut Vec<String>,
    ) -> Result<HashMap<String, Value>, ExprError> {
        let mut out = HashMap::new();
        for name in names {
            if !self.memo.contains_key(name) {
                let variables = self.variables;
                let Some(var) = variables.iter().find(|v| &v.name == name) else {
                    continue;
                };
                if stack.contains(name) {
                    return Err(ExprError::Cycle(name.clone()));
                }
                stack.push(name.clone());
                let deps = self.needed(&var.program);
                let result = self.resolve(&deps, stack).and_then(|vars| {
                    self.bind_variables(vars);
                    let result = var.program.evaluate(&self.act);
                    result.map_err(|e| self.note(e))
                });
                stack.pop();
                let result = result.map_err(|e| ExprError::Variable {
                    name: name.clone(),
                    source: Box::new(e),
                });
                self.memo.insert(name.clone(), result);
            }
            match self.memo.get(name) {
                Some(Ok(value)) => {
                    out.insert(name.clone(), value.clone());
                }
                Some(Err(e)) => return Err(e.clone()),
                None => {}
            }
        }
        Ok(out)
    }

    fn bind_variables(&mut self, vars: HashMap<String, Value>) {
        if !self.json_mode {
            self.act.bind_value("variables", Value::from(vars));
        }
    }
}

/// The request bindings of the policy's mode: only `object` in JSON mode.
fn base_activation<'a>(
    data: &'a RequestBindings<'a>,
    json_mode: bool,
    host: &'a dyn Host,
) -> Activation<'a> {
    let mut act = Activation::new(host);
    data.bind(&mut act, json_mode);
    if !json_mode {
        act.bind_value("variables", Value::from(HashMap::<String, Value>::new()));
    }
    act
}
