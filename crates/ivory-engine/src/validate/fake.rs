//! An in-memory [`ImageVerifier`] for the validating stage's tests.

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
    ImagePlatform, ImageReference, ImageVerifier, Rejection, Verification, VerifyError,
    VerifyRequest,
};

/// How every call behaves besides the verdict table.
#[derive(Clone, Copy, Debug, Default)]
pub(super) enum Mode {
    #[default]
    Answer,
    /// Every call reports a spent budget itself.
    Deadline,
    /// Every call fails to reach the registry.
    Unavailable,
    /// Every call fails to reach the registry, with this message.
    UnavailableSaying(&'static str),
    /// Every call sleeps this long first (use with paused time).
    Sleep(Duration),
}

/// Verdicts by (image, attestor name, attestation name); everything else is NotVerified.
#[derive(Default)]
pub(super) struct FakeVerifier {
    verified: HashSet<(String, String, Option<String>)>,
    payloads: HashMap<(String, String), Value>,
    mode: Mode,
    /// Registry hosts whose images behave as the given mode instead (every kind of call).
    hosts: HashMap<String, Mode>,
    /// Architectures image data reports, by image (amd64 otherwise).
    arches: HashMap<String, String>,
    pub(super) calls: AtomicUsize,
    /// `resolve_digest` calls (not counted in `calls`).
    pub(super) resolves: AtomicUsize,
    /// Images whose image data was fetched.
    pub(super) fetched: Mutex<Vec<String>>,
    pub(super) requests: Mutex<Vec<VerifyRequest>>,
}

impl FakeVerifier {
    pub(super) fn new() -> Self {
        Self::default()
    }

    pub(super) fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Every call about an image on registry `host` behaves as `mode`.
    pub(super) fn host(mut self, host: &str, mode: Mode) -> Self {
        self.hosts.insert(host.to_owned(), mode);
        self
    }

    /// Image data of `image` says `architecture`.
    pub(super) fn arch(mut self, image: &str, architecture: &str) -> Self {
        self.arches
            .insert(image.to_owned(), architecture.to_owned());
        self
    }

    fn mode_for(&self, image: &str) -> Mode {
        let host = image.split('/').next().unwrap_or_default();
        self.hosts.get(host).copied().unwrap_or(self.mode)
    }

    /// Applies the mode of `image`'s registry: `Err` when it fails or reports a spent budget.
    async fn behave(&self, image: &str, operation: &str) -> Result<(), VerifyError> {
        let registry = image.split('/').next().unwrap_or_default().to_owned();
        match self.mode_for(image) {
            Mode::Answer => Ok(()),
            Mode::Sleep(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
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
        }
    }

    pub(super) fn resolves(&self) -> usize {
        self.resolves.load(Ordering::SeqCst)
    }

    pub(super) fn fetched(&self) -> Vec<String> {
        self.fetched.lock().unwrap().clone()
    }

    /// `attestor` signed `image`.
    pub(super) fn sign(mut self, image: &str, attestor: &str) -> Self {
        self.verified
            .insert((image.to_owned(), attestor.to_owned(), None));
        self
    }

    /// `attestor` attested `image` with attestation `name`, whose statement is `payload`.
    pub(super) fn attest(
        mut self,
        image: &str,
        attestor: &str,
        name: &str,
        payload: Value,
    ) -> Self {
        self.verified
            .insert((image.to_owned(), attestor.to_owned(), Some(name.to_owned())));
        self.payloads
            .insert((image.to_owned(), name.to_owned()), payload);
        self
    }

    pub(super) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub(super) fn requests(&self) -> Vec<VerifyRequest> {
        self.requests.lock().unwrap().clone()
    }

    async fn answer(&self, request: &VerifyRequest) -> Result<Verification, VerifyError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.requests.lock().unwrap().push(request.clone());
        let image = request.image.original();
        self.behave(image, "fetching the manifest").await?;
        // The fake holds no Notation signatures (ivory-verify's tests verify real ones).
        if request.attestor.notary.is_some() {
            return Ok(Verification::NotVerified {
                digest: None,
                reason: Rejection::Attestor(
                    "the fake verifier holds no Notation signatures".into(),
                ),
            });
        }
        let attestation = request.attestation.as_ref().map(|a| a.name.clone());
        let key = (
            image.to_owned(),
            request.attestor.name.clone(),
            attestation.clone(),
        );
        if !self.verified.contains(&key) {
            return Ok(Verification::NotVerified {
                digest: Some(DIGEST.into()),
                reason: Rejection::NoSignatures,
            });
        }
        let payload = attestation.and_then(|a| self.payloads.get(&(image.to_owned(), a)).cloned());
        Ok(Verification::Verified {
            digest: DIGEST.into(),
            payload,
            signer: Some(fake_signer(&request.attestor.name)),
        })
    }
}

pub(super) const DIGEST: &str =
    "sha256:1111111111111111111111111111111111111111111111111111111111111111";

impl ImageVerifier for FakeVerifier {
    fn resolve_digest<'a>(
        &'a self,
        image: &'a ImageReference,
        _credentials: Option<&'a Credentials>,
        _deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        let image = image.original();
        async move {
            self.resolves.fetch_add(1, Ordering::SeqCst);
            self.behave(image, "resolving the digest").await?;
            Ok(DIGEST.to_owned())
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
            self.fetched.lock().unwrap().push(image.to_owned());
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
}

/// The signer the fake reports for `attestor`: a made-up key fingerprint naming it.
pub(super) fn fake_signer(attestor: &str) -> crate::verifier::Signer {
    crate::verifier::Signer {
        key: Some(format!("sha256:{attestor}")),
        log_index: Some(42),
        ..Default::default()
    }
}
