//! ivory-verify: cosign, Sigstore and Notation signature verification for ivory.
//! [`CosignVerifier`] implements the engine's [`ivory_engine::verifier::ImageVerifier`] seam over
//! [`ivory_registry::Registry`], with ivory's own caches. It owns no policy logic: what to verify
//! and what a verdict means for the request are the engine's.
//!
//! * [`verdict`]: the synchronous core (no IO). Legacy cosign `.sig` (simple signing, several
//!   signatures per manifest) and `.att` (DSSE in-toto) layers are rewritten as v0.1 Sigstore
//!   bundles, so sigstore-verify checks every format alike (Fulcio chain, SCT, Rekor SET and
//!   inclusion proof, Rekor v2, RFC 3161 timestamps, tlog-body consistency); Sigstore bundles
//!   v0.1–v0.3 from OCI referrers go in as they are. Layers whose Rekor entry is of a kind
//!   sigstore-verify does not read (`rekord/0.0.1`, `intoto/0.0.1`) get the same checks in
//!   `legacy_tlog`: SET, entry body against payload or envelope, signature and signer, chain
//!   and validity at the integrated time, embedded SCT. Sigstore bundles whose entry is Rekor v2
//!   `dsse/0.0.2` are checked by `rekor_v2_dsse` (body against payload hash, signature and
//!   certificate or key, inclusion proof to the checkpoint, checkpoint signed by the named
//!   trust-root log valid at the RFC 3161 times) while sigstore-verify checks the rest with its
//!   log step skipped (`verdict::run_with_entry`).
//! * [`attestor_plan`]: an attestor turned into a key, a certificate or keyless identities
//!   (identities, `subjectExpression`, `additionalExtensions`), plus its trust root ([`trust`]:
//!   the embedded public-good `trusted_root.json`, `trustedRoot`, `keyless.roots` and `ctlog`
//!   keys).
//! * [`envelope`]: signature material as registries store it. Every reader of signature JSON
//!   parses it under bounds through `signed_json`, a leaf module.
//! * [`notation`]: Notary Project signatures (below).
//! * [`blob`]: a file, its bytes or a `sha256:` digest against a Sigstore bundle with an
//!   attestor's plan, for `ivory verify-blob`: the image path's sigstore-verify call, with the
//!   artefact streamed.
//! * `timestamp_token`: RFC 3161 tokens read with their repeated SignedData certificates once,
//!   before the Notation and Sigstore bundle paths read them.
//! * `verifier`: discovery, image data, platforms and the caches (below). Registry errors
//!   become [`ivory_engine::verifier::VerifyError`]s in one place, `classify`, by the registry
//!   error's variant, never its text; a definite "not verified" is a typed [`Rejection`].
//!
//! # Discovery
//!
//! Signatures are read from the cosign `.sig`/`.att` tag and from the OCI referrers (the API or
//! the `sha256-<hex>` fallback tag), in the image's repository, the attestor's
//! `source.repository`, or `--signature-repository`/`COSIGN_REPOSITORY` (`verifier/sources.rs`).
//! Every listed referrer is a candidate whatever its descriptor's label; at most
//! [`VerifierConfig::max_signatures`] are fetched and each is judged by its own media types. The
//! source where a repository's signatures were last found is read first, the other only when
//! nothing there verifies; a negative verdict carries what each layout held
//! ([`Rejection::Searched`]).
//!
//! Image data for CEL has Kyverno's shape (from an index, the manifest of the workload's
//! platform). For a policy's `ivory.dev/verify-platforms`, the platform manifests of an index are
//! verified each by digest (`verifier/platforms.rs`): platforms read as containerd normalizes
//! them, an entry without a platform placed by its image config, nested indexes descended
//! into, and what cannot be placed verified whatever the Pod runs.
//!
//! # Caches
//!
//! * Tag → digest (`--tag-cache-ttl`, default 30 s, on `serve`, `verify`, `apply` and `audit`;
//!   Helm `tagCacheTTL`), reused only by the same credential set, `allowInsecureRegistry`
//!   included: what one set of pull secrets saw, or reached over plain HTTP, never answers for
//!   another. A longer lifetime spares registries a herd of HEAD requests for popular tags
//!   (every replica of a rollout asks once); a shorter one notices a moved tag sooner: until the
//!   entry expires the old digest is pinned. `0s` asks the registry every time.
//! * Verdicts by digest, never by tag: digest + signature repository + attestor/trust hash +
//!   attestation type; positive ones for [`VerifierConfig::verified_ttl`] (1 h), definite
//!   negative ones for [`VerifierConfig::negative_ttl`] (30 s), errors never. Each verdict is
//!   stamped with when it was reached, so a background scan's `revalidating` view reaches again
//!   those older than the scan. A verdict of unknown revocation status is transient: handed to
//!   the callers waiting for that load, never kept here or in the L2.
//! * Concurrent identical misses share one load, each caller bounded by its own deadline
//!   (`verifier/cache.rs`). [`CosignVerifier::cache_stats`] counts hits, misses and coalesced
//!   waits per cache.
//!
//! The fleet-wide cache hooks in behind the in-process ones ([`SharedCache`], implemented by
//! ivory-l2 on Redis and on files), in the `load` closures of the verifier and its cache, so the
//! in-process coalescing runs first and only one load per replica reaches it. This crate decides
//! what is shared and under which name (`verifier/shared.rs`), and knows nothing of Redis:
//! positive and negative verdicts (named by SHA-256 of the in-process key; a negative verdict
//! with its typed [`Rejection`]), tag → digest (reference plus an HMAC of the whole credential
//! set, so no credential and no guessable hash of one appears in a name), and the signature
//! source hint. Errors are never shared. Lifetimes are the in-process ones; an entry read from
//! the L2 then lives its full lifetime in the reader, so a value can be served for up to twice
//! its lifetime across the fleet. Tag entries are named with the sealing key, so while a key
//! rotates, replicas that seal with different keys do not share tags. Every name starts with
//! the entry format, `ivory:v2:`: a replica never asks for another format's names, and an entry
//! under its own names that does not decode is ignored.
//!
//! # Notation signatures
//!
//! A `notary` attestor becomes a plan ([`notation`]: its `certs` and `tsaCerts` parsed once, and
//! the trust policy from `ivory.dev/notation-trust-policy`, [`ivory_policy::notation`]) in the
//! same plan cache as cosign attestors. For one verdict-cache miss, `verifier/notation.rs` reads
//! the image's manifest (its descriptor is what `targetArtifact` must equal) and its referrers of
//! type [`notation::SIGNATURE_ARTIFACT_TYPE`] (at most [`notation::MAX_SIGNATURE_ATTEMPTS`], each
//! envelope under `max_signature_bytes`), and the notation module checks them in order with no
//! IO ([`notation::envelope`]: JWS and COSE parsing; its `check`: integrity, authenticity,
//! authentic timestamp, expiry, revocation, as the level says; [`notation::revocation`]: the
//! chain against CRLs already held). CRLs come from `verifier/revocation.rs`, a store bounded by
//! bytes that fetches them in the background (queued by a lookup that finds nothing usable,
//! never awaited by an admission) through [`ivory_registry::UrlFetcher`]'s guarded, capped GET
//! ([`RevocationConfig`]). Verdicts go through the cosign path's cache, coalescing and
//! [`SharedCache`] names unchanged, the attestation part of the key being `referrer:<type>`.
//! Crates: `coset` (COSE_Sign1 and its `Sig_structure`, rather than hand-encoded CBOR);
//! `x509-cert` (certificate fields, CRLs) and `cms` (an RFC 3161 token's certificates);
//! `rustls-webpki` with its `aws-lc-rs` algorithms (P-521 and RSA-PSS chains, code-signing
//! usage); `aws-lc-rs` (RSA-PSS and fixed-width ECDSA checks, RSA key sizes); sigstore-verify's
//! RFC 3161 checks for EC TSA keys, and `timestamp_rsa` for tokens of RSA TSAs
//! (`docs/kyverno-semantics.md` §16).
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
pub mod trust_source;
pub mod verdict;
mod verifier;

pub use attestor_plan::{KMS_UNSUPPORTED, Plan};
pub use envelope::{Envelope, Legacy};
pub use rejection::{Rejection, Sought};
pub use trust::PUBLIC_GOOD_TRUSTED_ROOT;
pub use trust_source::{
    Pending, RefreshConfig, RefreshStats, RootState, TrustRoots, TrustSource, TrustSourceError,
    TufSource, TufSources,
};
pub use verdict::{Accepted, NO_ATTESTATIONS, NO_SIGNATURES, TLOG_FAILED, evaluate};
pub use verifier::{
    CacheStats, CosignVerifier, CredentialsResolver, CrlAge, Lookup, RevocationConfig,
    RevocationStats, SharedCache, VerifierConfig,
};
