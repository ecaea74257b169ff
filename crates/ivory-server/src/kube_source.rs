//! Policies, Namespaces and registry Secrets from the Kubernetes API (`ivory serve --kube`).
//!
//! Reflectors keep local copies, so admission requests rarely call the API server: only for a
//! Namespace the reflector has not seen yet (read within the request's budget), and to start
//! watching the registry Secrets of a namespace a policy's `credentials` names for the first
//! time. Every policy change recompiles into the [`PolicyStore`]; a policy that no longer
//! compiles keeps its last good version (its error is shown on `/readyz` and counted), while
//! the other policies move on.
//!
//! Credential scope follows Kyverno: a cluster policy reads `name` from ivory's namespace and
//! `namespace/name` from that namespace; a NamespacedImageValidatingPolicy reads Secrets of its
//! own namespace only (its plain names are qualified with it when it is compiled).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use futures::future::{BoxFuture, FutureExt as _};
use futures::{Stream, StreamExt as _};
use ivory_policy::types::Credentials as PolicyCredentials;
use ivory_policy::{CompiledPolicy, PolicyError, load_str};
use ivory_registry::Credentials;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource};
use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::policies::PolicyStore;
use crate::sources::{
    CredentialError, CredentialProblem, CredentialSource, DOCKER_CONFIG_KEY, DOCKER_CONFIG_TYPE,
    NamespaceSource, SecretProblem,
};

/// API group of the policy CRDs.
pub const POLICY_GROUP: &str = "policies.kyverno.io";
/// Version ivory watches; the CRDs serve it (conversion strategy None).
pub const POLICY_VERSION: &str = "v1";
/// How long startup waits for each watch's first list before giving up with a clear error
/// (an uninstalled CRD or missing RBAC would otherwise keep ivory unready without a word).
pub(crate) const SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The running reflectors; cheap to clone.
#[derive(Clone)]
pub struct KubeSource {
    /// `None` only in unit tests: then nothing is read beyond the stores.
    client: Option<Client>,
    namespaces: Store<Namespace>,
    /// Registry Secrets per namespace: ivory's own from the start, others once a policy's
    /// `credentials` names them.
    secrets: Arc<RwLock<BTreeMap<String, Store<Secret>>>>,
    /// Namespace of ivory itself: where a cluster policy's plain `credentials.secrets` live.
    own_namespace: String,
}

impl KubeSource {
    /// Starts the reflectors, waits for their first lists, publishes the first policy set into
    /// `store` and keeps it current in a background task.
    pub async fn start(
        client: Client,
        own_namespace: String,
        store: Arc<PolicyStore>,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let changed = Arc::new(Notify::new());
        let [cluster, namespaced] = policy_resources();
        let cluster_store = reflect_dynamic(&client, cluster, changed.clone());
        let namespaced_store = reflect_dynamic(&client, namespaced, changed.clone());
        let namespaces = reflect(
            watcher(
                Api::<Namespace>::all(client.clone()),
                watcher::Config::default(),
            ),
            None,
        );
        let secrets = watch_secrets(&client, &own_namespace);
        synced("ImageValidatingPolicy", &cluster_store).await?;
        synced("NamespacedImageValidatingPolicy", &namespaced_store).await?;
        synced("Namespace", &namespaces).await?;
        synced("Secret", &secrets).await?;
        let mut compiler = Compiler::default();
        compiler.publish(&[&cluster_store, &namespaced_store], &store, &metrics);
        tokio::spawn(async move {
            loop {
                // Bursts of events coalesce into one permit.
                changed.notified().await;
                let (a, b) = (cluster_store.clone(), namespaced_store.clone());
                let (s, m) = (store.clone(), metrics.clone());
                // CEL compilation is blocking work; the compiler travels with it.
                let task = tokio::task::spawn_blocking(move || {
                    compiler.publish(&[&a, &b], &s, &m);
                    compiler
                });
                match task.await {
                    Ok(back) => compiler = back,
                    Err(e) => {
                        tracing::error!(error = %e, "policy compilation panicked; policy updates stop");
                        return;
                    }
                }
            }
        });
        let secrets = BTreeMap::from([(own_namespace.clone(), secrets)]);
        Ok(Self {
            client: Some(client),
            namespaces,
            secrets: Arc::new(RwLock::new(secrets)),
            own_namespace,
        })
    }

    /// The API client (`None` only in unit tests).
    pub fn client(&self) -> Option<Client> {
        self.client.clone()
    }

    /// Also watches PolicyExceptions (in `namespace` only, when given) into `store`.
    pub async fn watch_exceptions(
        &self,
        namespace: Option<&str>,
        store: Arc<PolicyStore>,
        metrics: Arc<Metrics>,
    ) -> Result<()> {
        match &self.client {
            Some(client) => exceptions::watch(client.clone(), namespace, store, metrics).await,
            None => Ok(()),
        }
    }

