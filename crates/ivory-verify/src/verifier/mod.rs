//! The async side: [`CosignVerifier`] implements the engine's `ImageVerifier` over
//! `ivory_registry::Registry`, with ivory's own caches.
//!
//! Request floor, once the registry host is known (auth probed once per host; a registry
//! without the referrers API, such as Distribution 2.8, remembered as such): a cold tag costs
//! HEAD, then the `.sig`/`.att` tag, then its signature blobs in parallel; a digest skips the
//! HEAD. The OCI referrers (API or `sha256-<hex>` tag schema, plus one manifest GET per listed
//! referrer, at most `max_signatures`, and one blob GET per Sigstore bundle among them)
//! are read only when the cosign tag holds nothing that verifies, or first where a
//! repository's signatures were last found there. A warm (digest, attestor set, attestation)
//! costs nothing; concurrent identical misses share one fetch set.
//!
//! This module owns the request flow (attestor plan → digest → verdict cache → signatures →
//! [`evaluate`]); its children own one concern each:
//! * `cache`: cache keys, the tag cache, verdict lifetimes and coalescing of concurrent misses
//!   (the detached-load and retry-once rules);
//! * `sources`: where signatures live (cosign tag, OCI referrers) and how they are read;
//! * `image_data`: manifests and configs for the CEL `image` context;
//! * `shared`: what is shared with the other replicas through an optional L2 ([`SharedCache`]).
//!
//! Registry errors become [`VerifyError`]s in one place, `crate::classify`.

mod cache;
mod held;
mod image_data;
mod notation;
mod platforms;
mod revocation;
mod shared;
mod sources;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt as _};
use ivory_engine::verifier::{
    HeldVerdict, ImagePlatform, ImageVerifier, PlatformScope, Verification, VerifyError,
    VerifyRequest,
};
use ivory_plumbing::keyed::{KeyedState, keyed_state};
use ivory_policy::types::{Attestation, Attestor, Credentials as PolicyCredentials};
use ivory_reference::ImageReference;
use ivory_registry::{Credentials, Error as RegistryError, Registry, parse_reference};
use moka::future::Cache;
use serde_json::Value;
use tokio::time::Instant;

use crate::attestor_plan::{Authority, Plan};
use crate::classify::deadline_error;
use crate::rejection::Rejection;
use crate::trust_source::{Pending, RefreshConfig, TrustRoots, TufSources};
use crate::verdict::{Accepted, evaluate};

pub use cache::CacheStats;
use cache::{
    AttestorMemo, CacheCounters, Cached, KeyedCache, Loaded, ResultKey, SHARED_LOAD_CAP, Stamped,
    TagKey, VerdictExpiry, attestor_hash, coalesced,
};
use revocation::RevocationStore;
pub use revocation::{CrlAge, RevocationConfig, RevocationStats};
pub use shared::{Lookup, SharedCache};
use shared::{Shared, SharedLoad, hint_name, through, verdict_name};
use sources::{Family, SignatureLocation, Source};

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
    /// The trusted root used when an attestor names none, kept current by its source
    /// (`TrustRoots::spawn_refresh`).
    pub trust_roots: TrustRoots,
    /// The TUF repositories attestors name (`cosign.tuf`); `None`: followed through this
    /// verifier's registry client, memory only, hourly.
    pub tuf_sources: Option<TufSources>,
    /// The background store of revocation data (CRLs) for Notation chains.
    pub revocation: RevocationConfig,
    /// The repository cosign signatures are read from when an attestor names none
    /// (`source.repository`), as cosign's `COSIGN_REPOSITORY`; `None`: the image's own.
    pub signature_repository: Option<String>,
    /// One-shot commands only: how long a verdict of unknown revocation status waits for the
    /// background fetches it asked for before it is reached again (once). `None` (`ivory
    /// serve`): never; an admission is never held for revocation data.
    pub revocation_settle: Option<Duration>,
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
            trust_roots: TrustRoots::embedded(),
            tuf_sources: None,
            revocation: RevocationConfig::default(),
            revocation_settle: None,
            signature_repository: None,
        }
    }
}

