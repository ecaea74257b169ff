//! One legacy policy's `verifyImages` rules → ImageValidatingPolicies (one per entry): the
//! policy-wide context, names, defaults and autogen; each entry is converted by [`entry`].

mod entry;

use std::collections::BTreeMap;

use serde_json::Value;

use super::attestors::{self, Converted, Inherited, SetCheck};
use super::error::{ConvertError, ErrorKind};
use super::images;
use super::matching;
use super::model::{
    self, Attestor, AttestorSet, ImageVerification, Keyless, Rule, Spec, StaticKey,
};
use super::report::{Outcome, RuleReport};
use super::{Conversion, FIXED, LegacyError, Options, conditions};
use entry::{ConvertedEntry, convert_entry};
use ivory_policy::types::{
    Attestation, Attestor as PolicyAttestor, Autogen, Credentials, Enabled, Evaluation,
    MatchImageReference, MatchResources as Constraints, NamedExpression, ObjectMeta,
    PodControllers, PolicyDocument, PolicySpec, TypeRef, Validation, ValidationConfigurations,
    WebhookConfiguration,
};

/// Annotation naming the legacy rule a converted policy came from.
pub(crate) const SOURCE_ANNOTATION: &str = "ivory.dev/converted-from";

/// Policy-wide settings every converted rule shares.
struct PolicyContext<'a> {
    kind: &'a str,
    name: &'a str,
    namespace: Option<String>,
    /// Policy-wide differences every converted rule reports.
    notes: Vec<String>,
    spec: Spec,
    autogen_annotation: Option<String>,
    location: &'a str,
    /// `ClusterPolicy/<name>` or `Policy/<namespace>/<name>`, for the reports.
    label: String,
    options: Options,
}

/// Converts every `verifyImages` entry of one ClusterPolicy / Policy, adding a report per
/// entry (and per other rule) and the converted policies to `out`. Refused entries are
/// reported; only a policy that cannot be read at all is an error.
pub(crate) fn convert_policy(
    doc: &Value,
    kind: &str,
    name: &str,
    location: &str,
    options: Options,
    out: &mut Conversion,
) -> Result<(), LegacyError> {
    let ctx = policy_context(doc, kind, name, location, options)?;
    let rules = ctx.spec.rules.clone();
    let policy_refusal = policy_refusal(&ctx.spec);
    // Kyverno generates pod-controller rules only when every rule of the policy allows it
    // (`CanAutoGen`: no names, selector or annotations, only Pod kinds, in any rule).
    let autogen_everywhere = rules.iter().all(rule_allows_autogen);
    // Reports in input order; converted policies are finished once all rules are seen.
    let mut lines: Vec<Result<ConvertedEntry, RuleReport>> = Vec::new();
    for (rule_index, rule) in rules.iter().enumerate() {
        if rule.verify_images.is_empty() {
            lines.push(Err(report(
                &ctx,
                &rule.name,
                None,
                Outcome::Skipped {
                    reason: "not a verifyImages rule (only verifyImages rules are converted)"
                        .to_owned(),
                },
            )));
            continue;
        }
        let many = rule.verify_images.len() > 1;
        for (i, entry) in rule.verify_images.iter().enumerate() {
            let rule_label = if many {
                format!("{}[{i}]", rule.name)
            } else {
                rule.name.clone()
            };
            let result = match &policy_refusal {
                Some(refusal) => Err(refusal.clone()),
                None => convert_entry(&ctx, rule, entry, i, many),
            };
            let result = result.and_then(|(mut doc, differences)| {
                if !autogen_everywhere {
                    doc.spec.autogen = Some(no_autogen());
                }
                loads(&doc).map(|()| (doc, differences))
            });
            lines.push(match result {
                Ok((doc, differences)) => Ok((rule_label, doc, differences)),
                Err(error) => {
                    let reason = error.in_rule(rule_index).to_string();
                    Err(report(&ctx, &rule_label, None, Outcome::Refused { reason }))
                }
            });
        }
    }
    for line in lines {
        let (rule_label, doc, differences) = match line {
            Ok(converted) => converted,
            Err(line) => {
                out.reports.push(line);
                continue;
            }
        };
        let outcome = if differences.is_empty() {
            Outcome::Exact
        } else {
            Outcome::WithDifferences { differences }
        };
        let to = Some(doc.metadata.name.clone());
        out.reports.push(report(&ctx, &rule_label, to, outcome));
        out.policies.push(doc);
    }
    Ok(())
}

