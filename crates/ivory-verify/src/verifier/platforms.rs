//! What must be signed in a multi-platform image (the policy's `ivory.dev/verify-platforms`):
//! every platform manifest of the index, or those the Pod can run on. Each selected manifest
//! is verified as an image of its own, by digest, so through the same verdict cache, coalescing
//! and caps as any image; all must verify. The index's children are cached by digest and
//! credential set (an index is content-addressed: its children never change).

use std::sync::Arc;

use ivory_engine::verifier::{
    ImageReference, PlatformScope, PlatformSet, Verification, VerifyError, VerifyRequest,
};
use ivory_registry::Credentials;
use serde_json::Value;
use tokio::time::Instant;

use super::CosignVerifier;
use super::cache::TagKey;
use crate::classify::map_error;
use crate::rejection::Rejection;

/// One platform manifest of an index: its digest and `os/architecture[/variant]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Child {
    pub(super) digest: String,
    pub(super) os: String,
    pub(super) architecture: String,
    pub(super) variant: Option<String>,
}

impl Child {
    fn platform(&self) -> String {
        match &self.variant {
            Some(v) => format!("{}/{}/{v}", self.os, self.architecture),
            None => format!("{}/{}", self.os, self.architecture),
        }
    }
}

/// Platform manifests of one index ivory verifies at most. Real indexes list a handful; an
/// index a registry fills with thousands (a manifest may hold ~30,000 entries within its byte
/// cap) must not fan one admission out into thousands of verifications, nor fill the index
/// cache: past this the image is not verified, and at most this many + 1 children are kept.
pub(super) const MAX_PLATFORM_MANIFESTS: usize = 64;

/// The platform manifests of an index a kubelet can pick: entries with a platform that is not
/// `unknown` (BuildKit's attestation manifests say `unknown/unknown`); at most
/// [`MAX_PLATFORM_MANIFESTS`] + 1 of them, so that too many can still be told.
pub(super) fn runnable_children(index: &Value) -> Vec<Child> {
    index
        .get("manifests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let digest = entry.get("digest")?.as_str()?;
            let platform = entry.get("platform")?;
            let part = |key: &str| platform.get(key).and_then(Value::as_str);
            let (os, architecture) = (part("os")?, part("architecture")?);
            if os == "unknown" || architecture == "unknown" {
                return None;
            }
            Some(Child {
                digest: digest.to_owned(),
                os: os.to_owned(),
                architecture: architecture.to_owned(),
                variant: part("variant").map(str::to_owned),
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
            .filter(|c| set.contains(&c.os, &c.architecture))
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
                            platform: child.platform(),
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
        let children = manifest
            .is_index()
            .then(|| Arc::new(runnable_children(&manifest.json)));
        self.inner.indexes.insert(key, children.clone());
        Ok(children)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn attestation_manifests_and_entries_without_a_platform_are_not_runnable() {
        let index = json!({"manifests": [
            {"digest": "sha256:a", "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {"digest": "sha256:b", "platform": {"os": "unknown", "architecture": "unknown"}},
            {"digest": "sha256:c"},
            {"digest": "sha256:d", "platform": {"os": "windows", "architecture": "amd64"}},
        ]});
        let children = runnable_children(&index);
        let platforms: Vec<String> = children.iter().map(Child::platform).collect();
        assert_eq!(platforms, ["linux/arm64/v8", "windows/amd64"]);
        assert_eq!(children[1].digest, "sha256:d");
    }

    #[test]
    fn an_index_keeps_at_most_one_child_past_the_cap() {
        let entries: Vec<Value> = (0..1000)
            .map(|n| json!({"digest": format!("sha256:{n}"), "platform": {"os": "linux", "architecture": format!("a{n}")}}))
            .collect();
        let children = runnable_children(&json!({ "manifests": entries }));
        assert_eq!(children.len(), MAX_PLATFORM_MANIFESTS + 1);
    }
}
