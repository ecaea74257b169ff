//! A route's prepared plans, reused: when a request's matching inputs are those of one judged
//! before on the same policies, and every verdict that request's plans asked for is still the
//! very verdict the verifier keeps, the decision those plans led to is the decision again. The
//! warm path then skips matching, image selection, planning, evaluation and the decision
//! itself; what is left per request is the review's parse, one key and one check per verdict.
//!
//! The key is every input preparation reads ([`Input`]), written into one byte string whose
//! parts are tagged and length-prefixed (two different inputs never write the same bytes); an
//! entry is found by the key's keyed hash and used only when its bytes are the same, compared
//! in full. Only routes whose every policy decides from those inputs and its verification
//! answers alone are kept ([`PolicyFacts::route_pure`]); only decisions no error, budget or
//! deadline shaped, and whose every answer was a verdict the verifier still holds, are kept.
//! So an entry ends with any verdict it read (expiry, eviction, replacement, another trust
//! root: [`ImageVerifier::still_holds`]) and with any policy version (the key names each policy
//! object, and a reload makes new ones).
//!
//! A missed input would be a bypass: `tests.rs` changes each input alone and checks the
//! decision follows it, and drops each input from the key in turn to see that test fail.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ivory_plumbing::keyed::{KeyedMap, KeyedState, keyed_state};
use ivory_policy::compiled::CompiledPolicy;
use serde_json::Value;

use super::facts::PolicyFacts;
use super::prefetch::{JobSet, Outcome, Prefetched};
use crate::admission::{AdmissionRequest, AdmittedObject, GroupVersionKind, GroupVersionResource};
use crate::decision::Decision;
use crate::images;
use crate::verifier::{HeldVerdict, ImageVerifier};

/// Routes kept at most, and their bytes at most (keys, decisions, verdict handles); when more
/// are seen, all are forgotten and kept again as they come (a cost, never a different answer).
const MAX_ROUTES: usize = 1024;
const MAX_BYTES: usize = 8 << 20;
/// Keys longer than this (many images, many labels) are judged afresh every time.
const MAX_KEY_BYTES: usize = 16 << 10;
/// Decisions larger than this (long messages, many images) are not kept.
const MAX_DECISION_BYTES: usize = 16 << 10;

/// Every input a route's preparation reads from a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Input {
    /// Each policy object (one per version and autogen variant), in route order.
    Policies,
    Operation,
    /// The request's kind (`requestKind` is read by no preparation: only the CEL `request`
    /// binding, which a kept route's policies never read).
    Kind,
    Resource,
    SubResource,
    RequestResource,
    RequestSubResource,
    Name,
    Namespace,
    /// The Namespace object's presence and labels (its pinning label among them).
    NamespaceLabels,
    /// Whether the Namespace's labels could not be known.
    NamespaceLabelsUnknown,
    ObjectLabels,
    OldObjectLabels,
    /// The admitted object's own `kind` (pinning: what gets pins; [`Input::Kind`] when it has
    /// none).
    SubjectKind,
    /// The built-in extractors' images, by extractor.
    Images,
}

/// A request's matching inputs on one route, written out.
pub(super) struct RouteKey {
    hash: u64,
    bytes: Vec<u8>,
    /// The facts whose addresses the key holds.
    policies: Vec<Arc<PolicyFacts>>,
}

/// Kept routes with the decision each led to, shared by every request a server or CLI judges.
pub(super) struct RoutePlans {
    entries: RwLock<Routes>,
    hasher: KeyedState,
    hits: AtomicU64,
}

/// The kept routes and roughly the bytes they hold.
#[derive(Default)]
struct Routes {
    by_key: KeyedMap<u64, Arc<RouteEntry>>,
    bytes: usize,
}

impl Default for RoutePlans {
    fn default() -> Self {
        Self {
            entries: RwLock::new(Routes::default()),
            hasher: keyed_state(),
            hits: AtomicU64::new(0),
        }
    }
}

struct RouteEntry {
    /// Roughly what the entry holds, for [`MAX_BYTES`].
    bytes: usize,
    key: Vec<u8>,
    /// Kept so that the addresses in `key` name these policies and no others.
    _policies: Vec<Arc<PolicyFacts>>,
    /// Every verdict the plans asked for, as the verifier holds it.
    held: Vec<HeldVerdict>,
    /// Shared with every request it is reused for: a reuse copies a pointer.
    decision: Arc<Decision>,
}

