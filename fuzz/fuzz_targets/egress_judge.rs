//! The egress rule: the operator's address ranges (`--egress-allow`), the classes of every
//! address and its IPv6 forms, and URL hosts as the registry client judges them.
//!
//! Input: a mode byte, then
//! - 0: text read as a range (`Cidr`): an accepted range prints as it parses, holds its own
//!   network, and a /32 or /128 holds nothing else.
//! - 1: 4 bytes of an IPv4 address and 16 of an IPv6 one: an always-refused IPv4 address is
//!   refused in its IPv4-mapped, IPv4-compatible and NAT64 forms too, of the same class; a
//!   range naming the IPv4 address allows all its forms; the default rule refuses exactly the
//!   always-refused classes.
//! - 2: text as a URL host: a URL `checked_url` lets through names no address the default rule
//!   refuses, whatever spelling the URL parser read (decimal, hex, octal, short dotted, IPv6
//!   forms); a refusal names an address the rule refuses.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ivory_reference::{AddressClass, Cidr, EgressRule, PrivateNetworks};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => ranges(rest),
        1 => addresses(rest),
        _ => url_hosts(rest),
    }
});

fn ranges(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cidr) = text.parse::<Cidr>() else {
        return;
    };
    let shown = cidr.to_string();
    assert_eq!(shown.parse::<Cidr>().ok(), Some(cidr), "{text:?}");
    let network: IpAddr = shown
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("a range prints its network");
    assert!(cidr.contains(network), "{text:?}");
    let other = match network {
        IpAddr::V4(v4) if shown.ends_with("/32") => IpAddr::V4(Ipv4Addr::from(u32::from(v4) ^ 1)),
        IpAddr::V6(v6) if shown.ends_with("/128") => IpAddr::V6(Ipv6Addr::from(u128::from(v6) ^ 1)),
        _ => return,
    };
    assert!(!cidr.contains(other), "{text:?}");
}

fn addresses(data: &[u8]) {
    let (Some(v4), Some(v6)) = (data.get(..4), data.get(4..20)) else {
        return;
    };
    let v4 = Ipv4Addr::new(v4[0], v4[1], v4[2], v4[3]);
    let mut octets = [0u8; 16];
    octets.copy_from_slice(v6);
    let v6 = Ipv6Addr::from(octets);
    let rule = EgressRule::default();
    for ip in [IpAddr::V4(v4), IpAddr::V6(v6)] {
        let class = AddressClass::of(ip);
        assert_eq!(rule.judge(ip).is_err(), class.always_refused(), "{ip}");
        let deny = EgressRule {
            private: PrivateNetworks::Deny,
            ..EgressRule::default()
        };
        assert_eq!(
            deny.judge(ip).is_err(),
            class != AddressClass::Public,
            "{ip}"
        );
    }
    let class = AddressClass::of(IpAddr::V4(v4));
    let bits = u32::from(v4);
    let mapped = Ipv6Addr::from(0xffff_0000_0000u128 | u128::from(bits));
    let nat64 = Ipv6Addr::from((0x64_ff9bu128 << 96) | u128::from(bits));
    let mut forms = vec![mapped, nat64];
    if bits > 1 {
        forms.push(Ipv6Addr::from(u128::from(bits)));
    }
    let allow = EgressRule {
        allow: vec![format!("{v4}/32").parse().expect("a /32 range")],
        private: PrivateNetworks::Deny,
    };
    for form in forms {
        if class != AddressClass::Public {
            assert_eq!(AddressClass::of(IpAddr::V6(form)), class, "{v4} as {form}");
        }
        assert!(allow.judge(IpAddr::V6(form)).is_ok(), "{v4} as {form}");
    }
}

fn url_hosts(data: &[u8]) {
    let Ok(host) = std::str::from_utf8(data) else {
        return;
    };
    if host.contains(['/', '?', '#', '@', '\\']) {
        return;
    }
    let url = format!("http://{host}/a.crl");
    let rule = EgressRule::default();
    match ivory_registry::checked_url(&url) {
        Ok(parsed) => {
            // What the fetcher would connect to, read back from the URL it would request.
            let Some(text) = parsed.host_str() else {
                panic!("{host:?} passed without a host");
            };
            let literal = text.trim_start_matches('[').trim_end_matches(']');
            if let Ok(ip) = literal.parse::<IpAddr>() {
                assert!(rule.judge(ip).is_ok(), "{host:?} passed as {ip}");
            }
        }
        Err(ivory_registry::UrlFetchError::AddressRefused(refusal)) => {
            assert!(refusal.class.always_refused(), "{host:?}: {refusal}");
            assert!(rule.judge(refusal.ip).is_err(), "{host:?}: {refusal}");
        }
        Err(_) => {}
    }
}
