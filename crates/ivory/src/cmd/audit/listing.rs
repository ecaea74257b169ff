//! Walking a registry for `ivory audit`: the catalog, then each repository's tags, page by
//! page (the pages themselves are ivory-registry's `catalog_pages`/`tag_pages`), each image
//! queued as it comes.

use std::sync::Arc;

use ivory_engine::images;
use ivory_engine::report::ImageReport;
use ivory_policy::CompiledPolicy;
use ivory_registry::{Credentials, Registry};

use super::Args;
use super::queue::ImageQueue;

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
    let creds = Credentials::anonymous().allow_insecure(insecure);
    let globs = args
        .repositories
        .iter()
        .map(|g| {
            ivory_policy::compile_image_glob(g)
                .map_err(|e| anyhow::anyhow!("--repository {g}: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let failed = |e: ivory_registry::Error| {
        tracing::debug!(registry = host, error = %e, "catalog listing failed");
        anyhow::anyhow!("listing the catalog of registry {host}: {}", e.summary())
    };
    let mut catalog = registry.catalog_pages(host, &creds).map_err(failed)?;
    let mut invalid = 0;
    let mut more = true;
    while let Some(page) = catalog
        .next_page(ivory_clock::now() + args.timeout)
        .await
        .map_err(failed)?
    {
        invalid += page.invalid;
        for repo in page
            .names
            .iter()
            .filter(|r| globs.is_empty() || globs.iter().any(|g| g.is_match(r)))
        {
            more = list_repository(args, registry, policies, host, repo, queue, listed).await?;
            if !more {
                break;
            }
        }
        if !more {
            break;
        }
    }
    if invalid > 0 {
        queue.report(ImageReport::error(
            host,
            format!(
                "{host}: {invalid} repository names outside the OCI distribution grammar skipped"
            ),
        ));
    }
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

/// Queues the tags of `host/repo`, page by page; false when `--max-images` stopped it.
async fn list_repository(
    args: &Args,
    registry: &Registry,
    policies: &[Arc<CompiledPolicy>],
    host: &str,
    repo: &str,
    queue: &mut ImageQueue<'_>,
    listed: &mut usize,
) -> anyhow::Result<bool> {
    let reference = format!("{host}/{repo}");
    let repo_insecure = policies
        .iter()
        .any(|p| p.allows_insecure_registry() && images::selects_repository(p, &reference));
    let repo_creds = Credentials::anonymous().allow_insecure(repo_insecure);
    let failed = |e: ivory_registry::Error| {
        ImageReport::error(
            &reference,
            format!("{reference}: listing the tags: {}", e.summary()),
        )
    };
    let mut tags = match registry.tag_pages(&reference, &repo_creds) {
        Ok(tags) => tags,
        Err(e) => {
            queue.report(failed(e));
            return Ok(true);
        }
    };
    let mut invalid = 0;
    let mut more = true;
    'pages: loop {
        let page = match tags.next_page(ivory_clock::now() + args.timeout).await {
            Ok(Some(page)) => page,
            Ok(None) => break,
            Err(e) => {
                queue.report(failed(e));
                break;
            }
        };
        invalid += page.invalid;
        for tag in page
            .names
            .iter()
            .filter(|t| !ivory_registry::is_signature_tag(t))
        {
            if *listed >= args.max_images {
                more = false;
                break 'pages;
            }
            if queue.push(format!("{reference}:{tag}")).await? {
                *listed += 1;
            }
        }
    }
    if invalid > 0 {
        queue.report(ImageReport::error(
            &reference,
            format!("{reference}: {invalid} tags outside the OCI distribution grammar skipped"),
        ));
    }
    Ok(more)
}
