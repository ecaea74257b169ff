//! ivory-registry: OCI registry access for verification and digest pinning. It owns the
//! registry protocol, not signatures (ivory-verify judges what it fetches).
//!
//! Image references are `ivory-reference`'s ([`ivory_reference::ImageReference`]), the one
//! reference type the engine, the verifier and this crate share. Requests go through ivory's
//! own reqwest layer, not oci-client, because oci-client reads whole bodies (`bytes()`,
//! `text()`) before any limit applies and exposes neither its HTTP client nor its redirect
//! policy; it is gone from the product, and only the fuzz workspace still uses it, as an
//! independent reference parser for differential checks. Auth challenges are parsed by
//! `http-auth`.
//!
//! What [`Registry`] does: tag → digest by HEAD, manifests (and a platform's manifest of an
//! index), blobs, referrers (the API, or the `sha256-<hex>` fallback tag, [`ReferrersVia`]), and
//! catalog and tags page by page for `ivory audit` ([`listing`]: names checked against the OCI
//! distribution grammar before use, over-full pages cut, a `Link` header only a same-origin
//! signal for the next page, whose URL ivory builds itself), and a whole registry walked
//! catalog → tags into an [`ImageSink`] ([`Walk`]: signature tags skipped, `max_images` bound).
//!
//! * **Bounded**: every answer is streamed under a hard cap and a shared read budget; JSON is
//!   refused before parsing when its tree would balloon ([`json_shape`], [`parse_json_bounded`],
//!   [`JsonLimits`]); every digest a registry sends is checked for form (algorithm, lower-case
//!   hex, length: [`DigestProblem`]) and, where the body is read, against the body.
//! * **TLS and credentials**: at most 3 redirects, which never downgrade TLS and never carry
//!   credentials to another origin; credentials go over TLS only, and plain HTTP is used only
//!   for a registry allowed insecure (the policy's `allowInsecureRegistry`,
//!   `--allow-insecure-registry`/`--allow-http-registry`) or on loopback, tried after TLS fails
//!   as go-containerregistry does; a plain-HTTP token realm of a TLS registry is refused.
//! * **Auth**: per origin, the `/v2/` probe runs once (concurrent cold calls share it); Bearer
//!   tokens are kept per origin, repository and credential set, so tenants' credentials never
//!   mix ([`Credentials`]).
//! * **Egress** ([`Config::egress`], an [`EgressRule`]; `--egress-allow`/`--egress-private`):
//!   every connection is judged. Names are judged on the system resolver's answer, which is what
//!   is connected to (`client/resolve.rs`, `GuardedResolver`); address literals, in any
//!   spelling after URL parsing, before each request, token realm and redirect hop
//!   (`judge_literal`). [`Error::EgressRefused`] names the image, the address and the flag.
//! * **Deadlines**: every call takes an absolute deadline, runs under a per-registry
//!   concurrency cap and retries 429/503 only while the deadline allows.
//! * **Mirrors** ([`Config::mirrors`], `ivory test --registry-mirror`): a registry's images are
//!   fetched from another host while names, globs and cache keys keep the original host.
//! * **Errors**: registry text never reaches an error message (it is logged, truncated).
//!   [`Error::summary`] renders one line for people (registry and root cause once; the full
//!   chain goes to the debug log). Transport failures are classified once, by type, from the
//!   error chain (`cause.rs`: [`TransportCause`] from rustls, io, hyper and ivory's own resolver
//!   error, [`RedirectRefusal`] from ivory's redirect policy; `hyper` and `rustls` are direct
//!   dependencies only to name those error types); operations are an enum ([`Operation`]).
//! * **Counters**: calls and answer classes per registry host ([`RegistryStats`]). A missing
//!   referrers API is remembered for [`Config::referrers_api_ttl`], so referrers go straight to
//!   the fallback tag.
//! * **URLs a certificate names** ([`UrlFetcher`], from [`Registry::url_fetcher`]): one guarded
//!   GET, http(s) only, no redirects, the same egress rule, a capped body and a deadline; the
//!   verifier's CRL fetches.

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
pub use listing::{NameKind, Page, PageError, is_signature_tag, valid_repository, valid_tag};
pub use manifest::{
    ACCEPTED_MEDIA_TYPES, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, Manifest, OCI_INDEX, OCI_MANIFEST,
};
pub use operation::Operation;
pub use reference::parse_reference;
pub use stats::{MAX_NAMED_HOSTS, OTHER_HOSTS, RegistryStats};
pub use url_fetch::{UrlFetchError, UrlFetcher, checked_url};
pub use walk::{ImageSink, Walk, WalkError, WalkProblem};

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
mod walk;
