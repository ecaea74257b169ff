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
    assert_eq!(
        errors[0].location, "ImageValidatingPolicy/pin (doc 1)",
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
    // The gauge says so, and keeps saying so while `a` stays broken.
    assert!(metrics.encode().contains("ivory_policy_load_errors 1\n"));
    compiler.publish(&[&reader], &store, &metrics);
    assert!(metrics.encode().contains("ivory_policy_load_errors 1\n"));

    // Deleting the broken policy removes it and its error; fixing needs no restart.
    writer.apply_watcher_event(&watcher::Event::Delete(broken("a", "2")));
    writer.apply_watcher_event(&watcher::Event::Apply(broken("b", "2")));
    writer.apply_watcher_event(&watcher::Event::Apply(good("b", "3")));
    compiler.publish(&[&reader], &store, &metrics);
    assert_eq!(names(&store), ["b", "c"]);
    assert!(store.snapshot().errors.is_empty());
    assert!(metrics.encode().contains("ivory_policy_load_errors 0\n"));
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

/// A source without a client: the Namespaces given, and one synced Secret store per
/// namespace of the Secrets given (ivory's own always).
fn source_with(namespaces: Vec<Namespace>, secrets: Vec<Secret>) -> KubeSource {
    let (ns_reader, mut ns_writer) = reflector::store::<Namespace>();
    for ns in namespaces {
        ns_writer.apply_watcher_event(&watcher::Event::Apply(ns));
    }
    let mut by_namespace: BTreeMap<String, Vec<Secret>> =
        BTreeMap::from([("ivory".into(), vec![])]);
    for s in secrets {
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        by_namespace.entry(ns).or_default().push(s);
    }
    let stores = by_namespace
        .into_iter()
        .map(|(ns, secrets)| {
            let (reader, mut writer) = reflector::store::<Secret>();
            writer.apply_watcher_event(&watcher::Event::Init);
            for s in secrets {
                writer.apply_watcher_event(&watcher::Event::InitApply(s));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
            (ns, reader)
        })
        .collect();
    // The stores keep their contents after the writers are dropped.
    KubeSource {
        client: None,
        namespaces: ns_reader,
        secrets: Arc::new(RwLock::new(stores)),
        own_namespace: "ivory".to_owned(),
    }
}

#[tokio::test]
async fn namespaces_carry_their_real_labels_and_unknown_ones_are_unknown() {
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
    let deadline = ivory_clock::now() + std::time::Duration::from_secs(1);
    let value = source.namespace("team", deadline).await.unwrap();
    assert_eq!(value["metadata"]["labels"]["tier"], "prod");
    assert_eq!(value["kind"], "Namespace");
    assert!(value["metadata"].get("managedFields").is_none(), "{value}");
    // Not seen and no API to ask: unknown, so the server leaves selectors to the API server.
    assert_eq!(source.namespace("new", deadline).await, None);
}

/// A client whose API server knows Namespace `fresh` (labelled `tier: prod`) and nothing
/// else, and never answers for `hung`.
fn fake_api() -> Client {
    let service = tower::service_fn(|req: axum::http::Request<kube::client::Body>| async move {
        let path = req.uri().path().to_owned();
        if path.ends_with("/hung") {
            std::future::pending::<()>().await;
        }
        let (status, body) = if path == "/api/v1/namespaces/fresh" {
            let ns = json!({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": "fresh", "labels": {"tier": "prod"}}});
            (200, ns)
        } else {
            let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                "reason": "NotFound", "code": 404, "message": "not found"});
            (404, status)
        };
        axum::http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.to_string()))
    });
    Client::new(service, "default")
}

