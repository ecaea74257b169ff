//! Cluster objects for the policies' `resource.*` and `globalContext.*` CEL calls, from watch
//! caches (`ivory serve --kube`). Never an API call per admission.
//!
//! Which kinds to watch comes from the loaded policies ([`ivory_policy::ClusterReads`], known at
//! load): [`ResourceWatches::follow`] starts a watch when a policy needs it and stops it when
//! none does (hot reload). A watch answers only once its first list is complete (a relist after it lost its place keeps
//! serving the previous complete set until the new one is complete); before that, or when it
//! holds more than its bounds, a read fails (the policy's failurePolicy decides) instead of
//! answering from a partial set.
//!
//! Memory is bounded per watch ([`WatchLimits`]: objects and bytes, `managedFields` dropped) and
//! for all watches together ([`TotalBytes`]: a watch whose growth would pass the process-wide
//! bound drops what it holds and serves errors, like one past its own bounds); what each holds
//! is exported as metrics. GlobalContextEntries (`kyverno.io/v2beta1`, watched
//! when a policy reads one) name the resource whose objects they answer; that resource is then
//! watched too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
use ivory_engine::resources::{GlobalContextEntry, ObjectList, ResourceError, ResourceSource};
use ivory_policy::ResourceRead;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersion;
use kube::discovery::Scope;
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::Value;

use crate::metrics::WatchStats;
use crate::policies::PolicyStore;

/// How often the watched set is compared with what the policies need.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);
/// How long a watch over its bounds waits before listing again.
const OVER_LIMIT_RETRY: Duration = Duration::from_secs(60);
/// Where GlobalContextEntries are read (the version Kyverno 1.19 stores).
fn global_context_watch() -> ResourceRead {
    ResourceRead {
        group: ivory_engine::resources::global_context::GROUP.to_owned(),
        version: "v2beta1".to_owned(),
        resource: "globalcontextentries".to_owned(),
        namespace: None,
    }
}

/// Bounds of one watch's cache.
#[derive(Clone, Copy, Debug)]
pub struct WatchLimits {
    /// Most objects held.
    pub max_objects: usize,
    /// Most bytes held (the objects' JSON, without `managedFields`).
    pub max_bytes: usize,
    /// Most bytes held by all watches together (lists in progress included).
    pub max_total_bytes: usize,
}

impl Default for WatchLimits {
    fn default() -> Self {
        Self {
            max_objects: 10_000,
            max_bytes: 64 * 1024 * 1024,
            max_total_bytes: 256 * 1024 * 1024,
        }
    }
}

/// The bytes all watches hold together, against [`WatchLimits::max_total_bytes`]. Each watch
/// charges what it holds (its objects and a list in progress) and gives it back when it drops
/// them or stops.
#[derive(Debug)]
pub struct TotalBytes {
    used: AtomicUsize,
    cap: usize,
}

impl TotalBytes {
    /// Nothing charged yet, at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            cap,
        }
    }

    /// Bytes charged by all watches.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Moves a watch's charge from `*charged` to `want`; false (charge unchanged) when growing
    /// it would pass the bound.
    fn resize(&self, charged: &mut usize, want: usize) -> bool {
        if want <= *charged {
            self.used.fetch_sub(*charged - want, Ordering::Relaxed);
            *charged = want;
            return true;
        }
        let more = want - *charged;
        let grown = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(more).filter(|total| *total <= self.cap)
            });
        if grown.is_ok() {
            *charged = want;
        }
        grown.is_ok()
    }
}

/// Objects by (namespace, name).
type Objects = BTreeMap<(String, String), Arc<Value>>;
/// A list in progress: the objects so far and their bytes.
type Listing = (Objects, usize);

/// The state of one watch.
#[derive(Debug, Default)]
struct Held {
    /// `kind` of the objects (from discovery).
    kind: Option<String>,
    objects: Objects,
    bytes: usize,
    synced: bool,
    /// Set while the watch holds more than its bounds allow: it then holds nothing.
    over: Option<String>,
    /// The last error of the watch (forbidden, not found), until the next success.
    error: Option<String>,
    /// Bytes charged to [`TotalBytes`] (what it holds plus a list in progress).
    charged: usize,
    /// Emptied because all watches together reached [`WatchLimits::max_total_bytes`].
    over_total: bool,
}

