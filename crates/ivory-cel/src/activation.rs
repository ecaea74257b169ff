//! Per-evaluation bindings and the bridge from CEL functions to the engine's [`Host`].

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use cel::common::types::Type;
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{ExecutionError, IdedExpr, Value};

use crate::convert::{json_to_val, json_to_value, string_lists_to_val, value_to_json};
use crate::{CostBudget, EvalError, HostError};

/// Implemented by the engine: answers the Kyverno verification / image-data functions.
/// An error becomes the CEL runtime error of the call, worded by its text.
pub trait Host: Send + Sync {
    /// `verifyImageSignatures(img, attestors)`: how many of `attestors` verified the image.
    fn verify_image_signatures(
        &self,
        image: &str,
        attestors: &[serde_json::Value],
    ) -> Result<i64, HostError>;
    /// `verifyAttestationSignatures(img, attestation, attestors)`: how many of `attestors`
    /// verified the named attestation of the image.
    fn verify_attestation_signatures(
        &self,
        image: &str,
        attestation: &str,
        attestors: &[serde_json::Value],
    ) -> Result<i64, HostError>;
    /// `extractPayload(img, attestation)`: the payload of the image's named attestation.
    fn extract_payload(
        &self,
        image: &str,
        attestation: &str,
    ) -> Result<serde_json::Value, HostError>;
    /// `getImageData(img)`, `image.GetMetadata(img)`, `image.getMetadata(img)`.
    fn image_data(&self, image: &str) -> Result<serde_json::Value, HostError>;

    /// `resource.Get`/`resource.get`: the object, or `None` when it does not exist (Kyverno
    /// answers `null` for a missing object). Hosts without cluster resources refuse.
    fn resource_get(&self, _query: &ResourceQuery) -> Result<Option<serde_json::Value>, HostError> {
        Err(HostError::NotAvailable)
    }

    /// `resource.List`/`resource.list`: a list object (`apiVersion`, `kind`, `metadata`,
    /// `items`), as Kyverno's dynamic client returns it.
    fn resource_list(&self, _query: &ResourceQuery) -> Result<serde_json::Value, HostError> {
        Err(HostError::NotAvailable)
    }

    /// `globalContext.Get`/`globalContext.get(entry, projection)`: the entry's data (`null`
    /// for an entry that does not exist, as Kyverno answers).
    fn global_context(
        &self,
        _entry: &str,
        _projection: &str,
    ) -> Result<serde_json::Value, HostError> {
        Err(HostError::NotAvailable)
    }

    /// `time.now()`: the wall clock (a test's host answers the time it wants).
    fn wall_time(&self) -> std::time::SystemTime {
        ivory_clock::wall()
    }
}

/// The arguments of one `resource.Get` / `resource.List` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceQuery {
    /// `apiVersion` as written: `v1`, `apps/v1`.
    pub api_version: String,
    /// The resource's plural name (`configmaps`).
    pub resource: String,
    /// The namespace argument of a cluster policy's call (`""`: cluster-scoped, or every
    /// namespace for a list); `None` for the namespaced form, which reads the policy's own.
    pub namespace: Option<String>,
    /// The object's name (`Get` only).
    pub name: Option<String>,
    /// Label selector of `List(..., labels)`: every pair must match.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// The query of a `resource.Get`/`resource.List` call, `None` when the arguments fit no
/// overload.
pub(crate) fn resource_query(op: HostOp, args: &[Value]) -> Option<ResourceQuery> {
    use Value::{Map, String as S};
    let query = |v: &str, r: &str, ns: Option<&str>, name: Option<&str>, labels| ResourceQuery {
        api_version: v.to_owned(),
        resource: r.to_owned(),
        namespace: ns.map(str::to_owned),
        name: name.map(str::to_owned),
        labels,
    };
    match (op, args) {
        (HostOp::ResourceGet, [S(v), S(r), S(ns), S(n)]) => {
            Some(query(v, r, Some(ns), Some(n), BTreeMap::new()))
        }
        (HostOp::ResourceGet, [S(v), S(r), S(n)]) => {
            Some(query(v, r, None, Some(n), BTreeMap::new()))
        }
        (HostOp::ResourceList, [S(v), S(r), S(ns)]) => {
            Some(query(v, r, Some(ns), None, BTreeMap::new()))
        }
        (HostOp::ResourceList, [S(v), S(r), S(ns), Map(l)]) => {
            Some(query(v, r, Some(ns), None, query_labels(l)?))
        }
        (HostOp::ResourceList, [S(v), S(r)]) => Some(query(v, r, None, None, BTreeMap::new())),
        (HostOp::ResourceList, [S(v), S(r), Map(l)]) => {
            Some(query(v, r, None, None, query_labels(l)?))
        }
        _ => None,
    }
}

