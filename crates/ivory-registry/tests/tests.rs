//! Integration tests against the real `docker-registry` (CNCF Distribution 2.8) started by
//! ivory-testkit, plus in-process fault servers for what a real registry cannot do.
//!
//! - `budget`: the cold verification path's request sequence.
//! - `auth`: anonymous, basic (explicit, secret, config file) and token flows, request counts.
//! - `tls`: custom CA, missing CA, allowInsecureRegistry, mirrors.
//! - `fetch`: manifests, blobs, limits, platforms, referrers fallback.
//! - `listing`: tag and catalog pagination.
//! - `egress`: the egress rule on the registry host in every spelling, redirects (chained
//!   through an allowed host), token realms and CRL URLs at the metadata address, in a private
//!   network namespace; loopback under `--egress-private deny` and the allow-list.
//! - `faults`: deadlines, refusals, 429/503, malformed and looping manifests, concurrency cap.
//! - `hostile`: endless bodies, echoed error bodies, credential-collecting redirects,
//!   plain-HTTP token realms, forged digests.

// Setup helpers outside #[test] fns panic on failure by design.
#![allow(clippy::unwrap_used)]

mod auth;
mod budget;
mod egress;
mod faults;
mod fetch;
mod hostile;
mod listing;
mod tls;
mod util;
