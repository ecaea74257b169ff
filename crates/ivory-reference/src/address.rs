//! The egress rule: which addresses ivory connects to when a request, a registry or a
//! certificate chooses the host. One rule for every connection (registry, redirect target,
//! token realm, CRL distribution point, image data), judged on the address itself, after name
//! resolution, so no spelling of a host and no DNS answer reaches an address it refuses.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The flag that names addresses the rule lets through whatever their class.
pub const EGRESS_ALLOW_FLAG: &str = "--egress-allow";
/// The flag that governs loopback and private addresses.
pub const EGRESS_PRIVATE_FLAG: &str = "--egress-private";

/// AWS's IPv6 instance-metadata address, `fd00:ec2::254`.
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
/// Metadata services outside 169.254.0.0/16: Alibaba Cloud (100.100.100.200), Azure's host
/// channel (WireServer, 168.63.129.16), Oracle Cloud's legacy address (192.0.0.192).
const METADATA_V4: [Ipv4Addr; 3] = [
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(168, 63, 129, 16),
    Ipv4Addr::new(192, 0, 0, 192),
];

/// What an address is, as far as the egress rule cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressClass {
    /// A cloud metadata service's address outside link-local (`fd00:ec2::254`,
    /// `100.100.100.200`, `168.63.129.16`, `192.0.0.192`).
    Metadata,
    /// `169.254.0.0/16` (where 169.254.169.254 answers) and `fe80::/10`.
    LinkLocal,
    /// `0.0.0.0/8` and `::`, which reach the local host.
    Unspecified,
    /// `224.0.0.0/4` and `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `240.0.0.0/4`, reserved for future use.
    Reserved,
    /// `127.0.0.0/8` and `::1`.
    Loopback,
    /// RFC 1918 (`10/8`, `172.16/12`, `192.168/16`), shared address space (`100.64/10`),
    /// unique-local (`fc00::/7`) and site-local (`fec0::/10`) addresses, and the local-use
    /// NAT64 prefix (`64:ff9b:1::/48`).
    Private,
    /// Anything else.
    Public,
}

impl AddressClass {
    /// The class of `ip`. An IPv6 address that carries an IPv4 address (IPv4-mapped
    /// `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d` and
    /// `64:ff9b:1::/48` with the address in its last 32 bits, 6to4 `2002:AABB:CCDD::`) is of
    /// that IPv4 address's class when the IPv4 class is not public: the kernel, a NAT64
    /// gateway or a relay delivers such an address to the IPv4 host.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::of_v4(v4),
            IpAddr::V6(v6) => Self::of_v6(v6),
        }
    }

    fn of_v4(v4: Ipv4Addr) -> Self {
        let [a, b, ..] = v4.octets();
        if METADATA_V4.contains(&v4) {
            Self::Metadata
        } else if v4.is_link_local() {
            Self::LinkLocal
        } else if a == 0 {
            Self::Unspecified
        } else if v4.is_broadcast() {
            Self::Broadcast
        } else if v4.is_multicast() {
            Self::Multicast
        } else if a >= 240 {
            Self::Reserved
        } else if v4.is_loopback() {
            Self::Loopback
        } else if v4.is_private() || (a == 100 && (b & 0xc0) == 64) {
            Self::Private
        } else {
            Self::Public
        }
    }

    fn of_v6(v6: Ipv6Addr) -> Self {
        let s = v6.segments();
        if v6 == AWS_METADATA_V6 {
            return Self::Metadata;
        }
        if v6.is_unspecified() {
            return Self::Unspecified;
        }
        if v6.is_loopback() {
            return Self::Loopback;
        }
        if let Some(v4) = embedded_v4(v6) {
            let class = Self::of_v4(v4);
            if class != Self::Public {
                return class;
            }
        }
        match s[0] {
            x if (x & 0xffc0) == 0xfe80 => Self::LinkLocal,
            x if (x & 0xff00) == 0xff00 => Self::Multicast,
            x if (x & 0xffc0) == 0xfec0 || (x & 0xfe00) == 0xfc00 => Self::Private,
            0x64 if s[1] == 0xff9b && s[2] == 1 => Self::Private,
            _ => Self::Public,
        }
    }

    /// Refused unless allow-listed, whatever [`PrivateNetworks`] says.
    pub fn always_refused(self) -> bool {
        !matches!(self, Self::Loopback | Self::Private | Self::Public)
    }

    /// A few words for a person: `link-local (cloud metadata)`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Metadata => "a cloud metadata address",
            Self::LinkLocal => "link-local (where cloud metadata services answer)",
            Self::Unspecified => "unspecified (the local host)",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Reserved => "reserved",
            Self::Loopback => "loopback",
            Self::Private => "a private network address",
            Self::Public => "public",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// The IPv4 address an IPv6 address carries, for the forms that deliver to it.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let [.., a, b, c, d] = v6.octets();
    let last = Ipv4Addr::new(a, b, c, d);
    let first_five_zero = s[..5].iter().all(|x| *x == 0);
    if first_five_zero && s[5] == 0xffff {
        return Some(last);
    }
    if first_five_zero && s[5] == 0 && !v6.is_unspecified() && !v6.is_loopback() {
        // IPv4-compatible; `::` and `::1` are IPv6's own unspecified and loopback.
        return Some(last);
    }
    if s[0] == 0x64 && s[1] == 0xff9b && (s[2..6].iter().all(|x| *x == 0) || s[2] == 1) {
        return Some(last);
    }
    if s[0] == 0x2002 {
        let [_, _, a, b, c, d, ..] = v6.octets();
        return Some(Ipv4Addr::new(a, b, c, d));
    }
    None
}

