//! Shared helpers: start a harness, push a one-layer image, build a client for it.

use std::time::Duration;

use ivory_registry::{Config, Registry};
use ivory_testkit::{AuthMode, Harness, HarnessOptions, RegistryHarness, SimpleImage};
use tokio::time::Instant;

pub(crate) fn deadline(d: Duration) -> Instant {
    ivory_clock::now() + d
}

/// Generous budget for calls that should succeed on a loaded 2-core machine.
pub(crate) fn ok_deadline() -> Instant {
    deadline(Duration::from_secs(20))
}

pub(crate) async fn start(auth: AuthMode) -> Harness {
    RegistryHarness::start(HarnessOptions {
        auth,
        ..HarnessOptions::default()
    })
    .await
    .expect("start docker-registry harness")
}

pub(crate) fn client_for(h: &Harness) -> Registry {
    client_with(h, Config::default())
}

pub(crate) fn client_with(h: &Harness, config: Config) -> Registry {
    Registry::new(Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..config
    })
    .unwrap()
}

/// Writes a layout with one image tagged `tag` and pushes it to `repo`.
pub(crate) async fn push_simple(h: &Harness, repo: &str, tag: &str, seed: &str) -> SimpleImage {
    let dir = tempfile::tempdir().unwrap();
    let img = ivory_testkit::write_simple_image(dir.path(), tag, seed).unwrap();
    let tags = h.push_oci_layout(dir.path(), repo).await.unwrap();
    assert_eq!(tags.get(tag), Some(&img.manifest.digest));
    img
}

/// Requests as "METHOD path status" strings, for readable assertions.
pub(crate) fn seq(h: &Harness) -> Vec<String> {
    h.requests()
        .into_iter()
        .map(|(m, p, s)| format!("{m} {p} {s}"))
        .collect()
}

/// `image` parsed, as the registry's callers hand images over (parsed once, where they enter).
pub(crate) fn reference(image: &str) -> ivory_reference::ImageReference {
    ivory_reference::ImageReference::parse(image).unwrap_or_else(|e| panic!("{e}"))
}
