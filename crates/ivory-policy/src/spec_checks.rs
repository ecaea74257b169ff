//! Structural checks the CRD schema and Kyverno's policy admission perform, plus the checks that
//! make a policy usable by ivory (PEM armour, regexps, globs). Every problem is collected; CEL is
//! checked separately by `compile`.

use std::collections::HashSet;

use crate::error::Errors;
use crate::pem;
use crate::types::{
    Attestation, Attestor, Cosign, CosignKey, Keyless, LabelSelector, MatchResources,
    NamedExpression, NamedRuleWithOperations, Notary, ObjectMeta, POD_CONTROLLERS, PolicyKind,
    PolicySpec, StringSource,
};

const VALIDATION_ACTIONS: [&str; 3] = ["Deny", "Audit", "Warn"];
const FAILURE_POLICIES: [&str; 2] = ["Ignore", "Fail"];
const OPERATIONS: [&str; 5] = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
const SCOPES: [&str; 3] = ["*", "Cluster", "Namespaced"];
const MATCH_POLICIES: [&str; 2] = ["Equivalent", "Exact"];
const HASH_ALGORITHMS: [&str; 4] = ["sha224", "sha256", "sha384", "sha512"];
/// The hash algorithms ivory verifies with (the crypto provider has no SHA-224 signatures).
const SUPPORTED_HASH_ALGORITHMS: [&str; 3] = ["sha256", "sha384", "sha512"];
/// `credentials.providers` ivory implements: `default` is the docker config the registry client
/// reads; the cloud credential helpers are not built in.
const SUPPORTED_PROVIDERS: [&str; 1] = ["default"];
const PROVIDERS: [&str; 5] = ["default", "amazon", "azure", "google", "github"];
const MODES: [&str; 2] = ["Kubernetes", "JSON"];
const KMS_SCHEMES: [&str; 4] = ["awskms://", "gcpkms://", "azurekms://", "hashivault://"];
const MAX_MATCH_CONDITIONS: usize = 64;
/// `keyless.additionalExtensions` keys: the Fulcio GitHub workflow extensions cosign compares.
const ADDITIONAL_EXTENSION_KEYS: [&str; 5] = [
    "githubWorkflowTrigger",
    "githubWorkflowSha",
    "githubWorkflowName",
    "githubWorkflowRepository",
    "githubWorkflowRef",
];

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// Validates `metadata` for the given kind.
pub(crate) fn metadata(kind: PolicyKind, meta: &ObjectMeta, errs: &mut Errors) {
    if meta.name.is_empty() {
        errs.required("metadata.name", "name is required");
    } else if let Some(detail) = dns1123_subdomain(&meta.name) {
        errs.invalid("metadata.name", format!("{:?}: {detail}", meta.name));
    }
    if kind == PolicyKind::NamespacedImageValidatingPolicy {
        match meta.namespace.as_deref() {
            None | Some("") => errs.required(
                "metadata.namespace",
                "a NamespacedImageValidatingPolicy must have a namespace",
            ),
            Some(ns) => {
                if let Some(detail) = dns1123_label(ns) {
                    errs.invalid("metadata.namespace", format!("{ns:?}: {detail}"));
                }
            }
        }
    }
}

/// A NamespacedImageValidatingPolicy may name registry Secrets of its own namespace only
/// (`name` or `<its namespace>/name`): reading another namespace's Secrets, ivory's included,
/// would lend it credentials its authors were never given.
pub(crate) fn credentials_scope(
    kind: PolicyKind,
    meta: &ObjectMeta,
    spec: &PolicySpec,
    errs: &mut Errors,
) {
    let (PolicyKind::NamespacedImageValidatingPolicy, Some(own), Some(creds)) =
        (kind, meta.namespace.as_deref(), &spec.credentials)
    else {
        return;
    };
    for (i, s) in creds.secrets.iter().enumerate() {
        if let Some((namespace, _)) = s.split_once('/')
            && namespace != own
        {
            errs.invalid(
                format!("spec.credentials.secrets[{i}]"),
                format!(
                    "{s:?}: a NamespacedImageValidatingPolicy may only use Secrets of its own \
                     namespace {own:?}"
                ),
            );
        }
    }
}

