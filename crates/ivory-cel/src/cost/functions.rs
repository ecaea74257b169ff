//! The functions [`super::instrument`] inserts: they charge the thread's meter.

use cel::common::types::{CelBytes, CelInt, CelString};
use cel::common::value::CowVal;
use cel::{ExecutionError, FunctionContext};

use super::{Exceeded, charge, string_units};
use crate::library::registry::Registry;

/// `cost$iteration(units, value)`: charges `units`, returns `value`.
pub(crate) const ITERATION: &str = "cost$iteration";
/// `cost$size(value)`: charges the size of `value`, returns it.
pub(crate) const SIZE: &str = "cost$size";
/// `s.cost$replace(old, new[, n])`: `replace`, charging its result's size before building it.
pub(crate) const REPLACE: &str = "cost$replace";

pub(crate) fn register(registry: &mut Registry) {
    registry.add_raw(ITERATION, Box::new(iteration));
    registry.add_raw(SIZE, Box::new(size));
    registry.add_raw(REPLACE, Box::new(replace));
}

fn exceeded(e: Exceeded) -> ExecutionError {
    ExecutionError::function_error("cost", format!("CEL cost budget exceeded: {e}"))
}

/// `cost$iteration(units, value)`.
fn iteration<'c, 'd>(ftx: &mut FunctionContext<'c, 'd>) -> Result<CowVal<'c, 'd>, ExecutionError> {
    let units = ftx
        .args
        .first()
        .and_then(|a| a.downcast_ref::<CelInt>())
        .map_or(1, |n| u64::try_from(*n.inner()).unwrap_or(1));
    charge(units).map_err(exceeded)?;
    ftx.args
        .pop()
        .ok_or_else(ExecutionError::missing_argument_or_target)
}

/// `cost$size(value)`: strings and bytes by length, lists and maps by element count.
fn size<'c, 'd>(ftx: &mut FunctionContext<'c, 'd>) -> Result<CowVal<'c, 'd>, ExecutionError> {
    let value = ftx
        .args
        .pop()
        .ok_or_else(ExecutionError::missing_argument_or_target)?;
    let units = if let Some(s) = value.downcast_ref::<CelString<'_>>() {
        string_units(s.inner().len())
    } else if let Some(b) = value.downcast_ref::<CelBytes<'_>>() {
        string_units(b.inner().len())
    } else if let Some(sizer) = value.as_sizer() {
        u64::try_from(*sizer.size().inner()).unwrap_or(0)
    } else {
        0
    };
    charge(units).map_err(exceeded)?;
    Ok(value)
}

/// `s.replace(old, new[, n])`, charged for its result before it is built.
fn replace<'c, 'd>(ftx: &mut FunctionContext<'c, 'd>) -> Result<CowVal<'c, 'd>, ExecutionError> {
    let this = ftx
        .this
        .as_ref()
        .and_then(|t| t.downcast_ref::<CelString<'_>>());
    let args: Vec<Option<&CelString<'_>>> = ftx
        .args
        .iter()
        .take(2)
        .map(|a| a.downcast_ref::<CelString<'_>>())
        .collect();
    let limit = match ftx.args.get(2) {
        None => Some(-1),
        Some(n) => n.downcast_ref::<CelInt>().map(|n| *n.inner()),
    };
    let (Some(s), [Some(old), Some(new)], Some(limit)) = (this, args.as_slice(), limit) else {
        return Err(ExecutionError::function_error(
            "replace",
            "expects (string, string[, int]) on a string",
        ));
    };
    let (s, old, new) = (s.inner(), old.inner(), new.inner());
    let found = if old.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(old).count()
    };
    let count = usize::try_from(limit).map_or(found, |n| n.min(found));
    let len = s
        .len()
        .saturating_add(count.saturating_mul(new.len()))
        .saturating_sub(count.saturating_mul(old.len()));
    charge(string_units(len)).map_err(exceeded)?;
    let replaced = if limit < 0 {
        s.replace(old, new)
    } else {
        s.replacen(old, new, count)
    };
    Ok(CowVal::owned(CelString::from(replaced)))
}
