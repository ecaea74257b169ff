use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::ByteString;
use kube::api::ObjectMeta;
use kube::runtime::reflector::store::Writer;
use serde_json::json;

use super::*;

fn policy_object(name: &str, version: &str, validations: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "policies.kyverno.io/v1",
        "kind": "ImageValidatingPolicy",
        "metadata": {"name": name, "resourceVersion": version, "managedFields": [{"manager": "x"}]},
        "spec": {
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods"]
            }]},
            "matchImageReferences": [{"glob": "registry.test/*"}],
            "attestors": [],
            "validations": validations,
        },
        "status": {"conditionStatus": {"ready": true}}
    }))
    .unwrap()
}

fn good(name: &str, version: &str) -> DynamicObject {
    policy_object(name, version, json!([{"expression": "true"}]))
}

fn broken(name: &str, version: &str) -> DynamicObject {
    policy_object(
        name,
        version,
        json!([{"expression": "images.containers.("}]),
    )
}

fn policy_store(objects: &[DynamicObject]) -> (Store<DynamicObject>, Writer<DynamicObject>) {
    let resource = policy_resource("ImageValidatingPolicy", "imagevalidatingpolicies");
    let mut writer = Writer::new(resource);
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(o.clone()));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (writer.as_reader(), writer)
}

fn names(store: &PolicyStore) -> Vec<String> {
    store
        .snapshot()
        .policies()
        .iter()
        .map(|p| p.name.clone())
        .collect()
}

#[test]
fn compiles_objects_and_strips_status() {
    let object = good("pin", "1");
    let key = key_of(&object);
    assert_eq!(
        key,
        ("ImageValidatingPolicy".into(), String::new(), "pin".into())
    );
    let policy = compile_object(&object, &key).unwrap();
    assert_eq!(policy.name, "pin");

    let errors = compile_object(&broken("bad", "1"), &key).unwrap_err();
    assert!(
        errors[0].contains("ImageValidatingPolicy/pin"),
        "{errors:?}"
    );
}

#[test]
fn a_broken_update_keeps_that_policys_last_good_version_only() {
    let (reader, mut writer) = policy_store(&[good("a", "1"), good("b", "1")]);
    let store = PolicyStore::default();
    let metrics = Metrics::new();
    let mut compiler = Compiler::default();
    compiler.publish(&[&reader], &store, &metrics);
    assert_eq!(names(&store), ["a", "b"]);
    assert!(store.snapshot().errors.is_empty());

    // `a` breaks, `c` appears: `a` keeps its previous version, `c` is served, errors show `a`.
    writer.apply_watcher_event(&watcher::Event::Apply(broken("a", "2")));
    writer.apply_watcher_event(&watcher::Event::Apply(good("c", "1")));
    compiler.publish(&[&reader], &store, &metrics);
    let snapshot = store.snapshot();
    assert!(snapshot.is_ready());
    assert_eq!(names(&store), ["a", "b", "c"]);
    assert_eq!(snapshot.errors.len(), 1, "{:?}", snapshot.errors);
    assert!(snapshot.errors[0].contains("/a"), "{:?}", snapshot.errors);
    assert!(metrics.encode().contains("ivory_policy_load_errors"));

    // Deleting the broken policy removes it and its error; fixing needs no restart.
    writer.apply_watcher_event(&watcher::Event::Delete(broken("a", "2")));
    writer.apply_watcher_event(&watcher::Event::Apply(broken("b", "2")));
    writer.apply_watcher_event(&watcher::Event::Apply(good("b", "3")));
    compiler.publish(&[&reader], &store, &metrics);
    assert_eq!(names(&store), ["b", "c"]);
    assert!(store.snapshot().errors.is_empty());
}

#[test]
fn a_policy_broken_from_the_start_is_an_error_not_a_policy() {
    let (reader, _writer) = policy_store(&[broken("x", "1")]);
    let store = PolicyStore::default();
    let mut compiler = Compiler::default();
    compiler.publish(&[&reader], &store, &Metrics::new());
    let snapshot = store.snapshot();
    assert!(snapshot.is_ready(), "an empty set is still a set");
    assert!(snapshot.policies().is_empty());
    assert_eq!(snapshot.errors.len(), 1);
}

fn source_with(namespaces: Vec<Namespace>, secrets: Vec<Secret>) -> KubeSource {
    let (ns_reader, mut ns_writer) = reflector::store::<Namespace>();
    for ns in namespaces {
        ns_writer.apply_watcher_event(&watcher::Event::Apply(ns));
    }
    let (secret_reader, mut secret_writer) = reflector::store::<Secret>();
    for s in secrets {
        secret_writer.apply_watcher_event(&watcher::Event::Apply(s));
    }
    // The stores keep their contents after the writers are dropped.
    KubeSource {
        namespaces: ns_reader,
        secrets: secret_reader,
        own_namespace: "ivory".to_owned(),
    }
}

#[test]
fn namespaces_carry_their_real_labels_and_unknown_ones_are_synthesized() {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("team".into()),
            labels: Some(BTreeMap::from([("tier".into(), "prod".into())])),
            managed_fields: Some(vec![Default::default()]),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let source = source_with(vec![ns], vec![]).namespace_source();
    let value = source.namespace("team").unwrap();
    assert_eq!(value["metadata"]["labels"]["tier"], "prod");
    assert_eq!(value["kind"], "Namespace");
    assert!(value["metadata"].get("managedFields").is_none(), "{value}");
    assert_eq!(source.namespace("new").unwrap(), namespace_object("new"));
}

fn docker_secret(namespace: &str, name: &str, host: &str) -> Secret {
    let auth = base64::engine::general_purpose::STANDARD.encode("user:pass");
    let config = json!({"auths": {host: {"auth": auth}}}).to_string();
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        type_: Some(DOCKER_CONFIG_TYPE.into()),
        data: Some(BTreeMap::from([(
            DOCKER_CONFIG_KEY.to_owned(),
            ByteString(config.into_bytes()),
        )])),
        ..Secret::default()
    }
}

#[test]
fn credentials_come_from_secrets_in_ivorys_namespace() {
    let source = source_with(
        vec![],
        vec![docker_secret("ivory", "pull", "registry.test")],
    );
    assert!(source.credentials(None).is_empty());
    let policy = PolicyCredentials {
        allow_insecure_registry: Some(true),
        secrets: vec!["pull".into(), "missing".into(), "other/pull".into()],
        ..PolicyCredentials::default()
    };
    let creds = source.credentials(Some(&policy));
    assert!(creds.allow_insecure);
    assert!(!creds.is_empty(), "{creds:?}");
    let qualified = PolicyCredentials {
        secrets: vec!["ivory/pull".into()],
        ..PolicyCredentials::default()
    };
    assert!(!source.credentials(Some(&qualified)).is_empty());
    let elsewhere = PolicyCredentials {
        secrets: vec!["other/pull".into()],
        ..PolicyCredentials::default()
    };
    assert!(source.credentials(Some(&elsewhere)).is_empty());
}
