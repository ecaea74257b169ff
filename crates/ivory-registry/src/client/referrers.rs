//! The referrers floor: learn per host whether `/v2/<repo>/referrers/<digest>` exists, and
//! read the `sha256-<hex>` fallback tag directly where it does not.
//!
//! oci-client's `pull_referrers` hides the 404 that tells "no referrers API" from "no
//! referrers" (it silently falls back to the tag), so the first call per host (and TTL) asks
//! the API itself with a plain, unauthenticated GET: Distribution routes unknown paths to 404
//! before any auth check, while a registry with the API answers 200 or a 401 challenge.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use oci_client::Reference;
use reqwest::StatusCode;
use tokio::time::{Instant, timeout_at};

use super::{Registry, Target};
use crate::auth::Credentials;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::manifest::OCI_INDEX;
use crate::stats::StatusClass;

/// Per host: referrers API present (true) or absent (false), until the instant.
pub(super) struct ReferrersApi {
    ttl: Duration,
    hosts: Mutex<HashMap<String, (bool, Instant)>>,
}

impl ReferrersApi {
    pub(super) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            hosts: Mutex::default(),
        }
    }

    /// What is known about `host`; `None` when never learnt or expired.
    pub(super) fn get(&self, host: &str) -> Option<bool> {
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        hosts
            .get(host)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(present, _)| *present)
    }

    fn set(&self, host: &str, present: bool) {
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        hosts.insert(host.to_string(), (present, Instant::now() + self.ttl));
    }
}

/// A plain reqwest client with the same trust and timeouts as the oci-client ones.
pub(super) fn raw_client(
    roots: &[Vec<u8>],
    insecure: bool,
    config: &Config,
    user_agent: &'static str,
) -> std::result::Result<reqwest::Client, reqwest::Error> {
    let certs = crate::roots::trust_anchors(roots)
        .map(reqwest::Certificate::from_der)
        .collect::<std::result::Result<Vec<_>, _>>()?;
    reqwest::Client::builder()
        .danger_accept_invalid_certs(insecure)
        .tls_certs_only(certs)
        .connect_timeout(config.connect_timeout)
        .user_agent(user_agent)
        .build()
}

// === impl Registry ===

impl Registry {
    /// Asks `t`'s host whether it has the referrers API and remembers the answer.
    /// `Ok(None)` when the host did not answer usably (oci-client's path decides then).
    pub(super) async fn probe_referrers_api(
        &self,
        t: &Target,
        digest: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Option<bool>> {
        let budget = deadline.saturating_duration_since(Instant::now());
        let deadline_err = || t.site().deadline("referrers", budget);
        let counters = self.inner.stats.for_host(&t.host);
        let Some(client) = self.raw_client_for(creds.allow_insecure, deadline).await else {
            counters.error();
            return Err(deadline_err());
        };
        let scheme = if self.is_plain_http(&t.host, creds) {
            "http"
        } else {
            "https"
        };
        let url = format!(
            "{scheme}://{}/v2/{}/referrers/{digest}",
            t.host,
            t.reference.repository()
        );
        let gate = self.gate(&t.host);
        let Ok(Ok(_permit)) = timeout_at(deadline, gate.acquire_owned()).await else {
            counters.error();
            return Err(deadline_err());
        };
        counters.request();
        let started = Instant::now();
        let res = timeout_at(
            deadline,
            client.get(&url).header("Accept", OCI_INDEX).send(),
        )
        .await;
        counters.latency(started.elapsed());
        match res {
            Ok(Ok(resp)) => {
                let status = resp.status();
                counters.status(StatusClass::of_code(status.as_u16()));
                let present = status != StatusCode::NOT_FOUND;
                tracing::debug!(registry = %t.host, %status, present, "referrers API probed");
                self.inner.referrers_api.set(&t.host, present);
                Ok(Some(present))
            }
            Ok(Err(e)) => {
                counters.status(StatusClass::NoAnswer);
                tracing::debug!(registry = %t.host, error = %e, "referrers API probe failed");
                Ok(None)
            }
            Err(_) => {
                counters.status(StatusClass::NoAnswer);
                counters.error();
                Err(deadline_err())
            }
        }
    }

    /// The OCI referrers tag schema: the index tagged `sha256-<hex>`, filtered by
    /// `artifact_type`; no such tag means no referrers.
    pub(super) async fn referrers_by_tag(
        &self,
        t: &Target,
        digest: &str,
        artifact_type: Option<&str>,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<serde_json::Value> {
        let tag = digest.replace(':', "-");
        let reference = Reference::with_tag(
            t.reference.registry().to_string(),
            t.reference.repository().to_string(),
            tag,
        );
        let fallback = Target {
            image: reference.whole(),
            reference,
            host: t.host.clone(),
            auth: t.auth.clone(),
        };
        let m = match self.fetch_manifest_target(&fallback, creds, deadline).await {
            Ok(m) => m,
            Err(Error::NotFound { .. }) => return Ok(empty_index()),
            Err(e) => return Err(e),
        };
        if !m.is_index() {
            return Err(fallback
                .site()
                .invalid_manifest("referrers tag holds an image manifest, not an index"));
        }
        let mut index = m.json;
        if let (Some(want), Some(entries)) = (
            artifact_type,
            index.get_mut("manifests").and_then(|v| v.as_array_mut()),
        ) {
            entries.retain(|e| e.get("artifactType").and_then(|a| a.as_str()) == Some(want));
        }
        Ok(index)
    }

    /// The probe client; the insecure one is built on first use, off the async workers.
    async fn raw_client_for(&self, insecure: bool, deadline: Instant) -> Option<reqwest::Client> {
        if !insecure {
            return Some(self.inner.raw_secure.clone());
        }
        let (roots, config, ua) = (
            self.inner.roots.clone(),
            self.inner.config.clone(),
            self.inner.user_agent,
        );
        let init = self.inner.raw_insecure.get_or_try_init(|| async move {
            tokio::task::spawn_blocking(move || raw_client(&roots, true, &config, ua))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        });
        match timeout_at(deadline, init).await {
            Ok(Ok(c)) => Some(c.clone()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "building the insecure referrers probe client");
                None
            }
            Err(_) => None,
        }
    }
}

fn empty_index() -> serde_json::Value {
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [],
    })
}