/// Whether loopback and private addresses may be connected to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PrivateNetworks {
    /// Allowed: in-cluster registries and mirrors live on private addresses, and a kubelet
    /// pulls from them as well.
    #[default]
    Allow,
    /// Refused unless allow-listed.
    Deny,
}

/// An address range of the operator's allow-list (`10.0.0.0/8`, `fd00:ec2::254/128`, or one
/// address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// Text that is not `ADDRESS[/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an address range (ADDRESS or ADDRESS/PREFIX, e.g. 10.0.0.0/8)")]
pub struct CidrError(pub String);

impl Cidr {
    /// Whether `ip` lies in this range (an IPv4 range also holds that address's IPv6 forms,
    /// which [`AddressClass::of`] judges as the IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            (IpAddr::V4(_), IpAddr::V6(v6)) => {
                embedded_v4(v6).is_some_and(|v4| self.contains(IpAddr::V4(v4)))
            }
            (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || CidrError(s.to_owned());
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        // Only the canonical dotted and colon forms: an operator's range is read exactly.
        let network: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().map_err(|_| bad())?
            }
            Some(_) => return Err(bad()),
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Self { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The egress rule of one process: always-refused classes ([`AddressClass::always_refused`]),
/// loopback and private addresses as [`PrivateNetworks`] says, and the operator's allow-list
/// before both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressRule {
    /// Ranges connected to whatever their class (`--egress-allow`).
    pub allow: Vec<Cidr>,
    /// Loopback and private addresses (`--egress-private`).
    pub private: PrivateNetworks,
}

/// An address the egress rule refuses, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{ip} is {class}; an operator allows it with {}", remedy(*.class, *.ip))]
pub struct EgressRefusal {
    /// The address that would have been connected to.
    pub ip: IpAddr,
    /// Its class.
    pub class: AddressClass,
}

fn remedy(class: AddressClass, ip: IpAddr) -> String {
    // An IPv6 form judged as its IPv4 address is allowed by naming that address, which
    // allows all its forms.
    let ip = match ip {
        IpAddr::V6(v6) => embedded_v4(v6)
            .filter(|v4| AddressClass::of_v4(*v4) == class)
            .map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    };
    match class {
        AddressClass::Loopback | AddressClass::Private => {
            format!("{EGRESS_PRIVATE_FLAG}=allow or {EGRESS_ALLOW_FLAG} {ip}")
        }
        _ => format!("{EGRESS_ALLOW_FLAG} {ip}"),
    }
}

impl EgressRule {
    /// `Ok` when ivory may connect to `ip`.
    pub fn judge(&self, ip: IpAddr) -> Result<(), EgressRefusal> {
        let class = AddressClass::of(ip);
        let refused = match class {
            AddressClass::Public => false,
            AddressClass::Loopback | AddressClass::Private => self.private == PrivateNetworks::Deny,
            _ => true,
        };
        if refused && !self.allow.iter().any(|c| c.contains(ip)) {
            return Err(EgressRefusal { ip, class });
        }
        Ok(())
    }
}

