//! The async side: [`CosignVerifier`] implements the engine's `ImageVerifier` over
//! `ivory_registry::Registry`, with ivory's own caches.
//!
//! Request floor, once the registry host is known (auth probed once per host; a registry
//! without the referrers API, such as Distribution 2.8, remembered as such): a cold tag costs
//! HEAD, then the `.sig`/`.att` tag, then its signature blobs in parallel; a digest skips the
//! HEAD. The OCI referrers (API or `sha256-<hex>` tag schema, plus one manifest GET per bundle)
//! are read only when the cosign tag holds nothing that verifies, or first where a
//! repository's signatures were last found there. A warm (digest, attestor set, attestation)
//! costs nothing; concurrent identical misses share one fetch set.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt as _, join_all};
use ivory_engine::verifier::{ImageVerifier, Verification, VerifyError, VerifyRequest};
use ivory_policy::types::{Attestation, Attestor, Credentials as PolicyCredentials};
use ivory_registry::{
    Credentials, Error as RegistryError, JsonLimits, Registry, parse_json_bounded, parse_reference,
};
use moka::Expiry;
use moka::future::Cache;
use oci_client::Reference;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

use crate::check::{Accepted, evaluate};
use crate::classify::{deadline_error, map_error, unavailable};
use crate::envelope::{
    BUNDLE_MEDIA_TYPE_PREFIX, DSSE_MEDIA_TYPE, Envelope, Legacy, SIMPLE_SIGNING_MEDIA_TYPE,
};
use crate::plan::Plan;
use crate::trust::PUBLIC_GOOD_TRUSTED_ROOT;

/// Cache and limit settings.
#[derive(Clone, Debug)]
pub struct VerifierConfig {
    /// How long a resolved tag → digest is reused (per credential set). Longer protects
    /// registries from a herd of HEADs for popular tags; shorter follows a moved tag sooner.
    pub tag_ttl: Duration,
    /// How long a positive verdict is reused.
    pub verified_ttl: Duration,
    /// How long a definite negative verdict (no signature, bad signature, wrong identity) is
    /// reused. Errors (network, deadline, 5xx) are never cached.
    pub negative_ttl: Duration,
    /// Entries in the verdict cache.
    pub max_results: u64,
    /// Entries in the tag cache.
    pub max_tags: u64,
    /// Largest signature layer read.
    pub max_signature_bytes: usize,
    /// Most signature layers/referrers read per image.
    pub max_signatures: usize,
    /// The trusted root used when an attestor names none (`trusted_root.json` text).
    pub default_trusted_root: String,
}

impl Default for VerifierConfig {
    fn default() -> Self {
        Self {
            tag_ttl: Duration::from_secs(30),
            verified_ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(30),
            max_results: 10_000,
            max_tags: 10_000,
            max_signature_bytes: 4 * 1024 * 1024,
            max_signatures: 50,
            default_trusted_root: PUBLIC_GOOD_TRUSTED_ROOT.to_owned(),
        }
    }
}

/// Longest a shared (coalesced) load runs: the Kubernetes maximum webhook timeout. Each
/// caller waits only until its own deadline; the load runs in its own task and finishes (or
/// hits this cap) even when nobody waits any more, so its verdict still fills the cache for
/// the next admission of the same image.
const SHARED_LOAD_CAP: Duration = Duration::from_secs(30);

/// Signature repositories whose preferred signature source is remembered.
const FOUND_IN_CAPACITY: u64 = 10_000;

/// Counters of one cache, as returned by [`CosignVerifier::cache_stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// `tags` (tag → digest) or `results` (verdicts).
    pub cache: &'static str,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Of `hits`, those that returned a cached negative verdict.
    pub negative_hits: u64,
    /// Lookups that ran the load themselves.
    pub misses: u64,
    /// Lookups that waited for another caller's load of the same key.
    pub coalesced: u64,
}

#[derive(Default)]
struct CacheCounters {
    hits: AtomicU64,
    negative_hits: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
}