impl RoutePlans {
    /// The key of `req` on the route of `policies`, or `None` when the route is not one whose
    /// decision may be kept (a policy reads more than the matching inputs, an object has no
    /// summary, the key is too long).
    pub(super) fn key(
        &self,
        policies: &[&CompiledPolicy],
        req: &AdmissionRequest,
        namespace_object: Option<&Value>,
    ) -> Option<RouteKey> {
        let facts: Vec<Arc<PolicyFacts>> = policies.iter().map(|p| PolicyFacts::of(p)).collect();
        if !facts.iter().all(|f| f.route_pure) {
            return None;
        }
        let mut key = KeyWriter {
            bytes: Vec::with_capacity(1024),
        };
        key.policies(&facts);
        key.request(req)?;
        key.namespace(namespace_object);
        key.images(req);
        let bytes = key.bytes;
        (bytes.len() <= MAX_KEY_BYTES).then(|| RouteKey {
            hash: self.hasher.hash_one(&bytes),
            bytes,
            policies: facts,
        })
    }

    /// The decision kept for `key`, when every verdict it read is still the one `verifier`
    /// holds.
    pub(super) fn reuse(
        &self,
        key: &RouteKey,
        verifier: &dyn ImageVerifier,
    ) -> Option<Arc<Decision>> {
        let entry = {
            let entries = self.entries.read().ok()?;
            Arc::clone(entries.by_key.get(&key.hash)?)
        };
        let same = entry.key == key.bytes && entry.held.iter().all(|h| verifier.still_holds(h));
        if !same {
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(Arc::clone(&entry.decision))
    }

    /// Keeps `decision` for `key` when every job of `jobs` was a verification answered by a
    /// verdict `verifier` holds.
    pub(super) fn keep(
        &self,
        key: RouteKey,
        verifier: &dyn ImageVerifier,
        jobs: &JobSet,
        prefetched: &Prefetched,
        decision: &Arc<Decision>,
    ) {
        let decision_size = decision_bytes(decision);
        if decision_size > MAX_DECISION_BYTES || decision.budget_exhausted {
            return;
        }
        let Some(held) = hold(verifier, jobs, prefetched) else {
            return;
        };
        // A verdict handle holds a key of a few strings and a pointer.
        let bytes = key.bytes.len() + decision_size + 256 * held.len() + 256;
        let entry = Arc::new(RouteEntry {
            bytes,
            key: key.bytes,
            _policies: key.policies,
            held,
            decision: Arc::clone(decision),
        });
        let Ok(mut entries) = self.entries.write() else {
            return;
        };
        if entries.by_key.len() >= MAX_ROUTES || entries.bytes + bytes > MAX_BYTES {
            entries.by_key.clear();
            entries.bytes = 0;
        }
        if let Some(replaced) = entries.by_key.insert(key.hash, entry) {
            entries.bytes = entries.bytes.saturating_sub(replaced.bytes);
        }
        entries.bytes += bytes;
    }

    /// How many decisions were reused.
    pub(super) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Routes kept now, and their bytes.
    #[cfg(test)]
    fn size(&self) -> (usize, usize) {
        self.entries
            .read()
            .map(|e| (e.by_key.len(), e.bytes))
            .unwrap_or_default()
    }
}

/// A handle on every answer, or `None` when one is not a verdict the verifier holds.
fn hold(
    verifier: &dyn ImageVerifier,
    jobs: &JobSet,
    prefetched: &Prefetched,
) -> Option<Vec<HeldVerdict>> {
    jobs.verify_requests()
        .enumerate()
        .map(
            |(index, request)| match (request, prefetched.outcome(index)) {
                (Some(request), Some(Outcome::Verify(Ok(answer)))) => {
                    verifier.hold_verdict(request, answer)
                }
                _ => None,
            },
        )
        .collect()
}

/// Roughly the bytes a decision holds.
fn decision_bytes(decision: &Decision) -> usize {
    let strings = |list: &[String]| list.iter().map(String::len).sum::<usize>();
    decision.message.as_ref().map_or(0, String::len)
        + strings(&decision.warnings)
        + decision
            .audit_annotations
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
        + decision
            .results
            .iter()
            .map(|r| r.policy.len() + r.message.len() + strings(&r.images) + 64)
            .sum::<usize>()
}

/// Writes inputs as `tag, (1, length, bytes | 2, count)*, 0`: no two different inputs write
/// the same bytes.
struct KeyWriter {
    bytes: Vec<u8>,
}

/// One input being written (or dropped, in the mutation test).
struct Field<'w> {
    bytes: Option<&'w mut Vec<u8>>,
}

impl Field<'_> {
    fn str(&mut self, text: &str) -> &mut Self {
        if let Some(bytes) = self.bytes.as_deref_mut() {
            bytes.push(1);
            let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
            bytes.extend_from_slice(&len.to_le_bytes());
            bytes.extend_from_slice(text.as_bytes());
        }
        self
    }

    fn count(&mut self, n: usize) -> &mut Self {
        // Also an address: what is compared is the number, never what it points to.
        if let Some(bytes) = self.bytes.as_deref_mut() {
            bytes.push(2);
            bytes.extend_from_slice(&(n as u64).to_le_bytes());
        }
        self
    }

    fn flag(&mut self, on: bool) -> &mut Self {
        self.str(if on { "1" } else { "0" })
    }

    fn opt(&mut self, text: Option<&str>) -> &mut Self {
        match text {
            Some(text) => self.flag(true).str(text),
            None => self.flag(false),
        }
    }

    fn gvk(&mut self, gvk: &GroupVersionKind) -> &mut Self {
        self.str(&gvk.group).str(&gvk.version).str(&gvk.kind)
    }

    fn gvr(&mut self, gvr: &GroupVersionResource) -> &mut Self {
        self.str(&gvr.group).str(&gvr.version).str(&gvr.resource)
    }

    fn labels(&mut self, labels: &BTreeMap<String, String>) -> &mut Self {
        for (k, v) in labels {
            self.str(k).str(v);
        }
        self
    }
}