#[tokio::test]
async fn namespaces_the_watch_has_not_seen_are_read_from_the_api_within_the_deadline() {
    let mut source = source_with(vec![], vec![]);
    source.client = Some(fake_api());
    let namespaces = source.namespace_source();
    let deadline = ivory_clock::now() + std::time::Duration::from_secs(5);
    let fresh = namespaces.namespace("fresh", deadline).await.unwrap();
    assert_eq!(fresh["metadata"]["labels"]["tier"], "prod");
    assert_eq!(fresh["kind"], "Namespace");
    assert_eq!(namespaces.namespace("missing", deadline).await, None);
    let start = ivory_clock::now();
    let short = start + std::time::Duration::from_millis(200);
    assert_eq!(namespaces.namespace("hung", short).await, None);
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
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

fn secrets(names: &[&str]) -> PolicyCredentials {
    PolicyCredentials {
        secrets: names.iter().map(|n| (*n).to_owned()).collect(),
        ..PolicyCredentials::default()
    }
}

#[tokio::test]
async fn credential_scope_follows_kyverno() {
    let source = source_with(
        vec![],
        vec![
            docker_secret("ivory", "ivory-pull", "registry.test"),
            docker_secret("team", "team-pull", "registry.test"),
        ],
    );
    let deadline = ivory_clock::now() + std::time::Duration::from_secs(1);
    let prepare = |ns: Option<&'static str>, names: &'static [&'static str]| {
        let source = source.clone();
        async move { source.prepare(ns, &secrets(names), deadline).await }
    };
    // The texts are what the API server shows: compared whole.
    let prepare = |ns, names| {
        let checked = prepare(ns, names);
        async move { checked.await.map_err(|e| e.to_string()) }
    };
    // A cluster policy: plain names in ivory's namespace, `ns/name` anywhere.
    assert_eq!(prepare(None, &["ivory-pull"]).await, Ok(()));
    assert_eq!(
        prepare(None, &["team/team-pull", "ivory/ivory-pull"]).await,
        Ok(())
    );
    assert!(
        !source
            .credentials(Some(&secrets(&["team/team-pull"])))
            .is_empty()
    );
    assert_eq!(
        prepare(None, &["ivory-pull", "team-pull"]).await,
        Err(
            "spec.credentials.secrets[1] \"team-pull\": Secret ivory/team-pull of type \
             kubernetes.io/dockerconfigjson not found"
                .into()
        )
    );
    // A namespaced policy: its own namespace only; ivory's Secret is out of reach.
    assert_eq!(prepare(Some("team"), &["team-pull"]).await, Ok(()));
    assert_eq!(prepare(Some("team"), &["team/team-pull"]).await, Ok(()));
    assert_eq!(
        prepare(Some("team"), &["ivory-pull"]).await,
        Err(
            "spec.credentials.secrets[0] \"ivory-pull\": Secret team/ivory-pull of type \
             kubernetes.io/dockerconfigjson not found; a NamespacedImageValidatingPolicy reads \
             Secrets of its own namespace only"
                .into()
        )
    );
    assert_eq!(
        prepare(Some("team"), &["ivory/ivory-pull"]).await,
        Err(
            "spec.credentials.secrets[0] \"ivory/ivory-pull\": a NamespacedImageValidatingPolicy \
             may only use Secrets of its own namespace \"team\""
                .into()
        )
    );
    // A namespace nobody watches, and no API to start a watch with.
    let err = source
        .prepare(None, &secrets(&["elsewhere/x"]), deadline)
        .await
        .unwrap_err()
        .downcast::<CredentialError>()
        .expect("the source's own error");
    assert!(
        matches!(&err.problem, SecretProblem::NotWatched { namespace } if namespace == "elsewhere"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "spec.credentials.secrets[0] \"elsewhere/x\": Secrets of namespace elsewhere are not watched"
    );
}

#[test]
fn namespaced_policies_plain_secret_names_are_their_own_namespace() {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "policies.kyverno.io/v1",
        "kind": "NamespacedImageValidatingPolicy",
        "metadata": {"name": "p", "namespace": "team", "resourceVersion": "1"},
        "spec": {
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods"]
            }]},
            "credentials": {"secrets": ["team-pull", "team/other"]},
            "attestors": [],
            "validations": [{"expression": "true"}],
        }
    }))
    .unwrap();
    let policy = compile_object(&object, &key_of(&object)).unwrap();
    let creds = policy.credentials().unwrap();
    assert_eq!(creds.secrets, ["team/team-pull", "team/other"]);
    // Naming another namespace is a load error, not a silent skip.
    let mut object = object;
    object.data["spec"]["credentials"]["secrets"] = json!(["ivory/ivory-pull"]);
    let errors = compile_object(&object, &key_of(&object)).unwrap_err();
    assert!(
        errors[0].to_string().contains(
            "a NamespacedImageValidatingPolicy may only use Secrets of its own namespace"
        ),
        "{errors:?}"
    );
}
