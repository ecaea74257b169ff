//! Table-driven checks of every validation rule: each case patches the valid base policy and
//! lists the exact errors expected (empty = still valid).

use ivory_testkit::cases::Failures;
use serde_json::{Value, json};

use crate::testutil::{PUBLIC_KEY, errors_after};

type Case = (
    &'static str,
    Vec<(&'static str, Option<Value>)>,
    Vec<&'static str>,
);

fn set(pointer: &'static str, v: Value) -> (&'static str, Option<Value>) {
    (pointer, Some(v))
}

fn del(pointer: &'static str) -> (&'static str, Option<Value>) {
    (pointer, None)
}

/// Checks every case, then reports every one that failed.
fn run(cases: Vec<Case>) {
    let mut failures = Failures::new();
    for (name, patches, expected) in cases {
        let got = errors_after(&patches);
        failures.check(name, got == expected, || {
            format!("\n  expected {expected:#?}\n  got      {got:#?}")
        });
    }
    failures.assert_none();
}

#[test]
fn base_policy_is_valid() {
    assert_eq!(errors_after(&[]), Vec::<String>::new());
}

#[test]
fn metadata_and_header() {
    run(vec![
        (
            "name missing",
            vec![del("/metadata/name")],
            vec!["metadata.name: Required value: name is required"],
        ),
        (
            "name not dns",
            vec![set("/metadata/name", json!("Bad_Name"))],
            vec![
                "metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            ],
        ),
        (
            "dotted name ok",
            vec![set("/metadata/name", json!("a.b-c.d1"))],
            vec![],
        ),
        (
            "namespaced without namespace",
            vec![set("/kind", json!("NamespacedImageValidatingPolicy"))],
            vec![
                "metadata.namespace: Required value: a NamespacedImageValidatingPolicy must have a namespace",
            ],
        ),
        (
            "namespaced with namespace",
            vec![
                set("/kind", json!("NamespacedImageValidatingPolicy")),
                set("/metadata/namespace", json!("team-a")),
            ],
            vec![],
        ),
        (
            "namespace not a label",
            vec![
                set("/kind", json!("NamespacedImageValidatingPolicy")),
                set("/metadata/namespace", json!("team.a")),
            ],
            vec![
                "metadata.namespace: Invalid value: \"team.a\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            ],
        ),
        (
            "unknown version",
            vec![set("/apiVersion", json!("policies.kyverno.io/v2"))],
            vec![
                "apiVersion: Unsupported value: \"policies.kyverno.io/v2\": supported values: \"policies.kyverno.io/v1alpha1\", \"policies.kyverno.io/v1beta1\", \"policies.kyverno.io/v1\"",
            ],
        ),
        (
            "spec missing",
            vec![del("/spec")],
            vec!["spec: Required value"],
        ),
        (
            "attestors missing",
            vec![del("/spec/attestors")],
            vec!["spec.attestors: Required value"],
        ),
        (
            "attestors empty ok",
            vec![
                set("/spec/attestors", json!([])),
                set("/spec/validations/0/expression", json!("true")),
            ],
            vec![],
        ),
        (
            "validations missing",
            vec![del("/spec/validations")],
            vec!["spec.validations: Required value"],
        ),
        (
            "wrong type names the field",
            vec![set("/spec/validationActions", json!("Deny"))],
            vec!["spec.validationActions: invalid type: string \"Deny\", expected a sequence"],
        ),
    ]);
}

#[test]
fn name_too_long() {
    let name = "a".repeat(254);
    assert_eq!(
        errors_after(&[set("/metadata/name", json!(name))]),
        [format!(
            "metadata.name: Invalid value: \"{name}\": must be no more than 253 characters"
        )]
    );
    assert!(errors_after(&[set("/metadata/name", json!("a".repeat(253)))]).is_empty());
}

/// matchConstraints rules, broken and kept.
fn match_constraints_cases() -> Vec<Case> {
    const MC_REQUIRED: &str = "spec.matchConstraints: Required value: a matchConstraints with at least one resource rule is required";
    vec![
        (
            "missing",
            vec![del("/spec/matchConstraints")],
            vec![MC_REQUIRED],
        ),
        (
            "no rules",
            vec![set("/spec/matchConstraints/resourceRules", json!([]))],
            vec![MC_REQUIRED],
        ),
        (
            "json mode needs none",
            vec![
                del("/spec/matchConstraints"),
                del("/spec/variables"),
                del("/spec/matchConditions"),
                set("/spec/evaluation", json!({"mode": "JSON"})),
            ],
            vec![],
        ),
        (
            "bad operation",
            vec![set(
                "/spec/matchConstraints/resourceRules/0/operations",
                json!(["GET"]),
            )],
            vec![
                "spec.matchConstraints.resourceRules[0].operations[0]: Unsupported value: \"GET\": supported values: \"*\", \"CONNECT\", \"CREATE\", \"DELETE\", \"UPDATE\"",
            ],
        ),
        (
            "no operations",
            vec![set(
                "/spec/matchConstraints/resourceRules/0/operations",
                json!([]),
            )],
            vec!["spec.matchConstraints.resourceRules[0].operations: Required value"],
        ),
        (
            "star with others",
            vec![set(
                "/spec/matchConstraints/resourceRules/0/operations",
                json!(["*", "CREATE"]),
            )],
            vec![
                "spec.matchConstraints.resourceRules[0].operations: Invalid value: if '*' is present, must not specify other operations",
            ],
        ),
        (
            "star alone",
            vec![set(
                "/spec/matchConstraints/resourceRules/0/operations",
                json!(["*"]),
            )],
            vec![],
        ),
        (
            "no groups versions resources",
            vec![set(
                "/spec/matchConstraints/resourceRules/0",
                json!({"operations": ["CREATE"]}),
            )],
            vec![
                "spec.matchConstraints.resourceRules[0].apiGroups: Required value",
                "spec.matchConstraints.resourceRules[0].apiVersions: Required value",
                "spec.matchConstraints.resourceRules[0].resources: Required value",
            ],
        ),
        (
            "bad scope",
            vec![set(
                "/spec/matchConstraints/resourceRules/0/scope",
                json!("Everything"),
            )],
            vec![
                "spec.matchConstraints.resourceRules[0].scope: Unsupported value: \"Everything\": supported values: \"*\", \"Cluster\", \"Namespaced\"",
            ],
        ),
        (
            "good scope",
            vec![set(
                "/spec/matchConstraints/resourceRules/0/scope",
                json!("Namespaced"),
            )],
            vec![],
        ),
        (
            "bad exclude rule",
            vec![set(
                "/spec/matchConstraints/excludeResourceRules",
                json!([{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["PATCH"]}]),
            )],
            vec![
                "spec.matchConstraints.excludeResourceRules[0].operations[0]: Unsupported value: \"PATCH\": supported values: \"*\", \"CONNECT\", \"CREATE\", \"DELETE\", \"UPDATE\"",
            ],
        ),
        (
            "bad matchPolicy",
            vec![set("/spec/matchConstraints/matchPolicy", json!("Fuzzy"))],
            vec![
                "spec.matchConstraints.matchPolicy: Unsupported value: \"Fuzzy\": supported values: \"Equivalent\", \"Exact\"",
            ],
        ),
        (
            "good matchPolicy",
            vec![set("/spec/matchConstraints/matchPolicy", json!("Exact"))],
            vec![],
        ),
        (
            "selector operators",
            vec![set(
                "/spec/matchConstraints/namespaceSelector",
                json!({"matchExpressions": [
                    {"key": "a", "operator": "Has"},
                    {"key": "b", "operator": "In"},
                    {"key": "c", "operator": "Exists", "values": ["x"]},
                    {"key": "", "operator": "NotIn", "values": ["y"]},
                    {"key": "e", "operator": "DoesNotExist"}
                ]}),
            )],
            vec![
                "spec.matchConstraints.namespaceSelector.matchExpressions[0].operator: Invalid value: \"Has\": not a valid selector operator",
                "spec.matchConstraints.namespaceSelector.matchExpressions[1].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
                "spec.matchConstraints.namespaceSelector.matchExpressions[2].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                "spec.matchConstraints.namespaceSelector.matchExpressions[3].key: Required value",
            ],
        ),
        (
            "object selector checked too",
            vec![set(
                "/spec/matchConstraints/objectSelector",
                json!({"matchExpressions": [{"key": "a", "operator": "in", "values": ["x"]}]}),
            )],
            vec![
                "spec.matchConstraints.objectSelector.matchExpressions[0].operator: Invalid value: \"in\": not a valid selector operator",
            ],
        ),
    ]
}

#[test]
fn match_constraints() {
    run(match_constraints_cases());
}

/// The spec's enums and limits, broken and kept.
fn top_level_enums_and_limits_cases() -> Vec<Case> {
    vec![
        (
            "validation action",
            vec![set("/spec/validationActions", json!(["test"]))],
            vec![
                "spec.validationActions[0]: Unsupported value: \"test\": supported values: \"Deny\", \"Audit\", \"Warn\"",
            ],
        ),
        (
            "validation action set",
            vec![set("/spec/validationActions", json!(["Deny", "Deny"]))],
            vec!["spec.validationActions[1]: Duplicate value: \"Deny\""],
        ),
        (
            "validation actions ok",
            vec![set("/spec/validationActions", json!(["Warn", "Audit"]))],
            vec![],
        ),
        (
            "failure policy",
            vec![set("/spec/failurePolicy", json!("Never"))],
            vec![
                "spec.failurePolicy: Unsupported value: \"Never\": supported values: \"Ignore\", \"Fail\"",
            ],
        ),
        (
            "failure policy ok",
            vec![set("/spec/failurePolicy", json!("Ignore"))],
            vec![],
        ),
        (
            "timeout zero",
            vec![set(
                "/spec/webhookConfiguration",
                json!({"timeoutSeconds": 0}),
            )],
            vec![
                "spec.webhookConfiguration.timeoutSeconds: Invalid value: 0: the timeout value must be between 1 and 30 seconds",
            ],
        ),
        (
            "timeout 31",
            vec![set(
                "/spec/webhookConfiguration",
                json!({"timeoutSeconds": 31}),
            )],
            vec![
                "spec.webhookConfiguration.timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds",
            ],
        ),
        (
            "timeout 30",
            vec![set(
                "/spec/webhookConfiguration",
                json!({"timeoutSeconds": 30}),
            )],
            vec![],
        ),
        (
            "evaluation mode",
            vec![set("/spec/evaluation", json!({"mode": "Yaml"}))],
            vec![
                "spec.evaluation.mode: Unsupported value: \"Yaml\": supported values: \"Kubernetes\", \"JSON\"",
            ],
        ),
        (
            "providers",
            vec![set(
                "/spec/credentials",
                json!({"providers": ["github", "docker"]}),
            )],
            vec![
                "spec.credentials.providers[0]: Forbidden: \"github\" is not supported: use pull secrets (spec.credentials.secrets)",
                "spec.credentials.providers[1]: Unsupported value: \"docker\": supported values: \"default\", \"amazon\", \"azure\", \"google\", \"github\"",
            ],
        ),
        (
            "provider default is the docker config",
            vec![set("/spec/credentials", json!({"providers": ["default"]}))],
            vec![],
        ),
        (
            "secrets",
            vec![set(
                "/spec/credentials",
                json!({"secrets": ["ok", "ns/ok", "a/b/c", "/x"]}),
            )],
            vec![
                "spec.credentials.secrets[2]: Invalid value: \"a/b/c\": must be <name> or <namespace>/<name>",
                "spec.credentials.secrets[3]: Invalid value: \"/x\": must be <name> or <namespace>/<name>",
            ],
        ),
        (
            "a cluster policy may name any namespace's secrets",
            vec![set(
                "/spec/credentials",
                json!({"secrets": ["pull", "ivory/pull", "team/pull"]}),
            )],
            vec![],
        ),
        (
            "a namespaced policy names its own namespace's secrets only",
            vec![
                set("/kind", json!("NamespacedImageValidatingPolicy")),
                set("/metadata/namespace", json!("team")),
                set(
                    "/spec/credentials",
                    json!({"secrets": ["pull", "team/pull", "ivory/pull"]}),
                ),
            ],
            vec![
                "spec.credentials.secrets[2]: Invalid value: \"ivory/pull\": a NamespacedImageValidatingPolicy may only use Secrets of its own namespace \"team\"",
            ],
        ),
        (
            "autogen controllers",
            vec![set(
                "/spec/autogen",
                json!({"podControllers": {"controllers": ["deployments", "pods"]}}),
            )],
            vec![
                "spec.autogen.podControllers.controllers[1]: Unsupported value: \"pods\": supported values: \"daemonsets\", \"deployments\", \"replicasets\", \"statefulsets\", \"jobs\", \"cronjobs\"",
            ],
        ),
        (
            "autogen none",
            vec![set(
                "/spec/autogen",
                json!({"podControllers": {"controllers": []}}),
            )],
            vec![],
        ),
        (
            "unknown fields",
            vec![
                set("/spec/validationConfiguration", json!({"required": false})),
                set("/spec/attestors/0/cosign/keyy", json!({"data": "x"})),
            ],
            vec![
                "spec.attestors[0].cosign.keyy: unknown field",
                "spec.validationConfiguration: unknown field",
            ],
        ),
        (
            "pullSecrets alias and insecureIgnoreSCT spelling",
            vec![
                set(
                    "/spec/attestors/0/cosign/source",
                    json!({"pullSecrets": [{"name": "regcred"}], "repository": "ghcr.io/acme/sigs"}),
                ),
                set(
                    "/spec/attestors/0/cosign/ctlog",
                    json!({"insecureIgnoreSCT": true, "insecureIgnoreTlog": true}),
                ),
            ],
            vec![],
        ),
        (
            "too many match conditions",
            vec![set(
                "/spec/matchConditions",
                Value::Array(
                    (0..65)
                        .map(|i| json!({"name": format!("c{i}"), "expression": "true"}))
                        .collect(),
                ),
            )],
            vec!["spec.matchConditions: Too many: 65: must have at most 64 items"],
        ),
    ]
}

#[test]
fn top_level_enums_and_limits() {
    run(top_level_enums_and_limits_cases());
}

#[test]
fn named_lists() {
    run(vec![
        (
            "variable names",
            vec![set(
                "/spec/variables",
                json!([
                    {"name": "a", "expression": "1"},
                    {"name": "a", "expression": "2"},
                    {"name": "", "expression": "3"},
                    {"name": "b", "expression": " "}
                ]),
            )],
            vec![
                "spec.variables[1].name: Duplicate value: \"a\"",
                "spec.variables[2].name: Required value",
                "spec.variables[3].expression: Required value",
            ],
        ),
        (
            "image extractors",
            vec![set(
                "/spec/images",
                json!([
                    {"name": "x", "expression": "[object.a]"},
                    {"name": "x", "expression": "[object.b]"}
                ]),
            )],
            vec!["spec.images[1].name: Duplicate value: \"x\""],
        ),
        (
            "match conditions",
            vec![set(
                "/spec/matchConditions/1",
                json!({"name": "not-system", "expression": "true"}),
            )],
            vec!["spec.matchConditions[1].name: Duplicate value: \"not-system\""],
        ),
        (
            "audit annotations",
            vec![set(
                "/spec/auditAnnotations",
                json!([
                    {"key": "k", "valueExpression": "'v'"},
                    {"key": "k", "valueExpression": "'w'"},
                    {"key": "", "valueExpression": ""}
                ]),
            )],
            vec![
                "spec.auditAnnotations[1].key: Duplicate value: \"k\"",
                "spec.auditAnnotations[2].key: Required value",
                "spec.auditAnnotations[2].valueExpression: Required value",
            ],
        ),
        (
            "validation expression required",
            vec![set("/spec/validations/0/expression", json!(""))],
            vec!["spec.validations[0].expression: Required value"],
        ),
        (
            "image reference one of",
            vec![set(
                "/spec/matchImageReferences",
                json!([{}, {"glob": "a*", "expression": "true"}]),
            )],
            vec![
                "spec.matchImageReferences[0]: Invalid value: exactly one of glob or expression must be set",
                "spec.matchImageReferences[1]: Invalid value: exactly one of glob or expression must be set",
            ],
        ),
        (
            "bad glob",
            vec![set(
                "/spec/matchImageReferences/0/glob",
                json!("ghcr.io/[ab"),
            )],
            vec![
                "spec.matchImageReferences[0].glob: Invalid value: \"ghcr.io/[ab\": error parsing glob 'ghcr.io/[ab': unclosed character class; missing ']'",
            ],
        ),
    ]);
}

/// Each attestor rule, broken and kept.
fn attestors_cases() -> Vec<Case> {
    vec![
        (
            "neither cosign nor notary",
            vec![set("/spec/attestors/0", json!({"name": "cosign"}))],
            vec!["spec.attestors[0]: Invalid value: exactly one of cosign or notary must be set"],
        ),
        (
            "both cosign and notary",
            vec![set(
                "/spec/attestors/0/notary",
                json!({"certs": {"expression": "'x'"}}),
            )],
            vec!["spec.attestors[0]: Invalid value: exactly one of cosign or notary must be set"],
        ),
        (
            "name required and unique",
            vec![
                set(
                    "/spec/attestors/1",
                    json!({"name": "cosign", "cosign": {"key": {"kms": "awskms:///alias/x"}}}),
                ),
                set(
                    "/spec/attestors/2",
                    json!({"cosign": {"key": {"kms": "gcpkms://projects/p"}}}),
                ),
            ],
            vec![
                "spec.attestors[1].name: Duplicate value: \"cosign\"",
                "spec.attestors[1].cosign.key.kms: Forbidden: not supported: ivory reads no KMS; give the public key as data or expression",
                "spec.attestors[2].name: Required value",
                "spec.attestors[2].cosign.key.kms: Forbidden: not supported: ivory reads no KMS; give the public key as data or expression",
            ],
        ),
        (
            "cosign needs a trust source",
            vec![set(
                "/spec/attestors/0/cosign",
                json!({"ctlog": {"insecureIgnoreTlog": true}}),
            )],
            vec![
                "spec.attestors[0].cosign: cosign verifier needs to have one key, keyless or certificate fields set",
            ],
        ),
        (
            "key needs material",
            vec![set(
                "/spec/attestors/0/cosign/key",
                json!({"hashAlgorithm": "sha256"}),
            )],
            vec![
                "spec.attestors[0].cosign.key: Required value: one of data, expression or kms is required",
            ],
        ),
        (
            "key data and expression",
            vec![set("/spec/attestors/0/cosign/key/expression", json!("'x'"))],
            vec![
                "spec.attestors[0].cosign.key: Forbidden: data and expression are mutually exclusive",
            ],
        ),
        (
            "key data not pem",
            vec![set("/spec/attestors/0/cosign/key/data", json!("not a key"))],
            vec![
                "spec.attestors[0].cosign.key.data: Invalid value: not valid PEM: no PEM block found (expected -----BEGIN ...-----)",
            ],
        ),
        (
            "kms scheme",
            vec![set(
                "/spec/attestors/0/cosign/key",
                json!({"kms": "vault://x"}),
            )],
            vec![
                "spec.attestors[0].cosign.key.kms: Invalid value: \"vault://x\": must start with one of awskms://, gcpkms://, azurekms://, hashivault://",
            ],
        ),
        (
            "hash algorithm",
            vec![set(
                "/spec/attestors/0/cosign/key/hashAlgorithm",
                json!("md5"),
            )],
            vec![
                "spec.attestors[0].cosign.key.hashAlgorithm: Unsupported value: \"md5\": supported values: \"sha224\", \"sha256\", \"sha384\", \"sha512\"",
            ],
        ),
        (
            "hash algorithm sha224 has no implementation",
            vec![set(
                "/spec/attestors/0/cosign/key/hashAlgorithm",
                json!("sha224"),
            )],
            vec![
                "spec.attestors[0].cosign.key.hashAlgorithm: Unsupported value: \"sha224\": supported values: \"sha256\", \"sha384\", \"sha512\"",
            ],
        ),
        (
            "tuf served: a mirror and a root file",
            vec![set(
                "/spec/attestors/0/cosign/tuf",
                json!({"mirror": "https://tuf.example", "root": {"path": "/root.json"}}),
            )],
            vec![],
        ),
        (
            "tuf: a mirror that is not http(s), root data that is not base64, a root URL of another scheme",
            vec![set(
                "/spec/attestors/0/cosign/tuf",
                json!({"mirror": "ftp://tuf.example", "root": {"data": "not base64!", "path": "file:///root.json"}}),
            )],
            vec![
                "spec.attestors[0].cosign.tuf.mirror: Invalid value: must be an http or https URL",
                "spec.attestors[0].cosign.tuf.root.data: Invalid value: must be base64 (a root.json)",
                "spec.attestors[0].cosign.tuf.root.path: Invalid value: must be a file or an http or https URL",
            ],
        ),
        (
            "tuf beside a trustedRoot",
            vec![
                set(
                    "/spec/attestors/0/cosign/tuf",
                    json!({"mirror": "https://tuf.example"}),
                ),
                set(
                    "/spec/attestors/0/cosign/trustedRoot",
                    json!({"expression": "string(object.metadata.name)"}),
                ),
            ],
            vec![],
        ),
        (
            "keyless additional extensions",
            vec![set(
                "/spec/attestors/0/cosign",
                json!({"keyless": {"identities": [{"subjectExpression": "'s'"}],
                    "additionalExtensions": {"githubWorkflowRef": "refs/heads/main",
                        "githubWorkflowSha": 1, "buildTrigger": "push"}}}),
            )],
            vec![
                "spec.attestors[0].cosign.keyless.additionalExtensions.buildTrigger: Unsupported value: \"buildTrigger\": supported values: \"githubWorkflowTrigger\", \"githubWorkflowSha\", \"githubWorkflowName\", \"githubWorkflowRepository\", \"githubWorkflowRef\"",
                "spec.attestors[0].cosign.keyless.additionalExtensions.githubWorkflowSha: Invalid value: 1: must be a string",
            ],
        ),
        (
            "hash algorithm ok",
            vec![set(
                "/spec/attestors/0/cosign/key/hashAlgorithm",
                json!("sha512"),
            )],
            vec![],
        ),
        (
            "keyless without identities",
            vec![set(
                "/spec/attestors/0/cosign",
                json!({"keyless": {"identities": []}}),
            )],
            vec![
                "spec.attestors[0].cosign.keyless.identities: Required value: at least one identity is required",
            ],
        ),
        (
            "keyless empty identity and bad regexp",
            vec![set(
                "/spec/attestors/0/cosign",
                json!({"keyless": {"identities": [
                {},
                {"issuer": "https://token.actions.githubusercontent.com", "subjectRegExp": "(unclosed"}
            ], "roots": "nope"}}),
            )],
            vec![
                "spec.attestors[0].cosign.keyless.identities[0]: Required value: at least one of issuer, issuerRegExp, subject, subjectRegExp or subjectExpression is required",
                "spec.attestors[0].cosign.keyless.identities[1].subjectRegExp: Invalid value: \"(unclosed\": error: unclosed group",
                "spec.attestors[0].cosign.keyless.roots: Invalid value: not valid PEM: no PEM block found (expected -----BEGIN ...-----)",
            ],
        ),
        (
            "keyless ok",
            vec![set(
                "/spec/attestors/0/cosign",
                json!({"keyless": {"identities": [
                {"issuerRegExp": "^https://token\\.actions\\.githubusercontent\\.com$", "subjectRegExp": "^https://github.com/acme/.*$"}
            ]}, "ctlog": {"url": "https://rekor.sigstore.dev"}}),
            )],
            vec![],
        ),
        (
            "ctlog needs url unless tlog ignored",
            vec![set(
                "/spec/attestors/0/cosign/ctlog",
                json!({"insecureIgnoreSCT": true, "rekorPubKey": "x"}),
            )],
            vec![
                "spec.attestors[0].cosign.ctlog.rekorPubKey: Invalid value: not valid PEM: no PEM block found (expected -----BEGIN ...-----)",
                "spec.attestors[0].cosign.ctlog.url: Required value: rekor URL must be provided unless insecureIgnoreTlog is true",
            ],
        ),
        (
            "ctlog air gapped",
            vec![set(
                "/spec/attestors/0/cosign/ctlog",
                json!({"insecureIgnoreSCT": true, "insecureIgnoreTlog": true, "ctLogPubKey": PUBLIC_KEY}),
            )],
            vec![],
        ),
        (
            "certificate",
            vec![set(
                "/spec/attestors/0/cosign",
                json!({"certificate": {"certChain": {}}}),
            )],
            vec![
                "spec.attestors[0].cosign.certificate.cert: Required value",
                "spec.attestors[0].cosign.certificate.certChain: Invalid value: exactly one of value or expression must be set",
            ],
        ),
        (
            "certificate both value and expression",
            vec![set(
                "/spec/attestors/0/cosign",
                json!({"certificate": {"cert": {"value": PUBLIC_KEY, "expression": "'x'"}}}),
            )],
            vec![
                "spec.attestors[0].cosign.certificate.cert: Invalid value: exactly one of value or expression must be set",
            ],
        ),
        (
            "certificate value not pem",
            vec![set(
                "/spec/attestors/0/cosign",
                json!({"certificate": {"cert": {"value": "abc"}}}),
            )],
            vec![
                "spec.attestors[0].cosign.certificate.cert.value: Invalid value: not valid PEM: no PEM block found (expected -----BEGIN ...-----)",
            ],
        ),
        (
            "trusted root json",
            vec![set(
                "/spec/attestors/0/cosign/trustedRoot",
                json!({"value": "{not json"}),
            )],
            vec![
                "spec.attestors[0].cosign.trustedRoot.value: Invalid value: not a JSON trusted root: key must be a string at line 1 column 2",
            ],
        ),
        (
            "trusted root expression",
            vec![set(
                "/spec/attestors/0/cosign/trustedRoot",
                json!({"expression": "'{}'"}),
            )],
            vec![],
        ),
        (
            "notary needs certs",
            vec![set(
                "/spec/attestors/0",
                json!({"name": "n", "notary": {"tsaCerts": {"value": "x"}}}),
            )],
            vec![
                "spec.attestors[0].notary.certs: Required value",
                "spec.attestors[0].notary.tsaCerts.value: Invalid value: not valid PEM: no PEM block found (expected -----BEGIN ...-----)",
                "spec.validations[0].expression: undeclared attestor 'cosign' (declared: n)",
            ],
        ),
    ]
}

#[test]
fn attestors() {
    run(attestors_cases());
}

#[test]
fn attestations() {
    run(vec![
        (
            "both kinds",
            vec![set(
                "/spec/attestations/0/referrer",
                json!({"type": "sbom/cyclone-dx"}),
            )],
            vec![
                "spec.attestations[0]: Invalid value: exactly one of intoto or referrer must be set",
            ],
        ),
        (
            "neither kind and names",
            vec![set(
                "/spec/attestations",
                json!([
                    {"name": "a"},
                    {"name": "b", "intoto": {"type": ""}},
                    {"name": "b", "referrer": {"type": "x"}},
                    {"referrer": {"type": "x"}}
                ]),
            )],
            vec![
                "spec.attestations[0]: Invalid value: exactly one of intoto or referrer must be set",
                "spec.attestations[1].intoto.type: Required value",
                "spec.attestations[2].name: Duplicate value: \"b\"",
                "spec.attestations[3].name: Required value",
            ],
        ),
    ]);
}

#[test]
fn all_errors_are_collected() {
    let got = errors_after(&[
        set("/metadata/name", json!("")),
        set("/spec/failurePolicy", json!("Never")),
        set("/spec/validationActions", json!(["test"])),
        set(
            "/spec/validations/0/expression",
            json!("imagez.containers.size() > 0"),
        ),
    ]);
    assert_eq!(
        got,
        [
            "metadata.name: Required value: name is required",
            "spec.validationActions[0]: Unsupported value: \"test\": supported values: \"Deny\", \"Audit\", \"Warn\"",
            "spec.failurePolicy: Unsupported value: \"Never\": supported values: \"Ignore\", \"Fail\"",
            "spec.validations[0].expression: undeclared reference 'imagez'",
        ]
    );
}