/// The attestor's own TUF repository (`cosign.tuf`), unless it names its `trustedRoot` too
/// (which then decides, as before the repository is asked).
fn own_tuf(attestor: &Attestor) -> Option<&ivory_policy::types::Tuf> {
    let cosign = attestor.cosign.as_ref()?;
    let own_root = cosign
        .trusted_root
        .as_ref()
        .and_then(|t| t.value.as_deref())
        .is_some_and(|v| !v.trim().is_empty());
    let tuf = cosign.tuf.as_ref()?;
    let named = tuf.mirror.as_deref().is_some_and(|m| !m.is_empty())
        || tuf.root.as_ref().is_some_and(|r| {
            r.data.as_deref().is_some_and(|d| !d.is_empty())
                || r.path.as_deref().is_some_and(|p| !p.is_empty())
        });
    (named && !own_root).then_some(tuf)
}

/// Signature repositories whose preferred signature source is remembered.
const FOUND_IN_CAPACITY: u64 = 10_000;

/// Maps a policy's `credentials` to registry credentials (secret lookup lives in the binary).
pub type CredentialsResolver = Arc<dyn Fn(Option<&PolicyCredentials>) -> Credentials + Send + Sync>;

/// cosign/Sigstore verification with caches; cheap to clone.
#[derive(Clone)]
pub struct CosignVerifier {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    config: VerifierConfig,
    credentials: CredentialsResolver,
    tags: KeyedCache<TagKey, String>,
    results: KeyedCache<ResultKey, Stamped>,
    /// Moves whenever an entry leaves `results` (replaced, invalidated, evicted, expired):
    /// moka calls the listener that moves it before an insert or invalidation returns, so a
    /// held verdict whose count is unchanged is still the one kept ([`held`]).
    results_changes: Arc<AtomicU64>,
    plans: moka::sync::Cache<[u8; 32], Arc<Result<Plan, Rejection>>>,
    tag_counters: Arc<CacheCounters>,
    result_counters: Arc<CacheCounters>,
    /// Per signature repository and family, the source whose signature last verified when it
    /// was not the one read first. Only an ordering hint: it never decides a verdict.
    found_in: moka::sync::Cache<(String, Family), Source, KeyedState>,
    /// The runnable children of an index (`None`: a single manifest), by digest reference and
    /// credential set (`ivory.dev/verify-platforms`).
    indexes: moka::sync::Cache<TagKey, Option<Arc<Vec<platforms::Child>>>, KeyedState>,
    /// Recent attestors' hashes and plans (see [`AttestorMemo`]).
    attestors: AttestorMemo,
    /// The cache shared with the other replicas, if any.
    shared: Shared,
    /// CRLs fetched in the background for Notation chains.
    revocation: RevocationStore,
    /// The TUF repositories attestors name.
    tuf_sources: TufSources,
}

impl CosignVerifier {
    /// A verifier over `registry`; `credentials` maps a policy's `credentials` field.
    pub fn new(
        registry: Registry,
        config: VerifierConfig,
        credentials: CredentialsResolver,
    ) -> Self {
        Self::with_shared_cache(registry, config, credentials, None)
    }

