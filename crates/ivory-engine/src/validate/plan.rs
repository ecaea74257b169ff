//! Everything a policy needs before any network call: matching, matchConditions, image
//! extraction and filtering, `verifyDigest`, attestor CEL fields, and the list of
//! verification questions to prefetch.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use ivory_cel::CostBudget;
use ivory_policy::VerifyPlatforms;
use ivory_policy::compiled::{CompiledAttestor, CompiledPolicy};
use ivory_policy::types::{Attestor, FailurePolicy};
use serde_json::Value as Json;

use super::calls::{IMAGE_DATA_FUNCTIONS, programs};
use super::context::{AttestorsBinding, Evaluator, ExprError};
use super::facts::{PolicyFacts, fingerprint};
use super::outcome::{self, Evaluated};
use super::prefetch::{JobSet, LateImageData, Outcome, VerifyKey, VerifyPrints};
use super::{EVAL_FAILED, result};
use crate::admission::{AdmissionRequest, AdmittedObject};
use crate::bindings::RequestBindings;
use crate::decision::{PolicyResult, Status};
use crate::matching::MatchError;
use crate::resources::host::ClusterHost;
use crate::verifier::{ImagePlatform, ImageRefError, ImageReference, PlatformScope, VerifyRequest};
use crate::{images, matching};

/// A policy that matched and is ready for evaluation once the prefetch is done.
pub(super) struct Plan<'a> {
    pub(super) policy: &'a CompiledPolicy,
    /// What is derived from the policy once per policy version.
    pub(super) facts: Arc<PolicyFacts>,
    /// Answers the policy's cluster reads (`resource.*`, `globalContext.*`).
    pub(super) cluster: &'a ClusterHost<'a>,
    /// The request's bindings, shared by every policy.
    data: &'a RequestBindings<'a>,
    /// The evaluator that ran the policy's CEL before the prefetch, if any did; the first
    /// evaluation continues with it (and its cost budget), or builds one.
    eval: Option<Evaluator<'a>>,
    /// Whether the first evaluation has taken its evaluator.
    evaluated: bool,
    /// The cost budget of the first evaluation, charged again by later ones.
    budget: Option<Arc<CostBudget>>,
    /// The `attestors` binding of this request.
    attestors: AttestorsBinding,
    /// What a later evaluation of a policy that reads image data needs.
    pub(super) again: Option<Again>,
    /// The `images` binding: images after matchImageReferences, by extractor. Shared with the
    /// request's built-in images when the policy keeps them all, and with its memo key.
    pub(super) images: Arc<ImagesByExtractor>,
    /// Images after matchImageReferences, flat, first occurrence order.
    pub(super) matched: Vec<String>,
    /// Each of `matched` parsed, once: what crosses into the verifier, or why it cannot.
    pub(super) references: Vec<Result<ImageReference, ImageRefError>>,
    pub(super) notary_attestors: Vec<String>,
    pub(super) keys: BTreeMap<VerifyKey, usize>,
    pub(super) image_data: BTreeMap<String, usize>,
    /// `verifyDigest`: matched tag images (sorted) and their resolve job, asked so that a
    /// registry that cannot answer is told apart from an image that was simply not pinned.
    pub(super) undigested: Vec<(String, usize)>,
    /// Image data fetched after an evaluation asked for it (see [`super::evaluate::Run`]).
    pub(super) late_image_data: BTreeMap<String, LateImageData>,
}

/// What a policy that reads image data is evaluated again with, after more image data was
/// fetched (charged to the first evaluation's cost budget, so evaluating again buys no extra
/// CEL).
pub(super) struct Again {
    /// The workload's platform: which manifest of an index image data describes.
    platform: ImagePlatform,
}

impl<'a> Plan<'a> {
    /// Whether the policy can be evaluated again (only one that reads image data is).
    pub(super) fn can_evaluate_again(&self) -> bool {
        self.again.is_some()
    }

