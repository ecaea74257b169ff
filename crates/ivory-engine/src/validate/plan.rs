//! Everything a policy needs before any network call: matching, matchConditions, image
//! extraction and filtering, `verifyDigest`, attestor CEL fields, and the list of
//! verification questions to prefetch.

use std::collections::BTreeMap;
use std::sync::Arc;

use ivory_cel::{CostBudget, Program};
use ivory_policy::VerifyPlatforms;
use ivory_policy::compiled::{CompiledAttestor, CompiledPolicy};
use ivory_policy::types::{Attestor, FailurePolicy};
use serde_json::Value as Json;

use super::context::{Evaluator, ExprError};
use super::outcome::{self, Evaluated};
use super::prefetch::{Job, JobSet, LateImageData, Outcome, VerifyKey};
use super::{EVAL_FAILED, result};
use crate::admission::{AdmissionRequest, AdmittedObject};
use crate::bindings::RequestBindings;
use crate::decision::{PolicyResult, Status};
use crate::resources::host::ClusterHost;
use crate::verifier::{ImagePlatform, ImageRefError, ImageReference, PlatformScope, VerifyRequest};
use crate::{images, matching};

/// CEL functions that need signature verdicts / attestation verdicts / image metadata.
const SIGNATURE_FUNCTIONS: [&str; 1] = ["verifyImageSignatures"];
const ATTESTATION_FUNCTIONS: [&str; 2] = ["verifyAttestationSignatures", "extractPayload"];
pub(super) const IMAGE_DATA_FUNCTIONS: [&str; 5] = [
    "getImageData",
    "image.GetMetadata",
    "image.getMetadata",
    "GetMetadata",
    "getMetadata",
];

/// A policy that matched and is ready for evaluation once the prefetch is done.
pub(super) struct Plan<'a> {
    pub(super) policy: &'a CompiledPolicy,
    /// Answers the policy's cluster reads (`resource.*`, `globalContext.*`).
    pub(super) cluster: &'a ClusterHost<'a>,
    /// Holds the policy's `images`/`attestors`/`attestations` bindings; taken by the first
    /// evaluation ([`Plan::evaluator`] builds the next).
    pub(super) eval: Option<Evaluator<'a>>,
    /// What a later evaluation of a policy that reads image data is built from.
    pub(super) again: Option<Again<'a>>,
    /// The `images` binding: images after matchImageReferences, by extractor.
    pub(super) images: BTreeMap<String, Vec<String>>,
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

/// The bindings of a policy's evaluator, kept to evaluate it again after more image data was
/// fetched: charged to the same cost budget, so evaluating again buys no extra CEL.
pub(super) struct Again<'a> {
    data: &'a RequestBindings<'a>,
    /// The workload's platform: which manifest of an index image data describes.
    platform: ImagePlatform,
    attestors: Json,
    budget: Option<Arc<CostBudget>>,
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

    /// The evaluator of the policy's next evaluation; `None` when it was evaluated and cannot
    /// be again ([`Plan::can_evaluate_again`]).
    pub(super) fn evaluator(&mut self) -> Option<Evaluator<'a>> {
        if let Some(eval) = self.eval.take() {
            return Some(eval);
        }
        let again = self.again.as_ref()?;
        let mut eval = Evaluator::new(again.data, self.policy, self.cluster);
        if let Some(budget) = &again.budget {
            eval.share_budget(Arc::clone(budget));
        }
        eval.bind_policy(
            &self.images,
            again.attestors.clone(),
            self.policy.attestations.iter().map(|a| a.name.clone()),
        );
        Some(eval)
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

