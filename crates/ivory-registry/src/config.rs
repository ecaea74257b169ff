//! Client configuration: plain values, built once by the binary.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

/// Manifests larger than this are refused (Distribution itself caps manifests at 4 MiB).
pub const DEFAULT_MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;
/// Signature and attestation blobs larger than this are refused.
pub const DEFAULT_MAX_BLOB_BYTES: usize = 8 * 1024 * 1024;
/// Bytes of registry answers being read at once, across all calls (what a flood of large
/// answers can hold); a read that would pass it fails as transient.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 32 * 1024 * 1024;
/// Concurrent calls in flight per registry host.
pub const DEFAULT_PER_REGISTRY_CONCURRENCY: NonZeroUsize = NonZeroUsize::new(16).unwrap();
/// TCP+TLS connect budget; the per-call deadline still applies on top.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Entries per page for tag and catalog listings.
pub const DEFAULT_PAGE_SIZE: usize = 1000;
/// Upper bound on listing pages, so a registry that ignores `last` cannot loop us.
pub const DEFAULT_MAX_PAGES: usize = 1000;
/// How long a host's answer about the OCI referrers API (present or absent) is trusted.
pub const DEFAULT_REFERRERS_API_TTL: Duration = Duration::from_secs(15 * 60);
/// User agent sent to registries.
pub const DEFAULT_USER_AGENT: &str = concat!("ivory/", env!("CARGO_PKG_VERSION"));

/// Registry client settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Extra trusted roots (PEM, one or more certificates), as given by `--registry-ca`.
    pub ca_bundle_pem: Option<Vec<u8>>,
    /// A docker `config.json` whose `auths` apply when a request carries no matching secret.
    pub docker_config: Option<PathBuf>,
    /// Maximum concurrent calls per registry host (zero would stop every call).
    pub per_registry_concurrency: NonZeroUsize,
    /// Manifest size limit in bytes.
    pub max_manifest_bytes: usize,
    /// Default blob size limit in bytes (callers pass their own to `fetch_blob`).
    pub max_blob_bytes: usize,
    /// Budget for registry answers being read at once, in bytes.
    pub max_buffered_bytes: usize,
    /// User agent header.
    pub user_agent: String,
    /// Connect timeout per connection attempt.
    pub connect_timeout: Duration,
    /// Page size for `list_tags` and `catalog`.
    pub page_size: usize,
    /// Page count limit for `list_tags` and `catalog`.
    pub max_pages: usize,
    /// How long a learnt "this host has (no) referrers API" is reused before probing again,
    /// so an upgraded registry is rediscovered.
    pub referrers_api_ttl: Duration,
    /// TLS without certificate verification, with plain HTTP as the fallback, for every
    /// registry (cosign's `--allow-insecure-registry`); what a policy's
    /// `allowInsecureRegistry` allows for its own images.
    pub allow_insecure: bool,
    /// Plain HTTP for every registry when TLS fails (cosign's `--allow-http-registry`).
    /// Loopback registries get it anyway unless [`Config::plain_http_loopback`] is off.
    pub allow_http: bool,
    /// The plain-HTTP fallback, credentials included, for loopback registries (`localhost`,
    /// `127.0.0.0/8`, `::1`), as go-containerregistry gives it: their traffic does not leave
    /// the machine. On by default.
    pub plain_http_loopback: bool,
    /// Registry hosts served by another host (`ghcr.io` → `127.0.0.1:5000`), as a
    /// containerd mirror: image names, and so policies' globs and cache keys, keep the
    /// original host; connections, auth and limits are the mirror's. Nothing a mirror serves
    /// is trusted more than the original's answer would be: digests are checked against
    /// bodies and signatures are verified as usual.
    pub mirrors: std::collections::BTreeMap<String, String>,
    /// Which addresses any connection may go to (registry, redirect target, token realm,
    /// URL a certificate names), judged on the address connected to: literal hosts before
    /// the request, names on the resolver's answer.
    pub egress: ivory_reference::EgressRule,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            ca_bundle_pem: None,
            docker_config: None,
            per_registry_concurrency: DEFAULT_PER_REGISTRY_CONCURRENCY,
            max_manifest_bytes: DEFAULT_MAX_MANIFEST_BYTES,
            max_blob_bytes: DEFAULT_MAX_BLOB_BYTES,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            user_agent: DEFAULT_USER_AGENT.to_string(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            page_size: DEFAULT_PAGE_SIZE,
            max_pages: DEFAULT_MAX_PAGES,
            referrers_api_ttl: DEFAULT_REFERRERS_API_TTL,
            allow_insecure: false,
            allow_http: false,
            plain_http_loopback: true,
            mirrors: std::collections::BTreeMap::new(),
            egress: ivory_reference::EgressRule::default(),
        }
    }
}

/// True for `localhost`, `127.0.0.0/8` and `::1` registry hosts, with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None if host.matches(':').count() > 1 => host,
        None => host.split(':').next().unwrap_or(host),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn loopback_hosts_are_recognised_with_and_without_ports() {
        for host in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
            "::1",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "registry.example:5000",
            "10.0.0.1:5000",
            "localhost.example",
            "[::2]:5000",
            "index.docker.io",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