    /// The workload's platform, for a policy that reads image data.
    pub(super) fn platform(&self) -> Option<&ImagePlatform> {
        self.again.as_ref().map(|again| &again.platform)
    }

    /// The evaluator of the policy's next evaluation, with `images`, `attestors` and
    /// `attestations` bound; `None` when it was evaluated and cannot be again
    /// ([`Plan::can_evaluate_again`]). Built only here, so a policy whose result the memo
    /// answers never builds one.
    pub(super) fn evaluator(&mut self) -> Option<Evaluator<'a>> {
        let mut eval = if self.evaluated {
            self.again.as_ref()?;
            let mut eval = Evaluator::new(self.data, self.policy, self.cluster);
            if let Some(budget) = &self.budget {
                eval.share_budget(Arc::clone(budget));
            }
            eval
        } else {
            self.evaluated = true;
            let eval = self
                .eval
                .take()
                .unwrap_or_else(|| Evaluator::new(self.data, self.policy, self.cluster));
            self.budget = eval.shared_budget();
            eval
        };
        eval.bind_policy(
            &self.images,
            &self.attestors,
            Arc::clone(&self.facts.attestations),
        );
        Some(eval)
    }
}

/// A policy's evaluator before the prefetch, built the first time its CEL is needed: most
/// policies need none there (no matchConditions, image extractors or CEL attestor fields).
struct LazyEvaluator<'a> {
    data: &'a RequestBindings<'a>,
    policy: &'a CompiledPolicy,
    cluster: &'a ClusterHost<'a>,
    eval: Option<Evaluator<'a>>,
}

impl<'a> LazyEvaluator<'a> {
    fn get(&mut self) -> &mut Evaluator<'a> {
        self.eval
            .get_or_insert_with(|| Evaluator::new(self.data, self.policy, self.cluster))
    }

    /// Why an evaluation stopped on the cost limits or the deadline, if one did.
    fn over_budget(&self) -> Option<&str> {
        self.eval.as_ref().and_then(Evaluator::over_budget)
    }
}

pub(super) enum Prepared<'a> {
    /// matchConstraints/matchConditions did not select the request: no result at all.
    NotMatched,
    /// Decided before verification (matching error, extraction error, missing digest, ...).
    Done(PolicyResult),
    /// Stopped by the CEL cost limits or the deadline before verification.
    Evaluated(Evaluated),
    Ready(Box<Plan<'a>>),
}

/// Images by the extractor that found them (`containers`, `initContainers`, …, or a policy's
/// own `spec.images` names): the `images` binding.
pub(super) type ImagesByExtractor = BTreeMap<String, Vec<String>>;

/// Inputs shared by all policies of one request.
pub(super) struct RequestInputs<'a> {
    pub(super) req: &'a AdmissionRequest,
    pub(super) namespace_object: Option<&'a Json>,
    pub(super) data: &'a RequestBindings<'a>,
    /// Built-in extractor output (Kubernetes mode), unfiltered.
    pub(super) builtin: &'a Arc<ImagesByExtractor>,
}