/// Inputs shared by all policies of one request.
pub(super) struct RequestInputs<'a> {
    pub(super) req: &'a AdmissionRequest,
    pub(super) namespace_object: Option<&'a Json>,
    pub(super) data: &'a RequestBindings<'a>,
    /// Built-in extractor output (Kubernetes mode), unfiltered.
    pub(super) builtin: &'a BTreeMap<String, Vec<String>>,
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
    let mut eval = Evaluator::new(inputs.data, policy, cluster);
    // A cluster read that could not be answered before verification (in a variable an
    // attestor or extractor reads) leaves the policy to its failurePolicy.
    let cluster_failed = |images: &[String]| {
        cluster.failure_since(0).map(|err| {
            Prepared::Evaluated(outcome::cluster_unavailable(policy, &err, images.to_vec()))
        })
    };
    let over_budget = |eval: &Evaluator<'_>, images: &[String]| {
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
    let images = match images::filter_images(policy, &extracted) {
        Ok(images) => images,
        Err(e) => return fail(Status::Error, format!("{EVAL_FAILED}: {e}"), &[]),
    };
    let matched = flatten(&images);
    // Parsed once, here, where the images leave the request: every later step (verifyDigest,
    // the verifier, the registry) takes the parsed reference.
    let references: Vec<Result<ImageReference, ImageRefError>> = matched
        .iter()
        .map(|image| ImageReference::parse(image))
        .collect();
    let mut undigested: Vec<(&String, Option<&ImageReference>)> =
        if policy.verify_digest && demands_digest(policy, inputs) {
            matched
                .iter()
                .zip(&references)
                .filter(|(_, r)| !has_digest(r))
                .map(|(image, r)| (image, r.as_ref().ok()))
                .collect()
        } else {
            Vec::new()
        };
    undigested.sort_by_key(|(image, _)| *image);
    let mut resolvable = Vec::with_capacity(undigested.len());
    for (image, reference) in undigested {
        // An image that is not even a reference can never be pinned: no registry to ask. The
        // smallest offending image is named, so container order never changes the message.
        let Some(reference) = reference else {
            return fail(
                Status::Fail,
                format!("image {image} does not have a digest"),
                &matched,
            );
        };
        resolvable.push((image.clone(), reference.clone()));
    }
    let undigested: Vec<(String, usize)> = resolvable
        .into_iter()
        .map(|(image, reference)| {
            let job = jobs.add(Job::Resolve {
                image: reference,
                credentials: policy.credentials().cloned(),
            });
            (image, job)
        })
        .collect();

    let attestors = match evaluate_attestors(&policy.attestors, &mut eval) {
        Ok(attestors) => attestors,
        Err(message) => {
            return over_budget(&eval, &matched)
                .or_else(|| cluster_failed(&matched))
                .unwrap_or_else(|| {
                    fail(Status::Error, format!("{EVAL_FAILED}: {message}"), &matched)
                });
        }
    };
    let attestor_map = Json::Object(
        attestors
            .iter()
            .map(|(a, json)| (a.name.clone(), json.clone()))
            .collect(),
    );
    // Only a policy that reads image data needs the workload's platform or a second evaluation,
    // so only its attestor bindings are kept (a copy per request otherwise).
    let kept_attestors = calls_any(policy, &IMAGE_DATA_FUNCTIONS).then(|| attestor_map.clone());
    eval.bind_policy(
        &images,
        attestor_map,
        policy.attestations.iter().map(|a| a.name.clone()),
    );
    let again = kept_attestors.map(|attestors| Again {
        data: inputs.data,
        platform: ImagePlatform::of_workload(inputs.req.object.as_ref().map(AdmittedObject::value)),
        budget: eval.shared_budget(),
        attestors,
    });

    let mut plan = Plan {
        policy,
        cluster,
        eval: Some(eval),
        again,
        notary_attestors: attestors
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
    plan_jobs(&mut plan, &attestors, &platforms, jobs);
    Prepared::Ready(Box::new(plan))
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
    eval: &mut Evaluator<'_>,
) -> Result<bool, matching::MatchError> {
    let mut first_error = None;
    for condition in &policy.match_conditions {
        match eval.bool(&condition.program) {
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
fn extract_images(
    policy: &CompiledPolicy,
    builtin: &BTreeMap<String, Vec<String>>,
    eval: &mut Evaluator<'_>,
) -> Result<BTreeMap<String, Vec<String>>, PrepareError> {
    let mut images = if policy.json_mode {
        BTreeMap::new()
    } else {
        builtin.clone()
    };
    for extractor in &policy.image_extractors {
        let value = eval
            .json(&extractor.program)
            .map_err(|source| PrepareError::Extractor {
                extractor: extractor.name.clone(),
                source,
            })?;
        images.insert(extractor.name.clone(), string_list(&extractor.name, value)?);
    }
    Ok(images)
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
fn flatten(images: &BTreeMap<String, Vec<String>>) -> Vec<String> {
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

/// Evaluates each attestor's CEL-sourced fields into place: (attestor, its JSON for CEL).
fn evaluate_attestors(
    attestors: &[CompiledAttestor],
    eval: &mut Evaluator<'_>,
) -> Result<Vec<(Attestor, Json)>, PrepareError> {
    let mut out = Vec::with_capacity(attestors.len());
    for compiled in attestors {
        let name = &compiled.attestor.name;
        // Static attestors (the usual case) need no per-request serialization round trip.
        if compiled.fields.is_empty() {
            out.push((compiled.attestor.clone(), compiled.json.clone()));
            continue;
        }
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
        let mut attestor: Attestor = serde_json::from_value(json.clone()).map_err(|source| {
            PrepareError::AttestorDecode {
                attestor: name.clone(),
                source,
            }
        })?;
        // The Notation trust policy comes from an annotation, never from the attestor's JSON
        // (which does not deserialize it): carried over as compiled.
        if let (Some(notary), Some(compiled)) =
            (attestor.notary.as_mut(), compiled.attestor.notary.as_ref())
        {
            notary.trust_policy = compiled.trust_policy.clone();
        }
        out.push((attestor, json));
    }
    Ok(out)
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

/// Every program of the policy that runs after the prefetch.
pub(super) fn programs(policy: &CompiledPolicy) -> impl Iterator<Item = &Program> {
    policy
        .validations
        .iter()
        .flat_map(|v| std::iter::once(&v.expression).chain(v.message_expression.as_ref()))
        .chain(policy.variables.iter().map(|v| &v.program))
        .chain(policy.audit_annotations.iter().map(|a| &a.value_expression))
}

fn calls_any(policy: &CompiledPolicy, names: &[&str]) -> bool {
    programs(policy).any(|p| names.iter().any(|n| p.calls_function(n)))
}

/// Registers every question the policy's CEL can ask: matched images × attestors (× attestations),
/// and image data for the matched images and the images its expressions name as literals.
/// Nothing is prefetched for the request's other images: their image data is fetched only once
/// an expression asks for it ([`super::evaluate::Run::Wants`]), so a registry the policy does
/// not cover is asked only when, and matters only where, an expression reads its answer. Image
/// data describes the manifest for the workload's platform.
fn plan_jobs(
    plan: &mut Plan<'_>,
    attestors: &[(Attestor, Json)],
    platforms: &PlatformScope,
    jobs: &mut JobSet,
) {
    let policy = plan.policy;
    let credentials = policy.credentials().cloned();
    let mut attestations = Vec::new();
    if calls_any(policy, &SIGNATURE_FUNCTIONS) {
        attestations.push(None);
    }
    if calls_any(policy, &ATTESTATION_FUNCTIONS) {
        attestations.extend(policy.attestations.iter().map(Some));
    }
    for (image, reference) in plan.matched.iter().zip(&plan.references) {
        for attestation in &attestations {
            for (attestor, _) in attestors {
                // The host rejects notary × in-toto before looking anything up (Kyverno's error).
                if attestor.notary.is_some() && attestation.is_some_and(|a| a.intoto.is_some()) {
                    continue;
                }
                let job = match reference {
                    Ok(reference) => Job::Verify(Box::new(VerifyRequest {
                        image: reference.clone(),
                        attestor: attestor.clone(),
                        attestation: attestation.cloned(),
                        credentials: credentials.clone(),
                        platforms: platforms.clone(),
                    })),
                    Err(e) => Job::Settled(Outcome::Verify(Err(
                        crate::verifier::VerifyError::invalid_reference(image, e),
                    ))),
                };
                let index = jobs.add(job);
                let key = VerifyKey {
                    image: image.clone(),
                    attestor: attestor.name.clone(),
                    attestation: attestation.map(|a| a.name.clone()),
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
                    Ok(reference) => Job::ImageData {
                        image: reference,
                        credentials: credentials.clone(),
                        platform: platform.clone(),
                    },
                    Err(e) => Job::Settled(Outcome::ImageData(Err(
                        crate::verifier::VerifyError::invalid_reference(slot.key(), &e),
                    ))),
                };
                slot.insert(jobs.add(job));
            }
        }
    }
}
