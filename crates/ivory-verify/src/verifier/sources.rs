//! Where an image's signatures live and how they are read: cosign's `.sig`/`.att` tag (layers
//! fetched in parallel) and Sigstore bundles among the OCI referrers (every listed manifest,
//! judged by itself, whatever its descriptor says), and what each layout held (the account a
//! negative verdict carries, `Rejection::Searched`). Reading is bounded by
//! `VerifierConfig::max_signatures` and `max_signature_bytes`; which source is read first is
//! the verifier's decision (`CosignVerifier::load_verdict`).

use futures::future::join_all;
use ivory_engine::verifier::{ImageReference, VerifyError};
use ivory_registry::{Credentials, Error as RegistryError, Referrers, ReferrersVia};
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

/// Signature candidates, the first registry error met while collecting them, and what each
/// layout read held (the account a negative verdict carries).
pub(super) struct Fetched {
    pub(super) envelopes: Vec<Envelope>,
    pub(super) error: Option<VerifyError>,
    pub(super) looked: Vec<String>,
}

/// What one layout yielded: candidates, the first error, and what it held.
struct Read {
    envelopes: Vec<Envelope>,
    error: Option<RegistryError>,
    looked: Vec<String>,
}

impl Read {
    fn failed(layout: String, e: RegistryError) -> Self {
        Self {
            envelopes: Vec::new(),
            error: Some(e),
            looked: vec![format!("{layout}: unreadable")],
        }
    }
}

