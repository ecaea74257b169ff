//! Notation signatures and Notation-signed referrers, read from the registry for one cache
//! miss (the verdict cache, its coalescing and the L2 are the cosign path's: see
//! `CosignVerifier::verify_request`). Signatures are the image's OCI referrers of
//! `artifactType` `application/vnd.cncf.notary.signature` (referrers API or the
//! `sha256-<hex>` tag schema); at most [`MAX_SIGNATURE_ATTEMPTS`] are read, each signature
//! manifest and envelope under the registry's and `max_signature_bytes` caps.

use futures::future::join_all;
use ivory_engine::verifier::{ImageReference, Verification, VerifyError};
use ivory_registry::{Credentials, Error as RegistryError};
use jiff::Timestamp;
use serde_json::Value;
use tokio::time::Instant;

use super::CosignVerifier;
use super::cache::Loaded;
use super::sources::absent_is_empty;
use crate::classify::map_error;
use crate::notation::envelope::{COSE_MEDIA_TYPE, JWS_MEDIA_TYPE};
use crate::notation::{
    Candidate, MAX_SIGNATURE_ATTEMPTS, NotaryPlan, SIGNATURE_ARTIFACT_TYPE, Target, evaluate,
};
use crate::rejection::{Rejection, Sought};

/// Most referrers of the wanted attestation type whose signatures are checked.
const MAX_ATTESTATION_REFERRERS: usize = MAX_SIGNATURE_ATTEMPTS;

/// Where and how one verification reads: the image as the policy named it (for messages),
/// its repository, the credentials and the deadline of every registry call.
#[derive(Clone, Copy)]
pub(super) struct Reading<'a> {
    pub(super) image: &'a ImageReference,
    pub(super) repo: &'a str,
    pub(super) creds: &'a Credentials,
    pub(super) deadline: Instant,
}

/// The signatures of one subject, as read.
struct Signatures {
    candidates: Vec<Candidate>,
    /// More signatures exist than were read.
    more: bool,
}

impl CosignVerifier {
    /// The verdict of `plan` about `digest` in `repo`: its signatures, or (with
    /// `referrer_type`) the first referrer of that type whose own signatures verify, whose
    /// first layer is then the payload.
    ///
    /// A verdict of unknown revocation status is transient (never cached); with
    /// `revocation_settle` (one-shot commands), it waits that long for the fetches it asked
    /// for and is reached once more.
    pub(super) async fn load_notation_verdict(
        &self,
        at: &Reading<'_>,
        digest: &str,
        plan: &NotaryPlan,
        referrer_type: Option<&str>,
    ) -> Result<Loaded, VerifyError> {
        let image = at.image;
        let mut verdict = self
            .notation_verdict(at, digest, plan, referrer_type)
            .await?;
        if let (Err(reason), Some(wait)) = (&verdict, self.inner.config.revocation_settle)
            && reason.is_transient()
        {
            self.inner
                .revocation
                .settled(at.deadline.min(ivory_clock::now() + wait))
                .await;
            verdict = self
                .notation_verdict(at, digest, plan, referrer_type)
                .await?;
        }
        let transient = verdict.as_ref().is_err_and(Rejection::is_transient);
        let verdict = match verdict {
            Ok((signer, payload)) => Verification::Verified {
                digest: digest.to_owned(),
                payload,
                signer: Some(signer),
            },
            Err(reason) => {
                tracing::debug!(%image, digest, %reason, transient, "not verified (notation)");
                Verification::NotVerified {
                    digest: Some(digest.to_owned()),
                    reason,
                }
            }
        };
        Ok(Loaded { verdict, transient })
    }

    /// The signatures' verdict, or (with `referrer_type`) the referrers'.
    async fn notation_verdict(
        &self,
        at: &Reading<'_>,
        digest: &str,
        plan: &NotaryPlan,
        referrer_type: Option<&str>,
    ) -> Result<Result<(ivory_engine::verifier::Signer, Option<Value>), Rejection>, VerifyError>
    {
        Ok(match referrer_type {
            None => self
                .verify_subject(at, digest, plan)
                .await?
                .map(|signer| (signer, None)),
            Some(t) => self.verify_referrers(at, digest, plan, t).await?,
        })
    }

    /// Verifies the Notation signatures of `repo@digest`.
    async fn verify_subject(
        &self,
        at: &Reading<'_>,
        digest: &str,
        plan: &NotaryPlan,
    ) -> Result<Result<ivory_engine::verifier::Signer, Rejection>, VerifyError> {
        let Reading {
            image,
            repo,
            creds,
            deadline,
        } = *at;
        let subject = super::sibling(repo, '@', digest)
            .map_err(|e| map_error(image, "reading the signed manifest", e, deadline))?;
        let (manifest, signatures) = futures::join!(
            self.inner
                .registry
                .fetch_manifest(&subject, creds, deadline),
            self.notation_signatures(&subject, creds, deadline)
        );
        let manifest =
            manifest.map_err(|e| map_error(image, "reading the signed manifest", e, deadline))?;
        let signatures =
            signatures.map_err(|e| map_error(image, "reading Notation signatures", e, deadline))?;
        let target = Target {
            digest,
            media_type: &manifest.media_type,
            size: u64::try_from(manifest.bytes.len()).unwrap_or(u64::MAX),
        };
        Ok(evaluate(
            plan,
            &target,
            &signatures.candidates,
            signatures.more,
            &self.inner.revocation,
            Timestamp::now(),
        )
        .map(|(signer, warnings)| {
            for warning in warnings {
                tracing::warn!(%image, digest, %warning, "Notation check not enforced");
            }
            signer
        }))
    }

