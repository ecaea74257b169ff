//! Kept verdicts read without a future: [`ivory_engine::verifier::ImageVerifier::verify_known`]'s answer, and the
//! handles [`ivory_engine::verifier::ImageVerifier::hold_verdict`] gives out so that the engine can reuse a route's
//! decision while every verdict it read is still the one kept ([`ivory_engine::verifier::ImageVerifier::still_holds`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use futures::FutureExt as _;
use ivory_engine::verifier::{HeldVerdict, PlatformScope, Verification, VerifyRequest};
use tokio::time::Instant;

use super::cache::{ResultKey, Stamped};
use super::{CosignVerifier, Inner, attestation_key, signature_location};

/// A kept verdict handed out by [`ivory_engine::verifier::ImageVerifier::hold_verdict`]: the key it is kept under,
/// the very allocation kept there and the trust roots it was reached under. The verifier is
/// named by a weak pointer, which also keeps its address from being reused by another one.
struct Held {
    verifier: Weak<Inner>,
    key: ResultKey,
    generation: u64,
    verdict: Arc<Verification>,
    /// When the cache lets the verdict expire, at the latest: its stamp is taken before moka's.
    expires: Instant,
    /// `Inner::results_changes` when the verdict was last seen kept under its key: while the
    /// count stays there, nothing has left the cache, so the verdict is still kept.
    seen_at_change: AtomicU64,
}

impl CosignVerifier {
    /// [`ivory_engine::verifier::ImageVerifier::verify_known`]: the kept verdict of a digest reference verified over
    /// the index, found under the key [`CosignVerifier::verify_request`] would look up and
    /// counted as its hit. Anything else (a tag to resolve, platform manifests, an attestor
    /// that cannot be planned, a verdict not kept or not at hand) is left to `verify`.
    pub(super) fn known_verdict(&self, request: &VerifyRequest) -> Option<Verification> {
        let (_, kept) = self.kept_verdict(request)?;
        self.inner
            .result_counters
            .count_hit(!kept.verdict.is_verified());
        Some(Arc::unwrap_or_clone(kept.verdict))
    }

    /// [`ivory_engine::verifier::ImageVerifier::hold_verdict`]: a handle on the verdict kept for `request` when it is
    /// `answer` (never on one a load marked transient).
    pub(super) fn hold(
        &self,
        request: &VerifyRequest,
        answer: &Verification,
    ) -> Option<HeldVerdict> {
        let generation = self.trust_generation();
        let changes = self.results_changes();
        let (key, kept) = self.kept_verdict(request)?;
        let same = !kept.transient && *kept.verdict == *answer;
        let config = &self.inner.config;
        let ttl = if kept.verdict.is_verified() {
            config.verified_ttl
        } else {
            config.negative_ttl
        };
        same.then(|| {
            Box::new(Held {
                verifier: Arc::downgrade(&self.inner),
                key,
                generation,
                expires: kept.at + ttl,
                verdict: kept.verdict,
                seen_at_change: AtomicU64::new(changes),
            }) as HeldVerdict
        })
    }

    /// [`ivory_engine::verifier::ImageVerifier::still_holds`]: this verifier's handle, the same trust roots, and the
    /// same allocation kept under its key (a hit, counted as `verify` counts one). While nothing
    /// has left the cache since the verdict was last seen kept, and its lifetime has not run
    /// out, it is still kept without looking.
    pub(super) fn holds(&self, held: &HeldVerdict) -> bool {
        let Some(held) = held.downcast_ref::<Held>() else {
            return false;
        };
        let holds = std::ptr::eq(held.verifier.as_ptr(), Arc::as_ptr(&self.inner))
            && held.generation == self.trust_generation()
            && ivory_clock::now() < held.expires
            && self.still_kept(held);
        if holds {
            self.inner
                .result_counters
                .count_hit(!held.verdict.is_verified());
        }
        holds
    }

    /// Whether `held`'s allocation is still the one kept under its key: unchanged cache, or
    /// found there again (then remembered as seen at the count read before looking).
    fn still_kept(&self, held: &Held) -> bool {
        let changes = self.results_changes();
        if held.seen_at_change.load(Ordering::Relaxed) == changes {
            return true;
        }
        let kept = self
            .inner
            .results
            .get(&held.key)
            .now_or_never()
            .flatten()
            .is_some_and(|kept| Arc::ptr_eq(&kept.verdict, &held.verdict));
        if kept {
            held.seen_at_change.fetch_max(changes, Ordering::Relaxed);
        }
        kept
    }

    fn results_changes(&self) -> u64 {
        self.inner.results_changes.load(Ordering::Acquire)
    }

    /// The key [`CosignVerifier::verify_request`] would look `request` up under, and what is
    /// kept there, for a digest reference verified over the index.
    fn kept_verdict(&self, request: &VerifyRequest) -> Option<(ResultKey, Stamped)> {
        if request.platforms != PlatformScope::Index {
            return None;
        }
        let digest = request.image.digest()?;
        let (plan, hash) = self.plan(&request.attestor);
        let Ok(planned) = plan.as_ref() else {
            return None;
        };
        let predicate = attestation_key(planned, request.attestation.as_ref()).ok()?;
        let at = signature_location(
            request,
            self.inner.config.signature_repository.as_deref(),
            digest.to_owned(),
            predicate.as_deref(),
        );
        let key = ResultKey::at(&at, hash, predicate);
        let kept = self.inner.results.get(&key).now_or_never()??;
        Some((key, kept))
    }
}
