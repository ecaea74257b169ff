//! CEL scopes per field, variable ordering, attestor field pointers, defaults and hashing.

use ivory_testkit::cases::Failures;
use serde_json::{Value, json};

use crate::compiled::ImageMatcher;
use crate::testutil::{base, errors_after, load, patch};
use crate::types::{FailurePolicy, ValidationAction};

type Patch = (&'static str, Option<Value>);

fn set(pointer: &'static str, v: Value) -> Patch {
    (pointer, Some(v))
}

/// One CEL field's error: the patch to the valid base policy and the errors it gives.
type CelCase = (&'static str, Vec<Patch>, Vec<&'static str>);

/// Each CEL field with an error, and what the error says.
fn cel_error_cases() -> Vec<CelCase> {
    vec![
        (
            "a validation's expression",
            vec![set(
                "/spec/validations/0/expression",
                json!("imagez.containers.size() > 0"),
            )],
            vec!["spec.validations[0].expression: undeclared reference 'imagez'"],
        ),
        (
            "a validation's messageExpression",
            vec![set(
                "/spec/validations/0/messageExpression",
                json!("'bad ' + nope"),
            )],
            vec!["spec.validations[0].messageExpression: undeclared reference 'nope'"],
        ),
        (
            "a matchCondition using variables",
            vec![set(
                "/spec/matchConditions/0/expression",
                json!("variables.first == 'x'"),
            )],
            vec![
                "spec.matchConditions[0].expression: undeclared reference 'variables' (matchConditions can only use object, oldObject, request and namespaceObject)",
            ],
        ),
        (
            "a matchCondition using images",
            vec![set(
                "/spec/matchConditions/0/expression",
                json!("images.containers.size() > 0"),
            )],
            vec![
                "spec.matchConditions[0].expression: undeclared reference 'images' (matchConditions can only use object, oldObject, request and namespaceObject)",
            ],
        ),
        (
            "a matchImageReferences expression using object",
            vec![set(
                "/spec/matchImageReferences/0",
                json!({"expression": "object.metadata.name == ref"}),
            )],
            vec!["spec.matchImageReferences[0].expression: undeclared reference 'object'"],
        ),
        (
            "an images expression",
            vec![set(
                "/spec/images",
                json!([{"name": "x", "expression": "[objekt.a]"}]),
            )],
            vec!["spec.images[0].expression: undeclared reference 'objekt'"],
        ),
        (
            "an auditAnnotation",
            vec![set(
                "/spec/auditAnnotations",
                json!([{"key": "k", "valueExpression": "nope"}]),
            )],
            vec!["spec.auditAnnotations[0].valueExpression: undeclared reference 'nope'"],
        ),
        (
            "an attestor key expression",
            vec![set(
                "/spec/attestors/0/cosign/key",
                json!({"expression": "variables.nokey"}),
            )],
            vec!["spec.attestors[0].cosign.key.expression: undeclared variable 'variables.nokey'"],
        ),
        (
            "a variable using a later one",
            vec![set(
                "/spec/variables/0/expression",
                json!("variables.second + 'y'"),
            )],
            vec![
                "spec.variables[0].expression: variable 'variables.second' is declared at or after this one (spec.variables[1]); a variable may only use earlier variables",
            ],
        ),
        (
            "a variable using itself",
            vec![set(
                "/spec/variables/0/expression",
                json!("variables.first"),
            )],
            vec![
                "spec.variables[0].expression: variable 'variables.first' is declared at or after this one (spec.variables[0]); a variable may only use earlier variables",
            ],
        ),
        (
            "undeclared attestor and attestation",
            vec![set(
                "/spec/validations/0/expression",
                json!(
                    "verifyImageSignatures('x', [attestors.cosgin]) > 0 && verifyAttestationSignatures('x', attestations['sbom'], [attestors['cosign']]) > 0"
                ),
            )],
            vec![
                "spec.validations[0].expression: undeclared attestor 'cosgin' (declared: cosign)",
                "spec.validations[0].expression: undeclared attestation 'sbom' (declared: slsa)",
            ],
        ),
        (
            "the http library",
            vec![set(
                "/spec/validations/0/expression",
                json!("http.Get('https://example.com/keys').ok"),
            )],
            vec![
                "spec.validations[0].expression: Kyverno library 'http' is not supported by ivory: an admission never makes an HTTP call a policy chooses",
            ],
        ),
        (
            "resource.Post",
            vec![set(
                "/spec/validations/0/expression",
                json!("resource.Post('v1', 'configmaps', 'ns', {}) != null"),
            )],
            vec![
                "spec.validations[0].expression: Kyverno function 'resource.Post' is not supported by ivory: it reads cluster objects from watch caches (resource.Get, resource.List) and never writes",
            ],
        ),
        (
            "resource.Get of secrets",
            vec![set(
                "/spec/validations/0/expression",
                json!("resource.Get('v1', 'secrets', object.metadata.namespace, 'k') != null"),
            )],
            vec![
                "spec.validations[0].expression: resource.Get: reading secrets is refused: ivory does not read Secrets for policies: it would hold every Secret of the namespace in memory, and a policy could copy one into a message, an annotation or a report",
            ],
        ),
        (
            "non-literal resource and globalContext names",
            vec![set(
                "/spec/validations/0/expression",
                json!(
                    "resource.list(object.apiVersion, 'configmaps', '').items.size() > 0 && globalContext.Get(object.kind, '') != null"
                ),
            )],
            vec![
                "spec.validations[0].expression: resource.list: apiVersion and resource must be string literals, so that ivory knows which resources to watch from the policy alone",
                "spec.validations[0].expression: globalContext.Get: the entry name must be a string literal (ivory knows which GlobalContextEntries to read from the policy alone)",
            ],
        ),
        (
            "resource in matchImageReferences",
            vec![set(
                "/spec/matchImageReferences",
                json!([{"expression": "ref.startsWith(resource.Get('v1', 'configmaps', 'ivory', 'r').data.prefix)"}]),
            )],
            vec![
                "spec.matchImageReferences[0].expression: resource and globalContext are not available in matchImageReferences (Kyverno's match environment has no libraries): read the cluster in a validation",
            ],
        ),
        (
            "resource.Get overload",
            vec![set(
                "/spec/validations/0/expression",
                json!("resource.Get('v1', 'configmaps', 'keys') != null"),
            )],
            vec![
                "spec.validations[0].expression: resource.Get: found no matching overload (takes (apiVersion, resource, namespace, name))",
            ],
        ),
    ]
}

#[test]
fn cel_errors_name_the_field() {
    let mut failures = Failures::new();
    for (name, patches, expected) in cel_error_cases() {
        failures.check_eq(name, "errors", errors_after(&patches), expected);
    }
    failures.assert_none();
}

#[test]
fn json_mode_binds_only_object_images_attestors_attestations() {
    let mut doc = base();
    patch(&mut doc, "/spec/evaluation", Some(json!({"mode": "JSON"})));
    patch(&mut doc, "/spec/variables", None);
    patch(&mut doc, "/spec/matchConditions", None);
    patch(
        &mut doc,
        "/spec/images",
        Some(json!([{"name": "bar", "expression": "[object.foo.bar]"}])),
    );
    patch(
        &mut doc,
        "/spec/validations/1",
        Some(json!({"expression": "images.bar.size() > 0 && attestations.slsa != ''"})),
    );
    let report = load(&doc);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(report.policies[0].json_mode);

    patch(
        &mut doc,
        "/spec/validations/1/expression",
        Some(json!("oldObject == null")),
    );
    patch(
        &mut doc,
        "/spec/variables",
        Some(json!([{"name": "v", "expression": "request.name"}])),
    );
    let got: Vec<String> = load(&doc)
        .errors
        .iter()
        .map(|e| format!("{}: {}", e.field, e.reason))
        .collect();
    assert_eq!(
        got,
        [
            "spec.variables[0].expression: undeclared reference 'request' (evaluation.mode JSON binds only object, images, attestors and attestations)",
            "spec.validations[1].expression: undeclared reference 'oldObject' (evaluation.mode JSON binds only object, images, attestors and attestations)",
        ]
    );
}

#[test]
fn compiled_fields_and_defaults() {
    let mut doc = base();
    patch(
        &mut doc,
        "/spec/matchImageReferences/1",
        Some(json!({"expression": "ref.startsWith('docker.io/')"})),
    );
    patch(
        &mut doc,
        "/spec/validations/0/messageExpression",
        Some(json!("'unsigned: ' + object.metadata.name")),
    );
    patch(
        &mut doc,
        "/spec/auditAnnotations",
        Some(json!([{"key": "who", "valueExpression": "request.userInfo.username"}])),
    );
    patch(
        &mut doc,
        "/spec/attestors/1",
        Some(json!({"name": "cert", "cosign": {"certificate": {
        "cert": {"expression": "variables.first"}, "certChain": {"expression": "variables.second"}
    }, "trustedRoot": {"expression": "'{}'"}}})),
    );
    patch(
        &mut doc,
        "/spec/attestors/2",
        Some(json!({"name": "keyexpr", "cosign": {"key": {"expression": "variables.first"}}})),
    );
    patch(
        &mut doc,
        "/spec/attestors/3",
        Some(json!({"name": "notary", "notary": {
            "certs": {"expression": "variables.first"}, "tsaCerts": {"expression": "variables.second"}
        }})),
    );
    let report = load(&doc);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let p = &report.policies[0];
    assert_eq!(p.name, "base");
    assert_eq!(p.namespace, None);
    assert_eq!(p.actions, [ValidationAction::Deny]);
    assert_eq!(p.failure_policy, FailurePolicy::Fail);
    assert!(p.mutate_digest && p.verify_digest && p.required && !p.json_mode);
    assert!(p.spec.admission_enabled() && p.spec.background_enabled());
    assert_eq!(p.spec.timeout_seconds(), None);
    assert_eq!(p.autogen_config, None);
    assert_eq!(p.match_conditions[0].name, "not-system");
    assert_eq!(
        p.match_conditions[0].program.source(),
        "request.namespace != 'kube-system'"
    );
    assert_eq!(
        p.variables
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>(),
        ["first", "second"]
    );
    assert_eq!(p.variables[1].program.variable_refs(), ["first"]);
    assert!(
        matches!(&p.image_matchers[0], ImageMatcher::Glob { pattern, matcher }
        if pattern == "ghcr.io/*" && matcher.is_match("ghcr.io/kyverno/test-verify-image:signed"))
    );
    assert!(
        matches!(&p.image_matchers[1], ImageMatcher::Expression(prog)
        if prog.source() == "ref.startsWith('docker.io/')")
    );
    assert_eq!(p.validations[0].message.as_deref(), Some("not signed"));
    assert!(p.validations[0].message_expression.is_some());
    assert!(
        p.validations[0]
            .expression
            .calls_function("verifyImageSignatures")
    );
    assert_eq!(p.audit_annotations[0].key, "who");
    assert_eq!(p.attestations[0].name, "slsa");
    let pointers: Vec<Vec<&str>> = p
        .attestors
        .iter()
        .map(|a| a.fields.iter().map(|(ptr, _)| ptr.as_str()).collect())
        .collect();
    assert_eq!(
        pointers,
        vec![
            vec![],
            vec![
                "/cosign/certificate/cert/value",
                "/cosign/certificate/certChain/value",
                "/cosign/trustedRoot/value"
            ],
            vec!["/cosign/key/data"],
            vec!["/notary/certs/value", "/notary/tsaCerts/value"],
        ]
    );
    assert_eq!(p.attestors[3].fields[1].1.source(), "variables.second");
}

#[test]
fn explicit_flags_override_defaults() {
    let mut doc = base();
    patch(
        &mut doc,
        "/spec/validationActions",
        Some(json!(["Warn", "Audit", "Warn"][..2].to_vec())),
    );
    patch(&mut doc, "/spec/failurePolicy", Some(json!("Ignore")));
    patch(
        &mut doc,
        "/spec/validationConfigurations",
        Some(json!({"mutateDigest": false, "verifyDigest": false, "required": false})),
    );
    patch(
        &mut doc,
        "/spec/evaluation",
        Some(json!({"admission": {"enabled": false}, "background": {"enabled": false}})),
    );
    patch(
        &mut doc,
        "/spec/webhookConfiguration",
        Some(json!({"timeoutSeconds": 7})),
    );
    let report = load(&doc);
    let p = &report.policies[0];
    assert_eq!(p.actions, [ValidationAction::Audit, ValidationAction::Warn]);
    assert_eq!(p.failure_policy, FailurePolicy::Ignore);
    assert!(!p.mutate_digest && !p.verify_digest && !p.required);
    assert!(!p.spec.admission_enabled() && !p.spec.background_enabled());
    assert_eq!(p.spec.timeout_seconds(), Some(7));
}

fn hash_of(doc: &Value) -> String {
    let report = load(doc);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies[0].hash.clone()
}

#[test]
fn hash_is_stable_and_changes_on_edit() {
    let doc = base();
    let h = hash_of(&doc);
    assert_eq!(h.len(), 64);
    assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(h, hash_of(&doc), "same input, same hash");

    // Key order and YAML vs JSON do not matter: the spec is canonicalised.
    let yaml = serde_saphyr::to_string(&doc).unwrap();
    let from_yaml = crate::load::load_str(&yaml, "t.yaml");
    assert_eq!(from_yaml.policies[0].hash, h);

    let mut edited = doc.clone();
    patch(
        &mut edited,
        "/spec/validations/0/message",
        Some(json!("still not signed")),
    );
    assert_ne!(hash_of(&edited), h);

    let mut renamed = doc.clone();
    patch(&mut renamed, "/metadata/name", Some(json!("other")));
    assert_ne!(hash_of(&renamed), h);

    let mut namespaced = doc.clone();
    patch(
        &mut namespaced,
        "/kind",
        Some(json!("NamespacedImageValidatingPolicy")),
    );
    patch(
        &mut namespaced,
        "/metadata/namespace",
        Some(json!("team-a")),
    );
    assert_ne!(hash_of(&namespaced), h);

    // Metadata outside kind/namespace/name (labels) is not part of the policy's behaviour.
    let mut labelled = doc.clone();
    patch(
        &mut labelled,
        "/metadata/labels",
        Some(json!({"team": "a"})),
    );
    assert_eq!(hash_of(&labelled), h);

    // The alias kind is the same policy kind.
    let mut alias = doc;
    patch(&mut alias, "/kind", Some(json!("ImageVerificationPolicy")));
    assert_eq!(hash_of(&alias), h);
}

#[test]
fn compile_without_file_is_located_by_kind_and_name() {
    let mut doc = base();
    patch(&mut doc, "/spec/failurePolicy", Some(json!("Later")));
    let parsed: crate::types::PolicyDocument = serde_json::from_value(doc.clone()).unwrap();
    let errors = crate::compile(&parsed, crate::Origin::default()).unwrap_err();
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "ImageValidatingPolicy/base: spec.failurePolicy: Unsupported value: \"Later\": supported values: \"Ignore\", \"Fail\""
        ]
    );

    patch(
        &mut doc,
        "/kind",
        Some(json!("NamespacedImageValidatingPolicy")),
    );
    patch(&mut doc, "/metadata/namespace", Some(json!("team-a")));
    let parsed: crate::types::PolicyDocument = serde_json::from_value(doc).unwrap();
    let errors = crate::compile(&parsed, crate::Origin::default()).unwrap_err();
    assert_eq!(
        errors[0].to_string(),
        "NamespacedImageValidatingPolicy/team-a/base: spec.failurePolicy: Unsupported value: \"Later\": supported values: \"Ignore\", \"Fail\""
    );
}

