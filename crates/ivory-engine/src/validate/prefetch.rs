//! Concurrent prefetch of every verification answer a policy's CEL can ask for. cel-rust is
//! synchronous, so the network work happens here, before evaluation, under the request deadline.

use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use futures::future::join_all;
use ivory_plumbing::keyed::KeyedMap;
use ivory_policy::types::Credentials;
use serde_json::Value;
use tokio::time::{Instant, timeout_at};

use crate::verifier::{
    ImagePlatform, ImageRefError, ImageReference, ImageVerifier, PlatformScope, Verification,
    VerifyError, VerifyRequest,
};

/// One (image, attestor, attestation) question as a policy's CEL names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct VerifyKey {
    pub(super) image: String,
    pub(super) attestor: String,
    pub(super) attestation: Option<String>,
}

/// One call to the verifier, or an answer settled before any call.
#[derive(Clone, Debug)]
pub(super) enum Job {
    Verify(Box<VerifyRequest>),
    ImageData {
        image: ImageReference,
        credentials: Option<Credentials>,
        /// The workload's platform: which manifest of an index is described.
        platform: ImagePlatform,
    },
    /// `verifyDigest` on a tag: can the registry be asked at all?
    Resolve {
        image: ImageReference,
        credentials: Option<Credentials>,
    },
    /// An image that is not a reference: its answer is this error, and the verifier is never
    /// asked ([`VerifyError::invalid_reference`]).
    Settled(Outcome),
}

impl Job {
    fn operation(&self) -> String {
        match self {
            Self::Verify(request) => match &request.attestation {
                None => format!(
                    "verifying the signature with attestor {}",
                    request.attestor.name
                ),
                Some(att) => format!(
                    "verifying attestation {} with attestor {}",
                    att.name, request.attestor.name
                ),
            },
            Self::ImageData { .. } => "fetching image data".to_owned(),
            Self::Resolve { .. } => "resolving the image digest".to_owned(),
            Self::Settled(_) => String::new(),
        }
    }
}

/// What makes two jobs the same question: identical questions from several policies are
/// asked once. Attestors, attestations and credentials are compared by the fingerprints of
/// their JSON ([`super::facts::fingerprint`]), made once per policy version.
#[derive(Debug, PartialEq, Eq)]
enum JobKey {
    Verify {
        image: String,
        attestor: Arc<str>,
        attestation: Option<Arc<str>>,
        credentials: Arc<str>,
        platforms: PlatformScope,
    },
    ImageData {
        image: String,
        credentials: Arc<str>,
        platform: ImagePlatform,
    },
    Resolve {
        image: String,
        credentials: Arc<str>,
    },
}

impl Hash for JobKey {
    // Fingerprints are hex SHA-256: their first bytes spread keys as well as all of them do,
    // at a fraction of the hashing. Equal keys still hash alike (equal prints, equal prefixes).
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Self::Verify {
                image,
                attestor,
                attestation,
                credentials,
                platforms,
            } => {
                image.hash(state);
                hash_print(attestor, state);
                attestation.is_some().hash(state);
                if let Some(attestation) = attestation {
                    hash_print(attestation, state);
                }
                hash_print(credentials, state);
                platforms.hash(state);
            }
            Self::ImageData {
                image,
                credentials,
                platform,
            } => {
                image.hash(state);
                hash_print(credentials, state);
                platform.hash(state);
            }
            Self::Resolve { image, credentials } => {
                image.hash(state);
                hash_print(credentials, state);
            }
        }
    }
}

/// Hex digits of a fingerprint that [`JobKey`]'s hash reads: 64 bits.
const PRINT_HASHED: usize = 16;

fn hash_print<H: Hasher>(print: &str, state: &mut H) {
    let bytes = print.as_bytes();
    state.write(bytes.get(..PRINT_HASHED).unwrap_or(bytes));
}

/// The fingerprints of what a verification request carries besides its image.
pub(super) struct VerifyPrints<'f> {
    /// Of `attestor`.
    pub(super) attestor: &'f Arc<str>,
    /// Of `attestation`.
    pub(super) attestation: Option<&'f Arc<str>>,
    /// Of `credentials`.
    pub(super) credentials: &'f Arc<str>,
}

/// The answer to one [`Job`].
#[derive(Clone, Debug)]
pub(super) enum Outcome {
    Verify(Result<Verification, VerifyError>),
    ImageData(Result<Value, VerifyError>),
    Resolve(Result<String, VerifyError>),
}

/// Image data an evaluation asked for after the prefetch (an image the policy does not
/// select, a literal): the answer, or why ivory would not ask a registry for it.
#[derive(Clone, Debug)]
pub(super) enum LateImageData {
    Answer(Result<Value, VerifyError>),
    Refused(Refusal),
}

/// Why ivory did not fetch the data of an image an expression named late; the text is the
/// expression's error (after `failed to get imagedata: `).
#[derive(Clone, Debug, thiserror::Error)]
pub(super) enum Refusal {
    /// The name is not an image reference.
    #[error("invalid image reference {image}: {}", .error.reason)]
    InvalidReference { image: String, error: ImageRefError },
    /// The registry is a metadata, link-local or unspecified address literal.
    #[error(
        "image {image} names {ip}, {class}: ivory never fetches image data a request chooses from there ({} widens only the policy's own images)",
        ivory_reference::EGRESS_ALLOW_FLAG
    )]
    Address {
        image: String,
        ip: IpAddr,
        class: ivory_reference::AddressClass,
    },
    /// The request already named `max` other images (`late::MAX_LATE_IMAGES`).
    #[error(
        "image {image}: ivory fetches image data for at most {max} images outside the policy's matchImageReferences per request"
    )]
    TooMany { image: String, max: usize },
    /// Asked, but no answer came back (the request's deadline).
    #[error("image data of {image} was not fetched")]
    NotFetched { image: String },
}

