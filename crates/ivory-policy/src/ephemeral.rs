//! Pods and their ephemeral containers.
//!
//! `kubectl debug` adds a container to a running pod through an UPDATE of the
//! `pods/ephemeralcontainers` subresource, which a rule naming `pods` does not select in
//! Kubernetes (nor in Kyverno, which asks for the subresource to be listed). A policy written
//! for pods is meant for every container a pod runs, so ivory widens each rule that selects
//! core pods for CREATE or UPDATE to that subresource, in the engine and in the webhooks it
//! generates. Exclude rules are widened the same way, so excluding pods excludes their debug
//! containers too.

use crate::types::NamedRuleWithOperations;

/// The subresource `kubectl debug` writes ephemeral containers through.
pub const EPHEMERAL_CONTAINERS: &str = "pods/ephemeralcontainers";

/// Resource patterns that already select the ephemeral containers subresource.
const COVERING: [&str; 4] = [
    EPHEMERAL_CONTAINERS,
    "pods/*",
    "*/*",
    "*/ephemeralcontainers",
];

fn any_of(items: &[String], wanted: &[&str]) -> bool {
    items.iter().any(|i| wanted.contains(&i.as_str()))
}

/// Whether `rule` selects core v1 pods for CREATE or UPDATE.
pub fn selects_pods(rule: &NamedRuleWithOperations) -> bool {
    any_of(&rule.api_groups, &["", "*"])
        && any_of(&rule.api_versions, &["v1", "*"])
        && any_of(&rule.resources, &["pods", "*"])
        && any_of(&rule.operations, &["CREATE", "UPDATE", "*"])
}

/// The `pods/ephemeralcontainers` UPDATE rule `rule` implies, unless `rule` does not select
/// pods or already selects that subresource for UPDATE.
pub fn implied_rule(rule: &NamedRuleWithOperations) -> Option<NamedRuleWithOperations> {
    let covered = any_of(&rule.resources, &COVERING) && any_of(&rule.operations, &["UPDATE", "*"]);
    (selects_pods(rule) && !covered).then(|| NamedRuleWithOperations {
        api_groups: vec![String::new()],
        api_versions: vec!["v1".to_owned()],
        operations: vec!["UPDATE".to_owned()],
        resources: vec![EPHEMERAL_CONTAINERS.to_owned()],
        resource_names: rule.resource_names.clone(),
        scope: rule.scope.clone(),
    })
}

/// `rules` followed by the ephemeral-container rules they imply (each once).
pub fn with_ephemeral_containers(
    mut rules: Vec<NamedRuleWithOperations>,
) -> Vec<NamedRuleWithOperations> {
    let implied: Vec<NamedRuleWithOperations> = rules.iter().filter_map(implied_rule).collect();
    for rule in implied {
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(
        ops: &[&str],
        groups: &[&str],
        versions: &[&str],
        resources: &[&str],
    ) -> NamedRuleWithOperations {
        let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
        NamedRuleWithOperations {
            operations: owned(ops),
            api_groups: owned(groups),
            api_versions: owned(versions),
            resources: owned(resources),
            ..NamedRuleWithOperations::default()
        }
    }

    #[test]
    fn pod_rules_imply_the_subresource() {
        let implied = rule(&["UPDATE"], &[""], &["v1"], &[EPHEMERAL_CONTAINERS]);
        for r in [
            rule(&["CREATE"], &[""], &["v1"], &["pods"]),
            rule(&["CREATE", "UPDATE"], &[""], &["v1"], &["pods"]),
            rule(&["*"], &["*"], &["*"], &["*"]),
            rule(&["UPDATE"], &[""], &["*"], &["pods", "configmaps"]),
            // Listed, but for CREATE only: the subresource is only ever UPDATEd.
            rule(&["CREATE"], &[""], &["v1"], &["pods", EPHEMERAL_CONTAINERS]),
        ] {
            assert_eq!(implied_rule(&r), Some(implied.clone()), "{r:?}");
        }
        for r in [
            rule(
                &["CREATE", "UPDATE"],
                &[""],
                &["v1"],
                &["pods", EPHEMERAL_CONTAINERS],
            ),
            rule(&["*"], &[""], &["v1"], &["pods/*"]),
            rule(&["DELETE"], &[""], &["v1"], &["pods"]),
            rule(&["CREATE"], &["apps"], &["v1"], &["deployments"]),
            rule(&["CREATE"], &[""], &["v1beta1"], &["pods"]),
            rule(&["CREATE"], &[""], &["v1"], &["configmaps"]),
        ] {
            assert_eq!(implied_rule(&r), None, "{r:?}");
        }
    }

    #[test]
    fn implied_rules_keep_names_and_scope_and_are_added_once() {
        let mut pods = rule(&["CREATE"], &[""], &["v1"], &["pods"]);
        pods.resource_names = vec!["web".to_owned()];
        pods.scope = Some("Namespaced".to_owned());
        let rules = with_ephemeral_containers(vec![pods.clone(), pods.clone()]);
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[2].resources, [EPHEMERAL_CONTAINERS]);
        assert_eq!(rules[2].resource_names, ["web"]);
        assert_eq!(rules[2].scope.as_deref(), Some("Namespaced"));
    }
}
