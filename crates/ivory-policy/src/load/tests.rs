//! Loading: multi-document YAML, JSON forms, skipping, versions, duplicates and directories.

use std::fs;

use super::*;
use crate::testutil::PUBLIC_KEY;

fn policy_yaml(kind: &str, version: &str, name: &str, extra_meta: &str) -> String {
    format!(
        r#"apiVersion: policies.kyverno.io/{version}
kind: {kind}
metadata:
  name: {name}{extra_meta}
spec:
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods"]
  attestors: []
  validations:
    - expression: "true"
"#
    )
}

fn ivpol(name: &str) -> String {
    policy_yaml("ImageValidatingPolicy", "v1", name, "")
}

fn messages(report: &LoadReport) -> Vec<String> {
    report.errors.iter().map(ToString::to_string).collect()
}

#[test]
fn multi_document_yaml_with_one_bad_document() {
    let bad = ivpol("bad").replace("expression: \"true\"", "expression: \"imagez.size() > 0\"");
    let configmap = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n";
    let text = format!(
        "# leading comment\n---\n{}---\n{bad}---\n{configmap}---\n# only a comment\n---\n{}",
        ivpol("one"),
        ivpol("two")
    );
    let report = load_str(&text, "policies/a.yaml");
    assert_eq!(
        names(&report),
        ["ImageValidatingPolicy/one", "ImageValidatingPolicy/two"]
    );
    assert_eq!(
        messages(&report),
        ["policies/a.yaml (doc 2): spec.validations[0].expression: undeclared reference 'imagez'"]
    );
    assert_eq!(
        report.skipped,
        ["policies/a.yaml (doc 3): skipped v1 ConfigMap \"cm\": not an image validating policy"]
    );
    assert_eq!(report.policies[1].origin.document, 4);
    assert_eq!(
        report.policies[1].origin.file.as_deref(),
        Some(Path::new("policies/a.yaml"))
    );
}

#[test]
fn yaml_syntax_error_is_located_and_isolated() {
    let text = format!(
        "{}---\napiVersion: policies.kyverno.io/v1\nkind: [unclosed\n---\n{}",
        ivpol("one"),
        ivpol("two")
    );
    let report = load_str(&text, "s.yaml");
    assert_eq!(
        names(&report),
        ["ImageValidatingPolicy/one", "ImageValidatingPolicy/two"]
    );
    let errors = messages(&report);
    assert_eq!(errors.len(), 1);
    // Line numbers are relative to the whole file: the unclosed `[` is on line 17, column 7.
    assert_eq!(
        errors[0],
        "s.yaml (doc 2): YAML syntax error: unclosed bracket '[' at line 17, column 7"
    );
}

#[test]
fn json_object_array_and_list() {
    let one: serde_json::Value = serde_saphyr::from_str(&ivpol("one")).unwrap();
    let two: serde_json::Value = serde_saphyr::from_str(&ivpol("two")).unwrap();
    let report = load_str(&one.to_string(), "one.json");
    assert_eq!(names(&report), ["ImageValidatingPolicy/one"]);

    let array = serde_json::json!([one, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}, two]);
    let report = load_str(&array.to_string(), "arr.json");
    assert_eq!(
        names(&report),
        ["ImageValidatingPolicy/one", "ImageValidatingPolicy/two"]
    );
    assert_eq!(
        report.skipped,
        ["arr.json (doc 1) ([1]): skipped v1 Secret \"s\": not an image validating policy"]
    );

    let mut bad = two.clone();
    bad["spec"]["failurePolicy"] = "Sometimes".into();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [one, bad]});
    let report = load_str(&serde_json::to_string_pretty(&list).unwrap(), "list.json");
    assert_eq!(names(&report), ["ImageValidatingPolicy/one"]);
    assert_eq!(
        messages(&report),
        [
            "list.json (doc 1): items[1].spec.failurePolicy: Unsupported value: \"Sometimes\": supported values: \"Ignore\", \"Fail\""
        ]
    );

    // `kind: List` works in YAML too.
    let yaml = serde_saphyr::to_string(
        &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [two]}),
    )
    .unwrap();
    assert_eq!(
        names(&load_str(&yaml, "list.yaml")),
        ["ImageValidatingPolicy/two"]
    );
}