pub(super) fn prepare<'a>(
    policy: &'a CompiledPolicy,
    cluster: &'a ClusterHost<'a>,
    inputs: &RequestInputs<'a>,
    jobs: &mut JobSet,
) -> Prepared<'a> {
    let fail = |status: Status, message: String, images: &[String]| {
        Prepared::Done(result(policy, status, message, images.to_vec()))
    };
    // JSON payloads have no resource: a JSON-mode policy without rules matches every payload.
    let skip_constraints = policy.json_mode && policy.match_constraints.resource_rules.is_empty();
    if !skip_constraints {
        match matching::matches_constraints(policy, inputs.req, inputs.namespace_object) {
            Ok(true) => {}
            Ok(false) => return Prepared::NotMatched,
            Err(e) => {
                return fail(
                    Status::Error,
                    format!("failed to execute matching: {e}"),
                    &[],
                );
            }
        }
    }
    let facts = PolicyFacts::of(policy);
    let mut eval = LazyEvaluator {
        data: inputs.data,
        policy,
        cluster,
        eval: None,
    };
    // A cluster read that could not be answered before verification (in a variable an
    // attestor or extractor reads) leaves the policy to its failurePolicy.
    let cluster_failed = |images: &[String]| {
        cluster.failure_since(0).map(|err| {
            Prepared::Evaluated(outcome::cluster_unavailable(policy, &err, images.to_vec()))
        })
    };
    let over_budget = |eval: &LazyEvaluator<'_>, images: &[String]| {
        eval.over_budget()
            .map(|why| Prepared::Evaluated(outcome::over_budget(policy, why, images.to_vec())))
    };
    match match_conditions(policy, &mut eval) {
        Ok(true) => {}
        _ if eval.over_budget().is_some() => {
            return over_budget(&eval, &[]).unwrap_or(Prepared::NotMatched);
        }
        Ok(false) => return Prepared::NotMatched,
        Err(e) => return fail(Status::Error, format!("{EVAL_FAILED}: {e}"), &[]),
    }

    let extracted = match extract_images(policy, inputs.builtin, &mut eval) {
        Ok(images) => images,
        Err(message) => {
            return over_budget(&eval, &[])
                .or_else(|| cluster_failed(&[]))
                .unwrap_or_else(|| fail(Status::Error, format!("{EVAL_FAILED}: {message}"), &[]));
        }
    };
    let images = match selected_images(extracted, |image| facts.matches_image(policy, image)) {
        Ok(images) => images,
        Err(e) => return fail(Status::Error, format!("{EVAL_FAILED}: {e}"), &[]),
    };
    let matched = flatten(&images);
    // Parsed once, here, where the images leave the request: every later step (verifyDigest,
    // the verifier, the registry) takes the parsed reference.
    let references: Vec<Result<ImageReference, ImageRefError>> = matched
        .iter()
        .map(|image| facts.reference(policy, image))
        .collect();
    let undigested = match resolve_jobs(policy, &facts, inputs, &matched, &references, jobs) {
        Ok(undigested) => undigested,
        Err(image) => {
            let message = format!("image {image} does not have a digest");
            return fail(Status::Fail, message, &matched);
        }
    };

    // Kyverno evaluates an attestor only when CEL reads it, which the image comprehensions of a
    // request that selected no image never do: such a request evaluates no CEL-sourced field,
    // so a field that cannot be evaluated for it (a key read from a ConfigMap by the request's
    // namespace, say) decides nothing.
    let evaluator = (!matched.is_empty()).then_some(&mut eval);
    let attestors = match evaluate_attestors(policy, &facts, evaluator) {
        Ok(attestors) => attestors,
        Err(message) => {
            return over_budget(&eval, &matched)
                .or_else(|| cluster_failed(&matched))
                .unwrap_or_else(|| {
                    fail(Status::Error, format!("{EVAL_FAILED}: {message}"), &matched)
                });
        }
    };
    // Only a policy that reads image data needs the workload's platform or a second evaluation.
    let again = facts.reads_image_data.then(|| Again {
        platform: ImagePlatform::of_workload(inputs.req.object.as_ref().map(AdmittedObject::value)),
    });

    let mut plan = Plan {
        policy,
        facts,
        cluster,
        data: inputs.data,
        eval: eval.eval,
        evaluated: false,
        budget: None,
        attestors: attestors.binding,
        again,
        notary_attestors: attestors
            .list
            .iter()
            .filter(|(a, _)| a.notary.is_some())
            .map(|(a, _)| a.name.clone())
            .collect(),
        images,
        matched,
        references,
        keys: BTreeMap::new(),
        image_data: BTreeMap::new(),
        undigested,
        late_image_data: BTreeMap::new(),
    };
    // Only `podPlatform` reads the workload, and only then is its tree built.
    let workload = match policy.verify_platforms {
        VerifyPlatforms::PodPlatform => inputs.req.object.as_ref().map(AdmittedObject::value),
        VerifyPlatforms::Index | VerifyPlatforms::AllPlatforms => None,
    };
    let platforms = PlatformScope::of_policy(policy.verify_platforms, workload);
    plan_jobs(&mut plan, &attestors.list, &platforms, jobs);
    Prepared::Ready(Box::new(plan))
}