/// How a referrer manifest was judged once fetched.
enum Referrer {
    Bundle(Envelope),
    Other,
    /// Listed, but the registry no longer has it.
    Missing,
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
        // The account names the repository only when it is not the image's own.
        let place = if repo == image.repository_name() {
            String::new()
        } else {
            format!(" in {repo}")
        };
        let (read, operation) = match source {
            Source::CosignTag => {
                let suffix = match at.family {
                    Family::Signatures => "sig",
                    Family::Attestations => "att",
                };
                let tag = format!("{}{}.{suffix}", at.prefix, at.digest.replace(':', "-"));
                let layout = format!(".{suffix} tag {tag}{place}");
                let read = match super::sibling(repo, ':', &tag) {
                    Ok(tag_ref) => {
                        self.fetch_tagged(&tag_ref, at.family, layout, creds, deadline)
                            .await
                    }
                    Err(e) => Read::failed(layout, e),
                };
                (read, "reading cosign signatures")
            }
            Source::Referrers => {
                let read = match super::sibling(repo, '@', &at.digest) {
                    Ok(subject_ref) => {
                        self.fetch_bundles(repo, &subject_ref, &place, creds, deadline)
                            .await
                    }
                    Err(e) => Read::failed(format!("referrers{place}"), e),
                };
                (read, "reading signature referrers")
            }
        };
        Fetched {
            envelopes: read.envelopes,
            error: read.error.map(|e| map_error(image, operation, e, deadline)),
            looked: read.looked,
        }
    }

    /// The cosign tag's layers: simple-signing (`.sig`) or DSSE (`.att`).
    async fn fetch_tagged(
        &self,
        tag_ref: &ImageReference,
        family: Family,
        layout: String,
        creds: &Credentials,
        deadline: Instant,
    ) -> Read {
        let registry = &self.inner.registry;
        let manifest =
            match absent_is_empty(registry.fetch_manifest(tag_ref, creds, deadline).await) {
                Ok(Some(m)) => m,
                Ok(None) => {
                    return Read {
                        envelopes: Vec::new(),
                        error: None,
                        looked: vec![format!("{layout}: absent")],
                    };
                }
                Err(e) => return Read::failed(layout, e),
            };
        let mut layers = manifest
            .json
            .get("layers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let listed = layers.len();
        layers.truncate(self.inner.config.max_signatures);
        let kind = match family {
            Family::Signatures => "signature",
            Family::Attestations => "attestation",
        };
        let looked = vec![format!(
            "{layout}: {}{}",
            counted(listed, kind),
            left_unread(listed, layers.len())
        )];
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
        let (envelopes, error) = collect(results);
        Read {
            envelopes,
            error,
            looked,
        }
    }

    /// Sigstore bundles among the image's OCI referrers (API or fallback tag). Every listed
    /// manifest is a candidate whatever its descriptor says (writers label it with the
    /// bundle type, `application/vnd.oci.empty.v1+json` or nothing): each is fetched, at most
    /// `max_signatures` of them, those labelled as bundles first, and judged by its own
    /// artifactType, config and layer media types. Only a bundle's blob is fetched.
    async fn fetch_bundles(
        &self,
        repo: &str,
        subject_ref: &ImageReference,
        place: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Read {
        let registry = &self.inner.registry;
        let located = registry
            .referrers_located(subject_ref, None, creds, deadline)
            .await;
        let (index, mut looked, layout) = match located {
            Ok(Referrers {
                index,
                via: ReferrersVia::Api,
            }) => (index, Vec::new(), format!("referrers API{place}")),
            Ok(Referrers {
                index,
                via: ReferrersVia::FallbackTag { tag, present },
            }) => {
                let unsupported = format!("referrers API{place}: unsupported (404)");
                let layout = format!("fallback tag {tag}{place}");
                if !present {
                    return Read {
                        envelopes: Vec::new(),
                        error: None,
                        looked: vec![unsupported, format!("{layout}: absent")],
                    };
                }
                (index, vec![unsupported], layout)
            }
            Err(RegistryError::NotFound { .. }) => {
                return Read {
                    envelopes: Vec::new(),
                    error: None,
                    looked: vec![format!("referrers{place}: absent")],
                };
            }
            Err(e) => return Read::failed(format!("referrers{place}"), e),
        };
        let listed = candidates(&index);
        let refs: Vec<&str> = listed
            .iter()
            .copied()
            .take(self.inner.config.max_signatures)
            .collect();
        let limit = self.inner.config.max_signature_bytes;
        let results = join_all(refs.iter().map(|d| async move {
            let fetched = registry
                .fetch_manifest(&super::sibling(repo, '@', d)?, creds, deadline)
                .await;
            // A listed manifest since deleted is no evidence either way, not a failed read.
            let Some(m) = absent_is_empty(fetched)? else {
                return Ok(Referrer::Missing);
            };
            let Some(layer) = bundle_layer(&m.json) else {
                return Ok(Referrer::Other);
            };
            let blob = registry
                .fetch_blob(subject_ref, layer, limit, creds, deadline)
                .await?;
            Ok(Referrer::Bundle(Envelope::Bundle(blob)))
        }))
        .await;
        let (mut envelopes, mut others, mut missing, mut error) = (Vec::new(), 0, 0, None);
        for r in results {
            match r {
                Ok(Referrer::Bundle(e)) => envelopes.push(e),
                Ok(Referrer::Other) => others += 1,
                Ok(Referrer::Missing) => missing += 1,
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        let missing = if missing > 0 {
            format!(", {missing} missing")
        } else {
            String::new()
        };
        looked.push(format!(
            "{layout}: {}, {}, {}{missing}{}",
            counted(listed.len(), "manifest"),
            counted(envelopes.len(), "Sigstore bundle"),
            counted_other(others),
            left_unread(listed.len(), refs.len())
        ));
        Read {
            envelopes,
            error,
            looked,
        }
    }
}

/// The distinct manifest digests a referrers index lists, those whose descriptor is labelled
/// as a Sigstore bundle first. The label only orders the reading: it is never evidence, and an
/// unlabelled or relabelled descriptor is read too.
fn candidates(index: &Value) -> Vec<&str> {
    let entries = index
        .get("manifests")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let labelled = |m: &Value| {
        m.get("artifactType")
            .and_then(Value::as_str)
            .is_some_and(|t| t.starts_with(BUNDLE_MEDIA_TYPE_PREFIX))
    };
    let mut seen = std::collections::HashSet::new();
    let (first, rest): (Vec<&Value>, Vec<&Value>) = entries.iter().partition(|m| labelled(m));
    first
        .into_iter()
        .chain(rest)
        .filter_map(|m| m.get("digest").and_then(Value::as_str))
        .filter(|d| seen.insert(*d))
        .collect()
}

/// The digest of the Sigstore bundle a referrer manifest carries, judged by the manifest
/// itself: its first layer of a bundle media type, else its first layer when the manifest's
/// artifactType or config media type names a bundle; `None` for any other artifact (an SBOM, a
/// Notation signature).
fn bundle_layer(manifest: &Value) -> Option<&str> {
    let is_bundle = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .is_some_and(|t| t.starts_with(BUNDLE_MEDIA_TYPE_PREFIX))
    };
    let layers = manifest.get("layers").and_then(Value::as_array)?;
    let layer = match layers.iter().find(|l| is_bundle(l.get("mediaType"))) {
        Some(layer) => layer,
        None if is_bundle(manifest.get("artifactType"))
            || is_bundle(manifest.pointer("/config/mediaType")) =>
        {
            layers.first()?
        }
        None => return None,
    };
    layer.get("digest").and_then(Value::as_str)
}

/// `1 manifest`, `3 manifests`.
fn counted(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn counted_other(n: usize) -> String {
    if n == 1 {
        "1 other".to_owned()
    } else {
        format!("{n} others")
    }
}

/// ` (the first 50 read)` when the count cap left some unread.
fn left_unread(listed: usize, read: usize) -> String {
    if read < listed {
        format!(" (the first {read} read)")
    } else {
        String::new()
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
    use serde_json::json;

    const BUNDLE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
    const EMPTY: &str = "application/vnd.oci.empty.v1+json";

    #[test]
    fn every_listed_manifest_is_a_candidate_labelled_bundles_first_each_once() {
        let index = json!({"manifests": [
            {"digest": "sha256:aa", "artifactType": EMPTY},
            {"digest": "sha256:bb"},
            {"digest": "sha256:cc", "artifactType": BUNDLE},
            {"digest": "sha256:dd", "artifactType": "application/spdx+json"},
            {"digest": "sha256:aa", "artifactType": BUNDLE},
            {"artifactType": BUNDLE},
        ]});
        assert_eq!(
            candidates(&index),
            ["sha256:cc", "sha256:aa", "sha256:bb", "sha256:dd"]
        );
        assert!(candidates(&json!({})).is_empty());
    }

    #[test]
    fn a_referrer_is_judged_by_its_own_manifest() {
        let layer = |media: &str, digest: &str| json!({"mediaType": media, "digest": digest});
        // cosign v3: artifactType, empty config, bundle layer.
        let cosign = json!({"artifactType": BUNDLE, "config": {"mediaType": EMPTY},
            "layers": [layer(BUNDLE, "sha256:b1")]});
        assert_eq!(bundle_layer(&cosign), Some("sha256:b1"));
        // No artifactType: the layer's media type says it.
        let unlabelled = json!({"config": {"mediaType": EMPTY},
            "layers": [layer("text/plain", "sha256:t"), layer(BUNDLE, "sha256:b2")]});
        assert_eq!(bundle_layer(&unlabelled), Some("sha256:b2"));
        // The bundle type on the config (older writers), any layer type.
        let config = json!({"config": {"mediaType": BUNDLE},
            "layers": [layer("application/octet-stream", "sha256:b3")]});
        assert_eq!(bundle_layer(&config), Some("sha256:b3"));
        // An SBOM, a Notation signature, an index: not a bundle, no blob read.
        let sbom = json!({"artifactType": "application/spdx+json", "config": {"mediaType": EMPTY},
            "layers": [layer("application/spdx+json", "sha256:s")]});
        let notation = json!({"config": {"mediaType": "application/vnd.cncf.notary.signature"},
            "layers": [layer("application/jose+json", "sha256:n")]});
        let index = json!({"manifests": [{"digest": "sha256:x"}]});
        for other in [sbom, notation, index] {
            assert_eq!(bundle_layer(&other), None, "{other}");
        }
    }

    #[test]
    fn counts_read_as_words() {
        assert_eq!(counted(1, "manifest"), "1 manifest");
        assert_eq!(counted(0, "Sigstore bundle"), "0 Sigstore bundles");
        assert_eq!(counted_other(1), "1 other");
        assert_eq!(counted_other(2), "2 others");
        assert_eq!(left_unread(70, 50), " (the first 50 read)");
        assert_eq!(left_unread(3, 3), "");
    }

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
