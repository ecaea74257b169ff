//! The written CEL walks objects as Kyverno's `extract` does (pkg/utils/api/image.go): each
//! expectation below is what Kyverno finds, or its error, for the same object, except where a
//! comment names the documented difference.

use super::*;
use ivory_cel::{Activation, NoHost, Scope};
use serde_json::json;

/// The images `imageExtractors` finds in `object`, or the evaluation's error.
fn extract(extractors: Value, object: Value) -> BTreeMap<String, Result<Vec<String>, String>> {
    let converted = convert(Some(&extractors))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("extractors expected"));
    converted
        .images
        .iter()
        .map(|named| {
            let program = ivory_cel::compile(&named.expression, &Scope::new(["object"]))
                .unwrap_or_else(|e| panic!("{}: {e}", named.expression));
            let mut act = Activation::new(&NoHost);
            act.bind_json("object", &object);
            let value = program.evaluate(&act).map_err(|e| e.to_string()).map(|v| {
                match ivory_cel::value_to_json(&v) {
                    Ok(Value::Array(items)) => items
                        .iter()
                        .map(|i| i.as_str().unwrap_or_default().to_owned())
                        .collect(),
                    other => panic!("not a list: {other:?}"),
                }
            });
            (named.name.clone(), value)
        })
        .collect()
}

fn images(list: &[&str]) -> Result<Vec<String>, String> {
    Ok(list.iter().map(|s| (*s).to_owned()).collect())
}

fn pipeline_bundle() -> Value {
    json!({"PipelineRun": [{"name": "pipelineruns", "path": "/spec/pipelineRef", "value": "bundle", "key": "name"}]})
}

#[test]
fn a_field_path_finds_the_bundle_of_the_extractors_kind_only() {
    let run = |spec: Value| {
        extract(
            pipeline_bundle(),
            json!({"kind": "PipelineRun", "spec": spec}),
        )["pipelineruns"]
            .clone()
    };
    assert_eq!(
        run(json!({"pipelineRef": {"name": "p", "bundle": "reg.io/b:v1"}})),
        images(&["reg.io/b:v1"])
    );
    // No bundle, a blank one, a non-string one, no pipelineRef at all: nothing to verify.
    assert_eq!(run(json!({"pipelineRef": {"name": "p"}})), images(&[]));
    assert_eq!(
        run(json!({"pipelineRef": {"name": "p", "bundle": "  "}})),
        images(&[])
    );
    assert_eq!(
        run(json!({"pipelineRef": {"name": "p", "bundle": 3}})),
        images(&[])
    );
    assert_eq!(run(json!({})), images(&[]));
    assert_eq!(run(json!({"pipelineRef": null})), images(&[]));
    // Kyverno's "invalid key": the key field absent or not a string fails the rule.
    assert!(run(json!({"pipelineRef": {"bundle": "reg.io/b:v1"}})).is_err());
    assert!(run(json!({"pipelineRef": {"name": 7, "bundle": "reg.io/b:v1"}})).is_err());
    assert!(run(json!({"pipelineRef": {"resolver": "git"}})).is_err());
    // "invalid image config": a path through a list or a scalar.
    assert!(run(json!({"pipelineRef": ["reg.io/b:v1"]})).is_err());
    assert!(run(json!({"pipelineRef": "reg.io/b:v1"})).is_err());
    // Another kind: the extractor is Kyverno's for PipelineRun only.
    let other = extract(
        pipeline_bundle(),
        json!({"kind": "TaskRun", "spec": {"pipelineRef": {"name": "p", "bundle": "reg.io/b:v1"}}}),
    );
    assert_eq!(other["pipelineruns"], images(&[]));
}

#[test]
fn a_wildcard_walks_list_elements_and_object_values() {
    let steps = json!({"TaskRun": [{"name": "steps", "path": "/status/taskSpec/steps/*", "value": "image", "key": "name"}]});
    let found = |status: Value| {
        extract(steps.clone(), json!({"kind": "TaskRun", "status": status}))["steps"].clone()
    };
    assert_eq!(
        found(json!({"taskSpec": {"steps": [
            {"name": "a", "image": "reg.io/a:1"},
            {"name": "b"},
            "not an object",
            // Documented difference: Kyverno walks into a nested list; skipped here.
            [{"name": "nested", "image": "reg.io/nested:1"}],
            {"name": "c", "image": "reg.io/c@sha256:0000000000000000000000000000000000000000000000000000000000000000"}
        ]}})),
        images(&[
            "reg.io/a:1",
            "reg.io/c@sha256:0000000000000000000000000000000000000000000000000000000000000000"
        ])
    );
    // Over an object: its object values.
    assert_eq!(
        found(json!({"taskSpec": {"steps": {"x": {"name": "x", "image": "reg.io/x:1"}, "y": 3}}})),
        images(&["reg.io/x:1"])
    );
    assert_eq!(found(json!({})), images(&[]));
    assert!(found(json!({"taskSpec": {"steps": "text"}})).is_err());
}

#[test]
fn the_value_defaults_to_the_last_path_field_and_the_name_to_custom() {
    let found = extract(
        json!({"Tool": [{"path": "/spec/image"}, {"path": "/spec/sidecar/image"}]}),
        json!({"kind": "Tool", "spec": {"image": "reg.io/t:1", "sidecar": {"image": "reg.io/s:1"}}}),
    );
    assert_eq!(found["custom"], images(&["reg.io/t:1", "reg.io/s:1"]));
}

#[test]
fn refusals_name_the_field() {
    let refusal = |v: Value| match convert(Some(&v)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("{v} converted"),
    };
    let pod = refusal(json!({"Pod": [{"path": "/spec/containers/*/image"}]}));
    assert!(pod.contains("imageExtractors.Pod"), "{pod}");
    let jmes = refusal(
        json!({"Tool": [{"path": "/spec/image", "jmesPath": "trim_prefix(@, 'docker://')"}]}),
    );
    assert!(jmes.contains("imageExtractors.Tool[0].jmesPath"), "{jmes}");
    let empty = refusal(json!({"Tool": [{"path": "/"}]}));
    assert!(empty.contains("imageExtractors.Tool[0].path"), "{empty}");
    let unknown = refusal(json!({"Tool": [{"path": "/spec/image", "other": 1}]}));
    assert!(unknown.contains("imageExtractors"), "{unknown}");
}
