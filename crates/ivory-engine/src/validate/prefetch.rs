//! Concurrent prefetch of every verification answer a policy's CEL can ask for. cel-rust is
//! synchronous, so the network work happens here, before evaluation, under the request deadline.

use std::collections::HashMap;

use futures::future::join_all;
use ivory_policy::types::Credentials;
use serde_json::Value;
use tokio::time::{Instant, timeout_at};

use crate::verifier::{
    ImagePlatform, ImageReference, ImageVerifier, Verification, VerifyError, VerifyRequest,
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

    /// Identical questions from several policies are asked once.
    fn dedupe_key(&self) -> Option<String> {
        let value = match self {
            Self::Verify(r) => serde_json::to_string(&(
                "verify",
                r.image.original(),
                &r.attestor,
                &r.attestation,
                &r.credentials,
                &r.platforms,
            )),
            Self::ImageData {
                image,
                credentials,
                platform,
            } => serde_json::to_string(&("image_data", image.original(), credentials, platform)),
            Self::Resolve { image, credentials } => {
                serde_json::to_string(&("resolve", image.original(), credentials))
            }
            Self::Settled(_) => return None,
        };
        value.ok()
    }
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
    Refused(String),
}

/// The jobs of all policies of one request, de-duplicated.
#[derive(Debug, Default)]
pub(super) struct JobSet {
    jobs: Vec<Job>,
    seen: HashMap<String, usize>,
}

impl JobSet {
    /// Adds `job` (or finds its twin) and returns its index in the eventual [`Prefetched`].
    pub(super) fn add(&mut self, job: Job) -> usize {
        let key = job.dedupe_key();
        if let Some(&index) = key.as_ref().and_then(|k| self.seen.get(k)) {
            return index;
        }
        let index = self.jobs.len();
        self.jobs.push(job);
        if let Some(key) = key {
            self.seen.insert(key, index);
        }
        index
    }

    pub(super) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.jobs.len()
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
    jobs: JobSet,
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
        Job::Verify(request) => Outcome::Verify(
            timeout_at(deadline, verifier.verify(request, deadline))
                .await
                .unwrap_or_else(|_| Err(expired(&request.image))),
        ),
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
