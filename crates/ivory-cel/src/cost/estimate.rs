//! Worst-case cost of an instrumented expression: what its `cost$…` calls would charge on the
//! largest request ivory accepts, after Kubernetes' `checker.Cost`. ivory has no schemas, so
//! every value from the request is sized by [`MAX_INPUT_BYTES`], and a list by the fewest bytes
//! an element takes, as Kubernetes sizes unbounded lists.
//!
//! A list nested in the element a comprehension is visiting is sized by that element's share of
//! its list (the visited elements together are no larger than the list), so a pass over
//! `c.ports` inside a pass over containers costs as much as one pass over the request, while a
//! pass over any request list inside another (a cross product) multiplies.

use cel::IdedExpr;
use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, LiteralValue, operators};

use super::functions::{ITERATION, REPLACE, SIZE};
use super::instrument::{is_builder, is_cluster_read, is_registry_read};
use super::{
    BYTES_PER_UNIT, MAX_INPUT_BYTES, MIN_ELEMENT_BYTES, POLICY_VALUE_BYTES, POLICY_VALUE_ITEMS,
};
use crate::Scope;

/// Worst-case cost of `e` (saturating).
pub(crate) fn estimate(e: &IdedExpr, scope: &Scope) -> u64 {
    Estimator {
        scope,
        vars: Vec::new(),
        level: 0,
    }
    .walk(e)
    .cost
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Scalar,
    String,
    List,
    Unknown,
}

/// Largest size a value can have.
#[derive(Debug, Clone, Copy)]
struct Bound {
    kind: Kind,
    /// Elements of a list or map, bytes of a string.
    items: u64,
    /// Serialized size.
    bytes: u64,
    /// Whether the value comes from the policy or from data a host fetched (cluster objects,
    /// attestation statements), not from the request: a list, map or string inside it is
    /// assumed to hold at most [`POLICY_VALUE_ITEMS`] elements.
    fetched: bool,
}

const SCALAR: Bound = Bound {
    kind: Kind::Scalar,
    items: 0,
    bytes: 8,
    fetched: false,
};

const POLICY_VALUE: Bound = Bound {
    kind: Kind::Unknown,
    items: POLICY_VALUE_ITEMS,
    bytes: POLICY_VALUE_BYTES,
    fetched: true,
};

/// `lists.range(n)`: the extension refuses more than a million elements.
const RANGE: Bound = Bound {
    kind: Kind::List,
    items: 1_000_000,
    bytes: 8_000_000,
    fetched: false,
};

const REQUEST: Bound = Bound {
    kind: Kind::Unknown,
    items: MAX_INPUT_BYTES / MIN_ELEMENT_BYTES,
    bytes: MAX_INPUT_BYTES,
    fetched: false,
};

impl Bound {
    fn unknown(bytes: u64) -> Self {
        Self {
            kind: Kind::Unknown,
            items: bytes / MIN_ELEMENT_BYTES,
            bytes,
            fetched: false,
        }
    }

    /// A value of unknown kind derived from `from` alone (a field, an element, a flattened
    /// list of it): fetched data stays fetched, its parts no larger than the assumption.
    fn part_of(from: Self, bytes: u64) -> Self {
        let mut bound = Self::unknown(bytes);
        if from.fetched {
            bound.fetched = true;
            bound.items = bound.items.min(POLICY_VALUE_ITEMS);
        }
        bound
    }

    fn string(bytes: u64) -> Self {
        Self {
            kind: Kind::String,
            items: bytes,
            bytes,
            fetched: false,
        }
    }

    fn plus(self, other: Self) -> Self {
        let kind = if self.kind == other.kind {
            self.kind
        } else {
            Kind::Unknown
        };
        Self {
            kind,
            items: self.items.saturating_add(other.items),
            bytes: self.bytes.saturating_add(other.bytes),
            fetched: self.fetched_with(other),
        }
    }

    fn max(self, other: Self) -> Self {
        Self {
            kind: if self.kind == other.kind {
                self.kind
            } else {
                Kind::Unknown
            },
            items: self.items.max(other.items),
            bytes: self.bytes.max(other.bytes),
            fetched: self.fetched_with(other),
        }
    }

    /// Whether a value made of this one and `other` is still fetched data: an empty or
    /// scalar part (a `null` branch, `cel.bind`'s empty range) does not make it request data.
    fn fetched_with(self, other: Self) -> bool {
        let neutral = |b: Self| b.items == 0;
        match (self.fetched, other.fetched) {
            (true, true) => true,
            (true, false) => neutral(other),
            (false, true) => neutral(self),
            (false, false) => false,
        }
    }