    /// Kyverno's referrer attestations: the referrers of `artifact_type`, each verified by
    /// its own Notation signatures; the first that verifies gives its first layer (JSON) as
    /// the payload `extractPayload` reads.
    async fn verify_referrers(
        &self,
        at: &Reading<'_>,
        digest: &str,
        plan: &NotaryPlan,
        artifact_type: &str,
    ) -> Result<Result<(ivory_engine::verifier::Signer, Option<Value>), Rejection>, VerifyError>
    {
        let Reading {
            image,
            repo,
            creds,
            deadline,
        } = *at;
        let subject = super::sibling(repo, '@', digest)
            .map_err(|e| map_error(image, "reading referrers", e, deadline))?;
        let registry = &self.inner.registry;
        let index = absent_is_empty(
            registry
                .referrers(&subject, Some(artifact_type), creds, deadline)
                .await,
        )
        .map_err(|e| map_error(image, "reading referrers", e, deadline))?;
        let referrers: Vec<String> = index
            .as_ref()
            .and_then(|i| i.get("manifests"))
            .and_then(Value::as_array)
            .map(|ms| {
                ms.iter()
                    .filter_map(|m| m.get("digest").and_then(Value::as_str).map(str::to_owned))
                    .take(MAX_ATTESTATION_REFERRERS)
                    .collect()
            })
            .unwrap_or_default();
        if referrers.is_empty() {
            return Ok(Err(Rejection::Content(format!(
                "attestation verification failed, no attestations found for type: {artifact_type}"
            ))));
        }
        let mut reasons = Vec::new();
        for referrer in referrers {
            match self.verify_subject(at, &referrer, plan).await? {
                Ok(signer) => {
                    let payload = self.referrer_payload(at, &referrer).await?;
                    return Ok(payload.map(|p| (signer, Some(p))));
                }
                Err(reason) => {
                    let text = format!(
                        "failed to verify attestation {artifact_type}, digest {referrer}: {reason}"
                    );
                    reasons.push(if reason.is_transient() {
                        Rejection::RevocationUnknown(text)
                    } else {
                        Rejection::Content(text)
                    });
                }
            }
        }
        Ok(Err(Rejection::NoneMatched {
            sought: Sought::Attestations,
            left_out: reasons.len().saturating_sub(5),
            reasons: reasons.into_iter().take(5).collect(),
        }))
    }

    /// The first layer of a verified referrer, as JSON.
    async fn referrer_payload(
        &self,
        at: &Reading<'_>,
        referrer: &str,
    ) -> Result<Result<Value, Rejection>, VerifyError> {
        let Reading {
            image,
            repo,
            creds,
            deadline,
        } = *at;
        let registry = &self.inner.registry;
        let reference = super::sibling(repo, '@', referrer)
            .map_err(|e| map_error(image, "reading an attestation", e, deadline))?;
        let manifest = registry
            .fetch_manifest(&reference, creds, deadline)
            .await
            .map_err(|e| map_error(image, "reading an attestation", e, deadline))?;
        let Some(layer) = manifest
            .json
            .pointer("/layers/0/digest")
            .and_then(Value::as_str)
        else {
            return Ok(Err(Rejection::Content(format!(
                "attestation {referrer} has no layer"
            ))));
        };
        let limit = self.inner.config.max_signature_bytes;
        let blob = registry
            .fetch_blob(&reference, layer, limit, creds, deadline)
            .await
            .map_err(|e| map_error(image, "reading an attestation", e, deadline))?;
        // Bounded like every signed document: an SBOM of tiny objects cannot balloon.
        Ok(crate::signed_json::parse_signed_json(
            &blob,
            &format!("attestation {referrer}"),
        ))
    }

    /// The Notation signatures among the referrers of `subject` (a digest reference): at most
    /// [`MAX_SIGNATURE_ATTEMPTS`] envelopes, fetched in parallel.
    async fn notation_signatures(
        &self,
        subject: &ImageReference,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Signatures, RegistryError> {
        let registry = &self.inner.registry;
        let Some(index) = absent_is_empty(
            registry
                .referrers(subject, Some(SIGNATURE_ARTIFACT_TYPE), creds, deadline)
                .await,
        )?
        else {
            return Ok(Signatures {
                candidates: Vec::new(),
                more: false,
            });
        };
        let all: Vec<&str> = index
            .get("manifests")
            .and_then(Value::as_array)
            .map(|ms| {
                ms.iter()
                    .filter_map(|m| m.get("digest").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default();
        let more = all.len() > MAX_SIGNATURE_ATTEMPTS;
        let limit = self.inner.config.max_signature_bytes;
        let fetched = join_all(all.iter().take(MAX_SIGNATURE_ATTEMPTS).map(|d| async move {
            let reference = super::sibling(subject.repository_name(), '@', d)?;
            let manifest = registry.fetch_manifest(&reference, creds, deadline).await?;
            let Some(layer) = manifest.json.pointer("/layers/0") else {
                return Ok(None);
            };
            let media_type = layer
                .get("mediaType")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(digest) = layer.get("digest").and_then(Value::as_str) else {
                return Ok(None);
            };
            if media_type != JWS_MEDIA_TYPE && media_type != COSE_MEDIA_TYPE {
                // Kept: the verdict names the unknown envelope type.
                return Ok(Some(Candidate {
                    media_type: media_type.to_owned(),
                    bytes: Vec::new(),
                }));
            }
            let bytes = registry
                .fetch_blob(&reference, digest, limit, creds, deadline)
                .await?;
            Ok(Some(Candidate {
                media_type: media_type.to_owned(),
                bytes,
            }))
        }))
        .await;
        let mut candidates = Vec::new();
        for f in fetched {
            if let Some(c) = f? {
                candidates.push(c);
            }
        }
        Ok(Signatures { candidates, more })
    }
}
