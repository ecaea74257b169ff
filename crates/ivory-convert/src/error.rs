//! Why a legacy document, rule or field is not converted: the field path it concerns and what
//! is wrong with it.
//!
//! The message texts follow Kyverno's (`<field>: Required value`, `Unsupported value: …`) where
//! Kyverno would refuse the policy too, so a user sees the same words from both tools.

use std::fmt;

/// Where a problem is in a legacy policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldPath {
    /// A field from the document's root (`spec.failurePolicy`, `metadata.name`); empty for the
    /// document as a whole.
    Document(String),
    /// A field of rule `index` (`spec.rules[index]`), from the rule down
    /// (`verifyImages[1].attestors[0].entries[0].keys`); empty for the rule as a whole.
    Rule {
        /// The rule's index in `spec.rules`.
        index: usize,
        /// The field under the rule.
        field: String,
    },
    /// A field from wherever the converter was reading (`.key` inside a condition,
    /// `verifyImages[0]…` inside a rule): errors are made where the problem is seen, and each
    /// caller on the way up puts its own place before the field. Errors leaving the crate are
    /// placed ([`Document`](Self::Document) or [`Rule`](Self::Rule)).
    Relative(String),
}

impl FieldPath {
    /// The field as a report names it: from the rule down when under a rule (the report line
    /// names the rule), from the document's root otherwise.
    pub fn field(&self) -> &str {
        match self {
            Self::Document(field) | Self::Rule { field, .. } | Self::Relative(field) => field,
        }
    }
}

/// The full path from the document's root: `spec.rules[0].verifyImages[1].attestors[0]…`.
impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rule { index, field } if field.is_empty() => write!(f, "spec.rules[{index}]"),
            Self::Rule { index, field } => write!(f, "spec.rules[{index}].{field}"),
            Self::Document(field) | Self::Relative(field) => f.write_str(field),
        }
    }
}

/// What is wrong. The texts say it without the field; [`ConvertError`] puts the field first.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    /// Kyverno refuses it too: a required value is missing, or a value is not one Kyverno
    /// accepts.
    #[error("{0}")]
    Invalid(String),
    /// The field does not fit Kyverno's schema: unknown, or of the wrong type (serde's words).
    #[error("{0}")]
    Schema(String),
    /// A field, value or form with no exact ImageValidatingPolicy equivalent.
    #[error("{0}")]
    Unsupported(String),
    /// `{{ }}` variables (context, ConfigMap lookups) where the conversion needs literal text:
    /// their value is only known to Kyverno at admission.
    #[error("{0}")]
    VariableNotAllowed(String),
    /// A condition that is not `any` / `all` blocks of `{key, operator, value}`.
    #[error("{0}")]
    MalformedCondition(String),
    /// A condition whose operands its operator cannot be translated for; the operator is named
    /// after the field.
    #[error("{cause}")]
    Operator {
        /// The condition's `operator`.
        operator: String,
        /// Why its operands are not translated.
        cause: Box<ErrorKind>,
    },
    /// The converted policy does not load in ivory (a CEL program over the cost limit, say).
    #[error("the converted policy does not load in ivory: {field}: {reason}")]
    UnloadableOutput {
        /// The field of the converted policy ivory refuses.
        field: String,
        /// ivory's reason.
        reason: String,
    },
    /// The converted policy cannot be written as YAML.
    #[error("cannot write YAML: {0}")]
    Unwritable(String),
    /// The policy and rule names make no Kubernetes name.
    #[error("cannot make a policy name from {raw:?} (at most 253 characters)")]
    Unnameable {
        /// `<policy>-<rule>[-<i>]`, as written.
        raw: String,
    },
    /// The input is not YAML or JSON.
    #[error("{format} syntax error: {reason}")]
    Syntax {
        /// `JSON` or `YAML`.
        format: &'static str,
        /// The parser's words.
        reason: String,
    },
    /// The input is larger than [`MAX_INPUT_BYTES`](crate::MAX_INPUT_BYTES).
    #[error("input is {bytes} bytes, more than the {limit} accepted")]
    TooLarge {
        /// The input's size.
        bytes: usize,
        /// The largest size accepted.
        limit: usize,
    },
    /// Two converted policies would have the same kind, namespace and name.
    #[error("two converted policies would both be named {name:?}; rename a rule")]
    DuplicateName {
        /// The name both would have.
        name: String,
    },
}

/// A legacy document, rule or field that is not converted.
///
/// Displays as `<field>: <what>` (as Kyverno words its validation errors), the field as
/// [`FieldPath::field`] gives it, since a report line names the policy and rule already;
/// [`FieldPath`]'s own display is the full path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConvertError {
    /// The field it concerns.
    pub path: FieldPath,
    /// What is wrong with it.
    pub kind: ErrorKind,
}

impl ConvertError {
    /// `kind` at `field`, relative to where the converter is reading (placed by its callers).
    pub(crate) fn new(field: impl Into<String>, kind: ErrorKind) -> Self {
        Self {
            path: FieldPath::Relative(field.into()),
            kind,
        }
    }

    /// `kind` at `field` from the document's root (policy-wide fields, the input as a whole).
    pub(crate) fn document(field: impl Into<String>, kind: ErrorKind) -> Self {
        Self {
            path: FieldPath::Document(field.into()),
            kind,
        }
    }

    /// [`ErrorKind::Invalid`] at `field`.
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(field, ErrorKind::Invalid(reason.into()))
    }

    /// [`ErrorKind::Unsupported`] at `field`.
    pub(crate) fn unsupported(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(field, ErrorKind::Unsupported(reason.into()))
    }

    /// [`ErrorKind::VariableNotAllowed`] at `field`.
    pub(crate) fn variable(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(field, ErrorKind::VariableNotAllowed(reason.into()))
    }

    /// [`ErrorKind::MalformedCondition`] at `field`.
    pub(crate) fn condition(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(field, ErrorKind::MalformedCondition(reason.into()))
    }

    /// The same error with `parent` put before its field: errors are made where the field is
    /// known only from the inside (a condition's `.key`), and their callers add where that
    /// sits (`verifyImages[0].attestations[0].conditions[0].all[1]`).
    pub(crate) fn under(mut self, parent: &str) -> Self {
        if let FieldPath::Relative(field) = &mut self.path {
            field.insert_str(0, parent);
        }
        self
    }

    /// The same error placed under rule `index` of the policy, unless it is placed already (a
    /// policy-wide field found while converting a rule).
    pub(crate) fn in_rule(mut self, index: usize) -> Self {
        if let FieldPath::Relative(field) = &mut self.path {
            let field = std::mem::take(field);
            self.path = FieldPath::Rule { index, field };
        }
        self
    }
}

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = self.path.field();
        match &self.kind {
            ErrorKind::Operator { operator, cause } => {
                write!(f, "{field} (operator {operator}): {cause}")
            }
            kind if field.is_empty() => write!(f, "{kind}"),
            kind => write!(f, "{field}: {kind}"),
        }
    }
}
