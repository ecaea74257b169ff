//! Kubernetes `lists` library (`isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf` on
//! lists), `jsonpatch.escapeKey`, and cel-go's `cel.bind` macro.

use std::cmp::Ordering;

use cel::common::ast::{ComprehensionExpr, Expr, ListExpr, LiteralValue};
use cel::common::types::{self, CelInt};
use cel::common::value::CowVal;
use cel::parser::{Macro, MacroExprHelper};
use cel::{Env, ExecutionError, IdedExpr, ParseError, Value};

use super::{FunctionError, Registry, string};

fn compare(a: &Value, b: &Value) -> Result<Ordering, FunctionError> {
    a.partial_cmp(b).ok_or_else(|| {
        FunctionError::Elements(format!(
            "{} and {} are not comparable",
            super::type_name(a),
            super::type_name(b)
        ))
    })
}

fn extreme(items: &[Value], want: Ordering) -> Result<Value, FunctionError> {
    let mut best = items.first().ok_or_else(|| {
        FunctionError::Elements("empty list has no minimum or maximum".to_owned())
    })?;
    for item in &items[1..] {
        if compare(item, best)? == want {
            best = item;
        }
    }
    Ok(best.clone())
}

fn sum(items: &[Value]) -> Result<Value, FunctionError> {
    let overflow = || FunctionError::OutOfRange("sum overflows".to_owned());
    match items.first() {
        None | Some(Value::Int(_)) => items
            .iter()
            .try_fold(0i64, |acc, v| match v {
                Value::Int(i) => acc.checked_add(*i).ok_or_else(overflow),
                other => Err(mixed(other)),
            })
            .map(Value::Int),
        Some(Value::UInt(_)) => items
            .iter()
            .try_fold(0u64, |acc, v| match v {
                Value::UInt(u) => acc.checked_add(*u).ok_or_else(overflow),
                other => Err(mixed(other)),
            })
            .map(Value::UInt),
        Some(Value::Float(_)) => items
            .iter()
            .try_fold(0f64, |acc, v| match v {
                Value::Float(f) => Ok(acc + f),
                other => Err(mixed(other)),
            })
            .map(Value::Float),
        Some(other) => Err(FunctionError::Elements(format!(
            "sum is not defined on list of {}",
            super::type_name(other)
        ))),
    }
}

fn mixed(v: &Value) -> FunctionError {
    FunctionError::Elements(format!("sum: unexpected {} in list", super::type_name(v)))
}

pub(super) fn register(r: &mut Registry) {
    r.add("isSorted", |a| match a {
        [Value::List(items)] => Some((|| {
            for w in items.windows(2) {
                if compare(&w[0], &w[1])? == Ordering::Greater {
                    return Ok(Value::Bool(false));
                }
            }
            Ok(Value::Bool(true))
        })()),
        _ => None,
    });
    r.add("sum", |a| match a {
        [Value::List(items)] => Some(sum(items)),
        _ => None,
    });
    r.add("min", |a| match a {
        [Value::List(items)] => Some(extreme(items, Ordering::Less)),
        _ => None,
    });
    r.add("max", |a| match a {
        [Value::List(items)] => Some(extreme(items, Ordering::Greater)),
        _ => None,
    });
    r.add("jsonpatch.escapeKey", |a| match a {
        [Value::String(s)] => Some(Ok(string(s.replace('~', "~0").replace('/', "~1")))),
        _ => None,
    });
}

/// `list.indexOf(x)` / `list.lastIndexOf(x)`: the strings extension already declares these
/// names as overloads, so lists get overloads too (context functions would conflict).
pub(super) fn add_overloads(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_member_overload(
        "indexOf",
        "list_indexOf_dyn",
        types::LIST_TYPE,
        vec![types::DYN_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_lastIndexOf_dyn",
        types::LIST_TYPE,
        vec![types::DYN_TYPE],
        last_index_of,
    )?;
    env.add_macro(Macro::receiver("bind", 3, bind_macro))
}

fn position<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    last: bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list, needle] = args.as_slice() else {
        return Err(ExecutionError::missing_argument_or_target());
    };
    let (Value::List(items), needle) = (
        Value::try_from(list.as_ref())?,
        Value::try_from(needle.as_ref())?,
    ) else {
        return Err(ExecutionError::missing_argument_or_target());
    };
    let mut indexed = items.iter().enumerate();
    let found = if last {
        indexed.rev().find(|(_, v)| **v == needle)
    } else {
        indexed.find(|(_, v)| **v == needle)
    };
    let idx = found.map_or(-1, |(i, _)| i64::try_from(i).unwrap_or(i64::MAX));
    Ok(CowVal::owned(CelInt::from(idx)))
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(args, false)
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(args, true)
}

/// `cel.bind(name, init, body)`: `body` with `name` bound to `init`, expanded like cel-go to
/// a comprehension over an empty list whose accumulator is the binding.
fn bind_macro(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(n)) if n == "cel") {
        return Ok(None);
    }
    let Expr::Ident(name) = &args[0].expr else {
        return Err(helper.new_error(
            args[0].id,
            "cel.bind() variable name must be a simple identifier",
        ));
    };
    let name = name.clone();
    let body = args.pop().unwrap_or_default();
    let init = args.pop().unwrap_or_default();
    let empty = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let cond = helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into())));
    let step = helper.next_expr(Expr::Ident(name.clone()));
    let comprehension = ComprehensionExpr {
        iter_range: empty,
        iter_var: "#unused".to_owned(),
        iter_var2: None,
        accu_var: name,
        accu_init: init,
        loop_cond: cond,
        loop_step: step,
        result: body,
    };
    Ok(Some(
        helper.next_expr(Expr::Comprehension(Box::new(comprehension))),
    ))
}