#[test]
fn json_syntax_error_has_line_and_column() {
    let report = load_str(
        "{\n  \"apiVersion\": \"policies.kyverno.io/v1\",\n  \"kind\": }\n",
        "bad.json",
    );
    assert_eq!(
        messages(&report),
        ["bad.json (doc 1): JSON syntax error: expected value at line 3 column 11"]
    );
}

#[test]
fn kinds_versions_and_foreign_documents() {
    for version in ["v1alpha1", "v1beta1", "v1"] {
        for kind in ["ImageValidatingPolicy", "ImageVerificationPolicy"] {
            let report = load_str(&policy_yaml(kind, version, "p", ""), "k.yaml");
            assert!(
                report.errors.is_empty(),
                "{kind} {version}: {:?}",
                report.errors
            );
            assert_eq!(report.policies[0].kind, PolicyKind::ImageValidatingPolicy);
        }
        let nivpol = policy_yaml(
            "NamespacedImageValidatingPolicy",
            version,
            "p",
            "\n  namespace: team-a",
        );
        let report = load_str(&nivpol, "n.yaml");
        assert_eq!(names(&report), ["NamespacedImageValidatingPolicy/team-a/p"]);
        assert_eq!(report.policies[0].namespace.as_deref(), Some("team-a"));
    }
    // A namespace on a cluster policy is ignored, as the API server does.
    let report = load_str(
        &policy_yaml("ImageValidatingPolicy", "v1", "p", "\n  namespace: x"),
        "c.yaml",
    );
    assert_eq!(report.policies[0].namespace, None);

    let report = load_str(
        &policy_yaml("ImageValidatingPolicy", "v2", "p", ""),
        "v.yaml",
    );
    assert!(report.policies.is_empty());
    assert_eq!(
        messages(&report),
        [
            "v.yaml (doc 1): apiVersion: Unsupported value: \"policies.kyverno.io/v2\": supported values: \"policies.kyverno.io/v1alpha1\", \"policies.kyverno.io/v1beta1\", \"policies.kyverno.io/v1\""
        ]
    );

    let foreign = [
        policy_yaml("ValidatingPolicy", "v1", "vpol", ""),
        policy_yaml("ImageValidatingPolicy", "v1", "x", "")
            .replace("policies.kyverno.io", "kyverno.io"),
        "kind: ImageValidatingPolicy\nmetadata: {name: y}\n".to_owned(),
    ]
    .join("---\n");
    let report = load_str(&foreign, "f.yaml");
    assert!(report.policies.is_empty() && report.errors.is_empty());
    assert_eq!(
        report.skipped,
        [
            "f.yaml (doc 1): skipped policies.kyverno.io/v1 ValidatingPolicy \"vpol\": not an image validating policy",
            "f.yaml (doc 2): skipped kyverno.io/v1 ImageValidatingPolicy \"x\": not an image validating policy",
            "f.yaml (doc 3): skipped  ImageValidatingPolicy \"y\": not an image validating policy",
        ]
    );
}

#[test]
fn non_object_documents_are_errors() {
    let report = load_str("just a string\n", "s.yaml");
    assert_eq!(
        messages(&report),
        ["s.yaml (doc 1): Invalid value: a document must be an object, found a string"]
    );
}

#[test]
fn duplicates_name_both_origins() {
    let text = [
        ivpol("dup"),
        ivpol("dup"),
        policy_yaml("ImageVerificationPolicy", "v1alpha1", "dup", ""),
        policy_yaml(
            "NamespacedImageValidatingPolicy",
            "v1",
            "dup",
            "\n  namespace: a",
        ),
        policy_yaml(
            "NamespacedImageValidatingPolicy",
            "v1",
            "dup",
            "\n  namespace: b",
        ),
    ]
    .join("---\n");
    let report = load_str(&text, "d.yaml");
    assert_eq!(
        names(&report),
        [
            "ImageValidatingPolicy/dup",
            "NamespacedImageValidatingPolicy/a/dup",
            "NamespacedImageValidatingPolicy/b/dup",
        ]
    );
    assert_eq!(
        messages(&report),
        [
            "d.yaml (doc 2): metadata.name: Duplicate value: \"dup\": ImageValidatingPolicy is already defined by d.yaml (doc 1)",
            "d.yaml (doc 3): metadata.name: Duplicate value: \"dup\": ImageValidatingPolicy is already defined by d.yaml (doc 1)",
        ]
    );
}

