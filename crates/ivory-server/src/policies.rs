//! The policy set the server evaluates, swapped atomically on reload.
//!
//! A reload that produces any error keeps the previous good set: a half-loaded directory must
//! never silently drop a policy that was being enforced. The errors stay visible on `/readyz`
//! and in the metrics until a clean load replaces them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ivory_policy::{CompiledException, CompiledPolicy, LoadReport, PolicyFiles, read_policy_files};
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

/// Policy files and folders given by `--policies`, reloaded when their content changes and
/// has stopped changing.
///
/// A writer that is not atomic (`cat >`, scp, many configuration-management tools) exposes a
/// prefix of the new file for a while, and a prefix can be a valid policy that lost a check.
/// So a change is applied only once two reads a poll interval apart found the same bytes; until
/// then the set in force stays. What is loaded is the bytes that were compared, never a third
/// read. A writer that stalls mid-file for longer than the poll interval is not told apart from
/// a finished one: write policy files atomically (rename, or a ConfigMap volume, whose updates
/// are atomic symlink swaps).
#[derive(Clone, Debug)]
pub struct FileSource {
    /// The files and folders, in the order given (load order decides error order).
    pub paths: Vec<PathBuf>,
}

impl FileSource {
    /// Reads every policy file of every path in one pass.
    pub fn read(&self) -> PolicyFiles {
        let mut files = PolicyFiles::default();
        for path in &self.paths {
            files.merge(read_policy_files(path));
        }
        files
    }

    /// Loads every path into one report (duplicate names across paths are errors).
    pub fn load(&self) -> LoadReport {
        self.read().load()
    }

    /// Reads until two reads `interval` apart are the same, and returns that content: the
    /// first load waits for files being written just like a reload does.
    pub async fn read_settled(&self, interval: Duration) -> PolicyFiles {
        let mut last = self.read_blocking().await;
        loop {
            tokio::time::sleep(interval).await;
            let now = self.read_blocking().await;
            if let (Some(now), Some(before)) = (&now, &last)
                && now == before
            {
                return now.clone();
            }
            tracing::info!("policy files are changing; waiting for them to settle");
            last = now;
        }
    }

    /// [`Self::read`] off the async workers; `None` when the read did not finish (the task
    /// panicked or was cancelled), which must never read as "no policy files".
    async fn read_blocking(&self) -> Option<PolicyFiles> {
        let source = self.clone();
        tokio::task::spawn_blocking(move || source.read())
            .await
            .ok()
    }

    /// Loads `files`, records the outcome in `store` and `metrics`, and logs it.
    pub fn apply(files: &PolicyFiles, store: &PolicyStore, metrics: &Metrics) {
        let report = files.load();
        let count = report.policies.len();
        let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        for note in &report.skipped {
            tracing::info!(note = %note, "skipped non-policy document");
        }
        for warning in report.policies.iter().flat_map(ivory_policy::blind_spots) {
            tracing::warn!(warning = %warning, "policy blind spot");
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

    /// Reads, loads and records the outcome (no settling: one-shot loads and tests).
    pub fn reload_into(&self, store: &PolicyStore, metrics: &Metrics) {
        Self::apply(&self.read(), store, metrics);
    }

    /// Polls every `interval`; content that differs from `applied` is loaded once the next
    /// poll reads it unchanged. Runs until the task is dropped.
    pub async fn watch(
        self,
        store: Arc<PolicyStore>,
        metrics: Arc<Metrics>,
        interval: Duration,
        mut applied: PolicyFiles,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut candidate: Option<PolicyFiles> = None;
        loop {
            tick.tick().await;
            let Some(now) = self.read_blocking().await else {
                continue;
            };
            match next_step(&applied, candidate.as_ref(), now) {
                Step::Unchanged => candidate = None,
                Step::Settling(now) => {
                    tracing::info!("policy files changed; applying them once they stop changing");
                    candidate = Some(now);
                }
                Step::Apply(now) => {
                    candidate = None;
                    let (store, metrics, files) = (store.clone(), metrics.clone(), now.clone());
                    // Parsing and CEL compilation are blocking work.
                    let _ = tokio::task::spawn_blocking(move || {
                        Self::apply(&files, &store, &metrics);
                    })
                    .await;
                    applied = now;
                }
            }
        }
    }
}

/// What a poll that read `now` does.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The content in force: nothing to do.
    Unchanged,
    /// New content not seen at the previous poll: wait for it to settle.
    Settling(PolicyFiles),
    /// The same new content as at the previous poll: load it.
    Apply(PolicyFiles),
}

fn next_step(applied: &PolicyFiles, candidate: Option<&PolicyFiles>, now: PolicyFiles) -> Step {
    if &now == applied {
        Step::Unchanged
    } else if candidate == Some(&now) {
        Step::Apply(now)
    } else {
        Step::Settling(now)
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

        let before = source.read();
        std::fs::write(&file, "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata: {name: x}\nspec: {validations: 3}\n").unwrap();
        assert_ne!(before, source.read());
        source.reload_into(&store, &metrics);
        let snap = store.snapshot();
        assert_eq!(snap.policies()[0].name, "ivory-pin-digests");
        assert!(snap.errors[0].contains("p.yaml"), "{:?}", snap.errors);
        assert!(metrics.encode().contains("ivory_policy_load_errors 1"));
    }

    fn files(content: &str) -> PolicyFiles {
        PolicyFiles {
            files: vec![(PathBuf::from("p.yaml"), content.as_bytes().to_vec())],
            errors: Vec::new(),
        }
    }

    #[test]
    fn a_change_is_applied_only_once_two_polls_read_it_unchanged() {
        let applied = files("old");
        let prefix = files("new, half writ");
        let whole = files("new, half written and finished");
        assert_eq!(next_step(&applied, None, applied.clone()), Step::Unchanged);
        // The writer is mid-file: the prefix is never applied, even when it stays for a poll
        // and the finished file then differs from it.
        assert_eq!(
            next_step(&applied, None, prefix.clone()),
            Step::Settling(prefix.clone())
        );
        assert_eq!(
            next_step(&applied, Some(&prefix), whole.clone()),
            Step::Settling(whole.clone())
        );
        assert_eq!(
            next_step(&applied, Some(&whole), whole.clone()),
            Step::Apply(whole.clone())
        );
        // Put back as it was before settling: nothing to do.
        assert_eq!(
            next_step(&applied, Some(&prefix), applied.clone()),
            Step::Unchanged
        );
    }
}
