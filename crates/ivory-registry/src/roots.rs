//! Trust anchors for registry TLS: the system's root certificates, read once per process,
//! plus the configured CA bundle.
//!
//! reqwest's default (platform) verifier reads and parses the whole system store for every
//! client it builds, and ivory builds one per registry host and credential set plus the
//! referrers client (what that cost: BENCHMARKS.md, "Cold verification vs cosign").

use std::sync::OnceLock;

static SYSTEM: OnceLock<Vec<Vec<u8>>> = OnceLock::new();

/// The system roots (DER), loaded on first use. Unreadable files are logged and skipped, as
/// the platform verifier does.
fn system_roots() -> &'static [Vec<u8>] {
    SYSTEM.get_or_init(|| {
        let loaded = rustls_native_certs::load_native_certs();
        for error in &loaded.errors {
            tracing::warn!(%error, "reading system root certificates");
        }
        loaded
            .certs
            .into_iter()
            .map(|c| c.as_ref().to_vec())
            .collect()
    })
}

/// Every certificate a registry's chain may end in: system roots, then `extra` (DER).
pub(crate) fn trust_anchors(extra: &[Vec<u8>]) -> impl Iterator<Item = &[u8]> {
    system_roots().iter().chain(extra).map(Vec::as_slice)
}
