//! An admitted object (`object`/`oldObject`) kept as the raw JSON the API server sent, with
//! the little a typical image policy reads of it taken out in one pass: `kind`,
//! `metadata.labels` and the container and volume images of every pod spec it embeds.
//!
//! Building a `serde_json::Value` tree of a Pod and dropping it again was a third of a warm
//! admission's CPU time (BENCHMARKS.md), for policies that read only its images. The tree is
//! still there for whatever reads more (CEL reading `object`, mutation, the CLI): built on its
//! first read, once.
//!
//! The summary is only ever a shortcut. It is read by a strict typed parse that refuses
//! anything the lenient tree readers and the shape check (`super::shape`) could read
//! differently: a field of another type, a duplicate field, a list where an object belongs.
//! An object it refuses has no summary, and every reader falls back to the tree, so an unusual
//! object costs time, never a different answer (`summary_agrees_with_the_tree`).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// Key of the images mounted as volumes (`spec.volumes[].image.reference`), beside the
/// container lists' own names.
pub const IMAGE_VOLUMES: &str = "imageVolumes";

/// `metadata.labels` of an object (empty when absent or not strings).
pub fn object_labels(object: Option<&Value>) -> BTreeMap<String, String> {
    object
        .and_then(|o| o.pointer("/metadata/labels"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// One admitted object: its raw JSON, its summary and its tree, each read once at most. Boxed:
/// a request holds two and is moved whole several times between the parse and the answer, and
/// the unboxed parts were half of its 1,200 bytes (issue 47).
pub struct AdmittedObject {
    parts: Box<ObjectParts>,
}

/// What an [`AdmittedObject`] holds.
struct ObjectParts {
    /// Set when read as raw JSON; taken from `body` on first use when summarized in place.
    raw: OnceLock<Box<RawValue>>,
    /// The review this object was summarized from in the review's own parse, and which of its
    /// objects it is: where the raw JSON is taken from if something reads it.
    body: Option<(Arc<[u8]>, Which)>,
    summary: OnceLock<Option<ObjectSummary>>,
    tree: OnceLock<Value>,
}

/// `request.object` or `request.oldObject`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    Object,
    OldObject,
}

thread_local! {
    /// Set while [`summarizing_in_place`] parses a review on this thread.
    static IN_PLACE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `parse` (a review's parse) with its objects summarized in place: one pass over the
/// review instead of one to keep each object's raw JSON and another to summarize it. Such an
/// object has no raw JSON until [`AdmittedObject::attach_body`] says where it is. The typed
/// summary refuses unusual objects, which fails `parse`: the caller then parses the usual
/// way, so an unusual object costs time, never a different answer.
pub(crate) fn summarizing_in_place<T>(parse: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_PLACE.with(|flag| flag.set(false));
        }
    }
    IN_PLACE.with(|flag| flag.set(true));
    let _reset = Reset;
    parse()
}

/// The objects of a review body, as raw JSON.
#[derive(Deserialize)]
struct BodyObjects {
    request: BodyRequest,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BodyRequest {
    #[serde(default)]
    object: Option<Box<RawValue>>,
    #[serde(default)]
    old_object: Option<Box<RawValue>>,
}

impl AdmittedObject {
    /// An object read as raw JSON.
    fn from_raw(raw: Box<RawValue>) -> Self {
        Self {
            parts: Box::new(ObjectParts {
                raw: OnceLock::from(raw),
                body: None,
                summary: OnceLock::new(),
                tree: OnceLock::new(),
            }),
        }
    }

    /// Where an object summarized in place came from ([`summarizing_in_place`]).
    pub(crate) fn attach_body(&mut self, body: &Arc<[u8]>, which: Which) {
        if self.parts.raw.get().is_none() {
            self.parts.body = Some((Arc::clone(body), which));
        }
    }

    fn raw_value(&self) -> &RawValue {
        self.parts.raw.get_or_init(|| {
            // The body was read as a review holding this object, without duplicate fields, so
            // reading it again finds the same text; null is what a failure would mean.
            let found = self.parts.body.as_ref().and_then(|(body, which)| {
                let objects: BodyObjects = serde_json::from_slice(body).ok()?;
                match which {
                    Which::Object => objects.request.object,
                    Which::OldObject => objects.request.old_object,
                }
            });
            found.unwrap_or_else(null_raw)
        })
    }

    /// The JSON tree, parsed from the raw JSON on the first call.
    pub fn value(&self) -> &Value {
        self.parts.tree.get_or_init(|| {
            // The raw text was accepted as one JSON value when the review was read; parsing
            // it again cannot fail, and the shape check refuses a null object regardless.
            serde_json::from_str(self.raw()).unwrap_or(Value::Null)
        })
    }

    /// The raw JSON as received.
    pub fn raw(&self) -> &str {
        self.raw_value().get()
    }

    /// What the warm path reads, or `None` when the object is unusual enough that only the
    /// tree can say (see the module documentation).
    pub fn summary(&self) -> Option<&ObjectSummary> {
        self.parts
            .summary
            .get_or_init(|| {
                serde_json::from_str::<ObjectOnly<ObjectSummary>>(self.raw())
                    .ok()
                    .map(|o| o.0)
            })
            .as_ref()
    }

    /// Changes the object through its tree; its raw JSON and summary follow.
    pub fn edit(&mut self, change: impl FnOnce(&mut Value)) {
        let mut tree = self.value().clone();
        change(&mut tree);
        *self = tree.into();
    }

    /// Whether the tree has been built (tests: laziness).
    pub fn tree_built(&self) -> bool {
        self.parts.tree.get().is_some()
    }

    /// `metadata.labels` (empty when absent).
    pub fn labels(&self) -> BTreeMap<String, String> {
        match self.summary() {
            Some(summary) => summary.labels().clone(),
            None => object_labels(Some(self.value())),
        }
    }

    /// `metadata.name`, when it is a string.
    pub fn name(&self) -> Option<&str> {
        match self.summary() {
            Some(summary) => summary.metadata().and_then(|m| m.name.as_deref()),
            None => self
                .value()
                .pointer("/metadata/name")
                .and_then(Value::as_str),
        }
    }

    /// `metadata.uid`, when it is a string.
    pub fn uid(&self) -> Option<&str> {
        match self.summary() {
            Some(summary) => summary.metadata().and_then(|m| m.uid.as_deref()),
            None => self
                .value()
                .pointer("/metadata/uid")
                .and_then(Value::as_str),
        }
    }

    /// `kind`, when it is a string.
    pub fn kind(&self) -> Option<&str> {
        match self.summary() {
            Some(summary) => summary.kind.as_deref(),
            None => self.value().get("kind").and_then(Value::as_str),
        }
    }
}

impl ivory_cel::JsonSource for AdmittedObject {
    fn json(&self) -> &Value {
        self.value()
    }
}

impl From<Value> for AdmittedObject {
    fn from(value: Value) -> Self {
        // Serializing a tree with string keys cannot fail; null is what a failure would mean.
        let raw = serde_json::value::to_raw_value(&value).unwrap_or_else(|_| null_raw());
        Self {
            parts: Box::new(ObjectParts {
                raw: OnceLock::from(raw),
                body: None,
                summary: OnceLock::new(),
                tree: OnceLock::from(value),
            }),
        }
    }
}

impl Clone for AdmittedObject {
    fn clone(&self) -> Self {
        Self {
            parts: Box::new(ObjectParts {
                raw: self.parts.raw.clone(),
                body: self.parts.body.clone(),
                summary: self.parts.summary.clone(),
                tree: self.parts.tree.clone(),
            }),
        }
    }
}

impl PartialEq for AdmittedObject {
    fn eq(&self, other: &Self) -> bool {
        self.raw() == other.raw() || self.value() == other.value()
    }
}

impl fmt::Debug for AdmittedObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.raw())
    }
}

