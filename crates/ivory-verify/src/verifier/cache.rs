//! The verifier's caches: what keys a tag and a verdict, how long a verdict lives, and how
//! concurrent misses of one key share one load (each caller bounded by its own deadline).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt as _};
use ivory_engine::verifier::{Verification, VerifyError};
use ivory_plumbing::keyed::KeyedState;
use ivory_policy::types::Attestor;
use ivory_reference::ImageReference;
use ivory_registry::Credentials;
use moka::Expiry;
use moka::future::Cache;
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

use super::CosignVerifier;
use super::shared::{SharedLoad, SharedValue, tag_name, through};
use crate::attestor_plan::Plan;
use crate::classify::{deadline_error, map_error};

/// A verifier cache keyed by request-chosen data (images, signature repositories), hashed
/// with a random key of its own ([`ivory_plumbing::keyed`]).
pub(super) type KeyedCache<K, V> = Cache<K, V, KeyedState>;

/// Longest a shared (coalesced) load runs: the Kubernetes maximum webhook timeout. Why a load
/// has its own cap and not a caller's deadline: rule 2 at [`coalesced`].
pub(super) const SHARED_LOAD_CAP: Duration = Duration::from_secs(30);

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
pub(super) struct CacheCounters {
    hits: AtomicU64,
    negative_hits: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
}

impl CacheCounters {
    /// Counts a value found kept (`negative`: a verdict that did not verify).
    pub(super) fn count_hit(&self, negative: bool) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        if negative {
            self.negative_hits.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn snapshot(&self, cache: &'static str) -> CacheStats {
        CacheStats {
            cache,
            hits: self.hits.load(Ordering::Relaxed),
            negative_hits: self.negative_hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            coalesced: self.coalesced.load(Ordering::Relaxed),
        }
    }
}

/// Tag cache key: what a registry answered for a tag holds only for the credential set (and
/// `allow_insecure`) that asked; another set may see another registry view or must not reach
/// it over plain HTTP at all.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct TagKey {
    pub(super) reference: String,
    pub(super) credentials: Credentials,
}

/// Verdict cache key: never a tag.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ResultKey {
    pub(super) digest: String,
    pub(super) signature_repo: String,
    pub(super) attestor: [u8; 32],
    pub(super) attestation: Option<String>,
}

impl ResultKey {
    /// The key of the verdict about the signatures at `at` under the attestor hashed `attestor`
    /// (`attestation`: the predicate key, `None` for signatures).
    pub(super) fn at(
        at: &super::sources::SignatureLocation,
        attestor: [u8; 32],
        attestation: Option<String>,
    ) -> Self {
        Self {
            digest: at.digest.clone(),
            signature_repo: at.repo_key(),
            attestor,
            attestation,
        }
    }
}

/// A cached verdict and when it was reached: a background scan reaches again a verdict
/// reached before it started ([`CosignVerifier::verify_request`]'s `fresh_since`).
#[derive(Clone, Debug)]
pub(super) struct Stamped {
    pub(super) at: Instant,
    /// Shared: a hit copies a pointer, and a held verdict is this very allocation
    /// ([`super::held`]).
    pub(super) verdict: Arc<Verification>,
    /// Not kept: see [`Loaded::transient`].
    pub(super) transient: bool,
}

impl Stamped {
    pub(super) fn now(verdict: Verification) -> Self {
        Self {
            at: ivory_clock::now(),
            verdict: Arc::new(verdict),
            transient: false,
        }
    }

    pub(super) fn loaded(loaded: Loaded) -> Self {
        Self {
            transient: loaded.transient,
            ..Self::now(loaded.verdict)
        }
    }
}

/// A verdict as one load reached it.
#[derive(Clone, Debug)]
pub(super) struct Loaded {
    pub(super) verdict: Verification,
    /// Reached on data still being fetched in the background (a Notation chain's unknown
    /// revocation status): handed to the callers waiting for this load, never cached here
    /// or in the L2, so the next admission is judged again.
    pub(super) transient: bool,
}

impl Loaded {
    pub(super) fn lasting(verdict: Verification) -> Self {
        Self {
            verdict,
            transient: false,
        }
    }
}

/// Only lasting verdicts are ever written (a transient one has a zero lifetime), so what is
/// read back is lasting.
impl SharedValue for Loaded {
    fn encode(&self) -> Option<Vec<u8>> {
        self.verdict.encode()
    }

    fn decode(bytes: &[u8], expected_digest: Option<&str>) -> Option<Self> {
        Verification::decode(bytes, expected_digest).map(Self::lasting)
    }
}