/// The policy-wide settings: name, namespace, `spec` and the autogen annotation. A policy
/// without a name or `spec`, or whose `spec` does not fit the schema, cannot be read at all.
fn policy_context<'a>(
    doc: &Value,
    kind: &'a str,
    name: &'a str,
    location: &'a str,
    options: Options,
) -> Result<PolicyContext<'a>, LegacyError> {
    let label = match doc.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if kind == "Policy" => format!("Policy/{ns}/{name}"),
        _ => format!("{kind}/{name}"),
    };
    let err = |error: ConvertError| LegacyError {
        location: format!("{location}: {label}"),
        error,
    };
    let required = |field: &str| err(ConvertError::document(field, invalid("Required value")));
    if name.is_empty() {
        return Err(required("metadata.name"));
    }
    let namespace = doc
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|ns| !ns.is_empty())
        .map(str::to_owned);
    // kubectl puts a Policy without a namespace into its context's namespace, and the Kyverno
    // CLI's test suites leave it out: the conversion uses `default` and says so.
    let mut notes = Vec::new();
    let namespace = if kind == "Policy" && namespace.is_none() {
        notes.push(
            "metadata.namespace: not set; the NamespacedImageValidatingPolicy is put in namespace \
             default (where kubectl's default context would put the Policy)"
                .to_owned(),
        );
        Some("default".to_owned())
    } else {
        namespace
    };
    let spec_value = doc.get("spec").cloned().unwrap_or(Value::Null);
    if spec_value.is_null() {
        return Err(required("spec"));
    }
    let spec: Spec = serde_path_to_error::deserialize(spec_value).map_err(|e| {
        let kind = ErrorKind::Schema(e.inner().to_string());
        err(ConvertError::document(format!("spec.{}", e.path()), kind))
    })?;
    let autogen_annotation = doc
        .pointer("/metadata/annotations/pod-policies.kyverno.io~1autogen-controllers")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(PolicyContext {
        kind,
        name,
        namespace: if kind == "Policy" { namespace } else { None },
        notes,
        spec,
        autogen_annotation,
        location,
        label,
        options,
    })
}

/// [`ErrorKind::Invalid`] with `reason`.
fn invalid(reason: &str) -> ErrorKind {
    ErrorKind::Invalid(reason.to_owned())
}

/// Kyverno's `checkAutogenSupport` over a rule's match and exclude.
fn rule_allows_autogen(rule: &Rule) -> bool {
    let descriptions = [rule.match_.as_ref(), rule.exclude.as_ref()]
        .into_iter()
        .flatten()
        .flat_map(|m| {
            m.resources
                .iter()
                .chain(m.any.iter().filter_map(|f| f.resources.as_ref()))
                .chain(m.all.iter().filter_map(|f| f.resources.as_ref()))
        });
    descriptions.into_iter().all(|d| {
        d.name.as_deref().is_none_or(str::is_empty)
            && d.names.is_empty()
            && d.selector.is_none()
            && d.annotations.is_none()
            && d.kinds.iter().all(|k| k.rsplit('/').next() == Some("Pod"))
    })
}

fn report(ctx: &PolicyContext<'_>, rule: &str, to: Option<String>, outcome: Outcome) -> RuleReport {
    RuleReport {
        location: ctx.location.to_owned(),
        policy: ctx.label.clone(),
        rule: rule.to_owned(),
        converted_to: to,
        outcome,
    }
}

