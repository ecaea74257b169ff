//! Legacy `verifyImages` rules in a test suite: converted exactly as `ivory convert` converts
//! them (`ivory_convert`), one ImageValidatingPolicy per rule, and each `results` row
//! about `<policy>`/`<rule>` answered by the policy written for that rule.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use ivory_policy::CompiledPolicy;

use super::suite;

/// Kyverno's prefixes of the rules it generates for controllers from a Pod rule.
const AUTOGEN_PREFIXES: [&str; 2] = ["autogen-cronjob-", "autogen-"];

/// The legacy policies of one test, converted.
#[derive(Default)]
pub(super) struct Converted {
    /// The ImageValidatingPolicies written for the rules.
    pub(super) policies: Vec<Arc<CompiledPolicy>>,
    /// `(legacy policy name, rule)` → the converted policy's name.
    names: BTreeMap<(String, String), String>,
}

impl Converted {
    /// The converted policy that answers a row about `policy`'s `rule` (a rule Kyverno
    /// generated for controllers answers as the Pod rule it came from).
    pub(super) fn policy_for(&self, policy: &str, rule: &str) -> Option<&str> {
        let base = AUTOGEN_PREFIXES
            .iter()
            .find_map(|p| rule.strip_prefix(p))
            .unwrap_or(rule);
        self.names
            .get(&(policy.to_owned(), base.to_owned()))
            .map(String::as_str)
    }

    /// Whether `policy` is a converted legacy policy of the test.
    pub(super) fn has_policy(&self, policy: &str) -> bool {
        self.names.keys().any(|(p, _)| p == policy)
    }
}

/// Converts the `files` holding legacy `verifyImages` rules. A rule the converter refuses
/// makes the test unrunnable, naming it: it would otherwise be judged by nothing.
pub(super) fn convert<'a>(files: impl IntoIterator<Item = &'a Path>) -> anyhow::Result<Converted> {
    let mut converted = Converted::default();
    for file in files {
        let origin = file.display().to_string();
        let text = suite::read_input(file)?;
        let conversion = ivory_convert::convert_str(&text, &origin)
            .with_context(|| format!("converting legacy policies of {origin}"))?;
        if conversion.refused() {
            let refused: Vec<String> = conversion
                .reports
                .iter()
                .filter(|r| r.refused())
                .map(ToString::to_string)
                .collect();
            bail!(
                "{origin}: legacy verifyImages rules ivory cannot run: {}",
                refused.join("; ")
            );
        }
        let report = ivory_policy::load_str(&conversion.yaml, &origin);
        if let Some(e) = report.errors.first() {
            bail!("{origin}: a converted policy does not load: {e}");
        }
        converted
            .policies
            .extend(report.policies.into_iter().map(Arc::new));
        for r in &conversion.reports {
            if let Some(name) = &r.converted_to {
                let legacy = r.policy.rsplit('/').next().unwrap_or(&r.policy);
                let rule = r.rule.split('[').next().unwrap_or(&r.rule);
                converted
                    .names
                    .insert((legacy.to_owned(), rule.to_owned()), name.clone());
            }
        }
    }
    Ok(converted)
}