/// A `map<string, string>` label selector.
fn query_labels(map: &cel::objects::Map) -> Option<BTreeMap<String, String>> {
    map.map
        .iter()
        .map(|(k, v)| match (k, v) {
            (cel::objects::Key::String(k), Value::String(v)) => {
                Some((k.as_str().to_owned(), v.as_str().to_owned()))
            }
            _ => None,
        })
        .collect()
}

/// A host for contexts without registry access: every call errors.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHost;

impl Host for NoHost {
    fn verify_image_signatures(&self, _: &str, _: &[serde_json::Value]) -> Result<i64, HostError> {
        Err(HostError::NotAvailable)
    }
    fn verify_attestation_signatures(
        &self,
        _: &str,
        _: &str,
        _: &[serde_json::Value],
    ) -> Result<i64, HostError> {
        Err(HostError::NotAvailable)
    }
    fn extract_payload(&self, _: &str, _: &str) -> Result<serde_json::Value, HostError> {
        Err(HostError::NotAvailable)
    }
    fn image_data(&self, _: &str) -> Result<serde_json::Value, HostError> {
        Err(HostError::NotAvailable)
    }
}

/// Name under which the host is visible to library functions. `$` cannot appear in a CEL
/// identifier, so expressions cannot reach it.
pub(crate) const HOST_VAR: &str = "$ivory_host";

/// A JSON value converted to CEL on first read, then shared by every activation that binds
/// it. Most expressions never read `object` or `request`, and those that do should pay for one
/// conversion per request, not one per policy and stage.
pub struct LazyJson<'a> {
    source: LazySource<'a>,
    val: OnceLock<Box<dyn Val>>,
}

enum LazySource<'a> {
    Borrowed(&'a serde_json::Value),
    /// Built on first read too (e.g. the whole `request`, which copies the object).
    Built(Box<dyn Fn() -> serde_json::Value + Send + Sync + 'a>),
    /// Borrowed from a JSON tree that itself exists only once asked for (an admitted object
    /// kept as raw JSON).
    Deferred(&'a dyn JsonSource),
}

/// Something that can produce a JSON tree on demand and keep it (an admitted object kept as
/// raw JSON, parsed on first read).
pub trait JsonSource: Send + Sync {
    /// The tree, built on the first call.
    fn json(&self) -> &serde_json::Value;
}

impl<'a> LazyJson<'a> {
    /// A value that already exists as JSON; converted to CEL on its first read.
    pub fn borrowed(value: &'a serde_json::Value) -> Self {
        Self {
            source: LazySource::Borrowed(value),
            val: OnceLock::new(),
        }
    }

    /// A value built by `make` only if an expression reads it.
    pub fn built(make: impl Fn() -> serde_json::Value + Send + Sync + 'a) -> Self {
        Self {
            source: LazySource::Built(Box::new(make)),
            val: OnceLock::new(),
        }
    }

    /// A value borrowed from `source`, whose tree is asked for only if an expression reads it.
    pub fn deferred(source: &'a dyn JsonSource) -> Self {
        Self {
            source: LazySource::Deferred(source),
            val: OnceLock::new(),
        }
    }

    /// Whether the value has been converted (some expression read it).
    pub fn is_converted(&self) -> bool {
        self.val.get().is_some()
    }

    fn val(&self) -> &dyn Val {
        self.val
            .get_or_init(|| match &self.source {
                LazySource::Borrowed(json) => json_to_val(json),
                LazySource::Built(make) => json_to_val(&make()),
                LazySource::Deferred(source) => json_to_val(source.json()),
            })
            .as_ref()
    }
}

impl std::fmt::Debug for LazyJson<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyJson")
            .field("converted", &self.is_converted())
            .finish()
    }
}

/// A JSON value converted once to the interpreter's representation and bound by reference
/// into any number of activations: what does not change between requests (a policy's static
/// attestors and attestations) is converted once per policy version, not once per request.
pub struct ConvertedJson(Box<dyn Val>);

impl ConvertedJson {
    /// `value`, converted.
    pub fn new(value: &serde_json::Value) -> Self {
        Self(json_to_val(value))
    }
}

impl std::fmt::Debug for ConvertedJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ConvertedJson").field(&self.0).finish()
    }
}

/// A bound variable: owned by the activation, or shared with others through a [`LazyJson`]
/// or a [`ConvertedJson`].
enum Bound<'a> {
    Owned(Box<dyn Val>),
    Lazy(&'a LazyJson<'a>),
    Converted(Arc<ConvertedJson>),
}

/// Per-evaluation bindings, and the cost budget evaluations against them are charged to.
pub struct Activation<'a> {
    host: &'a dyn Host,
    vars: Vec<(String, Bound<'a>)>,
    budget: Option<Arc<CostBudget>>,
}

