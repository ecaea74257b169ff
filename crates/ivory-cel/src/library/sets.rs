//! cel-go `ext.Sets`: `sets.contains`, `sets.equivalent`, `sets.intersects`.

use cel::Value;

use super::Registry;

fn lists(a: &[Value]) -> Option<(&[Value], &[Value])> {
    match a {
        [Value::List(x), Value::List(y)] => Some((x.as_slice(), y.as_slice())),
        _ => None,
    }
}

/// CEL equality, with numbers compared by value across int/uint/double.
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Int(x), Value::UInt(y)) | (Value::UInt(y), Value::Int(x)) => {
            u64::try_from(*x).is_ok_and(|x| x == *y)
        }
        (Value::Int(x), Value::Float(y)) | (Value::Float(y), Value::Int(x)) => *x as f64 == *y,
        (Value::UInt(x), Value::Float(y)) | (Value::Float(y), Value::UInt(x)) => *x as f64 == *y,
        _ => a == b,
    }
}

fn contains_all(haystack: &[Value], needles: &[Value]) -> bool {
    needles.iter().all(|n| haystack.iter().any(|h| equal(h, n)))
}

pub(super) fn register(r: &mut Registry) {
    r.add("sets.contains", |a| {
        lists(a).map(|(x, y)| Ok(Value::Bool(contains_all(x, y))))
    });
    r.add("sets.equivalent", |a| {
        lists(a).map(|(x, y)| Ok(Value::Bool(contains_all(x, y) && contains_all(y, x))))
    });
    r.add("sets.intersects", |a| {
        lists(a).map(|(x, y)| Ok(Value::Bool(y.iter().any(|n| x.iter().any(|h| equal(h, n))))))
    });
}
