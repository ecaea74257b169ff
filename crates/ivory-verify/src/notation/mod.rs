//! Notary Project (Notation) signatures: a `notary` attestor turned into a `NotaryPlan`
//! (its trust stores and trust policy), [`envelope`]s read from JWS or COSE, and the verdict
//! over an image's signatures (`evaluate`). No IO: the verifier fetches (at most
//! [`MAX_SIGNATURE_ATTEMPTS`] signatures, each bounded) and calls in here.

mod algorithms;
mod check;
pub mod envelope;
pub mod revocation;
mod timestamp_rsa;

use ivory_policy::notation::{NotationTrustPolicy, TrustStore, TrustedIdentity};
use ivory_policy::types::Notary;
use jiff::Timestamp;
use sigstore_verify::types::DerCertificate;

pub(crate) use check::Target;
use check::Verified;

use crate::keys::parse_certificates;
use crate::rejection::{Rejection, Sought};
use ivory_engine::verifier::Signer;

/// `artifactType` of Notation signatures among an image's referrers.
pub const SIGNATURE_ARTIFACT_TYPE: &str = "application/vnd.cncf.notary.signature";
/// Signatures tried per image (notation's `MaxSignatureAttempts` as Kyverno sets it).
pub const MAX_SIGNATURE_ATTEMPTS: usize = 10;

/// A `notary` attestor ready to verify: its trust stores and trust policy.
#[derive(Debug)]
pub(crate) struct NotaryPlan {
    /// `certs`: the `ca` trust store (or `signingAuthority`, as the trust policy says).
    pub(crate) certs: Vec<DerCertificate>,
    /// Which trust store `certs` are.
    pub(crate) store: TrustStore,
    /// `tsaCerts`: roots of timestamp authorities.
    pub(crate) tsa: Vec<DerCertificate>,
    /// The trust policy (ivory's extension; Kyverno's `strict` when absent).
    pub(crate) policy: NotationTrustPolicy,
    /// `trustedIdentities`, parsed (empty: any).
    pub(crate) identities: Vec<TrustedIdentity>,
}

impl NotaryPlan {
    /// The plan of `notary`, whose CEL fields the engine has already evaluated.
    pub(crate) fn new(notary: &Notary) -> Result<Self, Rejection> {
        let text = |s: &Option<ivory_policy::types::StringSource>| {
            s.as_ref()
                .and_then(|s| s.value.as_deref())
                .unwrap_or_default()
                .to_owned()
        };
        let certs_text = text(&notary.certs);
        if certs_text.trim().is_empty() {
            return Err(Rejection::Attestor(
                "notary.certs holds no certificate".into(),
            ));
        }
        let certs = parse_certificates(&certs_text, "notary.certs")?;
        let tsa_text = text(&notary.tsa_certs);
        let tsa = if tsa_text.trim().is_empty() {
            Vec::new()
        } else {
            parse_certificates(&tsa_text, "notary.tsaCerts")?
        };
        let policy = notary.trust_policy.clone().unwrap_or_default();
        let identities = policy
            .trusted_identities
            .iter()
            .map(|i| TrustedIdentity::parse(i).map_err(|e| Rejection::Attestor(e.to_string())))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            certs,
            store: policy.certs_trust_store.unwrap_or(TrustStore::Ca),
            tsa,
            policy,
            identities,
        })
    }
}

/// A signature layer as fetched: its media type and bytes.
pub(crate) struct Candidate {
    pub(crate) media_type: String,
    pub(crate) bytes: Vec<u8>,
}

/// The first of `candidates` that verifies for `target`; `more` says signatures were left
/// unread past [`MAX_SIGNATURE_ATTEMPTS`]. Revocation is checked against what `revocation`
/// holds.
pub(crate) fn evaluate(
    plan: &NotaryPlan,
    target: &Target<'_>,
    candidates: &[Candidate],
    more: bool,
    revocation: &dyn revocation::RevocationSource,
    now: Timestamp,
) -> Result<(Signer, Vec<String>), Rejection> {
    if candidates.is_empty() {
        return Err(Rejection::NoSignatures);
    }
    let mut reasons = Vec::new();
    for c in candidates {
        let outcome = envelope::parse(&c.media_type, &c.bytes)
            .map_err(|e| Rejection::Malformed(e.to_string()))
            .and_then(|env| check::verify(plan, &env, target, revocation, now));
        match outcome {
            Ok(Verified { signer, warnings }) => return Ok((signer, warnings)),
            Err(e) => {
                if !reasons.contains(&e) {
                    reasons.push(e);
                }
            }
        }
    }
    if more {
        reasons.push(Rejection::Content(format!(
            "signature evaluation stopped: the limit of {MAX_SIGNATURE_ATTEMPTS} signature attempts was reached"
        )));
    }
    // Kept whatever is cut: it is what keeps the verdict out of the caches.
    reasons.sort_by_key(|r| !r.is_transient());
    let left_out = reasons.len().saturating_sub(5);
    reasons.truncate(5);
    Err(Rejection::NoneMatched {
        sought: Sought::Signatures,
        reasons,
        left_out,
    })
}
