//! ivory-engine: admission decisions for image validating policies.
//!
//! Given an AdmissionRequest and the compiled policies a route selects, it matches, extracts
//! images, evaluates CEL, asks the [`verifier::ImageVerifier`] seam for digests and signatures,
//! and returns a [`decision::Decision`]. It does no IO of its own. Every front end judges a
//! request through [`pipeline::Pipeline::judge`].
//!
//! # What this crate owns
//!
//! * [`pipeline`]: the one path every front end takes (the webhook routes, the background scan,
//!   the one-shot commands through [`pipeline::run_routes`]): the object's shape ([`admission::shape`]), `namespaceObject`,
//!   PolicyExceptions, credentials, then the stage under an optional [`pipeline::Backstop`],
//!   with panics contained and answered by the failurePolicy, so no panic escapes a request.
//!   A field policies read but of the wrong type is refused, naming it (400 from the webhook,
//!   an error naming the resource from the CLI). What differs between front ends is a field of
//!   the [`pipeline::Pipeline`], never a second copy of the steps.
//! * [`admission`]: AdmissionReview types. `object`/`oldObject` stay raw JSON
//!   ([`admission::object::AdmittedObject`]): kind, labels and pod-spec images come from a strict
//!   summary taken while the review itself is parsed ([`admission::AdmissionReview::parse`]; an
//!   object the summary refuses sends the review through the usual parse), the raw text is taken
//!   from the kept body only if something reads it, and the `serde_json::Value` tree is built
//!   only when something reads more (CEL reading `object`, the CLI's patches). The response is
//!   written as text by [`admission::ReviewResponse::to_json`], with no JSON tree.
//! * [`matching`]: routes ([`matching::select_policies`], [`matching::route_policies`]),
//!   matchConstraints and matchConditions.
//! * [`images`]: image extraction from every container kind (containers, initContainers,
//!   ephemeralContainers, image volumes, pod templates), matched on the canonical form as well
//!   as as written.
//! * [`mutate`]: the mutating stage; [`validate`]: the validating stage (both below).
//! * [`report`]: one image against the loaded policies, as `ivory verify` and `ivory audit`
//!   report it ([`report::ImageChecker`]): the tag resolved with the credentials of the first
//!   policy that selects it, a synthetic Pod judged on every route
//!   ([`pipeline::run_routes`], which merges the routes' decisions), each attestor asked about
//!   the signature and each attestation, and the verdict from the policies' statuses; plus
//!   which hosts and repositories a policy may select ([`images::may_select_on_host`],
//!   [`images::selects_repository`]) for an audit that lists registries. The binary renders it.
//! * [`resources`]: the cluster reads of CEL (`resource.Get`/`List`, `globalContext.Get`):
//!   answered synchronously through [`resources::ResourceSource`] ([`resources::FileResources`]
//!   for `--cluster-resources` files of `serve` in file mode, `apply` and `verify`, and for
//!   `ivory test`; ivory-server's watches with `--kube`; [`resources::NoResources`] where there
//!   are none; GlobalContextEntries as [`resources::GlobalContextEntry`]), with a per-policy
//!   host that confines each read to what the policy declared (a namespaced policy: its own
//!   namespace) and records every read that failed, so the failurePolicy decides even when CEL
//!   absorbed the error.
//! * [`exceptions`]: PolicyExceptions (below).
//! * `testing` (feature `test-support`, tests only): `FakeVerifier`, the in-memory
//!   `ImageVerifier` the engine's, the server's and the binary's unit tests share.
//!
//! The JSON text writer of the response and of the `verified-images` annotation, and the keyed
//! hasher of every map keyed by request-chosen data, are [`ivory_plumbing`]'s, shared with the
//! verifier and the binary's log lines.
//!
//! It does not talk to registries or the API server: everything external goes through
//! [`verifier::ImageVerifier`] (which takes parsed [`ivory_reference::ImageReference`]s),
//! [`resources::ResourceSource`] and the pipeline's [`pipeline::NamespaceSource`] and
//! [`pipeline::CredentialSource`].
//!
//! # The mutating stage
//!
//! [`mutate::mutate`]: for each policy with `mutateDigest`, match, evaluate matchConditions, take
//! images from the well-known JSON pointers, normalize them (`docker.io/…:latest`), skip digests
//! and images the policy does not select, resolve the rest concurrently through
//! [`verifier::ImageVerifier::resolve_digest`] (the verifier's tag cache, coalesced), and emit
//! one RFC 6902 `replace` op per pointer, de-duplicated across policies. A policy's pinning mode
//! ([`ivory_policy::Pinning`]: the `ivory.dev/digest-pinning` annotation, narrowed by the
//! Namespace label of the same name as the policy allows) decides which objects get pins: all,
//! Pods only, or none; `verifyDigest` follows the same mode (`docs/kyverno-semantics.md` §3).
//!
//! # The validating stage
//!
//! [`validate::validate`] (or [`validate::validate_memoized`], which the pipeline calls): for each
//! policy, match, matchConditions, extract images (built-in extractors by resource plus
//! `spec.images`), filter by `matchImageReferences`, then prefetch concurrently every
//! verification the policy's CEL can ask for about the images it selects
//! ([`verifier::ImageVerifier::verify`]; a verdict the verifier already holds for a digest is
//! taken at once by [`verifier::ImageVerifier::verify_known`], without a future or deadline per
//! question). Identical questions of several policies are asked once, compared by the SHA-256
//! fingerprints of their attestor, attestation and credentials JSON. For a multi-platform image
//! the index is verified or, as the policy's `ivory.dev/verify-platforms` says, each platform
//! manifest. Image data for `image.GetMetadata` is prefetched for those images and for image
//! literals in the expressions (from an index, the manifest of the platform the workload's
//! `nodeSelector` and required node affinity pin, else linux/amd64, or the index's only
//! platform the workload can run), plus, for `verifyDigest`, the digest of each tag-only image.
//!
//! Image data of any other image an expression names is fetched when the expression first asks
//! for it, through the same verifier and deadline, and the policy is evaluated again with the
//! answer (`validate/late.rs`: at most two rounds and 32 images per request, never a
//! link-local or unspecified address). Then `verifyDigest` (a tag the registry answered for was
//! not pinned: fail; a tag whose registry could not answer follows the failurePolicy), then the
//! CEL validations, synchronously against those answers. A prefetched error matters only to an
//! expression that reads it, and a validation that is false whether the missing answers would
//! have been "verified" or "not verified" is a definite failure. After all policies,
//! `required`, enforced across all policies of the request; then Deny/Warn/Audit assemble the
//! [`decision::Decision`]. An admitted one carries the [`validate::VERIFIED_ANNOTATION`] audit
//! annotation (what was verified, by which attestor, the signer the verifier reported: key
//! fingerprint or certificate identity, and the log index), each entry written once when
//! verified and kept with a memoized result. Annotations on the object are never
//! evidence: verification always happens here.
//!
//! What does not change between requests is derived once per policy version (`validate/facts.rs`,
//! kept in the policy's [`ivory_policy::DerivedSlot`]): the static attestor and attestation
//! bindings, which verification functions the expressions call, whether results may be
//! memoized, the job fingerprints, and per image (4,096 per policy, 16,384 in all) whether
//! `matchImageReferences` selects it and its parsed reference. [`validate::DecisionMemo`] keeps
//! the results of policies that read only images and verification answers (a moka cache of
//! 32 MiB by weight), reused only for equal answers. A policy's evaluator is built only when CEL
//! runs. `object`, `oldObject`, `request` and `namespaceObject` are converted to CEL once per
//! request and only if an expression reads them (`bindings`).
//!
//! # Deadlines, errors and failurePolicy
//!
//! Every external call carries the absolute deadline. When it passes, the policy's
//! `failurePolicy` decides explicitly: `Fail` denies naming the image, registry and budget;
//! `Ignore` allows with a warning and an audit annotation. Errors are typed
//! ([`verifier::VerifyError`]: deadline, unavailable, not found, hostile); a definite "not
//! verified" carries its [`verifier::Rejection`], decided once in ivory-verify and kept as it is
//! through every cache, so only people read its text. Inside CEL the verification functions
//! answer through [`ivory_cel::Host`], whose [`ivory_cel::HostError`] keeps the class while its
//! text is Kyverno's; the interpreter carries only text and `||` may absorb it, so the
//! engine's host also records each `VerifyError` an expression read and decides from those.
//! The CLI's verdicts and exit codes (0 pass, 1 not verified or denied, 2 could not be checked)
//! and the `rule_result` metric label come from [`decision::Status`].
//!
//! # PolicyExceptions
//!
//! Loaded by [`ivory_policy::exception`] (`policyRefs` by name and kind, `matchConditions`
//! compiled with `object`, `oldObject`, `request`, `namespaceObject`; `expiresAt` honoured;
//! `images`/`allowedValues` and unknown fields refused) and acted on only when enabled
//! (`--enable-policy-exceptions`, Kyverno's `--enablePolicyException`). They come from the
//! policy files (documents of kind `PolicyException` beside the policies; `ivory apply` and
//! `ivory verify` take `--exception FILE`) or, with `--kube`, from ivory-server's watch.
//! Before either stage runs, [`exceptions::Exceptions::partition`] takes out every selected
//! policy (autogen variants included) that applies to the request and has an exception whose
//! conditions all hold: it gets a `skip` result with Kyverno's message
//! (`rule is skipped due to policy exception: <ns>/<name>`) and the property `exceptions`, is
//! not evaluated and pins nothing. An exception condition that errs makes the policy's result
//! an error.

pub mod admission;
mod bindings;
pub mod decision;
pub mod exceptions;
pub mod images;
pub mod matching;
pub mod mutate;
pub mod pipeline;
pub mod report;
pub mod resources;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod validate;
pub mod verifier;