impl Drop for Field<'_> {
    fn drop(&mut self) {
        if let Some(bytes) = self.bytes.as_deref_mut() {
            bytes.push(0);
        }
    }
}

impl KeyWriter {
    fn field(&mut self, input: Input) -> Field<'_> {
        if dropped(input) {
            return Field { bytes: None };
        }
        self.bytes.push(input as u8 + 2);
        Field {
            bytes: Some(&mut self.bytes),
        }
    }

    /// Each policy by the address of its facts: one allocation per policy object (a reload or an
    /// autogen variant has its own), which the entry keeps alive so no other can take it.
    fn policies(&mut self, policies: &[Arc<PolicyFacts>]) {
        let mut field = self.field(Input::Policies);
        for facts in policies {
            field.count(Arc::as_ptr(facts) as usize);
        }
    }

    /// `None` when an object has no summary (only its tree could say what it holds).
    fn request(&mut self, req: &AdmissionRequest) -> Option<()> {
        let object_labels = summary_labels(req.object.as_ref())?;
        let old_labels = summary_labels(req.old_object.as_ref())?;
        self.field(Input::Operation).str(req.operation.as_str());
        self.field(Input::Kind).gvk(&req.kind);
        self.field(Input::Resource).gvr(&req.resource);
        self.field(Input::SubResource)
            .opt(req.sub_resource.as_deref());
        let mut field = self.field(Input::RequestResource);
        match &req.request_resource {
            Some(gvr) => field.flag(true).gvr(gvr),
            None => field.flag(false),
        };
        drop(field);
        self.field(Input::RequestSubResource)
            .opt(req.request_sub_resource.as_deref());
        self.field(Input::Name).str(&req.name);
        self.field(Input::Namespace).str(&req.namespace);
        self.field(Input::NamespaceLabelsUnknown)
            .flag(req.namespace_labels_unknown);
        for (input, labels) in [
            (Input::ObjectLabels, object_labels),
            (Input::OldObjectLabels, old_labels),
        ] {
            let mut field = self.field(input);
            match labels {
                Some(labels) => field.flag(true).labels(labels),
                None => field.flag(false),
            };
        }
        self.field(Input::SubjectKind)
            .opt(req.subject().and_then(AdmittedObject::kind));
        Some(())
    }

    fn namespace(&mut self, namespace_object: Option<&Value>) {
        let mut field = self.field(Input::NamespaceLabels);
        field.flag(namespace_object.is_some());
        let labels = namespace_object
            .and_then(|ns| ns.get("metadata")?.get("labels"))
            .and_then(Value::as_object);
        for (k, v) in labels.into_iter().flatten() {
            field.str(k);
            match v {
                Value::String(v) => field.flag(true).str(v),
                // Not a label a selector reads; kept apart from every string all the same.
                other => field.flag(false).str(&other.to_string()),
            };
        }
    }

    /// The built-in extractors' images, read where [`images::builtin_images`] reads them.
    fn images(&mut self, req: &AdmissionRequest) {
        let mut field = self.field(Input::Images);
        let has_spec = images::for_each_builtin_list(req, |extractor, images| {
            field.str(extractor).count(images.len());
            for (_, image) in images {
                field.str(image);
            }
        });
        field.flag(has_spec);
    }
}

/// An object's labels from its summary (`Some(None)`: no object; `None`: no summary).
fn summary_labels(object: Option<&AdmittedObject>) -> Option<Option<&BTreeMap<String, String>>> {
    match object {
        Some(object) => object.summary().map(|s| Some(s.labels())),
        None => Some(None),
    }
}

#[cfg(not(test))]
fn dropped(_: Input) -> bool {
    false
}

#[cfg(test)]
thread_local! {
    /// The mutation check: an input left out of every key written on this thread.
    static DROPPED: std::cell::Cell<Option<Input>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
fn dropped(input: Input) -> bool {
    DROPPED.with(|d| d.get() == Some(input))
}

/// Leaves `input` out of every key written on this thread while `run` runs.
#[cfg(test)]
pub(super) fn without_input<T>(input: Input, run: impl FnOnce() -> T) -> T {
    DROPPED.with(|d| d.set(Some(input)));
    let out = run();
    DROPPED.with(|d| d.set(None));
    out
}

#[cfg(test)]
mod tests;
