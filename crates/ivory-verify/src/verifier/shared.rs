//! The hook to a cache shared by the replicas of a fleet (L2): the verifier's side of it.
//!
//! The store itself (Redis, tamper evidence, deadlines, circuit breaker) lives behind
//! [`SharedCache`], implemented by the `ivory-l2` crate; this module decides *what* is shared
//! and under which name: positive and negative verdicts (named by digest, signature
//! repository, attestor hash and attestation type, as the in-process cache), tag → digest
//! (named with a keyed hash of the credential set, so no credential appears in a name), and the
//! signature source hint. Errors are never shared.
//!
//! An L2 answer is only ever an optimization: [`SharedCache`] methods answer "nothing" when
//! the store is slow, down or returns something that does not authenticate, and the caller
//! then loads from the registry as it would without an L2.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use ivory_engine::verifier::{Rejection, Verification, VerifyError};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

use super::sources::{Family, Source};

/// What a lookup that is about to load found, in one atomic step: the value, or the right to
/// fill the name for the fleet, or that another replica has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The authentic value.
    Found(Vec<u8>),
    /// Nothing stored and no lease: this replica took the lease and fills the name.
    Won,
    /// Nothing stored, another replica holds the lease and is filling it.
    Held,
    /// The store did not answer in time or held an entry that does not verify: load without
    /// coordination.
    Alone,
}

/// A byte store shared by the replicas. Every method is bounded by the store's own small
/// deadline and never fails: an unavailable, slow or tampered store reads as empty.
pub trait SharedCache: Send + Sync {
    /// The authentic value stored under `name`, if any.
    fn get<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<Vec<u8>>>;
    /// Stores `value` under `name` for `ttl` and releases this replica's lease on `name`.
    fn put<'a>(&'a self, name: &'a str, value: Vec<u8>, ttl: Duration) -> BoxFuture<'a, ()>;
    /// The value under `name`, or else the lease on it (one filler per name across the
    /// fleet), atomically: a value stored just before the lease is never missed.
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Lookup>;
    /// Waits, until `until` at most, for the lease holder's value of `name`; `None` when the
    /// holder gave up (its lease is gone and no value came) or time ran out.
    fn wait<'a>(&'a self, name: &'a str, until: Instant) -> BoxFuture<'a, Option<Vec<u8>>>;
    /// Gives up this replica's lease on `name` (its load failed: errors are never shared).
    fn release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, ()>;
    /// A keyed hash of secret material (credentials) for use inside names: a reader of the
    /// store cannot test guessed passwords against it.
    fn keyed_hash(&self, secret: &[u8]) -> [u8; 32];
}

/// The L2 handle the verifier holds.
pub(super) type Shared = Option<Arc<dyn SharedCache>>;

/// Name prefix: the format version, so a change of encoding never reads old entries. v2: a
/// negative verdict keeps its typed [`Rejection`] (v1 held its text).
const PREFIX: &str = "ivory:v2";

/// SHA-256 over length-prefixed fields, hex: fields can never run into each other.
fn name(kind: &str, fields: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for f in fields {
        h.update((f.len() as u64).to_be_bytes());
        h.update(f);
    }
    format!("{PREFIX}:{kind}:{}", hex::encode(h.finalize()))
}

/// Name of a verdict: exactly the fields of the in-process verdict key (`ResultKey`).
pub(super) fn verdict_name(
    digest: &str,
    signature_repo: &str,
    attestor: &[u8; 32],
    attestation: Option<&str>,
) -> String {
    name(
        "verdict",
        &[
            digest.as_bytes(),
            signature_repo.as_bytes(),
            attestor,
            attestation.unwrap_or("\0none").as_bytes(),
        ],
    )
}

/// Name of a tag → digest answer for one credential set.
pub(super) fn tag_name(l2: &dyn SharedCache, reference: &str, credentials: &[u8]) -> String {
    name("tag", &[reference.as_bytes(), &l2.keyed_hash(credentials)])
}

/// Name of the signature source hint of one repository and family.
pub(super) fn hint_name(repo_key: &str, family: Family) -> String {
    let family: &[u8] = match family {
        Family::Signatures => b"sig",
        Family::Attestations => b"att",
    };
    name("hint", &[repo_key.as_bytes(), family])
}