impl CacheCounters {
    fn snapshot(&self, cache: &'static str) -> CacheStats {
        CacheStats {
            cache,
            hits: self.hits.load(Ordering::Relaxed),
            negative_hits: self.negative_hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            coalesced: self.coalesced.load(Ordering::Relaxed),
        }
    }
}

/// Maps a policy's `credentials` to registry credentials (secret lookup lives in the binary).
pub type CredentialsResolver = Arc<dyn Fn(Option<&PolicyCredentials>) -> Credentials + Send + Sync>;

/// Tag cache key: what a registry answered for a tag holds only for the credential set (and
/// `allow_insecure`) that asked; another set may see another registry view or must not reach
/// it over plain HTTP at all.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TagKey {
    reference: String,
    credentials: Credentials,
}

/// Verdict cache key: never a tag.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ResultKey {
    digest: String,
    signature_repo: String,
    attestor: [u8; 32],
    attestation: Option<String>,
}

/// Which signature family to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Family {
    Signatures,
    Attestations,
}

/// Where signatures are attached to an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// cosign's `sha256-<hex>.sig` / `.att` tag (cosign v2, `--new-bundle-format=false`).
    CosignTag,
    /// Sigstore bundles as OCI referrers (cosign v3, sigstore-js).
    Referrers,
}

impl Source {
    fn other(self) -> Self {
        match self {
            Self::CosignTag => Self::Referrers,
            Self::Referrers => Self::CosignTag,
        }
    }
}

/// The signatures of one digest: repository (maybe `source.repository`), tag prefix, family.
#[derive(Clone)]
struct SignatureLocation {
    repo: String,
    prefix: String,
    digest: String,
    family: Family,
}

impl SignatureLocation {
    /// Repository and tag prefix: where signatures of any digest of the image are looked up.
    fn repo_key(&self) -> String {
        format!("{}|{}", self.repo, self.prefix)
    }
}

/// Signature candidates, and the first registry error met while collecting them.
struct Fetched {
    envelopes: Vec<Envelope>,
    error: Option<VerifyError>,
}

/// Positive verdicts live `verified_ttl`, negative ones `negative_ttl`.
struct VerdictExpiry {
    verified: Duration,
    negative: Duration,
}

impl Expiry<ResultKey, Verification> for VerdictExpiry {
    fn expire_after_create(
        &self,
        _: &ResultKey,
        v: &Verification,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(if v.is_verified() {
            self.verified
        } else {
            self.negative
        })
    }
}

/// cosign/Sigstore verification with caches; cheap to clone.
#[derive(Clone)]
pub struct CosignVerifier {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    config: VerifierConfig,
    credentials: CredentialsResolver,
    tags: Cache<TagKey, String>,
    results: Cache<ResultKey, Verification>,
    plans: moka::sync::Cache<[u8; 32], Arc<Result<Plan, String>>>,
    tag_counters: Arc<CacheCounters>,
    result_counters: Arc<CacheCounters>,
    /// Per signature repository and family, the source whose signature last verified when it
    /// was not the one read first. Only an ordering hint: it never decides a verdict.
    found_in: moka::sync::Cache<(String, Family), Source>,
    /// Parsed image references (see [`CosignVerifier::reference`]).
    references: moka::sync::Cache<String, Arc<Reference>>,
    /// SHA-256 of `config.default_trusted_root`, part of every attestor hash.
    root_hash: [u8; 32],
}

impl CosignVerifier {
    /// A verifier over `registry`; `credentials` maps a policy's `credentials` field.
    pub fn new(
        registry: Registry,
        config: VerifierConfig,
        credentials: CredentialsResolver,
    ) -> Self {
        let results = Cache::builder()
            .max_capacity(config.max_results)
            .expire_after(VerdictExpiry {
                verified: config.verified_ttl,
                negative: config.negative_ttl,
            })
            .build();
        let tags = Cache::builder()
            .max_capacity(config.max_tags)
            .time_to_live(config.tag_ttl)
            .build();
        let plans = moka::sync::Cache::builder().max_capacity(1_000).build();
        let root_hash = Sha256::digest(config.default_trusted_root.as_bytes()).into();
        let references = moka::sync::Cache::new(config.max_tags);
        Self {
            inner: Arc::new(Inner {
                root_hash,
                registry,
                config,
                credentials,
                tags,
                results,
                plans,
                tag_counters: Arc::default(),
                result_counters: Arc::default(),
                references,
                found_in: moka::sync::Cache::builder()
                    .max_capacity(FOUND_IN_CAPACITY)
                    .time_to_idle(Duration::from_secs(3600))
                    .build(),
            }),
        }
    }

