//! `deploy/` stays in step with the serde model: the generated CRDs carry Kyverno's names and
//! versions, their schema names exactly the fields of `types.rs`, a policy with every field set
//! validates structurally against it, and the kustomize base, the Helm chart and the certificate
//! script render what the cluster needs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use ivory_policy::types::{
    Attestation, Attestor, AuditAnnotation, Autogen, Cosign, CosignCertificate, CosignKey,
    Credentials, Ctlog, Enabled, Evaluation, Identity, Keyless, LabelSelector,
    LabelSelectorRequirement, MatchImageReference, MatchResources, NamedExpression,
    NamedRuleWithOperations, Notary, PodControllers, PolicySpec, SecretReference, Source,
    StringSource, Tuf, TufRoot, TypeRef, Validation, ValidationConfigurations,
    WebhookConfiguration,
};
use serde_json::{Value, json};

const IVPOL: &str = "imagevalidatingpolicies";
const NIVPOL: &str = "namespacedimagevalidatingpolicies";

fn repo_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .nth(2)
        .expect("crates/<name>")
        .to_path_buf()
}

fn crd(plural: &str) -> Value {
    let path = repo_root().join(format!("deploy/crds/policies.kyverno.io_{plural}.yaml"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn versions(crd: &Value) -> &Vec<Value> {
    crd["spec"]["versions"].as_array().expect("spec.versions")
}

fn object_schema<'a>(crd: &'a Value, version: &str) -> &'a Value {
    versions(crd)
        .iter()
        .find(|v| v["name"] == version)
        .unwrap_or_else(|| panic!("version {version} missing"))
        .pointer("/schema/openAPIV3Schema")
        .expect("openAPIV3Schema")
}

fn spec_schema(crd: &Value) -> &Value {
    &object_schema(crd, "v1")["properties"]["spec"]
}

// --- the CRD objects -------------------------------------------------------------------------

#[test]
fn crd_files_match_their_generator() {
    let out = Command::new("python3")
        .arg(repo_root().join("deploy/crds/generate.py"))
        .arg("--check")
        .output()
        .expect("python3 must be installed to check deploy/crds/generate.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn crds_declare_kyverno_names_scopes_and_versions() {
    let cases = [
        (
            IVPOL,
            "ImageValidatingPolicy",
            "ivpol",
            "Cluster",
            &["v1", "v1beta1", "v1alpha1"][..],
        ),
        (
            NIVPOL,
            "NamespacedImageValidatingPolicy",
            "nivpol",
            "Namespaced",
            &["v1", "v1beta1"][..],
        ),
    ];
    for (plural, kind, short, scope, names) in cases {
        let crd = crd(plural);
        assert_eq!(
            crd["metadata"]["name"],
            format!("{plural}.policies.kyverno.io")
        );
        let spec = &crd["spec"];
        assert_eq!(spec["group"], ivory_policy::types::API_GROUP);
        assert_eq!(spec["names"]["kind"], kind);
        assert_eq!(spec["names"]["plural"], plural);
        assert_eq!(spec["names"]["shortNames"], json!([short]));
        assert_eq!(spec["names"]["categories"], json!(["kyverno"]));
        assert_eq!(spec["scope"], scope);
        assert_eq!(spec["conversion"]["strategy"], "None");
        let listed: Vec<&str> = versions(&crd)
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert_eq!(listed, names, "{plural}");
        for v in versions(&crd) {
            let name = v["name"].as_str().unwrap();
            assert!(
                ivory_policy::types::API_VERSIONS.contains(&name),
                "{plural} {name}"
            );
            assert_eq!(v["served"], true, "{plural} {name}");
            assert_eq!(v["storage"], name == "v1beta1", "{plural} {name} storage");
            assert_eq!(
                v["deprecated"].as_bool().unwrap_or(false),
                name == "v1alpha1"
            );
            assert_eq!(v["subresources"], json!({"status": {}}));
            assert_eq!(
                v["additionalPrinterColumns"],
                json!([
                    {"jsonPath": ".metadata.creationTimestamp", "name": "AGE", "type": "date"},
                    {"jsonPath": ".status.conditionStatus.ready", "name": "READY", "type": "string"},
                ])
            );
            assert_eq!(v["schema"]["openAPIV3Schema"]["required"], json!(["spec"]));
        }
    }
}

#[test]
fn every_version_of_both_kinds_has_one_schema() {
    let reference = object_schema(&crd(IVPOL), "v1").clone();
    for plural in [IVPOL, NIVPOL] {
        let crd = crd(plural);
        for v in versions(&crd) {
            let name = v["name"].as_str().unwrap();
            assert!(
                object_schema(&crd, name) == &reference,
                "{plural} {name} schema differs from imagevalidatingpolicies v1"
            );
        }
    }
}

#[test]
fn spec_schema_follows_kyverno_markers() {
    let crd = crd(IVPOL);
    let spec = spec_schema(&crd);
    assert_eq!(spec["required"], json!(["attestors", "validations"]));
    let p = &spec["properties"];
    assert_eq!(p["validationActions"]["x-kubernetes-list-type"], "set");
    assert_eq!(
        p["validationActions"]["items"]["enum"],
        json!(["Deny", "Audit", "Warn"])
    );
    assert_eq!(p["failurePolicy"]["enum"], json!(["Ignore", "Fail"]));
    assert_eq!(p["validations"]["x-kubernetes-list-type"], "atomic");
    assert_eq!(p["auditAnnotations"]["x-kubernetes-list-type"], "atomic");
    assert_eq!(p["matchConstraints"]["x-kubernetes-map-type"], "atomic");
    assert_eq!(p["validationConfigurations"]["default"], json!({}));
    assert_eq!(
        p["attestors"]["items"]["oneOf"],
        json!([{"required": ["cosign"]}, {"required": ["notary"]}])
    );
    assert_eq!(
        p["matchImageReferences"]["items"]["oneOf"],
        json!([{"required": ["glob"]}, {"required": ["expression"]}])
    );
    assert_eq!(
        p["credentials"]["properties"]["providers"]["items"]["enum"],
        json!(["default", "amazon", "azure", "google", "github"])
    );
    let pull_secrets =
        &p["attestors"]["items"]["properties"]["cosign"]["properties"]["source"]["properties"];
    assert_eq!(
        pull_secrets["PullSecrets"]["items"]["properties"]["name"]["default"],
        ""
    );
    assert_eq!(
        p["webhookConfiguration"]["properties"]["timeoutSeconds"]["format"],
        "int32"
    );
}

/// The schema's defaults are the ones the model's accessors apply when a field is absent.
#[test]
fn schema_defaults_match_model_defaults() {
    let crd = crd(IVPOL);
    let p = &spec_schema(&crd)["properties"];
    let empty = PolicySpec::default();
    let flags = &p["validationConfigurations"]["properties"];
    assert_eq!(flags["mutateDigest"]["default"], empty.mutate_digest());
    assert_eq!(flags["verifyDigest"]["default"], empty.verify_digest());
    assert_eq!(flags["required"]["default"], empty.required());
    let eval = &p["evaluation"]["properties"];
    assert_eq!(
        eval["admission"]["properties"]["enabled"]["default"],
        empty.admission_enabled()
    );
    assert_eq!(
        eval["background"]["properties"]["enabled"]["default"],
        empty.background_enabled()
    );
}

// --- model <-> schema --------------------------------------------------------------------------

fn value(text: &str) -> Option<String> {
    Some(text.to_owned())
}

fn inline(text: &str) -> Option<StringSource> {
    Some(StringSource {
        value: value(text),
        expression: None,
    })
}

fn computed(expr: &str) -> Option<StringSource> {
    Some(StringSource {
        value: None,
        expression: value(expr),
    })
}

fn named(name: &str, expression: &str) -> NamedExpression {
    NamedExpression {
        name: name.to_owned(),
        expression: expression.to_owned(),
    }
}

fn selector() -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: BTreeMap::from([("team".to_owned(), "a".to_owned())]),
        match_expressions: vec![LabelSelectorRequirement {
            key: "tier".to_owned(),
            operator: "In".to_owned(),
            values: vec!["web".to_owned()],
        }],
    })
}

