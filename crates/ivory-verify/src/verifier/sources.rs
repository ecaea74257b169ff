//! Where an image's signatures live and how they are read: cosign's `.sig`/`.att` tag (layers
//! fetched in parallel) and Sigstore bundles among the OCI referrers. Reading is bounded by
//! `VerifierConfig::max_signatures` and `max_signature_bytes`; which source is read first is
//! the verifier's decision (`CosignVerifier::load_verdict`).

use futures::future::join_all;
use ivory_engine::verifier::{ImageReference, VerifyError};
use ivory_registry::{Credentials, Error as RegistryError};
use serde_json::Value;
use tokio::time::Instant;

use super::CosignVerifier;
use crate::classify::map_error;
use crate::envelope::{
    BUNDLE_MEDIA_TYPE_PREFIX, DSSE_MEDIA_TYPE, Envelope, Legacy, SIMPLE_SIGNING_MEDIA_TYPE,
};

/// Which signature family to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Family {
    Signatures,
    Attestations,
}

/// Where signatures are attached to an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// cosign's `sha256-<hex>.sig` / `.att` tag (cosign v2, `--new-bundle-format=false`).
    CosignTag,
    /// Sigstore bundles as OCI referrers (cosign v3, sigstore-js).
    Referrers,
}

impl Source {
    pub(super) fn other(self) -> Self {
        match self {
            Self::CosignTag => Self::Referrers,
            Self::Referrers => Self::CosignTag,
        }
    }
}

/// The signatures of one digest: repository (maybe `source.repository`), tag prefix, family.
#[derive(Clone)]
pub(super) struct SignatureLocation {
    pub(super) repo: String,
    pub(super) prefix: String,
    pub(super) digest: String,
    pub(super) family: Family,
}

impl SignatureLocation {
    /// Repository and tag prefix: where signatures of any digest of the image are looked up.
    pub(super) fn repo_key(&self) -> String {
        // Joined by hand: `format!` walks its template at run time, on every verdict lookup.
        let mut key = String::with_capacity(self.repo.len() + 1 + self.prefix.len());
        key.push_str(&self.repo);
        key.push('|');
        key.push_str(&self.prefix);
        key
    }
}

/// Signature candidates, and the first registry error met while collecting them.
pub(super) struct Fetched {
    pub(super) envelopes: Vec<Envelope>,
    pub(super) error: Option<VerifyError>,
}

impl CosignVerifier {
    /// Fetches the signature candidates of one source: the cosign tag (`.sig`/`.att`) and its
    /// layers, or the OCI referrers (API or tag schema) and each bundle.
    pub(super) async fn fetch(
        &self,
        image: &ImageReference,
        at: &SignatureLocation,
        source: Source,
        creds: &Credentials,
        deadline: Instant,
    ) -> Fetched {
        let repo = &at.repo;
        let (found, failure, operation) = match source {
            Source::CosignTag => {
                let suffix = match at.family {
                    Family::Signatures => "sig",
                    Family::Attestations => "att",
                };
                let tag = format!("{}{}.{suffix}", at.prefix, at.digest.replace(':', "-"));
                let (found, failure) = match super::sibling(repo, ':', &tag) {
                    Ok(tag_ref) => {
                        self.fetch_tagged(&tag_ref, at.family, creds, deadline)
                            .await
                    }
                    Err(e) => (Vec::new(), Some(e)),
                };
                (found, failure, "reading cosign signatures")
            }
            Source::Referrers => {
                let (found, failure) = match super::sibling(repo, '@', &at.digest) {
                    Ok(subject_ref) => {
                        self.fetch_bundles(repo, &subject_ref, creds, deadline)
                            .await
                    }
                    Err(e) => (Vec::new(), Some(e)),
                };
                (found, failure, "reading signature referrers")
            }
        };
        Fetched {
            envelopes: found,
            error: failure.map(|e| map_error(image, operation, e, deadline)),
        }
    }

