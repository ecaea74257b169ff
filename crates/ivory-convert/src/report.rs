//! The per-rule report of a conversion.

use std::fmt;

use serde::Serialize;

/// How one `verifyImages` rule (one entry of it) was converted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum Outcome {
    /// The converted policy decides every request as Kyverno's legacy rule does.
    Exact,
    /// Converted; each item names a documented difference (docs/kyverno-semantics.md §14).
    WithDifferences {
        /// One sentence per difference.
        differences: Vec<String>,
    },
    /// Not converted; nothing is written for it.
    Refused {
        /// The field and why it has no ImageValidatingPolicy equivalent.
        reason: String,
    },
    /// Not a `verifyImages` rule: left alone (only `verifyImages` rules are converted).
    Skipped {
        /// Why.
        reason: String,
    },
}

/// The report line of one rule (or one `verifyImages` entry of a rule).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleReport {
    /// Where the policy came from: `<origin> (doc <n>)`.
    pub location: String,
    /// `ClusterPolicy/<name>` or `Policy/<namespace>/<name>`.
    pub policy: String,
    /// The rule's name, with `[i]` for the i-th `verifyImages` entry when it has several.
    pub rule: String,
    /// The name of the ImageValidatingPolicy written for it, when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub converted_to: Option<String>,
    /// What happened.
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl RuleReport {
    /// Whether the rule was refused.
    pub fn refused(&self) -> bool {
        matches!(self.outcome, Outcome::Refused { .. })
    }
}

impl fmt::Display for RuleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = format!("{}: {}, rule {}", self.location, self.policy, self.rule);
        let to = self
            .converted_to
            .as_deref()
            .map(|n| format!(" -> {n}"))
            .unwrap_or_default();
        match &self.outcome {
            Outcome::Exact => write!(f, "{head}{to}: converted exactly"),
            Outcome::WithDifferences { differences } => {
                write!(f, "{head}{to}: converted with documented differences")?;
                for d in differences {
                    write!(f, "\n  - {d}")?;
                }
                Ok(())
            }
            Outcome::Refused { reason } => write!(f, "{head}: refused: {reason}"),
            Outcome::Skipped { reason } => write!(f, "{head}: skipped: {reason}"),
        }
    }
}
