//! Conversions between serde_json and CEL values.

use std::collections::HashMap;
use std::sync::Arc;

use cel::Value;
use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use cel::common::value::Val;
use cel::objects::{Key, Map, OptionalValue};

use crate::EvalError;
use crate::library::type_name;

/// JSON → CEL runtime value, built directly in the interpreter's representation so that
/// binding costs one traversal.
pub(crate) fn json_to_val(v: &serde_json::Value) -> Box<dyn Val> {
    match v {
        serde_json::Value::Null => Box::new(CelNull),
        serde_json::Value::Bool(b) => Box::new(CelBool::from(*b)),
        serde_json::Value::Number(n) => number_val(n),
        serde_json::Value::String(s) => Box::new(CelString::from(s.clone())),
        serde_json::Value::Array(items) => Box::new(CelList::from(
            items.iter().map(json_to_val).collect::<Vec<_>>(),
        )),
        serde_json::Value::Object(obj) => {
            let map: HashMap<CelMapKey<'static>, Box<dyn Val>> = obj
                .iter()
                .map(|(k, v)| (CelMapKey::from(k.clone()), json_to_val(v)))
                .collect();
            Box::new(CelMap::from(map))
        }
    }
}

/// A map of string lists → CEL runtime value, without a JSON tree in between (the same value
/// [`json_to_val`] makes of the map's JSON).
pub(crate) fn string_lists_to_val(
    map: &std::collections::BTreeMap<String, Vec<String>>,
) -> Box<dyn Val> {
    let map: HashMap<CelMapKey<'static>, Box<dyn Val>> = map
        .iter()
        .map(|(key, list)| {
            let items: Vec<Box<dyn Val>> = list
                .iter()
                .map(|s| Box::new(CelString::from(s.clone())) as Box<dyn Val>)
                .collect();
            (
                CelMapKey::from(key.clone()),
                Box::new(CelList::from(items)) as Box<dyn Val>,
            )
        })
        .collect();
    Box::new(CelMap::from(map))
}

fn number_val(n: &serde_json::Number) -> Box<dyn Val> {
    if let Some(i) = n.as_i64() {
        Box::new(CelInt::from(i))
    } else if let Some(u) = n.as_u64() {
        Box::new(CelUInt::from(u))
    } else {
        Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN)))
    }
}

/// JSON → [`Value`] (the owned enum used by host results and `bind_value`).
pub fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::UInt(u)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(items) => {
            Value::List(Arc::new(items.iter().map(json_to_value).collect()))
        }
        serde_json::Value::Object(obj) => {
            let map: HashMap<Key, Value> = obj
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), json_to_value(v)))
                .collect();
            Value::Map(Map { map: Arc::new(map) })
        }
    }
}

/// CEL value → JSON. Bytes become base64 strings, optionals their value (or null), the
/// library's object types their string form; functions and non-finite floats are errors.
pub fn value_to_json(v: &Value) -> Result<serde_json::Value, EvalError> {
    Ok(match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Int(i) => serde_json::Value::from(*i),
        Value::UInt(u) => serde_json::Value::from(*u),
        Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(serde_json::Value::Number)
            .ok_or_else(|| EvalError::NotJson(format!("double {f}")))?,
        Value::String(s) => serde_json::Value::String(s.as_str().to_owned()),
        Value::Bytes(b) => {
            use base64::Engine as _;
            serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(&**b))
        }
        Value::List(items) => serde_json::Value::Array(
            items
                .iter()
                .map(value_to_json)
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Value::Map(m) => {
            let mut out = serde_json::Map::with_capacity(m.map.len());
            for (k, v) in m.map.iter() {
                out.insert(key_string(k), value_to_json(v)?);
            }
            serde_json::Value::Object(out)
        }
        Value::Duration(d) => {
            serde_json::Value::String(format!("{}s", d.num_milliseconds() as f64 / 1000.0))
        }
        Value::Timestamp(t) => serde_json::Value::String(t.to_rfc3339()),
        Value::Opaque(o) => {
            if let Some(opt) = o.downcast_ref::<OptionalValue>() {
                match opt.value() {
                    Some(inner) => value_to_json(inner)?,
                    None => serde_json::Value::Null,
                }
            } else if let Some(s) = crate::library::opaque_to_string(o.as_ref()) {
                serde_json::Value::String(s)
            } else {
                return Err(EvalError::NotJson(o.runtime_type_name().to_owned()));
            }
        }
        other => return Err(EvalError::NotJson(type_name(other))),
    })
}

fn key_string(k: &Key) -> String {
    match k {
        Key::Int(i) => i.to_string(),
        Key::Uint(u) => u.to_string(),
        Key::Bool(b) => b.to_string(),
        Key::String(s) => s.as_str().to_owned(),
    }
}

/// `Some(inner)` for a present optional or a plain value, `None` for an empty optional.
pub(crate) fn unwrap_optional(v: Value) -> Option<Value> {
    if let Value::Opaque(o) = &v
        && let Some(opt) = o.downcast_ref::<OptionalValue>()
    {
        return opt.value().cloned();
    }
    Some(v)
}

/// A wall-clock time as a CEL timestamp (UTC).
pub(crate) fn wall_time_value(time: std::time::SystemTime) -> Value {
    let utc: chrono::DateTime<chrono::Utc> = time.into();
    Value::Timestamp(utc.fixed_offset())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_roundtrip_keeps_structure_and_number_kinds() {
        let j =
            json!({"a": [1, -2, 18446744073709551615u64, 1.5, "s", null, true], "b": {"c": {}}});
        let back = value_to_json(&json_to_value(&j)).unwrap();
        assert_eq!(back, j);
    }

    #[test]
    fn bytes_become_base64_and_nan_is_an_error() {
        assert_eq!(
            value_to_json(&Value::Bytes(Arc::new(b"hi".to_vec()))).unwrap(),
            json!("aGk=")
        );
        assert!(value_to_json(&Value::Float(f64::NAN)).is_err());
    }

    #[test]
    fn json_to_val_converts_to_the_same_value() {
        let j = json!({"k": [1, "x", {"y": false}]});
        let val = json_to_val(&j);
        let v = Value::try_from(val.as_ref()).unwrap();
        assert_eq!(value_to_json(&v).unwrap(), j);
    }

    #[test]
    fn optionals_unwrap() {
        let none = Value::Opaque(Arc::new(OptionalValue::none()));
        assert_eq!(unwrap_optional(none), None);
        let some = Value::Opaque(Arc::new(OptionalValue::of(Value::Int(1))));
        assert_eq!(unwrap_optional(some), Some(Value::Int(1)));
        assert_eq!(unwrap_optional(Value::Null), Some(Value::Null));
    }
}