fn rule() -> NamedRuleWithOperations {
    NamedRuleWithOperations {
        resource_names: vec!["p".to_owned()],
        operations: vec!["CREATE".to_owned()],
        api_groups: vec![String::new()],
        api_versions: vec!["v1".to_owned()],
        resources: vec!["pods".to_owned()],
        scope: value("Namespaced"),
    }
}

/// A cosign attestor with every field set; the `{value}|{expression}` sources take `side`.
fn full_cosign(
    side: fn(&str) -> Option<StringSource>,
    other: fn(&str) -> Option<StringSource>,
) -> Cosign {
    Cosign {
        annotations: BTreeMap::from([("env".to_owned(), "prod".to_owned())]),
        certificate: Some(CosignCertificate {
            cert: side("cert"),
            cert_chain: other("chain"),
        }),
        ctlog: Some(Ctlog {
            ct_log_pub_key: value("ct"),
            insecure_ignore_sct: Some(true),
            insecure_ignore_tlog: Some(false),
            rekor_pub_key: value("rekor"),
            tsa_cert_chain: value("tsa"),
            url: value("https://rekor.example"),
        }),
        key: Some(CosignKey {
            data: value("pem"),
            expression: value("'pem'"),
            hash_algorithm: value("sha256"),
            kms: value("hashivault://k"),
        }),
        keyless: Some(Keyless {
            additional_extensions: BTreeMap::from([("githubWorkflowRef".to_owned(), json!("x"))]),
            identities: vec![Identity {
                issuer: value("https://issuer"),
                subject: value("me"),
                issuer_reg_exp: value("https://.*"),
                subject_reg_exp: value(".*"),
                subject_expression: value("'me'"),
            }],
            roots: value("roots"),
        }),
        source: Some(Source {
            pull_secrets: vec![SecretReference {
                name: "regcred".to_owned(),
            }],
            repository: value("registry.example/sigs"),
            tag_prefix: value("v"),
        }),
        trusted_root: side("root"),
        tuf: Some(Tuf {
            mirror: value("https://tuf.example"),
            root: Some(TufRoot {
                data: value("e30="),
                path: value("/root.json"),
            }),
        }),
    }
}

/// Every field of the model set at least once (alternatives of a oneOf in separate list items).
/// Struct literals without `..Default::default()`: a field added to `types.rs` fails to compile
/// here until it is added to the fixture, and then to the CRD schema.
fn full_spec() -> PolicySpec {
    let cosign_attestor = |name: &str, cosign| Attestor {
        name: name.to_owned(),
        cosign: Some(cosign),
        notary: None,
    };
    let notary_attestor = |name: &str, certs, tsa_certs| Attestor {
        name: name.to_owned(),
        cosign: None,
        notary: Some(Notary {
            certs,
            tsa_certs,
            trust_policy: None,
        }),
    };
    PolicySpec {
        match_constraints: Some(MatchResources {
            namespace_selector: selector(),
            object_selector: selector(),
            resource_rules: vec![rule()],
            exclude_resource_rules: vec![rule()],
            match_policy: value("Equivalent"),
        }),
        match_conditions: vec![named("c", "true")],
        match_image_references: vec![
            MatchImageReference {
                glob: value("ghcr.io/*"),
                expression: None,
            },
            MatchImageReference {
                glob: None,
                expression: value("true"),
            },
        ],
        variables: vec![named("v", "1")],
        validation_actions: vec!["Deny".to_owned(), "Audit".to_owned()],
        failure_policy: value("Ignore"),
        audit_annotations: vec![AuditAnnotation {
            key: "k".to_owned(),
            value_expression: "'v'".to_owned(),
        }],
        validations: Some(vec![Validation {
            expression: "true".to_owned(),
            message: value("m"),
            message_expression: value("'m'"),
            reason: value("Forbidden"),
        }]),
        webhook_configuration: Some(WebhookConfiguration {
            timeout_seconds: Some(15),
        }),
        evaluation: Some(Evaluation {
            mode: value("Kubernetes"),
            admission: Some(Enabled {
                enabled: Some(true),
            }),
            background: Some(Enabled {
                enabled: Some(false),
            }),
        }),
        validation_configurations: Some(ValidationConfigurations {
            mutate_digest: Some(true),
            verify_digest: Some(true),
            required: Some(false),
        }),
        credentials: Some(Credentials {
            allow_insecure_registry: Some(false),
            providers: vec!["default".to_owned(), "github".to_owned()],
            secrets: vec!["regcred".to_owned()],
        }),
        images: vec![named("i", "[object.image]")],
        attestors: Some(vec![
            cosign_attestor("a", full_cosign(inline, computed)),
            cosign_attestor("b", full_cosign(computed, inline)),
            notary_attestor("c", inline("certs"), computed("tsa")),
            notary_attestor("d", computed("certs"), inline("tsa")),
        ]),
        attestations: vec![
            Attestation {
                name: "provenance".to_owned(),
                intoto: Some(TypeRef {
                    type_: "https://slsa.dev/provenance/v1".to_owned(),
                }),
                referrer: None,
            },
            Attestation {
                name: "sbom".to_owned(),
                intoto: None,
                referrer: Some(TypeRef {
                    type_: "application/spdx+json".to_owned(),
                }),
            },
        ],
        autogen: Some(Autogen {
            pod_controllers: Some(PodControllers {
                controllers: Some(vec!["deployments".to_owned()]),
            }),
        }),
    }
}

