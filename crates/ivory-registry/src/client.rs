//! `Registry`: the deadline-, limit- and retry-aware registry client.
//!
//! oci-client provides references and credentials types; every request that reads an
//! answer goes through [`http`] and [`session`] so that each body is bounded before it is
//! buffered, registry text never reaches an error message, and digests are checked.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ivory_reference::ImageReference;
use reqwest::Method;

use crate::reference::{parse_reference, sibling};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::auth::{Credentials, RegistryAuth, registry_auth};
use crate::config::Config;
use crate::digest;
use crate::error::{Error, Result, Site};
use crate::listing::{self, NameKind, Page};
use crate::manifest::{self, ACCEPTED_MEDIA_TYPES, Manifest};
use crate::operation::Operation;
use crate::stats::{RegistryStats, StatsTable};
use crate::url_fetch::{UrlFetchError, UrlFetcher};

use http::{ReadBudget, build_client, error_snippet, read_capped};
use referrers::ReferrersApi;
pub use referrers::{Referrers, ReferrersVia};
use session::{Challenge, Token, TokenKey};

pub(crate) mod http;
mod referrers;
pub(crate) mod resolve;
mod session;
#[cfg(test)]
mod tests;
mod transport;

/// Index-in-index nesting we follow before calling the manifest unsound.
pub const MAX_INDEX_DEPTH: usize = 4;
/// Hosts whose auth challenge is remembered.
const MAX_HOSTS: u64 = 1024;
/// Bearer tokens kept (one per origin × repository × credential set).
const MAX_TOKENS: u64 = 16 * 1024;
/// An unused token is dropped after this, whatever its lifetime.
const TOKEN_IDLE: Duration = Duration::from_secs(30 * 60);
/// `Docker-Content-Digest`, as the field name in errors.
const DIGEST_HEADER: &str = "Docker-Content-Digest";

/// Target platform for [`Registry::fetch_platform_manifest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// e.g. `linux`.
    pub os: String,
    /// e.g. `amd64`.
    pub architecture: String,
    /// e.g. `v8`; `None` matches any variant.
    pub variant: Option<String>,
}

/// Registry client shared across requests; clones share pools, tokens, caps and counters.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: Config,
    user_agent: &'static str,
    global: Credentials,
    roots: Arc<Vec<Vec<u8>>>,
    /// HTTP clients (verifying TLS; accepting any certificate, for insecure registries).
    /// They hold no credentials: each request carries its own.
    http_secure: reqwest::Client,
    http_insecure: tokio::sync::OnceCell<reqwest::Client>,
    /// Bytes of registry answers being read at once, across every call.
    read_budget: ReadBudget,
    gates: Mutex<HashMap<String, Arc<Semaphore>>>,
    plain_http: Mutex<HashSet<String>>,
    /// Per origin: what its `/v2/` asked for. Forgotten on 401 so it is probed again.
    probes: moka::future::Cache<String, Challenge>,
    /// Bearer tokens per origin, repository and credential set.
    tokens: moka::future::Cache<TokenKey, Token>,
    /// Per host: does `/v2/<repo>/referrers/<digest>` exist (learnt, with a TTL)?
    referrers_api: ReferrersApi,
    stats: StatsTable,
}

/// What one call needs: parsed reference, where errors point, and the auth to use.
struct Target {
    reference: ImageReference,
    image: String,
    host: String,
    auth: RegistryAuth,
}

impl Target {
    fn site(&self, op: Operation) -> Site<'_> {
        Site {
            op,
            image: &self.image,
            registry: &self.host,
        }
    }

    /// `<repository>/<kind>/<reference>` for manifest and blob URLs.
    fn path(&self, kind: &str, reference: &str) -> String {
        format!("{}/{kind}/{reference}", self.reference.repository())
    }

    /// Tag or digest, as the manifest URL wants it.
    fn manifest_ref(&self) -> &str {
        self.reference
            .digest()
            .or_else(|| self.reference.tag())
            .unwrap_or("latest")
    }
}

// === impl Registry ===

