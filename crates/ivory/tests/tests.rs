//! ivory's integration tests: the real `ivory` binary (`CARGO_BIN_EXE_ivory`) as a process.
//!
//! * `advisories`: Kyverno's published bypasses replayed against `ivory serve`.
//! * `serve`: `ivory serve` over HTTPS with a CA the test makes, against the real registry.
//! * `serve_images`: every image of a pod is judged (spellings, `kubectl debug`, image volumes,
//!   malformed images).
//! * `serve_bypass`: malformed reviews, paths and timeouts, namespaceSelector trust, credential
//!   scope.
//! * `serve_cel_cost`: `ivory serve` against costly CEL (load-time refusal, run-time limit).
//! * `memory`: peak RSS of `ivory serve` against hostile registries.
//! * `webhooks`: `ivory webhooks` output.
//! * `dogfood`: ivory's own image (scripts/image.sh), signed and attested, judged by ivory.
//! * `cli_verify`, `cli_apply`, `cli_audit`: the one-shot commands against the real registry
//!   (`cli_util`: running them, pushing fixtures).
//! * `util`: process startup, HTTPS clients, review and policy builders.

// Test helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

mod advisories;
mod cli_apply;
mod cli_audit;
mod cli_util;
mod cli_verify;
mod dogfood;
mod memory;
mod serve;
mod serve_bypass;
mod serve_cel_cost;
mod serve_images;
mod util;
mod webhooks;
