//! What must be signed in a multi-platform image (the policy's `ivory.dev/verify-platforms`):
//! every platform manifest of the index, or those the Pod can run on. Each selected manifest
//! is verified as an image of its own, by digest, so through the same verdict cache, coalescing
//! and caps as any image; all must verify. The index's children are cached by digest and
//! credential set (an index is content-addressed: its children never change).
//!
//! Platforms are read as containerd reads them when it picks the manifest a node runs
//! (`containerd/platforms`' `Normalize`): case-insensitive, architecture aliases folded
//! (`x86_64` is `amd64`, `aarch64` is `arm64`, ...), an entry without a `platform` placed by its
//! image config, nested indexes descended into. What ivory cannot place counts as every
//! platform, so it must verify.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::sync::Arc;

use futures::StreamExt;
use ivory_engine::verifier::{
    ImageReference, PlatformScope, PlatformSet, Verification, VerifyError, VerifyRequest,
};
use ivory_registry::{
    Credentials, DOCKER_MANIFEST_LIST, JsonLimits, MAX_INDEX_DEPTH, OCI_INDEX, parse_json_bounded,
};
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::CosignVerifier;
use super::cache::TagKey;
use crate::classify::map_error;
use crate::rejection::Rejection;

/// A platform as containerd matches it: each part normalized; `None` where ivory cannot tell
/// it, which matches any value (an entry ivory cannot place must verify whatever the Pod runs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Platform {
    os: Option<String>,
    architecture: Option<String>,
    variant: Option<String>,
}

impl Platform {
    /// `os`, `architecture` and `variant` as written (an index entry's `platform`, an image
    /// config), normalized as containerd's `platforms.Normalize` does.
    fn normalized(os: &str, architecture: &str, variant: &str) -> Self {
        let os = match os.to_lowercase() {
            o if o == "macos" => "darwin".to_owned(),
            o => o,
        };
        let (architecture, variant) =
            normalized_architecture(architecture.to_lowercase(), variant.to_lowercase());
        let told = |s: String| (!s.is_empty()).then_some(s);
        Self {
            // containerd reads an empty OS as its host's: any node's.
            os: told(os),
            // An empty architecture runs on no node; read as any, so that it must verify.
            architecture: told(architecture),
            variant: told(variant),
        }
    }

    /// The platform an object with `os`/`architecture`/`variant` fields (an index entry's
    /// `platform`, an image config) names; any when one of them is not a string (containerd
    /// could not read that index or config at all).
    fn of_object(object: &Map<String, Value>) -> Self {
        let text = |key: &str| match object.get(key) {
            None | Some(Value::Null) => Some(""),
            Some(value) => value.as_str(),
        };
        match (text("os"), text("architecture"), text("variant")) {
            (Some(os), Some(architecture), Some(variant)) => {
                Self::normalized(os, architecture, variant)
            }
            _ => Self::default(),
        }
    }

    /// BuildKit's attestation manifests say `unknown/unknown`: no node runs them.
    fn is_unknown(&self) -> bool {
        self.os.as_deref() == Some("unknown") || self.architecture.as_deref() == Some("unknown")
    }

    /// Whether a node of a platform in `set` could run a manifest of this platform; a part
    /// ivory cannot tell is whatever the set allows.
    fn runs_on(&self, set: &PlatformSet) -> bool {
        let allows =
            |allowed: &Option<BTreeSet<String>>, part: &Option<String>| match (allowed, part) {
                (Some(allowed), Some(part)) => allowed.contains(part),
                _ => true,
            };
        allows(&set.os, &self.os) && allows(&set.architecture, &self.architecture)
    }
}

impl fmt::Display for Platform {
    /// `os/architecture[/variant]`, `*` for a part ivory cannot tell.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |p: &Option<String>| p.clone().unwrap_or_else(|| "*".to_owned());
        write!(f, "{}/{}", part(&self.os), part(&self.architecture))?;
        match &self.variant {
            Some(variant) => write!(f, "/{variant}"),
            None => Ok(()),
        }
    }
}

