//! Kubernetes `semver` library.

use std::cmp::Ordering;

use cel::Value;
use cel::objects::Opaque;
use semver::Version;

use super::{FunctionError, Ordered, Registry, opaque, wrap};

pub(super) const SEMVER_TYPE: &str = "kubernetes.Semver";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Semver(pub Version);

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        SEMVER_TYPE
    }
}

pub(super) fn to_string(o: &dyn Opaque) -> Option<String> {
    o.downcast_ref::<Semver>().map(|v| v.0.to_string())
}

/// Strict semver; with `normalize`, a leading `v`, missing minor/patch and leading zeros
/// are accepted (`v1.02` → `1.2.0`).
pub(crate) fn parse(s: &str, normalize: bool) -> Result<Version, FunctionError> {
    let err = |e: &dyn std::fmt::Display| {
        FunctionError::Invalid(format!("could not parse {s:?} as semver: {e}"))
    };
    if !normalize {
        return Version::parse(s).map_err(|e| err(&e));
    }
    let trimmed = s.strip_prefix('v').unwrap_or(s);
    let split_at = trimmed.find(['-', '+']).unwrap_or(trimmed.len());
    let (core, rest) = trimmed.split_at(split_at);
    let mut parts: Vec<String> = core
        .split('.')
        .map(|p| {
            let t = p.trim_start_matches('0');
            if t.is_empty() && !p.is_empty() {
                "0".to_owned()
            } else {
                t.to_owned()
            }
        })
        .collect();
    while parts.len() < 3 {
        parts.push("0".to_owned());
    }
    Version::parse(&format!("{}{rest}", parts.join("."))).map_err(|e| err(&e))
}

fn construct(a: &[Value]) -> Option<Result<Version, FunctionError>> {
    match a {
        [Value::String(s)] => Some(parse(s, false)),
        [Value::String(s), Value::Bool(n)] => Some(parse(s, *n)),
        _ => None,
    }
}

impl Ordered for Semver {
    fn order(&self, other: &Self) -> Ordering {
        self.0.cmp_precedence(&other.0)
    }
}

fn member(a: &[Value], f: fn(&Version) -> u64) -> Option<Result<Value, FunctionError>> {
    match a {
        [v] => opaque::<Semver>(v).map(|s| {
            i64::try_from(f(&s.0))
                .map(Value::Int)
                .map_err(|_| FunctionError::OutOfRange("semver component overflows int".to_owned()))
        }),
        _ => None,
    }
}

pub(super) fn register(r: &mut Registry) {
    r.add("semver", |a| {
        construct(a).map(|r| r.map(|v| wrap(Semver(v))))
    });
    r.add("isSemver", |a| {
        construct(a).map(|r| Ok(Value::Bool(r.is_ok())))
    });
    r.add("major", |a| member(a, |v| v.major));
    r.add("minor", |a| member(a, |v| v.minor));
    r.add("patch", |a| member(a, |v| v.patch));
    r.add_comparisons::<Semver>();
}