struct Watch {
    held: Arc<RwLock<Held>>,
    task: tokio::task::JoinHandle<()>,
    total: Arc<TotalBytes>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
        let mut held = self.held.write().unwrap_or_else(|p| p.into_inner());
        self.total.resize(&mut held.charged, 0);
    }
}

/// The running watches, one per kind (and namespace) the policies read.
pub struct ResourceWatches {
    client: Client,
    limits: WatchLimits,
    total: Arc<TotalBytes>,
    watches: RwLock<BTreeMap<ResourceRead, Watch>>,
}

impl std::fmt::Debug for ResourceWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceWatches").finish_non_exhaustive()
    }
}

impl ResourceWatches {
    /// No watch yet; [`Self::follow`] starts what the policies need.
    pub fn new(client: Client, limits: WatchLimits) -> Arc<Self> {
        Arc::new(Self {
            client,
            limits,
            total: Arc::new(TotalBytes::new(limits.max_total_bytes)),
            watches: RwLock::new(BTreeMap::new()),
        })
    }

    /// Keeps the watches in step with the policies of `store`, for as long as the process runs.
    pub fn follow(self: &Arc<Self>, store: Arc<PolicyStore>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(FOLLOW_INTERVAL);
            loop {
                tick.tick().await;
                let needed = me.needed(&store);
                me.sync(&needed);
            }
        });
    }

    /// What the loaded policies read, with the targets of the GlobalContextEntries they name.
    fn needed(&self, store: &PolicyStore) -> BTreeSet<ResourceRead> {
        let snapshot = store.snapshot();
        let mut resources = BTreeSet::new();
        let mut entries = BTreeSet::new();
        for policy in snapshot.policies() {
            resources.extend(policy.cluster_reads.resources.iter().cloned());
            entries.extend(policy.cluster_reads.global_context.iter().cloned());
        }
        if !entries.is_empty() {
            resources.insert(global_context_watch());
            for entry in &entries {
                if let Ok(Some(e)) = self.entry(entry) {
                    resources.insert(e.target);
                }
            }
        }
        resources
    }

    /// Starts the watches in `needed` that do not run, stops those no longer needed.
    pub fn sync(&self, needed: &BTreeSet<ResourceRead>) {
        {
            // The usual case, every second: nothing changed; admissions are not held up by a
            // write lock for it.
            let watches = self.watches.read().unwrap_or_else(|p| p.into_inner());
            if watches.len() == needed.len() && needed.iter().all(|r| watches.contains_key(r)) {
                return;
            }
        }
        let mut watches = self.watches.write().unwrap_or_else(|p| p.into_inner());
        watches.retain(|read, _| {
            let keep = needed.contains(read);
            if !keep {
                tracing::info!(resource = %read, "no policy reads it any more: watch stopped");
            }
            keep
        });
        for read in needed {
            if !watches.contains_key(read) {
                tracing::info!(resource = %read, "a policy reads it: watch started");
                watches.insert(read.clone(), self.start(read.clone()));
            }
        }
    }

    fn start(&self, read: ResourceRead) -> Watch {
        let held = Arc::new(RwLock::new(Held::default()));
        let task = tokio::spawn(run_watch(
            self.client.clone(),
            read,
            self.limits,
            Arc::clone(&self.total),
            Arc::clone(&held),
        ));
        Watch {
            held,
            task,
            total: Arc::clone(&self.total),
        }
    }

    /// What each watch holds.
    pub fn stats(&self) -> Vec<WatchStats> {
        let watches = self.watches.read().unwrap_or_else(|p| p.into_inner());
        watches
            .iter()
            .map(|(read, w)| {
                let held = w.held.read().unwrap_or_else(|p| p.into_inner());
                WatchStats {
                    resource: read.to_string(),
                    objects: held.objects.len(),
                    bytes: held.bytes,
                    synced: held.synced && held.over.is_none(),
                    over_total: held.over_total,
                }
            })
            .collect()
    }

    /// Runs `f` on the synced, in-bounds cache of `what`.
    fn with_held<T>(
        &self,
        what: &ResourceRead,
        f: impl FnOnce(&Held) -> T,
    ) -> Result<T, ResourceError> {
        let watches = self.watches.read().unwrap_or_else(|p| p.into_inner());
        let Some(watch) = watches.get(what) else {
            return Err(ResourceError::NotWatched {
                what: what.to_string(),
            });
        };
        let held = watch.held.read().unwrap_or_else(|p| p.into_inner());
        if let Some(detail) = &held.over {
            return Err(ResourceError::OverLimit {
                what: what.to_string(),
                detail: detail.clone(),
            });
        }
        if !held.synced {
            return Err(ResourceError::NotSynced {
                what: what.to_string(),
                detail: held
                    .error
                    .clone()
                    .unwrap_or_else(|| "its first list is not complete".to_owned()),
            });
        }
        Ok(f(&held))
    }

    fn entry(&self, name: &str) -> Result<Option<GlobalContextEntry>, ResourceError> {
        let object = self.with_held(&global_context_watch(), |held| {
            held.objects.get(&(String::new(), name.to_owned())).cloned()
        })?;
        object
            .map(|o| {
                GlobalContextEntry::parse(&o).map_err(|e| ResourceError::GlobalContext {
                    entry: e.name,
                    reason: e.reason,
                })
            })
            .transpose()
    }
}

