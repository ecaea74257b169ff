//! One legacy policy's `verifyImages` rules → ImageValidatingPolicies (one per entry).
//!
//! Each entry is converted in passes, in the order the legacy fields are read: the entry's
//! own fields ([`read_entry`]), the rule's match ([`matching::convert`]), the action and
//! digest flags ([`read_settings`]), the attestors ([`build_attestors`]), the image references
//! ([`image_references`]), the validations ([`build_validations`]), the webhook settings
//! ([`build_admission`]), and the policy ([`assemble`]). The first pass that refuses names the
//! refusal, as the single function before them did.

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
use super::{Conversion, LegacyError, conditions};
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
}

/// Converts every `verifyImages` entry of one ClusterPolicy / Policy, adding a report per
/// entry (and per other rule) and the converted policies to `out`. Refused entries are
/// reported; only a policy that cannot be read at all is an error.
pub(crate) fn convert_policy(
    doc: &Value,
    kind: &str,
    name: &str,
    location: &str,
    out: &mut Conversion,
) -> Result<(), LegacyError> {
    let ctx = policy_context(doc, kind, name, location)?;
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

/// A converted entry: the policy and its documented differences.
type Entry = (PolicyDocument, Vec<String>);

/// A converted entry: its report label, the policy and its documented differences.
type ConvertedEntry = (String, PolicyDocument, Vec<String>);

/// Converts `verifyImages[index]` of `rule`, pass by pass (see the module's doc). Errors name
/// the field from the rule down (or from the document's root, for policy-wide fields).
fn convert_entry(
    ctx: &PolicyContext<'_>,
    rule: &Rule,
    entry: &Value,
    index: usize,
    many: bool,
) -> Result<Entry, ConvertError> {
    let field = format!("verifyImages[{index}]");
    let mut differences = ctx.notes.clone();
    let iv = read_entry(rule, entry, &field, &mut differences)?;
    let matched = matching::convert(
        rule.match_.as_ref(),
        rule.exclude.as_ref(),
        rule.preconditions.as_ref(),
    )?;
    let settings = read_settings(ctx, &iv, &field, &mut differences)?;
    let verification = build_attestors(&iv, &field, settings.notary, &mut differences)?;
    let images = image_references(&iv, &field, &mut differences)?;
    let validations = build_validations(&verification, images.skip.as_ref());
    let verifies =
        !verification.signature_checks.is_empty() || !verification.attestation_checks.is_empty();
    // Kyverno's `required` looks for this rule's own pass; a rule that verifies fails by itself
    // when an image it selects does not verify, and passes images it skips, so `required`
    // would add nothing but a denial of skipped images. A rule that verifies nothing never
    // passes its own `required`.
    let required = settings.legacy_required && !verifies;
    if required {
        differences.push(format!("{field}.required: the rule verifies nothing, so Kyverno denies every image it selects (\"unverified image\"); ivory denies them too unless another policy of the request verified the image"));
    }
    let admission = build_admission(ctx, rule, matched.conditions, &iv, &field, &mut differences)?;
    let parts = Parts {
        settings,
        constraints: matched.constraints,
        verification,
        include: images.include,
        validations,
        required,
        admission,
    };
    let name_index = many.then_some(index);
    let doc = assemble(ctx, &rule.name, name_index, parts, &mut differences)?;
    Ok((doc, differences))
}

/// Pass 1: the entry read into the model, the rule-level fields no entry converts refused,
/// and Kyverno's defaults for the deprecated entry fields applied.
fn read_entry(
    rule: &Rule,
    entry: &Value,
    field: &str,
    differences: &mut Vec<String>,
) -> Result<ImageVerification, ConvertError> {
    let iv: ImageVerification = serde_path_to_error::deserialize(entry.clone()).map_err(|e| {
        let kind = ErrorKind::Schema(e.inner().to_string());
        ConvertError::new(format!("{field}.{}", e.path()), kind)
    })?;
    if !rule.context.is_empty() {
        return Err(ConvertError::unsupported(
            "context",
            "context entries (ConfigMaps, API calls, image data) are not converted",
        ));
    }
    if rule.image_extractors.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ConvertError::unsupported(
            "imageExtractors",
            "custom image extractors are not converted",
        ));
    }
    if iv.validate.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ConvertError::unsupported(
            format!("{field}.validate"),
            "deny conditions over verifyImages are not converted",
        ));
    }
    Ok(legacy_defaults(iv, field, differences))
}