/// Field paths (`a.b[].c`) the schema declares; maps (`additionalProperties`) are leaves.
fn schema_paths(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let Some(props) = schema["properties"].as_object() {
        for (key, sub) in props {
            let path = format!("{prefix}.{key}");
            out.insert(path.clone());
            schema_paths(sub, &path, out);
        }
    }
    if schema["items"].is_object() {
        schema_paths(&schema["items"], &format!("{prefix}[]"), out);
    }
}

/// Field paths a value sets, read with the schema only to know which objects are maps.
fn value_paths(schema: &Value, value: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) if !schema["additionalProperties"].is_object() => {
            for (key, sub) in map {
                let path = format!("{prefix}.{key}");
                out.insert(path.clone());
                value_paths(&schema["properties"][key], sub, &path, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                value_paths(&schema["items"], item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn model_and_schema_name_the_same_fields() {
    let crd = crd(IVPOL);
    let schema = spec_schema(&crd);
    let mut declared = BTreeSet::new();
    schema_paths(schema, "spec", &mut declared);
    let mut written = BTreeSet::new();
    let spec = serde_json::to_value(full_spec()).unwrap();
    value_paths(schema, &spec, "spec", &mut written);
    let only_model: Vec<_> = written.difference(&declared).collect();
    let only_schema: Vec<_> = declared.difference(&written).collect();
    assert!(
        only_model.is_empty(),
        "serialized by types.rs, missing in the CRD: {only_model:#?}"
    );
    assert!(
        only_schema.is_empty(),
        "in the CRD, never set by the model: {only_schema:#?}"
    );
    // Sanity: the walk saw the whole tree, including the standard MatchResources.
    assert!(declared.contains("spec.matchConstraints.namespaceSelector.matchExpressions[].values"));
    assert!(declared.contains("spec.attestors[].cosign.source.PullSecrets[].name"));
    assert!(declared.len() > 100, "{}", declared.len());
}

/// A change that breaks a valid spec.
type Edit<'a> = &'a dyn Fn(&mut Value);

/// A structural check of `value` against an OpenAPI v3 CRD schema: types, required keys, enums,
/// oneOf (of `required` alternatives), set uniqueness and unknown fields (which the API server
/// would silently prune).
fn validate(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let type_ok = match schema["type"].as_str() {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("boolean") => value.is_boolean(),
        Some("integer") => match schema["format"].as_str() {
            Some("int32") => value.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
            _ => value.is_i64(),
        },
        Some(other) => panic!("{path}: schema type {other} not handled"),
        None => true,
    };
    if !type_ok {
        errors.push(format!("{path}: expected {}, got {value}", schema["type"]));
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        errors.push(format!("{path}: {value} not in {allowed:?}"));
    }
    if let Some(alternatives) = schema["oneOf"].as_array() {
        let matching = alternatives
            .iter()
            .filter(|alt| {
                let mut e = Vec::new();
                validate(alt, value, path, &mut e);
                e.is_empty()
            })
            .count();
        if matching != 1 {
            errors.push(format!(
                "{path}: must match exactly one of {alternatives:?}, matches {matching}"
            ));
        }
    }
    match value {
        Value::Object(map) => validate_object(schema, map, path, errors),
        Value::Array(items) => {
            if schema["x-kubernetes-list-type"] == "set" {
                let unique: BTreeSet<String> = items.iter().map(Value::to_string).collect();
                if unique.len() != items.len() {
                    errors.push(format!("{path}: duplicate entries in a set"));
                }
            }
            for (i, item) in items.iter().enumerate() {
                validate(&schema["items"], item, &format!("{path}[{i}]"), errors);
            }
        }
        _ => {}
    }
}

fn validate_object(
    schema: &Value,
    map: &serde_json::Map<String, Value>,
    path: &str,
    errors: &mut Vec<String>,
) {
    for key in schema["required"].as_array().into_iter().flatten() {
        let key = key.as_str().expect("required keys are strings");
        if !map.contains_key(key) {
            errors.push(format!("{path}: missing required {key}"));
        }
    }
    let props = schema["properties"].as_object();
    let extra = &schema["additionalProperties"];
    for (key, sub) in map {
        let child = format!("{path}.{key}");
        match props.and_then(|p| p.get(key)) {
            Some(sub_schema) => validate(sub_schema, sub, &child, errors),
            None if extra.is_object() => validate(extra, sub, &child, errors),
            // A schema node with neither (only `metadata`) accepts anything.
            None if props.is_none() => {}
            None => errors.push(format!("{child}: unknown field")),
        }
    }
}

fn spec_errors(spec: &Value) -> Vec<String> {
    let crd = crd(IVPOL);
    let mut errors = Vec::new();
    validate(spec_schema(&crd), spec, "spec", &mut errors);
    errors
}

#[test]
fn full_policy_validates_against_the_schema() {
    let spec = serde_json::to_value(full_spec()).unwrap();
    assert_eq!(spec_errors(&spec), Vec::<String>::new());
}

#[test]
fn schema_check_rejects_what_the_api_server_would() {
    let full = serde_json::to_value(full_spec()).unwrap();
    let broken = |edit: &dyn Fn(&mut Value)| {
        let mut spec = full.clone();
        edit(&mut spec);
        spec_errors(&spec)
    };
    let cases: [(Edit<'_>, &str); 9] = [
        (
            &|s| {
                s.as_object_mut().unwrap().remove("attestors");
            },
            "missing required attestors",
        ),
        (
            &|s| s["failurePolicy"] = json!("Maybe"),
            "spec.failurePolicy: \"Maybe\" not in",
        ),
        (
            &|s| s["validationActions"] = json!(["Deny", "Deny"]),
            "duplicate entries in a set",
        ),
        (
            &|s| s["attestors"][2]["cosign"] = s["attestors"][0]["cosign"].clone(),
            "spec.attestors[2]: must match exactly one of",
        ),
        (
            &|s| s["matchImageReferences"][0] = json!({}),
            "spec.matchImageReferences[0]: must match exactly one of",
        ),
        (
            &|s| s["credentials"]["providers"] = json!(["quay"]),
            "spec.credentials.providers[0]: \"quay\" not in",
        ),
        (
            &|s| {
                let keyless = &mut s["attestors"][0]["cosign"]["keyless"];
                keyless.as_object_mut().unwrap().remove("identities");
            },
            "spec.attestors[0].cosign.keyless: missing required identities",
        ),
        (
            &|s| s["validations"][0]["typo"] = json!(1),
            "spec.validations[0].typo: unknown field",
        ),
        (
            &|s| s["webhookConfiguration"]["timeoutSeconds"] = json!(1_u64 << 40),
            "spec.webhookConfiguration.timeoutSeconds: expected",
        ),
    ];
    for (edit, expected) in cases {
        let errors = broken(edit);
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "expected {expected:?} in {errors:#?}"
        );
    }
}

/// Every shipped policy (samples, default, Kyverno's documented examples) fits the CRD.
#[test]
fn shipped_policies_validate_against_the_schema() {
    let root = repo_root();
    let dirs = [
        root.join("policies"),
        root.join("policies/samples"),
        root.join("crates/ivory-policy/tests/data/kyverno"),
        root.join("crates/ivory-policy/tests/data/kyverno-refused"),
    ];
    let mut checked = 0;
    for dir in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for doc in serde_saphyr::from_multiple::<Value>(&text).unwrap() {
                let api = doc["apiVersion"].as_str().unwrap_or_default();
                if !api.starts_with("policies.kyverno.io/") {
                    continue;
                }
                let errors = spec_errors(&doc["spec"]);
                assert!(errors.is_empty(), "{}: {errors:#?}", file.display());
                checked += 1;
            }
        }
    }
    assert!(checked >= 15, "only {checked} policies found");
}

// --- rendering -------------------------------------------------------------------------------

/// A tool built by scripts/install-deploy-tools.sh; its absence fails the test on purpose so a
/// machine without it cannot pass by skipping.
fn tool(name: &str) -> PathBuf {
    let path = repo_root().join(".tools/bin").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/install-deploy-tools.sh (scripts/test.sh does)",
        path.display()
    );
    path
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tool output is UTF-8")
}

fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .expect("rendered YAML parses")
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

fn kinds_and_names(docs: &[Value]) -> BTreeSet<(String, String)> {
    docs.iter()
        .map(|d| {
            let field = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (field(&d["kind"]), field(&d["metadata"]["name"]))
        })
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn expected(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    pairs
        .iter()
        .map(|(k, n)| ((*k).to_owned(), (*n).to_owned()))
        .collect()
}

/// The hardening every rendering of the Deployment must keep.
fn assert_hardened(deployment: &Value, args: &[&str]) {
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let anti =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        anti[0]["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        pod["topologySpreadConstraints"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "https", "scheme": "HTTPS"})
    );
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "https", "scheme": "HTTPS"})
    );
    assert_eq!(c["ports"][0]["containerPort"], 8443);
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert_eq!(c["args"], json!(args));
    let tls = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"] == "/etc/ivory/tls")
        .expect("TLS mount");
    assert_eq!(tls["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == tls["name"])
        .expect("TLS volume");
    // The name cert-manager's Certificate and certs/make-certs.sh write.
    assert_eq!(volume["secret"]["secretName"], "ivory-tls");
}

const KUBE_ARGS: [&str; 20] = [
    "serve",
    "--kube",
    "--listen=0.0.0.0:8443",
    // A killed serving process is replaced on the same socket (docs/CLUSTER.md, failures under load).
    "--supervise",
    "--tls-cert=/etc/ivory/tls/tls.crt",
    "--tls-key=/etc/ivory/tls/tls.key",
    "--body-limit=3145728",
    "--body-budget=67108864",
    "--body-timeout=10s",
    "--header-timeout=10s",
    "--idle-timeout=120s",
    "--handshake-timeout=10s",
    "--max-connections=1024",
    "--header-budget=8388608",
    "--answer-budget=67108864",
    "--answer-budget-per-connection=16777216",
    "--answer-timeout=10s",
    // The default trusted root kept current from Sigstore's public-good TUF repository.
    "--tuf-mirror=public-good",
    "--tuf-cache-dir=/var/cache/ivory/tuf",
    "--tuf-refresh-interval=1h",
];

#[test]
fn kustomize_renders_the_base_and_the_cert_manager_overlay() {
    let kustomize = tool("kustomize");
    let docs = documents(&run(Command::new(&kustomize).args(["build", "deploy"])));
    let base = expected(&[
        (
            "CustomResourceDefinition",
            "imagevalidatingpolicies.policies.kyverno.io",
        ),
        (
            "CustomResourceDefinition",
            "namespacedimagevalidatingpolicies.policies.kyverno.io",
        ),
        ("Namespace", "ivory-system"),
        ("ServiceAccount", "ivory"),
        ("ClusterRole", "ivory"),
        ("ClusterRoleBinding", "ivory"),
        // What policies read through resource.Get/List: nothing until an overlay adds rules.
        ("ClusterRole", "ivory-cluster-reads"),
        ("ClusterRoleBinding", "ivory-cluster-reads"),
        ("Role", "ivory-secrets"),
        ("RoleBinding", "ivory-secrets"),
        ("Deployment", "ivory"),
        ("PodDisruptionBudget", "ivory"),
        ("Service", "ivory"),
    ]);
    assert_eq!(kinds_and_names(&docs), base);
    for doc in docs.iter().filter(|d| {
        d["kind"] != "CustomResourceDefinition"
            && d["kind"] != "ClusterRole"
            && d["kind"] != "ClusterRoleBinding"
            && d["kind"] != "Namespace"
    }) {
        assert_eq!(
            doc["metadata"]["namespace"], "ivory-system",
            "{}",
            doc["kind"]
        );
    }
    assert_hardened(find(&docs, "Deployment"), &KUBE_ARGS);
    assert_eq!(image_of(&docs), "ghcr.io/ivory/ivory:0.1.0");
    assert_eq!(
        find(&docs, "PodDisruptionBudget")["spec"]["minAvailable"],
        2
    );
    let svc = &find(&docs, "Service")["spec"]["ports"][0];
    assert_eq!(
        (svc["port"].clone(), svc["targetPort"].clone()),
        (json!(443), json!("https"))
    );
    assert_least_privilege(&docs);
    let reads = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "ivory-cluster-reads")
        .unwrap();
    assert_eq!(reads["rules"], json!([]), "no cluster reads by default");

    let overlay = documents(&run(
        Command::new(&kustomize).args(["build", "deploy/overlays/cert-manager"])
    ));
    let mut with_certs = base.clone();
    with_certs.extend(expected(&[
        ("Issuer", "ivory-selfsigned"),
        ("Issuer", "ivory-ca"),
        ("Certificate", "ivory-ca"),
        ("Certificate", "ivory"),
    ]));
    assert_eq!(kinds_and_names(&overlay), with_certs);
    let cert = overlay
        .iter()
        .find(|d| d["kind"] == "Certificate" && d["metadata"]["name"] == "ivory")
        .unwrap();
    assert_eq!(cert["spec"]["secretName"], "ivory-tls");
    assert!(
        cert["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&json!("ivory.ivory-system.svc"))
    );

    // An overlay points the base at a pushed image by repository + digest; the digest replaces
    // the base's tag. kustomize only takes relative bases, so the overlay sits in the repository.
    let dir = tempfile::Builder::new()
        .prefix(".kustomize-digest-")
        .tempdir_in(repo_root())
        .unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "resources: [../deploy/base]\nimages:\n  - name: ghcr.io/ivory/ivory\n    newName: registry.example/ivory\n    digest: {DIGEST}\n"
        ),
    )
    .unwrap();
    let pinned = documents(&run(Command::new(&kustomize).arg("build").arg(dir.path())));
    assert_eq!(
        image_of(&pinned),
        format!("registry.example/ivory@{DIGEST}")
    );
}

