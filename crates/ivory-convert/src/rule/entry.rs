//! One `verifyImages` entry → one ImageValidatingPolicy.
//!
//! Each entry is converted in passes, in the order the legacy fields are read: the entry's
//! own fields ([`read_entry`]), the rule's match ([`crate::matching::convert`]), the action and
//! digest flags ([`read_settings`]), the attestors ([`build_attestors`]), the image references
//! ([`image_references`]), the validations ([`build_validations`]), the webhook settings
//! ([`build_admission`]), and the policy ([`assemble`]). The first pass that refuses names the
//! refusal, as the single function before them did.

use super::*;
use crate::context::ConfigMaps;

/// A converted entry: the policy and its documented differences.
pub(super) type Entry = (PolicyDocument, Vec<String>);

/// A converted entry: its report label, the policy and its documented differences.
pub(super) type ConvertedEntry = (String, PolicyDocument, Vec<String>);

/// Converts `verifyImages[index]` of `rule`, pass by pass (see the module's doc). Errors name
/// the field from the rule down (or from the document's root, for policy-wide fields).
pub(super) fn convert_entry(
    ctx: &PolicyContext<'_>,
    rule: &Rule,
    entry: &Value,
    index: usize,
    many: bool,
) -> Result<Entry, ConvertError> {
    let field = format!("verifyImages[{index}]");
    let mut differences = ctx.notes.clone();
    let iv = read_entry(entry, &field, &mut differences)?;
    let extractors = crate::extractors::convert(rule.image_extractors.as_ref())?;
    let custom_kinds = extractors
        .as_ref()
        .map(|e| e.kinds.clone())
        .unwrap_or_default();
    let matched = matching::convert(
        rule.match_.as_ref(),
        rule.exclude.as_ref(),
        rule.preconditions.as_ref(),
        &custom_kinds,
    )?;
    let settings = read_settings(ctx, &iv, &field, &mut differences)?;
    let config_maps = ConfigMaps::read(&rule.context, ctx.namespace.as_deref())?;
    let verification =
        build_attestors(&iv, &field, settings.notary, config_maps, &mut differences)?;
    let images = image_references(&iv, &field, &mut differences)?;
    let lists = match &extractors {
        Some(extractors) => {
            differences.push(extractor_difference(settings.mutate_digest));
            extractors.lists()
        }
        None => crate::extractors::BUILT_IN_LISTS
            .iter()
            .map(|l| (*l).to_owned())
            .collect(),
    };
    let validations = build_validations(&verification, images.skip.as_ref(), &lists);
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
        extractors: extractors.map(|e| e.images).unwrap_or_default(),
        required,
        admission,
    };
    let name_index = many.then_some(index);
    let doc = assemble(ctx, &rule.name, name_index, parts, &mut differences)?;
    Ok((doc, differences))
}

/// Pass 1: the entry read into the model, the entry fields no policy converts refused, and
/// Kyverno's defaults for the deprecated entry fields applied.
fn read_entry(
    entry: &Value,
    field: &str,
    differences: &mut Vec<String>,
) -> Result<ImageVerification, ConvertError> {
    let iv: ImageVerification = serde_path_to_error::deserialize(entry.clone()).map_err(|e| {
        let kind = ErrorKind::Schema(e.inner().to_string());
        ConvertError::new(format!("{field}.{}", e.path()), kind)
    })?;
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
    let mut mutate_digest = iv.mutate_digest.unwrap_or(true);
    if !enforce && mutate_digest {
        if !ctx.options.fix {
            return Err(ConvertError::invalid(
                format!("{field}.mutateDigest"),
                "mutateDigest must be set to false for ‘Audit’ failure action (Kyverno refuses \
                 this policy; `ivory convert --fix` sets it to false and reports it)",
            ));
        }
        let written = if iv.mutate_digest.is_some() {
            "set to true"
        } else {
            "left at its default (true)"
        };
        differences.push(format!(
            "{FIXED}{field}.mutateDigest: {written} under the ‘Audit’ failure action, which \
             Kyverno refuses; converted as mutateDigest: false (images are not pinned; \
             verifyDigest still applies as written)"
        ));
        mutate_digest = false;
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
    config_maps: ConfigMaps,
    differences: &mut Vec<String>,
) -> Result<Verification, ConvertError> {
    let inherited = Inherited {
        repository: iv.repository.clone(),
        annotations: iv.annotations.clone(),
        notary,
        expand_keys: true,
        config_maps,
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
        let is_context_entry = |name: &str| inherited.config_maps.contains(name);
        let predicate = |path: &str| conditions::attestation_path(path, &is_context_entry);
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
fn build_validations(
    verification: &Verification,
    skip: Option<&String>,
    lists: &[String],
) -> Vec<Validation> {
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
        validations_for(&check_cel, skip, lists, message, &mut validations);
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
            validations_for(&check_cel, skip, lists, message, &mut validations);
        }
        if let Some(condition) = &attestation.condition {
            let check_cel = format!(
                "cel.bind(predicate, extractPayload(image, attestations.{name}).predicate, {condition})"
            );
            let message = format!("attestation checks failed for predicate {type_}");
            validations_for(&check_cel, skip, lists, message, &mut validations);
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
    /// `images`: the rule's `imageExtractors`.
    extractors: Vec<NamedExpression>,
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
        extractors,
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
            images: extractors,
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

/// What the report says of a rule whose images come from its `imageExtractors`.
fn extractor_difference(mutate_digest: bool) -> String {
    let pinning = if mutate_digest {
        "; Kyverno pins them to digests, an ImageValidatingPolicy pins container images only, \
         so an image there written with a tag is denied by verifyDigest instead of pinned"
    } else {
        ""
    };
    format!(
        "imageExtractors: read by the policy's `images` extractors (the resource guessed from \
         the kind, in any group unless one is written){pinning}"
    )
}

/// CEL, one expression per image list: `check` holds for every selected image of `list`. One
/// expression per list keeps each under the static cost limit that a comprehension over
/// their concatenation exceeds.
fn per_image<'a>(check: &'a str, lists: &'a [String]) -> impl Iterator<Item = String> + 'a {
    lists
        .iter()
        .map(move |list| format!("{}.all(image, {check})", images_list(list)))
}

/// `images.<list>`, or `images['<list>']` for a name that is not a CEL identifier.
fn images_list(list: &str) -> String {
    if images::is_cel_identifier(list) {
        format!("images.{list}")
    } else {
        format!("images[{}]", images::cel_string(list))
    }
}

/// One validation per image list, with the same message.
fn validations_for(
    check: &str,
    skip: Option<&String>,
    lists: &[String],
    message: String,
    out: &mut Vec<Validation>,
) {
    let check = match skip {
        Some(skip) => format!("({skip}) || {check}"),
        None => check.to_owned(),
    };
    for expression in per_image(&check, lists) {
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