impl ResourceSource for ResourceWatches {
    fn get(
        &self,
        what: &ResourceRead,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Value>>, ResourceError> {
        self.with_held(what, |held| {
            held.objects
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned()
        })
    }

    fn list(&self, what: &ResourceRead) -> Result<ObjectList, ResourceError> {
        self.with_held(what, |held| ObjectList {
            kind: held.kind.clone(),
            items: held.objects.values().cloned().collect(),
        })
    }

    fn global_context(&self, entry: &str) -> Result<Option<ObjectList>, ResourceError> {
        match self.entry(entry)? {
            None => Ok(None),
            Some(e) => self.list(&e.target).map(Some),
        }
    }
}

/// Finds the resource (its kind and scope) by discovery, then watches it; a watch over its
/// bounds drops what it holds, waits, and lists again.
async fn run_watch(
    client: Client,
    read: ResourceRead,
    limits: WatchLimits,
    total: Arc<TotalBytes>,
    held: Arc<RwLock<Held>>,
) {
    let set_error = |e: String| {
        tracing::warn!(resource = %read, error = %e, "watch for policies' cluster reads failed");
        held.write().unwrap_or_else(|p| p.into_inner()).error = Some(e);
    };
    let (resource, namespaced) = loop {
        match discover(&client, &read).await {
            Ok(found) => break found,
            Err(e) => set_error(e.to_string()),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    held.write().unwrap_or_else(|p| p.into_inner()).kind = Some(resource.kind.clone());
    loop {
        let api = match (&read.namespace, namespaced) {
            (Some(ns), true) => {
                Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
            }
            _ => Api::<DynamicObject>::all_with(client.clone(), &resource),
        };
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut pending: Option<Listing> = None;
        let mut over = false;
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    set_error(forbidden_hint(&read, &e));
                    continue;
                }
            };
            let mut h = held.write().unwrap_or_else(|p| p.into_inner());
            over = apply(&mut h, &mut pending, event, &resource, limits, &total);
            if over {
                break;
            }
        }
        if over {
            let detail = held.read().unwrap_or_else(|p| p.into_inner()).over.clone();
            tracing::warn!(resource = %read, max_objects = limits.max_objects, max_bytes = limits.max_bytes,
                max_total_bytes = limits.max_total_bytes, detail = detail.unwrap_or_default(),
                "watch exceeds its bounds: serving nothing for it, listing again later");
            tokio::time::sleep(OVER_LIMIT_RETRY).await;
        }
    }
}

/// Applies one event; true when the watch went over its bounds or the process-wide one (it
/// then holds nothing).
fn apply(
    h: &mut Held,
    pending: &mut Option<Listing>,
    event: watcher::Event<DynamicObject>,
    resource: &ApiResource,
    limits: WatchLimits,
    total: &TotalBytes,
) -> bool {
    if apply_event(h, pending, event, resource, limits) {
        total.resize(&mut h.charged, 0);
        h.over_total = false;
        return true;
    }
    let want = h.bytes + pending.as_ref().map_or(0, |(_, bytes)| *bytes);
    if total.resize(&mut h.charged, want) {
        // Cleared with `over` once a list completes within every bound.
        h.over_total = h.over_total && h.over.is_some();
        return false;
    }
    let detail = format!(
        "all watches together would hold {} bytes, past the process-wide bound of {} bytes (--resource-watch-max-total-bytes)",
        total.used().saturating_sub(h.charged) + want,
        limits.max_total_bytes
    );
    exceeded(h, pending, detail);
    total.resize(&mut h.charged, 0);
    h.over_total = true;
    true
}

