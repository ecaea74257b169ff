//! Requests a policy is blind to by its own `matchConstraints`, said at load time.
//!
//! Kubernetes lets an UPDATE change a Pod's `spec.containers[*].image` (and a controller's pod
//! template), so a rule that selects Pods or controllers for CREATE only never sees an image
//! swapped in afterwards. Kyverno loads such a policy silently; ivory loads it too (the author
//! may mean it) but says so, once per load, naming the rule.

use crate::compiled::CompiledPolicy;
use crate::types::NamedRuleWithOperations;

/// Resources whose objects carry container images that an UPDATE may change.
const IMAGE_CARRIERS: [&str; 10] = [
    "*",
    "pods",
    "deployments",
    "replicasets",
    "statefulsets",
    "daemonsets",
    "jobs",
    "cronjobs",
    "replicationcontrollers",
    "podtemplates",
];

/// One warning per `spec.matchConstraints.resourceRules[i]` that selects image-carrying
/// resources for CREATE but not for UPDATE.
pub fn blind_spots(policy: &CompiledPolicy) -> Vec<String> {
    let Some(constraints) = &policy.spec.match_constraints else {
        return Vec::new();
    };
    constraints
        .resource_rules
        .iter()
        .enumerate()
        .filter(|(_, rule)| create_only(rule))
        .map(|(i, rule)| {
            format!(
                "{}: spec.matchConstraints.resourceRules[{i}] selects {} for CREATE but not UPDATE: \
                 an UPDATE can change their container images, and this policy never sees it; \
                 add UPDATE to operations",
                policy.name,
                carriers(rule).join(", ")
            )
        })
        .collect()
}

fn create_only(rule: &NamedRuleWithOperations) -> bool {
    let has = |op: &str| rule.operations.iter().any(|o| o == op || o == "*");
    has("CREATE") && !has("UPDATE") && !carriers(rule).is_empty()
}

fn carriers(rule: &NamedRuleWithOperations) -> Vec<&str> {
    rule.resources
        .iter()
        .map(String::as_str)
        .filter(|r| IMAGE_CARRIERS.contains(r))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_str;

    fn policy(operations: &str, resources: &str) -> CompiledPolicy {
        let yaml = format!(
            "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata: {{name: p}}
spec:
  matchConstraints:
    resourceRules:
      - apiGroups: [\"\", apps]
        apiVersions: [v1]
        operations: {operations}
        resources: {resources}
  attestors: []
  validations:
    - expression: \"true\"
"
        );
        let mut report = load_str(&yaml, "p.yaml");
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        report.policies.remove(0)
    }

    #[test]
    fn create_only_rules_on_image_carriers_are_named() {
        let warnings = blind_spots(&policy("[CREATE]", "[pods, deployments, configmaps]"));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0]
                .contains("resourceRules[0] selects pods, deployments for CREATE but not UPDATE"),
            "{warnings:?}"
        );
        for (ops, resources) in [
            ("[CREATE, UPDATE]", "[pods]"),
            ("[\"*\"]", "[pods]"),
            ("[CREATE]", "[configmaps]"),
            ("[UPDATE]", "[pods]"),
        ] {
            assert!(
                blind_spots(&policy(ops, resources)).is_empty(),
                "{ops} {resources}"
            );
        }
    }
}
