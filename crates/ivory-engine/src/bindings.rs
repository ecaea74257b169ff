//! The CEL bindings of one admission request (`object`, `oldObject`, `request`,
//! `namespaceObject`), built once per request and shared by every policy's activations.
//!
//! Each is converted to CEL only when an expression first reads it: a typical image policy
//! reads only `images`, and converting a Pod (twice more inside `request`) for every policy
//! and stage was most of a warm admission's CPU time.

use std::sync::Arc;

use ivory_cel::{Activation, CostBudget, LazyJson};
use serde_json::Value;
use tokio::time::Instant;

use crate::admission::{AdmissionRequest, AdmittedObject};

static NULL: Value = Value::Null;

pub(crate) struct RequestBindings<'r> {
    object: LazyJson<'r>,
    old_object: LazyJson<'r>,
    request: LazyJson<'r>,
    namespace_object: LazyJson<'r>,
    /// No evaluation against these bindings runs past it.
    deadline: Option<Instant>,
}

impl<'r> RequestBindings<'r> {
    /// `object` is what the stage calls the object: the request's `object` for
    /// matchConditions, the subject (`oldObject` on DELETE) for validations.
    pub(crate) fn new(
        req: &'r AdmissionRequest,
        object: Option<&'r AdmittedObject>,
        namespace_object: Option<&'r Value>,
    ) -> Self {
        Self {
            object: admitted(object),
            old_object: admitted(req.old_object.as_ref()),
            request: LazyJson::built(move || req.to_json()),
            namespace_object: LazyJson::borrowed(namespace_object.unwrap_or(&NULL)),
            deadline: None,
        }
    }

    /// Stops every evaluation against these bindings at the request's `deadline`.
    pub(crate) fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Binds all four, or only `object` for a JSON-mode policy (its payload is not a resource),
    /// and gives the activation (one per policy) its own cost budget, ending at the deadline.
    pub(crate) fn bind<'a>(&'a self, act: &mut Activation<'a>, json_mode: bool) {
        act.set_budget(Arc::new(CostBudget::for_policy(self.deadline)));
        act.bind_lazy("object", &self.object);
        if !json_mode {
            act.bind_lazy("oldObject", &self.old_object);
            act.bind_lazy("request", &self.request);
            act.bind_lazy("namespaceObject", &self.namespace_object);
        }
    }

    /// Whether any expression read the `request` binding (tests: laziness).
    #[cfg(test)]
    pub(crate) fn request_converted(&self) -> bool {
        self.request.is_converted()
    }
}

/// An admitted object for CEL: its tree is built only if an expression reads it.
fn admitted(object: Option<&AdmittedObject>) -> LazyJson<'_> {
    match object {
        Some(object) => LazyJson::deferred(object),
        None => LazyJson::borrowed(&NULL),
    }
}

impl std::fmt::Debug for RequestBindings<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBindings")
            .field("object", &self.object)
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::AdmissionReview;
    use ivory_cel::{NoHost, Scope, compile};

    fn pod_create() -> AdmissionRequest {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/admission/pod-create.json"
        );
        let bytes = std::fs::read(path).unwrap();
        AdmissionReview::parse(&bytes).unwrap().request
    }

    #[test]
    fn request_is_built_only_when_read_and_then_shared() {
        let req = pod_create();
        let bindings = RequestBindings::new(&req, req.object.as_ref(), None);
        let scope = Scope::new(["object", "oldObject", "request", "namespaceObject"]);
        let eval = |source: &str| {
            let mut act = Activation::new(&NoHost);
            bindings.bind(&mut act, false);
            compile(source, &scope)
                .unwrap()
                .evaluate_bool(&act)
                .unwrap()
        };
        assert!(eval("object.kind == 'Pod'"));
        assert!(!bindings.request_converted());
        assert!(eval("request.operation == 'CREATE' && oldObject == null"));
        assert!(bindings.request_converted());
        // A second activation reads the converted value, with the same answer.
        assert!(eval("request.kind.kind == 'Pod'"));
    }
}
