//! Kubernetes `quantity` library. Values are kept exactly in nano-units (Kubernetes rounds
//! quantities up to nano precision too); magnitudes beyond ~1e29 are rejected.

use std::cmp::Ordering;

use cel::Value;
use cel::objects::Opaque;

use super::{FunctionError, Ordered, Registry, opaque, wrap};

pub(super) const QUANTITY_TYPE: &str = "kubernetes.Quantity";
const NANO: i128 = 1_000_000_000;

#[derive(Debug, Clone)]
pub(crate) struct Quantity {
    original: String,
    nanos: i128,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        QUANTITY_TYPE
    }
}

pub(super) fn to_string(o: &dyn Opaque) -> Option<String> {
    o.downcast_ref::<Quantity>().map(|q| q.original.clone())
}

/// Parses `<signedNumber><suffix>` (binary SI `Ki…Ei`, decimal SI `n u m k M G T P E`,
/// or decimal exponent `e<n>`/`E<n>`).
pub(crate) fn parse(s: &str) -> Result<Quantity, FunctionError> {
    let err = || {
        FunctionError::Invalid(format!(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {s:?}"
        ))
    };
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let num_len = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(num_len);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return Err(err());
    }
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 36 {
        return Err(too_large(s));
    }
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| err())?
    };
    let frac_len = i64::try_from(frac_part.len()).map_err(|_| err())?;
    let (pow2, pow10) = suffix_powers(suffix).ok_or_else(err)?;
    let nanos = scale(mantissa, pow2, pow10 + 9 - frac_len).ok_or_else(|| too_large(s))?;
    Ok(Quantity {
        original: s.to_owned(),
        nanos: if negative { -nanos } else { nanos },
    })
}

fn too_large(s: &str) -> FunctionError {
    FunctionError::OutOfRange(format!("quantity {s:?} is out of the supported range"))
}

/// (power of two, power of ten) of a suffix.
fn suffix_powers(suffix: &str) -> Option<(u32, i64)> {
    Some(match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => {
            let exp = suffix.strip_prefix(['e', 'E'])?;
            let sign_ok = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if sign_ok.is_empty()
                || !sign_ok.chars().all(|c| c.is_ascii_digit())
                || sign_ok.len() > 4
            {
                return None;
            }
            (0, exp.parse().ok()?)
        }
    })
}

/// `m * 2^pow2 * 10^pow10`, rounded up to an integer; `None` on overflow.
fn scale(m: i128, pow2: u32, pow10: i64) -> Option<i128> {
    let mut v = m.checked_mul(1i128.checked_shl(pow2)?)?;
    if pow10 >= 0 {
        let p = 10i128.checked_pow(u32::try_from(pow10).ok()?)?;
        v = v.checked_mul(p)?;
    } else {
        let neg = u32::try_from(-pow10).ok()?;
        if neg > 38 {
            return Some(i128::from(v > 0));
        }
        let p = 10i128.checked_pow(neg)?;
        v = v / p + i128::from(v % p != 0);
    }
    if v.abs() > 10i128.pow(36) {
        None
    } else {
        Some(v)
    }
}

fn as_integer(q: &Quantity) -> Result<i64, FunctionError> {
    if q.nanos % NANO != 0 {
        return Err(FunctionError::OutOfRange(format!(
            "cannot convert value to integer: {} is not a whole number",
            q.original
        )));
    }
    i64::try_from(q.nanos / NANO).map_err(|_| {
        FunctionError::OutOfRange(format!(
            "cannot convert value to integer: {} overflows int",
            q.original
        ))
    })
}

fn operand(v: &Value) -> Option<i128> {
    match v {
        Value::Int(i) => Some(i128::from(*i) * NANO),
        other => opaque::<Quantity>(other).map(|q| q.nanos),
    }
}

fn format_nanos(n: i128) -> String {
    if n % NANO == 0 {
        (n / NANO).to_string()
    } else {
        format!("{n}n")
    }
}

fn arith(a: &[Value], sub: bool) -> Option<Result<Value, FunctionError>> {
    let [q, other] = a else { return None };
    let q = opaque::<Quantity>(q)?;
    let rhs = operand(other)?;
    let rhs = if sub { -rhs } else { rhs };
    Some(
        q.nanos
            .checked_add(rhs)
            .filter(|n| n.abs() <= 10i128.pow(36))
            .map(|nanos| {
                wrap(Quantity {
                    original: format_nanos(nanos),
                    nanos,
                })
            })
            .ok_or_else(|| FunctionError::OutOfRange("quantity arithmetic overflow".to_owned())),
    )
}

impl Ordered for Quantity {
    fn order(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

fn member(
    a: &[Value],
    f: fn(&Quantity) -> Result<Value, FunctionError>,
) -> Option<Result<Value, FunctionError>> {
    match a {
        [v] => opaque::<Quantity>(v).map(f),
        _ => None,
    }
}

pub(super) fn register(r: &mut Registry) {
    r.add("quantity", |a| match a {
        [Value::String(s)] => Some(parse(s).map(wrap)),
        _ => None,
    });
    r.add("isQuantity", |a| match a {
        [Value::String(s)] => Some(Ok(Value::Bool(parse(s).is_ok()))),
        _ => None,
    });
    r.add("isInteger", |a| {
        member(a, |q| Ok(Value::Bool(as_integer(q).is_ok())))
    });
    r.add("asInteger", |a| {
        member(a, |q| as_integer(q).map(Value::Int))
    });
    r.add("asApproximateFloat", |a| {
        member(a, |q| Ok(Value::Float(q.nanos as f64 / NANO as f64)))
    });
    r.add("sign", |a| {
        member(a, |q| Ok(Value::Int(q.nanos.signum() as i64)))
    });
    r.add("add", |a| arith(a, false));
    r.add("sub", |a| arith(a, true));
    r.add_comparisons::<Quantity>();
}