impl Serialize for AdmittedObject {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw_value().serialize(s)
    }
}

impl<'de> Deserialize<'de> for AdmittedObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        Ok(Self::from_raw(raw))
    }
}

/// Deserializes `Option<AdmittedObject>` with `null` as `None`.
pub(crate) fn null_as_none<'de, D>(d: D) -> Result<Option<AdmittedObject>, D::Error>
where
    D: Deserializer<'de>,
{
    if IN_PLACE.with(Cell::get) {
        let summary = Option::<ObjectOnly<ObjectSummary>>::deserialize(d)?;
        return Ok(summary.map(|summary| AdmittedObject {
            parts: Box::new(ObjectParts {
                raw: OnceLock::new(),
                body: None,
                summary: OnceLock::from(Some(summary.0)),
                tree: OnceLock::new(),
            }),
        }));
    }
    let raw = Option::<Box<RawValue>>::deserialize(d)?;
    Ok(raw
        .filter(|r| r.get() != "null")
        .map(AdmittedObject::from_raw))
}

fn null_raw() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).unwrap_or_default()
}

/// `kind`, `metadata.labels` and the pod specs of an object, read strictly.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ObjectSummary {
    kind: Option<String>,
    metadata: Option<ObjectOnly<Metadata>>,
    spec: Option<ObjectOnly<PodSpec>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Metadata {
    name: Option<String>,
    uid: Option<String>,
    labels: Option<BTreeMap<String, String>>,
}

