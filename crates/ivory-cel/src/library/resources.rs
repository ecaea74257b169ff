//! Kyverno's `resource` and `globalContext` libraries: reads of cluster objects, answered by
//! the host (ivory-cel does no IO). A cluster policy's calls name the namespace
//! (`resource.Get(apiVersion, resource, namespace, name)`), a namespaced policy's do not
//! (`resource.Get(apiVersion, resource, name)`: its own namespace); the policy compiler checks
//! which form a policy may use, the functions accept both.

use cel::common::value::CowVal;
use cel::{ExecutionError, FunctionContext, Value};

use super::{Registry, call_values, no_overload};
use crate::activation::{HostOp, call_host, resource_query};

/// The names Kyverno declares for each operation (PascalCase, and camelCase since 1.18).
pub const RESOURCE_GET: [&str; 2] = ["resource.Get", "resource.get"];
/// `resource.List` / `resource.list`.
pub const RESOURCE_LIST: [&str; 2] = ["resource.List", "resource.list"];
/// `globalContext.Get` / `globalContext.get`.
pub const GLOBAL_CONTEXT_GET: [&str; 2] = ["globalContext.Get", "globalContext.get"];

pub(super) fn register(r: &mut Registry) {
    for name in RESOURCE_GET {
        r.add_raw(name, host_fn(name, HostOp::ResourceGet));
    }
    for name in RESOURCE_LIST {
        r.add_raw(name, host_fn(name, HostOp::ResourceList));
    }
    for name in GLOBAL_CONTEXT_GET {
        r.add_raw(name, host_fn(name, HostOp::GlobalContext));
    }
}

fn signature_ok(op: HostOp, args: &[Value]) -> bool {
    match op {
        HostOp::GlobalContext => matches!(
            args,
            [Value::String(_)] | [Value::String(_), Value::String(_)]
        ),
        _ => resource_query(op, args).is_some(),
    }
}

