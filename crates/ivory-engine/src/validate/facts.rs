//! What the validating stage derives from a policy once per policy version instead of once per
//! request: the CEL bindings of its static attestors and of its attestations, which
//! verification functions its expressions call, whether its results may be memoized, the
//! fingerprints that de-duplicate its verification jobs, and which images its
//! `matchImageReferences` select (with those images parsed). Kept in the policy's
//! [`DerivedSlot`], which a clone (an autogen variant, a policy changed field by field) never
//! inherits, and dropped with the policy on reload.
//!
//! [`DerivedSlot`]: ivory_policy::DerivedSlot

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use ivory_cel::{ConvertedJson, Program};
use ivory_plumbing::keyed::KeyedMap;
use ivory_policy::compiled::CompiledPolicy;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use super::calls::{
    ATTESTATION_FUNCTIONS, IMAGE_DATA_FUNCTIONS, SIGNATURE_FUNCTIONS, programs,
    reads_only_pure_inputs,
};
use crate::images;
use crate::matching::MatchError;
use crate::verifier::{ImageRefError, ImageReference};

/// Images whose facts are kept per policy: the images a cluster runs are few. When more are
/// seen, the kept ones are all forgotten and derived again as they come (a cost, never a
/// different answer).
const KEPT_IMAGES: usize = 4096;
/// Longer image strings are matched every time rather than kept.
const MAX_KEPT_IMAGE_LEN: usize = 512;
/// Image facts kept by all policies together (each a few hundred bytes, at most a few KiB):
/// many policies seeing many distinct images cannot grow memory past this.
const KEPT_IMAGES_IN_ALL: usize = 16_384;

/// Image facts kept now, by all policies ([`KEPT_IMAGES_IN_ALL`]).
static KEPT_IN_ALL: AtomicUsize = AtomicUsize::new(0);

/// The per-policy-version facts of one policy.
pub(super) struct PolicyFacts {
    /// The `attestors` binding when every attestor is static (no CEL-sourced field).
    pub(super) attestors: Option<Arc<ConvertedJson>>,
    /// The `attestations` binding (name → name).
    pub(super) attestations: Arc<ConvertedJson>,
    /// For each static attestor, the fingerprint of the attestor its verification requests
    /// carry (`None` for one with CEL fields, known per request only).
    pub(super) attestor_keys: Vec<Option<Arc<str>>>,
    /// For each attestation, the fingerprint of its JSON.
    pub(super) attestation_keys: Vec<Arc<str>>,
    /// The fingerprint of `spec.credentials`.
    pub(super) credentials_key: Arc<str>,
    /// Whether an expression calls `verifyImageSignatures`.
    pub(super) calls_signatures: bool,
    /// Whether an expression calls `verifyAttestationSignatures` or `extractPayload`.
    pub(super) calls_attestations: bool,
    /// Whether an expression reads image data (`image.GetMetadata` and its spellings).
    pub(super) reads_image_data: bool,
    /// Whether the policy's results are a function of its `images` and verification answers
    /// alone, as far as the policy itself decides ([`super::memo::memoizable`] adds what the
    /// request decides).
    pub(super) pure: bool,
    /// Whether everything the policy decides for a request, from matching to its result, is
    /// a function of the route's matching inputs and its verification answers alone
    /// ([`super::reuse`]): a pure policy with no matchConditions, no `spec.images`
    /// extractors, no per-workload platforms and not in JSON mode.
    pub(super) route_pure: bool,
    /// What is known of each image seen: both are functions of the image string alone (the
    /// globs and expressions of `matchImageReferences` see nothing else).
    images: RwLock<KeyedMap<Box<str>, Arc<ImageFacts>>>,
}

/// What a policy knows of one image.
pub(super) struct ImageFacts {
    /// Whether `matchImageReferences` selects it.
    selected: bool,
    /// The image parsed, when selected (only selected images are verified).
    reference: Option<Result<ImageReference, ImageRefError>>,
}

impl PolicyFacts {
    /// The facts of `policy`, derived on first use and kept with it.
    pub(super) fn of(policy: &CompiledPolicy) -> Arc<Self> {
        policy
            .derived
            .get_or_init(|| Self::derive(policy))
            .unwrap_or_else(|| Arc::new(Self::derive(policy)))
    }