/// The images `verifyDigest` wants pinned and written without a digest, smallest first, each
/// with the job that resolves its tag; `Err` names the smallest that is not even a reference
/// (no registry to ask, so it can never be pinned; container order never changes the message).
fn resolve_jobs<'i>(
    policy: &CompiledPolicy,
    facts: &PolicyFacts,
    inputs: &RequestInputs<'_>,
    matched: &'i [String],
    references: &[Result<ImageReference, ImageRefError>],
    jobs: &mut JobSet,
) -> Result<Vec<(String, usize)>, &'i str> {
    if !(policy.verify_digest && demands_digest(policy, inputs)) {
        return Ok(Vec::new());
    }
    let mut undigested: Vec<(&String, Option<&ImageReference>)> = matched
        .iter()
        .zip(references)
        .filter(|(_, r)| !has_digest(r))
        .map(|(image, r)| (image, r.as_ref().ok()))
        .collect();
    undigested.sort_by_key(|(image, _)| *image);
    let mut resolvable = Vec::with_capacity(undigested.len());
    for (image, reference) in undigested {
        let Some(reference) = reference else {
            return Err(image);
        };
        resolvable.push((image.clone(), reference.clone()));
    }
    Ok(resolvable
        .into_iter()
        .map(|(image, reference)| {
            let credentials = policy.credentials().cloned();
            let job = jobs.resolve(reference, credentials, &facts.credentials_key);
            (image, job)
        })
        .collect())
}

/// Whether `verifyDigest` applies to this request: only where the policy's pinning mode
/// ([`Pinning`](ivory_policy::compiled::Pinning), narrowed by the namespace) pins, since an
/// image the mutating stage left as a tag on purpose cannot carry a digest. A tag image is
/// still verified: the verifier resolves it and verifies that digest, which is what the
/// kubelet pulls unless the tag moves in between (docs/kyverno-semantics.md §3).
fn demands_digest(policy: &CompiledPolicy, inputs: &RequestInputs<'_>) -> bool {
    let kind = inputs
        .req
        .subject()
        .and_then(AdmittedObject::kind)
        .unwrap_or(&inputs.req.kind.kind);
    policy.pinning_for(inputs.namespace_object).pins(kind)
}

/// All conditions true ⇒ matched; any false ⇒ not matched (even if another errored); else an
/// error is "not matched" under `failurePolicy: Ignore` and a policy error under `Fail`.
fn match_conditions(
    policy: &CompiledPolicy,
    eval: &mut LazyEvaluator<'_>,
) -> Result<bool, matching::MatchError> {
    let mut first_error = None;
    for condition in &policy.match_conditions {
        match eval.get().bool(&condition.program) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => {
                first_error.get_or_insert_with(|| matching::MatchError::Condition {
                    name: condition.name.clone(),
                    message: e.to_string(),
                });
            }
        }
    }
    match (first_error, policy.failure_policy) {
        (None, _) => Ok(true),
        (Some(_), FailurePolicy::Ignore) => Ok(false),
        (Some(e), FailurePolicy::Fail) => Err(e),
    }
}