impl Registry {
    /// A fetcher of URLs ivory did not choose (CRL distribution points), with this client's
    /// trust, connect timeout, user agent and address guards, and a budget of its own of
    /// `budget_bytes` bodies held at once.
    pub fn url_fetcher(
        &self,
        budget_bytes: usize,
    ) -> std::result::Result<UrlFetcher, UrlFetchError> {
        UrlFetcher::new(&self.inner.config, &self.inner.roots, budget_bytes)
    }

    /// Builds the client: validates the CA bundle and loads the docker config file.
    pub fn new(config: Config) -> Result<Self> {
        let roots = match &config.ca_bundle_pem {
            Some(pem) => parse_ca_bundle(pem)?,
            None => Vec::new(),
        };
        let global = match &config.docker_config {
            Some(path) => {
                let bytes = std::fs::read(path).map_err(|e| Error::InvalidCredentials {
                    source_name: path.display().to_string(),
                    detail: e.to_string(),
                })?;
                Credentials::anonymous()
                    .with_docker_config_json(&path.display().to_string(), &bytes)?
            }
            None => Credentials::anonymous(),
        };
        // One small leak per Registry, so clients built later need no copy.
        let user_agent: &'static str = Box::leak(config.user_agent.clone().into_boxed_str());
        // Building the client now surfaces a bad CA bundle at startup, not on first use.
        let http_secure =
            build_client(&roots, false, &config, user_agent).map_err(|e| Error::Config {
                detail: format!("registry CA bundle rejected: {e}"),
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                referrers_api: ReferrersApi::new(config.referrers_api_ttl),
                read_budget: ReadBudget::new(config.max_buffered_bytes),
                config,
                user_agent,
                global,
                roots: Arc::new(roots),
                http_secure,
                http_insecure: tokio::sync::OnceCell::new(),
                gates: Mutex::default(),
                plain_http: Mutex::default(),
                probes: moka::future::Cache::builder()
                    .max_capacity(MAX_HOSTS)
                    .build(),
                tokens: moka::future::Cache::builder()
                    .max_capacity(MAX_TOKENS)
                    .time_to_idle(TOKEN_IDLE)
                    .build(),
                stats: StatsTable::default(),
            }),
        })
    }

    /// The configuration this registry was built with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Tag → digest with one HEAD (GET only when `Docker-Content-Digest` is missing).
    /// A reference that already carries a digest is answered without network. The header
    /// must be a well-formed digest; a body, when read, must hash to it.
    pub async fn resolve_digest(
        &self,
        image: &ImageReference,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<String> {
        let t = self.target(image, creds);
        if let Some(d) = t.reference.digest() {
            return Ok(d.to_string());
        }
        let t = &t;
        let site = t.site(Operation::ResolveDigest);
        let limit = self.inner.config.max_manifest_bytes;
        self.call(
            Operation::ResolveDigest,
            t,
            creds,
            deadline,
            move |conn| async move {
                let url = conn.url(&t.host, &t.path("manifests", t.manifest_ref()));
                let accept = ACCEPTED_MEDIA_TYPES.join(", ");
                let head = self
                    .send(&conn, t, site, Method::HEAD, &url, Some(&accept))
                    .await?;
                let head = success(site, head).await?;
                if let Some(d) = header_digest(site, &head)? {
                    return Ok(d);
                }
                let resp = self
                    .send(&conn, t, site, Method::GET, &url, Some(&accept))
                    .await?;
                let (header, body) = self.read_manifest(site, resp, limit).await?;
                verified_digest(site, None, header, &body)
            },
        )
        .await
    }

    /// Fetches a manifest or index by tag or digest: digest-verified, size-limited,
    /// media type checked. Indexes are returned as is (no platform selection).
    pub async fn fetch_manifest(
        &self,
        image: &ImageReference,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Manifest> {
        let t = self.target(image, creds);
        self.fetch_manifest_target(&t, creds, deadline).await
    }

    async fn fetch_manifest_target(
        &self,
        t: &Target,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Manifest> {
        let limit = self.inner.config.max_manifest_bytes;
        let counters = self.inner.stats.for_host(&t.host);
        let site = t.site(Operation::FetchManifest);
        let (bytes, digest) = self
            .call(
                Operation::FetchManifest,
                t,
                creds,
                deadline,
                move |conn| async move {
                    let url = conn.url(&t.host, &t.path("manifests", t.manifest_ref()));
                    let accept = ACCEPTED_MEDIA_TYPES.join(", ");
                    let resp = self
                        .send(&conn, t, site, Method::GET, &url, Some(&accept))
                        .await?;
                    let (header, body) = self.read_manifest(site, resp, limit).await?;
                    let digest = verified_digest(site, t.reference.digest(), header, &body)?;
                    Ok((body, digest))
                },
            )
            .await?;
        counters.bytes(bytes.len());
        manifest::parse(&site, digest, bytes)
    }

    /// A 2xx manifest answer's validated digest header and its body, read under `limit`.
    async fn read_manifest(
        &self,
        site: Site<'_>,
        resp: reqwest::Response,
        limit: usize,
    ) -> Result<(Option<String>, Vec<u8>)> {
        let resp = success(site, resp).await?;
        let header = header_digest(site, &resp)?;
        let body = read_capped(resp, limit, &self.inner.read_budget)
            .await
            .map_err(|e| site.body("manifest", limit, e))?;
        Ok((header, body))
    }

    /// Follows an index (nested up to [`MAX_INDEX_DEPTH`]) to the image manifest for
    /// `platform`. Cycles and over-deep nesting end in `InvalidManifest`.
    pub async fn fetch_platform_manifest(
        &self,
        image: &ImageReference,
        platform: &Platform,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Manifest> {
        let mut t = self.target(image, creds);
        let mut seen: HashSet<String> = HashSet::new();
        for _ in 0..=MAX_INDEX_DEPTH {
            let m = self.fetch_manifest_target(&t, creds, deadline).await?;
            if !m.is_index() {
                return Ok(m);
            }
            seen.insert(m.digest.clone());
            let site = t.site(Operation::FetchManifest);
            let child = m
                .children()
                .into_iter()
                .find(|(_, p)| platform_matches(p.as_ref(), platform))
                .map(|(d, _)| d)
                .ok_or_else(|| {
                    site.invalid_manifest(format!(
                        "index {} has no entry for {}/{}",
                        m.digest, platform.os, platform.architecture
                    ))
                })?;
            site.checked_digest("index entry", &child)?;
            if seen.contains(&child) {
                return Err(
                    site.invalid_manifest(format!("index {} refers to itself (cycle)", m.digest))
                );
            }
            t.reference = sibling(&t.reference, '@', &child)?;
        }
        Err(t
            .site(Operation::FetchManifest)
            .invalid_manifest(format!("index nesting deeper than {MAX_INDEX_DEPTH}")))
    }

    /// Fetches a blob by digest from the repository of `repository`, refusing more than
    /// `max_bytes` while streaming; content is verified against `digest`. Redirects (to a
    /// CDN, say) are followed without credentials when they leave the registry's origin.
    pub async fn fetch_blob(
        &self,
        repository: &ImageReference,
        digest: &str,
        max_bytes: usize,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Vec<u8>> {
        let t = self.target(repository, creds);
        let t = &t;
        let site = t.site(Operation::FetchBlob);
        site.checked_digest("blob descriptor", digest)?;
        let counters = self.inner.stats.for_host(&t.host);
        let data = self
            .call(
                Operation::FetchBlob,
                t,
                creds,
                deadline,
                move |conn| async move {
                    let url = conn.url(&t.host, &t.path("blobs", digest));
                    let resp = self.send(&conn, t, site, Method::GET, &url, None).await?;
                    let resp = success(site, resp).await?;
                    let header = header_digest(site, &resp)?;
                    let body = read_capped(resp, max_bytes, &self.inner.read_budget)
                        .await
                        .map_err(|e| site.body("blob", max_bytes, e))?;
                    verified_digest(site, Some(digest), header, &body)?;
                    Ok(body)
                },
            )
            .await?;
        counters.bytes(data.len());
        Ok(data)
    }

    /// OCI 1.1 referrers of `image_at_digest` as an OCI index (entries filtered by
    /// `artifact_type`, every entry's digest checked). A host whose referrers API answered
    /// 404 (Distribution 2.8, for example) is remembered for [`Config::referrers_api_ttl`]
    /// and asked for the `sha256-<hex>` fallback tag directly; a missing fallback tag means
    /// no referrers.
    pub async fn referrers(
        &self,
        image_at_digest: &ImageReference,
        artifact_type: Option<&str>,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<serde_json::Value> {
        self.referrers_located(image_at_digest, artifact_type, creds, deadline)
            .await
            .map(|r| r.index)
    }

    /// [`Registry::referrers`], and which layout answered: the referrers API, or the
    /// `sha256-<hex>` fallback tag (present or not) where the host has no referrers API.
    pub async fn referrers_located(
        &self,
        image_at_digest: &ImageReference,
        artifact_type: Option<&str>,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Referrers> {
        let t = self.target(image_at_digest, creds);
        let Some(digest) = t.reference.digest().map(str::to_owned) else {
            return Err(Error::InvalidReference {
                image: t.image.clone(),
                registry: t.host.clone(),
                detail: "referrers need a digest reference".into(),
            });
        };
        let index = if self.inner.referrers_api.get(&t.host) == Some(false) {
            None
        } else {
            self.referrers_api(&t, &digest, creds, deadline).await?
        };
        let (mut index, via) = match index {
            Some(index) => (index, ReferrersVia::Api),
            None => {
                let tag = digest.replace(':', "-");
                match self.referrers_by_tag(&t, &tag, creds, deadline).await? {
                    Some(index) => (index, ReferrersVia::FallbackTag { tag, present: true }),
                    None => (
                        referrers::empty_index(),
                        ReferrersVia::FallbackTag {
                            tag,
                            present: false,
                        },
                    ),
                }
            }
        };
        let site = t.site(Operation::Referrers);
        let entries = index
            .get_mut("manifests")
            .and_then(|v| v.as_array_mut())
            .ok_or_else(|| site.invalid_manifest("referrers answer has no manifests array"))?;
        if let Some(want) = artifact_type {
            entries.retain(|e| e.get("artifactType").and_then(|a| a.as_str()) == Some(want));
        }
        for entry in entries.iter() {
            let d = entry
                .get("digest")
                .and_then(|d| d.as_str())
                .ok_or_else(|| site.invalid_manifest("referrers entry without a digest"))?;
            site.checked_digest("referrers entry", d)?;
        }
        Ok(Referrers { index, via })
    }

    /// The referrers API answer; `None` when the host has no referrers API (404).
    async fn referrers_api(
        &self,
        t: &Target,
        digest: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Option<serde_json::Value>> {
        let limit = self.inner.config.max_manifest_bytes;
        let site = t.site(Operation::Referrers);
        let res = self
            .call(
                Operation::Referrers,
                t,
                creds,
                deadline,
                move |conn| async move {
                    let url = conn.url(&t.host, &t.path("referrers", digest));
                    let resp = self
                        .send(&conn, t, site, Method::GET, &url, Some(manifest::OCI_INDEX))
                        .await?;
                    let resp = success(site, resp).await?;
                    read_capped(resp, limit, &self.inner.read_budget)
                        .await
                        .map_err(|e| site.body("referrers index", limit, e))
                },
            )
            .await;
        let body = match res {
            Ok(body) => body,
            Err(Error::NotFound { .. }) => {
                tracing::debug!(registry = %t.host, "no referrers API");
                self.inner.referrers_api.set(&t.host, false);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        self.inner.referrers_api.set(&t.host, true);
        self.inner.stats.for_host(&t.host).bytes(body.len());
        let index = manifest::parse_json(&site, "referrers answer", &body)?;
        Ok(Some(index))
    }

    /// All tags of `repo`, following pagination, collected (at most
    /// [`Config::max_pages`] × [`Config::page_size`] valid tags). Long listings from a
    /// registry that is not trusted are read page by page with [`Registry::tag_pages`].
    pub async fn list_tags(
        &self,
        repo: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Vec<String>> {
        self.tag_pages(repo, creds)?.collect(deadline).await
    }

    /// All repositories of `registry` (`host[:port]`), following pagination, collected (see
    /// [`Registry::list_tags`]; [`Registry::catalog_pages`] reads page by page).
    pub async fn catalog(
        &self,
        registry: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Vec<String>> {
        self.catalog_pages(registry, creds)?.collect(deadline).await
    }

    /// The tags of `repo`, page by page (names checked against the tag grammar).
    pub fn tag_pages(&self, repo: &str, creds: &Credentials) -> Result<Listing> {
        let t = self.target(&parse_reference(repo)?, creds);
        let path = format!("{}/tags/list", t.reference.repository());
        Ok(self.listing(t, Operation::ListTags, path, NameKind::Tag, creds))
    }

    /// The repositories of `registry` (`host[:port]`), page by page (names checked against
    /// the repository grammar). Bearer-token registries need `registry:catalog:*` scope,
    /// which is not requested.
    pub fn catalog_pages(&self, registry: &str, creds: &Credentials) -> Result<Listing> {
        // Addressed through a reference; only its registry is used.
        let t = self.target(&parse_reference(&format!("{registry}/catalog"))?, creds);
        Ok(self.listing(
            t,
            Operation::Catalog,
            "_catalog".to_owned(),
            NameKind::Repository,
            creds,
        ))
    }

    fn listing(
        &self,
        t: Target,
        op: Operation,
        path: String,
        kind: NameKind,
        creds: &Credentials,
    ) -> Listing {
        Listing {
            registry: self.clone(),
            t,
            op,
            path,
            kind,
            creds: creds.clone(),
            last: None,
            pages: 0,
            done: false,
        }
    }

    /// One page of a listing, `path?n=…&last=…`, and whether its `Link` names a next page.
    #[allow(clippy::too_many_arguments)]
    async fn page(
        &self,
        t: &Target,
        op: Operation,
        path: &str,
        kind: NameKind,
        last: Option<&str>,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<(Page, bool)> {
        let limit = self.inner.config.max_manifest_bytes;
        let n = self.inner.config.page_size;
        let site = t.site(op);
        let (body, link_next) = self
            .call(op, t, creds, deadline, move |conn| async move {
                let mut url = reqwest::Url::parse(&conn.url(&t.host, path))
                    .map_err(|e| site.rejected(None, format!("bad URL: {e}")))?;
                url.query_pairs_mut().append_pair("n", &n.to_string());
                if let Some(l) = last {
                    url.query_pairs_mut().append_pair("last", l);
                }
                let resp = self
                    .send(&conn, t, site, Method::GET, url.as_str(), None)
                    .await?;
                let resp = success(site, resp).await?;
                let links: Vec<&[u8]> = resp
                    .headers()
                    .get_all(reqwest::header::LINK)
                    .iter()
                    .map(|v| v.as_bytes())
                    .collect();
                let link_next = listing::next_page_link(&links, &url).is_some();
                let body = read_capped(resp, limit, &self.inner.read_budget)
                    .await
                    .map_err(|e| site.body("listing page", limit, e))?;
                Ok((body, link_next))
            })
            .await?;
        let page = listing::parse_page(&body, kind, &t.host, last, n)
            .map_err(|e| site.rejected(Some(200), e.to_string()))?;
        Ok((page, link_next))
    }

    /// Per-registry counters, sorted by host.
    pub fn stats(&self) -> Vec<RegistryStats> {
        self.inner.stats.snapshot()
    }

    // --- internals ---

    /// Where `reference` is fetched from (its registry, or that registry's mirror) and with
    /// which auth. The reference was parsed by the caller, once: nothing here parses it again.
    fn target(&self, reference: &ImageReference, creds: &Credentials) -> Target {
        let registry = reference.registry();
        let host = self
            .inner
            .config
            .mirrors
            .get(registry)
            .map_or(registry, String::as_str)
            .to_owned();
        let auth = registry_auth(&host, creds, &self.inner.global);
        Target {
            reference: reference.clone(),
            image: reference.original().to_owned(),
            host,
            auth,
        }
    }
}

/// A registry listing read one page at a time (from [`Registry::tag_pages`] or
/// [`Registry::catalog_pages`]): each page holds at most [`Config::page_size`] valid names,
/// all greater than the previous page's, so pages never repeat a name and only one page is
/// held at a time. The next page is asked for with `n` and `last` (ivory's own URL) while
/// the registry's `Link` names one on the same origin and path, the page was cut (the
/// registry sent more than `n`), or it was exactly full; it ends on a page with nothing new,
/// and after [`Config::max_pages`] pages with an error.
pub struct Listing {
    registry: Registry,
    t: Target,
    op: Operation,
    path: String,
    kind: NameKind,
    creds: Credentials,
    last: Option<String>,
    pages: usize,
    done: bool,
}

impl std::fmt::Debug for Listing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listing")
            .field("image", &self.t.image)
            .field("pages", &self.pages)
            .finish_non_exhaustive()
    }
}

impl Listing {
    /// The next page, read by `deadline` (one budget per page: the caller may take its time
    /// between pages); `None` once the listing has ended. After an error the listing ends.
    pub async fn next_page(&mut self, deadline: Instant) -> Result<Option<Page>> {
        if self.done {
            return Ok(None);
        }
        let config = &self.registry.inner.config;
        if self.pages >= config.max_pages {
            self.done = true;
            return Err(self.t.site(self.op).rejected(
                None,
                format!("listing did not end after {} pages", config.max_pages),
            ));
        }
        self.pages += 1;
        let n = config.page_size;
        let answer = self
            .registry
            .page(
                &self.t,
                self.op,
                &self.path,
                self.kind,
                self.last.as_deref(),
                &self.creds,
                deadline,
            )
            .await;
        let (page, link_next) = match answer {
            Ok(a) => a,
            Err(e) => {
                self.done = true;
                return Err(e);
            }
        };
        // No Link and an over-full page that was not cut: the registry ignored `n` and sent
        // everything.
        let more = link_next || page.cut > 0 || page.entries == n;
        if page.names.is_empty() || !more {
            self.done = true;
        }
        if let Some(max) = page.names.last() {
            self.last = Some(max.clone());
        }
        Ok(Some(page))
    }

    /// Every remaining valid name, in order, all read by `deadline`.
    pub async fn collect(mut self, deadline: Instant) -> Result<Vec<String>> {
        let mut all = Vec::new();
        while let Some(page) = self.next_page(deadline).await? {
            all.extend(page.names);
        }
        Ok(all)
    }
}

fn parse_ca_bundle(pem: &[u8]) -> Result<Vec<Vec<u8>>> {
    let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(pem)
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Config {
            detail: format!("registry CA bundle is not valid PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(Error::Config {
            detail: "registry CA bundle contains no certificate".into(),
        });
    }
    Ok(certs)
}

/// The answer if it is 2xx; otherwise an error by status, the body's start logged only.
async fn success(site: Site<'_>, resp: reqwest::Response) -> Result<reqwest::Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let snippet = error_snippet(resp).await;
    Err(site.by_status(status.as_u16(), &snippet))
}

/// `Docker-Content-Digest`, if present, checked for form.
fn header_digest(site: Site<'_>, resp: &reqwest::Response) -> Result<Option<String>> {
    let Some(value) = resp.headers().get(DIGEST_HEADER) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("<not text>");
    site.checked_digest(DIGEST_HEADER, text)?;
    Ok(Some(text.to_owned()))
}

/// The digest of `body`: it must hash to `expected` (the digest that addressed it) and to
/// `header` (what the registry claims), each with its own algorithm.
fn verified_digest(
    site: Site<'_>,
    expected: Option<&str>,
    header: Option<String>,
    body: &[u8],
) -> Result<String> {
    for claimed in expected.into_iter().chain(header.as_deref()) {
        let actual = digest::of(claimed, body);
        if actual != claimed {
            return Err(site.digest_mismatch(claimed, &actual));
        }
    }
    Ok(expected
        .map(str::to_owned)
        .or(header)
        .unwrap_or_else(|| digest::sha256(body)))
}

fn platform_matches(p: Option<&serde_json::Value>, want: &Platform) -> bool {
    let Some(p) = p else { return false };
    let field = |k: &str| p.get(k).and_then(|v| v.as_str());
    field("os") == Some(want.os.as_str())
        && field("architecture") == Some(want.architecture.as_str())
        && want
            .variant
            .as_deref()
            .is_none_or(|v| field("variant") == Some(v))
}