/// Validates the whole spec (everything but CEL).
pub(crate) fn spec(spec: &PolicySpec, errs: &mut Errors) {
    match &spec.match_constraints {
        Some(mc) if !mc.resource_rules.is_empty() => {
            match_resources(mc, "spec.matchConstraints", errs);
        }
        // JSON-mode policies evaluate arbitrary payloads (Kyverno CLI/SDK), not admission requests.
        _ if spec.json_mode() => {}
        _ => errs.required(
            "spec.matchConstraints",
            "a matchConstraints with at least one resource rule is required",
        ),
    }
    if spec.match_conditions.len() > MAX_MATCH_CONDITIONS {
        errs.push(
            "spec.matchConditions",
            format!(
                "Too many: {}: must have at most {MAX_MATCH_CONDITIONS} items",
                spec.match_conditions.len()
            ),
        );
    }
    named_expressions(&spec.match_conditions, "spec.matchConditions", errs);
    named_expressions(&spec.variables, "spec.variables", errs);
    named_expressions(&spec.images, "spec.images", errs);
    for (i, m) in spec.match_image_references.iter().enumerate() {
        let field = format!("spec.matchImageReferences[{i}]");
        match (m.glob.as_deref(), m.expression.as_deref()) {
            (Some(glob), None) => {
                if let Err(e) = crate::glob::compile_image_glob(glob) {
                    errs.invalid(format!("{field}.glob"), format!("{glob:?}: {e}"));
                }
            }
            (None, Some(expr)) => {
                if expr.trim().is_empty() {
                    errs.required(format!("{field}.expression"), "");
                }
            }
            _ => errs.invalid(field, "exactly one of glob or expression must be set"),
        }
    }
    validation_actions(&spec.validation_actions, errs);
    if let Some(fp) = spec.failure_policy.as_deref()
        && !FAILURE_POLICIES.contains(&fp)
    {
        errs.unsupported("spec.failurePolicy", fp, &FAILURE_POLICIES);
    }
    let mut keys = HashSet::new();
    for (i, a) in spec.audit_annotations.iter().enumerate() {
        let field = format!("spec.auditAnnotations[{i}]");
        if a.key.is_empty() {
            errs.required(format!("{field}.key"), "");
        } else if !keys.insert(a.key.as_str()) {
            errs.duplicate(format!("{field}.key"), &a.key);
        }
        if a.value_expression.trim().is_empty() {
            errs.required(format!("{field}.valueExpression"), "");
        }
    }
    match &spec.validations {
        None => errs.required("spec.validations", ""),
        Some(list) => {
            for (i, v) in list.iter().enumerate() {
                if v.expression.trim().is_empty() {
                    errs.required(format!("spec.validations[{i}].expression"), "");
                }
            }
        }
    }
    if let Some(t) = spec.timeout_seconds()
        && !(1..=30).contains(&t)
    {
        errs.invalid(
            "spec.webhookConfiguration.timeoutSeconds",
            format!("{t}: the timeout value must be between 1 and 30 seconds"),
        );
    }
    if let Some(mode) = spec.evaluation.as_ref().and_then(|e| e.mode.as_deref())
        && !MODES.contains(&mode)
    {
        errs.unsupported("spec.evaluation.mode", mode, &MODES);
    }
    if let Some(creds) = &spec.credentials {
        for (i, p) in creds.providers.iter().enumerate() {
            let field = format!("spec.credentials.providers[{i}]");
            if !PROVIDERS.contains(&p.as_str()) {
                errs.unsupported(field, p, &PROVIDERS);
            } else if !SUPPORTED_PROVIDERS.contains(&p.as_str()) {
                errs.forbidden(
                    field,
                    &format!("{p:?} is not supported: use pull secrets (spec.credentials.secrets)"),
                );
            }
        }
        for (i, s) in creds.secrets.iter().enumerate() {
            let parts: Vec<&str> = s.split('/').collect();
            if parts.len() > 2 || parts.iter().any(|p| p.is_empty()) {
                errs.invalid(
                    format!("spec.credentials.secrets[{i}]"),
                    format!("{s:?}: must be <name> or <namespace>/<name>"),
                );
            }
        }
    }
    match &spec.attestors {
        None => errs.required("spec.attestors", ""),
        Some(list) => attestors(list, errs),
    }
    attestations(&spec.attestations, errs);
    if let Some(controllers) = spec
        .autogen
        .as_ref()
        .and_then(|a| a.pod_controllers.as_ref())
        .and_then(|p| p.controllers.as_ref())
    {
        for (i, c) in controllers.iter().enumerate() {
            if !POD_CONTROLLERS.contains(&c.as_str()) {
                errs.unsupported(
                    format!("spec.autogen.podControllers.controllers[{i}]"),
                    c,
                    &POD_CONTROLLERS,
                );
            }
        }
    }
}

