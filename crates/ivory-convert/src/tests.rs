//! Conversion tests: every converted policy must load in ivory.

use super::*;

fn convert_ok(text: &str) -> Conversion {
    let conversion = convert_str(text, "test.yaml").unwrap_or_else(|e| panic!("{e}"));
    let report = ivory_policy::load_str(&conversion.yaml, "converted.yaml");
    assert!(
        report.errors.is_empty(),
        "{:?}\n{}",
        report.errors,
        conversion.yaml
    );
    conversion
}

const PEM: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv\nDLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==\n-----END PUBLIC KEY-----";

/// The PEM key as a YAML block scalar body indented by `n` spaces.
fn key(n: usize) -> String {
    let pad = " ".repeat(n);
    PEM.lines()
        .map(|l| format!("{pad}{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_key_rule_converts_and_loads() {
    let key = key(14);
    let text = format!(
        r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {{name: check-images}}
spec:
  validationFailureAction: Enforce
  webhookTimeoutSeconds: 15
  rules:
  - name: signed
    match: {{any: [{{resources: {{kinds: [Pod]}}}}]}}
    verifyImages:
    - imageReferences: ["ghcr.io/acme/*"]
      skipImageReferences: ["ghcr.io/acme/skip*"]
      attestors:
      - entries:
        - keys:
            publicKeys: |-
{key}
            rekor: {{ignoreTlog: true, url: https://rekor.sigstore.dev}}
  - name: other
    match: {{any: [{{resources: {{kinds: [Pod]}}}}]}}
    validate: {{message: x, pattern: {{}}}}
"#
    );
    let c = convert_ok(&text);
    assert_eq!(c.policies.len(), 1);
    assert_eq!(c.reports.len(), 2);
    let by_rule = |name: &str| c.reports.iter().find(|r| r.rule == name).unwrap();
    assert_eq!(
        by_rule("signed").outcome,
        Outcome::Exact,
        "{}",
        by_rule("signed")
    );
    assert!(matches!(by_rule("other").outcome, Outcome::Skipped { .. }));
    let p = &c.policies[0];
    assert_eq!(p.metadata.name, "check-images-signed");
    assert_eq!(p.spec.validation_actions, ["Deny"]);
    assert_eq!(p.spec.timeout_seconds(), Some(15));
}

#[test]
fn refused_rules_name_policy_rule_and_field_and_nothing_is_converted_for_them() {
    let text = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {name: p}
spec:
  validationFailureAction: Enforce
  rules:
  - name: kms
    match: {any: [{resources: {kinds: [Pod]}}]}
    verifyImages:
    - imageReferences: ["*"]
      attestors: [{entries: [{keys: {kms: "awskms:///arn"}}]}]
  - name: cond
    match: {any: [{resources: {kinds: [Pod]}}]}
    verifyImages:
    - imageReferences: ["*"]
      attestations:
      - type: https://slsa.dev/provenance/v0.2
        attestors: [{entries: [{keyless: {subject: a, issuer: b, rekor: {url: https://rekor.sigstore.dev}}}]}]
        conditions:
        - all:
          - key: "{{ to_upper(builder.id) }}"
            operator: Equals
            value: X
"#;
    let c = convert_str(text, "t.yaml").unwrap();
    assert!(c.refused());
    assert!(c.policies.is_empty());
    let lines: Vec<String> = c.reports.iter().map(ToString::to_string).collect();
    assert!(
        lines[0].contains(
            "ClusterPolicy/p, rule kms: refused: verifyImages[0].attestors[0].entries[0].keys.kms"
        ),
        "{lines:?}"
    );
    assert!(
        lines[1].contains(
            "rule cond: refused: verifyImages[0].attestations[0].conditions[0].all[0].key"
        ),
        "{lines:?}"
    );
}

#[test]
fn unknown_fields_and_bad_documents_are_named() {
    let text = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {name: p}
spec:
  rules:
  - name: r
    match: {any: [{resources: {kinds: [Pod]}}]}
    verifyImages:
    - imageReferences: ["*"]
      mutateDigest: false
      attestorz: []
"#;
    let c = convert_str(text, "t.yaml").unwrap();
    assert!(
        c.reports[0]
            .to_string()
            .contains("verifyImages[0].attestorz: unknown field `attestorz`"),
        "{}",
        c.reports[0]
    );
    let err = convert_str(
        "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata: {}\nspec: {rules: []}\n",
        "t.yaml",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("metadata.name: Required value"),
        "{err}"
    );
    // A Policy without a namespace (as the Kyverno CLI's test suites write them) goes to
    // `default`, and the report says so.
    let c = convert_ok(
        "apiVersion: kyverno.io/v1\nkind: Policy\nmetadata: {name: p}\nspec:\n  validationFailureAction: Enforce\n  rules:\n  - name: r\n    match: {any: [{resources: {kinds: [Pod]}}]}\n    verifyImages:\n    - imageReferences: ['*']\n      required: false\n",
    );
    assert_eq!(c.policies[0].metadata.namespace.as_deref(), Some("default"));
    assert!(
        c.reports[0]
            .to_string()
            .contains("metadata.namespace: not set"),
        "{}",
        c.reports[0]
    );
    let err = convert_str(&"a".repeat(MAX_INPUT_BYTES + 1), "big.yaml").unwrap_err();
    assert!(err.to_string().starts_with("big.yaml: input is"), "{err}");
}

#[test]
fn keyless_attestations_with_conditions_audit_and_a_namespaced_policy() {
    let text = r#"
apiVersion: kyverno.io/v2beta1
kind: Policy
metadata: {name: slsa, namespace: shop}
spec:
  validationFailureAction: Audit
  failurePolicy: Ignore
  background: false
  rules:
  - name: provenance
    match:
      any:
      - resources: {kinds: [Pod], namespaces: [shop]}
    exclude:
      any:
      - subjects: [{kind: ServiceAccount, name: deployer, namespace: ci}]
    verifyImages:
    - imageReferences: ["registry.example/*"]
      mutateDigest: false
      verifyDigest: false
      attestations:
      - predicateType: https://slsa.dev/provenance/v0.2
        attestors:
        - count: 1
          entries:
          - keyless:
              subject: https://github.com/acme/*
              issuer: https://token.actions.githubusercontent.com
              rekor: {url: https://rekor.sigstore.dev}
          - keyless:
              subjectRegExp: ".*@acme.example"
              issuerRegExp: ".*"
              rekor: {url: https://rekor.sigstore.dev}
        conditions:
        - any:
          - key: "{{ builder.id }}"
            operator: Equals
            value: "https://github.com/acme/*"
          - key: "{{ buildType }}"
            operator: AnyIn
            value: [a, b]
"#;
    let c = convert_ok(text);
    let p = &c.policies[0];
    assert_eq!(p.kind, "NamespacedImageValidatingPolicy");
    assert_eq!(p.metadata.namespace.as_deref(), Some("shop"));
    assert_eq!(p.spec.validation_actions, ["Audit"]);
    assert_eq!(p.spec.failure_policy.as_deref(), Some("Ignore"));
    assert!(!p.spec.background_enabled());
    let validations = p.spec.validations.as_ref().unwrap();
    assert_eq!(validations.len(), 6);
    assert!(validations[0].expression.contains("verifyAttestationSignatures(image, attestations.a0, [attestors.a0s0e0, attestors.a0s0e1]) >= 1"), "{}", validations[0].expression);
    assert!(
        validations[3]
            .expression
            .contains("extractPayload(image, attestations.a0).predicate"),
        "{}",
        validations[3].expression
    );
    let names: Vec<&str> = p
        .spec
        .match_conditions
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["match", "exclude-0"]);
    // Kyverno matches `subject` as a wildcard: the genuine workflow's signature must pass.
    let attestors = p.spec.attestors.as_ref().unwrap();
    let keyless = attestors[0].cosign.as_ref().unwrap().keyless.as_ref();
    let identities = &keyless.unwrap().identities;
    assert_eq!(identities[0].subject, None, "{identities:?}");
    assert_eq!(
        identities[0].subject_reg_exp.as_deref(),
        Some(r"^https://github\.com/acme/.*$")
    );
    assert_eq!(
        identities[0].issuer.as_deref(),
        Some("https://token.actions.githubusercontent.com")
    );
    assert!(
        p.spec.match_conditions[1]
            .expression
            .contains("system:serviceaccount:ci:deployer")
    );
}

#[test]
fn autogen_follows_kyvernos_policy_wide_rule_and_reports_keep_input_order() {
    let text = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {name: p}
spec:
  validationFailureAction: Enforce
  rules:
  - name: by-name
    match: {any: [{resources: {kinds: [Pod], names: ["web-*"]}}]}
    validate: {message: x, pattern: {}}
  - name: digests
    match: {any: [{resources: {kinds: [Pod]}}]}
    verifyImages:
    - imageReferences: ["ghcr.io/*"]
      required: false
"#;
    let c = convert_ok(text);
    let rules: Vec<&str> = c.reports.iter().map(|r| r.rule.as_str()).collect();
    assert_eq!(rules, ["by-name", "digests"]);
    assert_eq!(
        c.policies[0].spec.autogen_controllers(),
        Vec::<String>::new()
    );
    // Without the named rule, Kyverno (and the conversion) extend the rule to controllers.
    let alone = text.replace("  - name: by-name\n    match: {any: [{resources: {kinds: [Pod], names: [\"web-*\"]}}]}\n    validate: {message: x, pattern: {}}\n", "");
    let c = convert_ok(&alone);
    assert_eq!(c.policies[0].spec.autogen_controllers().len(), 6);
}

#[test]
fn errors_are_std_errors_the_binary_can_wrap() {
    // `ivory convert` and `ivory test` wrap them in anyhow (`with_context`, `{e}`).
    fn wrappable<E: std::error::Error + Send + Sync + 'static>() {}
    wrappable::<LegacyError>();
    wrappable::<ConvertError>();
    let e = convert_str("{\"a\": ", "t.json").unwrap_err();
    assert_eq!(e.error.path, FieldPath::Document(String::new()));
    assert!(
        matches!(e.error.kind, ErrorKind::Syntax { format: "JSON", .. }),
        "{e:?}"
    );
    assert!(
        e.to_string().starts_with("t.json: JSON syntax error: "),
        "{e}"
    );
}

#[test]
fn audit_with_mutate_digest_is_refused_unless_fixed_and_the_fix_is_reported() {
    let key = key(14);
    let text = format!(
        r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {{name: audit}}
spec:
  validationFailureAction: Audit
  rules:
  - name: default-digest
    match: {{any: [{{resources: {{kinds: [Pod]}}}}]}}
    verifyImages:
    - imageReferences: ["ghcr.io/acme/*"]
      attestors:
      - entries:
        - keys:
            publicKeys: |
{key}
  - name: explicit-digest
    match: {{any: [{{resources: {{kinds: [Pod]}}}}]}}
    verifyImages:
    - imageReferences: ["ghcr.io/acme/*"]
      mutateDigest: true
      attestors:
      - entries:
        - keys:
            publicKeys: |
{key}
"#
    );
    let refused = convert_str(&text, "t.yaml").unwrap();
    assert!(refused.refused());
    for report in &refused.reports {
        assert!(
            report.to_string().contains(
                "refused: verifyImages[0].mutateDigest: mutateDigest must be set to false"
            ) && report.to_string().contains("--fix"),
            "{report}"
        );
    }
    let fixed = convert_str_with(&text, "t.yaml", Options { fix: true }).unwrap();
    assert!(!fixed.refused());
    let loaded = ivory_policy::load_str(&fixed.yaml, "converted.yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    for (report, written) in fixed
        .reports
        .iter()
        .zip(["left at its default", "set to true"])
    {
        let Outcome::WithDifferences { differences } = &report.outcome else {
            panic!("{report}");
        };
        let fix = &differences[0];
        assert!(
            fix.starts_with(FIXED) && fix.contains("mutateDigest: ") && fix.contains(written),
            "{fix}"
        );
    }
    for policy in &fixed.policies {
        assert_eq!(policy.spec.validation_actions, ["Audit"]);
        assert!(!policy.spec.mutate_digest(), "{}", fixed.yaml);
    }
}

/// `useCache` (Kyverno: cache this rule's verification responses, default true) changes no
/// verdict: ivory's verdict cache is always on, its keys carry the digest and a hash of the
/// attestor and trust material. Either value converts to the same policy, exactly.
#[test]
fn use_cache_changes_nothing_in_the_converted_policy() {
    let key = key(14);
    let text = |use_cache: &str| {
        format!(
            r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {{name: cached}}
spec:
  validationFailureAction: Enforce
  rules:
  - name: signed
    match: {{any: [{{resources: {{kinds: [Pod]}}}}]}}
    verifyImages:
    - imageReferences: ["ghcr.io/acme/*"]
{use_cache}      attestors:
      - entries:
        - keys:
            publicKeys: |-
{key}
            rekor: {{ignoreTlog: true, url: https://rekor.sigstore.dev}}
"#
        )
    };
    let plain = convert_ok(&text(""));
    for value in ["true", "false"] {
        let with = convert_ok(&text(&format!("      useCache: {value}\n")));
        assert_eq!(with.yaml, plain.yaml, "useCache: {value}");
        assert_eq!(with.reports[0].outcome, Outcome::Exact, "useCache: {value}");
    }
}
