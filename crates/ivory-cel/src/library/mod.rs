//! The function library: cel stdlib + extensions, Kubernetes libraries and Kyverno's image
//! functions. Built once per process; every evaluation runs in a child scope of it.

mod k8s_lists;
mod kyverno;
mod net;
mod quantity;
mod regex;
pub(crate) mod registry;
mod resources;
mod semvers;
mod sets;
mod time;
mod urls;

use std::sync::{Arc, OnceLock};

use cel::common::ast::{CallExpr, Expr, LiteralValue};
use cel::common::types::{CelString, Type};
use cel::common::value::CowVal;
use cel::objects::Opaque;
use cel::parser::Parser;
use cel::{Context, Env, ExecutionError, FunctionContext, IdedExpr, Value};

pub(crate) use registry::{Func, Handler, Ordered, Registry};

/// The names of the cluster-read functions (re-exported by the crate).
pub(crate) mod resources_names {
    pub use super::resources::{GLOBAL_CONTEXT_GET, RESOURCE_GET, RESOURCE_LIST};
}

/// The names of the functions that read the wall clock (re-exported by the crate).
pub(crate) mod clock_names {
    pub use super::time::TIME_NOW;
}

/// Name `matches` calls are rewritten to, so that they use the cached regexes.
/// `$` keeps it out of reach of expressions.
pub(crate) const MATCHES_CACHED: &str = "matches$cached";

pub(crate) struct Library {
    pub context: Context<'static, 'static>,
    env: Arc<Env>,
}

static LIBRARY: OnceLock<Library> = OnceLock::new();

pub(crate) fn get() -> &'static Library {
    LIBRARY.get_or_init(build)
}

impl Library {
    pub(crate) fn parser(&self) -> Parser {
        self.env.parser()
    }

    pub(crate) fn has_type(&self, name: &str) -> bool {
        self.env.types().find_type(name).is_some()
    }

    /// Whether a call of `name` (as a member call when `member`) resolves to a function.
    /// cel-rust offers no lookup API, so ask the interpreter with an argument-less call:
    /// an unknown name is the only case reported as an undeclared reference to itself.
    pub(crate) fn knows_function(&self, name: &str, member: bool) -> bool {
        let call = IdedExpr {
            id: 1,
            expr: Expr::Call(CallExpr {
                func_name: name.to_owned(),
                target: member.then(|| {
                    Box::new(IdedExpr {
                        id: 2,
                        expr: Expr::Literal(LiteralValue::Null),
                    })
                }),
                args: Vec::new(),
            }),
        };
        let scope = self.context.new_inner_scope();
        !matches!(
            scope.resolve(&call),
            Err(ExecutionError::UndeclaredReference(n)) if n.as_str() == name
        )
    }
}

/// Why a library function refused its arguments. The text becomes the CEL error
/// (`Error executing function '<name>': <text>`), in the words of the Kubernetes or Kyverno
/// library the function comes from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FunctionError {
    /// A string that is not a value of the function's type (quantity, IP address, CIDR, URL,
    /// semver, regex).
    #[error("{0}")]
    Invalid(String),
    /// A string that is not an image reference.
    #[error(transparent)]
    Image(#[from] ivory_reference::ImageRefError),
    /// A value or result outside what the type holds (overflow, a fraction where an integer
    /// is asked for).
    #[error("{0}")]
    OutOfRange(String),
    /// List elements the function cannot compare or add up, or an empty list where an
    /// element is needed.
    #[error("{0}")]
    Elements(String),
}

fn build() -> Library {
    let mut env = Env::stdlib();
    for (what, result) in [
        ("strings", env.add_extension(cel::extensions::strings)),
        ("lists", env.add_extension(cel::extensions::lists)),
        ("math", env.add_extension(cel::extensions::math)),
        ("encoders", env.add_extension(cel::extensions::encoders)),
        ("string overloads", add_string_overloads(&mut env)),
        ("list overloads", k8s_lists::add_overloads(&mut env)),
    ] {
        // Declarations are static; a failure is a bug caught by every test.
        if let Err(e) = result {
            panic!("ivory-cel: declaring the {what} library failed: {e}");
        }
    }
    let env = Arc::new(env);
    let mut context = Context::with_env(Arc::clone(&env));
    let mut registry = Registry::default();
    regex::register(&mut registry);
    net::register(&mut registry);
    urls::register(&mut registry);
    quantity::register(&mut registry);
    semvers::register(&mut registry);
    sets::register(&mut registry);
    kyverno::register(&mut registry);
    resources::register(&mut registry);
    time::register(&mut registry);
    k8s_lists::register(&mut registry);
    crate::cost::functions::register(&mut registry);
    for (name, handlers) in registry.handlers {
        if let Err(e) = context.add_function(name, dispatcher(name, handlers)) {
            panic!("ivory-cel: declaring function {name} failed: {e}");
        }
    }
    for (name, f) in registry.raw {
        if let Err(e) = context.add_function(name, f) {
            panic!("ivory-cel: declaring function {name} failed: {e}");
        }
    }
    Library { context, env }
}