/// A digest as scripts/image.sh prints it.
const DIGEST: &str = "sha256:4514eae9f57cad9117693744e0effa7ce2374e7e1a6e0719d592d9fdd870598f";

/// The image of the rendered Deployment's container.
fn image_of(docs: &[Value]) -> String {
    find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .expect("container image")
        .to_owned()
}

/// Read-only access to the policy kinds, exceptions, Namespaces and Pods; get/create/patch of
/// the wgpolicyk8s.io reports and nothing else; Secrets only through a namespaced Role.
fn assert_least_privilege(docs: &[Value]) {
    for doc in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        for rule in doc["rules"].as_array().expect("rules") {
            if rule["apiGroups"] == json!(["wgpolicyk8s.io"]) {
                assert_eq!(
                    rule["resources"],
                    json!(["policyreports", "clusterpolicyreports"]),
                    "{doc}"
                );
                assert_eq!(rule["verbs"], json!(["get", "create", "patch"]), "{doc}");
                continue;
            }
            assert_eq!(rule["verbs"], json!(["get", "list", "watch"]), "{doc}");
            let secrets = rule["resources"]
                .as_array()
                .expect("resources")
                .contains(&json!("secrets"));
            assert!(
                !secrets || doc["kind"] == "Role",
                "secrets only via a Role: {doc}"
            );
        }
    }
}

