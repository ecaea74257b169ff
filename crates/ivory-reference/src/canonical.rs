//! The canonical spelling of an image reference, for policy matching.
//!
//! One image has many spellings the kubelet pulls identically: `GHCR.IO/acme/app`,
//! `ghcr.io:443/acme/app`, `localhost:05000/app`, `busybox`, `library/busybox`,
//! `index.docker.io/library/busybox`, `registry-1.docker.io/library/busybox`. A policy names one
//! of them in a glob, so matching only the string as written lets the others through. The
//! canonical form lower-cases the host, drops the default ports (443 and 80), strips leading
//! zeros from other ports, spells every Docker Hub alias `docker.io` and fills in `library/`.
//!
//! The split follows the kubelet's rules (docker distribution `ParseNormalizedNamed`: the first
//! component is a host when it has a `.` or `:`, is `localhost` or has an upper-case letter) and
//! needs no other validation, so a reference ggcr refuses (a `sha512` digest, say) still gets a
//! canonical host and is matched — and then refused where it is verified.

use std::borrow::Cow;

/// Docker Hub as it is spelled in canonical form (what Kyverno's normalisation and policy
/// globs such as `docker.io/*` use).
pub const CANONICAL_DOCKER_HUB: &str = "docker.io";
/// Host names that all reach Docker Hub's registry.
const DOCKER_HUB_ALIASES: [&str; 4] = [
    "docker.io",
    "index.docker.io",
    "registry-1.docker.io",
    "registry.hub.docker.com",
];
/// Ports a registry host answers on when none is written (HTTPS, and HTTP for local registries).
const DEFAULT_PORTS: [&str; 2] = ["443", "80"];
const IMPLICIT_TAG: &str = "latest";

/// A reference split into its parts as written, without validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Parts<'a> {
    /// `None` when the first component is not a host (Docker Hub).
    host: Option<&'a str>,
    path: &'a str,
    tag: Option<&'a str>,
    digest: Option<&'a str>,
}

impl<'a> Parts<'a> {
    fn split(image: &'a str) -> Self {
        let (name_and_tag, digest) = match image.split_once('@') {
            Some((name, digest)) => (name, Some(digest)),
            None => (image, None),
        };
        // A ':' followed by a '/' belongs to a registry port, not a tag.
        let (name, tag) = match name_and_tag.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
            _ => (name_and_tag, None),
        };
        let (host, path) = match name.split_once('/') {
            Some((first, rest)) if is_host(first) => (Some(first), rest),
            _ => (None, name),
        };
        Self {
            host,
            path,
            tag,
            digest,
        }
    }
}

fn is_host(component: &str) -> bool {
    component.contains(['.', ':'])
        || component == "localhost"
        || component.bytes().any(|b| b.is_ascii_uppercase())
}

/// The canonical host: lower-cased, default port dropped, leading zeros of the port removed,
/// Docker Hub aliases (and a missing host) spelled `docker.io`. Borrows when nothing changes.
/// A host that would no longer read as a host once respelled (`MYREG` lower-cased, `[1]:80`
/// without its port) keeps its spelling: respelled, it would name a Docker Hub namespace.
pub fn canonical_host(host: Option<&str>) -> Cow<'_, str> {
    let Some(host) = host else {
        return Cow::Borrowed(CANONICAL_DOCKER_HUB);
    };
    let respelled = respell_host(host);
    if is_host(&respelled) {
        respelled
    } else {
        Cow::Borrowed(host)
    }
}

/// Lower case, default port dropped, port zeros stripped, Docker Hub aliases folded.
fn respell_host(host: &str) -> Cow<'_, str> {
    let lower: Cow<'_, str> = if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    };
    let (name, port) = split_port(&lower);
    // Only a numeric port is respelled; anything else is no reference a registry answers to,
    // and is matched as written (respelling it again would find another "port").
    if port.is_some_and(|p| !p.bytes().all(|b| b.is_ascii_digit())) || !is_host_name(name) {
        return lower;
    }
    let port = port.map(|p| {
        let trimmed = p.trim_start_matches('0');
        if trimmed.is_empty() && !p.is_empty() {
            "0"
        } else {
            trimmed
        }
    });
    let port = port.filter(|p| !DEFAULT_PORTS.contains(p));
    if port.is_none() && DOCKER_HUB_ALIASES.contains(&name) {
        return Cow::Borrowed(CANONICAL_DOCKER_HUB);
    }
    let unchanged = name.len() + port.map_or(0, |p| p.len() + 1) == lower.len();
    if unchanged {
        return lower;
    }
    Cow::Owned(match port {
        Some(p) => format!("{name}:{p}"),
        None => name.to_owned(),
    })
}

