//! Policy errors in the API server's field-error style, prefixed with where the policy came from.

use std::fmt;

use crate::compiled::Origin;

/// One problem with one policy document: `<location>: <field path>: <reason>`.
///
/// `location` is `<file> (doc <n>)` for files and `<kind>/<name>` (or a caller-given label) for
/// policies without a file; `field` is empty for errors about the document as a whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// Which policy: `<file> (doc <n>)` or `<kind>/<name>`; empty when the caller adds it.
    pub location: String,
    /// Field path inside the document, e.g. `spec.attestors[0].cosign.key.data`.
    pub field: String,
    /// What is wrong, in the API server's words where it has some (`Required value`, …).
    pub reason: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.location.is_empty(), self.field.is_empty()) {
            (true, true) => f.write_str(&self.reason),
            (true, false) => write!(f, "{}: {}", self.field, self.reason),
            (false, true) => write!(f, "{}: {}", self.location, self.reason),
            (false, false) => write!(f, "{}: {}: {}", self.location, self.field, self.reason),
        }
    }
}

impl PolicyError {
    /// An error at `field` of the policy at `location`.
    pub fn new(
        location: impl Into<String>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            location: location.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// `Result` with the crate's error type.
pub type Result<T, E = PolicyError> = std::result::Result<T, E>;

/// The `<file> (doc <n>)` / `<kind>/<name>` prefix of a policy's errors.
pub(crate) fn location(origin: &Origin, fallback: &str) -> String {
    match &origin.file {
        Some(file) => format!("{} (doc {})", file.display(), origin.document),
        None => fallback.to_owned(),
    }
}

/// Field errors collected while validating one policy; the location is added at the end.
#[derive(Debug, Default)]
pub(crate) struct Errors {
    items: Vec<(String, String)>,
}

impl Errors {
    pub(crate) fn push(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.items.push((field.into(), reason.into()));
    }

    /// `Required value` (optionally with a detail), as the API server words it.
    pub(crate) fn required(&mut self, field: impl Into<String>, detail: &str) {
        self.push(field, with_detail("Required value", detail));
    }

    /// `Unsupported value: "x": supported values: "a", "b"`.
    pub(crate) fn unsupported(
        &mut self,
        field: impl Into<String>,
        value: &str,
        supported: &[&str],
    ) {
        let list = supported
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        self.push(
            field,
            format!("Unsupported value: {value:?}: supported values: {list}"),
        );
    }

    /// `Invalid value: <detail>`.
    pub(crate) fn invalid(&mut self, field: impl Into<String>, detail: impl fmt::Display) {
        self.push(field, format!("Invalid value: {detail}"));
    }

    /// `Duplicate value: "x"`.
    pub(crate) fn duplicate(&mut self, field: impl Into<String>, value: &str) {
        self.push(field, format!("Duplicate value: {value:?}"));
    }

    /// `Forbidden: <detail>`.
    pub(crate) fn forbidden(&mut self, field: impl Into<String>, detail: &str) {
        self.push(field, format!("Forbidden: {detail}"));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub(crate) fn extend(&mut self, other: Errors) {
        self.items.extend(other.items);
    }

    /// Appends `suffix` to every field (used to mark errors of autogen variants).
    pub(crate) fn with_field_suffix(self, suffix: &str) -> Errors {
        Errors {
            items: self
                .items
                .into_iter()
                .map(|(field, reason)| (format!("{field}{suffix}"), reason))
                .collect(),
        }
    }

    /// Attaches the location to every collected error.
    pub(crate) fn into_policy_errors(self, location: &str) -> Vec<PolicyError> {
        self.items
            .into_iter()
            .map(|(field, reason)| PolicyError::new(location, field, reason))
            .collect()
    }
}

fn with_detail(head: &str, detail: &str) -> String {
    if detail.is_empty() {
        head.to_owned()
    } else {
        format!("{head}: {detail}")
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn display_has_location_field_and_reason() {
        let origin = Origin {
            file: Some(PathBuf::from("policies/a.yaml")),
            document: 2,
        };
        let err = PolicyError::new(
            location(&origin, "ignored"),
            "spec.validations[0].expression",
            "undeclared reference 'imagez'",
        );
        assert_eq!(
            err.to_string(),
            "policies/a.yaml (doc 2): spec.validations[0].expression: undeclared reference 'imagez'"
        );
    }

    #[test]
    fn display_without_file_or_field() {
        let loc = location(&Origin::default(), "ImageValidatingPolicy/x");
        assert_eq!(loc, "ImageValidatingPolicy/x");
        assert_eq!(
            PolicyError::new(loc, "", "boom").to_string(),
            "ImageValidatingPolicy/x: boom"
        );
    }

    #[test]
    fn unsupported_lists_values_quoted() {
        let mut errs = Errors::default();
        errs.unsupported(
            "spec.validationActions[0]",
            "test",
            &["Deny", "Audit", "Warn"],
        );
        let out = errs.into_policy_errors("");
        assert_eq!(
            out[0].to_string(),
            r#"spec.validationActions[0]: Unsupported value: "test": supported values: "Deny", "Audit", "Warn""#
        );
    }
}
