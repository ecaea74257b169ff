//! ivory-registry: OCI registry access for verification and digest pinning.
//!
//! References and credential types come from oci-client; requests go through ivory's own
//! reqwest layer, because oci-client buffers whole bodies before any limit applies and
//! exposes neither its HTTP client nor its redirect policy. Every answer is streamed under
//! a hard cap, registry text never reaches an error message, redirects are capped and
//! never carry credentials to another origin, and every digest a registry sends is checked
//! for form and, where the body is read, against the body. Every call takes an absolute deadline, runs under a per-registry
//! concurrency cap, retries 429/503 only while the deadline allows, enforces size limits,
//! and is counted per registry host (calls and answer classes). One oci-client per credential
//! set keeps tokens and pooled connections without mixing tenants' credentials; each is built
//! once, on the blocking pool (loading root certificates is slow), however many calls want it.
//! Per host, the auth probe runs once (concurrent cold calls share it), and a missing
//! referrers API is remembered for [`Config::referrers_api_ttl`] so referrers go straight to
//! the `sha256-<hex>` fallback tag.

pub use auth::Credentials;
pub use client::{MAX_INDEX_DEPTH, Platform, Registry};
pub use config::{
    Config, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BLOB_BYTES, DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_MANIFEST_BYTES, DEFAULT_MAX_PAGES, DEFAULT_PAGE_SIZE,
    DEFAULT_PER_REGISTRY_CONCURRENCY, DEFAULT_REFERRERS_API_TTL, DEFAULT_USER_AGENT,
};
pub use digest::DigestProblem;
pub use error::{Error, Result};
pub use manifest::{
    ACCEPTED_MEDIA_TYPES, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, Manifest, OCI_INDEX, OCI_MANIFEST,
};
pub use reference::parse_reference;
pub use stats::RegistryStats;

mod auth;
mod client;
mod config;
mod digest;
mod error;
mod manifest;
mod reference;
mod roots;
mod stats;