/// containerd's architecture aliases and variant defaults (`platforms.normalizeArch`), on
/// lower-cased input.
fn normalized_architecture(architecture: String, variant: String) -> (String, String) {
    match architecture.as_str() {
        "i386" => ("386".to_owned(), String::new()),
        "x86_64" | "x86-64" | "amd64" => {
            let variant = if variant == "v1" {
                String::new()
            } else {
                variant
            };
            ("amd64".to_owned(), variant)
        }
        "aarch64" | "arm64" => {
            let variant = match variant.as_str() {
                "8" | "v8" | "v8.0" => String::new(),
                "9" | "9.0" | "v9.0" => "v9".to_owned(),
                _ => variant,
            };
            ("arm64".to_owned(), variant)
        }
        "armhf" => ("arm".to_owned(), "v7".to_owned()),
        "armel" => ("arm".to_owned(), "v6".to_owned()),
        "arm" => {
            let variant = match variant.as_str() {
                "" | "7" => "v7".to_owned(),
                "5" | "6" | "8" => format!("v{variant}"),
                _ => variant,
            };
            ("arm".to_owned(), variant)
        }
        _ => (architecture, variant),
    }
}

/// One platform manifest of an index: its digest and the platform containerd places it on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Child {
    pub(super) digest: String,
    pub(super) platform: Platform,
}

/// Platform manifests of one index ivory verifies at most. Real indexes list a handful; an
/// index a registry fills with thousands (a manifest may hold ~30,000 entries within its byte
/// cap) must not fan one admission out into thousands of verifications, nor fill the index
/// cache: past this the image is not verified, and at most this many + 1 children are kept.
pub(super) const MAX_PLATFORM_MANIFESTS: usize = 64;

/// Image configs read at once to place an index's entries that have no `platform`.
const CONFIGS_AT_ONCE: usize = 8;

/// An index entry a node may run: its digest and its written platform, `None` when the entry
/// has none (containerd then places it by its image config); `nested` when its descriptor says
/// it is an index (containerd descends into it).
#[derive(Debug)]
struct Entry {
    digest: String,
    written: Option<Platform>,
    nested: bool,
}

/// The entries of an index a kubelet can pick: all but those whose platform says `unknown`
/// (BuildKit's attestation manifests); at most [`MAX_PLATFORM_MANIFESTS`] + 1 of them, so that
/// too many can still be told. An entry without a digest cannot be pulled and is left out.
fn candidate_entries(index: &Value) -> Vec<Entry> {
    index
        .get("manifests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let digest = entry.get("digest")?.as_str()?;
            let written = match entry.get("platform") {
                None | Some(Value::Null) => None,
                Some(Value::Object(platform)) => Some(Platform::of_object(platform)),
                Some(_) => Some(Platform::default()),
            };
            if written.as_ref().is_some_and(Platform::is_unknown) {
                return None;
            }
            let media_type = entry.get("mediaType").and_then(Value::as_str);
            Some(Entry {
                digest: digest.to_owned(),
                written,
                nested: media_type.is_some_and(|t| t == OCI_INDEX || t == DOCKER_MANIFEST_LIST),
            })
        })
        .take(MAX_PLATFORM_MANIFESTS + 1)
        .collect()
}