impl<'a> Activation<'a> {
    /// Bindings with no variables yet, answering Kyverno's functions through `host`.
    pub fn new(host: &'a dyn Host) -> Self {
        Self {
            host,
            vars: Vec::new(),
            budget: None,
        }
    }

    /// Charges every evaluation against this activation to `budget` (and stops it at the
    /// budget's deadline). Without one, each evaluation is bounded by the per-evaluation limit
    /// alone.
    pub fn set_budget(&mut self, budget: Arc<CostBudget>) {
        self.budget = Some(budget);
    }

    /// The budget evaluations are charged to.
    pub fn budget(&self) -> Option<&CostBudget> {
        self.budget.as_deref()
    }

    /// The budget evaluations are charged to, to charge another activation to it as well
    /// (a policy evaluated again must not get a fresh budget).
    pub fn shared_budget(&self) -> Option<Arc<CostBudget>> {
        self.budget.clone()
    }

    /// Binds `name` to a JSON value (converted once, here). Rebinding replaces.
    pub fn bind_json(&mut self, name: &str, value: &serde_json::Value) {
        self.bind_val(name, json_to_val(value));
    }

    /// Binds `name` to a CEL value. Rebinding replaces.
    pub fn bind_value(&mut self, name: &str, value: Value) {
        let val: Box<dyn Val> = match value.try_into() {
            Ok(v) => v,
            // Only function values fail to convert; bind them as null rather than panic.
            Err(_) => Box::new(cel::common::types::CelNull),
        };
        self.bind_val(name, val);
    }

    /// Binds `name` to a map of string lists (the `images` variable), built straight in the
    /// interpreter's representation. Rebinding replaces.
    pub fn bind_string_lists(&mut self, name: &str, map: &BTreeMap<String, Vec<String>>) {
        self.bind_val(name, string_lists_to_val(map));
    }

    /// Binds `name` to a value converted once and shared with other activations.
    pub fn bind_converted(&mut self, name: &str, value: Arc<ConvertedJson>) {
        self.bind(name, Bound::Converted(value));
    }

    /// Binds `name` to a value shared with other activations, converted on first read.
    pub fn bind_lazy(&mut self, name: &str, value: &'a LazyJson<'a>) {
        self.bind(name, Bound::Lazy(value));
    }

    fn bind_val(&mut self, name: &str, val: Box<dyn Val>) {
        self.bind(name, Bound::Owned(val));
    }

    fn bind(&mut self, name: &str, bound: Bound<'a>) {
        match self.vars.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = bound,
            None => self.vars.push((name.to_owned(), bound)),
        }
    }

    /// The same bindings answered by another host (e.g. one that holds prefetched verdicts).
    pub fn with_host<'b>(self, host: &'b dyn Host) -> Activation<'b>
    where
        'a: 'b,
    {
        let mut act: Activation<'b> = self;
        act.host = host;
        act
    }

    /// Whether a variable named `name` is bound.
    pub fn is_bound(&self, name: &str) -> bool {
        self.vars.iter().any(|(n, _)| n == name)
    }
}

impl VariableResolver for Activation<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        if variable == HOST_VAR {
            return Some(CowVal::owned(HostVal(self.host)));
        }
        self.vars
            .iter()
            .find(|(n, _)| n == variable)
            .map(|(_, bound)| match bound {
                Bound::Owned(v) => CowVal::Borrowed(v.as_ref()),
                Bound::Lazy(lazy) => CowVal::Borrowed(lazy.val()),
                Bound::Converted(converted) => CowVal::Borrowed(converted.0.as_ref()),
            })
    }
}

pub(crate) fn evaluate(expr: &IdedExpr, act: &Activation<'_>) -> Result<Value, EvalError> {
    let root = &crate::library::get().context;
    let mut scope = root.new_inner_scope();
    scope.set_variable_resolver(act);
    scope.resolve(expr).map_err(EvalError::from)
}

static HOST_TYPE: Type = Type::new_unspecified_type("ivory.host");

/// The host as a CEL value. Library functions reach it through [`call_host`]; the request
/// travels as an index so that no `'static` downcast of the borrowed host is needed.
#[derive(Clone, Copy)]
struct HostVal<'a>(&'a dyn Host);

impl std::fmt::Debug for HostVal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostVal")
    }
}

impl Val for HostVal<'_> {
    fn get_type(&self) -> &Type {
        &HOST_TYPE
    }

    fn cel_type() -> &'static Type {
        &HOST_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn cel::common::traits::Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(*self)
    }
}