/// Why a policy's images or attestors could not be had from its CEL; the text follows
/// `failed to evaluate policy: ` in the policy result.
#[derive(Debug, thiserror::Error)]
enum PrepareError {
    /// A `spec.images` extractor failed.
    #[error("images.{extractor}: {source}")]
    Extractor {
        extractor: String,
        source: ExprError,
    },
    /// A `spec.images` extractor yielded something other than a list of strings.
    #[error("images.{extractor}: expected {expected}, got {got}")]
    ExtractorType {
        extractor: String,
        expected: &'static str,
        got: Json,
    },
    /// A CEL-sourced attestor field failed.
    #[error("attestor {attestor}: {pointer}: {source}")]
    AttestorField {
        attestor: String,
        pointer: String,
        source: ExprError,
    },
    /// A CEL-sourced attestor field's pointer cannot be written.
    #[error("attestor {attestor}: {source}")]
    AttestorPointer {
        attestor: String,
        source: PointerError,
    },
    /// The attestor with its fields filled in is not a valid attestor.
    #[error("attestor {attestor}: {source}")]
    AttestorDecode {
        attestor: String,
        source: serde_json::Error,
    },
}

/// A field pointer of a compiled attestor that does not fit its JSON.
#[derive(Debug, thiserror::Error)]
enum PointerError {
    #[error("invalid field pointer {0:?}")]
    Invalid(String),
    #[error("field pointer {0:?} names no array element")]
    NoArrayElement(String),
    #[error("field pointer {0:?} crosses a non-object")]
    CrossesNonObject(String),
}

/// Built-in extractors (Kubernetes mode only), then `spec.images` (same name overrides).
fn extract_images<'b>(
    policy: &CompiledPolicy,
    builtin: &'b Arc<ImagesByExtractor>,
    eval: &mut LazyEvaluator<'_>,
) -> Result<Cow<'b, Arc<ImagesByExtractor>>, PrepareError> {
    if policy.image_extractors.is_empty() && !policy.json_mode {
        return Ok(Cow::Borrowed(builtin));
    }
    let mut images = if policy.json_mode {
        BTreeMap::new()
    } else {
        BTreeMap::clone(builtin)
    };
    for extractor in &policy.image_extractors {
        let value =
            eval.get()
                .json(&extractor.program)
                .map_err(|source| PrepareError::Extractor {
                    extractor: extractor.name.clone(),
                    source,
                })?;
        images.insert(extractor.name.clone(), string_list(&extractor.name, value)?);
    }
    Ok(Cow::Owned(Arc::new(images)))
}

/// `images` after the policy's selection (`selects`): the same map, shared, when it selects
/// every image (a policy that selects all, or whose globs every image of the request meets),
/// else a copy with only the selected ones ([`images::filter_images_by`]).
fn selected_images(
    images: Cow<'_, Arc<ImagesByExtractor>>,
    selects: impl FnMut(&str) -> Result<bool, MatchError>,
) -> Result<Arc<ImagesByExtractor>, MatchError> {
    Ok(match images::filter_images_by(&images, selects)? {
        Some(filtered) => Arc::new(filtered),
        None => images.into_owned(),
    })
}

fn string_list(name: &str, value: Json) -> Result<Vec<String>, PrepareError> {
    let wrong = |expected, got| PrepareError::ExtractorType {
        extractor: name.to_owned(),
        expected,
        got,
    };
    let Json::Array(items) = value else {
        return Err(wrong("a list of strings", value));
    };
    items
        .into_iter()
        .map(|item| match item {
            Json::String(s) => Ok(s),
            other => Err(wrong("a string", other)),
        })
        .collect()
}

/// The images of all extractors (by extractor name), de-duplicated.
fn flatten(images: &ImagesByExtractor) -> Vec<String> {
    let mut flat: Vec<String> = Vec::new();
    for image in images.values().flatten() {
        if !flat.contains(image) {
            flat.push(image.clone());
        }
    }
    flat
}

/// A digest reference as go-containerregistry `name.NewDigest` accepts it.
fn has_digest(reference: &Result<ImageReference, ImageRefError>) -> bool {
    reference.as_ref().is_ok_and(|r| r.digest().is_some())
}

/// A policy's attestors for one request.
struct Attestors<'p> {
    /// Each attestor with its CEL-sourced fields filled in, and its fingerprint.
    list: Vec<(Cow<'p, Attestor>, Arc<str>)>,
    /// The `attestors` binding (name → object).
    binding: AttestorsBinding,
}