impl CosignVerifier {
    /// [`VerifyRequest`] under [`PlatformScope::Platforms`]: a single manifest is verified as
    /// itself; for an index, each runnable manifest in `set` must verify. `fresh_since` as for
    /// [`CosignVerifier::verify_request`].
    pub(super) async fn verify_platforms(
        &self,
        request: &VerifyRequest,
        set: &PlatformSet,
        deadline: Instant,
        fresh_since: Option<Instant>,
    ) -> Result<Verification, VerifyError> {
        let image = &request.image;
        let creds = (self.inner.credentials)(request.credentials.as_ref());
        let digest = self.resolve(image, &creds, deadline).await?;
        let name = image.repository_name();
        let manifest_of = |digest: &str| {
            super::sibling(name, '@', digest)
                .map_err(|e| map_error(image, "fetching the manifest", e, deadline))
        };
        let pinned = manifest_of(&digest)?;
        let as_image = |image: ImageReference| VerifyRequest {
            image,
            platforms: PlatformScope::Index,
            ..request.clone()
        };
        let Some(children) = self
            .index_children(image, &pinned, &creds, deadline)
            .await?
        else {
            return self
                .verify_request(&as_image(pinned), deadline, fresh_since)
                .await;
        };
        if children.len() > MAX_PLATFORM_MANIFESTS {
            return Ok(Verification::NotVerified {
                digest: Some(digest),
                reason: Rejection::TooManyPlatforms {
                    limit: MAX_PLATFORM_MANIFESTS,
                },
            });
        }
        let selected: Vec<&Child> = children
            .iter()
            .filter(|c| c.platform.runs_on(set))
            .collect();
        if selected.is_empty() {
            return Ok(Verification::NotVerified {
                digest: Some(digest),
                reason: Rejection::NoPlatformManifest {
                    platforms: set.describe(),
                },
            });
        }
        let mut requests = Vec::with_capacity(selected.len());
        for child in selected {
            requests.push((child, as_image(manifest_of(&child.digest)?)));
        }
        let answers =
            futures::future::join_all(requests.iter().map(|(child, request)| async move {
                let answer = self.verify_request(request, deadline, fresh_since).await;
                (*child, answer)
            }))
            .await;
        let mut first = None;
        for (child, answer) in answers {
            match answer? {
                Verification::Verified {
                    payload, signer, ..
                } => {
                    first.get_or_insert((payload, signer));
                }
                Verification::NotVerified { reason, .. } => {
                    return Ok(Verification::NotVerified {
                        digest: Some(digest),
                        reason: Rejection::Platform {
                            platform: child.platform.to_string(),
                            digest: child.digest.clone(),
                            reason: Box::new(reason),
                        },
                    });
                }
            }
        }
        let (payload, signer) = first.unwrap_or_default();
        Ok(Verification::Verified {
            digest,
            payload,
            signer,
        })
    }