impl cel::common::traits::Indexer for HostVal<'_> {
    fn get<'b, 'v>(&'b self, _idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let call = HOST_CALL.with(|slot| slot.borrow_mut().take());
        let (op, args) =
            call.ok_or_else(|| ExecutionError::function_error("host", "malformed host request"))?;
        let result = dispatch(self.0, op, &args)?;
        let val: Box<dyn Val> = result.try_into()?;
        Ok(CowVal::Owned(val))
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

thread_local! {
    /// The pending host call of this thread's evaluation (see [`call_host`]).
    static HOST_CALL: std::cell::RefCell<Option<(HostOp, Vec<Value>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Host operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostOp {
    VerifyImageSignatures,
    VerifyAttestationSignatures,
    ExtractPayload,
    ImageData,
    ResourceGet,
    ResourceList,
    GlobalContext,
    WallTime,
}

impl HostOp {
    pub(crate) fn function_name(self) -> &'static str {
        match self {
            Self::VerifyImageSignatures => "verifyImageSignatures",
            Self::VerifyAttestationSignatures => "verifyAttestationSignatures",
            Self::ExtractPayload => "extractPayload",
            Self::ImageData => "getImageData",
            Self::ResourceGet => "resource.Get",
            Self::ResourceList => "resource.List",
            Self::GlobalContext => "globalContext.Get",
            Self::WallTime => "time.now",
        }
    }
}

/// Calls the evaluation's host from inside a library function.
pub(crate) fn call_host(
    ftx: &cel::FunctionContext<'_, '_>,
    op: HostOp,
    args: Vec<Value>,
) -> Result<Value, ExecutionError> {
    let host = ftx.ptx.get_variable(HOST_VAR).ok_or_else(|| {
        ExecutionError::function_error(op.function_name(), HostError::NotAvailable)
    })?;
    let indexer = host.as_indexer().ok_or_else(|| {
        ExecutionError::function_error(op.function_name(), HostError::NotAvailable)
    })?;
    // The arguments travel beside the call rather than as the index value: converting them
    // (attestor maps with PEM keys) to the interpreter's representation and back was most of
    // a warm validation's CEL time. Evaluation is synchronous, so the slot is this call's.
    HOST_CALL.with(|slot| *slot.borrow_mut() = Some((op, args)));
    let result = indexer.get(&cel::common::types::CelNull);
    HOST_CALL.with(|slot| slot.borrow_mut().take());
    Value::try_from(result?.as_ref())
}

fn dispatch(host: &dyn Host, op: HostOp, args: &[Value]) -> Result<Value, ExecutionError> {
    let bad = || ExecutionError::function_error("host", "malformed host request");
    let name = op.function_name();
    let fail = |e: HostError| ExecutionError::function_error(name, e);
    match (op, args) {
        (HostOp::VerifyImageSignatures, [Value::String(img), attestors]) => host
            .verify_image_signatures(img, &json_list(attestors)?)
            .map(Value::Int)
            .map_err(fail),
        (
            HostOp::VerifyAttestationSignatures,
            [Value::String(img), Value::String(att), attestors],
        ) => host
            .verify_attestation_signatures(img, att, &json_list(attestors)?)
            .map(Value::Int)
            .map_err(fail),
        (HostOp::ExtractPayload, [Value::String(img), Value::String(att)]) => host
            .extract_payload(img, att)
            .map(|j| json_to_value(&j))
            .map_err(fail),
        (HostOp::ImageData, [Value::String(img)]) => host
            .image_data(img)
            .map(|j| json_to_value(&j))
            .map_err(fail),
        (HostOp::ResourceGet, args) => {
            let query = resource_query(op, args).ok_or_else(bad)?;
            match host.resource_get(&query).map_err(fail)? {
                Some(object) => Ok(json_to_value(&object)),
                None => Ok(Value::Null),
            }
        }
        (HostOp::ResourceList, args) => {
            let query = resource_query(op, args).ok_or_else(bad)?;
            host.resource_list(&query)
                .map(|j| json_to_value(&j))
                .map_err(fail)
        }
        (HostOp::GlobalContext, [Value::String(entry), rest @ ..]) => {
            let projection = match rest {
                [] => "",
                [Value::String(p)] => p.as_str(),
                _ => return Err(bad()),
            };
            host.global_context(entry, projection)
                .map(|j| json_to_value(&j))
                .map_err(fail)
        }
        (HostOp::WallTime, []) => Ok(crate::convert::wall_time_value(host.wall_time())),
        _ => Err(bad()),
    }
}

fn json_list(v: &Value) -> Result<Vec<serde_json::Value>, ExecutionError> {
    let json = value_to_json(v).map_err(|e| ExecutionError::function_error("host", e))?;
    match json {
        serde_json::Value::Array(items) => Ok(items),
        other => Err(ExecutionError::function_error(
            "host",
            format!("expected a list of attestors, got {other}"),
        )),
    }
}