/// Whether `name` (an authority without its port) is one host name: not empty, with no other
/// `:` unless it is a whole bracketed IPv6 literal.
fn is_host_name(name: &str) -> bool {
    match name.strip_prefix('[') {
        Some(rest) => rest
            .strip_suffix(']')
            .is_some_and(|inner| !inner.contains(['[', ']'])),
        None => !name.is_empty() && !name.contains([':', '[', ']']),
    }
}

/// `(host, port)` of an authority; IPv6 literals keep their brackets.
fn split_port(authority: &str) -> (&str, Option<&str>) {
    let after_literal = if authority.starts_with('[') {
        authority.find(']').map_or(authority.len(), |i| i + 1)
    } else {
        0
    };
    match authority[after_literal..].rfind(':') {
        Some(i) => {
            let at = after_literal + i;
            (&authority[..at], Some(&authority[at + 1..]))
        }
        None => (authority, None),
    }
}

/// The canonical spelling of `image`, tag and digest as written. Borrows when `image` is
/// already canonical (the common case), so matching allocates nothing then.
pub fn canonical(image: &str) -> Cow<'_, str> {
    let parts = Parts::split(image);
    let host = canonical_host(parts.host);
    let needs_library = host == CANONICAL_DOCKER_HUB && !parts.path.contains('/');
    if !needs_library && parts.host == Some(host.as_ref()) {
        return Cow::Borrowed(image);
    }
    Cow::Owned(render(
        &host,
        parts.path,
        needs_library,
        parts.tag,
        parts.digest,
    ))
}

fn render(
    host: &str,
    path: &str,
    library: bool,
    tag: Option<&str>,
    digest: Option<&str>,
) -> String {
    let mut out = String::with_capacity(
        host.len() + path.len() + 16 + tag.map_or(0, str::len) + digest.map_or(0, str::len),
    );
    out.push_str(host);
    out.push('/');
    if library {
        out.push_str("library/");
    }
    out.push_str(path);
    if let Some(tag) = tag {
        out.push(':');
        out.push_str(tag);
    }
    if let Some(digest) = digest {
        out.push('@');
        out.push_str(digest);
    }
    out
}

