//! ivory's integration tests: the real `ivory` binary (`CARGO_BIN_EXE_ivory`) as a process.
//!
//! * `advisories`: Kyverno's published bypasses replayed against `ivory serve`.
//! * `serve`: `ivory serve` over HTTPS with a CA the test makes, against the real registry.
//! * `serve_images`: every image of a pod is judged (spellings, `kubectl debug`, image volumes,
//!   malformed images).
//! * `serve_bypass`: malformed reviews, paths and timeouts, namespaceSelector trust, credential
//!   scope.
//! * `serve_parity`: Kyverno parity (key hash algorithms across cosign generations, legacy
//!   Rekor entry kinds, certificate constraints, fields refused at load, image data).
//! * `serve_limits`: the webhook port against clients holding partial bodies, header trickles,
//!   idle and surplus connections (body budget, timeouts, connection cap; peak RSS).
//! * `serve_reload`: policy files rewritten non-atomically while `ivory serve` watches them.
//! * `serve_trust_root`: `ivory serve --tuf-mirror` following a TUF repository on loopback.
//! * `serve_supervise`: `ivory serve --supervise` replacing a serving process killed with SIGKILL.
//! * `serve_cel_cost`: `ivory serve` against costly CEL (load-time refusal, run-time limit).
//! * `fleet`: `ivory serve` replicas sharing a real redis-server (`--cache-redis`).
//! * `memory`: peak RSS of `ivory serve` against hostile registries and a hostile Redis.
//! * `notation`: Notation signatures (notation CLI fixtures) through `serve`, `verify`, `audit`.
//! * `webhooks`: `ivory webhooks` output.
//! * `dogfood`: ivory's own image (scripts/image.sh), signed and attested, judged by ivory.
//! * `cli_verify`, `cli_apply`, `cli_audit`: the one-shot commands against the real registry
//!   (`cli_util`: running them, pushing fixtures).
//! * `cli_verify_blob`: `ivory verify-blob` on cosign v3 blob bundles (as `cosign verify-blob`
//!   answered), and the official Sigstore conformance suite's 140 verification cases
//!   (`scripts/sigstore-conformance.sh`).
//! * `cli_pipeline`: a malformed review refused alike by `apply` and `serve` (one pipeline).
//! * `cli_cluster_resources`: `--cluster-resources` for `resource.Get` in `verify` and `apply`.
//! * `cli_cache`: the persistent verification cache of the one-shot commands (`--cache-dir`),
//!   and a cache folder of another user refused.
//! * `cli_files`: `convert -o` and `ivory test` against hostile folders and suites (planted
//!   links, paths out of the suite, FIFOs) and names with escape sequences.
//! * `cli_completions`: `ivory completions bash|zsh|fish`.
//! * `cli_registries`: every command against a plain-HTTP loopback registry and a self-signed
//!   one; the one-line error form.
//! * `cli_egress`: the egress rule through `verify` and `serve`: the metadata address in other
//!   spellings under a broad glob and in image data (in a private network namespace),
//!   `--egress-private`, `--egress-allow`.
//! * `demo`: `scripts/demo.sh` and the story it prints.
//! * `discovery`: cosign v3 signatures behind the referrers fallback index however its
//!   descriptors are labelled, in another repository, and another image's bundles (denied),
//!   through `serve` and `verify`.
//! * `util`: process startup, HTTPS clients, review and policy builders.

// Test helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

mod advisories;
mod cli_apply;
mod cli_audit;
mod cli_audit_shards;
mod cli_cache;
mod cli_cluster_resources;
mod cli_completions;
mod cli_convert;
mod cli_egress;
mod cli_exceptions;
mod cli_files;
mod cli_pipeline;
mod cli_registries;
mod cli_test_suites;
mod cli_util;
mod cli_verify;
mod cli_verify_blob;
mod demo;
mod discovery;
mod dogfood;
mod fleet;
mod memory;
mod monitoring;
mod notation;
mod notation_revocation;
mod serve;
mod serve_bypass;
mod serve_cel_cost;
mod serve_exceptions;
mod serve_images;
mod serve_limits;
mod serve_parity;
mod serve_reload;
mod serve_route_scope;
mod serve_supervise;
mod serve_trust_root;
mod util;
mod webhooks;