    /// [`CosignVerifier::new`] with a cache shared by the replicas (L2) behind the in-process
    /// caches: verdicts, resolved tags and source hints found there skip the registry, and one
    /// replica at a time loads a name the fleet misses.
    pub fn with_shared_cache(
        registry: Registry,
        config: VerifierConfig,
        credentials: CredentialsResolver,
        shared: Option<Arc<dyn SharedCache>>,
    ) -> Self {
        let results_changes = Arc::new(AtomicU64::new(0));
        let changes = Arc::clone(&results_changes);
        let results = Cache::builder()
            .max_capacity(config.max_results)
            .eviction_listener(move |_, _, _| {
                changes.fetch_add(1, Ordering::Release);
            })
            .expire_after(VerdictExpiry {
                verified: config.verified_ttl,
                negative: config.negative_ttl,
            })
            .build_with_hasher(keyed_state());
        let tags = Cache::builder()
            .max_capacity(config.max_tags)
            .time_to_live(config.tag_ttl)
            .build_with_hasher(keyed_state());
        let plans = moka::sync::Cache::builder().max_capacity(1_000).build();
        // Weighed by children, so the bound is on what is held, not on the number of indexes.
        let indexes = moka::sync::Cache::builder()
            .weigher(
                |_: &TagKey, children: &Option<Arc<Vec<platforms::Child>>>| {
                    children.as_ref().map_or(1, |c| {
                        u32::try_from(c.len()).unwrap_or(u32::MAX).saturating_add(1)
                    })
                },
            )
            .max_capacity(config.max_tags)
            .time_to_idle(Duration::from_secs(3600))
            .build_with_hasher(keyed_state());
        let revocation = RevocationStore::new(registry.clone(), config.revocation.clone());
        let tuf_sources = config.tuf_sources.clone().unwrap_or_else(|| {
            TufSources::new(
                registry.clone(),
                RefreshConfig::default(),
                Duration::from_secs(3600),
                None,
            )
        });
        Self {
            inner: Arc::new(Inner {
                revocation,
                tuf_sources,
                shared,
                attestors: AttestorMemo::default(),
                registry,
                config,
                credentials,
                tags,
                results,
                results_changes,
                plans,
                tag_counters: Arc::default(),
                result_counters: Arc::default(),
                indexes,
                found_in: moka::sync::Cache::builder()
                    .max_capacity(FOUND_IN_CAPACITY)
                    .time_to_idle(Duration::from_secs(3600))
                    .build_with_hasher(keyed_state()),
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

    /// The CRLs held for Notation chains (their age) and the fetches made, for metrics.
    pub fn revocation_stats(&self) -> RevocationStats {
        self.inner.revocation.stats()
    }

    /// Which trust roots are in force: it changes whenever a source swaps one.
    fn trust_generation(&self) -> u64 {
        self.inner
            .config
            .trust_roots
            .generation()
            .wrapping_add(self.inner.tuf_sources.generation())
    }

    fn plan(&self, attestor: &Attestor) -> (Arc<Result<Plan, Rejection>>, [u8; 32]) {
        // A root swapped by its source changes every hash: plans and verdicts of the old root
        // are never answered under the new one.
        let generation = self.trust_generation();
        if let Some((hash, plan)) = self.inner.attestors.get(attestor, generation) {
            return (plan, hash);
        }
        let root = match own_tuf(attestor) {
            Some(tuf) => match self.inner.tuf_sources.root(tuf) {
                Ok(root) => root,
                // Not kept: the next verification asks again.
                Err(pending) => {
                    let reason = match pending {
                        Pending::Invalid(why) => Rejection::Attestor(why),
                        Pending::NotYet(why) => Rejection::TrustPending(why),
                    };
                    return (Arc::new(Err(reason)), attestor_hash(attestor, &[0; 32]));
                }
            },
            None => self.inner.config.trust_roots.current(),
        };
        let hash = attestor_hash(attestor, &root.hash);
        let plan = self
            .inner
            .plans
            .get_with(hash, || Arc::new(Plan::new(attestor, &root)));
        self.inner
            .attestors
            .insert(attestor, generation, &(hash, Arc::clone(&plan)));
        (plan, hash)
    }

    /// [`ImageVerifier::verify`] for the request's platform scope; `fresh_since` as for
    /// [`CosignVerifier::verify_request`].
    fn verify_scoped<'a>(
        &'a self,
        request: &'a VerifyRequest,
        deadline: Instant,
        fresh_since: Option<Instant>,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        // Each scope boxes its own future: the common one stays as small as it was. Boxed
        // before `bounded` wraps it, so that wrapping and boxing move a pointer, not the
        // verification's whole state.
        match &request.platforms {
            PlatformScope::Index => bounded(
                &request.image,
                "verifying signatures",
                deadline,
                self.verify_request(request, deadline, fresh_since).boxed(),
            )
            .boxed(),
            PlatformScope::Platforms(set) => bounded(
                &request.image,
                "verifying the signatures of its platform manifests",
                deadline,
                self.verify_platforms(request, set, deadline, fresh_since)
                    .boxed(),
            )
            .boxed(),
        }
    }

    /// Answers `request` from the verdict cache or the registry. With `fresh_since`, a cached
    /// verdict reached before then is reached again, and the cache shared with other replicas is
    /// neither read nor written (its entries carry no time a scan could compare with).
    async fn verify_request(
        &self,
        request: &VerifyRequest,
        deadline: Instant,
        fresh_since: Option<Instant>,
    ) -> Result<Verification, VerifyError> {
        // Verdicts that do not depend on the image (unsupported or malformed attestor, notary,
        // KMS, referrer attestations) need no registry round trip.
        let (mut plan, mut hash) = self.plan(&request.attestor);
        if let (Err(Rejection::TrustPending(_)), Some(wait), Some(tuf)) = (
            plan.as_ref(),
            self.inner.config.revocation_settle,
            own_tuf(&request.attestor),
        ) {
            // A one-shot command judges with the attestor's root once its first fetch is in.
            let until = deadline.min(ivory_clock::deadline_in(wait));
            self.inner.tuf_sources.settle(tuf, until).await;
            (plan, hash) = self.plan(&request.attestor);
        }
        let wanted = match plan.as_ref() {
            Err(reason) => Err(reason.clone()),
            Ok(p) => attestation_key(p, request.attestation.as_ref())
                .map_err(|e| Rejection::Attestor(e.to_string())),
        };
        let predicate = match wanted {
            Ok(predicate) => predicate,
            Err(reason) => {
                let digest = request.image.digest().map(str::to_owned);
                return Ok(Verification::NotVerified { digest, reason });
            }
        };
        let creds = (self.inner.credentials)(request.credentials.as_ref());
        let digest = self.resolve(&request.image, &creds, deadline).await?;
        let at = signature_location(
            request,
            self.inner.config.signature_repository.as_deref(),
            digest,
            predicate.as_deref(),
        );
        let key = ResultKey::at(&at, hash, predicate.clone());
        let (verified_ttl, negative_ttl) = (
            self.inner.config.verified_ttl,
            self.inner.config.negative_ttl,
        );
        // Built on a miss only: naming hashes the key.
        let load = || {
            let l2 = self.inner.shared.clone().filter(|_| fresh_since.is_none());
            let shared = l2.map(|l2| SharedLoad {
                name: verdict_name(&at.digest, &at.repo_key(), &hash, predicate.as_deref()),
                l2,
                digest: Some(at.digest.clone()),
                deadline,
            });
            let (this, image, at) = (self.clone(), request.image.clone(), at.clone());
            let (plan, predicate, creds) = (Arc::clone(&plan), predicate.clone(), creds.clone());
            let load = async move {
                this.load_verdict(&image, &at, &plan, predicate, &creds)
                    .await
            }
            .boxed();
            let load = match shared {
                None => load,
                Some(shared) => through(
                    shared,
                    move |v: &Loaded| {
                        if v.transient {
                            Duration::ZERO
                        } else if v.verdict.is_verified() {
                            verified_ttl
                        } else {
                            negative_ttl
                        }
                    },
                    load,
                )
                .boxed(),
            };
            load.map(|loaded| loaded.map(Stamped::loaded)).boxed()
        };
        coalesced(
            &self.inner.results,
            &self.inner.result_counters,
            key,
            deadline,
            |v| {
                if fresh_since.is_some_and(|since| v.at < since) {
                    Cached::Stale
                } else if v.verdict.is_verified() {
                    Cached::Positive
                } else {
                    Cached::Negative
                }
            },
            |budget| deadline_error(&request.image, "verifying signatures", budget),
            load,
        )
        .await
        .map(|v| Arc::unwrap_or_clone(v.verdict))
    }

    /// Fetches and checks signatures for one cache miss. The source where this repository's
    /// signatures were last found is read first, the other only if nothing there verifies:
    /// one round trip less per cold image, and a negative verdict still means both were read.
    async fn load_verdict(
        &self,
        image: &ImageReference,
        at: &SignatureLocation,
        plan: &Result<Plan, Rejection>,
        predicate: Option<String>,
        creds: &Credentials,
    ) -> Result<Loaded, VerifyError> {
        let plan = plan.as_ref().map_err(|reason| VerifyError::Unavailable {
            image: image.original().to_owned(),
            registry: String::new(),
            message: reason.to_string(),
        })?;
        let shared = ivory_clock::now() + SHARED_LOAD_CAP;
        if let Authority::Notary(notary) = &plan.authority {
            let referrer = predicate
                .as_deref()
                .and_then(|p| p.strip_prefix(REFERRER_KEY));
            let reading = notation::Reading {
                image,
                repo: &at.repo,
                creds,
                deadline: shared,
            };
            return self
                .load_notation_verdict(&reading, &at.digest, notary, referrer)
                .await;
        }
        let hint_key = (at.repo_key(), at.family);
        let first = self.source_hint(&hint_key).await;
        let mut fetched = self.fetch(image, at, first, creds, shared).await;
        let mut verdict = evaluate(plan, &at.digest, &fetched.envelopes, predicate.as_deref());
        let mut found = first;
        if verdict.is_err() {
            let second = self.fetch(image, at, first.other(), creds, shared).await;
            fetched.envelopes.extend(second.envelopes);
            fetched.error = fetched.error.or(second.error);
            fetched.looked.extend(second.looked);
            verdict = evaluate(plan, &at.digest, &fetched.envelopes, predicate.as_deref());
            found = first.other();
        }
        // A negative verdict reached on partial data is no verdict: report the error (never
        // cached) rather than cache a false "not verified".
        if let (Err(_), Some(e)) = (&verdict, fetched.error) {
            return Err(e);
        }
        let digest = at.digest.clone();
        Ok(Loaded::lasting(match verdict {
            Ok(Accepted { statement, signer }) => {
                tracing::debug!(%image, %digest, source = ?found, "signature verified");
                if found != first {
                    self.remember_source(hint_key, found).await;
                }
                Verification::Verified {
                    digest,
                    payload: statement,
                    signer: Some(signer),
                }
            }
            Err(reason) => {
                let reason = Rejection::Searched {
                    reason: Box::new(reason),
                    looked: fetched.looked,
                };
                tracing::debug!(%image, %digest, %reason, "not verified");
                Verification::NotVerified {
                    digest: Some(digest),
                    reason,
                }
            }
        }))
    }
}

impl CosignVerifier {
    /// Where to read a repository's signatures first: where they were last found, by this
    /// replica or (through the L2) another one; the cosign tag otherwise.
    async fn source_hint(&self, key: &(String, Family)) -> Source {
        if let Some(source) = self.inner.found_in.get(key) {
            return source;
        }
        let Some(l2) = &self.inner.shared else {
            return Source::CosignTag;
        };
        let shared = l2.get(&hint_name(&key.0, key.1)).await;
        match shared.and_then(|bytes| shared::SharedValue::decode(&bytes, None)) {
            Some(source) => {
                self.inner.found_in.insert(key.clone(), source);
                source
            }
            None => Source::CosignTag,
        }
    }

    async fn remember_source(&self, key: (String, Family), source: Source) {
        if let Some(l2) = &self.inner.shared
            && let Some(bytes) = shared::SharedValue::encode(&source)
        {
            l2.put(&hint_name(&key.0, key.1), bytes, HINT_TTL).await;
        }
        self.inner.found_in.insert(key, source);
    }
}

/// The reference `<repository><separator><identifier>` (`@digest` or `:tag`) next to an image:
/// a signature tag, a referrer, a pinned or platform manifest. ivory builds it from parts of a
/// parsed reference (or a policy's signature repository) and parses it like any other, so a
/// bad part is refused here, naming it, and the registry only ever gets a parsed reference.
fn sibling(
    repository: &str,
    separator: char,
    identifier: &str,
) -> Result<ImageReference, RegistryError> {
    parse_reference(&format!("{repository}{separator}{identifier}"))
}

/// How long a source hint lives in the L2 (the in-process one is kept while used).
const HINT_TTL: Duration = Duration::from_secs(3600);

/// An attestation an attestor cannot verify: the reason of a "not verified" verdict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum UnverifiableAttestation {
    #[error("cosign verifier only supports intoto attestations, {0} is a referrer attestation")]
    Referrer(String),
    #[error("notary verifier only supports oci 1.1 referrers as attestations")]
    Intoto,
    #[error("attestation {0} has neither intoto nor referrer")]
    Untyped(String),
}

/// How a referrer attestation of a notary attestor is named in verdict keys (an in-toto
/// predicate type is a URI, so the two cannot meet).
const REFERRER_KEY: &str = "referrer:";

/// The attestation part of a verdict's key: the in-toto predicate type (cosign) or
/// [`REFERRER_KEY`] + the referrer's artifactType (notary).
fn attestation_key(
    plan: &Plan,
    a: Option<&Attestation>,
) -> Result<Option<String>, UnverifiableAttestation> {
    if !matches!(plan.authority, Authority::Notary(_)) {
        return attestation_type(a);
    }
    match a {
        None => Ok(None),
        Some(a) => match (&a.referrer, &a.intoto) {
            (Some(t), _) => Ok(Some(format!("{REFERRER_KEY}{}", t.type_))),
            (None, Some(_)) => Err(UnverifiableAttestation::Intoto),
            (None, None) => Err(UnverifiableAttestation::Untyped(a.name.clone())),
        },
    }
}

/// The in-toto predicate type of the requested attestation; `referrer` attestations are
/// notary's and cannot be verified by a cosign attestor.
fn attestation_type(a: Option<&Attestation>) -> Result<Option<String>, UnverifiableAttestation> {
    match a {
        None => Ok(None),
        Some(a) => match (&a.intoto, &a.referrer) {
            (Some(t), _) => Ok(Some(t.type_.clone())),
            (None, Some(_)) => Err(UnverifiableAttestation::Referrer(a.name.clone())),
            (None, None) => Err(UnverifiableAttestation::Untyped(a.name.clone())),
        },
    }
}

/// Where the signatures of `request`'s image at `digest` are read: the attestor's
/// `source.repository`, else the configured `default_repository` (`--signature-repository`),
/// else the image's own repository; the tag prefix; and the family (`predicate`: the
/// attestation's key; `None` for signatures).
fn signature_location(
    request: &VerifyRequest,
    default_repository: Option<&str>,
    digest: String,
    predicate: Option<&str>,
) -> SignatureLocation {
    let source = request
        .attestor
        .cosign
        .as_ref()
        .and_then(|c| c.source.as_ref());
    // The default is cosign's (COSIGN_REPOSITORY): Notation signatures stay with the image.
    let default_repository = default_repository.filter(|_| request.attestor.cosign.is_some());
    let repo = match source.and_then(|s| s.repository.as_deref()) {
        Some(r) if !r.is_empty() => r,
        _ => default_repository.unwrap_or(request.image.repository_name()),
    }
    .to_owned();
    let prefix = source
        .and_then(|s| s.tag_prefix.clone())
        .unwrap_or_default();
    let family = if predicate.is_some() {
        Family::Attestations
    } else {
        Family::Signatures
    };
    SignatureLocation {
        repo,
        prefix,
        digest,
        family,
    }
}

/// Runs `fut` until `deadline`; past it, a named deadline error instead of a hang.
async fn bounded<T>(
    image: &ImageReference,
    operation: &str,
    deadline: Instant,
    fut: impl std::future::Future<Output = Result<T, VerifyError>>,
) -> Result<T, VerifyError> {
    let budget = deadline.saturating_duration_since(ivory_clock::now());
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(r) => r,
        Err(_) => Err(deadline_error(image, operation, budget)),
    }
}

impl ImageVerifier for CosignVerifier {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a PolicyCredentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        async move {
            let creds = (self.inner.credentials)(credentials);
            bounded(
                image,
                "resolving the digest",
                deadline,
                self.resolve(image, &creds, deadline),
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
        self.verify_scoped(request, deadline, None)
    }