fn host_fn(name: &'static str, op: HostOp) -> super::Func {
    Box::new(move |ftx: &mut FunctionContext<'_, '_>| {
        if ftx.this.is_some() {
            return Err(ExecutionError::not_supported_as_method(name, Value::Null));
        }
        let args = call_values(ftx)?;
        if !signature_ok(op, &args) {
            return Err(no_overload(name, &args, false));
        }
        let value = call_host(ftx, op, args)?;
        value.try_into().map(CowVal::Owned)
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::{Value as Json, json};

    use crate::{Activation, Host, HostError, NoHost, ResourceQuery, Scope, compile};

    /// An in-memory cluster: one ConfigMap in `team-a`, and a GlobalContextEntry `gce`.
    #[derive(Default)]
    struct Cluster {
        queries: Mutex<Vec<ResourceQuery>>,
    }

    fn config_map() -> Json {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "keys", "namespace": "team-a", "labels": {"app": "x"}},
               "data": {"allowed": "ghcr.io/acme"}})
    }

    impl Host for Cluster {
        fn verify_image_signatures(&self, _: &str, _: &[Json]) -> Result<i64, HostError> {
            Err(HostError::NotAvailable)
        }
        fn verify_attestation_signatures(
            &self,
            _: &str,
            _: &str,
            _: &[Json],
        ) -> Result<i64, HostError> {
            Err(HostError::NotAvailable)
        }
        fn extract_payload(&self, _: &str, _: &str) -> Result<Json, HostError> {
            Err(HostError::NotAvailable)
        }
        fn image_data(&self, _: &str) -> Result<Json, HostError> {
            Err(HostError::NotAvailable)
        }
        fn resource_get(&self, q: &ResourceQuery) -> Result<Option<Json>, HostError> {
            self.queries.lock().unwrap().push(q.clone());
            if q.resource == "leases" {
                return Err(HostError::Registry(
                    "the leases watch is not synced yet".into(),
                ));
            }
            let ns = q.namespace.clone().unwrap_or_else(|| "team-a".into());
            Ok((q.api_version == "v1"
                && q.resource == "configmaps"
                && ns == "team-a"
                && q.name.as_deref() == Some("keys"))
            .then(config_map))
        }
        fn resource_list(&self, q: &ResourceQuery) -> Result<Json, HostError> {
            self.queries.lock().unwrap().push(q.clone());
            let items: Vec<Json> = [config_map()]
                .into_iter()
                .filter(|o| {
                    q.labels
                        .iter()
                        .all(|(k, v)| o["metadata"]["labels"][k] == *v)
                })
                .collect();
            Ok(json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {}, "items": items}))
        }
        fn global_context(&self, entry: &str, projection: &str) -> Result<Json, HostError> {
            Ok(match (entry, projection) {
                ("gce", "") => json!([config_map()]),
                _ => Json::Null,
            })
        }
    }

    fn run(host: &dyn Host, src: &str) -> Result<Json, crate::EvalError> {
        let program = compile(src, &Scope::new(["object"])).expect("compiles");
        let act = Activation::new(host);
        program.evaluate_json(&act)
    }

    #[test]
    fn get_answers_the_object_and_null_when_missing() {
        let host = Cluster::default();
        let got = run(
            &host,
            "resource.Get('v1', 'configmaps', 'team-a', 'keys').data.allowed",
        );
        assert_eq!(got.unwrap(), json!("ghcr.io/acme"));
        let camel = run(
            &host,
            "resource.get('v1', 'configmaps', 'team-a', 'nope') == null",
        );
        assert_eq!(camel.unwrap(), json!(true));
        let namespaced = run(
            &host,
            "resource.get('v1', 'configmaps', 'keys').data.allowed",
        );
        assert_eq!(namespaced.unwrap(), json!("ghcr.io/acme"));
        let queries = host.queries.lock().unwrap();
        assert_eq!(queries[0].namespace.as_deref(), Some("team-a"));
        assert_eq!(
            queries[2].namespace, None,
            "the namespaced form names no namespace"
        );
    }

    #[test]
    fn list_answers_a_list_object_filtered_by_labels() {
        let host = Cluster::default();
        let all = run(
            &host,
            "resource.List('v1', 'configmaps', '').items.map(o, o.metadata.name)",
        );
        assert_eq!(all.unwrap(), json!(["keys"]));
        let none = run(
            &host,
            "size(resource.list('v1', 'configmaps', 'team-a', {'app': 'y'}).items)",
        );
        assert_eq!(none.unwrap(), json!(0));
        let kind = run(
            &host,
            "resource.list('v1', 'configmaps', {'app': 'x'}).kind",
        );
        assert_eq!(kind.unwrap(), json!("ConfigMapList"));
        let queries = host.queries.lock().unwrap();
        assert_eq!(queries[1].labels.get("app").map(String::as_str), Some("y"));
    }

    #[test]
    fn unavailable_data_is_an_error_never_an_empty_answer() {
        let host = Cluster::default();
        let err = run(
            &host,
            "resource.Get('coordination.k8s.io/v1', 'leases', 'a', 'b') == null",
        )
        .unwrap_err();
        assert!(err.to_string().contains("not synced"), "{err}");
        let none = run(&NoHost, "resource.Get('v1', 'configmaps', 'a', 'b')").unwrap_err();
        assert!(none.to_string().contains("not available"), "{none}");
    }

    #[test]
    fn wrong_argument_types_find_no_overload() {
        let host = Cluster::default();
        let err = run(&host, "resource.Get('v1', 'configmaps', 1, 'keys')").unwrap_err();
        assert!(err.to_string().contains("resource.Get"), "{err}");
        assert!(host.queries.lock().unwrap().is_empty());
    }

    #[test]
    fn global_context_answers_the_entry_or_null() {
        let host = Cluster::default();
        let got = run(&host, "globalContext.Get('gce', '')[0].metadata.name");
        assert_eq!(got.unwrap(), json!("keys"));
        let one_arg = run(&host, "size(globalContext.get('gce'))");
        assert_eq!(one_arg.unwrap(), json!(1));
        let missing = run(&host, "globalContext.Get('other', '') == null");
        assert_eq!(missing.unwrap(), json!(true));
    }

    #[test]
    fn calls_are_recorded_with_their_literal_arguments() {
        let program = compile(
            "resource.Get('v1', 'configmaps', object.metadata.namespace, 'keys') != null",
            &Scope::new(["object"]),
        )
        .expect("compiles");
        let calls: Vec<_> = program.namespaced_calls("resource.Get").collect();
        assert_eq!(
            calls,
            [[
                Some("v1".to_owned()),
                Some("configmaps".to_owned()),
                None,
                Some("keys".to_owned())
            ]]
        );
    }
}