/// [`apply`] for this watch's own bounds.
fn apply_event(
    h: &mut Held,
    pending: &mut Option<Listing>,
    event: watcher::Event<DynamicObject>,
    resource: &ApiResource,
    limits: WatchLimits,
) -> bool {
    h.error = None;
    let over = |objects: usize, bytes: usize| {
        (objects > limits.max_objects || bytes > limits.max_bytes).then(|| {
            format!(
                "{objects} objects, {bytes} bytes; bounds {} objects, {} bytes",
                limits.max_objects, limits.max_bytes
            )
        })
    };
    match event {
        watcher::Event::Init => *pending = Some((BTreeMap::new(), 0)),
        watcher::Event::InitApply(o) => {
            if let Some((objects, bytes)) = pending.as_mut() {
                let (key, value, size) = stored(o, resource);
                *bytes += size;
                if let Some(old) = objects.insert(key, value) {
                    *bytes = bytes.saturating_sub(size_of(&old));
                }
                if let Some(detail) = over(objects.len(), *bytes) {
                    return exceeded(h, pending, detail);
                }
            }
        }
        watcher::Event::InitDone => {
            if let Some((objects, bytes)) = pending.take() {
                h.objects = objects;
                h.bytes = bytes;
            }
            h.synced = true;
            h.over = None;
        }
        watcher::Event::Apply(o) => {
            let (key, value, size) = stored(o, resource);
            h.bytes += size;
            if let Some(old) = h.objects.insert(key, value) {
                h.bytes = h.bytes.saturating_sub(size_of(&old));
            }
            if let Some(detail) = over(h.objects.len(), h.bytes) {
                return exceeded(h, pending, detail);
            }
        }
        watcher::Event::Delete(o) => {
            let (key, _, _) = stored(o, resource);
            if let Some(old) = h.objects.remove(&key) {
                h.bytes = h.bytes.saturating_sub(size_of(&old));
            }
        }
    }
    false
}

fn exceeded(h: &mut Held, pending: &mut Option<Listing>, detail: String) -> bool {
    *pending = None;
    h.objects.clear();
    h.bytes = 0;
    h.synced = false;
    h.over = Some(detail);
    true
}

fn size_of(object: &Value) -> usize {
    serde_json::to_vec(object).map_or(0, |b| b.len())
}

/// The object as policies see it: `apiVersion` and `kind` set (list items lack them),
/// `managedFields` dropped (bookkeeping of the API server, often most of an object's bytes).
fn stored(object: DynamicObject, resource: &ApiResource) -> ((String, String), Arc<Value>, usize) {
    let key = (
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default(),
    );
    let mut value = serde_json::to_value(&object).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert(
            "apiVersion".into(),
            Value::String(resource.api_version.clone()),
        );
        map.insert("kind".into(), Value::String(resource.kind.clone()));
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            meta.remove("managedFields");
        }
    }
    let size = size_of(&value);
    (key, Arc::new(value), size)
}

/// Why the resource of a read was not found by discovery (the watch's error until it is).
#[derive(Debug, thiserror::Error)]
enum DiscoveryError {
    /// The API server's discovery documents of the group version could not be read.
    #[error("discovery of {api_version}: {source}")]
    Failed {
        api_version: String,
        source: kube::Error,
    },
    /// The group version has no such resource.
    #[error("the API server serves no resource {resource} in {api_version}")]
    NotServed {
        resource: String,
        api_version: String,
    },
}

/// The kind and scope of `read`'s resource, from the API server's discovery documents.
async fn discover(
    client: &Client,
    read: &ResourceRead,
) -> Result<(ApiResource, bool), DiscoveryError> {
    let gv = GroupVersion::gv(&read.group, &read.version);
    let group = kube::discovery::pinned_group(client, &gv)
        .await
        .map_err(|source| DiscoveryError::Failed {
            api_version: read.api_version(),
            source,
        })?;
    group
        .versioned_resources(&read.version)
        .into_iter()
        .find(|(ar, _)| ar.plural == read.resource)
        .map(|(ar, caps)| (ar, caps.scope == Scope::Namespaced))
        .ok_or_else(|| DiscoveryError::NotServed {
            resource: read.resource.clone(),
            api_version: read.api_version(),
        })
}

