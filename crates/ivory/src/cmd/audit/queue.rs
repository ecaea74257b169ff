//! The audit's work queue: images in, one check per distinct repository@digest, reports out.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::Arc;

use anyhow::Context as _;
use ivory_engine::report::{ImageChecker, ImageReport, verification_key};
use ivory_engine::verifier::VerifyError;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::Finished;
use super::progress::Progress;

/// What one task finished.
enum Done {
    Resolved(String, Result<String, VerifyError>),
    Verified(String, ImageReport),
}

/// Images of one repository@digest waiting for (or given) its single verification.
struct Group {
    waiting: Vec<String>,
    report: Option<ImageReport>,
}

/// The audit's work queue (not the engine's `Pipeline`, which judges each image): resolves
/// images as the sources find them and checks each distinct repository@digest once, as soon as its first tag is resolved (a hung lookup does not hold the others back):
/// `limit` tasks run at a time and a new image waits while `2 × limit` are queued, so a
/// listing's pages wait for room instead of piling up.
pub(super) struct ImageQueue<'a> {
    checker: Arc<ImageChecker>,
    limit: usize,
    permits: Arc<Semaphore>,
    tasks: JoinSet<Done>,
    groups: HashMap<String, Group>,
    /// Images queued so far: each is audited once, however many sources name it.
    seen: HashSet<String>,
    finished: &'a mut Finished,
    progress: &'a mut Progress,
}

impl<'a> ImageQueue<'a> {
    pub(super) fn new(
        limit: NonZeroUsize,
        checker: &Arc<ImageChecker>,
        finished: &'a mut Finished,
        progress: &'a mut Progress,
    ) -> Self {
        progress.start("verifying", 0);
        Self {
            checker: checker.clone(),
            limit: limit.get(),
            permits: Arc::new(Semaphore::new(limit.get())),
            tasks: JoinSet::new(),
            groups: HashMap::new(),
            seen: HashSet::new(),
            finished,
            progress,
        }
    }

    /// Queues `image` (waiting for room first); false when it was queued before. An image
    /// of another shard, or one this shard finished in an earlier run, counts as listed but
    /// is not queued.
    pub(super) async fn push(&mut self, image: String) -> anyhow::Result<bool> {
        if !self.finished.owns(&image) {
            return Ok(true);
        }
        if !self.seen.insert(image.clone()) {
            return Ok(false);
        }
        if self.finished.resumed.contains(&image) {
            return Ok(true);
        }
        self.finished.found += 1;
        self.progress.grow(1);
        while self.tasks.len() >= 2 * self.limit {
            self.join_one().await?;
        }
        let (checker, permits) = (self.checker.clone(), self.permits.clone());
        self.tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let digest = checker.resolve(&image).await;
            Done::Resolved(image, digest)
        });
        Ok(true)
    }

    /// An entry for something that could not be listed (when this shard owns its subject).
    pub(super) fn report(&mut self, report: ImageReport) {
        if !self.finished.owns(&report.image) {
            return;
        }
        self.finished.found += 1;
        self.finished.record(report);
        self.progress.grow(1);
        self.progress.inc(1);
    }

    /// Notes that a registry listing stopped at `--max-images`.
    pub(super) fn truncated(&mut self) {
        self.finished.truncated = true;
    }

    /// Waits for every queued image.
    pub(super) async fn finish(mut self) -> anyhow::Result<()> {
        while self.join_one().await? {}
        Ok(())
    }

    /// Takes one finished task's result; false when no task is left.
    async fn join_one(&mut self) -> anyhow::Result<bool> {
        let Some(joined) = self.tasks.join_next().await else {
            return Ok(false);
        };
        let finished = &mut *self.finished;
        match joined.context("audit task failed")? {
            Done::Resolved(image, Err(e)) => {
                finished.record(ImageReport::unresolved(&image, &e));
                self.progress.inc(1);
            }
            Done::Resolved(image, Ok(digest)) => {
                let key = verification_key(&image, &digest);
                if let Some(group) = self.groups.get_mut(&key) {
                    match &group.report {
                        Some(report) => {
                            finished.record(ImageReport {
                                image,
                                ..report.clone()
                            });
                            self.progress.inc(1);
                        }
                        None => group.waiting.push(image),
                    }
                    return Ok(true);
                }
                self.groups.insert(
                    key.clone(),
                    Group {
                        waiting: vec![image.clone()],
                        report: None,
                    },
                );
                let (checker, permits) = (self.checker.clone(), self.permits.clone());
                self.tasks.spawn(async move {
                    let _permit = permits.acquire_owned().await;
                    Done::Verified(key, checker.check_digest(&image, &digest).await)
                });
            }
            Done::Verified(key, report) => {
                let Some(group) = self.groups.get_mut(&key) else {
                    return Ok(true);
                };
                let waiting = std::mem::take(&mut group.waiting);
                self.progress.inc(waiting.len());
                for image in waiting {
                    finished.record(ImageReport {
                        image,
                        ..report.clone()
                    });
                }
                group.report = Some(report);
                finished.digests += 1;
            }
        }
        Ok(true)
    }
}
