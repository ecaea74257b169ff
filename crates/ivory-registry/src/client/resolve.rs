//! Where the egress rule ([`EgressRule`]) meets the connections: every name is resolved by
//! [`GuardedResolver`], which hands reqwest only the addresses the rule allows, so the address
//! judged is the address connected to (no second lookup, no DNS-rebinding gap). reqwest skips
//! the resolver for a literal address, so URLs with one are judged by [`judge_literal`] before
//! any request and on every redirect hop; the URL parser has already turned every spelling
//! (`2852039166`, `0xa9fea9fe`, `169.254.43518`, `0251.0376.0251.0376`, `[::ffff:a9fe:a9fe]`)
//! into the address it connects to.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ivory_reference::{EgressRefusal, EgressRule};
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::cause::{AddressRefused, LookupFailed};

/// The system resolver (`getaddrinfo`, as reqwest's default), without the addresses the
/// egress rule refuses; its failures are typed ([`LookupFailed`], [`AddressRefused`]) so they
/// are known by type.
#[derive(Debug, Default, Clone)]
pub(crate) struct GuardedResolver {
    rule: Arc<EgressRule>,
}

impl GuardedResolver {
    pub(crate) fn new(rule: Arc<EgressRule>) -> Self {
        Self { rule }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let rule = self.rule.clone();
        Box::pin(async move {
            // Collected at once: the iterator borrows `host`, which the error takes.
            let found = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map(Iterator::collect::<Vec<SocketAddr>>);
            let found = match found {
                Ok(found) => found,
                Err(source) => return Err(LookupFailed { host, source }.into()),
            };
            let (kept, refused) = keep_allowed(&rule, found);
            match (kept.is_empty(), refused) {
                (true, Some(refusal)) => Err(AddressRefused::new(host, refusal).into()),
                _ => Ok(Box::new(kept.into_iter()) as Addrs),
            }
        })
    }
}

/// The allowed addresses, and the first refusal.
fn keep_allowed(
    rule: &EgressRule,
    found: Vec<SocketAddr>,
) -> (Vec<SocketAddr>, Option<EgressRefusal>) {
    let mut refused = None;
    let kept = found
        .into_iter()
        .filter(|a| match rule.judge(a.ip()) {
            Ok(()) => true,
            Err(refusal) => {
                refused.get_or_insert(refusal);
                false
            }
        })
        .collect();
    (kept, refused)
}

/// The refusal of `url`'s host when it is an address literal the rule refuses (names are
/// judged by [`GuardedResolver`] when connected to).
pub(crate) fn judge_literal(rule: &EgressRule, url: &Url) -> Result<(), EgressRefusal> {
    let ip = match url.host() {
        Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
        Some(url::Host::Domain(_)) | None => return Ok(()),
    };
    rule.judge(ip)
}

#[cfg(test)]
mod tests {
    use ivory_reference::{AddressClass, PrivateNetworks};

    use super::*;

    fn addr(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 0)
    }

    #[test]
    fn metadata_link_local_and_unspecified_addresses_are_dropped() {
        let rule = EgressRule::default();
        let (kept, refused) = keep_allowed(&rule, vec![addr("169.254.169.254"), addr("10.1.2.3")]);
        assert_eq!(kept, vec![addr("10.1.2.3")]);
        assert_eq!(
            refused.map(|r| r.ip),
            Some("169.254.169.254".parse().unwrap())
        );
        let (kept, refused) = keep_allowed(&rule, vec![addr("fe80::1")]);
        assert!(kept.is_empty() && refused.is_some());
        let deny = EgressRule {
            private: PrivateNetworks::Deny,
            ..EgressRule::default()
        };
        let (kept, refused) = keep_allowed(&deny, vec![addr("10.1.2.3")]);
        assert!(kept.is_empty());
        assert_eq!(refused.map(|r| r.class), Some(AddressClass::Private));
    }

    #[test]
    fn every_spelling_of_a_literal_is_judged_as_the_address_it_connects_to() {
        let rule = EgressRule::default();
        for url in [
            "http://169.254.169.254/",
            "http://2852039166/",
            "http://0xa9fea9fe:80/",
            "http://169.254.43518/",
            "http://0251.0376.0251.0376/",
            "http://0xA9.0xFE.0xA9.0xFE/",
            "http://[::ffff:169.254.169.254]/",
            "http://[::169.254.169.254]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[fe80::1]/",
            "http://[fd00:ec2::254]/",
            "http://0/",
            "http://[::]/",
            "http://169.254.169.254./",
            "http://%31%36%39.254.169.254/",
            "http://169\u{3002}254\u{3002}169\u{3002}254/",
            "http://\u{ff11}\u{ff16}\u{ff19}.254.169.254/",
            "http://[::ffff:a9fe:a9fe]/",
            "http://[0:0:0:0:0:ffff:169.254.169.254]/",
            "http://[2002:a9fe:a9fe::]/",
            "http://[64:ff9b:1::a9fe:a9fe]/",
            "http://224.0.0.1/",
            "http://255.255.255.255/",
        ] {
            let parsed = Url::parse(url).unwrap();
            assert!(judge_literal(&rule, &parsed).is_err(), "{url}");
        }
        for url in [
            "http://127.0.0.1:5000/",
            "http://10.0.0.1/",
            "https://ghcr.io/",
        ] {
            let parsed = Url::parse(url).unwrap();
            assert!(judge_literal(&rule, &parsed).is_ok(), "{url}");
        }
    }

    /// glibc's getaddrinfo reads `2852039166`, `0xa9fea9fe`, `169.254.43518` and octal as
    /// 169.254.169.254: the resolver's real answer is judged, whatever name asked for it.
    #[tokio::test]
    async fn numeric_spellings_the_system_resolver_reads_are_refused() {
        for spelling in [
            "2852039166",
            "0xa9fea9fe",
            "169.254.43518",
            "0251.0376.0251.0376",
        ] {
            let name: Name = spelling.parse().unwrap();
            let err = GuardedResolver::default()
                .resolve(name)
                .await
                .err()
                .unwrap_or_else(|| panic!("{spelling} resolved"));
            let refused = err
                .downcast_ref::<AddressRefused>()
                .unwrap_or_else(|| panic!("{spelling}: {err}"));
            assert_eq!(refused.ip, "169.254.169.254".parse::<IpAddr>().unwrap());
        }
    }

    #[tokio::test]
    async fn real_names_resolve_through_the_system_resolver() {
        let name: Name = "localhost".parse().unwrap();
        let addrs: Vec<SocketAddr> = GuardedResolver::default()
            .resolve(name)
            .await
            .unwrap()
            .collect();
        assert!(
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()),
            "{addrs:?}"
        );
    }
}
