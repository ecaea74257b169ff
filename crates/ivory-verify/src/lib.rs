//! ivory-verify: cosign and Sigstore signature verification for ivory. [`CosignVerifier`]
//! implements the engine's [`ivory_engine::verifier::ImageVerifier`] seam over
//! `ivory_registry::Registry`, with ivory's own caches.
//!
//! * [`verdict`]: the synchronous core (no IO). Legacy cosign `.sig` (simple signing, several
//!   signatures per manifest) and `.att` (DSSE in-toto) layers are rewritten as v0.1 Sigstore
//!   bundles, so sigstore-verify checks every format alike (Fulcio chain, SCT, Rekor SET and
//!   inclusion proof, Rekor v2, RFC 3161 timestamps, tlog-body consistency); Sigstore bundles
//!   v0.1–v0.3 from OCI referrers go in as they are. Layers whose Rekor entry is of a kind
//!   sigstore-verify does not read (`rekord/0.0.1`, `intoto/0.0.1`) get the same checks in
//!   `legacy_tlog`.
//! * [`attestor_plan`]: an attestor turned into a key, a certificate or keyless identities, plus its
//!   trust root ([`trust`]: the embedded public-good `trusted_root.json`, `trustedRoot`,
//!   `keyless.roots` and `ctlog` keys).
//! * [`envelope`]: signature material as registries store it.
//! * [`notation`]: Notary Project signatures (JWS and COSE envelopes, X.509 chains to the
//!   attestor's trust stores, RFC 3161 timestamps, the trust policy's levels).
//! * `verifier`: discovery (`.sig`/`.att` tag ∥ referrers, blobs in parallel), caches
//!   (tag → digest; verdicts by digest + attestor hash + attestation, short-lived when
//!   negative, never for errors; concurrent identical misses coalesced, each caller bounded
//!   by its own deadline), deadlines. [`CosignVerifier::cache_stats`] counts hits, misses and
//!   coalesced waits per cache.
//!
//! Not supported: the attestor's `cosign.source.PullSecrets` (`pullSecrets`) is ignored.
//! Signatures are read with the credentials the [`CredentialsResolver`] derives from the
//! policy's `credentials` field (and the registry client's global docker config); secrets
//! named in `source.PullSecrets` are neither read nor used, so a signature repository that
//! needs them is read anonymously (or with those other credentials) and fails if refused.

pub mod attestor_plan;
pub mod blob;
mod chain;
mod classify;
pub mod envelope;
mod keys;
mod legacy_tlog;
pub mod notation;
mod rejection;
mod rekor_v2_dsse;
mod signed_json;
mod signer;
mod timestamp_token;
pub mod trust;
pub mod verdict;
mod verifier;

pub use attestor_plan::{KMS_UNSUPPORTED, Plan, TUF_UNSUPPORTED};
pub use envelope::{Envelope, Legacy};
pub use rejection::{Rejection, Sought};
pub use trust::PUBLIC_GOOD_TRUSTED_ROOT;
pub use verdict::{Accepted, NO_ATTESTATIONS, NO_SIGNATURES, TLOG_FAILED, evaluate};
pub use verifier::{
    CacheStats, CosignVerifier, CredentialsResolver, CrlAge, Lookup, RevocationConfig,
    RevocationStats, SharedCache, VerifierConfig,
};