    /// The cosign tag's layers: simple-signing (`.sig`) or DSSE (`.att`).
    async fn fetch_tagged(
        &self,
        tag_ref: &ImageReference,
        family: Family,
        creds: &Credentials,
        deadline: Instant,
    ) -> (Vec<Envelope>, Option<RegistryError>) {
        let registry = &self.inner.registry;
        let manifest =
            match absent_is_empty(registry.fetch_manifest(tag_ref, creds, deadline).await) {
                Ok(Some(m)) => m,
                Ok(None) => return (Vec::new(), None),
                Err(e) => return (Vec::new(), Some(e)),
            };
        let mut layers = manifest
            .json
            .get("layers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        layers.truncate(self.inner.config.max_signatures);
        let limit = self.inner.config.max_signature_bytes;
        let results = join_all(layers.iter().map(|layer| async move {
            let Some(d) = layer.get("digest").and_then(Value::as_str) else {
                return Ok(None);
            };
            let media = layer
                .get("mediaType")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let blob = registry
                .fetch_blob(tag_ref, d, limit, creds, deadline)
                .await?;
            let legacy =
                Legacy::from_annotations(blob, layer.get("annotations").and_then(Value::as_object));
            Ok(Some(match media {
                DSSE_MEDIA_TYPE => Envelope::Dsse(legacy),
                SIMPLE_SIGNING_MEDIA_TYPE => Envelope::SimpleSigning(legacy),
                _ if family == Family::Attestations => Envelope::Dsse(legacy),
                _ => Envelope::SimpleSigning(legacy),
            }))
        }))
        .await;
        collect(results)
    }

    /// Sigstore bundles among the image's OCI referrers.
    async fn fetch_bundles(
        &self,
        repo: &str,
        subject_ref: &ImageReference,
        creds: &Credentials,
        deadline: Instant,
    ) -> (Vec<Envelope>, Option<RegistryError>) {
        let registry = &self.inner.registry;
        let index =
            match absent_is_empty(registry.referrers(subject_ref, None, creds, deadline).await) {
                Ok(Some(i)) => i,
                Ok(None) => return (Vec::new(), None),
                Err(e) => return (Vec::new(), Some(e)),
            };
        let refs: Vec<String> = index
            .get("manifests")
            .and_then(Value::as_array)
            .map(|ms| {
                ms.iter()
                    .filter(|m| {
                        m.get("artifactType")
                            .and_then(Value::as_str)
                            .is_some_and(|t| t.starts_with(BUNDLE_MEDIA_TYPE_PREFIX))
                    })
                    .filter_map(|m| m.get("digest").and_then(Value::as_str).map(str::to_owned))
                    .take(self.inner.config.max_signatures)
                    .collect()
            })
            .unwrap_or_default();
        let limit = self.inner.config.max_signature_bytes;
        let results = join_all(refs.iter().map(|d| async move {
            let m = registry
                .fetch_manifest(&super::sibling(repo, '@', d)?, creds, deadline)
                .await?;
            let Some(ld) = m.json.pointer("/layers/0/digest").and_then(Value::as_str) else {
                return Ok(None);
            };
            let blob = registry
                .fetch_blob(subject_ref, ld, limit, creds, deadline)
                .await?;
            Ok(Some(Envelope::Bundle(blob)))
        }))
        .await;
        collect(results)
    }
}

/// Envelopes that arrived, and the first error among those that did not.
fn collect(
    results: Vec<Result<Option<Envelope>, RegistryError>>,
) -> (Vec<Envelope>, Option<RegistryError>) {
    let mut out = Vec::new();
    let mut error = None;
    for r in results {
        match r {
            Ok(Some(e)) => out.push(e),
            Ok(None) => {}
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    (out, error)
}

/// A missing tag or referrers list means "none", not an error.
pub(super) fn absent_is_empty<T>(r: Result<T, RegistryError>) -> Result<Option<T>, RegistryError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(RegistryError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_key_names_repository_and_tag_prefix_apart() {
        let at = |repo: &str, prefix: &str| SignatureLocation {
            repo: repo.to_owned(),
            prefix: prefix.to_owned(),
            digest: "sha256:00".to_owned(),
            family: Family::Signatures,
        };
        assert_eq!(
            at("ghcr.io/acme/app", "v2-").repo_key(),
            "ghcr.io/acme/app|v2-"
        );
        assert_eq!(at("ghcr.io/acme/app", "").repo_key(), "ghcr.io/acme/app|");
        assert_ne!(
            at("ghcr.io/acme/a", "pp").repo_key(),
            at("ghcr.io/acme/app", "").repo_key()
        );
    }
}