#[test]
fn directory_loading_is_recursive_sorted_and_skips_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("nested/deeper")).unwrap();
    fs::create_dir_all(root.join("..data")).unwrap();
    fs::write(root.join("b.yaml"), ivpol("b")).unwrap();
    fs::write(root.join("a.yml"), ivpol("a")).unwrap();
    let json: serde_json::Value = serde_saphyr::from_str(&ivpol("c")).unwrap();
    fs::write(root.join("nested/c.json"), json.to_string()).unwrap();
    fs::write(root.join("nested/deeper/d.yaml"), ivpol("a")).unwrap();
    fs::write(root.join("nested/notes.txt"), "not a policy").unwrap();
    fs::write(root.join("..data/a.yml"), ivpol("a")).unwrap();
    fs::write(root.join(".hidden.yaml"), ivpol("hidden")).unwrap();
    fs::write(root.join("broken.yaml"), "kind: [").unwrap();

    let report = load_path(root);
    assert_eq!(
        names(&report),
        [
            "ImageValidatingPolicy/a",
            "ImageValidatingPolicy/b",
            "ImageValidatingPolicy/c"
        ]
    );
    let errors = messages(&report);
    assert_eq!(errors.len(), 2, "{errors:?}");
    let a = root.join("a.yml").display().to_string();
    let d = root.join("nested/deeper/d.yaml").display().to_string();
    assert!(errors[0].starts_with(&format!(
        "{}/broken.yaml (doc 1): YAML syntax error",
        root.display()
    )));
    assert_eq!(
        errors[1],
        format!(
            "{d} (doc 1): metadata.name: Duplicate value: \"a\": ImageValidatingPolicy is already defined by {a} (doc 1)"
        )
    );

    // A single file works too; a missing path is an error, not a panic.
    assert_eq!(
        names(&load_path(root.join("b.yaml"))),
        ["ImageValidatingPolicy/b"]
    );
    let missing = load_path(root.join("nope"));
    assert!(
        messages(&missing)[0].contains("nope: failed to read: "),
        "{:?}",
        missing.errors
    );
}

#[test]
fn syntax_errors_in_json_files_by_extension() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("p.json"), "{\"kind\": ").unwrap();
    let report = load_path(dir.path());
    assert!(messages(&report)[0].contains(
        "p.json (doc 1): JSON syntax error: EOF while parsing a value at line 1 column 9"
    ));
}

#[test]
fn pem_in_yaml_block_scalar_loads() {
    let text = ivpol("k").replace(
        "attestors: []",
        &format!(
            "attestors:\n    - name: k\n      cosign:\n        key:\n          data: |\n{}",
            PUBLIC_KEY
                .lines()
                .map(|l| format!("            {l}\n"))
                .collect::<String>()
        ),
    );
    let report = load_str(&text, "k.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        report.policies[0].attestors[0]
            .attestor
            .cosign
            .as_ref()
            .unwrap()
            .key
            .as_ref()
            .unwrap()
            .data
            .as_deref(),
        Some(PUBLIC_KEY)
    );
}

#[test]
fn marker_lines_with_content_and_odd_documents() {
    let inline = serde_json::to_string(
        &serde_saphyr::from_str::<serde_json::Value>(&ivpol("inline")).unwrap(),
    )
    .unwrap();
    let text = format!(
        "--- {inline}\n---\napiVersion: v1\nkind: List\n---\napiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata: {{name: nospec}}\nspec: null\n"
    );
    let report = load_str(&text, "m.yaml");
    assert_eq!(names(&report), ["ImageValidatingPolicy/inline"]);
    assert_eq!(
        report.skipped,
        ["m.yaml (doc 2): skipped a List without items"]
    );
    assert_eq!(messages(&report), ["m.yaml (doc 3): spec: Required value"]);
}

#[test]
fn documents_name_the_one_that_does_not_parse() {
    let docs = crate::documents("a: 1\n---\nb: 2\n").unwrap();
    assert_eq!(docs.len(), 2);
    let err = crate::documents("a: 1\n---\nb: [\n").unwrap_err();
    assert!(
        matches!(err, crate::DocumentError::Yaml { number: 2, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("document 2: YAML syntax error: "),
        "{err}"
    );
    let err = crate::documents("{\"a\": ").unwrap_err();
    assert!(matches!(err, crate::DocumentError::Json(_)), "{err:?}");
    assert!(err.to_string().starts_with("JSON syntax error: "), "{err}");
}