/// The jobs of all policies of one request, de-duplicated.
#[derive(Debug, Default)]
pub(super) struct JobSet {
    jobs: Vec<Job>,
    seen: KeyedMap<JobKey, usize>,
}

impl JobSet {
    /// Adds the verification `request` (whose attestor, attestation and credentials have the
    /// fingerprints `prints`), or finds its twin; returns its index in the eventual
    /// [`Prefetched`].
    pub(super) fn verify(&mut self, request: VerifyRequest, prints: &VerifyPrints<'_>) -> usize {
        let key = JobKey::Verify {
            image: request.image.original().to_owned(),
            attestor: Arc::clone(prints.attestor),
            attestation: prints.attestation.cloned(),
            credentials: Arc::clone(prints.credentials),
            platforms: request.platforms.clone(),
        };
        self.add(Job::Verify(Box::new(request)), Some(key))
    }

    /// Adds a request for the image data of `image` on `platform` (pulled with `credentials`,
    /// whose fingerprint is `credentials_key`), or finds its twin.
    pub(super) fn image_data(
        &mut self,
        image: ImageReference,
        credentials: Option<Credentials>,
        credentials_key: &Arc<str>,
        platform: ImagePlatform,
    ) -> usize {
        let key = JobKey::ImageData {
            image: image.original().to_owned(),
            credentials: Arc::clone(credentials_key),
            platform: platform.clone(),
        };
        let job = Job::ImageData {
            image,
            credentials,
            platform,
        };
        self.add(job, Some(key))
    }

    /// Adds a request to resolve the tag of `image`, or finds its twin.
    pub(super) fn resolve(
        &mut self,
        image: ImageReference,
        credentials: Option<Credentials>,
        credentials_key: &Arc<str>,
    ) -> usize {
        let key = JobKey::Resolve {
            image: image.original().to_owned(),
            credentials: Arc::clone(credentials_key),
        };
        self.add(Job::Resolve { image, credentials }, Some(key))
    }

    /// Adds an answer settled without asking (never shared with another question).
    pub(super) fn settled(&mut self, outcome: Outcome) -> usize {
        self.add(Job::Settled(outcome), None)
    }

    fn add(&mut self, job: Job, key: Option<JobKey>) -> usize {
        let index = self.jobs.len();
        if let Some(key) = key {
            // One hash of the key, whether it is new or a twin's.
            match self.seen.entry(key) {
                Entry::Occupied(twin) => return *twin.get(),
                Entry::Vacant(slot) => {
                    slot.insert(index);
                }
            }
        }
        self.jobs.push(job);
        index
    }

    pub(super) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Each job's verification request, in job order (`None` for a job of another kind).
    pub(super) fn verify_requests(&self) -> impl Iterator<Item = Option<&VerifyRequest>> {
        self.jobs.iter().map(|job| match job {
            Job::Verify(request) => Some(&**request),
            _ => None,
        })
    }
}

/// Answers, indexed like the [`JobSet`] they came from.
#[derive(Debug, Default)]
pub(super) struct Prefetched {
    outcomes: Vec<Outcome>,
}

impl Prefetched {
    pub(super) fn outcome(&self, index: usize) -> Option<&Outcome> {
        self.outcomes.get(index)
    }

    /// The answers, in the order of the jobs.
    pub(super) fn into_outcomes(self) -> Vec<Outcome> {
        self.outcomes
    }

    /// Answers given directly, for tests of what reads them.
    #[cfg(test)]
    pub(super) fn from_outcomes(outcomes: Vec<Outcome>) -> Self {
        Self { outcomes }
    }
}

/// Runs every job concurrently; none outlives `deadline`. `started` is when the request's
/// budget began (for error messages).
pub(super) async fn run(
    verifier: &dyn ImageVerifier,
    jobs: &JobSet,
    started: Instant,
    deadline: Instant,
) -> Prefetched {
    let budget_ms =
        u64::try_from(deadline.saturating_duration_since(started).as_millis()).unwrap_or(u64::MAX);
    let calls = jobs
        .jobs
        .iter()
        .map(|job| run_one(verifier, job, deadline, budget_ms));
    Prefetched {
        outcomes: join_all(calls).await,
    }
}

async fn run_one(
    verifier: &dyn ImageVerifier,
    job: &Job,
    deadline: Instant,
    budget_ms: u64,
) -> Outcome {
    let expired = |image: &ImageReference| {
        let budget = std::time::Duration::from_millis(budget_ms);
        VerifyError::deadline_exceeded(image, &job.operation(), budget)
    };
    match job {
        Job::Verify(request) => Outcome::Verify(match verifier.verify_known(request) {
            Some(known) => Ok(known),
            None => timeout_at(deadline, verifier.verify(request, deadline))
                .await
                .unwrap_or_else(|_| Err(expired(&request.image))),
        }),
        Job::ImageData {
            image,
            credentials,
            platform,
        } => Outcome::ImageData(
            timeout_at(
                deadline,
                verifier.image_data(image, credentials.as_ref(), platform, deadline),
            )
            .await
            .unwrap_or_else(|_| Err(expired(image))),
        ),
        Job::Resolve { image, credentials } => Outcome::Resolve(
            timeout_at(
                deadline,
                verifier.resolve_digest(image, credentials.as_ref(), deadline),
            )
            .await
            .unwrap_or_else(|_| Err(expired(image))),
        ),
        Job::Settled(outcome) => outcome.clone(),
    }
}