fn validation_actions(actions: &[String], errs: &mut Errors) {
    let mut seen = HashSet::new();
    for (i, a) in actions.iter().enumerate() {
        let field = format!("spec.validationActions[{i}]");
        if !VALIDATION_ACTIONS.contains(&a.as_str()) {
            errs.unsupported(field, a, &VALIDATION_ACTIONS);
        } else if !seen.insert(a.as_str()) {
            errs.duplicate(field, a);
        }
    }
}

fn match_resources(mc: &MatchResources, field: &str, errs: &mut Errors) {
    for (i, rule) in mc.resource_rules.iter().enumerate() {
        resource_rule(rule, &format!("{field}.resourceRules[{i}]"), errs);
    }
    for (i, rule) in mc.exclude_resource_rules.iter().enumerate() {
        resource_rule(rule, &format!("{field}.excludeResourceRules[{i}]"), errs);
    }
    if let Some(mp) = mc.match_policy.as_deref()
        && !MATCH_POLICIES.contains(&mp)
    {
        errs.unsupported(format!("{field}.matchPolicy"), mp, &MATCH_POLICIES);
    }
    if let Some(sel) = &mc.namespace_selector {
        label_selector(sel, &format!("{field}.namespaceSelector"), errs);
    }
    if let Some(sel) = &mc.object_selector {
        label_selector(sel, &format!("{field}.objectSelector"), errs);
    }
}

/// The admissionregistration `RuleWithOperations` checks.
fn resource_rule(rule: &NamedRuleWithOperations, field: &str, errs: &mut Errors) {
    if rule.operations.is_empty() {
        errs.required(format!("{field}.operations"), "");
    }
    for (i, op) in rule.operations.iter().enumerate() {
        if !OPERATIONS.contains(&op.as_str()) {
            errs.unsupported(format!("{field}.operations[{i}]"), op, &OPERATIONS);
        }
    }
    if rule.operations.len() > 1 && rule.operations.iter().any(|o| o == "*") {
        errs.invalid(
            format!("{field}.operations"),
            "if '*' is present, must not specify other operations",
        );
    }
    for (name, list) in [
        ("apiGroups", &rule.api_groups),
        ("apiVersions", &rule.api_versions),
        ("resources", &rule.resources),
    ] {
        if list.is_empty() {
            errs.required(format!("{field}.{name}"), "");
        }
    }
    for (i, v) in rule.api_versions.iter().enumerate() {
        if v.is_empty() {
            errs.required(format!("{field}.apiVersions[{i}]"), "");
        }
    }
    for (i, r) in rule.resources.iter().enumerate() {
        if r.is_empty() {
            errs.required(format!("{field}.resources[{i}]"), "");
        }
    }
    if let Some(scope) = rule.scope.as_deref()
        && !SCOPES.contains(&scope)
    {
        errs.unsupported(format!("{field}.scope"), scope, &SCOPES);
    }
}

