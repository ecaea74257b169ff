//! `Registry`: the deadline-, limit- and retry-aware wrapper around oci-client.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::token_cache::RegistryTokenType;
use oci_client::{Client, Reference, RegistryOperation};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout_at};

use crate::auth::{Credentials, registry_auth};
use crate::config::Config;
use crate::error::{Error, Result, Site};
use crate::manifest::{self, ACCEPTED_MEDIA_TYPES, Manifest};
use crate::stats::{Counters, RegistryStats, StatsTable};

/// First retry delay after a 429/503; doubles per attempt.
const RETRY_BASE: Duration = Duration::from_millis(100);
/// Longest single retry delay.
const RETRY_CAP: Duration = Duration::from_secs(2);
/// Attempts per call, whatever the deadline.
const MAX_ATTEMPTS: u32 = 8;
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

struct Inner {
    config: Config,
    user_agent: &'static str,
    global: Credentials,
    roots: Vec<Vec<u8>>,
    clients: moka::sync::Cache<ClientKey, Client>,
    gates: Mutex<HashMap<String, Arc<Semaphore>>>,
    plain_http: Mutex<HashSet<String>>,
    /// Hosts whose `/v2/` answered without a Bearer challenge (true) or with one (false).
    /// Forgotten on 401 so a host that starts challenging is probed again.
    no_bearer_hosts: Mutex<HashMap<String, bool>>,
    stats: StatsTable,
}

/// One oci-client per credential set: oci-client keeps the first auth it sees per
/// registry (oras-project/rust-oci-client#221), so clients must never be shared across creds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ClientKey {
    host: String,
    auth: AuthKey,
    insecure: bool,
    plain_http: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum AuthKey {
    Anonymous,
    Basic(String, String),
    Bearer(String),
}

impl From<&RegistryAuth> for AuthKey {
    fn from(a: &RegistryAuth) -> Self {
        match a {
            RegistryAuth::Anonymous => AuthKey::Anonymous,
            RegistryAuth::Basic(u, p) => AuthKey::Basic(u.clone(), p.clone()),
            RegistryAuth::Bearer(t) => AuthKey::Bearer(t.clone()),
        }
    }
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
        // Building one client now surfaces a bad CA bundle at startup, not on first use.
        Client::try_from(client_config(&roots, false, false, &config, user_agent)).map_err(
            |e| Error::Config {
                detail: format!("registry CA bundle rejected: {e}"),
            },
        )?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                user_agent,
                global,
                roots,
                clients: moka::sync::Cache::builder()
                    .max_capacity(MAX_CLIENTS)
                    .time_to_idle(CLIENT_IDLE)
                    .build(),
                gates: Mutex::default(),
                plain_http: Mutex::default(),
                no_bearer_hosts: Mutex::default(),
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

