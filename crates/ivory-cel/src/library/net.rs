//! Kubernetes `ip` and `cidr` libraries.

use std::net::IpAddr;

use cel::Value;
use cel::objects::Opaque;
use ipnet::IpNet;

use super::{FunctionError, Registry, opaque, wrap};

pub(super) const IP_TYPE: &str = "net.IP";
pub(super) const CIDR_TYPE: &str = "net.IPPrefix";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ip(pub IpAddr);

impl Opaque for Ip {
    fn runtime_type_name(&self) -> &str {
        IP_TYPE
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cidr(pub IpNet);

impl Opaque for Cidr {
    fn runtime_type_name(&self) -> &str {
        CIDR_TYPE
    }
}

pub(super) fn to_string(o: &dyn Opaque) -> Option<String> {
    o.downcast_ref::<Ip>()
        .map(|ip| ip.0.to_string())
        .or_else(|| o.downcast_ref::<Cidr>().map(|c| c.0.to_string()))
}

/// Kubernetes rules: no zones, no IPv4-mapped IPv6 addresses.
pub(crate) fn parse_ip(s: &str) -> Result<IpAddr, FunctionError> {
    if s.contains('%') {
        return Err(FunctionError::Invalid(format!(
            "IP address with zone value is not allowed: {s}"
        )));
    }
    let ip: IpAddr = s.parse().map_err(|e| {
        FunctionError::Invalid(format!(
            "IP Address {s:?} parse error during conversion from string: {e}"
        ))
    })?;
    if let IpAddr::V6(v6) = ip
        && v6.to_ipv4_mapped().is_some()
    {
        return Err(FunctionError::Invalid(format!(
            "IPv4-mapped IPv6 address is not allowed: {s}"
        )));
    }
    Ok(ip)
}

pub(crate) fn parse_cidr(s: &str) -> Result<IpNet, FunctionError> {
    let Some((addr, _)) = s.split_once('/') else {
        return Err(FunctionError::Invalid(format!(
            "network address parse error during conversion from string: {s:?} has no prefix length"
        )));
    };
    if addr.contains('%') {
        return Err(FunctionError::Invalid(format!(
            "CIDR with zone value is not allowed: {s}"
        )));
    }
    parse_ip(addr)?;
    s.parse::<IpNet>().map_err(|e| {
        FunctionError::Invalid(format!(
            "network address parse error during conversion from string: {s:?}: {e}"
        ))
    })
}

fn is_link_local_multicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => v6.segments()[0] & 0xff0f == 0xff02,
    }
}

fn is_link_local_unicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// Go `netip.Addr.IsGlobalUnicast`.
fn is_global_unicast(ip: &IpAddr) -> bool {
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || is_link_local_unicast(ip)
        || broadcast)
}

fn ip_member(a: &[Value], f: fn(&IpAddr) -> Value) -> Option<Result<Value, FunctionError>> {
    match a {
        [v] => opaque::<Ip>(v).map(|ip| Ok(f(&ip.0))),
        _ => None,
    }
}

fn cidr_member(a: &[Value], f: fn(&IpNet) -> Value) -> Option<Result<Value, FunctionError>> {
    match a {
        [v] => opaque::<Cidr>(v).map(|c| Ok(f(&c.0))),
        _ => None,
    }
}

pub(super) fn register(r: &mut Registry) {
    r.add("ip", |a| match a {
        [Value::String(s)] => Some(parse_ip(s).map(|ip| wrap(Ip(ip)))),
        // cidr.ip(): the address part, as written.
        [v] => opaque::<Cidr>(v).map(|c| Ok(wrap(Ip(c.0.addr())))),
        _ => None,
    });
    r.add("isIP", |a| match a {
        [Value::String(s)] => Some(Ok(Value::Bool(parse_ip(s).is_ok()))),
        _ => None,
    });
    r.add("ip.isCanonical", |a| match a {
        [Value::String(s)] => Some(parse_ip(s).map(|ip| Value::Bool(ip.to_string() == **s))),
        _ => None,
    });
    r.add("family", |a| {
        ip_member(a, |ip| Value::Int(if ip.is_ipv4() { 4 } else { 6 }))
    });
    r.add("isUnspecified", |a| {
        ip_member(a, |ip| Value::Bool(ip.is_unspecified()))
    });
    r.add("isLoopback", |a| {
        ip_member(a, |ip| Value::Bool(ip.is_loopback()))
    });
    r.add("isLinkLocalMulticast", |a| {
        ip_member(a, |ip| Value::Bool(is_link_local_multicast(ip)))
    });
    r.add("isLinkLocalUnicast", |a| {
        ip_member(a, |ip| Value::Bool(is_link_local_unicast(ip)))
    });
    r.add("isGlobalUnicast", |a| {
        ip_member(a, |ip| Value::Bool(is_global_unicast(ip)))
    });

    r.add("cidr", |a| match a {
        [Value::String(s)] => Some(parse_cidr(s).map(|c| wrap(Cidr(c)))),
        _ => None,
    });
    r.add("isCIDR", |a| match a {
        [Value::String(s)] => Some(Ok(Value::Bool(parse_cidr(s).is_ok()))),
        _ => None,
    });
    r.add("containsIP", |a| match a {
        [c, other] => {
            let c = opaque::<Cidr>(c)?;
            let ip = match other {
                Value::String(s) => match parse_ip(s) {
                    Ok(ip) => ip,
                    Err(e) => return Some(Err(e)),
                },
                v => opaque::<Ip>(v)?.0,
            };
            Some(Ok(Value::Bool(c.0.contains(&ip))))
        }
        _ => None,
    });
    r.add("containsCIDR", |a| match a {
        [c, other] => {
            let c = opaque::<Cidr>(c)?;
            let inner = match other {
                Value::String(s) => match parse_cidr(s) {
                    Ok(n) => n,
                    Err(e) => return Some(Err(e)),
                },
                v => opaque::<Cidr>(v)?.0,
            };
            Some(Ok(Value::Bool(c.0.contains(&inner))))
        }
        _ => None,
    });
    r.add("masked", |a| cidr_member(a, |c| wrap(Cidr(c.trunc()))));
    r.add("prefixLength", |a| {
        cidr_member(a, |c| Value::Int(i64::from(c.prefix_len())))
    });
}