/// Positive verdicts live `verified_ttl`, negative ones `negative_ttl`.
pub(super) struct VerdictExpiry {
    pub(super) verified: Duration,
    pub(super) negative: Duration,
}

impl Expiry<ResultKey, Stamped> for VerdictExpiry {
    fn expire_after_create(
        &self,
        _: &ResultKey,
        v: &Stamped,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(if v.transient {
            Duration::ZERO
        } else if v.verdict.is_verified() {
            self.verified
        } else {
            self.negative
        })
    }
}

impl CosignVerifier {
    /// The digest `reference` names: its own, or the tag's from the tag cache (coalesced).
    pub(super) async fn resolve(
        &self,
        reference: &ImageReference,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<String, VerifyError> {
        if let Some(d) = reference.digest() {
            return Ok(d.to_owned());
        }
        let key = TagKey {
            reference: reference.name(),
            credentials: creds.clone(),
        };
        let ttl = self.inner.config.tag_ttl;
        // Built on a miss only: naming hashes the credential set.
        let load = || {
            let shared = self.inner.shared.clone().map(|l2| SharedLoad {
                name: tag_name(l2.as_ref(), &reference.name(), &creds.identity_bytes()),
                l2,
                digest: None,
                deadline,
            });
            let registry = self.inner.registry.clone();
            let (image, creds) = (reference.clone(), creds.clone());
            let load = async move {
                let shared = ivory_clock::now() + SHARED_LOAD_CAP;
                registry
                    .resolve_digest(&image, &creds, shared)
                    .await
                    .map_err(|e| map_error(&image, "resolving the digest", e, shared))
            }
            .boxed();
            match shared {
                None => load,
                Some(shared) => through(shared, move |_: &String| ttl, load).boxed(),
            }
        };
        coalesced(
            &self.inner.tags,
            &self.inner.tag_counters,
            key,
            deadline,
            |_| Cached::Positive,
            |budget| deadline_error(reference, "resolving the digest", budget),
            load,
        )
        .await
    }
}

/// What a cached value is to the caller of [`coalesced`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cached {
    /// Served, counted as a hit.
    Positive,
    /// Served, counted as a hit and a negative hit.
    Negative,
    /// Not served: reached again as on a miss.
    Stale,
}