    fn derive(policy: &CompiledPolicy) -> Self {
        let all_static = policy.attestors.iter().all(|a| a.fields.is_empty());
        let attestors = all_static.then(|| {
            let map = policy
                .attestors
                .iter()
                .map(|a| (a.attestor.name.clone(), a.json.clone()))
                .collect();
            Arc::new(ConvertedJson::new(&Json::Object(map)))
        });
        let attestations = policy
            .attestations
            .iter()
            .map(|a| (a.name.clone(), Json::String(a.name.clone())))
            .collect();
        let calls_any = |names: &[&str]| {
            programs(policy).any(|p: &Program| names.iter().any(|n| p.calls_function(n)))
        };
        let reads_image_data = calls_any(&IMAGE_DATA_FUNCTIONS);
        let pure = all_static
            && policy.cluster_reads.is_empty()
            && !reads_image_data
            && programs(policy).all(reads_only_pure_inputs);
        Self {
            attestors,
            attestations: Arc::new(ConvertedJson::new(&Json::Object(attestations))),
            attestor_keys: policy
                .attestors
                .iter()
                .map(|a| a.fields.is_empty().then(|| fingerprint(&a.attestor)))
                .collect(),
            attestation_keys: policy.attestations.iter().map(fingerprint).collect(),
            credentials_key: fingerprint(&policy.credentials()),
            calls_signatures: calls_any(&SIGNATURE_FUNCTIONS),
            calls_attestations: calls_any(&ATTESTATION_FUNCTIONS),
            reads_image_data,
            pure,
            route_pure: pure
                && !policy.hash.is_empty()
                && policy.match_conditions.is_empty()
                && policy.image_extractors.is_empty()
                && !policy.json_mode
                && policy.verify_platforms != ivory_policy::VerifyPlatforms::PodPlatform,
            images: RwLock::new(KeyedMap::default()),
        }
    }

    /// [`images::matches_image`], answered from the kept facts when it can be. Errors are
    /// never kept.
    pub(super) fn matches_image(
        &self,
        policy: &CompiledPolicy,
        image: &str,
    ) -> Result<bool, MatchError> {
        self.image(policy, image).map(|facts| facts.selected)
    }

    /// `image` parsed: kept with a selected image's facts; parsed here for one the policy does
    /// not select or whose selection is an error (never a verified image).
    pub(super) fn reference(
        &self,
        policy: &CompiledPolicy,
        image: &str,
    ) -> Result<ImageReference, ImageRefError> {
        self.image(policy, image)
            .ok()
            .and_then(|facts| facts.reference.clone())
            .unwrap_or_else(|| ImageReference::parse(image))
    }

    fn kept(&self, image: &str) -> Option<Arc<ImageFacts>> {
        let images = self.images.read().ok()?;
        images.get(image).cloned()
    }

