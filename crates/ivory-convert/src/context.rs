//! A rule's `context` entries that read ConfigMaps, as `resource.Get` in CEL.
//!
//! Kyverno v1.19 loads a `configMap` entry before the rule runs
//! (`pkg/engine/context/loaders/configmap.go`): the ConfigMap `name` in `namespace` (default:
//! the policy's own namespace for a Policy, `default` for a ClusterPolicy; a Policy may read
//! no other namespace), put under the entry's name with its `data`, so `{{ keys.data.prod }}`
//! reads one value. A ConfigMap that cannot be read is an error of the rule. In an
//! ImageValidatingPolicy the same read is `resource.Get("v1", "configmaps", ns, name)`, whose
//! failure the failurePolicy decides. Only the place legacy policies use it converts: a key
//! read from a ConfigMap (`keys.publicKeys: "{{ keys.data.<key> }}"`, where `<key>` may be
//! `{{request.namespace}}`), as the key's CEL `expression`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::{ConvertError, ErrorKind};
use super::images::cel_string;

/// One `configMap` context entry: the ConfigMap it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ConfigMapRef {
    namespace: String,
    name: String,
}

/// A rule's ConfigMap context entries by name.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConfigMaps(BTreeMap<String, ConfigMapRef>);

impl ConfigMaps {
    /// The rule's `context` (at `context`), or an error naming the entry that is not a plain
    /// `configMap` read. `policy_namespace` is the Policy's namespace (`None`: a ClusterPolicy).
    pub(crate) fn read(
        context: &[Value],
        policy_namespace: Option<&str>,
    ) -> Result<Self, ConvertError> {
        let mut out = BTreeMap::new();
        for (i, entry) in context.iter().enumerate() {
            let at = format!("context[{i}]");
            let (name, reference) = config_map_entry(entry, policy_namespace, &at)?;
            if out.insert(name.clone(), reference).is_some() {
                return Err(ConvertError::invalid(
                    format!("{at}.name"),
                    format!("{name:?} is defined twice"),
                ));
            }
        }
        Ok(Self(out))
    }

    /// Whether `name` is one of the entries.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The CEL expression for `text` when it is exactly `{{ <entry>.data.<key> }}` over one of
    /// these entries (`<key>` a plain key, or `{{request.namespace}}`): `None` when `text` names
    /// none of them.
    pub(crate) fn data_expression(&self, text: &str) -> Option<Result<String, ErrorKind>> {
        let inner = text.trim().strip_prefix("{{")?.strip_suffix("}}")?.trim();
        let (entry, rest) = inner.split_once('.')?;
        let reference = self.0.get(entry.trim())?;
        let get = format!(
            "resource.Get('v1', 'configmaps', {}, {})",
            cel_string(&reference.namespace),
            cel_string(&reference.name)
        );
        Some(data_key(rest.trim()).map(|key| format!("{get}.data[{key}]")))
    }
}

/// `data.<key>` after the entry name: the CEL index of the key.
fn data_key(path: &str) -> Result<String, ErrorKind> {
    let refused = || {
        ErrorKind::VariableNotAllowed(format!(
            "{path:?}: only data.<key> of a ConfigMap context entry is converted (the key plain \
             or {{{{request.namespace}}}})"
        ))
    };
    let key = path.strip_prefix("data.").ok_or_else(refused)?.trim();
    let nested = key
        .strip_prefix("{{")
        .and_then(|k| k.strip_suffix("}}"))
        .map(str::trim);
    match nested {
        Some("request.namespace") => Ok("request.namespace".to_owned()),
        Some(_) => Err(refused()),
        None if !key.is_empty() && !key.contains(['{', '}', '[', ']', '.', '|', '(']) => {
            Ok(cel_string(key.trim_matches('"')))
        }
        None => Err(refused()),
    }
}

/// One context entry: its name and ConfigMap, or an error naming the field.
fn config_map_entry(
    entry: &Value,
    policy_namespace: Option<&str>,
    at: &str,
) -> Result<(String, ConfigMapRef), ConvertError> {
    let name = entry
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ConvertError::invalid(format!("{at}.name"), "Required value"))?;
    let Some(config_map) = entry.get("configMap") else {
        let source = entry
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "name"))
            .cloned()
            .unwrap_or_default();
        return Err(ConvertError::unsupported(
            format!("{at}.{source}"),
            "only configMap context entries are converted (API calls, image data, global \
             context and variables are not)",
        ));
    };
    let literal = |field: &str| -> Result<Option<String>, ConvertError> {
        let value = config_map.get(field).and_then(Value::as_str).unwrap_or("");
        if value.contains("{{") {
            return Err(ConvertError::variable(
                format!("{at}.configMap.{field}"),
                "{{ }} variables in a ConfigMap reference are not converted",
            ));
        }
        Ok((!value.is_empty()).then(|| value.to_owned()))
    };
    let cm_name = literal("name")?
        .ok_or_else(|| ConvertError::invalid(format!("{at}.configMap.name"), "Required value"))?;
    let namespace = match (literal("namespace")?, policy_namespace) {
        (Some(ns), Some(own)) if ns != own => {
            return Err(ConvertError::invalid(
                format!("{at}.configMap.namespace"),
                format!(
                    "{ns:?} is not the policy's namespace {own:?}: Kyverno refuses a \
                     cross-namespace ConfigMap for a Policy"
                ),
            ));
        }
        (Some(ns), _) => ns,
        (None, Some(own)) => own.to_owned(),
        (None, None) => "default".to_owned(),
    };
    Ok((
        name.to_owned(),
        ConfigMapRef {
            namespace,
            name: cm_name,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_map_keys_become_resource_get_and_other_entries_are_named() {
        let maps = ConfigMaps::read(
            &[json!({"name": "keys", "configMap": {"name": "keys", "namespace": "default"}})],
            None,
        )
        .unwrap();
        let get = r#"resource.Get("v1", "configmaps", "default", "keys")"#;
        let cases = [
            (
                "{{ keys.data.production }}",
                format!("{get}.data['production']"),
            ),
            (
                "{{ keys.data.{{request.namespace}} }}",
                format!("{get}.data[request.namespace]"),
            ),
        ];
        for (text, cel) in cases {
            let got = maps.data_expression(text).unwrap().unwrap();
            assert_eq!(got.replace('"', "'"), cel.replace('"', "'"), "{text}");
        }
        assert!(maps.data_expression("{{ other.data.x }}").is_none());
        assert!(
            maps.data_expression("{{ keys.metadata.name }}")
                .unwrap()
                .is_err()
        );
        let api = ConfigMaps::read(
            &[json!({"name": "x", "apiCall": {"urlPath": "/api"}})],
            None,
        )
        .unwrap_err();
        assert_eq!(api.path.field(), "context[0].apiCall");
        let cross = ConfigMaps::read(
            &[json!({"name": "k", "configMap": {"name": "k", "namespace": "other"}})],
            Some("shop"),
        )
        .unwrap_err();
        assert_eq!(cross.path.field(), "context[0].configMap.namespace");
    }

    #[test]
    fn the_namespace_defaults_as_kyvernos() {
        let entry = [json!({"name": "k", "configMap": {"name": "cm"}})];
        for (policy, want) in [(None, "default"), (Some("shop"), "shop")] {
            let maps = ConfigMaps::read(&entry, policy).unwrap();
            let cel = maps.data_expression("{{ k.data.a }}").unwrap().unwrap();
            assert!(cel.contains(&format!("'{want}'")), "{cel}");
        }
    }
}