/// Looks `key` up; on a miss (or a cached value `classify` calls stale), runs `load` once for all
/// concurrent callers of the same key. Errors are never cached. Three rules hold here, and
/// only here:
///
/// 1. **Own deadline.** Each caller waits until its own `deadline` only: one that gives up gets
///    a deadline error while the shared load goes on for the callers still waiting.
///    Proven by `coalesced_callers_keep_their_own_deadlines` (ivory-verify `tests/registry.rs`).
/// 2. **Detached load.** The load is built only on a miss and runs boxed in its own task, capped
///    by [`SHARED_LOAD_CAP`] instead of any caller's deadline, so it finishes and fills the cache
///    even when every caller has given up; the next admission of the image then finds the
///    verdict. It also means no caller's timeout ever abandons moka's initializer (moka panics
///    after 200 consecutive abandoned initializations of one key). Proven by
///    `a_load_whose_only_caller_gave_up_still_fills_the_cache` (same file).
/// 3. **Retry once.** A caller that joined a load started before it arrived, and that load
///    failed, tries once more with a load of its own: an error from an earlier admission's
///    attempt, e.g. connect timeouts piling up against a slow registry, must not stand in for
///    what this admission's own budget allows; past its deadline it gets a deadline error.
///    Proven by `a_caller_that_joined_a_failed_load_retries_once_with_its_own` (same file).
pub(super) async fn coalesced<K, V>(
    cache: &KeyedCache<K, V>,
    counters: &Arc<CacheCounters>,
    key: K,
    deadline: Instant,
    classify: impl Fn(&V) -> Cached,
    deadline_err: impl FnOnce(Duration) -> VerifyError,
    load: impl Fn() -> BoxFuture<'static, Result<V, VerifyError>>,
) -> Result<V, VerifyError>
where
    K: Clone + std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let budget = deadline.saturating_duration_since(ivory_clock::now());
    if let Some(v) = cache.get(&key).await {
        let class = classify(&v);
        if class != Cached::Stale {
            counters.count_hit(class == Cached::Negative);
            return Ok(v);
        }
        // Callers that find the stale value before the load below replaces it reach the verdict
        // again too; they coalesce with this load.
        cache.invalidate(&key).await;
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
    cache: KeyedCache<K, V>,
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

/// Attestors seen lately, with their hash and plan. Every verification (cache hits included)
/// needs the attestor's hash; comparing it with a handful of recent attestors costs far less
/// than serializing and hashing it again, and policies use few distinct attestors.
#[derive(Default)]
pub(super) struct AttestorMemo {
    /// Each attestor with the trust-root generation its plan was made under.
    entries: RwLock<Vec<(Attestor, u64, AttestorPlan)>>,
    next: AtomicUsize,
}

/// An attestor's hash and plan.
pub(super) type AttestorPlan = ([u8; 32], Arc<Result<Plan, crate::Rejection>>);

/// Attestors remembered by [`AttestorMemo`]; past it, entries are replaced in turn.
const ATTESTOR_MEMO: usize = 32;

impl AttestorMemo {
    /// The remembered hash and plan of an attestor equal to `attestor`, made under the trust
    /// root of `generation`.
    pub(super) fn get(&self, attestor: &Attestor, generation: u64) -> Option<AttestorPlan> {
        let entries = self.entries.read().ok()?;
        entries
            .iter()
            .find(|(seen, made_under, _)| *made_under == generation && seen == attestor)
            .map(|(_, _, plan)| (plan.0, Arc::clone(&plan.1)))
    }

    /// Remembers `attestor`'s hash and plan, made under the trust root of `generation`.
    pub(super) fn insert(&self, attestor: &Attestor, generation: u64, plan: &AttestorPlan) {
        let Ok(mut entries) = self.entries.write() else {
            return;
        };
        let entry = (attestor.clone(), generation, (plan.0, Arc::clone(&plan.1)));
        if entries.len() < ATTESTOR_MEMO {
            entries.push(entry);
        } else {
            let at = self.next.fetch_add(1, Ordering::Relaxed) % ATTESTOR_MEMO;
            entries[at] = entry;
        }
    }
}

/// SHA-256 over the attestor (CEL fields already resolved, so trust material is inside) and
/// the default trusted root it falls back to.
pub(super) fn attestor_hash(attestor: &Attestor, root_hash: &[u8; 32]) -> [u8; 32] {
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

#[cfg(feature = "bench-support")]
impl CosignVerifier {
    /// Benchmarks only (`bench-support` feature, never in the product): a verified verdict for
    /// each of `digests` of `repository` under `attestor`, put in the verdict cache where a
    /// verified cosign signature (no attestation, the image's own repository) would put it, so
    /// the cost of a cache of millions of verdicts can be measured without a registry of
    /// millions of images. Lookups then go through [`ImageVerifier::verify`] as the engine's do.
    ///
    /// [`ImageVerifier::verify`]: ivory_engine::verifier::ImageVerifier::verify
    pub async fn seed_verified_verdicts(
        &self,
        repository: &str,
        attestor: &Attestor,
        digests: &[String],
    ) {
        let (_, hash) = self.plan(attestor);
        for digest in digests {
            let at = super::sources::SignatureLocation {
                repo: repository.to_owned(),
                prefix: String::new(),
                digest: digest.clone(),
                family: super::sources::Family::Signatures,
            };
            let key = ResultKey::at(&at, hash, None);
            let verdict = Verification::Verified {
                digest: digest.clone(),
                payload: None,
                signer: None,
            };
            self.inner.results.insert(key, Stamped::now(verdict)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_policy::types::CosignKey;

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
    fn the_attestor_memo_answers_equal_attestors_only() {
        let memo = AttestorMemo::default();
        let plan = |n: u8| {
            (
                [n; 32],
                Arc::new(Err(crate::Rejection::InvalidSignature(format!("plan {n}")))),
            )
        };
        memo.insert(&key_attestor("a", "KEY1"), 0, &plan(1));
        let hit = memo.get(&key_attestor("a", "KEY1"), 0);
        assert_eq!(hit.map(|p| p.0), Some([1; 32]));
        assert!(memo.get(&key_attestor("a", "KEY2"), 0).is_none());
        // A plan made under another trust root is not answered.
        assert!(memo.get(&key_attestor("a", "KEY1"), 1).is_none());
        for n in 0..=ATTESTOR_MEMO as u8 {
            memo.insert(&key_attestor("x", &n.to_string()), 0, &plan(n));
        }
        assert_eq!(
            memo.entries.read().map(|e| e.len()).unwrap_or_default(),
            ATTESTOR_MEMO
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
        let now = ivory_clock::now().into_std();
        let yes = Stamped::now(Verification::Verified {
            digest: "d".into(),
            payload: None,
            signer: None,
        });
        let no = Stamped::now(Verification::NotVerified {
            digest: None,
            reason: crate::Rejection::NoSignatures,
        });
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