/// Evaluates each attestor's CEL-sourced fields into place. Static attestors (the usual case)
/// are borrowed from the policy, with the binding and fingerprints made once per policy version.
/// Without an evaluator (a request whose policy selected no image, so nothing is verified with
/// them) the CEL-sourced fields stay as written.
fn evaluate_attestors<'p>(
    policy: &'p CompiledPolicy,
    facts: &PolicyFacts,
    mut eval: Option<&mut LazyEvaluator<'_>>,
) -> Result<Attestors<'p>, PrepareError> {
    let mut list = Vec::with_capacity(policy.attestors.len());
    let mut binding = serde_json::Map::new();
    for (compiled, key) in policy.attestors.iter().zip(&facts.attestor_keys) {
        let (attestor, json) = match (key, eval.as_deref_mut()) {
            (Some(key), _) => (
                (Cow::Borrowed(&compiled.attestor), Arc::clone(key)),
                Cow::Borrowed(&compiled.json),
            ),
            (None, Some(eval)) => {
                let (attestor, json) = evaluate_attestor(compiled, eval.get())?;
                let key = fingerprint(&attestor);
                ((Cow::Owned(attestor), key), Cow::Owned(json))
            }
            (None, None) => (
                (
                    Cow::Borrowed(&compiled.attestor),
                    fingerprint(&compiled.attestor),
                ),
                Cow::Borrowed(&compiled.json),
            ),
        };
        if facts.attestors.is_none() {
            binding.insert(compiled.attestor.name.clone(), json.into_owned());
        }
        list.push(attestor);
    }
    let binding = match &facts.attestors {
        Some(shared) => AttestorsBinding::Shared(Arc::clone(shared)),
        None => AttestorsBinding::Json(Json::Object(binding)),
    };
    Ok(Attestors { list, binding })
}

/// One attestor with its CEL-sourced fields evaluated into place, and its JSON for CEL.
fn evaluate_attestor(
    compiled: &CompiledAttestor,
    eval: &mut Evaluator<'_>,
) -> Result<(Attestor, Json), PrepareError> {
    let name = &compiled.attestor.name;
    let mut json = compiled.json.clone();
    for (pointer, program) in &compiled.fields {
        let value = eval
            .string(program)
            .map_err(|source| PrepareError::AttestorField {
                attestor: name.clone(),
                pointer: pointer.clone(),
                source,
            })?;
        set_pointer(&mut json, pointer, Json::String(value)).map_err(|source| {
            PrepareError::AttestorPointer {
                attestor: name.clone(),
                source,
            }
        })?;
    }
    let mut attestor: Attestor =
        serde_json::from_value(json.clone()).map_err(|source| PrepareError::AttestorDecode {
            attestor: name.clone(),
            source,
        })?;
    // The Notation trust policy comes from an annotation, never from the attestor's JSON
    // (which does not deserialize it): carried over as compiled.
    if let (Some(notary), Some(compiled)) =
        (attestor.notary.as_mut(), compiled.attestor.notary.as_ref())
    {
        notary.trust_policy = compiled.trust_policy.clone();
    }
    Ok((attestor, json))
}

/// Writes `value` at RFC 6901 `pointer`, creating objects on the way; a numeric token steps into
/// an existing array element.
fn set_pointer(root: &mut Json, pointer: &str, value: Json) -> Result<(), PointerError> {
    let mut target = root;
    let tokens: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some((last, parents)) = tokens.split_last() else {
        return Err(PointerError::Invalid(pointer.to_owned()));
    };
    for token in parents {
        if target.is_null() {
            *target = Json::Object(serde_json::Map::new());
        }
        target = match target {
            Json::Object(map) => map.entry(token.clone()).or_insert(Json::Null),
            Json::Array(items) => token
                .parse::<usize>()
                .ok()
                .and_then(|i| items.get_mut(i))
                .ok_or_else(|| PointerError::NoArrayElement(pointer.to_owned()))?,
            _ => return Err(PointerError::CrossesNonObject(pointer.to_owned())),
        };
    }
    if target.is_null() {
        *target = Json::Object(serde_json::Map::new());
    }
    let Json::Object(map) = target else {
        return Err(PointerError::CrossesNonObject(pointer.to_owned()));
    };
    map.insert(last.clone(), value);
    Ok(())
}