#[test]
fn helm_chart_lints_and_renders() {
    let helm = tool("helm");
    run(Command::new(&helm).args(["lint", "--strict", "deploy/helm/ivory"]));
    let template = |extra: &[&str]| {
        let mut cmd = Command::new(&helm);
        cmd.args([
            "template",
            "ivory",
            "deploy/helm/ivory",
            "--namespace",
            "ivory-system",
            "--include-crds",
        ]);
        cmd.args(extra);
        documents(&run(&mut cmd))
    };
    // Offline, as the chart's README shows it: Helm's built-in Kubernetes version (v1.20.0 in
    // a Helm built with `go install`) is not a cluster's and must not stop the rendering.
    let docs = template(&[]);
    assert_eq!(
        documents(&run(Command::new(&helm).args([
            "template",
            "ivory",
            "deploy/helm/ivory",
            "--kube-version",
            "1.32.0"
        ])))
        .len(),
        docs.len() - 2,
        "a supported cluster renders the same objects (without CRDs)"
    );
    let old = Command::new(&helm)
        .args([
            "template",
            "ivory",
            "deploy/helm/ivory",
            "--kube-version",
            "1.29.3",
        ])
        .current_dir(repo_root())
        .output()
        .expect("running helm");
    let stderr = String::from_utf8_lossy(&old.stderr);
    assert!(
        !old.status.success() && stderr.contains("ivory needs Kubernetes 1.30 or newer"),
        "a known-old cluster is refused: {stderr}"
    );
    assert_eq!(
        kinds_and_names(&docs),
        expected(&[
            (
                "CustomResourceDefinition",
                "imagevalidatingpolicies.policies.kyverno.io"
            ),
            (
                "CustomResourceDefinition",
                "namespacedimagevalidatingpolicies.policies.kyverno.io"
            ),
            ("ServiceAccount", "ivory"),
            ("ClusterRole", "ivory"),
            ("ClusterRoleBinding", "ivory"),
            ("Role", "ivory-secrets"),
            ("RoleBinding", "ivory-secrets"),
            ("Deployment", "ivory"),
            ("PodDisruptionBudget", "ivory"),
            ("Service", "ivory"),
        ])
    );
    assert_hardened(find(&docs, "Deployment"), &KUBE_ARGS);
    assert_least_privilege(&docs);
    let crd_docs: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    assert_eq!(crd_docs, [&crd(IVPOL), &crd(NIVPOL)]);
    assert_eq!(image_of(&docs), "ghcr.io/ivory/ivory:0.1.0");

    // What the policies read (resource.Get/List, globalContext.Get): get/list/watch on
    // those resources only, in a ClusterRole of their own; nothing by default; never Secrets.
    let reads = template(&[
        "--set",
        "clusterReads[0].resource=configmaps",
        "--set",
        "clusterReads[1].apiGroup=kyverno.io",
        "--set",
        "clusterReads[1].resource=globalcontextentries",
    ]);
    let role = reads
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "ivory-cluster-reads")
        .expect("the cluster-reads ClusterRole");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["kyverno.io"], "resources": ["globalcontextentries"], "verbs": ["get", "list", "watch"]},
        ])
    );
    assert!(reads.iter().any(|d| d["kind"] == "ClusterRoleBinding"
        && d["metadata"]["name"] == "ivory-cluster-reads"
        && d["subjects"][0]["name"] == "ivory"));
    assert_least_privilege(&reads);
    let secrets = Command::new(&helm)
        .args([
            "template",
            "ivory",
            "deploy/helm/ivory",
            "--set",
            "clusterReads[0].resource=secrets",
        ])
        .current_dir(repo_root())
        .output()
        .expect("running helm");
    assert!(
        !secrets.status.success()
            && String::from_utf8_lossy(&secrets.stderr).contains("never reads Secrets"),
        "Secrets are refused"
    );

    // Deploy by digest: repository + digest, the digest preferred over a tag.
    let by_digest =
        format!("image.repository=registry.example/ivory,image.tag=9.9.9,image.digest={DIGEST}");
    let pinned = template(&["--set", &by_digest]);
    assert_eq!(
        image_of(&pinned),
        format!("registry.example/ivory@{DIGEST}")
    );
    let mut bad = Command::new(&helm);
    bad.args([
        "template",
        "ivory",
        "deploy/helm/ivory",
        "--kube-version",
        "1.32.0",
    ])
    .args(["--set", "image.digest=latest"])
    .current_dir(repo_root());
    let out = bad.output().unwrap();
    assert!(!out.status.success(), "a malformed digest renders");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("image.digest must be sha256:"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        "kube: {enabled: false}\ncertManager: {enabled: true}\nreplicaCount: 3\n\
         policies:\n  pin.yaml: |\n    apiVersion: policies.kyverno.io/v1\n",
    )
    .unwrap();
    let docs = template(&["-f", values.to_str().unwrap()]);
    let names = kinds_and_names(&docs);
    assert!(
        !names.iter().any(|(k, _)| k.contains("Role")),
        "no RBAC without kube: {names:?}"
    );
    for want in [
        ("ConfigMap", "ivory-policies"),
        ("Certificate", "ivory"),
        ("Issuer", "ivory-ca"),
    ] {
        assert!(
            names.contains(&(want.0.to_owned(), want.1.to_owned())),
            "{want:?} in {names:?}"
        );
    }
    let deployment = find(&docs, "Deployment");
    assert_hardened(
        deployment,
        &[
            &["serve", "--policies=/etc/ivory/policies"][..],
            &KUBE_ARGS[2..],
        ]
        .concat(),
    );
    assert_eq!(
        deployment["spec"]["template"]["spec"]["automountServiceAccountToken"],
        false
    );
    assert_eq!(
        find(&docs, "ConfigMap")["data"]["pin.yaml"],
        "apiVersion: policies.kyverno.io/v1\n"
    );

    // PolicyExceptions: off by default, the two flags when enabled.
    let exceptions = dir.path().join("exceptions.yaml");
    std::fs::write(
        &exceptions,
        "policyExceptions: {enabled: true, namespace: kyverno}\n",
    )
    .unwrap();
    let docs = template(&["-f", exceptions.to_str().unwrap()]);
    let args = &find(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"];
    let args: Vec<&str> = args
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&"--enable-policy-exceptions")
            && args.contains(&"--exception-namespace=kyverno"),
        "{args:?}"
    );
}

