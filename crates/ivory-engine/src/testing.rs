//! The in-memory [`ImageVerifier`] the unit tests of the engine, the server and the binary
//! share (cargo feature `test-support`; never in a release build). It answers from tables set
//! up by its builder methods, behaves per registry host as a [`Mode`] says (answer, spent
//! budget, unreachable, slow, hung, panicking), and records what it was asked. Integration
//! tests use the real verifier over a real registry instead.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use ivory_policy::types::Credentials;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::verifier::{
    HeldVerdict, ImagePlatform, ImageReference, ImageVerifier, Rejection, Signer, Verification,
    VerifyError, VerifyRequest,
};

/// The digest every tag resolves to unless [`FakeVerifier::digest`] says otherwise.
pub const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// How a call about an image behaves before the verdict tables are read.
#[derive(Clone, Copy, Debug, Default)]
pub enum Mode {
    /// Answer from the tables.
    #[default]
    Answer,
    /// Report a spent budget ([`VerifyError::DeadlineExceeded`]).
    Deadline,
    /// Fail to reach the registry.
    Unavailable,
    /// Fail to reach the registry, with this message.
    UnavailableSaying(&'static str),
    /// Sleep this long first, then answer (use with paused time).
    Sleep(Duration),
    /// Never answer.
    Hang,
    /// Panic (a bug in a verifier must not escape a request).
    Panic,
}

/// Answers from tables: signatures by (image, attestor, attestation), digests by image.
/// Everything not in them is `NotVerified`, and every tag resolves to [`DIGEST`].
#[derive(Default)]
pub struct FakeVerifier {
    verified: HashSet<(String, String, Option<String>)>,
    /// Digests whose images verify for every attestor.
    signed_digests: HashSet<String>,
    payloads: HashMap<(String, String), Value>,
    digests: HashMap<String, String>,
    mode: Mode,
    /// Registry hosts whose images behave as the given mode instead (every kind of call).
    hosts: HashMap<String, Mode>,
    /// How `verify` calls behave, whatever the host (digests and image data as usual).
    verifying: Option<Mode>,
    /// Images whose calls behave as the given mode instead (before their host's).
    images: HashMap<String, Mode>,
    /// Images whose calls fail with the given error (after their mode).
    failures: HashMap<String, VerifyError>,
    /// Tags not in `digests` fail to resolve instead of resolving to [`DIGEST`].
    only_known_digests: bool,
    /// Architectures image data reports, by image (amd64 otherwise).
    arches: HashMap<String, String>,
    calls: AtomicUsize,
    resolves: AtomicUsize,
    running: AtomicUsize,
    most_running: AtomicUsize,
    fetched: Mutex<Vec<String>>,
    requests: Mutex<Vec<VerifyRequest>>,
    /// `resolve_digest` calls: the image and whether the policy named credentials.
    resolved: Mutex<Vec<(String, bool)>>,
    /// What a background scan reads through ([`ImageVerifier::revalidating`]), if anything.
    revalidated: Option<Box<FakeVerifier>>,
    /// Whether the tables' verdicts are held like kept ones ([`ImageVerifier::hold_verdict`]).
    holding: bool,
    revalidating_since: Mutex<Option<Instant>>,
}

impl FakeVerifier {
    /// A verifier that signs nothing and resolves every tag to [`DIGEST`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The tables' verdicts are held like a cache's kept ones: [`ImageVerifier::hold_verdict`]
    /// hands out handles, and [`ImageVerifier::still_holds`] says whether the tables of the
    /// verifier asked (possibly another fake) still give the same verdict.
    pub fn holding_verdicts(mut self) -> Self {
        self.holding = true;
        self
    }

    /// Every call behaves as `mode` (unless its image's host has its own).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Every call about an image on registry `host` behaves as `mode`.
    pub fn host(mut self, host: &str, mode: Mode) -> Self {
        self.hosts.insert(host.to_owned(), mode);
        self
    }

    /// Every `verify` call behaves as `mode` (digests and image data as their host says).
    pub fn verifying(mut self, mode: Mode) -> Self {
        self.verifying = Some(mode);
        self
    }

    /// Image data of `image` says `architecture`.
    pub fn arch(mut self, image: &str, architecture: &str) -> Self {
        self.arches
            .insert(image.to_owned(), architecture.to_owned());
        self
    }

    /// `image` resolves to `digest`.
    pub fn digest(mut self, image: &str, digest: &str) -> Self {
        self.digests.insert(image.to_owned(), digest.to_owned());
        self
    }

    /// Tags [`Self::digest`] did not name fail to resolve (`manifest unknown`).
    pub fn only_known_digests(mut self) -> Self {
        self.only_known_digests = true;
        self
    }

