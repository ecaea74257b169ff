//! ivory-plumbing: the pieces of the hot path that are about speed and hashing, not admission.
//!
//! The engine, the verifier, the server and the binary all write JSON text and key maps by data
//! a request chose; each piece is here once, in a crate that depends on no other ivory crate, so
//! the response, the `verified-images` annotation and the log lines share one writer, and every
//! request-keyed map in the engine and the verifier shares one hasher.
//!
//! # What this crate owns
//!
//! * [`json_text`]: JSON written straight into text, with no `serde_json::Value` tree: string
//!   literals escaped byte for byte as serde_json escapes them, a word (eight bytes) at a time
//!   where nothing needs escaping, a long string's escaped text remembered per thread; plus
//!   lists and maps of strings and unsigned numbers. serde_json looks every byte of a string up
//!   alone, and on the warm path the AdmissionReview response (written by
//!   `ivory_engine::admission::ReviewResponse::to_json`), its `verified-images` annotation (JSON
//!   inside JSON, so escaped twice) and the binary's log lines are mostly long runs of plain
//!   text (BENCHMARKS.md, issue 27's third round). Byte-exact output is what keeps a string
//!   from breaking out of its quotes (docs/SECURITY.md, "Strings breaking out of the answer").
//! * [`json_read`]: the admission review's JSON reader: serde's derived types read from the
//!   subset of JSON an API server writes, strings scanned a word at a time; anything outside
//!   the subset is refused, and the caller reads it with serde_json, whose answer stands
//!   (BENCHMARKS.md, issue 47).
//! * [`keyed`]: the hasher of every map and cache keyed by request-chosen data (the engine's
//!   kept image facts, verification jobs and memoized results; the verifier's verdict, tag and
//!   index caches): ahash, keyed per map from the OS's random source, so no Pod can aim its keys
//!   at one bucket. std's SipHash, keyed the same way, cost the warm path more than any other
//!   hashing; ahash's fallback algorithm, the one this build uses, is designed to stay
//!   collision-resistant against callers who do not know the key.
//!
//! It does no IO and knows nothing of admission: what a response or an annotation holds is the
//! engine's business.

pub mod json_read;
pub mod json_text;
pub mod keyed;