/// Policy-wide settings no converted rule can keep: every `verifyImages` rule is refused.
fn policy_refusal(spec: &Spec) -> Option<ConvertError> {
    if spec
        .validation_failure_action_overrides
        .as_ref()
        .is_some_and(|o| !o.is_empty())
    {
        return Some(ConvertError::document(
            "spec.validationFailureActionOverrides",
            ErrorKind::Unsupported("per-namespace actions are not converted".to_owned()),
        ));
    }
    let verify_rules = spec
        .rules
        .iter()
        .filter(|r| !r.verify_images.is_empty())
        .count();
    if spec.apply_rules.as_deref() == Some("One") && spec.rules.len() > 1 && verify_rules > 0 {
        return Some(ConvertError::document(
            "spec.applyRules",
            ErrorKind::Unsupported("One with several rules is not converted".to_owned()),
        ));
    }
    None
}

fn no_autogen() -> Autogen {
    Autogen {
        pod_controllers: Some(PodControllers {
            controllers: Some(Vec::new()),
        }),
    }
}

/// A DNS-1123 name from the policy and rule names.
fn policy_name(policy: &str, rule: &str, index: Option<usize>) -> Result<String, ConvertError> {
    let mut raw = format!("{policy}-{rule}");
    if let Some(i) = index {
        raw.push_str(&format!("-{i}"));
    }
    let mut name = String::with_capacity(raw.len());
    for c in raw.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() || c == '.' {
            name.push(c);
        } else if !name.ends_with('-') {
            name.push('-');
        }
    }
    let name = name.trim_matches(|c| c == '-' || c == '.').to_owned();
    if name.is_empty() || name.len() > 253 {
        // The names come from the rule (and policy): the error concerns the rule as a whole.
        return Err(ConvertError::new("", ErrorKind::Unnameable { raw }));
    }
    Ok(name)
}

/// Kyverno's `Convert()` of the deprecated rule-level fields (`image`, `key`, `issuer`,
/// `subject`, `roots`, `annotations`).
fn legacy_defaults(
    mut iv: ImageVerification,
    field: &str,
    differences: &mut Vec<String>,
) -> ImageVerification {
    if iv
        .additional_extensions
        .as_ref()
        .is_some_and(|m| !m.is_empty())
    {
        differences.push(format!("{field}.additionalExtensions: Kyverno ignores this deprecated rule-level field; so does the conversion"));
    }
    let key = iv.key.take().filter(|k| !k.is_empty());
    let issuer = iv.issuer.take().filter(|k| !k.is_empty());
    let subject = iv.subject.take().filter(|k| !k.is_empty());
    let roots = iv.roots.take().filter(|k| !k.is_empty());
    if let Some(image) = iv.image.take().filter(|i| !i.is_empty()) {
        iv.image_references.push(image);
    }
    if key.is_none() && issuer.is_none() {
        if subject.is_some() || roots.is_some() {
            differences.push(format!(
                "{field}.subject/roots: ignored without issuer, as Kyverno ignores them"
            ));
        }
        return iv;
    }
    let attestor = Attestor {
        keys: key.map(|k| StaticKey {
            public_keys: Some(k),
            ..StaticKey::default()
        }),
        keyless: if issuer.is_some() {
            Some(Keyless {
                issuer,
                subject,
                roots,
                ..Keyless::default()
            })
        } else {
            None
        },
        annotations: iv.annotations.clone(),
        ..Attestor::default()
    };
    let set = AttestorSet {
        count: None,
        entries: vec![attestor],
    };
    if iv.attestations.is_empty() {
        iv.attestors.push(set);
    } else {
        for a in &mut iv.attestations {
            a.attestors.push(set.clone());
        }
    }
    iv
}

/// The autogen annotation as the policy's `autogen`.
fn autogen(
    ctx: &PolicyContext<'_>,
    differences: &mut Vec<String>,
) -> Result<Option<Autogen>, ConvertError> {
    let Some(annotation) = ctx.autogen_annotation.as_deref() else {
        return Ok(None);
    };
    if annotation.trim() == "none" {
        return Ok(Some(no_autogen()));
    }
    let mut controllers = Vec::new();
    for kind in annotation
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
    {
        let plural = match kind {
            "DaemonSet" => "daemonsets",
            "Deployment" => "deployments",
            "ReplicaSet" => "replicasets",
            "StatefulSet" => "statefulsets",
            "Job" => "jobs",
            "CronJob" => "cronjobs",
            "ReplicationController" => {
                differences.push("pod-policies.kyverno.io/autogen-controllers: ReplicationController has no ImageValidatingPolicy autogen; its Pods are still checked when they are created".to_owned());
                continue;
            }
            other => {
                return Err(ConvertError::document(
                    "metadata.annotations[pod-policies.kyverno.io/autogen-controllers]",
                    ErrorKind::Invalid(format!("unknown controller {other:?}")),
                ));
            }
        };
        controllers.push(plural.to_owned());
    }
    Ok(Some(Autogen {
        pod_controllers: Some(PodControllers {
            controllers: Some(controllers),
        }),
    }))
}

