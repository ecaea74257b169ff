//! Finding container images in admitted objects, and `matchImageReferences`.
//!
//! Two extractors exist, as in Kyverno:
//! * [`builtin_images`] feeds the CEL `images` variable during validation. Kyverno chooses it by
//!   `requestResource` GVR (`pkg/cel/compiler/images.go`).
//! * [`image_pointers`] feeds digest pinning and knows JSON pointers. Kyverno chooses it by kind
//!   (`pkg/utils/api/image.go`), which adds ReplicationController.
//!
//! Both report every container list of the pod spec: `containers`, `initContainers` and
//! `ephemeralContainers`, and the OCI images mounted as volumes (`spec.volumes[].image.reference`)
//! under `imageVolumes`, the key Kyverno's built-in CEL extractors use. Kyverno's pinning
//! extractor has no image volumes; ivory pins and checks them like containers, so a volume
//! cannot bring in an image no policy looked at. An
//! ivory improvement: when `requestResource` is not one of the known GVRs (e.g. a request made
//! against `apps/v1beta1` and converted by the API server), the converted `resource` is tried
//! too, since that is the version the object in the review is encoded in.

use std::collections::BTreeMap;

use ivory_cel::image::alternative_spellings;
use ivory_cel::{Activation, NoHost};
use ivory_policy::compiled::{CompiledPolicy, ImageMatcher};
use serde_json::Value;

use crate::admission::{AdmissionRequest, AdmittedObject, GroupVersionResource};
use crate::matching::MatchError;

pub use crate::admission::object::IMAGE_VOLUMES;

/// Keys of the image map, in the order pointers are reported.
pub const IMAGE_FIELDS: [&str; 4] = [
    "initContainers",
    "containers",
    "ephemeralContainers",
    IMAGE_VOLUMES,
];

const POD_SPEC: &str = "/spec";
const TEMPLATE_SPEC: &str = "/spec/template/spec";
const CRONJOB_SPEC: &str = "/spec/jobTemplate/spec/template/spec";

/// Where the pod spec lives for a GVR the validating extractors know
/// (`docs/kyverno-semantics.md` §8).
fn pod_spec_for_gvr(gvr: &GroupVersionResource) -> Option<&'static str> {
    match (
        gvr.group.as_str(),
        gvr.version.as_str(),
        gvr.resource.as_str(),
    ) {
        ("", "v1", "pods") => Some(POD_SPEC),
        ("apps", "v1", "deployments" | "statefulsets" | "daemonsets" | "replicasets")
        | ("batch", "v1", "jobs") => Some(TEMPLATE_SPEC),
        ("batch", "v1", "cronjobs") => Some(CRONJOB_SPEC),
        _ => None,
    }
}

/// Where the pod spec lives for a kind the digest-pinning extractor knows
/// (`docs/kyverno-semantics.md` §8).
fn pod_spec_for_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some(POD_SPEC),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => Some(TEMPLATE_SPEC),
        "CronJob" => Some(CRONJOB_SPEC),
        _ => None,
    }
}

/// The built-in `images` map for validation: `containers`, `initContainers`,
/// `ephemeralContainers` and `imageVolumes`, each always present for a known GVR (possibly empty), taken from
/// `object` or, when there is none (DELETE), `oldObject`. Unknown GVRs give an empty map: only
/// `spec.images` extractors apply to them.
pub fn builtin_images(req: &AdmissionRequest) -> BTreeMap<String, Vec<String>> {
    let mut map = BTreeMap::new();
    for_each_builtin_list(req, |field, images| {
        let images = images
            .iter()
            .map(|(_, image)| (*image).to_owned())
            .collect();
        map.insert(field.to_owned(), images);
    });
    map
}

/// What [`builtin_images`] holds, one extractor at a time in [`IMAGE_FIELDS`] order, without
/// copying it: `false` (and no call) for a GVR with no pod spec.
pub(crate) fn for_each_builtin_list<'r>(
    req: &'r AdmissionRequest,
    mut each: impl FnMut(&'static str, &[(usize, &'r str)]),
) -> bool {
    let spec =
        pod_spec_for_gvr(req.original_resource()).or_else(|| pod_spec_for_gvr(&req.resource));
    let Some(spec) = spec else {
        return false;
    };
    for field in IMAGE_FIELDS {
        each(field, &images_in(req.subject(), spec, field));
    }
    true
}

/// One image field found in an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageAt {
    /// JSON pointer of the `image` field, e.g. `/spec/template/spec/containers/0/image`.
    pub pointer: String,
    /// The image exactly as written.
    pub image: String,
    /// `containers`, `initContainers`, `ephemeralContainers` or `imageVolumes`.
    pub field: &'static str,
}

/// Every container and image-volume image of `object` (of kind `kind`) with its JSON pointer,
/// for digest pinning. Unknown kinds have none. Entries without a string image are skipped.
pub fn image_pointers(object: &AdmittedObject, kind: &str) -> Vec<ImageAt> {
    let Some(spec) = pod_spec_for_kind(kind) else {
        return Vec::new();
    };
    IMAGE_FIELDS
        .iter()
        .flat_map(|field| {
            let (list, inner) = location(field);
            let found = images_in(Some(object), spec, field);
            found.into_iter().map(move |(index, image)| ImageAt {
                pointer: format!("{spec}/{}/{index}{inner}", escape_pointer_token(list)),
                image: image.to_owned(),
                field,
            })
        })
        .collect()
}

/// `(list in the pod spec, pointer to the image inside one entry)` of an image-map key.
fn location(field: &'static str) -> (&'static str, &'static str) {
    if field == IMAGE_VOLUMES {
        ("volumes", "/image/reference")
    } else {
        (field, "/image")
    }
}

