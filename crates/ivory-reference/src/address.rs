//! Addresses an image reference may name that ivory never connects to on a request's say.

use std::net::IpAddr;

/// AWS's IPv6 instance-metadata address, `fd00:ec2::254`.
const AWS_METADATA_V6: [u16; 8] = [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254];

/// Link-local addresses (cloud metadata services answer on 169.254.169.254, and fe80::/10
/// neighbours), AWS's IPv6 metadata address, unspecified ones (which reach the local host),
/// and the IPv4-mapped forms of these: the registry client refuses to connect to them, and the
/// engine refuses to name them for image data a request asks about.
pub fn is_metadata_or_unspecified(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            v6.is_unspecified()
                || v6.segments() == AWS_METADATA_V6
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| is_metadata_or_unspecified(IpAddr::V4(v4)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_link_local_and_unspecified_addresses_are_named() {
        for bad in [
            "169.254.169.254",
            "0.0.0.0",
            "fd00:ec2::254",
            "fe80::1",
            "::",
            "::ffff:169.254.169.254",
        ] {
            assert!(is_metadata_or_unspecified(bad.parse().unwrap()), "{bad}");
        }
        for good in ["127.0.0.1", "10.0.0.1", "::1", "2001:db8::1", "192.168.1.1"] {
            assert!(!is_metadata_or_unspecified(good.parse().unwrap()), "{good}");
        }
    }
}