#[test]
fn compile_rejects_foreign_kinds() {
    let mut doc = base();
    patch(&mut doc, "/kind", Some(json!("ValidatingPolicy")));
    let parsed: crate::types::PolicyDocument = serde_json::from_value(doc).unwrap();
    let errors = crate::compile(&parsed, crate::Origin::default()).unwrap_err();
    assert_eq!(
        errors[0].to_string(),
        "ValidatingPolicy/base: kind: Unsupported value: \"ValidatingPolicy\": supported values: \"ImageValidatingPolicy\", \"ImageVerificationPolicy\", \"NamespacedImageValidatingPolicy\""
    );
}

#[test]
fn a_costly_expression_is_refused_naming_policy_field_and_expression() {
    let nested = "object.spec.containers.all(a, object.spec.containers.all(b, \
                  object.spec.containers.all(c, a.name != b.name || b.name != c.name)))";
    for pointer in [
        "/spec/validations/0/expression",
        "/spec/validations/0/messageExpression",
        "/spec/matchConditions/0/expression",
        "/spec/variables/0/expression",
    ] {
        let errors = errors_after(&[set(pointer, json!(nested))]);
        let field = pointer
            .trim_start_matches('/')
            .replace("/0/", "[0].")
            .replace('/', ".");
        let error = errors
            .iter()
            .find(|e| e.contains("too costly"))
            .unwrap_or_else(|| panic!("{pointer}: {errors:?}"));
        assert!(
            error.contains(&format!("{field}: policy \"base\"")),
            "{error}"
        );
        assert!(error.contains(nested), "{error}");
    }
}