    /// What `cost$size` charges for a value of this bound.
    fn size_cost(self) -> u64 {
        let string = self.bytes.div_ceil(BYTES_PER_UNIT);
        match self.kind {
            Kind::Scalar => 0,
            Kind::String => string,
            Kind::List => self.items,
            Kind::Unknown => string.max(self.items),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Est {
    cost: u64,
    bound: Bound,
}

/// A comprehension variable: any element may be as large as the whole list (`whole`), but
/// over one pass the elements share it (`share`, used by the body of that pass itself).
struct Var {
    name: String,
    whole: Bound,
    share: Bound,
    level: usize,
}

struct Estimator<'s> {
    scope: &'s Scope,
    vars: Vec<Var>,
    level: usize,
}

impl Estimator<'_> {
    fn walk(&mut self, e: &IdedExpr) -> Est {
        match &e.expr {
            Expr::Unspecified => free(SCALAR),
            Expr::Literal(lit) => free(literal(lit)),
            Expr::Ident(name) => free(self.ident(name)),
            Expr::Select(s) => {
                let operand = self.walk(&s.operand);
                let bound = if s.test {
                    SCALAR
                } else {
                    Bound {
                        kind: Kind::Unknown,
                        ..operand.bound
                    }
                };
                Est {
                    cost: operand.cost,
                    bound,
                }
            }
            Expr::Call(call) => self.call(call),
            Expr::Comprehension(c) => self.comprehension(c),
            Expr::List(list) => {
                let parts: Vec<Est> = list.elements.iter().map(|el| self.walk(el)).collect();
                collection(&parts)
            }
            Expr::Map(map) => {
                let parts = self.entries(&map.entries);
                collection(&parts)
            }
            Expr::Struct(st) => {
                let parts = self.entries(&st.entries);
                collection(&parts)
            }
        }
    }

    fn entries(&mut self, entries: &[cel::common::ast::IdedEntryExpr]) -> Vec<Est> {
        entries
            .iter()
            .map(|entry| match &entry.expr {
                EntryExpr::MapEntry(me) => {
                    let key = self.walk(&me.key);
                    let value = self.walk(&me.value);
                    Est {
                        cost: key.cost.saturating_add(value.cost),
                        bound: key.bound.plus(value.bound),
                    }
                }
                EntryExpr::StructField(sf) => self.walk(&sf.value),
            })
            .collect()
    }

    fn ident(&self, name: &str) -> Bound {
        match self.vars.iter().rev().find(|v| v.name == name) {
            Some(var) if var.level == self.level => var.share,
            Some(var) => var.whole,
            None if self.scope.is_policy_defined(name) => POLICY_VALUE,
            None if self.scope.contains(name) => REQUEST,
            // A namespace (`image.GetMetadata`) or a type name.
            None => SCALAR,
        }
    }

    fn call(&mut self, call: &CallExpr) -> Est {
        let strings = takes_strings(&call.func_name);
        let target = call.target.as_deref().map(|t| self.operand(t, strings));
        let args: Vec<Est> = call.args.iter().map(|a| self.operand(a, strings)).collect();
        let inputs = || target.iter().chain(&args);
        let cost = inputs().fold(0u64, |sum, e| sum.saturating_add(e.cost));
        let last = args.last().map_or(SCALAR, |a| a.bound);
        let (own, bound) = match call.func_name.as_str() {
            ITERATION => (units(&call.args), last),
            SIZE => (last.size_cost(), last),
            REPLACE => {
                let bound = replaced(target.map_or(SCALAR, |t| t.bound), &args);
                (bound.size_cost(), bound)
            }
            operators::CONDITIONAL => (
                0,
                args.get(1)
                    .zip(args.get(2))
                    .map_or(SCALAR, |(a, b)| a.bound.max(b.bound)),
            ),
            operators::INDEX | operators::OPT_INDEX | operators::OPT_SELECT => (
                0,
                args.first()
                    .map_or(SCALAR, |a| Bound::part_of(a.bound, a.bound.bytes)),
            ),
            "range" => (0, range(&call.args)),
            // Cluster objects and registry data (attestation statements, image configs) are
            // not request data: sized like a value the policy defines (the run-time meter
            // charges what is actually read).
            _ if is_cluster_read(call) || is_registry_read(call) => (0, POLICY_VALUE),
            name if yields_scalar(name) => (0, SCALAR),
            name if is_builder(name) => (
                0,
                inputs()
                    .map(|e| e.bound)
                    .reduce(Bound::plus)
                    .map_or(SCALAR, |b| Bound {
                        kind: Kind::Unknown,
                        ..b
                    }),
            ),
            _ => (
                0,
                inputs()
                    .map(|e| e.bound)
                    .reduce(Bound::plus)
                    .map_or(SCALAR, |b| Bound::part_of(b, b.bytes)),
            ),
        };
        Est {
            cost: cost.saturating_add(own),
            bound,
        }
    }

    /// An operand of a call; a string function's operands are strings (anything else fails
    /// the call), so their charge is their length, not a list's element count.
    fn operand(&mut self, e: &IdedExpr, string: bool) -> Est {
        match &e.expr {
            Expr::Call(size) if string && size.func_name == SIZE && size.args.len() == 1 => {
                let inner = self.walk(&size.args[0]);
                let bound = Bound {
                    kind: Kind::String,
                    ..inner.bound
                };
                Est {
                    cost: inner.cost.saturating_add(bound.size_cost()),
                    bound,
                }
            }
            _ => self.walk(e),
        }
    }

    fn comprehension(&mut self, c: &ComprehensionExpr) -> Est {
        let range = self.walk(&c.iter_range);
        let init = self.walk(&c.accu_init);
        let r = range.bound;
        let whole = Bound::part_of(r, r.bytes);
        let share = Bound::part_of(r, r.bytes / r.items.max(1));
        let accu = init.bound.plus(r);
        // A comprehension over `[]` (`cel.bind`'s expansion) never iterates: its result runs
        // once for each time the comprehension itself does, so outer variables keep the share
        // they have there.
        let iterates = !matches!(&c.iter_range.expr, Expr::List(l) if l.elements.is_empty());
        self.level += usize::from(iterates);
        let level = self.level;
        let bind = |name: &str, whole: Bound, share: Bound| Var {
            name: name.to_owned(),
            whole,
            share,
            level,
        };
        let mut vars = vec![bind(&c.iter_var, whole, share)];
        if let Some(v2) = &c.iter_var2 {
            vars.push(bind(v2, whole, share));
        }
        vars.push(bind(&c.accu_var, accu, accu));
        let pushed = vars.len();
        self.vars.extend(vars);
        let cond = self.walk(&c.loop_cond);
        let step = self.walk(&c.loop_step);
        let result = self.walk(&c.result);
        self.vars.truncate(self.vars.len() - pushed);
        self.level -= usize::from(iterates);
        let per_iteration = cond.cost.saturating_add(step.cost);
        Est {
            cost: range
                .cost
                .saturating_add(init.cost)
                .saturating_add(r.items.saturating_mul(per_iteration))
                .saturating_add(result.cost),
            bound: result.bound,
        }
    }
}

fn free(bound: Bound) -> Est {
    Est { cost: 0, bound }
}

fn literal(lit: &LiteralValue) -> Bound {
    match lit {
        LiteralValue::String(s) => Bound::string(s.inner().len() as u64),
        LiteralValue::Bytes(b) => Bound::string(b.inner().len() as u64),
        _ => SCALAR,
    }
}

fn collection(parts: &[Est]) -> Est {
    let n = parts.len() as u64;
    Est {
        cost: parts.iter().fold(0u64, |sum, e| sum.saturating_add(e.cost)),
        bound: Bound {
            kind: Kind::List,
            items: n,
            bytes: parts
                .iter()
                .fold(n, |sum, e| sum.saturating_add(e.bound.bytes)),
            fetched: !parts.is_empty() && parts.iter().all(|e| e.bound.fetched),
        },
    }
}

fn units(args: &[IdedExpr]) -> u64 {
    match args.first().map(|a| &a.expr) {
        Some(Expr::Literal(LiteralValue::Int(n))) => u64::try_from(*n.inner()).unwrap_or(0),
        _ => 0,
    }
}

/// `s.replace(old, new)`: an empty `old` inserts `new` around every character.
fn replaced(s: Bound, args: &[Est]) -> Bound {
    let new = args.get(1).map_or(0, |a| a.bound.bytes);
    Bound::string(
        s.bytes
            .saturating_add(1)
            .saturating_mul(new.saturating_add(1)),
    )
}

/// `lists.range(n)`: `n` elements when `n` is a literal.
fn range(args: &[IdedExpr]) -> Bound {
    match args.first().map(|a| &a.expr) {
        Some(Expr::Literal(LiteralValue::Int(n))) => {
            let items = u64::try_from(*n.inner()).unwrap_or(0).min(RANGE.items);
            Bound {
                kind: Kind::List,
                items,
                bytes: items.saturating_mul(8),
                fetched: false,
            }
        }
        _ => RANGE,
    }
}

/// Functions whose receiver and arguments are strings.
fn takes_strings(name: &str) -> bool {
    matches!(
        name,
        "contains"
            | "startsWith"
            | "endsWith"
            | "matches"
            | "matches$cached"
            | "find"
            | "findAll"
            | "indexOf"
            | "lastIndexOf"
            | "split"
            | "lowerAscii"
            | "upperAscii"
            | "trim"
            | "substring"
            | "charAt"
            | "reverse"
            | "quote"
            | REPLACE
    )
}

/// Functions and operators whose result is a scalar whatever their inputs' size.
fn yields_scalar(name: &str) -> bool {
    matches!(
        name,
        operators::LOGICAL_AND
            | operators::LOGICAL_OR
            | operators::LOGICAL_NOT
            | operators::EQUALS
            | operators::NOT_EQUALS
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS
            | operators::IN
            | operators::NOT_STRICTLY_FALSE
            | operators::NEGATE
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO
            | "size"
            | "contains"
            | "startsWith"
            | "endsWith"
            | "matches"
            | "matches$cached"
            | "indexOf"
            | "lastIndexOf"
            | "int"
            | "uint"
            | "double"
            | "bool"
            | "verifyImageSignatures"
            | "verifyAttestationSignatures"
    )
}
