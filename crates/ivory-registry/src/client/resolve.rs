//! Name resolution that never connects to a cloud metadata service: a registry host (or a
//! redirect target) whose name resolves to link-local, unspecified or AWS's IPv6 metadata
//! addresses is refused at connect time, whatever the name. Request data can name any image,
//! and a name is resolved only when it is connected to, so this is where a name that points at
//! 169.254.169.254 is stopped (literal addresses are refused before any request by the engine).

use std::net::{IpAddr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use ivory_reference::is_metadata_or_unspecified;

use crate::cause::{AddressRefused, LookupFailed};

/// The system resolver (`getaddrinfo`, as reqwest's default), without forbidden addresses; its
/// failures are typed ([`LookupFailed`], [`AddressRefused`]) so they are known by type.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct GuardedResolver;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Collected at once: the iterator borrows `host`, which the error takes.
            let found = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map(Iterator::collect::<Vec<SocketAddr>>);
            let found = match found {
                Ok(found) => found,
                Err(source) => return Err(LookupFailed { host, source }.into()),
            };
            let (kept, refused) = keep_allowed(found);
            match (kept.is_empty(), refused) {
                (true, Some(ip)) => Err(AddressRefused { host, ip }.into()),
                _ => Ok(Box::new(kept.into_iter()) as Addrs),
            }
        })
    }
}

/// The allowed addresses, and the first refused one.
fn keep_allowed(found: Vec<SocketAddr>) -> (Vec<SocketAddr>, Option<IpAddr>) {
    let mut refused = None;
    let kept = found
        .into_iter()
        .filter(|a| {
            let bad = is_metadata_or_unspecified(a.ip());
            if bad {
                refused.get_or_insert(a.ip());
            }
            !bad
        })
        .collect();
    (kept, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 0)
    }

    #[test]
    fn metadata_link_local_and_unspecified_addresses_are_dropped() {
        let (kept, refused) = keep_allowed(vec![addr("169.254.169.254"), addr("10.1.2.3")]);
        assert_eq!(
            (kept, refused),
            (
                vec![addr("10.1.2.3")],
                Some("169.254.169.254".parse().unwrap())
            )
        );
        let (kept, refused) = keep_allowed(vec![addr("fe80::1")]);
        assert!(kept.is_empty() && refused.is_some());
    }

    #[tokio::test]
    async fn real_names_resolve_through_the_system_resolver() {
        let name: Name = "localhost".parse().unwrap();
        let addrs: Vec<SocketAddr> = GuardedResolver.resolve(name).await.unwrap().collect();
        assert!(
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()),
            "{addrs:?}"
        );
    }
}