/// A watch error, with what to do about a refusal.
fn forbidden_hint(read: &ResourceRead, error: &watcher::Error) -> String {
    if is_forbidden(error) {
        format!(
            "{error} (may ivory's service account get, list and watch {}? add it to the Helm \
             value clusterReads, or the kustomize ClusterRole)",
            read.resource
        )
    } else {
        error.to_string()
    }
}

/// Whether the API server refused the watch (403 or reason `Forbidden`), from the status it
/// answered with, never from the error's text.
fn is_forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => {
            matches!(e, kube::Error::Api(status) if status.is_forbidden())
        }
        watcher::Error::WatchError(status) => status.is_forbidden(),
        watcher::Error::NoResourceVersion => false,
    }
}

#[cfg(test)]
mod tests {
    use kube::api::GroupVersionKind;
    use serde_json::json;

    use super::*;

    fn resource() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", "ConfigMap"),
            "configmaps",
        )
    }

    fn cm(name: &str, data: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ivory",
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "data": {"k": data},
        }))
        .unwrap()
    }

    fn step(
        h: &mut Held,
        pending: &mut Option<Listing>,
        e: watcher::Event<DynamicObject>,
        limits: WatchLimits,
    ) -> bool {
        apply(
            h,
            pending,
            e,
            &resource(),
            limits,
            &TotalBytes::new(usize::MAX),
        )
    }

    #[test]
    fn all_watches_together_stay_within_the_process_wide_bound() {
        let total = TotalBytes::new(1000);
        let limits = WatchLimits {
            max_objects: 100,
            max_bytes: 4096,
            max_total_bytes: 1000,
        };
        let step =
            |h: &mut Held, p: &mut Option<Listing>, e| apply(h, p, e, &resource(), limits, &total);
        // One watch holds ~600 bytes, within its own bounds and the total.
        let (mut a, mut pa) = (Held::default(), None);
        step(&mut a, &mut pa, watcher::Event::Init);
        assert!(!step(
            &mut a,
            &mut pa,
            watcher::Event::InitApply(cm("a", &"x".repeat(500)))
        ));
        step(&mut a, &mut pa, watcher::Event::InitDone);
        assert!(a.synced && a.charged == a.bytes && a.bytes > 500);
        // Another, within its own bounds, would pass the total while listing: it drops what
        // it holds, serves nothing, says why, and gives its charge back.
        let (mut b, mut pb) = (Held::default(), None);
        step(&mut b, &mut pb, watcher::Event::Init);
        assert!(step(
            &mut b,
            &mut pb,
            watcher::Event::InitApply(cm("b", &"y".repeat(500)))
        ));
        assert!(b.objects.is_empty() && !b.synced && b.over_total && b.charged == 0);
        assert!(
            b.over
                .as_deref()
                .is_some_and(|o| o.contains("process-wide bound of 1000 bytes")),
            "{:?}",
            b.over
        );
        assert!(
            a.synced && a.over.is_none(),
            "the first watch keeps serving"
        );
        assert_eq!(total.used(), a.bytes);
        // Once the first gives bytes back, the second lists within the total again.
        step(&mut a, &mut pa, watcher::Event::Delete(cm("a", "")));
        assert_eq!(total.used(), 0);
        step(&mut b, &mut pb, watcher::Event::Init);
        assert!(!step(
            &mut b,
            &mut pb,
            watcher::Event::InitApply(cm("b", &"y".repeat(500)))
        ));
        step(&mut b, &mut pb, watcher::Event::InitDone);
        assert!(b.synced && b.over.is_none() && !b.over_total);
        assert_eq!(total.used(), b.bytes);
    }

    #[test]
    fn a_watch_serves_only_complete_lists_within_its_bounds() {
        let limits = WatchLimits {
            max_objects: 2,
            max_bytes: 4096,
            max_total_bytes: usize::MAX,
        };
        let (mut h, mut pending) = (Held::default(), None);
        assert!(!step(&mut h, &mut pending, watcher::Event::Init, limits));
        assert!(!step(
            &mut h,
            &mut pending,
            watcher::Event::InitApply(cm("a", "1")),
            limits
        ));
        assert!(
            !h.synced && h.objects.is_empty(),
            "nothing served before the list completes"
        );
        assert!(!step(
            &mut h,
            &mut pending,
            watcher::Event::InitDone,
            limits
        ));
        assert!(h.synced && h.objects.len() == 1);
        let stored = &h.objects[&("ivory".to_owned(), "a".to_owned())];
        assert_eq!(
            (stored["apiVersion"].as_str(), stored["kind"].as_str()),
            (Some("v1"), Some("ConfigMap"))
        );
        assert!(
            stored["metadata"].get("managedFields").is_none(),
            "{stored}"
        );
        assert_eq!(h.bytes, size_of(stored));

        // An update replaces; a delete removes and gives its bytes back.
        assert!(!step(
            &mut h,
            &mut pending,
            watcher::Event::Apply(cm("a", "22")),
            limits
        ));
        assert!(!step(
            &mut h,
            &mut pending,
            watcher::Event::Apply(cm("b", "3")),
            limits
        ));
        assert_eq!(h.objects.len(), 2);
        assert!(!step(
            &mut h,
            &mut pending,
            watcher::Event::Delete(cm("b", "3")),
            limits
        ));
        let a = h.objects[&("ivory".to_owned(), "a".to_owned())].clone();
        assert_eq!((h.objects.len(), h.bytes), (1, size_of(&a)));

        // Past a bound: everything dropped, nothing served, until a list within bounds.
        assert!(!step(
            &mut h,
            &mut pending,
            watcher::Event::Apply(cm("b", "3")),
            limits
        ));
        assert!(step(
            &mut h,
            &mut pending,
            watcher::Event::Apply(cm("c", "4")),
            limits
        ));
        assert!(h.objects.is_empty() && h.bytes == 0 && !h.synced);
        assert!(
            h.over.as_deref().is_some_and(|o| o.contains("3 objects")),
            "{:?}",
            h.over
        );
        let big = WatchLimits {
            max_objects: 10,
            max_bytes: 150,
            max_total_bytes: usize::MAX,
        };
        let (mut h, mut pending) = (Held::default(), None);
        step(&mut h, &mut pending, watcher::Event::Init, big);
        assert!(step(
            &mut h,
            &mut pending,
            watcher::Event::InitApply(cm("a", &"x".repeat(200))),
            big
        ));
        assert!(
            h.over.as_deref().is_some_and(|o| o.contains("bytes")),
            "{:?}",
            h.over
        );
        step(&mut h, &mut pending, watcher::Event::Init, big);
        step(
            &mut h,
            &mut pending,
            watcher::Event::InitApply(cm("a", "small")),
            big,
        );
        step(&mut h, &mut pending, watcher::Event::InitDone, big);
        assert!(h.synced && h.over.is_none() && h.objects.len() == 1);
    }

    #[test]
    fn a_refused_watch_says_what_to_grant() {
        let read = global_context_watch();
        let forbidden = || kube::core::Status::failure("no", "Forbidden").with_code(403);
        for refused in [
            watcher::Error::InitialListFailed(kube::Error::Api(forbidden().boxed())),
            watcher::Error::WatchError(forbidden().boxed()),
        ] {
            let hint = forbidden_hint(&read, &refused);
            assert!(
                hint.contains("clusterReads") && hint.contains("globalcontextentries"),
                "{hint}"
            );
        }
        // The status decides, not the words: a 500 whose message says 403 gets no hint.
        let worded = kube::core::Status::failure("forbidden (403)", "InternalError").with_code(500);
        let error = watcher::Error::WatchError(worded.boxed());
        assert_eq!(forbidden_hint(&read, &error), error.to_string());
        let error = watcher::Error::NoResourceVersion;
        assert_eq!(forbidden_hint(&read, &error), error.to_string());
    }

    #[test]
    fn a_resource_discovery_does_not_find_is_named_with_its_api_version() {
        let error = DiscoveryError::NotServed {
            resource: "widgets".into(),
            api_version: "example.com/v1".into(),
        };
        assert_eq!(
            error.to_string(),
            "the API server serves no resource widgets in example.com/v1"
        );
    }
}
