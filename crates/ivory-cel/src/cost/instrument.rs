//! Rewrites a checked expression so that its evaluation charges the thread's cost meter:
//!
//! * every comprehension charges its loop body's size once per iteration, through a call
//!   placed where the interpreter evaluates it on every iteration without changing the shapes
//!   it optimizes (`map`/`filter` append in place only when `loop_cond` is a literal);
//! * arguments of functions and operators whose work grows with their input's size charge
//!   that size before the call, and strings and lists that functions build charge their size;
//! * `replace` is routed to a variant that charges its result's size before building it.

use cel::IdedExpr;
use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, LiteralValue, operators};
use cel::common::types::CelInt;

use super::functions::{ITERATION, REPLACE, SIZE};
use crate::library::Library;

/// Whether `name` builds a string or list (see [`BUILDERS`]).
pub(crate) fn is_builder(name: &str) -> bool {
    BUILDERS.contains(&name)
}

/// Operators whose work grows with their operands' size (named functions always qualify).
const SIZED_OPERATORS: &[&str] = &[
    operators::ADD,
    operators::IN,
    operators::EQUALS,
    operators::NOT_EQUALS,
    operators::LESS,
    operators::LESS_EQUALS,
    operators::GREATER,
    operators::GREATER_EQUALS,
];

/// Functions that build a string or list as large as their inputs (or a bounded multiple):
/// their result is charged once built.
const BUILDERS: &[&str] = &[
    "join",
    "format",
    "split",
    "lowerAscii",
    "upperAscii",
    "trim",
    "substring",
    "reverse",
    "quote",
    "encode",
    "decode",
    "string",
    "range",
    "flatten",
    "distinct",
    "sort",
    "slice",
    "@sortByAssociatedKeys",
];

/// Rewrites `e` in place; returns the deepest nesting of the rewritten tree.
pub(crate) fn instrument(e: &mut IdedExpr, lib: &Library) -> usize {
    Rewriter { lib }.walk(e)
}

struct Rewriter<'l> {
    lib: &'l Library,
}

impl Rewriter<'_> {
    fn walk(&self, e: &mut IdedExpr) -> usize {
        1 + match &mut e.expr {
            Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => 0,
            Expr::Select(s) => self.walk(&mut s.operand),
            Expr::Call(call) => {
                let builds = BUILDERS.contains(&call.func_name.as_str());
                let depth = self.call(call);
                if builds {
                    wrap(e, SIZE, None);
                    return depth + 2;
                }
                depth
            }
            Expr::Comprehension(c) => self.comprehension(c),
            Expr::List(list) => list
                .elements
                .iter_mut()
                .map(|el| self.walk(el))
                .max()
                .unwrap_or(0),
            Expr::Map(map) => self.entries(&mut map.entries),
            Expr::Struct(st) => self.entries(&mut st.entries),
        }
    }

    fn entries(&self, entries: &mut [cel::common::ast::IdedEntryExpr]) -> usize {
        entries
            .iter_mut()
            .map(|entry| match &mut entry.expr {
                EntryExpr::MapEntry(me) => self.walk(&mut me.key).max(self.walk(&mut me.value)),
                EntryExpr::StructField(sf) => self.walk(&mut sf.value),
            })
            .max()
            .unwrap_or(0)
    }

    fn call(&self, call: &mut CallExpr) -> usize {
        let sized = is_sized(call);
        if call.func_name == "replace" && call.target.is_some() {
            call.func_name = REPLACE.to_owned();
        }
        let mut depth = 0;
        if let Some(target) = call.target.as_deref_mut() {
            let charge = sized
                && needs_charge(target)
                && !names_namespace(target, &call.func_name, self.lib);
            depth = self.walk(target);
            if charge {
                wrap(target, SIZE, None);
                depth += 1;
            }
        }
        for arg in &mut call.args {
            let charge = sized && needs_charge(arg);
            let mut d = self.walk(arg);
            if charge {
                wrap(arg, SIZE, None);
                d += 1;
            }
            depth = depth.max(d);
        }
        depth
    }

    fn comprehension(&self, c: &mut ComprehensionExpr) -> usize {
        let units = 1 + body_size(&c.loop_cond) + body_size(&c.loop_step);
        let depth = [
            self.walk(&mut c.iter_range),
            self.walk(&mut c.accu_init),
            self.walk(&mut c.loop_cond),
            self.walk(&mut c.loop_step),
            self.walk(&mut c.result),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        charge_iterations(c, units);
        depth + 1
    }
}