    /// The facts of `image`, derived (and kept) on first sight.
    fn image(&self, policy: &CompiledPolicy, image: &str) -> Result<Arc<ImageFacts>, MatchError> {
        if let Some(facts) = self.kept(image) {
            return Ok(facts);
        }
        let selected = images::matches_image(policy, image)?;
        let facts = Arc::new(ImageFacts {
            selected,
            reference: selected.then(|| ImageReference::parse(image)),
        });
        if image.len() <= MAX_KEPT_IMAGE_LEN
            && let Ok(mut images) = self.images.write()
        {
            if images.len() >= KEPT_IMAGES {
                KEPT_IN_ALL.fetch_sub(images.len(), Ordering::Relaxed);
                images.clear();
            }
            // Past the bound of all policies together, the answer is used but not kept.
            if KEPT_IN_ALL.fetch_add(1, Ordering::Relaxed) < KEPT_IMAGES_IN_ALL {
                if images
                    .insert(Box::from(image), Arc::clone(&facts))
                    .is_some()
                {
                    KEPT_IN_ALL.fetch_sub(1, Ordering::Relaxed);
                }
            } else {
                KEPT_IN_ALL.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(facts)
    }
}

impl Drop for PolicyFacts {
    fn drop(&mut self) {
        let kept = self.images.get_mut().map_or(0, |images| images.len());
        KEPT_IN_ALL.fetch_sub(kept, Ordering::Relaxed);
    }
}

/// The fingerprint of a value, for de-duplicating identical questions of several policies:
/// the hex SHA-256 of its JSON serialization (serde's field order is fixed per type).
pub(super) fn fingerprint(value: &impl serde::Serialize) -> Arc<str> {
    let mut hasher = Sha256::new();
    if serde_json::to_writer(&mut hasher, value).is_err() {
        // Plain data cannot fail to serialize; if it ever did, the value shares its
        // fingerprint with nothing, so its question is asked on its own.
        static UNSERIALIZABLE: AtomicUsize = AtomicUsize::new(0);
        let n = UNSERIALIZABLE.fetch_add(1, Ordering::Relaxed);
        return Arc::from(format!("unserializable-{n}"));
    }
    Arc::from(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::validate::tests::{PODS, attestors, policy as load};

    fn policy() -> CompiledPolicy {
        let selection = "matchImageReferences:\n- glob: 'ghcr.io/acme/*'\n- expression: ref.endsWith(':edge')\n";
        let spec = format!(
            "{PODS}{selection}{}validations:\n- expression: 'true'\n",
            attestors(&["cosign"])
        );
        load("facts", &spec)
    }

    #[test]
    fn kept_image_facts_are_the_fresh_ones() {
        let policy = policy();
        let facts = PolicyFacts::of(&policy);
        assert!(
            Arc::ptr_eq(&facts, &PolicyFacts::of(&policy)),
            "derived once"
        );
        let digest = "@sha256:abababababababababababababababababababababababababababababababab";
        let mut images: Vec<String> = [
            "ghcr.io/acme/app:1",
            "GHCR.IO/acme/app:1",
            "ghcr.io/other/app:1",
            "busybox:edge",
            "docker.io/library/busybox",
            "not a reference:edge",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        images.push(format!("ghcr.io/acme/pinned{digest}"));
        // More distinct images than are kept: the kept ones are forgotten on the way.
        images.extend((0..KEPT_IMAGES + 10).map(|i| format!("ghcr.io/acme/app{i}:1")));
        for round in 0..2 {
            for image in &images {
                let fresh = images::matches_image(&policy, image).map_err(|e| e.to_string());
                let kept = facts
                    .matches_image(&policy, image)
                    .map_err(|e| e.to_string());
                assert_eq!(kept, fresh, "{image} (round {round})");
                assert_eq!(
                    format!("{:?}", facts.reference(&policy, image)),
                    format!("{:?}", ImageReference::parse(image)),
                    "{image}"
                );
            }
            let kept = facts.images.read().map(|m| m.len()).unwrap_or(usize::MAX);
            assert!(kept <= KEPT_IMAGES, "{kept} kept");
        }
        assert_eq!(
            facts.matches_image(&policy, "busybox:edge").ok(),
            Some(true)
        );
        assert_eq!(
            facts.matches_image(&policy, "ghcr.io/other/app:1").ok(),
            Some(false)
        );
    }

    #[test]
    fn all_policies_together_keep_a_bounded_number_of_images() {
        // Enough policies that their own bounds together exceed the bound of all.
        let policies: Vec<CompiledPolicy> = (0..KEPT_IMAGES_IN_ALL / KEPT_IMAGES + 2)
            .map(|_| policy())
            .collect();
        for policy in &policies {
            let facts = PolicyFacts::of(policy);
            for i in 0..KEPT_IMAGES - 1 {
                let image = format!("ghcr.io/acme/app{i}:1");
                assert_eq!(facts.matches_image(policy, &image).ok(), Some(true));
            }
        }
        let kept: usize = policies
            .iter()
            .map(|p| {
                PolicyFacts::of(p)
                    .images
                    .read()
                    .map(|m| m.len())
                    .unwrap_or(0)
            })
            .sum();
        assert!(kept <= KEPT_IMAGES_IN_ALL, "{kept} kept");
        assert!(KEPT_IN_ALL.load(Ordering::Relaxed) <= KEPT_IMAGES_IN_ALL);
        drop(policies);
    }

    #[test]
    fn a_clone_derives_its_own_facts() {
        let policy = policy();
        let facts = PolicyFacts::of(&policy);
        assert!(facts.attestors.is_some() && facts.pure);
        let mut changed = policy.clone();
        changed.attestors.clear();
        let changed_facts = PolicyFacts::of(&changed);
        assert!(!Arc::ptr_eq(&facts, &changed_facts));
        assert!(changed_facts.attestor_keys.is_empty());
        assert_eq!(facts.attestor_keys.len(), 1);
    }
}
