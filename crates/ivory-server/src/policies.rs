//! The policy set the server evaluates, swapped atomically on reload.
//!
//! A reload that produces any error keeps the previous good set: a half-loaded directory must
//! never silently drop a policy that was being enforced. The errors stay visible on `/readyz`
//! and in the metrics until a clean load replaces them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ivory_policy::{CompiledException, CompiledPolicy, LoadReport, load_path};
use tokio::time::MissedTickBehavior;

use crate::metrics::Metrics;

/// What `/readyz` and the handlers see.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The last good set; `None` until a load succeeded.
    pub policies: Option<Arc<Vec<Arc<CompiledPolicy>>>>,
    /// PolicyExceptions from the same source (acted on only when exceptions are enabled).
    pub exceptions: Arc<Vec<Arc<CompiledException>>>,
    /// Errors of the most recent load (empty when it was clean).
    pub errors: Vec<String>,
    /// PolicyExceptions from Kubernetes that do not compile (they exempt nothing).
    pub exception_errors: Vec<String>,
}

impl Snapshot {
    /// Ready once a good set exists.
    pub fn is_ready(&self) -> bool {
        self.policies.is_some()
    }

    /// The policies to evaluate (empty before the first good load).
    pub fn policies(&self) -> &[Arc<CompiledPolicy>] {
        self.policies.as_deref().map_or(&[], Vec::as_slice)
    }
}

/// Lock-free holder of the current [`Snapshot`].
#[derive(Debug, Default)]
pub struct PolicyStore {
    current: ArcSwap<Snapshot>,
}

impl PolicyStore {
    /// A store serving `policies` from the start (the embedded default, tests).
    pub fn with_policies(policies: Vec<CompiledPolicy>) -> Self {
        let store = Self::default();
        store.replace(policies);
        store
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Installs a new good set (without exceptions) and clears errors.
    pub fn replace(&self, policies: Vec<CompiledPolicy>) {
        self.replace_all(policies, Vec::new());
    }

    /// Installs a new good set of policies and exceptions and clears errors.
    pub fn replace_all(&self, policies: Vec<CompiledPolicy>, exceptions: Vec<CompiledException>) {
        let policies = policies.into_iter().map(Arc::new).collect();
        self.current.store(Arc::new(Snapshot {
            policies: Some(Arc::new(policies)),
            exceptions: Arc::new(exceptions.into_iter().map(Arc::new).collect()),
            errors: Vec::new(),
            exception_errors: Vec::new(),
        }));
    }

    /// Installs `policies` together with `errors`, for sources that keep the last good version
    /// of each policy on their own (the Kubernetes source): the set is ready even with errors.
    /// The exceptions in force stay.
    pub fn publish(&self, policies: Vec<Arc<CompiledPolicy>>, errors: Vec<String>) {
        let policies = Arc::new(policies);
        self.current.rcu(|current| Snapshot {
            policies: Some(policies.clone()),
            exceptions: current.exceptions.clone(),
            errors: errors.clone(),
            exception_errors: current.exception_errors.clone(),
        });
    }

    /// Installs the exceptions the Kubernetes source watched, with the errors of those that do
    /// not compile; the policies stay.
    pub fn publish_exceptions(&self, exceptions: Vec<Arc<CompiledException>>, errors: Vec<String>) {
        let exceptions = Arc::new(exceptions);
        self.current.rcu(|current| Snapshot {
            policies: current.policies.clone(),
            exceptions: exceptions.clone(),
            errors: current.errors.clone(),
            exception_errors: errors.clone(),
        });
    }

    /// Applies a load: a clean report replaces the set, a failed one only records its errors.
    /// Returns true when the set was replaced.
    pub fn apply(&self, report: LoadReport) -> bool {
        if report.errors.is_empty() {
            self.replace_all(report.policies, report.exceptions);
            return true;
        }
        let previous = self.snapshot();
        self.current.store(Arc::new(Snapshot {
            policies: previous.policies.clone(),
            exceptions: previous.exceptions.clone(),
            errors: report.errors.iter().map(ToString::to_string).collect(),
            exception_errors: Vec::new(),
        }));
        false
    }
}

/// Policy files and folders given by `--policies`, reloaded when their content changes.
#[derive(Clone, Debug)]
pub struct FileSource {
    /// The files and folders, in the order given (load order decides error order).
    pub paths: Vec<PathBuf>,
}

impl FileSource {
    /// Loads every path into one report (duplicate names across paths are errors).
    pub fn load(&self) -> LoadReport {
        let mut report = LoadReport::default();
        for path in &self.paths {
            report.merge(load_path(path));
        }
        report
    }