/// Where a comprehension charges its iterations.
#[derive(Clone, Copy)]
enum ChargePoint {
    /// A computed condition runs before every iteration (all, exists).
    Condition,
    /// filter, map with a predicate, exists_one: the guard runs on every iteration.
    Guard,
    /// map: the appended `[f(x)]` runs on every iteration; charging inside the list keeps the
    /// `@result + [..]` shape the interpreter appends in place.
    Appended,
    Step,
}

/// The subexpression evaluated once per iteration on every path of the interpreter.
fn charge_point(c: &ComprehensionExpr) -> ChargePoint {
    if !matches!(c.loop_cond.expr, Expr::Literal(_)) {
        return ChargePoint::Condition;
    }
    match &c.loop_step.expr {
        Expr::Call(step) if step.func_name == operators::CONDITIONAL && step.args.len() == 3 => {
            ChargePoint::Guard
        }
        Expr::Call(step)
            if step.func_name == operators::ADD
                && step.args.len() == 2
                && matches!(&step.args[1].expr, Expr::List(l) if !l.elements.is_empty()) =>
        {
            ChargePoint::Appended
        }
        _ => ChargePoint::Step,
    }
}

/// Makes `c` charge `units` per iteration.
fn charge_iterations(c: &mut ComprehensionExpr, units: usize) {
    let point = charge_point(c);
    let target = match (point, &mut c.loop_step.expr) {
        (ChargePoint::Condition, _) => Some(&mut c.loop_cond),
        (ChargePoint::Guard, Expr::Call(step)) => step.args.first_mut(),
        (ChargePoint::Appended, Expr::Call(step)) => {
            match step.args.get_mut(1).map(|a| &mut a.expr) {
                Some(Expr::List(l)) => l.elements.first_mut(),
                _ => None,
            }
        }
        _ => None,
    };
    match target {
        Some(target) => wrap(target, ITERATION, Some(units)),
        None => wrap(&mut c.loop_step, ITERATION, Some(units)),
    }
}

/// Replaces `e` with `func([units,] e)`.
fn wrap(e: &mut IdedExpr, func: &str, units: Option<usize>) {
    let inner = std::mem::take(e);
    let mut args = Vec::with_capacity(2);
    if let Some(units) = units {
        args.push(IdedExpr {
            id: 0,
            expr: Expr::Literal(LiteralValue::Int(CelInt::from(
                i64::try_from(units).unwrap_or(i64::MAX),
            ))),
        });
    }
    args.push(inner);
    *e = IdedExpr {
        id: inner_id(&args),
        expr: Expr::Call(CallExpr {
            func_name: func.to_owned(),
            target: None,
            args,
        }),
    };
}

/// `resource.Get`/`List` and `globalContext.Get` (either case).
pub(crate) fn is_cluster_read(call: &CallExpr) -> bool {
    let Some(Expr::Ident(target)) = call.target.as_deref().map(|t| &t.expr) else {
        return false;
    };
    let name = format!("{target}.{}", call.func_name);
    crate::library::resources_names::RESOURCE_GET
        .iter()
        .chain(&crate::library::resources_names::RESOURCE_LIST)
        .chain(&crate::library::resources_names::GLOBAL_CONTEXT_GET)
        .any(|n| *n == name)
}