    /// Anonymous access (plus `allowInsecureRegistry`) for policies with `credentials`.
    pub fn anonymous_credentials() -> CredentialsResolver {
        Arc::new(|c: Option<&PolicyCredentials>| {
            Credentials::anonymous()
                .allow_insecure(c.and_then(|c| c.allow_insecure_registry).unwrap_or(false))
        })
    }

    /// The registry this verifier reads from (for its request counters).
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Hits, misses and coalesced waits of the tag and verdict caches.
    pub fn cache_stats(&self) -> Vec<CacheStats> {
        vec![
            self.inner.tag_counters.snapshot("tags"),
            self.inner.result_counters.snapshot("results"),
        ]
    }

    async fn resolve(
        &self,
        image: &str,
        reference: &Reference,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<String, VerifyError> {
        if let Some(d) = reference.digest() {
            return Ok(d.to_owned());
        }
        let key = TagKey {
            reference: reference.whole(),
            credentials: creds.clone(),
        };
        let load = || {
            let registry = self.inner.registry.clone();
            let (image, creds) = (image.to_owned(), creds.clone());
            async move {
                let shared = Instant::now() + SHARED_LOAD_CAP;
                registry
                    .resolve_digest(&image, &creds, shared)
                    .await
                    .map_err(|e| map_error(&image, "resolving the digest", e, shared))
            }
            .boxed()
        };
        coalesced(
            &self.inner.tags,
            &self.inner.tag_counters,
            key,
            deadline,
            |_| false,
            |budget| deadline_error(image, "resolving the digest", budget),
            load,
        )
        .await
    }

    /// `image` parsed, memoized: oci-client's parser runs a capturing regex (tens of
    /// thousands of instructions), and the warm path would otherwise parse every image of
    /// every admission again.
    fn reference(&self, image: &str) -> Result<Arc<Reference>, VerifyError> {
        if let Some(reference) = self.inner.references.get(image) {
            return Ok(reference);
        }
        let reference: Arc<Reference> =
            Arc::new(parse_reference(image).map_err(|e| unavailable(image, "", e.summary()))?);
        self.inner
            .references
            .insert(image.to_owned(), Arc::clone(&reference));
        Ok(reference)
    }

    fn plan(&self, attestor: &Attestor) -> (Arc<Result<Plan, String>>, [u8; 32]) {
        let hash = attestor_hash(attestor, &self.inner.root_hash);
        let root = &self.inner.config.default_trusted_root;
        let plan = self
            .inner
            .plans
            .get_with(hash, || Arc::new(Plan::new(attestor, root)));
        (plan, hash)
    }

    async fn verify_request(
        &self,
        request: &VerifyRequest,
        deadline: Instant,
    ) -> Result<Verification, VerifyError> {
        // Verdicts that do not depend on the image (unsupported or malformed attestor, notary,
        // KMS, referrer attestations) need no registry round trip.
        let (plan, hash) = self.plan(&request.attestor);
        let early = match (
            plan.as_ref(),
            attestation_type(request.attestation.as_ref()).as_ref(),
        ) {
            (Err(reason), _) | (Ok(_), Err(reason)) => Some(reason.clone()),
            _ => None,
        };
        if let Some(reason) = early {
            let digest = parse_reference(&request.image)
                .ok()
                .and_then(|r| r.digest().map(str::to_owned));
            return Ok(Verification::NotVerified { digest, reason });
        }
        let predicate = attestation_type(request.attestation.as_ref()).unwrap_or_default();
        let creds = (self.inner.credentials)(request.credentials.as_ref());
        let reference = self.reference(&request.image)?;
        let digest = self
            .resolve(&request.image, &reference, &creds, deadline)
            .await?;
        let cosign = request.attestor.cosign.as_ref();
        let signature_repo = match cosign
            .and_then(|c| c.source.as_ref())
            .and_then(|s| s.repository.as_deref())
        {
            Some(r) if !r.is_empty() => r.to_owned(),
            _ => format!("{}/{}", reference.registry(), reference.repository()),
        };
        let prefix = cosign
            .and_then(|c| c.source.as_ref())
            .and_then(|s| s.tag_prefix.clone())
            .unwrap_or_default();
        let family = if predicate.is_some() {
            Family::Attestations
        } else {
            Family::Signatures
        };
        let at = SignatureLocation {
            repo: signature_repo,
            prefix,
            digest,
            family,
        };
        let key = ResultKey {
            digest: at.digest.clone(),
            signature_repo: at.repo_key(),
            attestor: hash,
            attestation: predicate.clone(),
        };
        let load = || {
            let (this, image, at) = (self.clone(), request.image.clone(), at.clone());
            let (plan, predicate, creds) = (Arc::clone(&plan), predicate.clone(), creds.clone());
            async move {
                this.load_verdict(&image, &at, &plan, predicate, &creds)
                    .await
            }
            .boxed()
        };
        coalesced(
            &self.inner.results,
            &self.inner.result_counters,
            key,
            deadline,
            |v| !v.is_verified(),
            |budget| deadline_error(&request.image, "verifying signatures", budget),
            load,
        )
        .await
    }

    /// Fetches and checks signatures for one cache miss. The source where this repository's
    /// signatures were last found is read first, the other only if nothing there verifies:
    /// one round trip less per cold image, and a negative verdict still means both were read.
    async fn load_verdict(
        &self,
        image: &str,
        at: &SignatureLocation,
        plan: &Result<Plan, String>,
        predicate: Option<String>,
        creds: &Credentials,
    ) -> Result<Verification, VerifyError> {
        let plan = plan.as_ref().map_err(|reason| VerifyError::Unavailable {
            image: image.to_owned(),
            registry: String::new(),
            message: reason.clone(),
        })?;
        let shared = Instant::now() + SHARED_LOAD_CAP;
        let hint_key = (at.repo_key(), at.family);
        let first = self
            .inner
            .found_in
            .get(&hint_key)
            .unwrap_or(Source::CosignTag);
        let mut fetched = self.fetch(image, at, first, creds, shared).await;
        let mut verdict = evaluate(plan, &at.digest, &fetched.envelopes, predicate.as_deref());
        let mut found = first;
        if verdict.is_err() {
            let second = self.fetch(image, at, first.other(), creds, shared).await;
            fetched.envelopes.extend(second.envelopes);
            fetched.error = fetched.error.or(second.error);
            verdict = evaluate(plan, &at.digest, &fetched.envelopes, predicate.as_deref());
            found = first.other();
        }
        // A negative verdict reached on partial data is no verdict: report the error (never
        // cached) rather than cache a false "not verified".
        if let (Err(_), Some(e)) = (&verdict, fetched.error) {
            return Err(e);
        }
        let digest = at.digest.clone();
        Ok(match verdict {
            Ok(Accepted { statement }) => {
                tracing::debug!(image, %digest, source = ?found, "signature verified");
                if found != first {
                    self.inner.found_in.insert(hint_key, found);
                }
                Verification::Verified {
                    digest,
                    payload: statement,
                }
            }
            Err(reason) => {
                tracing::debug!(image, %digest, %reason, "not verified");
                Verification::NotVerified {
                    digest: Some(digest),
                    reason,
                }
            }
        })
    }

    /// Fetches the signature candidates of one source: the cosign tag (`.sig`/`.att`) and its
    /// layers, or the OCI referrers (API or tag schema) and each bundle.
    async fn fetch(
        &self,
        image: &str,
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
                let tag = format!("{}{}", at.prefix, at.digest.replace(':', "-"));
                let tag_ref = format!("{repo}:{tag}.{suffix}");
                let (found, failure) = self
                    .fetch_tagged(&tag_ref, at.family, creds, deadline)
                    .await;
                (found, failure, "reading cosign signatures")
            }
            Source::Referrers => {
                let subject_ref = format!("{repo}@{}", at.digest);
                let (found, failure) = self
                    .fetch_bundles(repo, &subject_ref, creds, deadline)
                    .await;
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
        tag_ref: &str,
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
        subject_ref: &str,
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
                .fetch_manifest(&format!("{repo}@{d}"), creds, deadline)
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

    async fn image_data_inner(
        &self,
        image: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Value, VerifyError> {
        let reference = self.reference(image)?;
        let digest = self.resolve(image, &reference, creds, deadline).await?;
        let registry = &self.inner.registry;
        let pinned = format!(
            "{}/{}@{digest}",
            reference.registry(),
            reference.repository()
        );
        let top = registry
            .fetch_manifest(&pinned, creds, deadline)
            .await
            .map_err(|e| map_error(image, "fetching the manifest", e, deadline))?;
        let (index, manifest) = if top.is_index() {
            let platform = ivory_registry::Platform {
                os: "linux".into(),
                architecture: "amd64".into(),
                variant: None,
            };
            let m = registry
                .fetch_platform_manifest(&pinned, &platform, creds, deadline)
                .await
                .map_err(|e| map_error(image, "fetching the platform manifest", e, deadline))?;
            (Some(top.json.clone()), m)
        } else {
            (None, top)
        };
        let config = match manifest
            .json
            .pointer("/config/digest")
            .and_then(Value::as_str)
        {
            Some(d) => {
                let bytes = registry
                    .fetch_blob(
                        &pinned,
                        d,
                        self.inner.config.max_signature_bytes,
                        creds,
                        deadline,
                    )
                    .await
                    .map_err(|e| map_error(image, "fetching the config", e, deadline))?;
                image_config(image, reference.registry(), &bytes)?
            }
            None => Value::Null,
        };
        let tag = reference.tag().map(str::to_owned);
        Ok(json!({
            "image": image,
            "resolvedImage": format!("{}/{}{}@{digest}", reference.registry(), reference.repository(), tag.as_deref().map(|t| format!(":{t}")).unwrap_or_default()),
            "registry": reference.registry(),
            "repository": reference.repository(),
            "identifier": tag.clone().unwrap_or_else(|| digest.clone()),
            "tag": tag.unwrap_or_default(),
            "digest": digest,
            "imageIndex": index,
            "manifest": manifest.json,
            "config": config,
        }))
    }
}

/// An image config for the CEL `image` context: one whose shape would balloon once parsed is
/// refused as hostile; one that is not JSON is left out, as before any limit applied.
fn image_config(image: &str, registry: &str, bytes: &[u8]) -> Result<Value, VerifyError> {
    match parse_json_bounded(bytes, &JsonLimits::SIGNATURE) {
        Ok(config) => Ok(config),
        Err(e) if e.is_too_complex() => Err(VerifyError::Hostile {
            image: image.to_owned(),
            registry: registry.to_owned(),
            message: format!("image config refused: it {e}"),
        }),
        Err(_) => Ok(Value::Null),
    }
}

/// Looks `key` up; on a miss, runs `load` once for all concurrent callers of the same key.
/// Each caller waits until its own `deadline` only: one that gives up gets a deadline error
/// while the shared load goes on for the callers still waiting (and fills the cache).
///
/// The load is built only on a miss and runs boxed in a detached task: a hit stays small and
/// cheap, and no caller's timeout ever abandons moka's initializer (moka panics after 200
/// consecutive abandoned initializations of one key).
///
/// A caller that joined a load started before it arrived and that load failed (errors are
/// never cached) tries once more with a load of its own: an error from an earlier admission's
/// attempt, e.g. connect timeouts piling up against a slow registry, must not stand in for
/// what this admission's own budget allows; past its deadline it gets a deadline error.
async fn coalesced<K, V>(
    cache: &Cache<K, V>,
    counters: &Arc<CacheCounters>,
    key: K,
    deadline: Instant,
    is_negative: impl Fn(&V) -> bool,
    deadline_err: impl FnOnce(Duration) -> VerifyError,
    load: impl Fn() -> BoxFuture<'static, Result<V, VerifyError>>,
) -> Result<V, VerifyError>
where
    K: Clone + std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let budget = deadline.saturating_duration_since(Instant::now());
    if let Some(v) = cache.get(&key).await {
        counters.hits.fetch_add(1, Ordering::Relaxed);
        if is_negative(&v) {
            counters.negative_hits.fetch_add(1, Ordering::Relaxed);
        }
        return Ok(v);
    }
    let attempts = async {
        let mut retried = false;
        loop {
            let shared = tokio::spawn(shared_load(
                cache.clone(),
                Arc::clone(counters),
                key.clone(),
                load(),
            ));
            match shared.await {
                Ok((Err(_), false)) if !retried => retried = true,
                Ok((result, _)) => return result,
                // The load panicked: an internal failure, reported like an unavailable registry.
                Err(join) => {
                    return Err(VerifyError::Unavailable {
                        image: String::new(),
                        registry: String::new(),
                        message: format!("verification task failed: {join}"),
                    });
                }
            }
        }
    };
    match tokio::time::timeout_at(deadline, attempts).await {
        Ok(result) => result,
        Err(_) => Err(deadline_err(budget)),
    }
}

/// One `try_get_with` on `key`; also says whether this call's own `load` ran (a miss) or it
/// joined another caller's (coalesced).
async fn shared_load<K, V>(
    cache: Cache<K, V>,
    counters: Arc<CacheCounters>,
    key: K,
    load: BoxFuture<'static, Result<V, VerifyError>>,
) -> (Result<V, VerifyError>, bool)
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let ran = AtomicBool::new(false);
    let init = async {
        ran.store(true, Ordering::Relaxed);
        load.await
    };
    let res = cache.try_get_with(key, init).await;
    let ran = ran.load(Ordering::Relaxed);
    let counter = if ran {
        &counters.misses
    } else {
        &counters.coalesced
    };
    counter.fetch_add(1, Ordering::Relaxed);
    (res.map_err(|e: Arc<VerifyError>| (*e).clone()), ran)
}

/// The in-toto predicate type of the requested attestation; `referrer` attestations are
/// notary's and cannot be verified by a cosign attestor.
fn attestation_type(a: Option<&Attestation>) -> Result<Option<String>, String> {
    match a {
        None => Ok(None),
        Some(a) => match (&a.intoto, &a.referrer) {
            (Some(t), _) => Ok(Some(t.type_.clone())),
            (None, Some(_)) => Err(format!(
                "cosign verifier only supports intoto attestations, {} is a referrer attestation",
                a.name
            )),
            (None, None) => Err(format!(
                "attestation {} has neither intoto nor referrer",
                a.name
            )),
        },
    }
}

/// SHA-256 over the attestor (CEL fields already resolved, so trust material is inside) and
/// the default trusted root it falls back to.
fn attestor_hash(attestor: &Attestor, root_hash: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    // The name does not change what verifies; the rest does. Serialized straight into the
    // hasher: this runs for every verification, cache hits included.
    let body = (&attestor.cosign, &attestor.notary);
    if serde_json::to_writer(&mut h, &body).is_err() {
        // Plain data cannot fail to serialize; if it ever did, the hash must still differ.
        h.update(b"\0unserializable");
    }
    h.update(root_hash);
    h.finalize().into()
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
fn absent_is_empty<T>(r: Result<T, RegistryError>) -> Result<Option<T>, RegistryError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(RegistryError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Runs `fut` until `deadline`; past it, a named deadline error instead of a hang.
async fn bounded<T>(
    image: &str,
    operation: &str,
    deadline: Instant,
    fut: impl std::future::Future<Output = Result<T, VerifyError>>,
) -> Result<T, VerifyError> {
    let budget = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(r) => r,
        Err(_) => Err(deadline_error(image, operation, budget)),
    }
}

impl ImageVerifier for CosignVerifier {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a str,
        credentials: Option<&'a PolicyCredentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        async move {
            let creds = (self.inner.credentials)(credentials);
            let reference = self.reference(image)?;
            bounded(
                image,
                "resolving the digest",
                deadline,
                self.resolve(image, &reference, &creds, deadline),
            )
            .await
        }
        .boxed()
    }

    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        bounded(
            &request.image,
            "verifying signatures",
            deadline,
            self.verify_request(request, deadline),
        )
        .boxed()
    }

    fn image_data<'a>(
        &'a self,
        image: &'a str,
        credentials: Option<&'a PolicyCredentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        async move {
            let creds = (self.inner.credentials)(credentials);
            bounded(
                image,
                "fetching image data",
                deadline,
                self.image_data_inner(image, &creds, deadline),
            )
            .await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_policy::types::{CosignKey, TypeRef};

    #[test]
    fn image_config_that_would_balloon_is_hostile() {
        let objects = ivory_registry::JsonLimits::SIGNATURE.max_objects + 1;
        let hostile = format!("[{}]", vec![r#"{"secret":0}"#; objects].join(","));
        let err = image_config("r.test/app:1", "r.test", hostile.as_bytes()).unwrap_err();
        assert_eq!(err.kind(), ivory_engine::verifier::ErrorKind::Hostile);
        let text = err.to_string();
        assert!(
            text.contains("r.test/app:1") && text.contains("image config refused"),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
        let ok = image_config("r.test/app:1", "r.test", br#"{"os":"linux"}"#).unwrap();
        assert_eq!(ok["os"], "linux");
        assert!(
            image_config("r.test/app:1", "r.test", b"not json")
                .unwrap()
                .is_null()
        );
    }

    fn key_attestor(name: &str, data: &str) -> Attestor {
        Attestor {
            name: name.into(),
            cosign: Some(ivory_policy::types::Cosign {
                key: Some(CosignKey {
                    data: Some(data.into()),
                    ..CosignKey::default()
                }),
                ..Default::default()
            }),
            notary: None,
        }
    }

    #[test]
    fn attestor_hash_follows_trust_material_not_names() {
        let root = [7u8; 32];
        let a = attestor_hash(&key_attestor("a", "KEY1"), &root);
        assert_eq!(a, attestor_hash(&key_attestor("b", "KEY1"), &root));
        assert_ne!(a, attestor_hash(&key_attestor("a", "KEY2"), &root));
        assert_ne!(a, attestor_hash(&key_attestor("a", "KEY1"), &[8u8; 32]));
    }

    #[test]
    fn attestation_kinds() {
        assert_eq!(attestation_type(None), Ok(None));
        let intoto = Attestation {
            name: "slsa".into(),
            intoto: Some(TypeRef {
                type_: "https://slsa.dev/provenance/v1".into(),
            }),
            referrer: None,
        };
        assert_eq!(
            attestation_type(Some(&intoto)),
            Ok(Some("https://slsa.dev/provenance/v1".into()))
        );
        let referrer = Attestation {
            name: "sbom".into(),
            intoto: None,
            referrer: Some(TypeRef {
                type_: "application/spdx+json".into(),
            }),
        };
        assert!(
            attestation_type(Some(&referrer))
                .unwrap_err()
                .contains("only supports intoto")
        );
    }

    #[test]
    fn verdict_ttls_depend_on_the_verdict() {
        let e = VerdictExpiry {
            verified: Duration::from_secs(60),
            negative: Duration::from_secs(5),
        };
        let key = ResultKey {
            digest: "d".into(),
            signature_repo: "r".into(),
            attestor: [0; 32],
            attestation: None,
        };
        let now = std::time::Instant::now();
        let yes = Verification::Verified {
            digest: "d".into(),
            payload: None,
        };
        let no = Verification::NotVerified {
            digest: None,
            reason: "x".into(),
        };
        assert_eq!(
            e.expire_after_create(&key, &yes, now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            e.expire_after_create(&key, &no, now),
            Some(Duration::from_secs(5))
        );
    }
}