    /// Every call about `image` behaves as `mode` (whatever its host).
    pub fn image(mut self, image: &str, mode: Mode) -> Self {
        self.images.insert(image.to_owned(), mode);
        self
    }

    /// Every call about `image` fails with `error`.
    pub fn fail(mut self, image: &str, error: VerifyError) -> Self {
        self.failures.insert(image.to_owned(), error);
        self
    }

    /// `attestor` signed `image`.
    pub fn sign(mut self, image: &str, attestor: &str) -> Self {
        self.verified
            .insert((image.to_owned(), attestor.to_owned(), None));
        self
    }

    /// Every image pinned to `digest` (`…@digest`) verifies, for every attestor.
    pub fn sign_digest(mut self, digest: &str) -> Self {
        self.signed_digests.insert(digest.to_owned());
        self
    }

    /// `attestor` attested `image` with attestation `name`, whose statement is `payload`.
    pub fn attest(mut self, image: &str, attestor: &str, name: &str, payload: Value) -> Self {
        self.verified
            .insert((image.to_owned(), attestor.to_owned(), Some(name.to_owned())));
        self.payloads
            .insert((image.to_owned(), name.to_owned()), payload);
        self
    }

    /// [`ImageVerifier::revalidating`] gives `fresh`: this verifier then plays a cache whose
    /// verdicts may be stale, `fresh` the registry behind it.
    pub fn revalidating_with(mut self, fresh: FakeVerifier) -> Self {
        self.revalidated = Some(Box::new(fresh));
        self
    }

    /// The `since` of the last [`ImageVerifier::revalidating`] call.
    pub fn revalidating_since(&self) -> Option<Instant> {
        *lock(&self.revalidating_since)
    }

    /// `verify` and `image_data` calls so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// `resolve_digest` calls so far (not counted in [`Self::calls`]).
    pub fn resolves(&self) -> usize {
        self.resolves.load(Ordering::SeqCst)
    }

    /// Every `resolve_digest` call so far, sorted: the image, and whether credentials came
    /// with it.
    pub fn resolved(&self) -> Vec<(String, bool)> {
        let mut resolved = lock(&self.resolved).clone();
        resolved.sort();
        resolved
    }

    /// The most `verify` calls that were in flight at once.
    pub fn most_concurrent(&self) -> usize {
        self.most_running.load(Ordering::SeqCst)
    }

    /// Images whose image data was fetched, in order.
    pub fn fetched(&self) -> Vec<String> {
        lock(&self.fetched).clone()
    }

    /// Every verification asked for, in order.
    pub fn requests(&self) -> Vec<VerifyRequest> {
        lock(&self.requests).clone()
    }

    fn mode_for(&self, image: &str) -> Mode {
        let by_host = || self.hosts.get(registry(image)).copied();
        self.images
            .get(image)
            .copied()
            .or_else(by_host)
            .unwrap_or(self.mode)
    }

    /// Applies the mode of `image` (or its registry), then its failure: `Err` when it fails or
    /// reports a spent budget.
    async fn behave(&self, image: &str, operation: &str) -> Result<(), VerifyError> {
        self.behave_as(self.mode_for(image), image, operation).await
    }

    /// Applies `mode` to a call about `image`.
    async fn behave_as(&self, mode: Mode, image: &str, operation: &str) -> Result<(), VerifyError> {
        let registry = registry(image).to_owned();
        let behaved = match mode {
            Mode::Answer => Ok(()),
            Mode::Sleep(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Mode::Hang => std::future::pending().await,
            Mode::Panic => panic!("the fake verifier panics for {image}"),
            Mode::Deadline => Err(VerifyError::DeadlineExceeded {
                image: image.to_owned(),
                registry,
                operation: operation.into(),
                budget_ms: 2000,
            }),
            Mode::Unavailable => Err(VerifyError::Unavailable {
                image: image.to_owned(),
                registry,
                message: "503 Service Unavailable".into(),
            }),
            Mode::UnavailableSaying(message) => Err(VerifyError::Unavailable {
                image: image.to_owned(),
                registry,
                message: message.into(),
            }),
        };
        match self.failures.get(image) {
            Some(error) => Err(error.clone()),
            None => behaved,
        }
    }

    async fn answer(&self, request: &VerifyRequest) -> Result<Verification, VerifyError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        lock(&self.requests).push(request.clone());
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_running.fetch_max(running, Ordering::SeqCst);
        let image = request.image.original();
        let mode = self.verifying.unwrap_or_else(|| self.mode_for(image));
        let behaved = self.behave_as(mode, image, "fetching the manifest").await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        behaved?;
        Ok(self.table_answer(request))
    }