#[test]
fn make_certs_writes_a_tls_secret_and_prints_the_ca_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new("bash")
        .arg("deploy/certs/make-certs.sh")
        .arg("--out")
        .arg(dir.path()));
    let ca_pem = std::fs::read(dir.path().join("ca.crt")).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(out.trim(), b64.encode(&ca_pem));
    let secret: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.path().join("secret.yaml")).unwrap())
            .unwrap();
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(
        secret["metadata"],
        json!({"name": "ivory-tls", "namespace": "ivory-system"})
    );
    let decode = |key: &str| {
        String::from_utf8(b64.decode(secret["data"][key].as_str().unwrap()).unwrap()).unwrap()
    };
    assert!(decode("tls.crt").starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(decode("tls.key").starts_with("-----BEGIN PRIVATE KEY-----"));
    assert_eq!(decode("ca.crt").as_bytes(), &ca_pem[..]);
    let sans = run(Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(dir.path().join("tls.crt")));
    assert!(sans.contains("DNS:ivory.ivory-system.svc"), "{sans}");
    run(Command::new("openssl")
        .arg("verify")
        .arg("-CAfile")
        .arg(dir.path().join("ca.crt"))
        .arg(dir.path().join("tls.crt")));
}

/// The shared cache (`--cache-redis`) as kustomize component and Helm values: the key mounted
/// from a Secret, the URL from the environment, a bundled server that ivory's own selectors
/// never pick up, and a `rediss://` server's private CA mounted from a Secret.
#[test]
fn kustomize_and_helm_render_the_shared_cache() {
    fn check(docs: &[Value], keys: &[&str]) {
        let ivory = docs
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ivory")
            .expect("ivory Deployment");
        let pod = &ivory["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .filter(|a| a.starts_with("--cache-redis"))
            .collect();
        let want: Vec<String> = keys
            .iter()
            .map(|k| format!("--cache-redis-key=/etc/ivory/shared-cache/{k}"))
            .collect();
        assert_eq!(args, want);
        let env = c["env"].as_array().unwrap();
        assert!(
            env.iter().any(|e| e["name"] == "IVORY_CACHE_REDIS"),
            "{env:?}"
        );
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "shared-cache-key")
            .expect("key volume");
        let items: Vec<&str> = volume["secret"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["key"].as_str())
            .collect();
        assert_eq!(items, keys);
        let cache = docs
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] != "ivory")
            .expect("cache Deployment");
        let cache_labels = &cache["spec"]["template"]["metadata"]["labels"];
        let service = docs
            .iter()
            .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == "ivory")
            .expect("ivory Service");
        let selects_cache = service["spec"]["selector"]
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| &cache_labels[k] == v);
        assert!(!selects_cache, "ivory's Service selects the cache pods");
    }
    let kustomize = tool("kustomize");
    let docs = documents(&run(
        Command::new(&kustomize).args(["build", "deploy/overlays/shared-cache"])
    ));
    check(&docs, &["current"]);
    let helm = tool("helm");
    let docs = documents(&run(Command::new(&helm).args([
        "template",
        "ivory",
        "deploy/helm/ivory",
        "--namespace",
        "ivory-system",
        "--kube-version",
        "1.32.0",
        "--set",
        "sharedCache.enabled=true,sharedCache.server.enabled=true,sharedCache.rotating=true",
    ])));
    check(&docs, &["current", "previous"]);

    // A rediss:// server's private CA, from a Secret: mounted and passed as --cache-redis-ca.
    let docs = documents(&run(Command::new(&helm).args([
        "template",
        "ivory",
        "deploy/helm/ivory",
        "--namespace",
        "ivory-system",
        "--kube-version",
        "1.32.0",
        "--set",
        "sharedCache.enabled=true,sharedCache.url=rediss://cache.example:6380,sharedCache.caSecret.name=cache-ca",
    ])));
    let ivory = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ivory")
        .expect("ivory Deployment");
    let pod = &ivory["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let ca_args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| a.starts_with("--cache-redis-ca"))
        .collect();
    assert_eq!(
        ca_args,
        ["--cache-redis-ca=/etc/ivory/shared-cache-ca/ca.crt"]
    );
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "shared-cache-ca")
        .expect("CA mount");
    assert_eq!(mount["mountPath"], "/etc/ivory/shared-cache-ca");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "shared-cache-ca")
        .expect("CA volume");
    assert_eq!(volume["secret"]["secretName"], "cache-ca");
    assert_eq!(volume["secret"]["items"][0]["key"], "ca.crt");
}

#[test]
fn helm_renders_the_registry_ca() {
    let render = |extra: &[&str]| {
        helm_template(extra)
            .into_iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ivory")
            .expect("ivory Deployment")
    };
    let ca_args = |d: &Value| -> Vec<String> {
        d["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .filter(|a| a.starts_with("--registry-ca"))
            .map(str::to_owned)
            .collect()
    };
    let plain = render(&[]);
    assert!(ca_args(&plain).is_empty(), "no --registry-ca by default");

    let with_ca = render(&[
        "--set",
        "registryCA.configMap=registry-ca,registryCA.key=root.pem",
    ]);
    assert_eq!(
        ca_args(&with_ca),
        ["--registry-ca=/etc/ivory/registry-ca/root.pem"]
    );
    let pod = &with_ca["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "registry-ca")
        .expect("registry-ca volume");
    assert_eq!(volume["configMap"]["name"], "registry-ca");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "registry-ca")
        .expect("registry-ca mount");
    assert_eq!(mount["mountPath"], "/etc/ivory/registry-ca");
    assert_eq!(mount["readOnly"], true);
}

// --- the trusted root ---------------------------------------------------------------------------

/// Where the charts mount the TUF cache and the trusted root (the paths the flags name).
const TUF_CACHE: &str = "/var/cache/ivory/tuf";
const TRUSTED_ROOT_DIR: &str = "/etc/ivory/trusted-root";

/// The `helm template` of the chart with `extra` arguments (the release namespace set).
fn helm_template(extra: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(tool("helm"));
    cmd.args([
        "template",
        "ivory",
        "deploy/helm/ivory",
        "--namespace",
        "ivory-system",
        "--kube-version",
        "1.32.0",
    ]);
    cmd.args(extra);
    documents(&run(&mut cmd))
}

/// What `helm template --set values` prints on stderr, asserting that it refused to render.
fn helm_refusal(values: &str) -> String {
    let out = Command::new(tool("helm"))
        .args(["template", "ivory", "deploy/helm/ivory", "--set", values])
        .current_dir(repo_root())
        .output()
        .expect("running helm");
    assert!(!out.status.success(), "{values} rendered");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// ivory's Deployment among rendered documents.
fn ivory_deployment(docs: &[Value]) -> &Value {
    docs.iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ivory")
        .expect("ivory Deployment")
}

/// The container's arguments about the trusted root (`--trusted-root`, `--tuf-*`), in order.
fn trust_args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| a.starts_with("--trusted-root") || a.starts_with("--tuf-"))
        .map(str::to_owned)
        .collect()
}