/// What travels through the L2 for a verdict.
#[derive(Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case", deny_unknown_fields)]
enum StoredVerdict {
    Verified {
        digest: String,
        payload: Option<serde_json::Value>,
        /// Who signed: evidence for the audit trail, never a reason to admit (the entry's HMAC
        /// covers it with the rest).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signer: Option<ivory_engine::verifier::Signer>,
    },
    NotVerified {
        digest: Option<String>,
        /// The typed reason (format v2; v1 entries held its text and are never read: their
        /// names are under the old prefix).
        reason: Rejection,
    },
}

/// A value of one of the shared kinds: how it is encoded, checked on the way back, and how
/// long it lives.
pub(super) trait SharedValue: Sized {
    fn encode(&self) -> Option<Vec<u8>>;
    /// `None` for bytes that are not a value of this kind for `expected_digest` (when the name
    /// implies one): such an entry is ignored, never trusted.
    fn decode(bytes: &[u8], expected_digest: Option<&str>) -> Option<Self>;
}

impl SharedValue for Verification {
    fn encode(&self) -> Option<Vec<u8>> {
        let stored = match self.clone() {
            Verification::Verified {
                digest,
                payload,
                signer,
            } => StoredVerdict::Verified {
                digest,
                payload,
                signer,
            },
            Verification::NotVerified { digest, reason } => {
                StoredVerdict::NotVerified { digest, reason }
            }
        };
        serde_json::to_vec(&stored).ok()
    }

    fn decode(bytes: &[u8], expected_digest: Option<&str>) -> Option<Self> {
        let v = match serde_json::from_slice(bytes).ok()? {
            StoredVerdict::Verified {
                digest,
                payload,
                signer,
            } => Verification::Verified {
                digest,
                payload,
                signer,
            },
            StoredVerdict::NotVerified { digest, reason } => {
                Verification::NotVerified { digest, reason }
            }
        };
        let digest = match &v {
            Verification::Verified { digest, .. } => Some(digest.as_str()),
            Verification::NotVerified { digest, .. } => digest.as_deref(),
        };
        match (digest, expected_digest) {
            (Some(d), Some(e)) if d != e => None,
            _ => Some(v),
        }
    }
}

/// A resolved digest (`algorithm:hex`).
impl SharedValue for String {
    fn encode(&self) -> Option<Vec<u8>> {
        Some(self.as_bytes().to_vec())
    }

    fn decode(bytes: &[u8], _: Option<&str>) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (algorithm, hex) = text.split_once(':')?;
        let well_formed = !algorithm.is_empty()
            && algorithm
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b))
            && hex.len() >= 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        well_formed.then(|| text.to_owned())
    }
}

impl SharedValue for Source {
    fn encode(&self) -> Option<Vec<u8>> {
        Some(match self {
            Source::CosignTag => b"cosign-tag".to_vec(),
            Source::Referrers => b"referrers".to_vec(),
        })
    }

    fn decode(bytes: &[u8], _: Option<&str>) -> Option<Self> {
        match bytes {
            b"cosign-tag" => Some(Source::CosignTag),
            b"referrers" => Some(Source::Referrers),
            _ => None,
        }
    }
}

/// How one shared load is named, checked and kept.
#[derive(Clone)]
pub(super) struct SharedLoad {
    pub(super) l2: Arc<dyn SharedCache>,
    pub(super) name: String,
    /// The digest the name implies (verdicts), checked again on decode.
    pub(super) digest: Option<String>,
    /// The deadline of the admission that started the load: a replica waiting on another's
    /// lease keeps half of what is left for a load of its own.
    pub(super) deadline: Instant,
}