#[test]
fn the_pinning_annotation_is_read_checked_and_shared_with_autogen_variants() {
    use crate::compiled::Pinning;
    let with = |value: Value, validation_configurations: Option<Value>| {
        let mut doc = base();
        patch(
            &mut doc,
            "/metadata/annotations",
            Some(json!({"ivory.dev/digest-pinning": value})),
        );
        if let Some(v) = validation_configurations {
            patch(&mut doc, "/spec/validationConfigurations", Some(v));
        }
        load(&doc)
    };
    assert_eq!(load(&base()).policies[0].pinning, Pinning::All);
    for (value, mode) in [
        ("all", Pinning::All),
        ("pods-only", Pinning::PodsOnly),
        ("no-patch", Pinning::NoPatch),
    ] {
        let report = with(json!(value), None);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        let p = &report.policies[0];
        assert_eq!(p.pinning, mode);
        assert!(!p.autogen.is_empty());
        assert!(p.autogen.iter().all(|v| v.pinning == mode), "{value}");
    }
    let errors = |report: crate::load::LoadReport| -> Vec<String> {
        report.errors.iter().map(|e| e.to_string()).collect()
    };
    let report = with(json!("pods"), None);
    assert!(report.policies.is_empty());
    let text = errors(report).join("\n");
    assert!(
        text.contains(
            "metadata.annotations[ivory.dev/digest-pinning]: Unsupported value: \"pods\": supported values: \"all\", \"pods-only\", \"no-patch\""
        ),
        "{text}"
    );
    // Where to pin means nothing to a policy that never pins: refused, not ignored.
    let report = with(json!("pods-only"), Some(json!({"mutateDigest": false})));
    let text = errors(report).join("\n");
    assert!(
        text.contains("metadata.annotations[ivory.dev/digest-pinning]: Invalid value")
            && text.contains("mutateDigest is false"),
        "{text}"
    );
    let report = with(json!("all"), Some(json!({"mutateDigest": false})));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

#[test]
fn a_namespace_label_narrows_pinning_and_chooses_no_patch_only_where_the_policy_allows() {
    use crate::compiled::Pinning;
    let ns = |value: &str| json!({"metadata": {"name": "team", "labels": {"ivory.dev/digest-pinning": value}}});
    let (pods_only, no_patch, all) = (ns("pods-only"), ns("no-patch"), ns("all"));
    for may_skip in [false, true] {
        assert_eq!(
            Pinning::All.effective(Some(&pods_only), may_skip),
            Pinning::PodsOnly
        );
        // A label never widens a policy's choice.
        assert_eq!(
            Pinning::PodsOnly.effective(Some(&all), may_skip),
            Pinning::PodsOnly
        );
        assert_eq!(
            Pinning::NoPatch.effective(Some(&pods_only), may_skip),
            Pinning::NoPatch
        );
        assert_eq!(Pinning::All.effective(None, may_skip), Pinning::All);
        assert_eq!(
            Pinning::ignored_namespace_label(Some(&pods_only), may_skip),
            None
        );
        assert_eq!(
            Pinning::ignored_namespace_label(Some(&ns("sometimes")), may_skip),
            Some("sometimes")
        );
    }
    // no-patch only with the policy's consent.
    assert_eq!(Pinning::All.effective(Some(&no_patch), false), Pinning::All);
    assert_eq!(
        Pinning::ignored_namespace_label(Some(&no_patch), false),
        Some("no-patch")
    );
    assert_eq!(
        Pinning::All.effective(Some(&no_patch), true),
        Pinning::NoPatch
    );
    assert_eq!(
        Pinning::PodsOnly.effective(Some(&no_patch), true),
        Pinning::NoPatch
    );
    assert_eq!(
        Pinning::ignored_namespace_label(Some(&no_patch), true),
        None
    );
    assert!(Pinning::PodsOnly.pins("Pod") && !Pinning::PodsOnly.pins("Deployment"));
    assert!(!Pinning::NoPatch.pins("Pod") && Pinning::All.pins("CronJob"));

    // The consent is the annotation ivory.dev/namespace-digest-pinning: any.
    let with = |value: &str| {
        let mut doc = base();
        patch(
            &mut doc,
            "/metadata/annotations",
            Some(json!({"ivory.dev/namespace-digest-pinning": value})),
        );
        load(&doc)
    };
    assert!(!load(&base()).policies[0].namespace_may_skip_pinning);
    let report = with("any");
    let p = &report.policies[0];
    assert!(p.namespace_may_skip_pinning);
    assert!(p.autogen.iter().all(|v| v.namespace_may_skip_pinning));
    assert_eq!(p.pinning_for(Some(&no_patch)), Pinning::NoPatch);
    assert!(!with("pods-only").policies[0].namespace_may_skip_pinning);
    let report = with("yes");
    assert!(report.policies.is_empty());
    let text: Vec<String> = report.errors.iter().map(|e| e.to_string()).collect();
    assert!(
        text.join("\n").contains(
            "metadata.annotations[ivory.dev/namespace-digest-pinning]: Unsupported value: \"yes\""
        ),
        "{text:?}"
    );
}

#[test]
fn the_verify_platforms_annotation_is_compiled_or_refused_never_ignored() {
    use crate::compiled::{VERIFY_PLATFORMS_ANNOTATION, VerifyPlatforms};
    let with = |value: &str| {
        let mut doc = base();
        patch(
            &mut doc,
            "/metadata/annotations",
            Some(json!({ VERIFY_PLATFORMS_ANNOTATION: value })),
        );
        doc
    };
    let plain = load(&base());
    assert_eq!(plain.policies[0].verify_platforms, VerifyPlatforms::Index);
    for (value, want) in [
        ("index", VerifyPlatforms::Index),
        ("allPlatforms", VerifyPlatforms::AllPlatforms),
        ("podPlatform", VerifyPlatforms::PodPlatform),
    ] {
        let report = load(&with(value));
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        let policy = &report.policies[0];
        assert_eq!(policy.verify_platforms, want);
        // Autogen variants verify the same platforms (their Pods run the same images).
        assert!(policy.autogen.iter().all(|v| v.verify_platforms == want));
    }
    // Another choice is another policy; `index` is the default spelled out.
    assert_eq!(hash_of(&with("index")), hash_of(&base()));
    assert_ne!(hash_of(&with("allPlatforms")), hash_of(&base()));
    let errors = errors_after(&[(
        "/metadata/annotations",
        Some(json!({ VERIFY_PLATFORMS_ANNOTATION: "everything" })),
    )]);
    assert_eq!(
        errors,
        [format!(
            "metadata.annotations[{VERIFY_PLATFORMS_ANNOTATION}]: Unsupported value: \"everything\": supported values: \"index\", \"allPlatforms\", \"podPlatform\""
        )]
    );
}

#[test]
fn the_notation_trust_policy_annotation_reaches_notary_attestors_or_refuses_the_policy() {
    use crate::notation::{Level, NOTATION_TRUST_POLICY_ANNOTATION};
    const ROOT: &str = include_str!("../../../../fixtures/notation/pki/root.pem");
    let with = |value: &str| {
        let mut doc = base();
        patch(
            &mut doc,
            "/spec/attestors/1",
            Some(json!({"name": "notary", "notary": {"certs": {"value": ROOT}}})),
        );
        patch(
            &mut doc,
            "/metadata/annotations",
            Some(json!({ NOTATION_TRUST_POLICY_ANNOTATION: value })),
        );
        doc
    };
    let report = load(&with(
        r#"{"notary": {"level": "audit", "trustedIdentities": ["*"]}}"#,
    ));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let policy = &report.policies[0];
    let trust = |p: &crate::CompiledPolicy| {
        p.attestors
            .iter()
            .find(|a| a.attestor.name == "notary")
            .and_then(|a| a.attestor.notary.as_ref())
            .and_then(|n| n.trust_policy.clone())
    };
    assert_eq!(trust(policy).unwrap().level, Some(Level::Audit));
    // Autogen variants verify with the same trust policy.
    assert!(!policy.autogen.is_empty());
    assert!(policy.autogen.iter().all(|v| trust(v) == trust(policy)));
    // Another trust policy is another policy.
    assert_ne!(
        hash_of(&with(r#"{"notary": {"level": "audit"}}"#)),
        hash_of(&with(r#"{"notary": {"level": "permissive"}}"#))
    );
    let field = format!("metadata.annotations[{NOTATION_TRUST_POLICY_ANNOTATION}]");
    for (value, want) in [
        (
            r#"{"cosign": {"level": "audit"}}"#,
            format!(
                "{field}.cosign: Invalid value: spec.attestors has no notary attestor named \"cosign\""
            ),
        ),
        (
            r#"{"notary": {"override": {"integrity": "log"}}}"#,
            format!(
                "{field}.notary.override.integrity: Invalid value: integrity is always enforced"
            ),
        ),
        (
            r#"{"notary": {"levle": "audit"}}"#,
            format!(
                "{field}: Invalid value: not a JSON object of attestor name to Notation trust policy: unknown field `levle`"
            ),
        ),
    ] {
        let report = load(&with(value));
        let errors: Vec<String> = report.errors.iter().map(|e| e.to_string()).collect();
        assert!(
            errors.iter().any(|e| e.contains(&want)),
            "{value}: {errors:?}"
        );
    }
    // Written in the spec, it is an unknown field, never a silent trust policy.
    let mut doc = with("{}");
    doc["spec"]["attestors"][1]["notary"]["ivory.dev/notationTrustPolicy"] =
        json!({"level": "audit"});
    let report = load(&doc);
    assert!(
        report
            .errors
            .iter()
            .any(|e| e.to_string().contains("notationTrustPolicy")),
        "{:?}",
        report.errors
    );
}