/// Registers every question the policy's CEL can ask: matched images × attestors (× attestations),
/// and image data for the matched images and the images its expressions name as literals.
/// Nothing is prefetched for the request's other images: their image data is fetched only once
/// an expression asks for it ([`super::evaluate::Run::Wants`]), so a registry the policy does
/// not cover is asked only when, and matters only where, an expression reads its answer. Image
/// data describes the manifest for the workload's platform.
fn plan_jobs(
    plan: &mut Plan<'_>,
    attestors: &[(Cow<'_, Attestor>, Arc<str>)],
    platforms: &PlatformScope,
    jobs: &mut JobSet,
) {
    let policy = plan.policy;
    let facts = Arc::clone(&plan.facts);
    let credentials = policy.credentials().cloned();
    let mut attestations = Vec::new();
    if facts.calls_signatures {
        attestations.push(None);
    }
    if facts.calls_attestations {
        attestations.extend(
            policy
                .attestations
                .iter()
                .zip(&facts.attestation_keys)
                .map(Some),
        );
    }
    for (image, reference) in plan.matched.iter().zip(&plan.references) {
        for attestation in &attestations {
            for (attestor, attestor_key) in attestors {
                // The host rejects notary × in-toto before looking anything up (Kyverno's error).
                if attestor.notary.is_some() && attestation.is_some_and(|(a, _)| a.intoto.is_some())
                {
                    continue;
                }
                let index = match reference {
                    Ok(reference) => {
                        let request = VerifyRequest {
                            image: reference.clone(),
                            attestor: attestor.as_ref().clone(),
                            attestation: attestation.map(|(a, _)| a.clone()),
                            credentials: credentials.clone(),
                            platforms: platforms.clone(),
                        };
                        let prints = VerifyPrints {
                            attestor: attestor_key,
                            attestation: attestation.map(|(_, key)| key),
                            credentials: &facts.credentials_key,
                        };
                        jobs.verify(request, &prints)
                    }
                    Err(e) => jobs.settled(Outcome::Verify(Err(
                        crate::verifier::VerifyError::invalid_reference(image, e),
                    ))),
                };
                let key = VerifyKey {
                    image: image.clone(),
                    attestor: attestor.name.clone(),
                    attestation: attestation.map(|(a, _)| a.name.clone()),
                };
                plan.keys.insert(key, index);
            }
        }
    }
    if let Some(platform) = plan.platform().cloned() {
        // Literal images are the policy author's, like its globs: asked with the prefetch, so a
        // policy that reads one is evaluated once.
        let literals = programs(policy).flat_map(|p| {
            IMAGE_DATA_FUNCTIONS
                .iter()
                .flat_map(move |f| p.literal_arguments(f))
        });
        let literals = literals.filter_map(|image| {
            ImageReference::parse(image)
                .ok()
                .map(|reference| (image.to_owned(), Ok(reference)))
        });
        let matched = plan
            .matched
            .iter()
            .cloned()
            .zip(plan.references.iter().cloned());
        let images: Vec<(String, Result<ImageReference, ImageRefError>)> =
            matched.chain(literals).collect();
        for (image, reference) in images {
            if let std::collections::btree_map::Entry::Vacant(slot) = plan.image_data.entry(image) {
                let job = match reference {
                    Ok(reference) => jobs.image_data(
                        reference,
                        credentials.clone(),
                        &facts.credentials_key,
                        platform.clone(),
                    ),
                    Err(e) => jobs.settled(Outcome::ImageData(Err(
                        crate::verifier::VerifyError::invalid_reference(slot.key(), &e),
                    ))),
                };
                slot.insert(job);
            }
        }
    }
}
