//! `Registry`: the deadline-, limit- and retry-aware wrapper around oci-client.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::reference::parse_reference;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::auth::{Credentials, registry_auth};
use crate::config::Config;
use crate::error::{Error, Result, Site};
use crate::manifest::{self, ACCEPTED_MEDIA_TYPES, Manifest};
use crate::stats::{RegistryStats, StatsTable};

use limit::LimitedWriter;
use referrers::{ReferrersApi, raw_client};
use transport::ClientKey;

mod limit;
mod referrers;
#[cfg(test)]
mod tests;
mod transport;

/// Index-in-index nesting we follow before calling the manifest unsound.
pub const MAX_INDEX_DEPTH: usize = 4;
/// Clients kept (one per registry host × credential set × scheme).
const MAX_CLIENTS: u64 = 1024;
/// An idle client (and its pooled connections and tokens) is dropped after this.
const CLIENT_IDLE: Duration = Duration::from_secs(30 * 60);

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
    clients: moka::future::Cache<ClientKey, Client>,
    /// Plain reqwest clients (verifying TLS, accepting any certificate) for the one request
    /// oci-client cannot make observably: the referrers API probe.
    raw_secure: reqwest::Client,
    raw_insecure: tokio::sync::OnceCell<reqwest::Client>,
    gates: Mutex<HashMap<String, Arc<Semaphore>>>,
    plain_http: Mutex<HashSet<String>>,
    /// Hosts whose `/v2/` answered without a Bearer challenge (true) or with one (false).
    /// Forgotten on 401 so a host that starts challenging is probed again.
    probes: moka::future::Cache<String, bool>,
    /// Per host: does `/v2/<repo>/referrers/<digest>` exist (learnt, with a TTL)?
    referrers_api: ReferrersApi,
    stats: StatsTable,
}

/// What one call needs: parsed reference, where errors point, and the auth to use.
struct Target {
    reference: Reference,
    image: String,
    host: String,
    auth: RegistryAuth,
}

impl Target {
    fn site(&self) -> Site<'_> {
        Site {
            image: &self.image,
            registry: &self.host,
        }
    }
}

// === impl Registry ===