    /// The Namespace seam for [`crate::AppState::namespaces`].
    pub fn namespace_source(&self) -> Arc<dyn NamespaceSource> {
        Arc::new(Namespaces {
            store: self.namespaces.clone(),
            client: self.client.clone(),
        })
    }

    /// The Secret seam for [`crate::AppState::credentials`].
    pub fn credential_source(&self) -> Arc<dyn CredentialSource> {
        Arc::new(self.clone())
    }

    /// Registry credentials for a policy's `credentials`: its `secrets` read from the Secret
    /// reflectors (`name` in ivory's namespace, `namespace/name` in that namespace). The
    /// webhook's pipeline checks them with `CredentialSource::prepare` before the stage runs,
    /// so for an admission a Secret missing here vanished in between (a background scan reads
    /// with what admissions prepared): it is logged and skipped.
    pub fn credentials(&self, policy: Option<&PolicyCredentials>) -> Credentials {
        let mut creds = Credentials::anonymous().allow_insecure(
            policy
                .and_then(|c| c.allow_insecure_registry)
                .unwrap_or(false),
        );
        for reference in policy.map_or(&[][..], |c| c.secrets.as_slice()) {
            let (namespace, name) = self.locate(None, reference);
            let bytes = self
                .secret_store(namespace)
                .and_then(|store| store.get(&ObjectRef::new(name).within(namespace)))
                .and_then(|s| docker_config(&s));
            let Some(bytes) = bytes else {
                tracing::warn!(secret = %reference, "credentials secret not found or without {DOCKER_CONFIG_KEY}; skipped");
                continue;
            };
            creds = match creds.clone().with_docker_config_json(reference, &bytes) {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(secret = %reference, error = %e, "unreadable credentials secret; skipped");
                    creds
                }
            };
        }
        creds
    }

    /// `(namespace, name)` of a `credentials.secrets` entry: plain names live in the policy's
    /// namespace (ivory's own for a cluster policy).
    fn locate<'r>(
        &'r self,
        policy_namespace: Option<&'r str>,
        reference: &'r str,
    ) -> (&'r str, &'r str) {
        reference
            .split_once('/')
            .unwrap_or((policy_namespace.unwrap_or(&self.own_namespace), reference))
    }

    fn secret_store(&self, namespace: &str) -> Option<Store<Secret>> {
        let watches = self.secrets.read().unwrap_or_else(|e| e.into_inner());
        watches.get(namespace).cloned()
    }

    /// The Secret reflector of `namespace`, started on first use, once its first list is in.
    async fn synced_secrets(
        &self,
        namespace: &str,
        deadline: Instant,
    ) -> Result<Store<Secret>, SecretProblem> {
        let store = match (self.secret_store(namespace), &self.client) {
            (Some(store), _) => store,
            (None, Some(client)) => {
                let mut watches = self.secrets.write().unwrap_or_else(|e| e.into_inner());
                watches
                    .entry(namespace.to_owned())
                    .or_insert_with(|| {
                        tracing::info!(namespace, "watching registry secrets");
                        watch_secrets(client, namespace)
                    })
                    .clone()
            }
            (None, None) => {
                return Err(SecretProblem::NotWatched {
                    namespace: namespace.to_owned(),
                });
            }
        };
        match tokio::time::timeout_at(deadline, store.wait_until_ready()).await {
            Ok(Ok(())) => Ok(store),
            _ => Err(SecretProblem::NotListed {
                namespace: namespace.to_owned(),
            }),
        }
    }

    /// Checks one `credentials.secrets[index]` entry (see [`CredentialSource::prepare`]).
    async fn prepare_secret(
        &self,
        policy_namespace: Option<&str>,
        index: usize,
        reference: &str,
        deadline: Instant,
    ) -> Result<(), CredentialError> {
        let fail = |problem| CredentialError {
            index,
            reference: reference.to_owned(),
            problem,
        };
        let (namespace, name) = self.locate(policy_namespace, reference);
        if let Some(own) = policy_namespace
            && namespace != own
        {
            return Err(fail(SecretProblem::OtherNamespace {
                own: own.to_owned(),
            }));
        }
        let store = self
            .synced_secrets(namespace, deadline)
            .await
            .map_err(fail)?;
        let Some(secret) = store.get(&ObjectRef::new(name).within(namespace)) else {
            return Err(fail(SecretProblem::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                namespaced_policy: policy_namespace.is_some(),
            }));
        };
        let Some(bytes) = docker_config(&secret) else {
            return Err(fail(SecretProblem::NoDockerConfig {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }));
        };
        Credentials::anonymous()
            .with_docker_config_json(reference, &bytes)
            .map(|_| ())
            .map_err(|source| {
                fail(SecretProblem::Invalid {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    source,
                })
            })
    }
}