fn label_selector(sel: &LabelSelector, field: &str, errs: &mut Errors) {
    for (i, req) in sel.match_expressions.iter().enumerate() {
        let f = format!("{field}.matchExpressions[{i}]");
        if req.key.is_empty() {
            errs.required(format!("{f}.key"), "");
        }
        match req.operator.as_str() {
            "In" | "NotIn" => {
                if req.values.is_empty() {
                    errs.required(
                        format!("{f}.values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    );
                }
            }
            "Exists" | "DoesNotExist" => {
                if !req.values.is_empty() {
                    errs.forbidden(
                        format!("{f}.values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    );
                }
            }
            other => errs.invalid(
                format!("{f}.operator"),
                format!("{other:?}: not a valid selector operator"),
            ),
        }
    }
}

/// Names required and unique, expressions required.
fn named_expressions(list: &[NamedExpression], field: &str, errs: &mut Errors) {
    let mut seen = HashSet::new();
    for (i, item) in list.iter().enumerate() {
        if item.name.is_empty() {
            errs.required(format!("{field}[{i}].name"), "");
        } else if !seen.insert(item.name.as_str()) {
            errs.duplicate(format!("{field}[{i}].name"), &item.name);
        }
        if item.expression.trim().is_empty() {
            errs.required(format!("{field}[{i}].expression"), "");
        }
    }
}

fn attestors(list: &[Attestor], errs: &mut Errors) {
    let mut seen = HashSet::new();
    for (i, a) in list.iter().enumerate() {
        let field = format!("spec.attestors[{i}]");
        if a.name.is_empty() {
            errs.required(format!("{field}.name"), "");
        } else if !seen.insert(a.name.as_str()) {
            errs.duplicate(format!("{field}.name"), &a.name);
        }
        match (&a.cosign, &a.notary) {
            (Some(c), None) => cosign(c, &format!("{field}.cosign"), errs),
            (None, Some(n)) => notary(n, &format!("{field}.notary"), errs),
            _ => errs.invalid(field, "exactly one of cosign or notary must be set"),
        }
    }
}

fn cosign(c: &Cosign, field: &str, errs: &mut Errors) {
    if c.key.is_none() && c.keyless.is_none() && c.certificate.is_none() {
        errs.push(
            field,
            "cosign verifier needs to have one key, keyless or certificate fields set",
        );
    }
    if let Some(key) = &c.key {
        cosign_key(key, &format!("{field}.key"), errs);
    }
    if let Some(keyless) = &c.keyless {
        cosign_keyless(keyless, &format!("{field}.keyless"), errs);
    }
    if let Some(cert) = &c.certificate {
        let f = format!("{field}.certificate");
        match &cert.cert {
            Some(src) => string_source(src, &format!("{f}.cert"), true, errs),
            None => errs.required(format!("{f}.cert"), ""),
        }
        if let Some(chain) = &cert.cert_chain {
            string_source(chain, &format!("{f}.certChain"), true, errs);
        }
    }
    if let Some(ctlog) = &c.ctlog {
        let f = format!("{field}.ctlog");
        for (name, value) in [
            ("rekorPubKey", &ctlog.rekor_pub_key),
            ("ctLogPubKey", &ctlog.ct_log_pub_key),
            ("tsaCertChain", &ctlog.tsa_cert_chain),
        ] {
            if let Some(v) = value {
                pem_field(v, &format!("{f}.{name}"), false, errs);
            }
        }
        let no_url = ctlog.url.as_deref().is_none_or(str::is_empty);
        if no_url && !ctlog.insecure_ignore_tlog.unwrap_or(false) {
            errs.required(
                format!("{f}.url"),
                "rekor URL must be provided unless insecureIgnoreTlog is true",
            );
        }
    }
    let has_trusted_root = c.trusted_root.as_ref().is_some_and(|r| {
        r.value.as_deref().is_some_and(|v| !v.trim().is_empty())
            || r.expression
                .as_deref()
                .is_some_and(|e| !e.trim().is_empty())
    });
    if let Some(tuf) = &c.tuf
        && !has_trusted_root
    {
        tuf_checks(tuf, &format!("{field}.tuf"), errs);
    }
    if let Some(root) = &c.trusted_root {
        let f = format!("{field}.trustedRoot");
        if exactly_one_source(root, &f, errs)
            && let Some(v) = &root.value
            && let Err(e) = serde_json::from_str::<serde_json::Value>(v)
        {
            errs.invalid(
                format!("{f}.value"),
                format!("not a JSON trusted root: {e}"),
            );
        }
    }
}

fn cosign_key(key: &CosignKey, field: &str, errs: &mut Errors) {
    match (
        key.data.as_deref(),
        key.expression.as_deref(),
        key.kms.as_deref(),
    ) {
        (None, None, None) => errs.required(field, "one of data, expression or kms is required"),
        (Some(_), Some(_), _) => {
            errs.forbidden(field, "data and expression are mutually exclusive");
        }
        _ => {}
    }
    if let Some(data) = &key.data {
        pem_field(data, &format!("{field}.data"), false, errs);
    }
    if let Some(expr) = &key.expression
        && expr.trim().is_empty()
    {
        errs.required(format!("{field}.expression"), "");
    }
    if let Some(kms) = &key.kms {
        if !KMS_SCHEMES.iter().any(|s| kms.starts_with(s)) {
            errs.invalid(
                format!("{field}.kms"),
                format!("{kms:?}: must start with one of {}", KMS_SCHEMES.join(", ")),
            );
        } else {
            errs.forbidden(
                format!("{field}.kms"),
                "not supported: ivory reads no KMS; give the public key as data or expression",
            );
        }
    }
    if let Some(alg) = &key.hash_algorithm {
        if !HASH_ALGORITHMS.contains(&alg.as_str()) {
            errs.unsupported(format!("{field}.hashAlgorithm"), alg, &HASH_ALGORITHMS);
        } else if !SUPPORTED_HASH_ALGORITHMS.contains(&alg.as_str()) {
            errs.unsupported(
                format!("{field}.hashAlgorithm"),
                alg,
                &SUPPORTED_HASH_ALGORITHMS,
            );
        }
    }
}

fn cosign_keyless(keyless: &Keyless, field: &str, errs: &mut Errors) {
    if keyless.identities.is_empty() {
        errs.required(
            format!("{field}.identities"),
            "at least one identity is required",
        );
    }
    for (i, id) in keyless.identities.iter().enumerate() {
        let f = format!("{field}.identities[{i}]");
        let set = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
        // An identity without any constraint would accept every Fulcio certificate.
        if !set(&id.issuer)
            && !set(&id.issuer_reg_exp)
            && !set(&id.subject)
            && !set(&id.subject_reg_exp)
            && !set(&id.subject_expression)
        {
            errs.required(
                f.clone(),
                "at least one of issuer, issuerRegExp, subject, subjectRegExp or subjectExpression is required",
            );
        }
        for (name, value) in [
            ("issuerRegExp", &id.issuer_reg_exp),
            ("subjectRegExp", &id.subject_reg_exp),
        ] {
            if let Some(re) = value
                && let Err(e) = regex::Regex::new(re)
            {
                let first_line = e.to_string().lines().last().unwrap_or_default().to_owned();
                errs.invalid(format!("{f}.{name}"), format!("{re:?}: {first_line}"));
            }
        }
    }
    if let Some(roots) = &keyless.roots {
        pem_field(roots, &format!("{field}.roots"), false, errs);
    }
    for (key, value) in &keyless.additional_extensions {
        let f = format!("{field}.additionalExtensions.{key}");
        if !ADDITIONAL_EXTENSION_KEYS.contains(&key.as_str()) {
            errs.unsupported(f, key, &ADDITIONAL_EXTENSION_KEYS);
        } else if !value.is_string() {
            errs.invalid(f, format!("{value}: must be a string"));
        }
    }
}

fn notary(n: &Notary, field: &str, errs: &mut Errors) {
    match &n.certs {
        Some(src) => string_source(src, &format!("{field}.certs"), false, errs),
        None => errs.required(format!("{field}.certs"), ""),
    }
    if let Some(tsa) = &n.tsa_certs {
        string_source(tsa, &format!("{field}.tsaCerts"), false, errs);
    }
}

/// `{value}` xor `{expression}`; a value must be PEM.
fn string_source(src: &StringSource, field: &str, allow_base64: bool, errs: &mut Errors) {
    if exactly_one_source(src, field, errs)
        && let Some(v) = &src.value
    {
        pem_field(v, &format!("{field}.value"), allow_base64, errs);
    }
}

/// `cosign.tuf` as ivory fetches it (`ivory_verify::TufSources`): the mirror an http(s) URL,
/// `root.data` base64 of a root.json, `root.path` a file or an http(s) URL.
fn tuf_checks(tuf: &crate::types::Tuf, field: &str, errs: &mut Errors) {
    if let Some(mirror) = tuf.mirror.as_deref().filter(|m| !m.is_empty())
        && !(mirror.starts_with("https://") || mirror.starts_with("http://"))
    {
        errs.invalid(format!("{field}.mirror"), "must be an http or https URL");
    }
    let Some(root) = &tuf.root else {
        return;
    };
    if let Some(data) = root.data.as_deref().filter(|d| !d.is_empty()) {
        use base64::Engine as _;
        if base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .is_err()
        {
            errs.invalid(format!("{field}.root.data"), "must be base64 (a root.json)");
        }
    }
    if let Some(path) = root.path.as_deref().filter(|p| !p.is_empty())
        && path.contains("://")
        && !(path.starts_with("https://") || path.starts_with("http://"))
    {
        errs.invalid(
            format!("{field}.root.path"),
            "must be a file or an http or https URL",
        );
    }
}

fn exactly_one_source(src: &StringSource, field: &str, errs: &mut Errors) -> bool {
    match (&src.value, &src.expression) {
        (Some(_), None) => true,
        (None, Some(e)) => {
            if e.trim().is_empty() {
                errs.required(format!("{field}.expression"), "");
            }
            true
        }
        _ => {
            errs.invalid(field, "exactly one of value or expression must be set");
            false
        }
    }
}

fn pem_field(text: &str, field: &str, allow_base64: bool, errs: &mut Errors) {
    let checked = if allow_base64 {
        pem::check_maybe_base64(text)
    } else {
        pem::check(text)
    };
    if let Err(e) = checked {
        errs.invalid(field, format!("not valid PEM: {e}"));
    }
}

fn attestations(list: &[Attestation], errs: &mut Errors) {
    let mut seen = HashSet::new();
    for (i, a) in list.iter().enumerate() {
        let field = format!("spec.attestations[{i}]");
        if a.name.is_empty() {
            errs.required(format!("{field}.name"), "");
        } else if !seen.insert(a.name.as_str()) {
            errs.duplicate(format!("{field}.name"), &a.name);
        }
        match (&a.intoto, &a.referrer) {
            (Some(t), None) if t.type_.is_empty() => {
                errs.required(format!("{field}.intoto.type"), "");
            }
            (None, Some(t)) if t.type_.is_empty() => {
                errs.required(format!("{field}.referrer.type"), "");
            }
            (Some(_), None) | (None, Some(_)) => {}
            _ => errs.invalid(field, "exactly one of intoto or referrer must be set"),
        }
    }
}

/// `None` when `name` is a valid RFC 1123 subdomain, else the API server's explanation.
fn dns1123_subdomain(name: &str) -> Option<String> {
    if name.len() > 253 {
        return Some("must be no more than 253 characters".to_owned());
    }
    if name.split('.').all(is_dns1123_label) {
        None
    } else {
        Some(DNS1123_SUBDOMAIN_MSG.to_owned())
    }
}

fn dns1123_label(name: &str) -> Option<String> {
    if name.len() > 63 {
        return Some("must be no more than 63 characters".to_owned());
    }
    if is_dns1123_label(name) {
        None
    } else {
        Some(DNS1123_LABEL_MSG.to_owned())
    }
}

fn is_dns1123_label(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|&c| alnum(c) || c == b'-')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