    /// OCI 1.1 referrers of `image_at_digest` as an OCI index, with oci-client's fallback
    /// to the `sha256-<hex>` tag schema when the API answers 404.
    ///
    /// Caveat (oci-client 0.18): in the fallback, a 4xx with an error envelope on the tag
    /// (403, 429 with body) reads as "no referrers" (empty index).
    pub async fn referrers(
        &self,
        image_at_digest: &str,
        artifact_type: Option<&str>,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<serde_json::Value> {
        let t = self.target(image_at_digest, creds)?;
        if t.reference.digest().is_none() {
            return Err(Error::InvalidReference {
                image: t.image.clone(),
                registry: t.host.clone(),
                detail: "referrers need a digest reference".into(),
            });
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

    /// All repositories of `registry` (host[:port]), following pagination. Bearer-token
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
        let reference: Reference = image.parse().map_err(|e| Error::InvalidReference {
            image: image.to_string(),
            registry: String::new(),
            detail: format!("{e}"),
        })?;
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

    /// Runs `f` under the host's concurrency cap and the deadline, retrying 429/503 while
    /// the deadline allows, and falling back to plain HTTP for insecure credentials.
    async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        t: &Target,
        creds: &Credentials,
        deadline: Instant,
        f: F,
    ) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let budget = deadline.saturating_duration_since(Instant::now());
        let counters = self.inner.stats.for_host(&t.host);
        let gate = self.gate(&t.host);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let plain = self.is_plain_http(&t.host, creds);
            let client = self.client(t, creds.allow_insecure, plain)?;
            let res = self
                .attempt(
                    op,
                    t,
                    deadline,
                    budget,
                    &counters,
                    &gate,
                    &client,
                    f(client.clone()),
                )
                .await;
            let err = match res {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if creds.allow_insecure && !plain && matches!(err, Error::Transport { .. }) {
                // Kyverno's allowInsecureRegistry: TLS failed, so try plain HTTP once.
                self.mark_plain_http(&t.host);
                continue;
            }
            let Some(status) = err.retry_status() else {
                if matches!(err, Error::Unauthorized { .. }) {
                    // The host may have started challenging; probe again next time.
                    self.set_open(&t.host, None);
                }
                counters.error();
                return Err(err);
            };
            counters.throttled();
            let delay = backoff(attempts);
            if attempts < MAX_ATTEMPTS && Instant::now() + delay < deadline {
                tracing::debug!(registry = %t.host, image = %t.image, status, attempts, ?delay, "retrying");
                tokio::time::sleep(delay).await;
                continue;
            }
            counters.error();
            return Err(Error::Throttled {
                image: t.image.clone(),
                registry: t.host.clone(),
                status,
                attempts,
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn attempt<T>(
        &self,
        op: &'static str,
        t: &Target,
        deadline: Instant,
        budget: Duration,
        counters: &Counters,
        gate: &Arc<Semaphore>,
        client: &Client,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        // Errors are counted once, by `call`.
        let deadline_err = || t.site().deadline(op, budget);
        let _permit = match timeout_at(deadline, gate.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => {
                return Err(Error::Config {
                    detail: "registry concurrency gate closed".into(),
                });
            }
            Err(_) => return Err(deadline_err()),
        };
        // The permit can arrive exactly at the deadline; do not start a doomed request.
        if Instant::now() >= deadline {
            return Err(deadline_err());
        }
        if self
            .skip_ping(client, t, deadline, counters)
            .await
            .is_none()
        {
            return Err(deadline_err());
        }
        counters.request();
        let started = Instant::now();
        let res = timeout_at(deadline, fut).await;
        counters.latency(started.elapsed());
        match res {
            Ok(r) => r,
            Err(_) => Err(deadline_err()),
        }
    }

    /// oci-client pings `/v2/` before every request for which it cached no token, and it
    /// caches none for anonymous access or for hosts that do not challenge. Probe each host
    /// once (through oci-client's own auth flow); for hosts without a Bearer challenge, seed
    /// the token cache with the Basic login (empty when anonymous), which open registries
    /// ignore and Basic-challenging ones check as they would after a ping.
    /// `None` when the deadline passed during the probe.
    async fn skip_ping(
        &self,
        client: &Client,
        t: &Target,
        deadline: Instant,
        counters: &Counters,
    ) -> Option<()> {
        let login = match &t.auth {
            RegistryAuth::Anonymous => (String::new(), String::new()),
            RegistryAuth::Basic(u, p) => (u.clone(), p.clone()),
            RegistryAuth::Bearer(_) => return Some(()),
        };
        let open = match self.open_state(&t.host) {
            Some(open) => open,
            None => {
                counters.request();
                let probe = client.auth(&t.reference, &t.auth, RegistryOperation::Pull);
                match timeout_at(deadline, probe).await {
                    Ok(Ok(None)) => {
                        self.set_open(&t.host, Some(true));
                        true
                    }
                    Ok(Ok(Some(_))) => {
                        self.set_open(&t.host, Some(false));
                        false
                    }
                    // Failures surface from the real request that follows.
                    Ok(Err(_)) => false,
                    Err(_) => return None,
                }
            }
        };
        if open {
            client
                .tokens
                .insert(
                    &t.reference,
                    RegistryOperation::Pull,
                    RegistryTokenType::Basic(login.0, login.1),
                )
                .await;
        }
        Some(())
    }

    fn open_state(&self, host: &str) -> Option<bool> {
        let hosts = self
            .inner
            .no_bearer_hosts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        hosts.get(host).copied()
    }

    fn set_open(&self, host: &str, open: Option<bool>) {
        let mut hosts = self
            .inner
            .no_bearer_hosts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match open {
            Some(o) => hosts.insert(host.to_string(), o),
            None => hosts.remove(host),
        };
    }

    fn gate(&self, host: &str) -> Arc<Semaphore> {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates
            .entry(host.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.inner.config.per_registry_concurrency)))
            .clone()
    }

    fn is_plain_http(&self, host: &str, creds: &Credentials) -> bool {
        creds.allow_insecure
            && self
                .inner
                .plain_http
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(host)
    }

    fn mark_plain_http(&self, host: &str) {
        self.inner
            .plain_http
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(host.to_string());
    }

    fn client(&self, t: &Target, insecure: bool, plain_http: bool) -> Result<Client> {
        let key = ClientKey {
            host: t.host.clone(),
            auth: AuthKey::from(&t.auth),
            insecure,
            plain_http,
        };
        if let Some(c) = self.inner.clients.get(&key) {
            return Ok(c);
        }
        let config = client_config(
            &self.inner.roots,
            insecure,
            plain_http,
            &self.inner.config,
            self.inner.user_agent,
        );
        let client = Client::try_from(config).map_err(|e| Error::Config {
            detail: format!("building registry client for {}: {e}", t.host),
        })?;
        self.inner.clients.insert(key, client.clone());
        Ok(client)
    }
}

fn client_config(
    roots: &[Vec<u8>],
    insecure: bool,
    plain_http: bool,
    config: &Config,
    user_agent: &'static str,
) -> ClientConfig {
    ClientConfig {
        protocol: if plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        accept_invalid_certificates: insecure,
        extra_root_certificates: roots
            .iter()
            .map(|der| Certificate {
                encoding: CertificateEncoding::Der,
                data: der.clone(),
            })
            .collect(),
        // We pick platforms ourselves (fetch_platform_manifest).
        platform_resolver: None,
        connect_timeout: Some(config.connect_timeout),
        user_agent,
        ..ClientConfig::default()
    }
}

fn backoff(attempt: u32) -> Duration {
    let factor = 1u32 << attempt.saturating_sub(1).min(10);
    RETRY_BASE.saturating_mul(factor).min(RETRY_CAP)
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

/// Collects a blob in memory and fails the stream once it passes the limit.
struct LimitedWriter {
    buf: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl LimitedWriter {
    fn new(limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            limit,
            exceeded: false,
        }
    }
}

impl tokio::io::AsyncWrite for LimitedWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.buf.len().saturating_add(data.len()) > self.limit {
            self.exceeded = true;
            return Poll::Ready(Err(std::io::Error::other("blob size limit exceeded")));
        }
        self.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(5), Duration::from_millis(1600));
        assert_eq!(backoff(6), RETRY_CAP);
        assert_eq!(backoff(40), RETRY_CAP);
    }

    #[test]
    fn ca_bundle_must_hold_a_certificate() {
        assert!(matches!(
            parse_ca_bundle(b"hello"),
            Err(Error::Config { .. })
        ));
        assert!(
            Registry::new(Config {
                ca_bundle_pem: Some(b"".to_vec()),
                ..Config::default()
            })
            .is_err()
        );
    }

    #[test]
    fn zero_concurrency_is_refused() {
        let err = Registry::new(Config {
            per_registry_concurrency: 0,
            ..Config::default()
        })
        .err()
        .unwrap();
        assert!(err.to_string().contains("per_registry_concurrency"));
    }

    #[test]
    fn platform_matching_honours_variant() {
        let p = serde_json::json!({"os":"linux","architecture":"arm64","variant":"v8"});
        let mut want = Platform {
            os: "linux".into(),
            architecture: "arm64".into(),
            variant: None,
        };
        assert!(platform_matches(Some(&p), &want));
        want.variant = Some("v7".into());
        assert!(!platform_matches(Some(&p), &want));
        assert!(!platform_matches(None, &want));
    }

    #[tokio::test]
    async fn digest_refs_and_bad_input_need_no_network() {
        let r = Registry::new(Config::default()).unwrap();
        let c = Credentials::anonymous();
        let d = format!("sha256:{}", "a".repeat(64));
        let deadline = Instant::now() + Duration::from_secs(1);
        let got = r
            .resolve_digest(&format!("unreachable.invalid/x@{d}"), &c, deadline)
            .await
            .unwrap();
        assert_eq!(got, d);
        let err = r
            .resolve_digest("UPPER/Case::", &c, deadline)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidReference { .. }), "{err}");
        let err = r
            .fetch_blob("unreachable.invalid/x", "md5:abc", 10, &c, deadline)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidReference { .. }), "{err}");
        let err = r
            .referrers("unreachable.invalid/x:tag", None, &c, deadline)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("need a digest"), "{err}");
        assert!(r.stats().is_empty());
    }

    #[tokio::test]
    async fn limited_writer_stops_at_limit() {
        use tokio::io::AsyncWriteExt;
        let mut w = LimitedWriter::new(4);
        w.write_all(b"abc").await.unwrap();
        assert!(w.write_all(b"de").await.is_err());
        assert!(w.exceeded);
    }
}
