//! One legacy policy's `verifyImages` rules → ImageValidatingPolicies (one per entry).

use std::collections::BTreeMap;

use serde_json::Value;

use super::attestors::{self, Converted, Inherited, SetCheck};
use super::images;
use super::matching;
use super::model::{Attestor, AttestorSet, ImageVerification, Keyless, Rule, Spec, StaticKey};
use super::report::{Outcome, RuleReport};
use super::{Conversion, LegacyError, conditions};
use ivory_policy::types::{
    Attestation, Autogen, Credentials, Enabled, Evaluation, MatchImageReference, NamedExpression,
    ObjectMeta, PodControllers, PolicyDocument, PolicySpec, TypeRef, Validation,
    ValidationConfigurations, WebhookConfiguration,
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
}

pub(crate) fn convert_policy(
    doc: &Value,
    kind: &str,
    name: &str,
    location: &str,
    out: &mut Conversion,
) -> Result<(), LegacyError> {
    let label = match doc.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if kind == "Policy" => format!("Policy/{ns}/{name}"),
        _ => format!("{kind}/{name}"),
    };
    let err = |message: String| LegacyError {
        location: format!("{location}: {label}"),
        message,
    };
    if name.is_empty() {
        return Err(err("metadata.name: Required value".to_owned()));
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
        return Err(err("spec: Required value".to_owned()));
    }
    let spec: Spec = serde_path_to_error::deserialize(spec_value)
        .map_err(|e| err(format!("spec.{}: {}", e.path(), e.inner())))?;
    let autogen_annotation = doc
        .pointer("/metadata/annotations/pod-policies.kyverno.io~1autogen-controllers")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let ctx = PolicyContext {
        kind,
        name,
        namespace: if kind == "Policy" { namespace } else { None },
        notes,
        spec,
        autogen_annotation,
        location,
    };
    let rules = ctx.spec.rules.clone();
    let policy_refusal = policy_refusal(&ctx.spec);
    // Kyverno generates pod-controller rules only when every rule of the policy allows it
    // (`CanAutoGen`: no names, selector or annotations, only Pod kinds, in any rule).
    let autogen_everywhere = rules.iter().all(rule_allows_autogen);
    // Reports in input order; converted policies are finished once all rules are seen.
    let mut lines: Vec<Result<ConvertedEntry, RuleReport>> = Vec::new();
    for rule in &rules {
        if rule.verify_images.is_empty() {
            lines.push(Err(report(
                &ctx,
                &label,
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
                Some(reason) => Err(reason.clone()),
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
                Err(reason) => Err(report(
                    &ctx,
                    &label,
                    &rule_label,
                    None,
                    Outcome::Refused { reason },
                )),
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
        out.reports.push(report(
            &ctx,
            &label,
            &rule_label,
            Some(doc.metadata.name.clone()),
            outcome,
        ));
        out.policies.push(doc);
    }
    Ok(())
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

fn report(
    ctx: &PolicyContext<'_>,
    label: &str,
    rule: &str,
    to: Option<String>,
    outcome: Outcome,
) -> RuleReport {
    RuleReport {
        location: ctx.location.to_owned(),
        policy: label.to_owned(),
        rule: rule.to_owned(),
        converted_to: to,
        outcome,
    }
}

fn policy_refusal(spec: &Spec) -> Option<String> {
    if spec
        .validation_failure_action_overrides
        .as_ref()
        .is_some_and(|o| !o.is_empty())
    {
        return Some(
            "spec.validationFailureActionOverrides: per-namespace actions are not converted"
                .to_owned(),
        );
    }
    let verify_rules = spec
        .rules
        .iter()
        .filter(|r| !r.verify_images.is_empty())
        .count();
    if spec.apply_rules.as_deref() == Some("One") && spec.rules.len() > 1 && verify_rules > 0 {
        return Some("spec.applyRules: One with several rules is not converted".to_owned());
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
fn policy_name(policy: &str, rule: &str, index: Option<usize>) -> Result<String, String> {
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
        return Err(format!(
            "cannot make a policy name from {raw:?} (at most 253 characters)"
        ));
    }
    Ok(name)
}

type Entry = (PolicyDocument, Vec<String>);

/// A converted entry: its report label, the policy and its documented differences.
type ConvertedEntry = (String, PolicyDocument, Vec<String>);

fn convert_entry(
    ctx: &PolicyContext<'_>,
    rule: &Rule,
    entry: &Value,
    index: usize,
    many: bool,
) -> Result<Entry, String> {
    let field = format!("verifyImages[{index}]");
    let iv: ImageVerification = serde_path_to_error::deserialize(entry.clone())
        .map_err(|e| format!("{field}.{}: {}", e.path(), e.inner()))?;
    if !rule.context.is_empty() {
        return Err(
            "context: context entries (ConfigMaps, API calls, image data) are not converted"
                .to_owned(),
        );
    }
    if rule.image_extractors.as_ref().is_some_and(|v| !v.is_null()) {
        return Err("imageExtractors: custom image extractors are not converted".to_owned());
    }
    if iv.validate.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(format!(
            "{field}.validate: deny conditions over verifyImages are not converted"
        ));
    }
    let mut differences = ctx.notes.clone();
    let iv = legacy_defaults(iv, &field, &mut differences)?;
    let matched = matching::convert(
        rule.match_.as_ref(),
        rule.exclude.as_ref(),
        rule.preconditions.as_ref(),
    )?;

    let action = iv
        .failure_action
        .clone()
        .or_else(|| ctx.spec.validation_failure_action.clone())
        .unwrap_or_else(|| "Audit".to_owned());
    let enforce = match action.to_ascii_lowercase().as_str() {
        "enforce" => true,
        "audit" => false,
        _ => {
            return Err(format!(
                "{field}.failureAction: Unsupported value: {action:?}: supported values: \"Audit\", \"Enforce\""
            ));
        }
    };
    let mutate_digest = iv.mutate_digest.unwrap_or(true);
    let verify_digest = iv.verify_digest.unwrap_or(true);
    let legacy_required = iv.required.unwrap_or(true);
    if !enforce && mutate_digest {
        return Err(format!(
            "{field}.mutateDigest: mutateDigest must be set to false for ‘Audit’ failure action (Kyverno refuses this policy)"
        ));
    }

    let notary = match iv.type_.as_deref().unwrap_or("Cosign") {
        "Cosign" => false,
        "SigstoreBundle" => {
            differences.push(format!("{field}.type SigstoreBundle: ivory reads Sigstore bundles and cosign signatures alike, so the attestors are cosign attestors"));
            false
        }
        "Notary" => {
            differences.push(format!("{field}.type Notary: verified as Notation signatures at the strict level; revocation is judged from CRLs ivory fetches in the background, never during the admission, so until a certificate's CRL has been fetched its images are denied as of unknown revocation status (docs/kyverno-semantics.md §16)"));
            true
        }
        other => return Err(format!("{field}.type: Unsupported value: {other:?}")),
    };
    if iv.cosign_oci11 == Some(true) {
        differences.push(format!("{field}.cosignOCI11: ivory reads OCI 1.1 referrers and cosign tags alike; the flag has no equivalent"));
    }
    let inherited = Inherited {
        repository: iv.repository.clone(),
        annotations: iv.annotations.clone(),
        notary,
        expand_keys: true,
    };
    let mut converted = Converted::default();
    attestors::convert_sets(
        &iv.attestors,
        &format!("{field}.attestors"),
        "",
        &inherited,
        &mut converted,
    )?;
    let signature_checks = std::mem::take(&mut converted.checks);
    let mut attestations = Vec::new();
    let mut attestation_checks: Vec<(String, Vec<SetCheck>, Option<String>)> = Vec::new();
    for (a, att) in iv.attestations.iter().enumerate() {
        let at = format!("{field}.attestations[{a}]");
        let type_ = att
            .type_
            .clone()
            .filter(|t| !t.is_empty())
            .or_else(|| att.predicate_type.clone().filter(|t| !t.is_empty()))
            .ok_or_else(|| format!("{at}: missing type"))?;
        if att.attestors.is_empty() {
            return Err(format!(
                "{at}.attestors: an attestation without attestors is not converted (Kyverno then accepts any keyless signer)"
            ));
        }
        if notary {
            return Err(format!(
                "{at}: Notary attestations (referrers) are not converted"
            ));
        }
        let name = format!("a{a}");
        let attestation_inherited = Inherited {
            expand_keys: false,
            ..inherited.clone()
        };
        attestors::convert_sets(
            &att.attestors,
            &format!("{at}.attestors"),
            &name,
            &attestation_inherited,
            &mut converted,
        )?;
        let checks = std::mem::take(&mut converted.checks);
        let condition = if att.conditions.is_empty() {
            None
        } else {
            let predicate = |path: &str| conditions::path_to_cel("predicate", path);
            let cel = conditions::translate_blocks(&att.conditions, &predicate)
                .map_err(|e| format!("{at}.conditions{e}"))?;
            Some(cel)
        };
        if condition.is_some() {
            differences.push(format!("{at}.conditions: checked on the verified statement extractPayload returns; Kyverno checks every statement of that type each attestor verifies (they differ only when an image has several attestations of one type)"));
        }
        attestations.push(Attestation {
            name: name.clone(),
            intoto: Some(TypeRef { type_ }),
            referrer: None,
        });
        attestation_checks.push((name, checks, condition));
    }
    differences.append(&mut converted.differences);

    let include = iv.image_references.clone();
    if include.is_empty() {
        return Err(format!(
            "{field}.imageReferences: An image reference is required"
        ));
    }
    if include
        .iter()
        .chain(&iv.skip_image_references)
        .any(|p| p.contains("{{"))
    {
        return Err(format!(
            "{field}.imageReferences: {{{{ }}}} variables are not converted"
        ));
    }
    if include.iter().any(|p| pattern_may_select_more(p)) {
        differences.push(format!("{field}.imageReferences: ivory also matches the other spellings of an image (docker.io/library/…, lower-case host, tag next to a digest), so digest pinning and verifyDigest may cover images Kyverno's patterns miss; they are verified too (stricter than Kyverno)"));
    }
    let skip = &iv.skip_image_references;
    if skip.iter().any(|p| pattern_may_select_more(p)) {
        differences.push(format!("{field}.skipImageReferences: Kyverno matches skip patterns on its normalised image string before pinning; the converted policy matches them on the image as written (pinned), so a Docker Hub, host-less or tag pattern may not skip an image Kyverno skips, which ivory then verifies (stricter)"));
    }
    // Skipped images are still selected (Kyverno pins them and demands their digest); only
    // their verification is skipped.
    let skip_cel = (!skip.is_empty()).then(|| images::matches_any("image", skip));
    let mut validations = Vec::new();
    for (i, check) in signature_checks.iter().enumerate() {
        let check_cel = format!(
            "verifyImageSignatures(image, {}) >= {}",
            attestor_list(&check.names),
            check.count
        );
        let message = format!(
            "failed to verify image signatures (attestors[{i}]: {} of {} attestors required)",
            check.count,
            check.names.len()
        );
        validations_for(&check_cel, skip_cel.as_ref(), message, &mut validations);
    }
    for (name, checks, condition) in &attestation_checks {
        let type_ = type_of(&attestations, name);
        for (i, check) in checks.iter().enumerate() {
            let check_cel = format!(
                "verifyAttestationSignatures(image, attestations.{name}, {}) >= {}",
                attestor_list(&check.names),
                check.count
            );
            let message = format!(
                "failed to verify the {type_} attestations (attestors[{i}]: {} of {} attestors required)",
                check.count,
                check.names.len()
            );
            validations_for(&check_cel, skip_cel.as_ref(), message, &mut validations);
        }
        if let Some(condition) = condition {
            let check_cel = format!(
                "cel.bind(predicate, extractPayload(image, attestations.{name}).predicate, {condition})"
            );
            let message = format!("attestation checks failed for predicate {type_}");
            validations_for(&check_cel, skip_cel.as_ref(), message, &mut validations);
        }
    }
    let verifies = !signature_checks.is_empty() || !attestation_checks.is_empty();
    // Kyverno's `required` looks for this rule's own pass; a rule that verifies fails by itself
    // when an image it selects does not verify, and passes images it skips, so `required`
    // would add nothing but a denial of skipped images. A rule that verifies nothing never
    // passes its own `required`.
    let required = legacy_required && !verifies;
    if required {
        differences.push(format!("{field}.required: the rule verifies nothing, so Kyverno denies every image it selects (\"unverified image\"); ivory denies them too unless another policy of the request verified the image"));
    }

    let mut match_conditions: Vec<NamedExpression> = Vec::new();
    if let Some(wc) = &ctx.spec.webhook_configuration {
        for c in &wc.match_conditions {
            match_conditions.push(NamedExpression {
                name: c.name.clone(),
                expression: c.expression.clone(),
            });
        }
    }
    for c in &rule.cel_preconditions {
        match_conditions.push(NamedExpression {
            name: c.name.clone(),
            expression: c.expression.clone(),
        });
    }
    for (name, expression) in matched.conditions {
        match_conditions.push(NamedExpression { name, expression });
    }

    let failure_policy = ctx
        .spec
        .webhook_configuration
        .as_ref()
        .and_then(|w| w.failure_policy.clone())
        .or_else(|| ctx.spec.failure_policy.clone());
    if let Some(fp) = &failure_policy
        && !matches!(fp.as_str(), "Fail" | "Ignore")
    {
        return Err(format!(
            "spec.failurePolicy: Unsupported value: {fp:?}: supported values: \"Fail\", \"Ignore\""
        ));
    }
    let timeout = ctx
        .spec
        .webhook_configuration
        .as_ref()
        .and_then(|w| w.timeout_seconds)
        .or(ctx.spec.webhook_timeout_seconds);

    let credentials = match &iv.image_registry_credentials {
        None => None,
        Some(c) => {
            for p in &c.providers {
                if !matches!(
                    p.as_str(),
                    "default" | "amazon" | "azure" | "google" | "github"
                ) {
                    return Err(format!(
                        "{field}.imageRegistryCredentials.providers: Unsupported value: {p:?}"
                    ));
                }
            }
            differences.push(format!("{field}.imageRegistryCredentials: the Pod's imagePullSecrets, which Kyverno's legacy rules also use, are not used by ImageValidatingPolicies (name every Secret here)"));
            Some(Credentials {
                allow_insecure_registry: c.allow_insecure_registry.filter(|b| *b),
                providers: c.providers.clone(),
                secrets: c.secrets.clone(),
            })
        }
    };

    let evaluation = {
        let background = ctx
            .spec
            .background
            .filter(|b| !b)
            .map(|b| Enabled { enabled: Some(b) });
        let admission = ctx
            .spec
            .admission
            .filter(|b| !b)
            .map(|b| Enabled { enabled: Some(b) });
        (background.is_some() || admission.is_some()).then_some(Evaluation {
            mode: None,
            admission,
            background,
        })
    };

    let autogen = autogen(ctx, &mut differences)?;
    let (out_kind, name) = (
        if ctx.kind == "Policy" {
            "NamespacedImageValidatingPolicy"
        } else {
            "ImageValidatingPolicy"
        },
        policy_name(ctx.name, &rule.name, many.then_some(index))?,
    );
    let mut annotations = BTreeMap::new();
    annotations.insert(
        SOURCE_ANNOTATION.to_owned(),
        format!("{}/{}#{}", ctx.kind, ctx.name, rule.name),
    );
    let doc = PolicyDocument {
        api_version: "policies.kyverno.io/v1".to_owned(),
        kind: out_kind.to_owned(),
        metadata: ObjectMeta {
            name,
            namespace: ctx.namespace.clone(),
            annotations,
            ..ObjectMeta::default()
        },
        spec: PolicySpec {
            match_constraints: Some(matched.constraints),
            match_conditions,
            match_image_references: include
                .iter()
                .map(|p| MatchImageReference {
                    glob: Some(images::wildcard_to_glob(p)),
                    expression: None,
                })
                .collect(),
            validation_actions: vec![if enforce { "Deny" } else { "Audit" }.to_owned()],
            failure_policy,
            validations: Some(validations),
            webhook_configuration: timeout.map(|t| WebhookConfiguration {
                timeout_seconds: Some(t),
            }),
            evaluation,
            validation_configurations: Some(ValidationConfigurations {
                mutate_digest: Some(mutate_digest),
                verify_digest: Some(verify_digest),
                required: Some(required),
            }),
            credentials,
            attestors: Some(converted.attestors),
            attestations,
            autogen,
            ..PolicySpec::default()
        },
    };
    Ok((doc, differences))
}

fn type_of(attestations: &[Attestation], name: &str) -> String {
    attestations
        .iter()
        .find(|a| a.name == name)
        .and_then(|a| a.intoto.as_ref())
        .map(|t| t.type_.clone())
        .unwrap_or_default()
}

fn attestor_list(names: &[String]) -> String {
    let items: Vec<String> = names.iter().map(|n| format!("attestors.{n}")).collect();
    format!("[{}]", items.join(", "))
}

/// CEL, one expression per image list: `check` holds for every selected container, init
/// container and ephemeral container image (the images Kyverno's legacy extractors read; OCI
/// image volumes are not among them). One expression per list keeps each under the static
/// cost limit that a comprehension over their concatenation exceeds.
fn per_image(check: &str) -> Vec<String> {
    ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .map(|list| format!("images.{list}.all(image, {check})"))
        .collect()
}

/// One validation per image list, with the same message.
fn validations_for(check: &str, skip: Option<&String>, message: String, out: &mut Vec<Validation>) {
    let check = match skip {
        Some(skip) => format!("({skip}) || {check}"),
        None => check.to_owned(),
    };
    for expression in per_image(&check) {
        out.push(Validation {
            expression,
            message: Some(message.clone()),
            ..Validation::default()
        });
    }
}

/// Whether a pattern can select an image under one of ivory's other spellings that Kyverno's
/// normalised string does not match (Docker Hub, no host, a tag that sits next to a digest,
/// upper-case hosts).
fn pattern_may_select_more(pattern: &str) -> bool {
    let first = pattern.split('/').next().unwrap_or_default();
    let host_like = pattern.contains('/') && (first.contains(['.', ':']) || first == "localhost");
    let tail = pattern.rsplit('/').next().unwrap_or_default();
    !host_like
        || first.starts_with("docker.io")
        || first.starts_with("index.docker.io")
        || first.starts_with('*')
        || tail.contains(':')
}

/// Kyverno's `Convert()` of the deprecated rule-level fields (`image`, `key`, `issuer`,
/// `subject`, `roots`, `annotations`).
fn legacy_defaults(
    mut iv: ImageVerification,
    field: &str,
    differences: &mut Vec<String>,
) -> Result<ImageVerification, String> {
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
        return Ok(iv);
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
    Ok(iv)
}

fn autogen(
    ctx: &PolicyContext<'_>,
    differences: &mut Vec<String>,
) -> Result<Option<Autogen>, String> {
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
                return Err(format!(
                    "metadata.annotations[pod-policies.kyverno.io/autogen-controllers]: unknown controller {other:?}"
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
fn loads(doc: &PolicyDocument) -> Result<(), String> {
    let text = ivory_policy::yaml::to_string(doc).map_err(|e| format!("cannot write YAML: {e}"))?;
    let report = ivory_policy::load_str(&text, "converted");
    match report.errors.first() {
        None => Ok(()),
        Some(e) => Err(format!(
            "the converted policy does not load in ivory: {}: {}",
            e.field, e.reason
        )),
    }
}