    /// Cheap change detector: every policy file's path and bytes. Contents rather than
    /// mtimes, because ConfigMap volumes swap symlinks and editors may keep the mtime.
    /// An unreadable entry shows as its location with no bytes, so it counts as a change too.
    pub fn fingerprint(&self) -> Vec<(PathBuf, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        for path in &self.paths {
            let (files, errors) = ivory_policy::policy_files(path);
            out.extend(files.into_iter().map(|f| {
                let bytes = std::fs::read(&f).ok();
                (f, bytes)
            }));
            out.extend(errors.iter().map(|e| (PathBuf::from(&e.location), None)));
        }
        out
    }

    /// Loads, records the outcome in `store` and `metrics`, and logs it.
    pub fn reload_into(&self, store: &PolicyStore, metrics: &Metrics) {
        let report = self.load();
        let count = report.policies.len();
        let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        for note in &report.skipped {
            tracing::info!(note = %note, "skipped non-policy document");
        }
        if store.apply(report) {
            tracing::info!(policies = count, "policies loaded");
            metrics.policies_loaded(count);
        } else {
            for error in &errors {
                tracing::error!(error = %error, "policy load failed; keeping the last good set");
            }
            metrics.policy_load_failed(errors.len());
        }
    }

    /// Polls for changes every `interval` and reloads when the fingerprint moves. Runs until
    /// the task is dropped.
    pub async fn watch(
        self,
        store: Arc<PolicyStore>,
        metrics: Arc<Metrics>,
        interval: Duration,
        mut last: Vec<(PathBuf, Option<Vec<u8>>)>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let source = self.clone();
            // File reads and CEL compilation are blocking work.
            let Ok(now) = tokio::task::spawn_blocking(move || source.fingerprint()).await else {
                continue;
            };
            if now == last {
                continue;
            }
            last = now;
            tracing::info!("policy files changed, reloading");
            let (source, store, metrics) = (self.clone(), store.clone(), metrics.clone());
            let _ = tokio::task::spawn_blocking(move || source.reload_into(&store, &metrics)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = include_str!("../../../policies/default.yaml");

    #[test]
    fn broken_reload_keeps_last_good_set() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.yaml");
        std::fs::write(&file, GOOD).unwrap();
        let source = FileSource {
            paths: vec![dir.path().to_path_buf()],
        };
        let store = PolicyStore::default();
        let metrics = Metrics::new();
        assert!(!store.snapshot().is_ready());
        source.reload_into(&store, &metrics);
        let snap = store.snapshot();
        assert!(snap.is_ready() && snap.errors.is_empty());
        assert_eq!(snap.policies()[0].name, "ivory-pin-digests");

        let before = source.fingerprint();
        std::fs::write(&file, "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata: {name: x}\nspec: {validations: 3}\n").unwrap();
        assert_ne!(before, source.fingerprint());
        source.reload_into(&store, &metrics);
        let snap = store.snapshot();
        assert_eq!(snap.policies()[0].name, "ivory-pin-digests");
        assert!(snap.errors[0].contains("p.yaml"), "{:?}", snap.errors);
        assert!(metrics.encode().contains("ivory_policy_load_errors 1"));
    }
}
