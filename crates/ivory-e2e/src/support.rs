//! Small helpers for cluster tests: unique names, namespaces, polling, unused ports.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::{Error, Result};

/// A DNS-label name `prefix-<unique suffix>`, unique within this process and very likely across
/// processes sharing a cluster.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = ivory_clock::wall()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{:x}-{n}", nanos ^ std::process::id())
}

/// Creates a namespace named `prefix-<unique suffix>` and returns its name. Namespaces carry the
/// `kubernetes.io/metadata.name` label, which webhook `namespaceSelector`s can match.
pub async fn create_namespace(client: &Client, prefix: &str) -> Result<String> {
    create_labelled_namespace(client, prefix, &[]).await
}

/// [`create_namespace`] with `labels` besides `ivory-e2e=true`.
pub async fn create_labelled_namespace(
    client: &Client,
    prefix: &str,
    labels: &[(&str, &str)],
) -> Result<String> {
    let name = unique_name(prefix);
    let mut all = BTreeMap::from([("ivory-e2e".to_owned(), "true".to_owned())]);
    all.extend(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(all),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    Ok(name)
}

/// Runs `check` until it returns `Ok`, at most for `timeout`. For what the API server applies
/// asynchronously, such as a new webhook configuration reaching its admission chain.
/// [`ivory_testkit::eventually`], its timeout as this crate's [`Error::Timeout`].
pub async fn eventually<T, E, F, Fut>(what: &str, timeout: Duration, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
    E: Display,
{
    ivory_testkit::eventually(what, timeout, check)
        .await
        .map_err(|timeout| Error::Timeout {
            what: timeout.what,
            timeout: timeout.timeout,
            last: timeout.last,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_differ_and_are_dns_labels() {
        let a = unique_name("e2e");
        let b = unique_name("e2e");
        assert_ne!(a, b);
        for name in [&a, &b] {
            assert!(name.starts_with("e2e-"), "{name}");
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
    }

    #[tokio::test]
    /// The wrapper keeps the testkit's error text (the retries themselves are tested there).
    async fn eventually_times_out_with_the_last_error() {
        let err = eventually("never", Duration::from_millis(300), || async {
            Err::<(), _>("still failing")
        })
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("never") && text.contains("still failing"),
            "{text}"
        );
    }
}