/// `extractPayload`, `getImageData` and `image.GetMetadata`/`getMetadata`: registry data the
/// verifier fetched and capped (an attestation statement, an image's config), not request data.
pub(crate) fn is_registry_read(call: &CallExpr) -> bool {
    match call.target.as_deref().map(|t| &t.expr) {
        None => matches!(call.func_name.as_str(), "extractPayload" | "getImageData"),
        Some(Expr::Ident(target)) => {
            target == "image" && matches!(call.func_name.as_str(), "GetMetadata" | "getMetadata")
        }
        Some(_) => false,
    }
}

fn inner_id(args: &[IdedExpr]) -> u64 {
    args.last().map_or(0, |a| a.id)
}

/// Whether the call's work grows with the size of its operands.
fn is_sized(call: &CallExpr) -> bool {
    // A cluster read is a lookup by its (short) arguments in a host's cache.
    if call.func_name.starts_with("cost$") || is_cluster_read(call) {
        return false;
    }
    let named = call
        .func_name
        .starts_with(|c: char| c.is_ascii_alphabetic());
    let sized = named || SIZED_OPERATORS.contains(&call.func_name.as_str());
    // `@result + [x]` (map, filter) and `@result + 1` (exists_one) update an accumulator,
    // which user expressions cannot name; the interpreter appends to it in place.
    let accumulates = call
        .args
        .iter()
        .any(|a| matches!(&a.expr, Expr::Ident(n) if n.starts_with('@')));
    sized && !accumulates
}

/// Whether an operand's size must be charged: literals are bounded by the source, and the
/// result of a sized call is bounded by its own operands, which are charged.
fn needs_charge(operand: &IdedExpr) -> bool {
    match &operand.expr {
        Expr::Literal(_) => false,
        Expr::Call(call) => !is_sized(call) && !call.func_name.starts_with("cost$"),
        _ => true,
    }
}

/// `ns.fn(..)` calls the namespaced function `ns.fn`; its target is a name, not a value.
fn names_namespace(target: &IdedExpr, func: &str, lib: &Library) -> bool {
    let mut segments = Vec::new();
    let mut cur = &target.expr;
    loop {
        match cur {
            Expr::Ident(n) => {
                segments.push(n.as_str());
                break;
            }
            Expr::Select(s) if !s.test => {
                segments.push(s.field.as_str());
                cur = &s.operand.expr;
            }
            _ => return false,
        }
    }
    segments.reverse();
    lib.knows_function(&format!("{}.{func}", segments.join(".")), false)
}

/// Nodes of a loop body evaluated per iteration; a nested comprehension charges its own
/// iterations, so only its setup and result count here.
/// A literal counts its size too: operations on it are not charged at run time.
pub(crate) fn body_size(e: &IdedExpr) -> usize {
    1 + match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => literal_units(s.inner().len()),
        Expr::Literal(LiteralValue::Bytes(b)) => literal_units(b.inner().len()),
        Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => 0,
        Expr::Select(s) => body_size(&s.operand),
        Expr::Call(call) => {
            call.target.as_deref().map_or(0, body_size)
                + call.args.iter().map(body_size).sum::<usize>()
        }
        Expr::Comprehension(c) => {
            body_size(&c.iter_range) + body_size(&c.accu_init) + body_size(&c.result)
        }
        Expr::List(list) => list.elements.iter().map(body_size).sum(),
        Expr::Map(map) => map.entries.iter().map(entry_size).sum(),
        Expr::Struct(st) => st.entries.iter().map(entry_size).sum(),
    }
}

fn literal_units(len: usize) -> usize {
    usize::try_from(super::string_units(len)).unwrap_or(usize::MAX)
}

fn entry_size(entry: &cel::common::ast::IdedEntryExpr) -> usize {
    match &entry.expr {
        EntryExpr::MapEntry(me) => body_size(&me.key) + body_size(&me.value),
        EntryExpr::StructField(sf) => body_size(&sf.value),
    }
}
