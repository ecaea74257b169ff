//! Unknown `spec` fields. The API server rejects them under strict field validation (kubectl's
//! default); a typo such as `validationConfiguration` would otherwise silently keep the defaults.

use serde_json::Value;

/// Paths of keys in `input` that did not survive deserialisation into `parsed` (the typed spec
/// serialised back). Empty values are ignored because serialisation omits them.
pub(crate) fn unknown_fields(input: &Value, parsed: &Value, path: &str, out: &mut Vec<String>) {
    match (input, parsed) {
        (Value::Object(inp), Value::Object(out_map)) => {
            for (key, value) in inp {
                let field = format!("{path}.{key}");
                match out_map.get(key).or_else(|| out_map.get(&alias(key))) {
                    Some(parsed_value) => unknown_fields(value, parsed_value, &field, out),
                    None if is_empty(value) => {}
                    None => out.push(field),
                }
            }
        }
        (Value::Array(inp), Value::Array(parsed_items)) if inp.len() == parsed_items.len() => {
            for (i, (a, b)) in inp.iter().zip(parsed_items).enumerate() {
                unknown_fields(a, b, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The CRD spells `source.PullSecrets` with a capital P; the documented `pullSecrets` is accepted.
fn alias(key: &str) -> String {
    match key {
        "pullSecrets" => "PullSecrets".to_owned(),
        other => other.to_owned(),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn unknown(input: Value, parsed: Value) -> Vec<String> {
        let mut out = Vec::new();
        unknown_fields(&input, &parsed, "spec", &mut out);
        // Map iteration order depends on serde_json's `preserve_order` feature.
        out.sort();
        out
    }

    #[test]
    fn finds_typos_at_any_depth() {
        assert_eq!(
            unknown(
                json!({"validationConfiguration": {"required": false}, "attestors": [{"name": "a", "cosgin": {"key": {}}}]}),
                json!({"attestors": [{"name": "a"}]})
            ),
            ["spec.attestors[0].cosgin", "spec.validationConfiguration"]
        );
    }

    #[test]
    fn ignores_empty_values_and_the_pull_secrets_alias() {
        assert!(unknown(
            json!({"matchConditions": [], "images": null, "x": {}, "source": {"pullSecrets": [{"name": "s"}]}}),
            json!({"source": {"PullSecrets": [{"name": "s"}]}})
        )
        .is_empty());
    }
}