/// A `spec` on the way to a pod spec: the pod spec itself (`spec`), or one holding a
/// `template` (workloads, a job template's `spec`) or a `jobTemplate` (CronJob).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    init_containers: Option<Vec<ObjectOnly<Container>>>,
    containers: Option<Vec<ObjectOnly<Container>>>,
    ephemeral_containers: Option<Vec<ObjectOnly<Container>>>,
    volumes: Option<Vec<ObjectOnly<Volume>>>,
    template: Option<ObjectOnly<Template>>,
    job_template: Option<ObjectOnly<Template>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Template {
    spec: Option<Box<ObjectOnly<PodSpec>>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Container {
    image: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Volume {
    image: Option<ObjectOnly<ImageVolume>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct ImageVolume {
    reference: Option<String>,
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl ObjectSummary {
    /// `metadata.labels` (empty when absent).
    pub fn labels(&self) -> &BTreeMap<String, String> {
        self.metadata()
            .and_then(|m| m.labels.as_ref())
            .unwrap_or(&NO_LABELS)
    }

    fn metadata(&self) -> Option<&Metadata> {
        self.metadata.as_ref().map(|m| &m.0)
    }

    /// The pod spec at `pointer` (`/spec`, `/spec/template/spec` or
    /// `/spec/jobTemplate/spec/template/spec`); `None` when absent or another pointer.
    pub fn pod_spec(&self, pointer: &str) -> Option<&PodSpec> {
        let spec = &self.spec.as_ref()?.0;
        match pointer {
            "/spec" => Some(spec),
            "/spec/template/spec" => spec.template_spec(),
            "/spec/jobTemplate/spec/template/spec" => {
                let job = spec.job_template.as_ref()?.0.spec.as_deref()?;
                job.0.template_spec()
            }
            _ => None,
        }
    }
}

impl PodSpec {
    /// `template.spec`.
    fn template_spec(&self) -> Option<&PodSpec> {
        self.template.as_ref()?.0.spec.as_deref().map(|s| &s.0)
    }

    /// `(index, image)` of each entry of `field` (`containers`, `initContainers`,
    /// `ephemeralContainers`, or `imageVolumes` for `volumes[].image.reference`) that has an
    /// image; the index counts every entry.
    pub fn images(&self, field: &str) -> Vec<(usize, &str)> {
        let images: Vec<Option<&str>> = match field {
            "initContainers" => container_images(&self.init_containers),
            "containers" => container_images(&self.containers),
            "ephemeralContainers" => container_images(&self.ephemeral_containers),
            IMAGE_VOLUMES => self
                .volumes
                .iter()
                .flatten()
                .map(|v| v.0.image.as_ref().and_then(|i| i.0.reference.as_deref()))
                .collect(),
            _ => Vec::new(),
        };
        images
            .into_iter()
            .enumerate()
            .filter_map(|(i, image)| image.map(|image| (i, image)))
            .collect()
    }
}

fn container_images(list: &Option<Vec<ObjectOnly<Container>>>) -> Vec<Option<&str>> {
    list.iter()
        .flatten()
        .map(|c| c.0.image.as_deref())
        .collect()
}

/// A struct read only from a JSON object: serde's derived structs also accept a list of their
/// fields in order, which the tree readers would see as no object at all.
#[derive(Clone, Debug, Default)]
pub struct ObjectOnly<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Only<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Only<T> {
            type Value = ObjectOnly<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(ObjectOnly)
            }
        }
        d.deserialize_map(Only(PhantomData))
    }
}

#[cfg(test)]
mod tests;
