//! Walking one registry's images for an audit: the catalog, then each selected repository's
//! tags, page by page ([`Registry::catalog_pages`], [`Registry::tag_pages`]), each image handed
//! to an [`ImageSink`] as its page comes, so a huge or hostile registry is never held in
//! memory. Tags that hold signatures are skipped ([`is_signature_tag`]); names outside the
//! OCI grammar are only counted (their bytes go nowhere); the walk stops once `max_images`
//! images were taken. What the images are checked against, and how problems are worded, is
//! the caller's.

use std::future::Future;
use std::time::Duration;

use crate::listing::is_signature_tag;
use crate::{Credentials, Error, Registry};

/// Receives what a [`Walk`] finds, in order.
pub trait ImageSink {
    /// Why the sink could not take an image (stops the walk).
    type Error;

    /// One image, `host/repository:tag`; `Ok(true)` when it counts towards the walk's
    /// `max_images` (an image the sink had already is not counted).
    fn image(&mut self, image: String) -> impl Future<Output = Result<bool, Self::Error>>;

    /// Something that could not be listed in full; the walk goes on.
    fn problem(&mut self, problem: WalkProblem);
}

/// A part of a registry that could not be listed in full.
#[derive(Debug)]
pub enum WalkProblem {
    /// The catalog of `host` held `count` repository names outside the grammar.
    InvalidRepositories {
        /// The registry.
        host: String,
        /// How many names were skipped.
        count: usize,
    },
    /// The tags of `repository` could not be listed (or not past some page).
    Tags {
        /// `host/repository`.
        repository: String,
        /// Why.
        error: Error,
    },
    /// `repository` listed `count` tags outside the grammar.
    InvalidTags {
        /// `host/repository`.
        repository: String,
        /// How many tags were skipped.
        count: usize,
    },
}

/// Why a walk stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum WalkError<E> {
    /// The catalog could not be listed (a walk without it has nothing to walk).
    #[error("listing the catalog of registry {host}: {}", error.summary())]
    Catalog {
        /// The registry.
        host: String,
        /// Why.
        error: Error,
    },
    /// The sink refused an image.
    #[error(transparent)]
    Sink(E),
}

/// One registry to walk, and with what.
pub struct Walk<'a> {
    /// The client (its bounds, egress rule and per-host limits apply).
    pub registry: &'a Registry,
    /// The registry's host (`host` or `host:port`).
    pub host: &'a str,
    /// Credentials for the catalog.
    pub catalog_credentials: Credentials,
    /// Which repositories (names as the catalog gives them, without the host) are walked.
    pub select: &'a dyn Fn(&str) -> bool,
    /// Credentials for the tags of one repository, `host/repository`.
    pub repository_credentials: &'a dyn Fn(&str) -> Credentials,
    /// Time for each listing call.
    pub timeout: Duration,
    /// Images a walk (or several sharing one count) takes at most.
    pub max_images: usize,
}

impl Walk<'_> {
    /// Hands every image of the registry to `sink`, adding the ones it counts to `listed`.
    /// `Ok(false)` when `listed` reached `max_images` and the walk stopped there: the
    /// registry lists more.
    pub async fn run<S: ImageSink>(
        &self,
        sink: &mut S,
        listed: &mut usize,
    ) -> Result<bool, WalkError<S::Error>> {
        let failed = |error: Error| WalkError::Catalog {
            host: self.host.to_owned(),
            error,
        };
        let mut catalog = self
            .registry
            .catalog_pages(self.host, &self.catalog_credentials)
            .map_err(failed)?;
        let mut invalid = 0;
        let mut more = true;
        while let Some(page) = catalog
            .next_page(ivory_clock::now() + self.timeout)
            .await
            .map_err(failed)?
        {
            invalid += page.invalid;
            for repo in page.names.iter().filter(|r| (self.select)(r)) {
                more = self.repository(repo, sink, listed).await?;
                if !more {
                    break;
                }
            }
            if !more {
                break;
            }
        }
        if invalid > 0 {
            sink.problem(WalkProblem::InvalidRepositories {
                host: self.host.to_owned(),
                count: invalid,
            });
        }
        Ok(more)
    }

    /// The tags of `host/repo`, page by page; false when `max_images` stopped it.
    async fn repository<S: ImageSink>(
        &self,
        repo: &str,
        sink: &mut S,
        listed: &mut usize,
    ) -> Result<bool, WalkError<S::Error>> {
        let repository = format!("{}/{repo}", self.host);
        let credentials = (self.repository_credentials)(&repository);
        let mut tags = match self.registry.tag_pages(&repository, &credentials) {
            Ok(tags) => tags,
            Err(error) => {
                sink.problem(WalkProblem::Tags { repository, error });
                return Ok(true);
            }
        };
        let mut invalid = 0;
        let mut more = true;
        'pages: loop {
            let page = match tags.next_page(ivory_clock::now() + self.timeout).await {
                Ok(Some(page)) => page,
                Ok(None) => break,
                Err(error) => {
                    sink.problem(WalkProblem::Tags {
                        repository: repository.clone(),
                        error,
                    });
                    break;
                }
            };
            invalid += page.invalid;
            for tag in page.names.iter().filter(|t| !is_signature_tag(t)) {
                if *listed >= self.max_images {
                    more = false;
                    break 'pages;
                }
                let image = format!("{repository}:{tag}");
                if sink.image(image).await.map_err(WalkError::Sink)? {
                    *listed += 1;
                }
            }
        }
        if invalid > 0 {
            sink.problem(WalkProblem::InvalidTags {
                repository,
                count: invalid,
            });
        }
        Ok(more)
    }
}
