//! ivory-registry: OCI registry access for verification and digest pinning.
//!
//! Image references are `ivory-reference`'s, the one reference type the engine, the verifier
//! and this crate share. Requests go through ivory's own reqwest layer, not oci-client,
//! because oci-client reads whole bodies before any limit applies and exposes neither its
//! HTTP client nor its redirect policy. Every answer is streamed under
//! a hard cap and a shared read budget; registry text never reaches an error message (it is
//! logged, truncated); redirects are capped, never downgrade TLS and never carry
//! credentials to another origin; credentials go over TLS only, unless the policy allows
//! the registry to be insecure; every digest a registry sends is checked for form and,
//! where the body is read, against the body.
//!
//! Every call takes an absolute deadline, runs under a per-registry concurrency cap,
//! retries 429/503 only while the deadline allows, and is counted per registry host (calls
//! and answer classes). Per origin, the auth probe runs once (concurrent cold calls share
//! it); Bearer tokens are kept per origin, repository and credential set, so tenants'
//! credentials never mix. A missing referrers API is remembered for
//! [`Config::referrers_api_ttl`] so referrers go straight to the `sha256-<hex>` fallback tag.

pub use auth::Credentials;
pub use cause::{AddressRefused, LookupFailed, RedirectRefusal, TransportCause};
pub use client::{Listing, MAX_INDEX_DEPTH, Platform, Referrers, ReferrersVia, Registry};
pub use config::{
    Config, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BLOB_BYTES, DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_MANIFEST_BYTES, DEFAULT_MAX_PAGES, DEFAULT_PAGE_SIZE,
    DEFAULT_PER_REGISTRY_CONCURRENCY, DEFAULT_REFERRERS_API_TTL, DEFAULT_USER_AGENT,
    is_loopback_host,
};
pub use digest::DigestProblem;
pub use error::{EgressVia, Error, Result};
pub use ivory_reference::{AddressClass, Cidr, EgressRefusal, EgressRule, PrivateNetworks};
pub use json::{
    JsonLimits, JsonShape, OBJECT_COST_BYTES, ShapeError, VALUE_COST_BYTES, json_shape,
    parse_json_bounded,
};
pub use listing::{NameKind, Page, PageError, valid_repository, valid_tag};
pub use manifest::{
    ACCEPTED_MEDIA_TYPES, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, Manifest, OCI_INDEX, OCI_MANIFEST,
};
pub use operation::Operation;
pub use reference::parse_reference;
pub use stats::{MAX_NAMED_HOSTS, OTHER_HOSTS, RegistryStats};
pub use url_fetch::{UrlFetchError, UrlFetcher, checked_url};

mod auth;
mod cause;
mod client;
mod config;
mod digest;
mod error;
mod json;
pub mod listing;
mod manifest;
mod operation;
mod reference;
mod roots;
mod stats;
mod url_fetch;