    fn verify_known(&self, request: &VerifyRequest) -> Option<Verification> {
        self.known_verdict(request)
    }

    fn hold_verdict(&self, request: &VerifyRequest, answer: &Verification) -> Option<HeldVerdict> {
        self.hold(request, answer)
    }

    fn still_holds(&self, held: &HeldVerdict) -> bool {
        self.holds(held)
    }

    fn image_data<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a PolicyCredentials>,
        platform: &'a ImagePlatform,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        async move {
            let creds = (self.inner.credentials)(credentials);
            bounded(
                image,
                "fetching image data",
                deadline,
                self.image_data_inner(image, &creds, platform, deadline),
            )
            .await
        }
        .boxed()
    }

    fn revalidating(&self, since: Instant) -> Option<Box<dyn ImageVerifier + '_>> {
        Some(Box::new(Revalidating {
            verifier: self,
            since,
        }))
    }
}

/// [`CosignVerifier`] for a background scan that started at `since` (see
/// [`ImageVerifier::revalidating`]).
struct Revalidating<'a> {
    verifier: &'a CosignVerifier,
    since: Instant,
}

impl ImageVerifier for Revalidating<'_> {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a PolicyCredentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        self.verifier.resolve_digest(image, credentials, deadline)
    }

    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        self.verifier
            .verify_scoped(request, deadline, Some(self.since))
    }

    fn image_data<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a PolicyCredentials>,
        platform: &'a ImagePlatform,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        self.verifier
            .image_data(image, credentials, platform, deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_policy::types::TypeRef;

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
                .to_string()
                .contains("only supports intoto")
        );
    }
}