impl CredentialSource for KubeSource {
    fn prepare<'a>(
        &'a self,
        policy_namespace: Option<&'a str>,
        credentials: &'a PolicyCredentials,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<(), CredentialProblem>> {
        async move {
            for (index, reference) in credentials.secrets.iter().enumerate() {
                self.prepare_secret(policy_namespace, index, reference, deadline)
                    .await?;
            }
            Ok(())
        }
        .boxed()
    }
}

/// A reflector of the registry Secrets of one namespace.
fn watch_secrets(client: &Client, namespace: &str) -> Store<Secret> {
    reflect(
        watcher(
            Api::<Secret>::namespaced(client.clone(), namespace),
            watcher::Config::default().fields(&format!("type={DOCKER_CONFIG_TYPE}")),
        ),
        None,
    )
}

/// Waits for a reflector's first complete list, at most [`SYNC_TIMEOUT`].
async fn synced<K>(what: &'static str, store: &Store<K>) -> Result<()>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    match tokio::time::timeout(SYNC_TIMEOUT, store.wait_until_ready()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Error::NotSynced { what }),
        Err(_) => Err(Error::SyncTimeout {
            what,
            waited: SYNC_TIMEOUT,
        }),
    }
}

fn docker_config(secret: &Secret) -> Option<Vec<u8>> {
    let data = secret.data.as_ref()?.get(DOCKER_CONFIG_KEY)?;
    Some(data.0.clone())
}

/// Namespaces from the reflector, or, for one it has not seen yet (created a moment ago),
/// read from the API server.
struct Namespaces {
    store: Store<Namespace>,
    client: Option<Client>,
}

impl NamespaceSource for Namespaces {
    fn namespace<'a>(&'a self, name: &'a str, deadline: Instant) -> BoxFuture<'a, Option<Value>> {
        async move {
            if let Some(ns) = self.store.get(&ObjectRef::new(name)) {
                return namespace_value(&ns);
            }
            let api = Api::<Namespace>::all(self.client.clone()?);
            match tokio::time::timeout_at(deadline, api.get_opt(name)).await {
                Ok(Ok(Some(ns))) => {
                    tracing::info!(
                        namespace = name,
                        "namespace not seen by the watch yet; read from the API"
                    );
                    namespace_value(&ns)
                }
                Ok(Ok(None)) => {
                    tracing::warn!(namespace = name, "namespace not found in the API");
                    None
                }
                Ok(Err(e)) => {
                    tracing::warn!(namespace = name, error = %e, "reading the namespace failed");
                    None
                }
                Err(_) => {
                    tracing::warn!(namespace = name, "reading the namespace timed out");
                    None
                }
            }
        }
        .boxed()
    }
}

/// A Namespace as `namespaceObject`: with apiVersion and kind, without managedFields.
fn namespace_value(ns: &Namespace) -> Option<Value> {
    let mut value = serde_json::to_value(ns).ok()?;
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    if let Some(obj) = value.as_object_mut() {
        obj.insert("apiVersion".to_owned(), Value::from("v1"));
        obj.insert("kind".to_owned(), Value::from("Namespace"));
    }
    Some(value)
}

/// The two policy kinds ivory watches, at [`POLICY_VERSION`].
pub fn policy_resources() -> [ApiResource; 2] {
    [
        policy_resource("ImageValidatingPolicy", "imagevalidatingpolicies"),
        policy_resource(
            "NamespacedImageValidatingPolicy",
            "namespacedimagevalidatingpolicies",
        ),
    ]
}

/// Compiles one policy object exactly as `ivory serve --kube` does (for `ivory doctor`).
pub fn compile_policy_object(
    object: &DynamicObject,
) -> std::result::Result<CompiledPolicy, Vec<PolicyError>> {
    compile_object(object, &key_of(object))
}

fn policy_resource(kind: &str, plural: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk(POLICY_GROUP, POLICY_VERSION, kind);
    ApiResource::from_gvk_with_plural(&gvk, plural)
}

fn reflect_dynamic(
    client: &Client,
    resource: ApiResource,
    changed: Arc<Notify>,
) -> Store<DynamicObject> {
    let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
    let writer = reflector::store::Writer::new(resource);
    let reader = writer.as_reader();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    spawn_drain(stream, Some(changed));
    reader
}

fn reflect<K>(
    stream: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    changed: Option<Arc<Notify>>,
) -> Store<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    spawn_drain(stream.default_backoff().reflect(writer), changed);
    reader
}

/// Drives a reflector stream; `changed` is notified once a list completes and on every change.
fn spawn_drain<K: Send + 'static>(
    stream: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    changed: Option<Arc<Notify>>,
) {
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
                ) => {
                    if let Some(n) = &changed {
                        n.notify_one();
                    }
                }
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Err(e) => tracing::warn!(error = %e, "Kubernetes watch failed; retrying"),
            }
        }
    });
}