/// The pod's volume named `name` and the container's mount of it, if any.
fn volume_and_mount<'a>(deployment: &'a Value, name: &str) -> Option<(&'a Value, &'a Value)> {
    let pod = &deployment["spec"]["template"]["spec"];
    let named = |list: &'a Value| {
        list.as_array()
            .expect("a list")
            .iter()
            .find(|v| v["name"] == name)
    };
    let volume = named(&pod["volumes"]);
    let mount = named(&pod["containers"][0]["volumeMounts"]);
    assert_eq!(
        volume.is_some(),
        mount.is_some(),
        "volume {name} and its mount go together"
    );
    volume.zip(mount)
}

/// The default TUF cache: an emptyDir the container may write, at the path the flag names.
fn assert_tuf_cache_is_an_empty_dir(deployment: &Value) {
    let (volume, mount) = volume_and_mount(deployment, "tuf-cache").expect("the TUF cache");
    assert_eq!(volume["emptyDir"]["sizeLimit"], "16Mi");
    assert_eq!(mount["mountPath"], TUF_CACHE);
    assert_ne!(mount["readOnly"], true, "ivory writes its TUF cache");
}

/// A trusted_root.json mounted read-only as a whole volume (a subPath mount would never see an
/// update, and ivory reads the file again every reload interval).
fn assert_trusted_root_mounted(deployment: &Value) -> &Value {
    let (volume, mount) = volume_and_mount(deployment, "trusted-root").expect("the trusted root");
    assert_eq!(mount["mountPath"], TRUSTED_ROOT_DIR);
    assert_eq!(mount["readOnly"], true);
    assert!(mount.get("subPath").is_none(), "{mount}");
    assert!(
        volume_and_mount(deployment, "tuf-cache").is_none(),
        "no TUF cache beside a file root"
    );
    volume
}

/// The Helm chart's `trustRoot` values: public-good TUF with an emptyDir cache by default, none,
/// a trusted_root.json from a ConfigMap or a Secret, a site's own mirror with its root and a
/// claim; contradictions refused.
#[test]
fn helm_renders_the_trusted_root() {
    let default = helm_template(&[]);
    let deployment = ivory_deployment(&default);
    assert_eq!(
        trust_args(deployment),
        [
            "--tuf-mirror=public-good",
            "--tuf-cache-dir=/var/cache/ivory/tuf",
            "--tuf-refresh-interval=1h"
        ]
    );
    assert_tuf_cache_is_an_empty_dir(deployment);
    assert!(volume_and_mount(deployment, "tuf-root").is_none());

    // No TUF: the root built into ivory, nothing mounted.
    let none = helm_template(&["--set", "trustRoot.tuf.mirror="]);
    let deployment = ivory_deployment(&none);
    assert!(trust_args(deployment).is_empty());
    assert!(volume_and_mount(deployment, "tuf-cache").is_none());

    // A trusted_root.json of the site's: it replaces the public-good default.
    let file = helm_template(&["--set", "trustRoot.file.configMap=site-root"]);
    let deployment = ivory_deployment(&file);
    assert_eq!(
        trust_args(deployment),
        ["--trusted-root=/etc/ivory/trusted-root/trusted_root.json"]
    );
    let volume = assert_trusted_root_mounted(deployment);
    assert_eq!(volume["configMap"]["name"], "site-root");

    let secret = helm_template(&[
        "--set",
        "trustRoot.file.secret=site-root,trustRoot.file.key=root.json",
    ]);
    let deployment = ivory_deployment(&secret);
    assert_eq!(
        trust_args(deployment),
        ["--trusted-root=/etc/ivory/trusted-root/root.json"]
    );
    let volume = assert_trusted_root_mounted(deployment);
    assert_eq!(volume["secret"]["secretName"], "site-root");
    let (tls, _) = volume_and_mount(deployment, "tls").expect("TLS volume");
    assert_eq!(
        volume["secret"]["defaultMode"], tls["secret"]["defaultMode"],
        "read by the pod's group only, as the TLS Secret"
    );

    // A site's own mirror: its root.json from a ConfigMap, the cache on a claim.
    let mirror = helm_template(&[
        "--set",
        "trustRoot.tuf.mirror=https://tuf.internal.example,trustRoot.tuf.rootConfigMap.name=tuf-root,\
         trustRoot.tuf.cache.existingClaim=ivory-tuf,trustRoot.tuf.refreshInterval=15m",
    ]);
    let deployment = ivory_deployment(&mirror);
    assert_eq!(
        trust_args(deployment),
        [
            "--tuf-mirror=https://tuf.internal.example",
            "--tuf-root=/etc/ivory/tuf-root/root.json",
            "--tuf-cache-dir=/var/cache/ivory/tuf",
            "--tuf-refresh-interval=15m"
        ]
    );
    let (root, root_mount) = volume_and_mount(deployment, "tuf-root").expect("the TUF root");
    assert_eq!(root["configMap"]["name"], "tuf-root");
    assert_eq!(root_mount["mountPath"], "/etc/ivory/tuf-root");
    assert_eq!(root_mount["readOnly"], true);
    let (cache, cache_mount) = volume_and_mount(deployment, "tuf-cache").expect("the TUF cache");
    assert_eq!(cache["persistentVolumeClaim"]["claimName"], "ivory-tuf");
    assert!(cache.get("emptyDir").is_none());
    assert_eq!(cache_mount["mountPath"], TUF_CACHE);

    // What ivory serve would refuse at start is refused at render, naming the values.
    for (values, says) in [
        (
            "trustRoot.file.configMap=a,trustRoot.file.secret=b",
            "set configMap or secret, not both",
        ),
        (
            "trustRoot.tuf.mirror=https://tuf.internal.example",
            "needs trustRoot.tuf.rootConfigMap.name",
        ),
        (
            "trustRoot.file.configMap=a,trustRoot.tuf.mirror=https://tuf.internal.example,trustRoot.tuf.rootConfigMap.name=r",
            "choose one",
        ),
    ] {
        let stderr = helm_refusal(values);
        assert!(stderr.contains(says), "{values}: {stderr}");
    }
}