/// `(index, image)` of each entry of `<spec>/<list>` that has a string image; the index is the
/// entry's position in the list (volumes without an image still count). Read from the
/// object's summary, or from its tree when it has none.
fn images_in<'v>(
    object: Option<&'v AdmittedObject>,
    spec: &str,
    field: &'static str,
) -> Vec<(usize, &'v str)> {
    let Some(object) = object else {
        return Vec::new();
    };
    match object.summary() {
        Some(summary) => summary
            .pod_spec(spec)
            .map(|pod| pod.images(field))
            .unwrap_or_default(),
        None => images_in_tree(object.value(), spec, field),
    }
}

/// [`images_in`] read from the JSON tree, leniently: a field of another type reads as absent.
pub(crate) fn images_in_tree<'v>(
    object: &'v Value,
    spec: &str,
    field: &'static str,
) -> Vec<(usize, &'v str)> {
    let (list, inner) = location(field);
    object
        .pointer(spec)
        .and_then(|s| s.get(list))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(move |(i, entry)| {
            entry
                .pointer(inner)
                .and_then(Value::as_str)
                .map(|image| (i, image))
        })
        .collect()
}

/// RFC 6901 escaping of one reference token.
pub fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Whether `image` is selected by the policy's `matchImageReferences`: any glob or CEL
/// expression (with `ref` bound to the image) matching selects it; an empty list selects every
/// image. Entries are tried in order and the first evaluation error is returned.
///
/// The image is tried as written first (Kyverno), then under its other spellings
/// ([`ivory_cel::image::alternative_spellings`]: canonical host, Docker Hub aliases and
/// `library/`, Kyverno's normalised form), so `GHCR.IO/acme/app` or `busybox@sha256:…` cannot
/// slip past a glob naming `ghcr.io/acme/*` or `docker.io/*`. Matching more images only ever
/// means checking more images, so this is stricter than Kyverno on purpose.
pub fn matches_image(policy: &CompiledPolicy, image: &str) -> Result<bool, MatchError> {
    if policy.image_matchers.is_empty() {
        return Ok(true);
    }
    if matches_spelling(policy, image, image)? {
        return Ok(true);
    }
    for spelling in alternative_spellings(image) {
        if matches_spelling(policy, image, &spelling)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether one spelling of `image` is selected; errors name the image as written.
fn matches_spelling(
    policy: &CompiledPolicy,
    image: &str,
    spelling: &str,
) -> Result<bool, MatchError> {
    for (index, matcher) in policy.image_matchers.iter().enumerate() {
        let matched = match matcher {
            ImageMatcher::Glob { matcher, .. } => matcher.is_match(spelling),
            ImageMatcher::Expression(program) => {
                let mut act = Activation::new(&NoHost);
                act.bind_json("ref", &Value::String(spelling.to_owned()));
                program
                    .evaluate_bool(&act)
                    .map_err(|e| MatchError::ImageReference {
                        index,
                        image: image.to_owned(),
                        message: e.to_string(),
                    })?
            }
        };
        if matched {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether the policy may select some image on `host` (a registry an audit lists): a glob
/// whose literal start (before its first wildcard) is compatible with `host/`; an expression,
/// or no matcher, may select any. Errs on the side of "may": it only widens what is tried.
pub fn may_select_on_host(policy: &CompiledPolicy, host: &str) -> bool {
    let prefix = format!("{host}/");
    policy.image_matchers.is_empty()
        || policy.image_matchers.iter().any(|m| match m {
            ImageMatcher::Glob { pattern, .. } => {
                let literal = pattern
                    .split(['*', '?', '[', '{'])
                    .next()
                    .unwrap_or_default();
                prefix.starts_with(literal) || literal.starts_with(&prefix)
            }
            ImageMatcher::Expression(_) => true,
        })
}

/// Whether the policy selects images of the repository `reference` (`host/repo`), with or
/// without a tag ([`matches_image`]; an expression that errs selects nothing).
pub fn selects_repository(policy: &CompiledPolicy, reference: &str) -> bool {
    [reference.to_owned(), format!("{reference}:latest")]
        .iter()
        .any(|image| matches_image(policy, image).unwrap_or(false))
}

/// Keeps only the images the policy selects; every key stays present (possibly empty), as the
/// CEL `images` variable requires.
pub fn filter_images(
    policy: &CompiledPolicy,
    images: &BTreeMap<String, Vec<String>>,
) -> Result<BTreeMap<String, Vec<String>>, MatchError> {
    let filtered = filter_images_by(images, |image| matches_image(policy, image))?;
    Ok(filtered.unwrap_or_else(|| images.clone()))
}

/// [`filter_images`] with the policy's selection answered by `selects` (which may remember
/// its answers; asked once per image): `None` when it selects every image, so that a caller
/// holding the map shared can keep sharing it.
pub(crate) fn filter_images_by(
    images: &BTreeMap<String, Vec<String>>,
    mut selects: impl FnMut(&str) -> Result<bool, MatchError>,
) -> Result<Option<BTreeMap<String, Vec<String>>>, MatchError> {
    let mut kept = Vec::new();
    for image in images.values().flatten() {
        kept.push(selects(image)?);
    }
    if kept.iter().all(|k| *k) {
        return Ok(None);
    }
    let mut kept = kept.into_iter();
    // Inserted one by one: the keys come sorted, and collecting would sort them again.
    let mut filtered = BTreeMap::new();
    for (key, list) in images {
        let list = list
            .iter()
            .filter(|_| kept.next().unwrap_or(false))
            .cloned()
            .collect();
        filtered.insert(key.clone(), list);
    }
    Ok(Some(filtered))
}

#[cfg(test)]
mod tests;