/// Identifies one policy object: kind, namespace (empty when cluster-scoped) and name.
type Key = (String, String, String);

/// Compiles policy objects, remembering each one's last good version.
#[derive(Default)]
struct Compiler {
    /// Outcome per object, keyed with its resourceVersion so unchanged objects are not recompiled.
    seen: BTreeMap<Key, (String, std::result::Result<(), Vec<PolicyError>>)>,
    good: BTreeMap<Key, Arc<CompiledPolicy>>,
}

impl Compiler {
    fn publish(
        &mut self,
        stores: &[&Store<DynamicObject>],
        store: &PolicyStore,
        metrics: &Metrics,
    ) {
        let objects: Vec<Arc<DynamicObject>> = stores.iter().flat_map(|s| s.state()).collect();
        let mut present = BTreeMap::new();
        for object in &objects {
            let key = key_of(object);
            let version = object.metadata.resource_version.clone().unwrap_or_default();
            present.insert(key.clone(), ());
            if self.seen.get(&key).is_some_and(|(v, _)| *v == version) {
                continue;
            }
            let outcome = match compile_object(object, &key) {
                Ok(policy) => {
                    tracing::info!(kind = %key.0, namespace = %key.1, name = %key.2, "policy compiled");
                    for warning in ivory_policy::blind_spots(&policy) {
                        tracing::warn!(kind = %key.0, namespace = %key.1, name = %key.2, warning = %warning, "policy blind spot");
                    }
                    self.good.insert(key.clone(), Arc::new(policy));
                    Ok(())
                }
                Err(errors) => {
                    for e in &errors {
                        tracing::error!(kind = %key.0, namespace = %key.1, name = %key.2, error = %e, "policy does not compile; keeping its last good version");
                    }
                    metrics.policy_load_failed(errors.len());
                    Err(errors)
                }
            };
            self.seen.insert(key, (version, outcome));
        }
        self.seen.retain(|k, _| present.contains_key(k));
        self.good.retain(|k, _| present.contains_key(k));
        let errors: Vec<String> = self
            .seen
            .values()
            .filter_map(|(_, outcome)| outcome.as_ref().err())
            .flatten()
            .map(ToString::to_string)
            .collect();
        let policies: Vec<Arc<CompiledPolicy>> = self.good.values().cloned().collect();
        tracing::info!(
            policies = policies.len(),
            errors = errors.len(),
            "policies from Kubernetes published"
        );
        // The errors of every object still failing, not only of this round's: a policy that
        // does not compile stays an error until it is fixed or deleted.
        metrics.policies_published(policies.len(), errors.len());
        store.publish(policies, errors);
    }
}

fn key_of(object: &DynamicObject) -> Key {
    let kind = object
        .types
        .as_ref()
        .map(|t| t.kind.clone())
        .unwrap_or_default();
    (
        kind,
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default(),
    )
}

/// Compiles one object through the same loader as policy files; `origin` reads
/// `ImageValidatingPolicy/name` or `NamespacedImageValidatingPolicy/namespace/name`.
fn compile_object(
    object: &DynamicObject,
    key: &Key,
) -> std::result::Result<CompiledPolicy, Vec<PolicyError>> {
    let origin = if key.1.is_empty() {
        format!("{}/{}", key.0, key.2)
    } else {
        format!("{}/{}/{}", key.0, key.1, key.2)
    };
    let mut value = serde_json::to_value(object)
        .map_err(|e| vec![PolicyError::new(origin.as_str(), "", e.to_string())])?;
    if let Some(obj) = value.as_object_mut() {
        obj.remove("status");
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    }
    if !key.1.is_empty() {
        qualify_secrets(&mut value, &key.1);
    }
    let report = load_str(&value.to_string(), &origin);
    if !report.errors.is_empty() {
        return Err(report.errors);
    }
    let mut policies = report.policies.into_iter();
    match (policies.next(), policies.next()) {
        (Some(policy), None) => Ok(policy),
        _ => Err(vec![PolicyError::new(
            origin,
            "",
            "expected exactly one policy",
        )]),
    }
}

/// Writes a namespaced policy's plain `credentials.secrets` names as `<namespace>/<name>`: the
/// credentials resolver sees only the names, and a namespaced policy's Secrets live in its
/// own namespace, never in ivory's.
fn qualify_secrets(policy: &mut Value, namespace: &str) {
    let secrets = policy
        .pointer_mut("/spec/credentials/secrets")
        .and_then(Value::as_array_mut);
    for secret in secrets.into_iter().flatten() {
        if let Some(name) = secret.as_str()
            && !name.contains('/')
        {
            *secret = Value::from(format!("{namespace}/{name}"));
        }
    }
}

pub mod exceptions;

#[cfg(test)]
mod tests;
