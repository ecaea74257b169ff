//! `ivory convert`: Kyverno's legacy `verifyImages` rules (`ClusterPolicy` / `Policy`,
//! `kyverno.io/v1` and `v2beta1`) as `ImageValidatingPolicy` / `NamespacedImageValidatingPolicy`
//! (`policies.kyverno.io/v1`).
//!
//! [`convert_str`] reads one file's text and returns every converted policy as YAML that
//! [`ivory_policy::load_str`] loads, with a report per rule: converted exactly, converted with
//! documented differences, refused (and why), or skipped (not a `verifyImages` rule). Nothing is
//! approximated silently: a field, match form or condition without an exact equivalent is
//! refused, naming the policy, rule and field. The mapping and every difference are in
//! `docs/kyverno-semantics.md` §14.
//!
//! The legacy model is read in `model`; each rule is converted in `rule` (its entries in
//! `rule/entry.rs`) with `matching`, `conditions`, `attestors` and `images`, and reported in
//! `report` ([`RuleReport`]). Every converted policy is loaded by ivory-policy before it is
//! returned, so a conversion ivory could not load (a CEL program over the cost limit, say) is a
//! refusal with ivory's reason, never a written file. The crate serves `ivory convert` and the
//! legacy suites of `ivory test`, and is linked only by the binary, so the webhook's policy
//! crate carries no converter; it neither loads policies for use nor judges them (ivory-policy,
//! ivory-engine).
//!
//! ```
//! let legacy = r#"
//! apiVersion: kyverno.io/v1
//! kind: ClusterPolicy
//! metadata: {name: check-images}
//! spec:
//!   validationFailureAction: Enforce
//!   rules:
//!   - name: signed
//!     match: {any: [{resources: {kinds: [Pod]}}]}
//!     verifyImages:
//!     - imageReferences: ["ghcr.io/acme/*"]
//!       attestors:
//!       - entries:
//!         - keys:
//!             publicKeys: |
//!               -----BEGIN PUBLIC KEY-----
//!               MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv
//!               DLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==
//!               -----END PUBLIC KEY-----
//! "#;
//! let conversion = ivory_convert::convert_str(legacy, "policy.yaml").unwrap();
//! assert!(!conversion.refused());
//! let loaded = ivory_policy::load_str(&conversion.yaml, "converted.yaml");
//! assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
//! assert_eq!(loaded.policies[0].name, "check-images-signed");
//! ```

mod attestors;
mod conditions;
mod context;
mod error;
mod extractors;
mod identity;
mod images;
mod jmespath_cel;
mod matching;
mod model;
mod report;
mod rule;

use serde_json::Value;

pub use error::{ConvertError, ErrorKind, FieldPath};
pub use report::{Outcome, RuleReport};

use ivory_policy::types::PolicyDocument;

/// Largest legacy file accepted, in bytes: policies are small; this bounds parsing work on
/// input a user (or a CI job) hands over.
pub const MAX_INPUT_BYTES: usize = 4 * 1024 * 1024;

/// The result of converting one file.
#[derive(Clone, Debug, Default)]
pub struct Conversion {
    /// The converted policies, in input order.
    pub policies: Vec<PolicyDocument>,
    /// All converted policies as one multi-document YAML stream (empty when there are none).
    pub yaml: String,
    /// One line per rule (per `verifyImages` entry when a rule has several).
    pub reports: Vec<RuleReport>,
    /// Documents that are not legacy policies: `<origin> (doc <n>): skipped <kind> <name>`.
    pub skipped: Vec<String>,
}

impl Conversion {
    /// Whether any rule was refused: the caller should then write nothing.
    pub fn refused(&self) -> bool {
        self.reports.iter().any(RuleReport::refused)
    }
}

/// Input that cannot be read as legacy policies at all (as opposed to a refused rule, which is
/// reported in [`Conversion::reports`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {error}")]
pub struct LegacyError {
    /// `<origin>` or `<origin> (doc <n>)`, with the policy when known.
    pub location: String,
    /// What is wrong, naming the field.
    pub error: ConvertError,
}

impl LegacyError {
    /// `kind` at `location`, with no field (the input as a whole).
    fn whole(location: impl Into<String>, kind: ErrorKind) -> Self {
        Self {
            location: location.into(),
            error: ConvertError::document("", kind),
        }
    }
}

