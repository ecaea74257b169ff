//! The referrers floor: learn per host whether `/v2/<repo>/referrers/<digest>` exists, and
//! read the `sha256-<hex>` fallback tag directly where it does not.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::{Registry, Target};
use crate::auth::Credentials;
use crate::error::{Error, Result};
use crate::manifest::OCI_INDEX;
use crate::operation::Operation;
use crate::reference::sibling;

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
            .filter(|(_, until)| ivory_clock::now() < *until)
            .map(|(present, _)| *present)
    }

    pub(super) fn set(&self, host: &str, present: bool) {
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        hosts.insert(host.to_string(), (present, ivory_clock::now() + self.ttl));
    }
}

// === impl Registry ===

impl Registry {
    /// The OCI referrers tag schema: the index tagged `tag` (`sha256-<hex>`); `None` when no
    /// such tag exists (no referrers).
    pub(super) async fn referrers_by_tag(
        &self,
        t: &Target,
        tag: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Option<serde_json::Value>> {
        let reference = sibling(&t.reference, ':', tag)?;
        let fallback = Target {
            image: reference.name(),
            reference,
            host: t.host.clone(),
            auth: t.auth.clone(),
        };
        let m = match self.fetch_manifest_target(&fallback, creds, deadline).await {
            Ok(m) => m,
            Err(Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !m.is_index() {
            return Err(fallback
                .site(Operation::Referrers)
                .invalid_manifest("referrers tag holds an image manifest, not an index"));
        }
        Ok(Some(m.json))
    }
}

/// The referrers of a digest and the layout they were read from.
#[derive(Debug, Clone)]
pub struct Referrers {
    /// An OCI index listing them (empty when there are none).
    pub index: serde_json::Value,
    /// Where they were read.
    pub via: ReferrersVia,
}

/// Which referrers layout answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReferrersVia {
    /// The OCI 1.1 referrers API (`/v2/<repo>/referrers/<digest>`).
    Api,
    /// The host has no referrers API: the fallback tag `tag` (`sha256-<hex>`), `present` or
    /// not.
    FallbackTag {
        /// `sha256-<hex>`.
        tag: String,
        /// False when no such tag exists.
        present: bool,
    },
}

pub(super) fn empty_index() -> serde_json::Value {
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [],
    })
}
