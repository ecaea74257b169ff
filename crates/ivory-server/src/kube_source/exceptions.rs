//! PolicyExceptions from the Kubernetes API (`serve --kube --enable-policy-exceptions`): one
//! reflector (all namespaces, or only the exception namespace), recompiled into the
//! [`PolicyStore`] on every change. An exception that does not compile is left out (it exempts
//! nothing: fail closed) and its error is logged and counted.

use std::sync::Arc;

use ivory_policy::compiled::Origin;
use ivory_policy::exception::{EXCEPTION_KIND, compile_exception};
use ivory_policy::{CompiledException, PolicyError};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::Value;
use tokio::sync::Notify;

use super::{POLICY_GROUP, spawn_drain, synced};
use crate::Result;
use crate::metrics::Metrics;
use crate::policies::PolicyStore;

/// Version of PolicyException ivory watches (Kyverno 1.19 serves v1alpha1, v1beta1 and v1).
pub const EXCEPTION_VERSION: &str = "v1";
/// Plural resource name of PolicyException.
pub const EXCEPTION_PLURAL: &str = "policyexceptions";

/// The PolicyException resource ivory watches.
pub fn exception_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk(POLICY_GROUP, EXCEPTION_VERSION, EXCEPTION_KIND);
    ApiResource::from_gvk_with_plural(&gvk, EXCEPTION_PLURAL)
}

/// Starts the reflector (in `namespace` only when given), waits for its first list, publishes
/// the exceptions and keeps them current in a background task.
pub async fn watch(
    client: Client,
    namespace: Option<&str>,
    store: Arc<PolicyStore>,
    metrics: Arc<Metrics>,
) -> Result<()> {
    let resource = exception_resource();
    let api = match namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client, ns, &resource),
        None => Api::<DynamicObject>::all_with(client, &resource),
    };
    let writer = reflector::store::Writer::new(resource);
    let reader = writer.as_reader();
    let changed = Arc::new(Notify::new());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    spawn_drain(stream, Some(changed.clone()));
    synced("PolicyException", &reader).await?;
    publish(&reader, &store, &metrics);
    tokio::spawn(async move {
        loop {
            changed.notified().await;
            publish(&reader, &store, &metrics);
        }
    });
    Ok(())
}

fn publish(reader: &Store<DynamicObject>, store: &PolicyStore, metrics: &Metrics) {
    let mut exceptions = Vec::new();
    let mut all_errors = Vec::new();
    for object in reader.state() {
        match compile_object(&object) {
            Ok(exception) => exceptions.push(Arc::new(exception)),
            Err(errors) => {
                for e in &errors {
                    tracing::error!(error = %e, "PolicyException does not compile; it exempts nothing");
                }
                metrics.policy_load_failed(errors.len());
                all_errors.extend(errors.iter().map(ToString::to_string));
            }
        }
    }
    tracing::info!(
        exceptions = exceptions.len(),
        errors = all_errors.len(),
        "policy exceptions from Kubernetes published"
    );
    store.publish_exceptions(exceptions, all_errors);
}

/// Compiles one watched object exactly as an exception file.
pub fn compile_object(
    object: &DynamicObject,
) -> std::result::Result<CompiledException, Vec<PolicyError>> {
    let mut value =
        serde_json::to_value(object).map_err(|e| vec![PolicyError::new("", "", e.to_string())])?;
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    if let Some(obj) = value.as_object_mut() {
        obj.remove("status");
    }
    compile_exception(value, &Origin::default())
}