/// Link-local, cloud metadata, unspecified, multicast, broadcast and reserved addresses, in
/// any of their IPv6 forms: what [`EgressRule`] refuses whatever the private-network setting.
/// The engine refuses them for image data a request asks about, before any registry call.
pub fn is_metadata_or_unspecified(ip: IpAddr) -> bool {
    AddressClass::of(ip).always_refused()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn metadata_link_local_and_unspecified_addresses_are_named() {
        for bad in [
            "169.254.169.254",
            "169.254.170.2",
            "0.0.0.0",
            "0.1.2.3",
            "fd00:ec2::254",
            "fe80::1",
            "febf::1",
            "::",
            "::ffff:169.254.169.254",
            "::169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "::ffff:0.0.0.0",
            "224.0.0.1",
            "ff02::1",
            "255.255.255.255",
            "240.0.0.1",
            "100.100.100.200",
            "168.63.129.16",
            "192.0.0.192",
            "::ffff:168.63.129.16",
        ] {
            assert!(is_metadata_or_unspecified(ip(bad)), "{bad}");
            assert!(EgressRule::default().judge(ip(bad)).is_err(), "{bad}");
        }
        for good in [
            "127.0.0.1",
            "10.0.0.1",
            "::1",
            "2001:db8::1",
            "192.168.1.1",
            "8.8.8.8",
            "64:ff9b::808:808",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_metadata_or_unspecified(ip(good)), "{good}");
            assert!(EgressRule::default().judge(ip(good)).is_ok(), "{good}");
        }
    }

    #[test]
    fn classes_of_private_and_embedded_forms() {
        for (addr, class) in [
            ("127.0.0.1", AddressClass::Loopback),
            ("::1", AddressClass::Loopback),
            ("::ffff:127.0.0.1", AddressClass::Loopback),
            ("10.1.2.3", AddressClass::Private),
            ("172.31.0.1", AddressClass::Private),
            ("100.64.0.1", AddressClass::Private),
            ("100.128.0.1", AddressClass::Public),
            ("fd12::1", AddressClass::Private),
            ("64:ff9b:1::808:808", AddressClass::Private),
            ("64:ff9b::a00:1", AddressClass::Private),
            ("2002:a00:1::", AddressClass::Private),
            ("2002:808:808::", AddressClass::Public),
            ("::ffff:a9fe:a9fe", AddressClass::LinkLocal),
            ("fd00:ec2::254", AddressClass::Metadata),
        ] {
            assert_eq!(AddressClass::of(ip(addr)), class, "{addr}");
        }
    }

    #[test]
    fn private_networks_follow_the_setting_and_the_allow_list_wins() {
        let deny = EgressRule {
            allow: vec!["127.0.0.1".parse().unwrap()],
            private: PrivateNetworks::Deny,
        };
        assert!(deny.judge(ip("127.0.0.1")).is_ok());
        assert!(deny.judge(ip("::ffff:127.0.0.1")).is_ok());
        let refusal = deny.judge(ip("10.0.0.1")).unwrap_err();
        assert_eq!(refusal.class, AddressClass::Private);
        let text = refusal.to_string();
        assert!(
            text.contains("10.0.0.1") && text.contains("--egress-private=allow"),
            "{text}"
        );
        let metadata = EgressRule {
            allow: vec!["169.254.169.254/32".parse().unwrap()],
            private: PrivateNetworks::Allow,
        };
        assert!(metadata.judge(ip("169.254.169.254")).is_ok());
        assert!(metadata.judge(ip("169.254.169.253")).is_err());
        let text = EgressRule::default()
            .judge(ip("169.254.169.254"))
            .unwrap_err()
            .to_string();
        assert!(text.contains("--egress-allow 169.254.169.254"), "{text}");
        let text = EgressRule::default()
            .judge(ip("::ffff:169.254.169.254"))
            .unwrap_err()
            .to_string();
        assert!(text.ends_with("--egress-allow 169.254.169.254"), "{text}");
    }

    #[test]
    fn ranges_parse_exactly() {
        for (text, inside, outside) in [
            ("10.0.0.0/8", "10.255.0.1", "11.0.0.1"),
            ("0.0.0.0/0", "169.254.169.254", "::1"),
            ("169.254.169.254", "169.254.169.254", "169.254.169.253"),
            ("fd00:ec2::/32", "fd00:ec2::254", "fd00:ec3::1"),
            ("::/0", "fe80::1", "127.0.0.1"),
        ] {
            let cidr: Cidr = text.parse().unwrap();
            assert!(cidr.contains(ip(inside)), "{text} {inside}");
            assert!(!cidr.contains(ip(outside)), "{text} {outside}");
        }
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "2852039166",
            "0xa9fea9fe",
            "169.254.43518",
            "10.0.0.0/8/8",
            "10.0.0.0/0008",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
