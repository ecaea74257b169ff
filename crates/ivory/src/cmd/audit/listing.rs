//! Walking the `--registry` hosts for `ivory audit`: ivory-registry's [`Walk`] over each
//! catalog, with the credentials the policies allow, into the audit's queue; what could not be
//! listed becomes an error entry worded here.

use std::sync::Arc;

use ivory_engine::images;
use ivory_engine::report::ImageReport;
use ivory_policy::CompiledPolicy;
use ivory_registry::{Credentials, ImageSink, Registry, Walk, WalkError, WalkProblem};

use super::Args;
use super::queue::ImageQueue;

/// The queue as a walk's sink: images queued, problems made error entries.
struct Sink<'q, 'a>(&'q mut ImageQueue<'a>);

impl ImageSink for Sink<'_, '_> {
    type Error = anyhow::Error;

    async fn image(&mut self, image: String) -> anyhow::Result<bool> {
        self.0.push(image).await
    }

    fn problem(&mut self, problem: WalkProblem) {
        let (subject, message) = match problem {
            WalkProblem::InvalidRepositories { host, count } => {
                let message = format!(
                    "{host}: {count} repository names outside the OCI distribution grammar skipped"
                );
                (host, message)
            }
            WalkProblem::Tags { repository, error } => {
                let message = format!("{repository}: listing the tags: {}", error.summary());
                (repository, message)
            }
            WalkProblem::InvalidTags { repository, count } => {
                let message = format!(
                    "{repository}: {count} tags outside the OCI distribution grammar skipped"
                );
                (repository, message)
            }
        };
        self.0.report(ImageReport::error(&subject, message));
    }
}

/// Queues `host/repo:tag` for every tag of every catalog repository matching `--repository`,
/// page by page. Repository names outside the grammar become one error entry for the
/// registry; a repository whose tags cannot be listed, or that lists tags outside the
/// grammar, one entry for it. False once `--max-images` images were listed: the listing
/// stopped (and says so in an entry).
pub(super) async fn list_registry(
    args: &Args,
    registry: &Registry,
    policies: &[Arc<CompiledPolicy>],
    host: &str,
    queue: &mut ImageQueue<'_>,
    listed: &mut usize,
) -> anyhow::Result<bool> {
    // The listing may use plain HTTP or unverified TLS where a policy for this registry's
    // images allows it, as verifying them will: the catalog when such a policy may select an
    // image on this host, each repository's tags when it selects that repository.
    let insecure = policies
        .iter()
        .any(|p| p.allows_insecure_registry() && images::may_select_on_host(p, host));
    let globs = args
        .repositories
        .iter()
        .map(|g| {
            ivory_policy::compile_image_glob(g)
                .map_err(|e| anyhow::anyhow!("--repository {g}: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let select = |repo: &str| globs.is_empty() || globs.iter().any(|g| g.is_match(repo));
    let repository_credentials = |repository: &str| {
        let insecure = policies
            .iter()
            .any(|p| p.allows_insecure_registry() && images::selects_repository(p, repository));
        Credentials::anonymous().allow_insecure(insecure)
    };
    let walk = Walk {
        registry,
        host,
        catalog_credentials: Credentials::anonymous().allow_insecure(insecure),
        select: &select,
        repository_credentials: &repository_credentials,
        timeout: args.timeout,
        max_images: args.max_images,
    };
    let more = match walk.run(&mut Sink(queue), listed).await {
        Ok(more) => more,
        Err(WalkError::Sink(e)) => return Err(e),
        Err(e @ WalkError::Catalog { .. }) => {
            if let WalkError::Catalog { error, .. } = &e {
                tracing::debug!(registry = host, error = %error, "catalog listing failed");
            }
            anyhow::bail!("{e}");
        }
    };
    if !more {
        queue.report(ImageReport::error(
            host,
            format!(
                "{host}: listing stopped at --max-images {}: the registry lists more images \
                 (raise --max-images to audit them)",
                args.max_images
            ),
        ));
    }
    Ok(more)
}