    /// The verdict the tables give `request`.
    fn table_answer(&self, request: &VerifyRequest) -> Verification {
        let image = request.image.original();
        // The fake holds no Notation signatures (ivory-verify's tests verify real ones).
        if request.attestor.notary.is_some() {
            return Verification::NotVerified {
                digest: None,
                reason: Rejection::Attestor(
                    "the fake verifier holds no Notation signatures".into(),
                ),
            };
        }
        let pinned = image.rsplit_once('@').map(|(_, d)| d);
        if let Some(digest) = pinned.filter(|d| self.signed_digests.contains(*d)) {
            return Verification::Verified {
                digest: digest.to_owned(),
                payload: None,
                signer: Some(fake_signer(&request.attestor.name)),
            };
        }
        let attestation = request.attestation.as_ref().map(|a| a.name.clone());
        let key = (
            image.to_owned(),
            request.attestor.name.clone(),
            attestation.clone(),
        );
        if !self.verified.contains(&key) {
            return Verification::NotVerified {
                digest: Some(DIGEST.into()),
                reason: Rejection::NoSignatures,
            };
        }
        let payload = attestation.and_then(|a| self.payloads.get(&(image.to_owned(), a)).cloned());
        Verification::Verified {
            digest: DIGEST.into(),
            payload,
            signer: Some(fake_signer(&request.attestor.name)),
        }
    }

    /// Whether the tables answer `request` with no mode or failure in the way.
    fn answers_from_tables(&self, request: &VerifyRequest) -> bool {
        let image = request.image.original();
        let mode = self.verifying.unwrap_or_else(|| self.mode_for(image));
        self.holding && matches!(mode, Mode::Answer) && !self.failures.contains_key(image)
    }
}

impl ImageVerifier for FakeVerifier {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a Credentials>,
        _deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        let image = image.original();
        async move {
            self.resolves.fetch_add(1, Ordering::SeqCst);
            lock(&self.resolved).push((image.to_owned(), credentials.is_some()));
            self.behave(image, "resolving the digest").await?;
            match self.digests.get(image) {
                Some(digest) => Ok(digest.clone()),
                None if self.only_known_digests => Err(VerifyError::Unavailable {
                    image: image.to_owned(),
                    registry: registry(image).to_owned(),
                    message: "manifest unknown".into(),
                }),
                None => Ok(DIGEST.to_owned()),
            }
        }
        .boxed()
    }

    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        _deadline: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        self.answer(request).boxed()
    }

    fn hold_verdict(&self, request: &VerifyRequest, answer: &Verification) -> Option<HeldVerdict> {
        let held = self.answers_from_tables(request) && self.table_answer(request) == *answer;
        held.then(|| Box::new((request.clone(), answer.clone())) as HeldVerdict)
    }

    fn still_holds(&self, held: &HeldVerdict) -> bool {
        held.downcast_ref::<(VerifyRequest, Verification)>()
            .is_some_and(|(request, answer)| {
                self.answers_from_tables(request) && self.table_answer(request) == *answer
            })
    }

    fn image_data<'a>(
        &'a self,
        image: &'a ImageReference,
        _credentials: Option<&'a Credentials>,
        _platform: &'a ImagePlatform,
        _deadline: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        let image = image.original();
        async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            lock(&self.fetched).push(image.to_owned());
            self.behave(image, "fetching image data").await?;
            Ok(json!({
                "image": image,
                "digest": DIGEST,
                "config": {
                    "architecture": self.arches.get(image).map_or("amd64", String::as_str),
                    "os": "linux",
                },
            }))
        }
        .boxed()
    }

    fn revalidating(&self, since: Instant) -> Option<Box<dyn ImageVerifier + '_>> {
        *lock(&self.revalidating_since) = Some(since);
        let fresh = self.revalidated.as_deref()?;
        Some(Box::new(Revalidated(fresh)))
    }
}

/// The revalidating view of a [`FakeVerifier`]: the fresh verifier behind it.
struct Revalidated<'a>(&'a FakeVerifier);

impl ImageVerifier for Revalidated<'_> {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a Credentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        self.0.resolve_digest(image, credentials, deadline)
    }

    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        self.0.verify(request, deadline)
    }

    fn image_data<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a Credentials>,
        platform: &'a ImagePlatform,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        self.0.image_data(image, credentials, platform, deadline)
    }
}

/// The signer the fake reports for `attestor`: a made-up key fingerprint naming it.
pub fn fake_signer(attestor: &str) -> Signer {
    Signer {
        key: Some(format!("sha256:{attestor}")),
        log_index: Some(42),
        ..Default::default()
    }
}

/// The registry host of an image as written (its first path segment).
fn registry(image: &str) -> &str {
    image.split('/').next().unwrap_or_default()
}

/// The guarded value, also after a panic elsewhere poisoned the lock (a [`Mode::Panic`] call).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