fn dispatcher(name: &'static str, handlers: Vec<Handler>) -> Func {
    Box::new(move |ftx| {
        let member = ftx.this.is_some();
        let all = call_values(ftx)?;
        for h in &handlers {
            if let Some(result) = h(&all) {
                let value = result.map_err(|e| ExecutionError::function_error(name, e))?;
                return value.try_into().map(CowVal::Owned);
            }
        }
        Err(no_overload(display_name(name), &all, member))
    })
}

/// Receiver (if any) followed by the arguments, as owned values.
pub(crate) fn call_values(ftx: &FunctionContext<'_, '_>) -> Result<Vec<Value>, ExecutionError> {
    let mut all = Vec::with_capacity(ftx.args.len() + 1);
    if let Some(this) = &ftx.this {
        all.push(Value::try_from(this.as_ref())?);
    }
    for a in &ftx.args {
        all.push(Value::try_from(a.as_ref())?);
    }
    Ok(all)
}

fn display_name(name: &str) -> &str {
    if name == MATCHES_CACHED {
        "matches"
    } else {
        name
    }
}

pub(crate) fn no_overload(name: &str, args: &[Value], member: bool) -> ExecutionError {
    let types = args.iter().map(type_name).collect();
    if member {
        ExecutionError::no_such_member_overload(name, types)
    } else {
        ExecutionError::no_such_overload(name, types)
    }
}

pub(crate) fn opaque<T: 'static>(v: &Value) -> Option<&T> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<T>(),
        _ => None,
    }
}

pub(crate) fn wrap<T: Opaque>(t: T) -> Value {
    Value::Opaque(Arc::new(t))
}

pub(crate) fn string(s: impl Into<String>) -> Value {
    Value::String(Arc::new(s.into()))
}

/// CEL type name of a value, for error messages.
pub(crate) fn type_name(v: &Value) -> String {
    match v {
        Value::Opaque(o) => o.runtime_type_name().to_owned(),
        Value::Float(_) => "double".to_owned(),
        Value::Null => "null_type".to_owned(),
        other => other.type_of().to_string(),
    }
}

/// String form of the library's object types (`string(x)`, JSON output).
pub(crate) fn opaque_to_string(o: &dyn Opaque) -> Option<String> {
    net::to_string(o)
        .or_else(|| urls::to_string(o))
        .or_else(|| quantity::to_string(o))
        .or_else(|| semvers::to_string(o))
        .or_else(|| kyverno::to_string(o))
}

const STRINGABLE_TYPES: &[&str] = &[
    net::IP_TYPE,
    net::CIDR_TYPE,
    urls::URL_TYPE,
    quantity::QUANTITY_TYPE,
    semvers::SEMVER_TYPE,
    kyverno::IMAGE_TYPE,
];

/// `string(x)` and `x.string()` for the library's object types; `string` is a stdlib
/// overload name, so it can only be extended with more overloads.
fn add_string_overloads(env: &mut Env) -> Result<(), cel::DeclarationError> {
    for name in STRINGABLE_TYPES {
        let t = || Type::new_opaque_type(*name);
        env.add_overload(
            "string",
            &format!("string_{name}"),
            vec![t()],
            opaque_string,
        )?;
        env.add_member_overload(
            "string",
            &format!("{name}_string"),
            t(),
            vec![],
            opaque_string,
        )?;
    }
    Ok(())
}

fn opaque_string<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let first = args
        .first()
        .ok_or_else(ExecutionError::missing_argument_or_target)?;
    let value = Value::try_from(first.as_ref())?;
    let s = match &value {
        Value::Opaque(o) => opaque_to_string(o.as_ref()),
        _ => None,
    };
    s.map(|s| CowVal::owned(CelString::from(s)))
        .ok_or_else(|| no_overload("string", &[value], false))
}

#[cfg(test)]
mod tests;