/// The entry's action, digest flags and signature type.
struct Settings {
    /// `Enforce` (deny) rather than `Audit`.
    enforce: bool,
    mutate_digest: bool,
    verify_digest: bool,
    /// `required` as written (the CRD defaults it to `true`).
    legacy_required: bool,
    /// `type: Notary`: the attestors are Notary certificates.
    notary: bool,
}

/// Pass 3: the failure action, the digest flags and the signature type.
fn read_settings(
    ctx: &PolicyContext<'_>,
    iv: &ImageVerification,
    field: &str,
    differences: &mut Vec<String>,
) -> Result<Settings, ConvertError> {
    let action = iv
        .failure_action
        .clone()
        .or_else(|| ctx.spec.validation_failure_action.clone())
        .unwrap_or_else(|| "Audit".to_owned());
    let enforce = match action.to_ascii_lowercase().as_str() {
        "enforce" => true,
        "audit" => false,
        _ => {
            return Err(ConvertError::invalid(
                format!("{field}.failureAction"),
                format!("Unsupported value: {action:?}: supported values: \"Audit\", \"Enforce\""),
            ));
        }
    };
    let mutate_digest = iv.mutate_digest.unwrap_or(true);
    if !enforce && mutate_digest {
        return Err(ConvertError::invalid(
            format!("{field}.mutateDigest"),
            "mutateDigest must be set to false for ‘Audit’ failure action (Kyverno refuses this \
             policy)",
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
        other => {
            return Err(ConvertError::invalid(
                format!("{field}.type"),
                format!("Unsupported value: {other:?}"),
            ));
        }
    };
    if iv.cosign_oci11 == Some(true) {
        differences.push(format!("{field}.cosignOCI11: ivory reads OCI 1.1 referrers and cosign tags alike; the flag has no equivalent"));
    }
    Ok(Settings {
        enforce,
        mutate_digest,
        verify_digest: iv.verify_digest.unwrap_or(true),
        legacy_required: iv.required.unwrap_or(true),
        notary,
    })
}

/// What an entry verifies: its attestors, and the checks over them.
struct Verification {
    /// Every attestor of the entry (signatures' and attestations').
    attestors: Vec<PolicyAttestor>,
    /// One check per `attestors[]` set: image signatures.
    signature_checks: Vec<SetCheck>,
    /// The in-toto types of `attestations[]`, named `a<i>`.
    attestations: Vec<Attestation>,
    /// One per `attestations[]` entry.
    attestation_checks: Vec<AttestationCheck>,
}

/// The checks of one `attestations[]` entry.
struct AttestationCheck {
    /// The attestation's name (`a<i>`).
    name: String,
    /// One per attestor set.
    checks: Vec<SetCheck>,
    /// `conditions` as CEL over `predicate`.
    condition: Option<String>,
}

/// Pass 4: the signature attestor sets and the attestations, as attestors and checks.
fn build_attestors(
    iv: &ImageVerification,
    field: &str,
    notary: bool,
    differences: &mut Vec<String>,
) -> Result<Verification, ConvertError> {
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
    let mut attestation_checks = Vec::new();
    for (a, att) in iv.attestations.iter().enumerate() {
        let at = format!("{field}.attestations[{a}]");
        let (attestation, check) =
            build_attestation(att, a, &at, &inherited, &mut converted, differences)?;
        attestations.push(attestation);
        attestation_checks.push(check);
    }
    // The attestors' differences follow the conditions', as they always have in the report.
    differences.append(&mut converted.differences);
    Ok(Verification {
        attestors: converted.attestors,
        signature_checks,
        attestations,
        attestation_checks,
    })
}

/// `attestations[a]` (at `at`): its type, its attestors (added to `converted`) and its
/// conditions as CEL.
fn build_attestation(
    att: &model::Attestation,
    a: usize,
    at: &str,
    inherited: &Inherited,
    converted: &mut Converted,
    differences: &mut Vec<String>,
) -> Result<(Attestation, AttestationCheck), ConvertError> {
    let type_ = att
        .type_
        .clone()
        .filter(|t| !t.is_empty())
        .or_else(|| att.predicate_type.clone().filter(|t| !t.is_empty()))
        .ok_or_else(|| ConvertError::invalid(at, "missing type"))?;
    if att.attestors.is_empty() {
        return Err(ConvertError::unsupported(
            format!("{at}.attestors"),
            "an attestation without attestors is not converted (Kyverno then accepts any \
             keyless signer)",
        ));
    }
    if inherited.notary {
        return Err(ConvertError::unsupported(
            at,
            "Notary attestations (referrers) are not converted",
        ));
    }
    let name = format!("a{a}");
    // Kyverno does not expand multi-key PEMs in attestations.
    let attestation_inherited = Inherited {
        expand_keys: false,
        ..inherited.clone()
    };
    attestors::convert_sets(
        &att.attestors,
        &format!("{at}.attestors"),
        &name,
        &attestation_inherited,
        converted,
    )?;
    let checks = std::mem::take(&mut converted.checks);
    let condition = if att.conditions.is_empty() {
        None
    } else {
        let predicate = |path: &str| conditions::path_to_cel("predicate", path);
        let cel = conditions::translate_blocks(&att.conditions, &predicate)
            .map_err(|e| e.under(&format!("{at}.conditions")))?;
        differences.push(format!("{at}.conditions: checked on the verified statement extractPayload returns; Kyverno checks every statement of that type each attestor verifies (they differ only when an image has several attestations of one type)"));
        Some(cel)
    };
    let attestation = Attestation {
        name: name.clone(),
        intoto: Some(TypeRef { type_ }),
        referrer: None,
    };
    let check = AttestationCheck {
        name,
        checks,
        condition,
    };
    Ok((attestation, check))
}

/// The images an entry selects, and those whose verification it skips.
struct Images {
    /// `imageReferences`: wildcard patterns.
    include: Vec<String>,
    /// CEL: `image` matches a `skipImageReferences` pattern (none when there are none).
    skip: Option<String>,
}

/// Pass 5: `imageReferences` and `skipImageReferences`.
fn image_references(
    iv: &ImageVerification,
    field: &str,
    differences: &mut Vec<String>,
) -> Result<Images, ConvertError> {
    let include = iv.image_references.clone();
    if include.is_empty() {
        return Err(ConvertError::invalid(
            format!("{field}.imageReferences"),
            "An image reference is required",
        ));
    }
    if include
        .iter()
        .chain(&iv.skip_image_references)
        .any(|p| p.contains("{{"))
    {
        return Err(ConvertError::variable(
            format!("{field}.imageReferences"),
            "{{ }} variables are not converted",
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
    Ok(Images {
        include,
        skip: (!skip.is_empty()).then(|| images::matches_any("image", skip)),
    })
}

/// Pass 6: one validation per check and image list; skipped images pass each.
fn build_validations(verification: &Verification, skip: Option<&String>) -> Vec<Validation> {
    let mut validations = Vec::new();
    for (i, check) in verification.signature_checks.iter().enumerate() {
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
        validations_for(&check_cel, skip, message, &mut validations);
    }
    for attestation in &verification.attestation_checks {
        let name = &attestation.name;
        let type_ = type_of(&verification.attestations, name);
        for (i, check) in attestation.checks.iter().enumerate() {
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
            validations_for(&check_cel, skip, message, &mut validations);
        }
        if let Some(condition) = &attestation.condition {
            let check_cel = format!(
                "cel.bind(predicate, extractPayload(image, attestations.{name}).predicate, {condition})"
            );
            let message = format!("attestation checks failed for predicate {type_}");
            validations_for(&check_cel, skip, message, &mut validations);
        }
    }
    validations
}

/// How the webhook calls the converted policy.
struct Admission {
    /// The webhook's, the rule's CEL preconditions, then match's, exclude's and
    /// preconditions' translations.
    match_conditions: Vec<NamedExpression>,
    failure_policy: Option<String>,
    timeout: Option<i32>,
    credentials: Option<Credentials>,
    evaluation: Option<Evaluation>,
}

/// Pass 7: match conditions, failure policy, timeout, registry credentials and evaluation
/// modes.
fn build_admission(
    ctx: &PolicyContext<'_>,
    rule: &Rule,
    matched: Vec<(String, String)>,
    iv: &ImageVerification,
    field: &str,
    differences: &mut Vec<String>,
) -> Result<Admission, ConvertError> {
    let webhook = ctx.spec.webhook_configuration.as_ref();
    let cel = webhook
        .map(|wc| wc.match_conditions.as_slice())
        .unwrap_or_default()
        .iter()
        .chain(&rule.cel_preconditions)
        .map(|c| (c.name.clone(), c.expression.clone()));
    let match_conditions = cel
        .chain(matched)
        .map(|(name, expression)| NamedExpression { name, expression })
        .collect();
    let failure_policy = webhook
        .and_then(|w| w.failure_policy.clone())
        .or_else(|| ctx.spec.failure_policy.clone());
    if let Some(fp) = &failure_policy
        && !matches!(fp.as_str(), "Fail" | "Ignore")
    {
        // Policy-wide: named from the document's root, not under the rule.
        return Err(ConvertError::document(
            "spec.failurePolicy",
            ErrorKind::Invalid(format!(
                "Unsupported value: {fp:?}: supported values: \"Fail\", \"Ignore\""
            )),
        ));
    }
    let timeout = webhook
        .and_then(|w| w.timeout_seconds)
        .or(ctx.spec.webhook_timeout_seconds);
    let credentials = credentials(iv, field, differences)?;
    let disabled = |b: Option<bool>| b.filter(|b| !b).map(|b| Enabled { enabled: Some(b) });
    let background = disabled(ctx.spec.background);
    let admission = disabled(ctx.spec.admission);
    let evaluation = (background.is_some() || admission.is_some()).then_some(Evaluation {
        mode: None,
        admission,
        background,
    });
    Ok(Admission {
        match_conditions,
        failure_policy,
        timeout,
        credentials,
        evaluation,
    })
}

/// `imageRegistryCredentials` as the policy's `credentials`.
fn credentials(
    iv: &ImageVerification,
    field: &str,
    differences: &mut Vec<String>,
) -> Result<Option<Credentials>, ConvertError> {
    let Some(c) = &iv.image_registry_credentials else {
        return Ok(None);
    };
    for p in &c.providers {
        if !matches!(
            p.as_str(),
            "default" | "amazon" | "azure" | "google" | "github"
        ) {
            return Err(ConvertError::invalid(
                format!("{field}.imageRegistryCredentials.providers"),
                format!("Unsupported value: {p:?}"),
            ));
        }
    }
    differences.push(format!("{field}.imageRegistryCredentials: the Pod's imagePullSecrets, which Kyverno's legacy rules also use, are not used by ImageValidatingPolicies (name every Secret here)"));
    Ok(Some(Credentials {
        allow_insecure_registry: c.allow_insecure_registry.filter(|b| *b),
        providers: c.providers.clone(),
        secrets: c.secrets.clone(),
    }))
}

/// What the passes made of one entry, for [`assemble`].
struct Parts {
    settings: Settings,
    constraints: Constraints,
    verification: Verification,
    /// `imageReferences`.
    include: Vec<String>,
    validations: Vec<Validation>,
    /// `validationConfigurations.required`.
    required: bool,
    admission: Admission,
}

/// Pass 8: the ImageValidatingPolicy (namespaced for a Policy), named after the policy and
/// rule (and entry, when the rule has several), with its autogen.
fn assemble(
    ctx: &PolicyContext<'_>,
    rule_name: &str,
    name_index: Option<usize>,
    parts: Parts,
    differences: &mut Vec<String>,
) -> Result<PolicyDocument, ConvertError> {
    let autogen = autogen(ctx, differences)?;
    let out_kind = if ctx.kind == "Policy" {
        "NamespacedImageValidatingPolicy"
    } else {
        "ImageValidatingPolicy"
    };
    let name = policy_name(ctx.name, rule_name, name_index)?;
    let mut annotations = BTreeMap::new();
    annotations.insert(
        SOURCE_ANNOTATION.to_owned(),
        format!("{}/{}#{}", ctx.kind, ctx.name, rule_name),
    );
    let Parts {
        settings,
        constraints,
        verification,
        include,
        validations,
        required,
        admission,
    } = parts;
    Ok(PolicyDocument {
        api_version: "policies.kyverno.io/v1".to_owned(),
        kind: out_kind.to_owned(),
        metadata: ObjectMeta {
            name,
            namespace: ctx.namespace.clone(),
            annotations,
            ..ObjectMeta::default()
        },
        spec: PolicySpec {
            match_constraints: Some(constraints),
            match_conditions: admission.match_conditions,
            match_image_references: include
                .iter()
                .map(|p| MatchImageReference {
                    glob: Some(images::wildcard_to_glob(p)),
                    expression: None,
                })
                .collect(),
            validation_actions: vec![if settings.enforce { "Deny" } else { "Audit" }.to_owned()],
            failure_policy: admission.failure_policy,
            validations: Some(validations),
            webhook_configuration: admission.timeout.map(|t| WebhookConfiguration {
                timeout_seconds: Some(t),
            }),
            evaluation: admission.evaluation,
            validation_configurations: Some(ValidationConfigurations {
                mutate_digest: Some(settings.mutate_digest),
                verify_digest: Some(settings.verify_digest),
                required: Some(required),
            }),
            credentials: admission.credentials,
            attestors: Some(verification.attestors),
            attestations: verification.attestations,
            autogen,
            ..PolicySpec::default()
        },
    })
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
        let ctx = policy_context(&policy, "ClusterPolicy", "p", "t.yaml").unwrap();
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