impl Registry {
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
        if config.per_registry_concurrency == 0 {
            return Err(Error::Config {
                detail: "per_registry_concurrency must be at least 1".into(),
            });
        }
        // oci-client wants a 'static user agent; one small leak per Registry.
        let user_agent: &'static str = Box::leak(config.user_agent.clone().into_boxed_str());
        // Building the probe client now surfaces a bad CA bundle at startup, not on first use.
        let raw_secure =
            raw_client(&roots, false, &config, user_agent).map_err(|e| Error::Config {
                detail: format!("registry CA bundle rejected: {e}"),
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                referrers_api: ReferrersApi::new(config.referrers_api_ttl),
                config,
                user_agent,
                global,
                roots: Arc::new(roots),
                clients: moka::future::Cache::builder()
                    .max_capacity(MAX_CLIENTS)
                    .time_to_idle(CLIENT_IDLE)
                    .build(),
                raw_secure,
                raw_insecure: tokio::sync::OnceCell::new(),
                gates: Mutex::default(),
                plain_http: Mutex::default(),
                probes: moka::future::Cache::builder()
                    .max_capacity(MAX_CLIENTS)
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
    /// A reference that already carries a digest is answered without network.
    pub async fn resolve_digest(
        &self,
        image: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<String> {
        let t = self.target(image, creds)?;
        if let Some(d) = t.reference.digest() {
            return Ok(d.to_string());
        }
        let t = &t;
        self.call(
            "resolve_digest",
            t,
            creds,
            deadline,
            move |client| async move {
                client
                    .fetch_manifest_digest(&t.reference, &t.auth)
                    .await
                    .map_err(|e| t.site().classify(e))
            },
        )
        .await
    }

    /// Fetches a manifest or index by tag or digest: digest-verified, size-limited,
    /// media type checked. Indexes are returned as is (no platform selection).
    pub async fn fetch_manifest(
        &self,
        image: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Manifest> {
        let t = self.target(image, creds)?;
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
        let (bytes, digest) = self
            .call(
                "fetch_manifest",
                t,
                creds,
                deadline,
                move |client| async move {
                    client
                        .pull_manifest_raw(&t.reference, &t.auth, ACCEPTED_MEDIA_TYPES)
                        .await
                        .map_err(|e| t.site().classify(e))
                },
            )
            .await?;
        counters.bytes(bytes.len());
        // oci-client buffers the body before we can see it; the deadline bounds that read.
        if bytes.len() > limit {
            return Err(t.site().too_large("manifest", limit));
        }
        manifest::parse(&t.site(), digest, Vec::from(bytes))
    }

    /// Follows an index (nested up to [`MAX_INDEX_DEPTH`]) to the image manifest for
    /// `platform`. Cycles and over-deep nesting end in `InvalidManifest`.
    pub async fn fetch_platform_manifest(
        &self,
        image: &str,
        platform: &Platform,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Manifest> {
        let mut t = self.target(image, creds)?;
        let mut seen: HashSet<String> = HashSet::new();
        for _ in 0..=MAX_INDEX_DEPTH {
            let m = self.fetch_manifest_target(&t, creds, deadline).await?;
            if !m.is_index() {
                return Ok(m);
            }
            seen.insert(m.digest.clone());
            let child = m
                .children()
                .into_iter()
                .find(|(_, p)| platform_matches(p.as_ref(), platform))
                .map(|(d, _)| d)
                .ok_or_else(|| {
                    t.site().invalid_manifest(format!(
                        "index {} has no entry for {}/{}",
                        m.digest, platform.os, platform.architecture
                    ))
                })?;
            if seen.contains(&child) {
                return Err(t
                    .site()
                    .invalid_manifest(format!("index {} refers to itself (cycle)", m.digest)));
            }
            t.reference = t.reference.clone_with_digest(child);
        }
        Err(t
            .site()
            .invalid_manifest(format!("index nesting deeper than {MAX_INDEX_DEPTH}")))
    }

    /// Fetches a blob by digest from the repository of `repo_ref`, refusing more than
    /// `max_bytes` while streaming; content is verified against `digest`.
    pub async fn fetch_blob(
        &self,
        repo_ref: &str,
        digest: &str,
        max_bytes: usize,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Vec<u8>> {
        let t = self.target(repo_ref, creds)?;
        check_digest(&t, digest)?;
        let t = &t;
        let counters = self.inner.stats.for_host(&t.host);
        let data = self
            .call("fetch_blob", t, creds, deadline, move |client| async move {
                let mut out = LimitedWriter::new(max_bytes);
                let res = client.pull_blob(&t.reference, digest, &mut out).await;
                match res {
                    Ok(()) => Ok(out.buf),
                    Err(_) if out.exceeded => Err(t.site().too_large("blob", max_bytes)),
                    Err(e) => Err(t.site().classify(e)),
                }
            })
            .await?;
        counters.bytes(data.len());
        Ok(data)
    }

    /// OCI 1.1 referrers of `image_at_digest` as an OCI index. A host whose referrers API
    /// answered 404 (Distribution 2.8, for example) is remembered for
    /// [`Config::referrers_api_ttl`] and asked for the `sha256-<hex>` fallback tag directly;
    /// a missing fallback tag means no referrers.
    pub async fn referrers(
        &self,
        image_at_digest: &str,
        artifact_type: Option<&str>,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<serde_json::Value> {
        let t = self.target(image_at_digest, creds)?;
        let Some(digest) = t.reference.digest().map(str::to_owned) else {
            return Err(Error::InvalidReference {
                image: t.image.clone(),
                registry: t.host.clone(),
                detail: "referrers need a digest reference".into(),
            });
        };
        let api = match self.inner.referrers_api.get(&t.host) {
            Some(known) => Some(known),
            None => {
                self.probe_referrers_api(&t, &digest, creds, deadline)
                    .await?
            }
        };
        if api == Some(false) {
            return self
                .referrers_by_tag(&t, &digest, artifact_type, creds, deadline)
                .await;
        }
        let t = &t;
        let index = self
            .call("referrers", t, creds, deadline, move |client| async move {
                // pull_referrers takes no auth argument: it uses the client's stored one.
                client
                    .store_auth_if_needed(t.reference.resolve_registry(), &t.auth)
                    .await;
                client
                    .pull_referrers(&t.reference, artifact_type)
                    .await
                    .map_err(|e| t.site().classify(e))
            })
            .await?;
        serde_json::to_value(&index).map_err(|e| t.site().invalid_manifest(e.to_string()))
    }

    /// All tags of `repo`, following `n`/`last` pagination.
    pub async fn list_tags(
        &self,
        repo: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Vec<String>> {
        let t = self.target(repo, creds)?;
        let n = self.inner.config.page_size;
        self.paginate(&t, |last| {
            let t = &t;
            async move {
                self.call("list_tags", t, creds, deadline, move |client| {
                    let last = last.clone();
                    async move {
                        client
                            .list_tags(&t.reference, &t.auth, Some(n), last.as_deref())
                            .await
                            .map(|r| r.tags)
                            .map_err(|e| t.site().classify(e))
                    }
                })
                .await
            }
        })
        .await
    }

    /// All repositories of `registry` (`host[:port]`), following pagination. Bearer-token
    /// registries need `registry:catalog:*` scope, which oci-client does not request.
    pub async fn catalog(
        &self,
        registry: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Vec<String>> {
        // oci-client addresses the catalog through a reference; only its registry is used.
        let t = self.target(&format!("{registry}/catalog"), creds)?;
        let n = self.inner.config.page_size;
        self.paginate(&t, |last| {
            let t = &t;
            async move {
                self.call("catalog", t, creds, deadline, move |client| {
                    let last = last.clone();
                    async move {
                        client
                            .catalog(&t.reference, &t.auth, Some(n), last.as_deref())
                            .await
                            .map(|r| r.repositories)
                            .map_err(|e| t.site().classify(e))
                    }
                })
                .await
            }
        })
        .await
    }

    /// Per-registry counters, sorted by host.
    pub fn stats(&self) -> Vec<RegistryStats> {
        self.inner.stats.snapshot()
    }

    // --- internals ---

    fn target(&self, image: &str, creds: &Credentials) -> Result<Target> {
        let reference = parse_reference(image)?;
        let host = reference.resolve_registry().to_string();
        let auth = registry_auth(&host, creds, &self.inner.global);
        Ok(Target {
            reference,
            image: image.to_string(),
            host,
            auth,
        })
    }

    /// Collects pages until one is short, empty, or adds nothing new.
    async fn paginate<F, Fut>(&self, t: &Target, mut page: F) -> Result<Vec<String>>
    where
        F: FnMut(Option<String>) -> Fut,
        Fut: Future<Output = Result<Vec<String>>>,
    {
        let n = self.inner.config.page_size;
        let mut all: Vec<String> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut last: Option<String> = None;
        for _ in 0..self.inner.config.max_pages {
            let items = page(last.clone()).await?;
            let count = items.len();
            let mut added = 0;
            for item in items {
                if seen.insert(item.clone()) {
                    all.push(item);
                    added += 1;
                }
            }
            // A registry that ignores `n` or `last` returns everything or repeats itself.
            if count < n || added == 0 || count > n {
                // Distribution 2.8 returns tags unsorted; callers get a stable order.
                all.sort();
                return Ok(all);
            }
            last = all.last().cloned();
        }
        Err(t.site().rejected(
            None,
            format!(
                "listing did not end after {} pages",
                self.inner.config.max_pages
            ),
        ))
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

fn check_digest(t: &Target, digest: &str) -> Result<()> {
    let ok = match digest.split_once(':') {
        Some(("sha256", hex)) => hex.len() == 64,
        Some(("sha512", hex)) => hex.len() == 128,
        _ => false,
    } && digest.split_once(':').is_some_and(|(_, h)| {
        h.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidReference {
            image: format!("{}@{digest}", t.image),
            registry: t.host.clone(),
            detail: "blob digest must be sha256:<64 hex> or sha512:<128 hex>".into(),
        })
    }
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