/// The converted policy must load in ivory; if it does not (a CEL program over the cost limit,
/// say), the rule is refused with ivory's reason instead of being written.
/// Its errors concern the rule as a whole (the field they name is the converted policy's).
fn loads(doc: &PolicyDocument) -> Result<(), ConvertError> {
    let text = ivory_policy::yaml::to_string(doc)
        .map_err(|e| ConvertError::new("", ErrorKind::Unwritable(e.to_string())))?;
    let report = ivory_policy::load_str(&text, "converted");
    match report.errors.first() {
        None => Ok(()),
        Some(e) => Err(ConvertError::new(
            "",
            ErrorKind::UnloadableOutput {
                field: e.field.to_string(),
                reason: e.reason.to_string(),
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FieldPath;
    use serde_json::json;

    /// The error convert_policy reports for rule 0's first entry, placed under the rule.
    fn refusal(policy: Value) -> ConvertError {
        let ctx =
            policy_context(&policy, "ClusterPolicy", "p", "t.yaml", Options::default()).unwrap();
        let rule = &ctx.spec.rules[0];
        convert_entry(&ctx, rule, &rule.verify_images[0], 0, false)
            .unwrap_err()
            .in_rule(0)
    }

    fn policy(spec: Value) -> Value {
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
               "metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn refusals_carry_the_full_field_path_and_what_is_wrong() {
        let e = refusal(policy(
            json!({"validationFailureAction": "Enforce", "rules": [{
            "name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "verifyImages": [{"imageReferences": ["*"],
                              "attestors": [{"entries": [{"keys": {"kms": "awskms:///k"}}]}]}]}]}),
        ));
        assert_eq!(
            e.path.to_string(),
            "spec.rules[0].verifyImages[0].attestors[0].entries[0].keys.kms"
        );
        assert!(matches!(e.kind, ErrorKind::Unsupported(_)), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("verifyImages[0].attestors[0].entries[0].keys.kms: KMS keys"),
            "{e}"
        );
    }

    #[test]
    fn policy_wide_fields_stay_rooted_at_the_document() {
        let e = refusal(policy(json!({"validationFailureAction": "Enforce",
            "failurePolicy": "Sometimes", "rules": [{
            "name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "verifyImages": [{"imageReferences": ["*"], "required": false}]}]})));
        assert_eq!(e.path, FieldPath::Document("spec.failurePolicy".to_owned()));
        assert!(matches!(e.kind, ErrorKind::Invalid(_)), "{e:?}");
    }

    #[test]
    fn condition_operands_name_the_operator() {
        let e = refusal(policy(
            json!({"validationFailureAction": "Enforce", "rules": [{
            "name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "verifyImages": [{"imageReferences": ["*"], "attestations": [{"type": "t",
                "attestors": [{"entries": [{"keyless": {"roots": "r"}}]}],
                "conditions": [{"all": [{"key": "{{ a }}", "operator": "Equals",
                                         "value": "{{ b }}"}]}]}]}]}]}),
        ));
        assert_eq!(
            e.path.to_string(),
            "spec.rules[0].verifyImages[0].attestations[0].conditions[0].all[0]"
        );
        let ErrorKind::Operator { operator, cause } = &e.kind else {
            panic!("{e:?}");
        };
        assert_eq!(operator, "Equals");
        assert!(matches!(**cause, ErrorKind::VariableNotAllowed(_)), "{e:?}");
        assert!(
            e.to_string().starts_with(
                "verifyImages[0].attestations[0].conditions[0].all[0] (operator Equals): value \
                 {{ b }}: a variable as the value is not converted"
            ),
            "{e}"
        );
    }
}