    /// The runnable children of the index `pinned` names, `None` when it is a single manifest.
    async fn index_children(
        &self,
        image: &ImageReference,
        pinned: &ImageReference,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Option<Arc<Vec<Child>>>, VerifyError> {
        let key = TagKey {
            reference: pinned.original().to_owned(),
            credentials: creds.clone(),
        };
        if let Some(children) = self.inner.indexes.get(&key) {
            return Ok(children);
        }
        let manifest = self
            .inner
            .registry
            .fetch_manifest(pinned, creds, deadline)
            .await
            .map_err(|e| map_error(image, "fetching the manifest", e, deadline))?;
        let children = match manifest.is_index() {
            true => Some(Arc::new(
                self.placed_children(image, &manifest.json, creds, deadline)
                    .await?,
            )),
            false => None,
        };
        self.inner.indexes.insert(key, children.clone());
        Ok(children)
    }

    /// The children of `index` a node may run, each placed where containerd places it: by its
    /// written platform, else by its image config. More than [`MAX_PLATFORM_MANIFESTS`]
    /// candidates are kept unplaced (the image is not verified; no config is read for them).
    async fn placed_children(
        &self,
        image: &ImageReference,
        index: &Value,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Vec<Child>, VerifyError> {
        let entries = self
            .flattened_entries(image, index, creds, deadline)
            .await?;
        if entries.len() > MAX_PLATFORM_MANIFESTS {
            return Ok(entries
                .into_iter()
                .map(|e| Child {
                    digest: e.digest,
                    platform: e.written.unwrap_or_default(),
                })
                .collect());
        }
        let placed: Vec<Result<Child, VerifyError>> = futures::stream::iter(entries)
            .map(|entry| async move {
                let platform = match entry.written {
                    Some(platform) => platform,
                    None => {
                        self.platform_by_config(image, &entry.digest, creds, deadline)
                            .await?
                    }
                };
                Ok(Child {
                    digest: entry.digest,
                    platform,
                })
            })
            .buffered(CONFIGS_AT_ONCE)
            .collect()
            .await;
        let mut children = Vec::with_capacity(placed.len());
        for child in placed {
            let child = child?;
            if !child.platform.is_unknown() {
                children.push(child);
            }
        }
        Ok(children)
    }

    /// The entries of `index` and, as containerd descends into nested indexes, theirs (an
    /// index signed as a whole vouches for none of its platforms). Each nested index counts
    /// against [`MAX_PLATFORM_MANIFESTS`] as an entry would, so that past it the result holds
    /// more than that many (the image is then not verified) and no more are fetched; nesting
    /// deeper than [`MAX_INDEX_DEPTH`] is refused as hostile.
    async fn flattened_entries(
        &self,
        image: &ImageReference,
        index: &Value,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Vec<Entry>, VerifyError> {
        let mut entries = Vec::new();
        let mut nested = Vec::new();
        let mut seen = HashSet::new();
        let mut pending = vec![(candidate_entries(index), 0)];
        while let Some((level, depth)) = pending.pop() {
            for entry in level {
                if entries.len() + nested.len() > MAX_PLATFORM_MANIFESTS {
                    entries.append(&mut nested);
                    return Ok(entries);
                }
                if !entry.nested {
                    entries.push(entry);
                    continue;
                }
                if depth >= MAX_INDEX_DEPTH {
                    return Err(VerifyError::Hostile {
                        image: image.original().to_owned(),
                        registry: image.registry().to_owned(),
                        message: format!("image index nesting deeper than {MAX_INDEX_DEPTH}"),
                    });
                }
                if !seen.insert(entry.digest.clone()) {
                    continue;
                }
                let fail = |e| map_error(image, "fetching a nested image index", e, deadline);
                let reference =
                    super::sibling(image.repository_name(), '@', &entry.digest).map_err(fail)?;
                let manifest = self
                    .inner
                    .registry
                    .fetch_manifest(&reference, creds, deadline)
                    .await
                    .map_err(fail)?;
                if manifest.is_index() {
                    pending.push((candidate_entries(&manifest.json), depth + 1));
                    nested.push(entry);
                } else {
                    // Not an index after all (containerd refuses it): verified as itself.
                    entries.push(entry);
                }
            }
        }
        Ok(entries)
    }

    /// Where containerd places the index entry `digest` that has no `platform`: the `os`,
    /// `architecture` and `variant` of its image config, fetched under the signature byte cap.
    /// Any platform when that cannot be read (an index, no config, not a JSON object): the
    /// entry must then verify whatever the Pod runs on. A registry error is the verification's.
    async fn platform_by_config(
        &self,
        image: &ImageReference,
        digest: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Platform, VerifyError> {
        let fail = |e| map_error(image, "reading the config of an index entry", e, deadline);
        let registry = &self.inner.registry;
        let child = super::sibling(image.repository_name(), '@', digest).map_err(fail)?;
        let manifest = registry
            .fetch_manifest(&child, creds, deadline)
            .await
            .map_err(fail)?;
        let config = match manifest.is_index() {
            true => None,
            false => manifest
                .json
                .pointer("/config/digest")
                .and_then(Value::as_str),
        };
        let Some(config) = config else {
            return Ok(Platform::default());
        };
        let bytes = registry
            .fetch_blob(
                &child,
                config,
                self.inner.config.max_signature_bytes,
                creds,
                deadline,
            )
            .await
            .map_err(fail)?;
        Ok(match parse_json_bounded(&bytes, &JsonLimits::SIGNATURE) {
            Ok(Value::Object(config)) => Platform::of_object(&config),
            _ => Platform::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn written(index: &Value) -> Vec<(String, Option<String>)> {
        candidate_entries(index)
            .into_iter()
            .map(|e| (e.digest, e.written.map(|p| p.to_string())))
            .collect()
    }

    #[test]
    fn attestation_manifests_are_left_out_and_entries_without_a_platform_are_kept_to_place() {
        let index = json!({"manifests": [
            {"digest": "sha256:a", "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {"digest": "sha256:b", "platform": {"os": "unknown", "architecture": "unknown"}},
            {"digest": "sha256:c"},
            {"digest": "sha256:d", "platform": {"os": "windows", "architecture": "amd64"}},
            {"digest": "sha256:e", "platform": null},
            {"digest": "sha256:f", "platform": {"os": "Unknown", "architecture": "UNKNOWN"}},
            {"platform": {"os": "linux", "architecture": "amd64"}},
        ]});
        assert_eq!(
            written(&index),
            [
                ("sha256:a".to_owned(), Some("linux/arm64".to_owned())),
                ("sha256:c".to_owned(), None),
                ("sha256:d".to_owned(), Some("windows/amd64".to_owned())),
                ("sha256:e".to_owned(), None),
            ]
        );
    }

    /// containerd's `platforms.Normalize`, spelling by spelling.
    #[test]
    fn platforms_are_normalized_as_containerd_normalizes_them() {
        let cases = [
            (("linux", "x86_64", ""), "linux/amd64"),
            (("Linux", "AMD64", ""), "linux/amd64"),
            (("LINUX", "x86-64", "v1"), "linux/amd64"),
            (("linux", "amd64", "V3"), "linux/amd64/v3"),
            (("linux", "aarch64", ""), "linux/arm64"),
            (("linux", "ARM64", "v8"), "linux/arm64"),
            (("linux", "arm64", "8"), "linux/arm64"),
            (("linux", "arm64", "9.0"), "linux/arm64/v9"),
            (("linux", "i386", "whatever"), "linux/386"),
            (("linux", "armhf", ""), "linux/arm/v7"),
            (("linux", "armel", ""), "linux/arm/v6"),
            (("linux", "arm", ""), "linux/arm/v7"),
            (("linux", "arm", "6"), "linux/arm/v6"),
            (("MacOS", "arm64", ""), "darwin/arm64"),
            (("Windows", "AMD64", ""), "windows/amd64"),
            (("linux", "s390x", ""), "linux/s390x"),
            (("", "amd64", ""), "*/amd64"),
            (("linux", "", ""), "linux/*"),
        ];
        for ((os, architecture, variant), want) in cases {
            let platform = Platform::normalized(os, architecture, variant);
            assert_eq!(platform.to_string(), want, "{os}/{architecture}/{variant}");
        }
        let unreadable = Platform::of_object(
            json!({"os": "linux", "architecture": 64})
                .as_object()
                .unwrap(),
        );
        assert_eq!(
            unreadable,
            Platform::default(),
            "a number is no architecture"
        );
    }

    #[test]
    fn a_part_ivory_cannot_tell_runs_wherever_the_pod_may() {
        let pod = PlatformSet {
            os: Some(["linux".to_owned()].into()),
            architecture: Some(["arm64".to_owned()].into()),
        };
        let runs = |os, architecture| Platform::normalized(os, architecture, "").runs_on(&pod);
        assert!(runs("linux", "aarch64"));
        assert!(runs("Linux", "ARM64"));
        assert!(!runs("linux", "x86_64"));
        assert!(!runs("windows", "arm64"));
        assert!(runs("", "arm64"), "no OS: containerd reads its host's");
        assert!(runs("linux", ""));
        assert!(!runs("", "amd64"));
        assert!(Platform::default().runs_on(&pod));
    }

    #[test]
    fn an_index_keeps_at_most_one_child_past_the_cap() {
        let entries: Vec<Value> = (0..1000)
            .map(|n| json!({"digest": format!("sha256:{n}"), "platform": {"os": "linux", "architecture": format!("a{n}")}}))
            .collect();
        let children = candidate_entries(&json!({ "manifests": entries }));
        assert_eq!(children.len(), MAX_PLATFORM_MANIFESTS + 1);
        let unplaced: Vec<Value> = (0..1000)
            .map(|n| json!({"digest": format!("sha256:{n}")}))
            .collect();
        let children = candidate_entries(&json!({ "manifests": unplaced }));
        assert_eq!(
            children.len(),
            MAX_PLATFORM_MANIFESTS + 1,
            "entries without a platform count"
        );
    }
}
