//! The system resolver behind ivory's registry clients, with a typed failure.

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::cause::LookupFailed;

/// getaddrinfo on tokio's blocking pool, as reqwest's default resolver does, but failing
/// with [`LookupFailed`] so a failed lookup is known by its type, not by hyper's words.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Collected at once: the iterator borrows `host`, which the error takes.
            let found = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map(Iterator::collect::<Vec<_>>);
            match found {
                Ok(addrs) => Ok(Box::new(addrs.into_iter()) as Addrs),
                Err(source) => Err(LookupFailed { host, source }.into()),
            }
        })
    }
}