/// How to convert: what the user allows the converter to change in their policies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Apply the fixes Kyverno's own validation asks for instead of refusing the rule (as
    /// `kyverno fix` would), each reported as a difference starting with [`FIXED`]: today
    /// `mutateDigest` left on (or set) under the `Audit` failure action, which Kyverno refuses,
    /// becomes `false`.
    pub fix: bool,
}

/// How a difference the converter made under [`Options::fix`] starts in the report.
pub const FIXED: &str = "fixed (--fix): ";

/// Converts every `verifyImages` rule of the ClusterPolicy / Policy documents in `text`
/// (multi-document YAML, or JSON) with the default [`Options`] (no fixes). `origin` names the
/// source in reports and errors (a file name). Documents of other kinds are listed in
/// [`Conversion::skipped`].
pub fn convert_str(text: &str, origin: &str) -> Result<Conversion, LegacyError> {
    convert_str_with(text, origin, Options::default())
}

/// [`convert_str`] with `options`.
pub fn convert_str_with(
    text: &str,
    origin: &str,
    options: Options,
) -> Result<Conversion, LegacyError> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(LegacyError::whole(
            origin,
            ErrorKind::TooLarge {
                bytes: text.len(),
                limit: MAX_INPUT_BYTES,
            },
        ));
    }
    let documents = parse_documents(text, origin)?;
    let mut out = Conversion::default();
    for (number, doc) in documents {
        let location = format!("{origin} (doc {number})");
        convert_document(doc, &location, options, &mut out)?;
    }
    let mut names = std::collections::BTreeSet::new();
    for p in &out.policies {
        let key = (
            p.kind.clone(),
            p.metadata.namespace.clone(),
            p.metadata.name.clone(),
        );
        if !names.insert(key) {
            return Err(LegacyError::whole(
                origin,
                ErrorKind::DuplicateName {
                    name: p.metadata.name.clone(),
                },
            ));
        }
    }
    out.yaml = render(&out.policies).map_err(|kind| LegacyError::whole(origin, kind))?;
    Ok(out)
}

fn render(policies: &[PolicyDocument]) -> Result<String, ErrorKind> {
    let mut yaml = String::new();
    for p in policies {
        let text =
            ivory_policy::yaml::to_string(p).map_err(|e| ErrorKind::Unwritable(e.to_string()))?;
        yaml.push_str("---\n");
        yaml.push_str(&text);
        if !text.ends_with('\n') {
            yaml.push('\n');
        }
    }
    Ok(yaml)
}

fn parse_documents(text: &str, origin: &str) -> Result<Vec<(usize, Value)>, LegacyError> {
    if text.trim_start().starts_with(['{', '[']) {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            let reason = e.to_string();
            LegacyError::whole(
                origin,
                ErrorKind::Syntax {
                    format: "JSON",
                    reason,
                },
            )
        })?;
        return Ok(match value {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (i + 1, v))
                .collect(),
            other => vec![(1, other)],
        });
    }
    let mut docs = Vec::new();
    for doc in ivory_policy::yaml_documents(text) {
        let number = doc.number;
        let value = doc.value.map_err(|e| {
            // The parser's words alone: the format is said by the kind.
            let reason = match e {
                ivory_policy::SyntaxError::Yaml { message, .. } => message,
                other => other.to_string(),
            };
            LegacyError::whole(
                format!("{origin} (doc {number})"),
                ErrorKind::Syntax {
                    format: "YAML",
                    reason,
                },
            )
        })?;
        if !value.is_null() {
            docs.push((number, value));
        }
    }
    Ok(docs)
}

fn convert_document(
    doc: Value,
    location: &str,
    options: Options,
    out: &mut Conversion,
) -> Result<(), LegacyError> {
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if kind == "List" {
        if let Some(Value::Array(items)) = doc.get("items") {
            for item in items.clone() {
                convert_document(item, location, options, out)?;
            }
        }
        return Ok(());
    }
    let legacy_version = matches!(api_version, "kyverno.io/v1" | "kyverno.io/v2beta1");
    if !legacy_version || !matches!(kind, "ClusterPolicy" | "Policy") {
        out.skipped.push(format!(
            "{location}: skipped {api_version} {kind} {name:?}: not a kyverno.io/v1 or v2beta1 ClusterPolicy or Policy"
        ));
        return Ok(());
    }
    rule::convert_policy(&doc, kind, &name, location, options, out)
}

#[cfg(test)]
mod tests;
