//! What the library's functions are collected in before the library is built: overloads by
//! name, and functions that need the call context.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use cel::common::value::CowVal;
use cel::{ExecutionError, FunctionContext, Value};

use super::{FunctionError, opaque};

/// A library function overload: gets the receiver (if any) followed by the arguments;
/// `None` means "these argument types are not mine".
pub(crate) type Handler = fn(&[Value]) -> Option<Result<Value, FunctionError>>;

pub(crate) type Func = Box<
    dyn for<'c, 'd> Fn(&mut FunctionContext<'c, 'd>) -> Result<CowVal<'c, 'd>, ExecutionError>
        + Send
        + Sync,
>;

#[derive(Default)]
pub(crate) struct Registry {
    pub(super) handlers: BTreeMap<&'static str, Vec<Handler>>,
    pub(super) raw: Vec<(&'static str, Func)>,
}

impl Registry {
    pub(crate) fn add(&mut self, name: &'static str, handler: Handler) {
        self.handlers.entry(name).or_default().push(handler);
    }

    /// A function that needs the call context (e.g. to reach the host).
    pub(crate) fn add_raw(&mut self, name: &'static str, f: Func) {
        self.raw.push((name, f));
    }

    /// The Kubernetes comparison members of an ordered library type: `x.compareTo(y)` (-1, 0,
    /// 1), `x.isGreaterThan(y)` and `x.isLessThan(y)`.
    pub(crate) fn add_comparisons<T: Ordered>(&mut self) {
        self.add("compareTo", |a| {
            compare::<T>(a).map(|o| Ok(Value::Int(o as i64)))
        });
        self.add("isGreaterThan", |a| {
            compare::<T>(a).map(|o| Ok(Value::Bool(o.is_gt())))
        });
        self.add("isLessThan", |a| {
            compare::<T>(a).map(|o| Ok(Value::Bool(o.is_lt())))
        });
    }
}

/// A library type with an order of its own (quantities by value, semvers by precedence), for
/// [`Registry::add_comparisons`].
pub(crate) trait Ordered: 'static {
    fn order(&self, other: &Self) -> Ordering;
}

/// Receiver and argument both of type `T`: their order; otherwise not this overload.
fn compare<T: Ordered>(a: &[Value]) -> Option<Ordering> {
    let [x, y] = a else { return None };
    Some(opaque::<T>(x)?.order(opaque::<T>(y)?))
}