/// Every spelling `image` is matched under besides the string as written, de-duplicated, in
/// this order: the canonical form (tag and digest as written); Kyverno's normalised form (what
/// its mutating webhook matches: `docker.io/` prefixed when no host is written, the tag dropped
/// next to a digest, `:latest` when neither is written); and the canonical form of that, so a
/// glob ending in `:*` or `@*` also sees an image written without a tag or with both.
pub fn alternative_spellings(image: &str) -> Vec<String> {
    let parts = Parts::split(image);
    let host = canonical_host(parts.host);
    let library = host == CANONICAL_DOCKER_HUB && !parts.path.contains('/');
    let normalised_tag = match parts.digest {
        Some(_) => None,
        None => Some(parts.tag.unwrap_or(IMPLICIT_TAG)),
    };
    let candidates = [
        render(&host, parts.path, library, parts.tag, parts.digest),
        render(
            parts.host.unwrap_or(CANONICAL_DOCKER_HUB),
            parts.path,
            false,
            normalised_tag,
            parts.digest,
        ),
        render(&host, parts.path, library, normalised_tag, parts.digest),
    ];
    let mut out: Vec<String> = Vec::with_capacity(candidates.len());
    for candidate in candidates {
        if candidate != image && !out.contains(&candidate) {
            out.push(candidate);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `image_reference` fuzz target (crash-b2c25869, then `[1]:80/0`): lower-casing
    /// `F` in `F/`, or dropping the port of `[1]:80`, made the host a Docker Hub namespace, so
    /// the canonical form named another image and was not idempotent.
    #[test]
    fn fuzz_crashes_hosts_that_would_stop_being_hosts_keep_their_spelling() {
        for image in ["F/", "MYREG/app:1", "F/app@sha256:ab"] {
            let once = canonical(image);
            assert_eq!(once, image, "{image}");
            assert_eq!(canonical(&once), once, "{image}");
        }
        assert_eq!(canonical("LOCALHOST/app"), "localhost/app");
        assert_eq!(canonical("MYREG:5000/app"), "myreg:5000/app");
        assert_eq!(canonical("GHCR.IO/acme/app"), "ghcr.io/acme/app");
        // Found next: `[1]` is a host only with its port.
        assert_eq!(canonical("[1]:80/0"), "[1]:80/0");
        assert_eq!(canonical("[::1]:80/app"), "[::1]/app");
        // And a "port" that is not a number.
        for odd in ["1:00hhosst:80/6", ":0555:80/6", "[1:80/6"] {
            assert_eq!(canonical(odd), odd, "{odd}");
        }
    }

    const DIGEST: &str = "sha256:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501";

    #[test]
    fn canonical_hosts() {
        let cases = [
            (None, "docker.io"),
            (Some("ghcr.io"), "ghcr.io"),
            (Some("GHCR.IO"), "ghcr.io"),
            (Some("ghcr.io:443"), "ghcr.io"),
            (Some("ghcr.io:0443"), "ghcr.io"),
            (Some("ghcr.io:80"), "ghcr.io"),
            (Some("LOCALHOST:5000"), "localhost:5000"),
            (Some("localhost:05000"), "localhost:5000"),
            (Some("localhost:0"), "localhost:0"),
            (Some("localhost:000"), "localhost:0"),
            (Some("index.docker.io"), "docker.io"),
            (Some("registry-1.docker.io"), "docker.io"),
            (Some("Registry-1.Docker.IO:443"), "docker.io"),
            (Some("registry.hub.docker.com"), "docker.io"),
            (Some("docker.io:5000"), "docker.io:5000"),
            (Some("[::1]:05000"), "[::1]:5000"),
            (Some("[::1]"), "[::1]"),
            (Some("[FE80::1]:443"), "[fe80::1]"),
        ];
        for (host, want) in cases {
            assert_eq!(canonical_host(host), want, "{host:?}");
        }
    }

    #[test]
    fn canonical_spellings_of_the_brief() {
        let cases = [
            (
                format!("LOCALHOST:5000/app@{DIGEST}"),
                format!("localhost:5000/app@{DIGEST}"),
            ),
            (
                format!("ghcr.io:443/acme/app@{DIGEST}"),
                format!("ghcr.io/acme/app@{DIGEST}"),
            ),
            ("GHCR.IO/acme/app:v1".into(), "ghcr.io/acme/app:v1".into()),
            (
                format!("busybox@{DIGEST}"),
                format!("docker.io/library/busybox@{DIGEST}"),
            ),
            (
                format!("library/busybox@{DIGEST}"),
                format!("docker.io/library/busybox@{DIGEST}"),
            ),
            (
                "index.docker.io/library/busybox:1".into(),
                "docker.io/library/busybox:1".into(),
            ),
            (
                "registry-1.docker.io/library/busybox".into(),
                "docker.io/library/busybox".into(),
            ),
            (
                "docker.io/busybox:1".into(),
                "docker.io/library/busybox:1".into(),
            ),
            (
                "acme/app:1@sha512:abc".into(),
                "docker.io/acme/app:1@sha512:abc".into(),
            ),
            ("localhost/app".into(), "localhost/app".into()),
            // A host only by its upper case keeps it (`foo/app` is another image).
            ("Foo/app".into(), "Foo/app".into()),
        ];
        for (image, want) in cases {
            assert_eq!(canonical(&image), want, "{image}");
        }
    }

    #[test]
    fn canonical_borrows_when_unchanged() {
        for image in [
            "ghcr.io/acme/app:v1",
            "docker.io/library/nginx",
            "localhost:5000/app",
            "[::1]:5000/app",
        ] {
            assert!(
                matches!(canonical(image), Cow::Borrowed(s) if s == image),
                "{image}"
            );
        }
    }

    #[test]
    fn alternative_spellings_cover_tags_and_kyverno_normalisation() {
        assert_eq!(
            alternative_spellings("busybox"),
            [
                "docker.io/library/busybox",
                "docker.io/busybox:latest",
                "docker.io/library/busybox:latest",
            ]
        );
        assert_eq!(
            alternative_spellings(&format!("GHCR.IO:0443/acme/app:v1@{DIGEST}")),
            [
                format!("ghcr.io/acme/app:v1@{DIGEST}"),
                format!("GHCR.IO:0443/acme/app@{DIGEST}"),
                format!("ghcr.io/acme/app@{DIGEST}"),
            ]
        );
        assert_eq!(
            alternative_spellings("ghcr.io/acme/app:v1"),
            Vec::<String>::new()
        );
        assert_eq!(
            alternative_spellings("ghcr.io/acme/app"),
            ["ghcr.io/acme/app:latest"]
        );
    }
}
