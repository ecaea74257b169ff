//! A legacy rule's `imageExtractors` as ImageValidatingPolicy `images` extractors.
//!
//! Kyverno (`pkg/utils/api/image.go`, `extract`) walks each extractor's slash-separated
//! `path` from the object: a field of an object (nothing when absent, an error when the
//! value walked through is not an object), `*` over a list (its object elements) or over an
//! object (its object and list values); at the end, the `value` field is the image when it is
//! a non-blank string. The extractors of a kind replace Kyverno's built-in ones for that kind
//! and are bound as `images.<name>` (`custom` without a name). The CEL written here walks the
//! same way: `null` for an absent field, the interpreter's error for a field read through a
//! list or a scalar (and for a `key` field that is not a string), and only for objects of the
//! extractor's kind. Kyverno keys each image by its `key` field, so of two images under one key
//! it verifies one; the converted policy verifies both. A list element that is itself a list
//! (Kyverno walks into it with the same path) is skipped.

use std::collections::{BTreeMap, BTreeSet};

use ivory_policy::types::NamedExpression;
use serde::Deserialize;
use serde_json::Value;

use super::error::ConvertError;
use super::images::cel_string;

/// Kinds whose images an ImageValidatingPolicy extracts by itself (and Kyverno's legacy
/// built-in extractors read): custom extractors for them would not replace the built-in ones.
const BUILT_IN_KINDS: [&str; 8] = [
    "Pod",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "ReplicationController",
    "Job",
    "CronJob",
];

/// The `images` lists an ImageValidatingPolicy fills from containers, as Kyverno's legacy
/// built-in extractors fill them (OCI image volumes are not among them).
pub(crate) const BUILT_IN_LISTS: [&str; 3] =
    ["containers", "initContainers", "ephemeralContainers"];

/// One entry of `imageExtractors.<Kind>`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExtractorConfig {
    path: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    jmes_path: String,
}

/// What a rule's `imageExtractors` became.
#[derive(Debug, Default)]
pub(crate) struct Extractors {
    /// The kinds (bare names, as Kyverno keys them) the extractors are for.
    pub kinds: BTreeSet<String>,
    /// One `images` extractor per name, its expression covering every kind.
    pub images: Vec<NamedExpression>,
}

impl Extractors {
    /// The `images.<name>` lists the rule's validations must cover.
    pub(crate) fn lists(&self) -> Vec<String> {
        self.images.iter().map(|i| i.name.clone()).collect()
    }
}

/// Reads `imageExtractors` (a map of kind → extractor list); `None` when absent. Errors name
/// the field from `imageExtractors` down.
pub(crate) fn convert(value: Option<&Value>) -> Result<Option<Extractors>, ConvertError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let configs: BTreeMap<String, Vec<ExtractorConfig>> =
        serde_path_to_error::deserialize(value.clone()).map_err(|e| {
            let kind = super::error::ErrorKind::Schema(e.inner().to_string());
            ConvertError::new(format!("imageExtractors.{}", e.path()), kind)
        })?;
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut out = Extractors::default();
    for (kind, list) in &configs {
        if BUILT_IN_KINDS.contains(&kind.as_str()) {
            return Err(ConvertError::unsupported(
                format!("imageExtractors.{kind}"),
                "custom extractors for a kind whose containers an ImageValidatingPolicy always \
                 extracts are not converted (Kyverno would read only the custom paths; the \
                 converted policy would verify the containers too)",
            ));
        }
        for (i, config) in list.iter().enumerate() {
            let at = format!("imageExtractors.{kind}[{i}]");
            let walk = walk(config).map_err(|e| e.under(&at))?;
            let name = if config.name.is_empty() {
                "custom"
            } else {
                config.name.as_str()
            };
            if BUILT_IN_LISTS.contains(&name) {
                return Err(ConvertError::unsupported(
                    format!("{at}.name"),
                    format!("{name:?} is an image list an ImageValidatingPolicy fills itself"),
                ));
            }
            by_name.entry(name.to_owned()).or_default().push(format!(
                "(object.kind == {} ? {walk} : [])",
                cel_string(kind)
            ));
        }
        out.kinds.insert(kind.clone());
    }
    out.images = by_name
        .into_iter()
        .map(|(name, parts)| NamedExpression {
            name,
            expression: parts.join(" + "),
        })
        .collect();
    Ok(Some(out))
}

/// The CEL list of images one extractor finds in `object`.
fn walk(config: &ExtractorConfig) -> Result<String, ConvertError> {
    if !config.jmes_path.is_empty() {
        return Err(ConvertError::unsupported(
            ".jmesPath",
            "a JMESPath over the extracted value is not converted",
        ));
    }
    let mut fields: Vec<&str> = config
        .path
        .split('/')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .collect();
    let value = if config.value.is_empty() {
        fields.pop().ok_or_else(|| {
            ConvertError::invalid(".path", "names no field (and no value is given)")
        })?
    } else {
        config.value.as_str()
    };
    if value == "*" {
        return Err(ConvertError::invalid(
            ".value",
            "the image field cannot be `*`",
        ));
    }
    let mut list = "[object]".to_owned();
    for field in fields {
        list = if field == "*" {
            wildcard_step(&list)
        } else {
            field_step(&list, field)
        };
    }
    Ok(image_step(&list, &config.key, value))
}

/// Each present value's `field`: `null` when an object lacks it (Kyverno finds nothing
/// there), the interpreter's error when the value is not an object (Kyverno's "invalid image
/// config").
fn field_step(list: &str, field: &str) -> String {
    let f = cel_string(field);
    format!(
        "{list}.filter(o, o != null).map(o, type(o) == map ? ({f} in o ? o[{f}] : null) : o[{f}])"
    )
}

/// `*`: a list's object elements, an object's object and list values; a scalar is an error.
fn wildcard_step(list: &str) -> String {
    format!(
        "{list}.filter(o, o != null).map(o, type(o) == list ? o.filter(e, type(e) == map) : \
         (type(o) == map ? o.map(k, o[k]).filter(e, type(e) == map || type(e) == list) : \
         o['*'])).flatten()"
    )
}

/// Each present object's `value` when it is a non-blank string. With a `key`, Kyverno first
/// reads the object's `key` field and fails the rule ("invalid key") unless it is a string,
/// image or not: an absent key is the interpreter's missing-key error, another type its
/// no-overload error of `+`.
fn image_step(list: &str, key: &str, value: &str) -> String {
    let v = cel_string(value);
    let image = format!("{v} in o && type(o[{v}]) == string && o[{v}].trim() != ''");
    // A conditional, not `&&`: CEL's `&&` would let a false image test absorb the key's error.
    let checked = if key.is_empty() {
        image
    } else {
        let k = cel_string(key);
        format!("((type(o[{k}]) == string || o[{k}] + '' == '') ? {image} : false)")
    };
    format!("{list}.filter(o, o != null && (type(o) != map || {checked})).map(o, o[{v}])")
}

#[cfg(test)]
mod tests;
