use ivory_testkit::cases::Failures;

use super::*;

const DIGEST: &str = "sha256:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501";

fn parsed(s: &str) -> ImageReference {
    ImageReference::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// (input, registry, repository, tag, digest, identifier)
type Case = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    &'static str,
);

/// References as go-containerregistry parses them.
fn parse_cases() -> Vec<Case> {
    vec![
        (
            "nginx",
            "index.docker.io",
            "library/nginx",
            Some("latest"),
            None,
            "latest",
        ),
        (
            "nginx:1.25",
            "index.docker.io",
            "library/nginx",
            Some("1.25"),
            None,
            "1.25",
        ),
        (
            "library/nginx",
            "index.docker.io",
            "library/nginx",
            Some("latest"),
            None,
            "latest",
        ),
        (
            "docker.io/nginx",
            "index.docker.io",
            "library/nginx",
            Some("latest"),
            None,
            "latest",
        ),
        (
            "index.docker.io/library/nginx:1",
            "index.docker.io",
            "library/nginx",
            Some("1"),
            None,
            "1",
        ),
        (
            "bitnami/redis:7",
            "index.docker.io",
            "bitnami/redis",
            Some("7"),
            None,
            "7",
        ),
        (
            "ghcr.io/kyverno/test-verify-image:signed",
            "ghcr.io",
            "kyverno/test-verify-image",
            Some("signed"),
            None,
            "signed",
        ),
        (
            "localhost:5000/x/y:dev",
            "localhost:5000",
            "x/y",
            Some("dev"),
            None,
            "dev",
        ),
        (
            "localhost:5000/xy",
            "localhost:5000",
            "xy",
            Some("latest"),
            None,
            "latest",
        ),
        // ggcr treats a first component without '.' or ':' as part of a Docker Hub repository
        (
            "localhost/foo",
            "index.docker.io",
            "localhost/foo",
            Some("latest"),
            None,
            "latest",
        ),
        (
            "registry.example.com:443/team/app",
            "registry.example.com:443",
            "team/app",
            Some("latest"),
            None,
            "latest",
        ),
        (
            "[::1]:5000/app:v1",
            "[::1]:5000",
            "app",
            Some("v1"),
            None,
            "v1",
        ),
        (
            "gcr.io/a/b/c/d:Tag_1.2-x",
            "gcr.io",
            "a/b/c/d",
            Some("Tag_1.2-x"),
            None,
            "Tag_1.2-x",
        ),
    ]
}

#[test]
fn parses_like_go_containerregistry() {
    let digest_ref = format!("ghcr.io/a/b@{DIGEST}");
    let tag_digest_ref = format!("nginx:1.25@{DIGEST}");
    let mut failures = Failures::new();
    for (input, registry, repository, tag, digest, identifier) in parse_cases() {
        let Some(r) = failures.check_ok(input, ImageReference::parse(input)) else {
            continue;
        };
        failures.check_eq(input, "registry", r.registry(), registry);
        failures.check_eq(input, "repository", r.repository(), repository);
        failures.check_eq(input, "tag", r.tag(), tag);
        failures.check_eq(input, "digest", r.digest(), digest);
        failures.check_eq(input, "identifier", r.identifier(), identifier);
        failures.check_eq(input, "original", r.original(), input);
    }
    failures.assert_none();
    let r = parsed(&digest_ref);
    assert_eq!((r.registry(), r.repository()), ("ghcr.io", "a/b"));
    assert_eq!(
        (r.tag(), r.digest(), r.identifier()),
        (None, Some(DIGEST), DIGEST)
    );
    assert_eq!(r.original_tag(), None);

    // repo:tag@digest parses as a digest reference; the tag is kept only as written
    let r = parsed(&tag_digest_ref);
    assert_eq!(r.repository(), "library/nginx");
    assert_eq!(r.tag(), None);
    assert_eq!(r.digest(), Some(DIGEST));
    assert_eq!(r.original_tag(), Some("1.25"));
}

#[test]
fn rejects_invalid_references() {
    for bad in [
        "",
        "Nginx",
        "ghcr.io/Acme/app",
        "nginx:",
        "nginx:bad tag",
        "a",
        "nginx@sha256:abc",
        "nginx@sha512:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501",
        "nginx@sha256:E2E16842C9B54D985BF1EF9242A313F36B856181F188DE21313820E177002501",
        "a@b@c",
        "ghcr.io:port/app",
        "nginx:tag:tag",
        "has space/app",
    ] {
        let err = ImageReference::parse(bad).expect_err(bad);
        assert_eq!(err.input, bad);
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
    }
    let too_long_tag = format!("nginx:{}", "t".repeat(129));
    assert!(ImageReference::parse(&too_long_tag).is_err());
}

#[test]
fn kyverno_normalisation_and_pinning() {
    assert_eq!(
        parsed("nginx").kyverno_normalized(),
        "docker.io/nginx:latest"
    );
    assert_eq!(
        parsed("nginx:1.25").kyverno_normalized(),
        "docker.io/nginx:1.25"
    );
    assert_eq!(
        parsed("library/nginx").kyverno_normalized(),
        "docker.io/library/nginx:latest"
    );
    assert_eq!(
        parsed("index.docker.io/nginx").kyverno_normalized(),
        "index.docker.io/nginx:latest"
    );
    assert_eq!(
        parsed("ghcr.io/a/b:t").kyverno_normalized(),
        "ghcr.io/a/b:t"
    );
    assert_eq!(
        parsed("localhost/foo:1").kyverno_normalized(),
        "localhost/foo:1"
    );
    assert_eq!(
        parsed("localhost:5000/foo").kyverno_normalized(),
        "localhost:5000/foo:latest"
    );
    assert_eq!(
        parsed(&format!("ghcr.io/a/b:t@{DIGEST}")).kyverno_normalized(),
        format!("ghcr.io/a/b@{DIGEST}")
    );
    assert_eq!(
        parsed("nginx").with_digest(DIGEST),
        format!("docker.io/nginx:latest@{DIGEST}")
    );
    assert_eq!(
        parsed("ghcr.io/a/b:v2").with_digest(DIGEST),
        format!("ghcr.io/a/b:v2@{DIGEST}")
    );
}