/// The kustomize base's public-good TUF root, the trusted-root overlay that swaps it for a
/// ConfigMap, and the air-gapped mirror patch deploy/README.md shows (kept identical here).
#[test]
fn kustomize_renders_the_trusted_root() {
    let kustomize = tool("kustomize");
    let base = documents(&run(Command::new(&kustomize).args(["build", "deploy"])));
    assert_tuf_cache_is_an_empty_dir(ivory_deployment(&base));

    let overlay = documents(&run(
        Command::new(&kustomize).args(["build", "deploy/overlays/trusted-root"])
    ));
    let deployment = ivory_deployment(&overlay);
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    let mut want: Vec<&str> = KUBE_ARGS[..17].to_vec();
    want.push("--trusted-root=/etc/ivory/trusted-root/trusted_root.json");
    assert_eq!(args, &json!(want));
    let volume = assert_trusted_root_mounted(deployment);
    assert_eq!(volume["configMap"]["name"], "ivory-trusted-root");

    let dir = tempfile::Builder::new()
        .prefix(".kustomize-tuf-mirror-")
        .tempdir_in(repo_root())
        .unwrap();
    std::fs::write(dir.path().join("kustomization.yaml"), README_MIRROR_OVERLAY).unwrap();
    std::fs::write(dir.path().join("root.json"), "{\"signed\": {}}\n").unwrap();
    let mirrored = documents(&run(Command::new(&kustomize).arg("build").arg(dir.path())));
    let deployment = ivory_deployment(&mirrored);
    assert_eq!(
        trust_args(deployment),
        [
            "--tuf-mirror=https://tuf.internal.example",
            "--tuf-root=/etc/ivory/tuf-root/root.json",
            "--tuf-cache-dir=/var/cache/ivory/tuf",
            "--tuf-refresh-interval=1h"
        ]
    );
    let config_map = mirrored
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("the generated root ConfigMap");
    assert_eq!(config_map["data"]["root.json"], "{\"signed\": {}}\n");
    let (root, root_mount) = volume_and_mount(deployment, "tuf-root").expect("the TUF root");
    assert_eq!(
        root["configMap"]["name"], config_map["metadata"]["name"],
        "the volume follows the generated (hashed) name, so a new root.json rolls the pods"
    );
    assert_eq!(root_mount["readOnly"], true);
    assert_tuf_cache_is_an_empty_dir(deployment);
}

/// The overlay of deploy/README.md, "Trusted root", for an air-gapped TUF mirror.
const README_MIRROR_OVERLAY: &str = "\
resources:
  - ../deploy
configMapGenerator:
  - name: ivory-tuf-root
    namespace: ivory-system
    files:
      - root.json
patches:
  - target:
      kind: Deployment
      name: ivory
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/args/17
        value: --tuf-mirror=public-good
      - op: replace
        path: /spec/template/spec/containers/0/args/17
        value: --tuf-mirror=https://tuf.internal.example
      - op: add
        path: /spec/template/spec/containers/0/args/18
        value: --tuf-root=/etc/ivory/tuf-root/root.json
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value:
          name: tuf-root
          mountPath: /etc/ivory/tuf-root
          readOnly: true
      - op: add
        path: /spec/template/spec/volumes/-
        value:
          name: tuf-root
          configMap:
            name: ivory-tuf-root
";

/// `service.clusterIP` (the address static webhook manifests call): the Service keeps it and
/// cert-manager's serving certificate carries it; unset, neither names one.
#[test]
fn helm_renders_the_fixed_cluster_ip_for_the_static_registration() {
    let find = |docs: &[Value], kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    let fixed = helm_template(&[
        "--set",
        "service.clusterIP=10.96.0.10,certManager.enabled=true",
    ]);
    assert_eq!(
        find(&fixed, "Service", "ivory")["spec"]["clusterIP"],
        "10.96.0.10"
    );
    assert_eq!(
        find(&fixed, "Certificate", "ivory")["spec"]["ipAddresses"],
        serde_json::json!(["10.96.0.10"])
    );
    let plain = helm_template(&["--set", "certManager.enabled=true"]);
    assert!(find(&plain, "Service", "ivory")["spec"]["clusterIP"].is_null());
    assert!(find(&plain, "Certificate", "ivory")["spec"]["ipAddresses"].is_null());
}

/// The monitoring objects: none by default; when enabled, a ServiceMonitor scraping the https
/// port's /metrics and a PrometheusRule holding every alert of the rules file.
#[test]
fn helm_renders_the_monitoring_objects_only_when_asked() {
    let kinds = |docs: &[Value]| -> Vec<String> {
        docs.iter()
            .filter_map(|d| d["kind"].as_str().map(str::to_owned))
            .collect()
    };
    let plain = helm_template(&[]);
    assert!(
        !kinds(&plain)
            .iter()
            .any(|k| k == "ServiceMonitor" || k == "PrometheusRule"),
        "{:?}",
        kinds(&plain)
    );
    let on = helm_template(&[
        "--set",
        "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true",
    ]);
    let monitor = on
        .iter()
        .find(|d| d["kind"] == "ServiceMonitor")
        .expect("a ServiceMonitor");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["path"], "/metrics");
    let rule = on
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let alerts = |groups: &Value| -> Vec<String> {
        groups
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().iter())
            .filter_map(|r| r["alert"].as_str().map(str::to_owned))
            .collect()
    };
    let file: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/monitoring/ivory-alerts.rules.yaml"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(alerts(&rule["spec"]["groups"]), alerts(&file["groups"]));
}

/// The dashboard for Grafana's sidecar: a ConfigMap holding deploy/monitoring/ivory-dashboard.json
/// as it is, from the chart when asked and from the kustomize component.
#[test]
fn the_dashboard_is_installable_with_helm_and_kustomize() {
    let file = std::fs::read_to_string(repo_root().join("deploy/monitoring/ivory-dashboard.json"))
        .unwrap();
    let dashboard = |doc: &Value| -> Value {
        serde_json::from_str(doc["data"]["ivory-dashboard.json"].as_str().unwrap()).unwrap()
    };
    let expected: Value = serde_json::from_str(&file).unwrap();
    assert!(
        !helm_template(&[])
            .iter()
            .any(|d| d["metadata"]["name"] == "ivory-dashboard")
    );
    let on = helm_template(&["--set", "monitoring.dashboard.enabled=true"]);
    let map = on
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "ivory-dashboard")
        .expect("the dashboard ConfigMap");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(dashboard(map), expected);

    let docs = documents(&run(
        Command::new(tool("kustomize")).args(["build", "deploy/overlays/monitoring"])
    ));
    let map = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "ivory-dashboard")
        .expect("the kustomize component's dashboard ConfigMap");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(dashboard(map), expected);
}