/// Runs `load` behind the L2: an authentic shared value answers at once; otherwise the first
/// replica to take the lease loads and shares, and the others wait for its value (at most
/// half of the remaining budget) before loading themselves. What `load` returns is returned
/// unchanged; only `Ok` values are shared, for `ttl(&value)`.
pub(super) async fn through<V: SharedValue>(
    shared: SharedLoad,
    ttl: impl Fn(&V) -> Duration,
    load: BoxFuture<'static, Result<V, VerifyError>>,
) -> Result<V, VerifyError> {
    let SharedLoad {
        l2,
        name,
        digest,
        deadline,
    } = shared;
    let decode = |bytes: Vec<u8>| V::decode(&bytes, digest.as_deref());
    let won = match l2.lookup(&name).await {
        Lookup::Found(bytes) => match decode(bytes) {
            Some(v) => return Ok(v),
            None => false,
        },
        Lookup::Won => true,
        Lookup::Held => {
            let now = ivory_clock::now();
            let until = now + deadline.saturating_duration_since(now) / 2;
            if let Some(v) = l2.wait(&name, until).await.and_then(decode) {
                return Ok(v);
            }
            false
        }
        Lookup::Alone => false,
    };
    let result = load.await;
    let shareable = result.as_ref().ok().and_then(|v| {
        // A zero lifetime means "do not cache" (e.g. `--tag-cache-ttl 0s`).
        let ttl = ttl(v);
        (!ttl.is_zero()).then(|| v.encode().map(|bytes| (bytes, ttl)))?
    });
    match shareable {
        Some((bytes, ttl)) => l2.put(&name, bytes, ttl).await,
        None if won => l2.release(&name).await,
        None => {}
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn verdicts_round_trip_and_are_bound_to_their_digest() {
        let yes = Verification::Verified {
            digest: D.into(),
            payload: Some(serde_json::json!({"predicateType": "x"})),
            signer: Some(ivory_engine::verifier::Signer {
                key: Some("sha256:ab".into()),
                log_index: Some(7),
                ..Default::default()
            }),
        };
        let bytes = yes.encode().unwrap_or_default();
        assert_eq!(Verification::decode(&bytes, Some(D)), Some(yes));
        assert_eq!(Verification::decode(&bytes, Some("sha256:other")), None);
        let no = Verification::NotVerified {
            digest: None,
            reason: Rejection::NoneMatched {
                sought: ivory_engine::verifier::Sought::Attestations,
                reasons: vec![Rejection::Identity {
                    subject: "someone".into(),
                    issuer: "https://issuer.example".into(),
                }],
                left_out: 0,
            },
        };
        let bytes = no.encode().unwrap_or_default();
        assert_eq!(Verification::decode(&bytes, Some(D)), Some(no));
        assert_eq!(
            Verification::decode(b"{\"verdict\":\"maybe\"}", Some(D)),
            None
        );
    }

    #[test]
    fn a_v1_negative_verdict_is_never_misread() {
        // What a replica of format v1 stored: the reason as text. Such entries live under
        // `ivory:v1:` names, which v2 never asks for; were one read anyway, it is ignored, not
        // turned into some rejection.
        let v1 = br#"{"verdict":"not_verified","digest":null,"reason":"signatures not found"}"#;
        assert_eq!(Verification::decode(v1, Some(D)), None);
        assert!(PREFIX != "ivory:v1");
        assert!(verdict_name(D, "r", &[0; 32], None).starts_with("ivory:v2:"));
    }

    #[test]
    fn only_well_formed_digests_decode() {
        assert_eq!(String::decode(D.as_bytes(), None).as_deref(), Some(D));
        for bad in [
            "",
            "sha256:",
            "sha256:XYZ",
            "nohex",
            "sha256:abc",
            "a b:0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(String::decode(bad.as_bytes(), None), None, "{bad}");
        }
    }

    #[test]
    fn names_separate_every_field() {
        let key = |digest: &str, repo: &str, attestation: Option<&str>| {
            verdict_name(digest, repo, &[1; 32], attestation)
        };
        let a = key("ab", "c", None);
        assert_ne!(a, key("a", "bc", None));
        assert_ne!(a, key("ab", "c", Some("")));
        assert_ne!(a, verdict_name("ab", "c", &[2; 32], None));
        assert!(a.starts_with("ivory:v2:verdict:"));
        assert_ne!(
            hint_name("r", Family::Signatures),
            hint_name("r", Family::Attestations)
        );
    }
}
