//! Image references as the registry client reads them: `ivory-reference`'s [`ImageReference`]
//! (go-containerregistry's rules, which Kyverno uses), the one reference type of the workspace,
//! with errors that name the image.

use ivory_reference::ImageReference;

use crate::error::{Error, Result};

/// `image` parsed; Docker Hub names get `index.docker.io` and the `library/` namespace.
pub fn parse_reference(image: &str) -> Result<ImageReference> {
    ImageReference::parse(image).map_err(|e| Error::InvalidReference {
        image: image.to_owned(),
        registry: String::new(),
        detail: e.reason.to_string(),
    })
}

/// The image `<repository>:<tag>` or `<repository>@<digest>` next to `reference`: the OCI
/// referrers tag, or an index's child manifest. `separator` is `:` or `@`.
pub(crate) fn sibling(
    reference: &ImageReference,
    separator: char,
    identifier: &str,
) -> Result<ImageReference> {
    parse_reference(&format!(
        "{}{separator}{identifier}",
        reference.repository_name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501";

    #[test]
    fn tags_digests_and_docker_hub_names() {
        let r = parse_reference("nginx").unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag(), r.digest()),
            ("index.docker.io", "library/nginx", Some("latest"), None)
        );
        assert_eq!(r.name(), "index.docker.io/library/nginx:latest");
        let r = parse_reference(&format!("127.0.0.1:5000/a/b:v1@{DIGEST}")).unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag(), r.digest()),
            ("127.0.0.1:5000", "a/b", None, Some(DIGEST))
        );
        assert_eq!(
            (r.original_tag(), r.name()),
            (Some("v1"), format!("127.0.0.1:5000/a/b@{DIGEST}"))
        );
        let r = parse_reference(&format!("ghcr.io/o/r@{DIGEST}")).unwrap();
        assert_eq!((r.tag(), r.digest()), (None, Some(DIGEST)));
    }

    #[test]
    fn siblings_share_the_repository() {
        let r = parse_reference("nginx:1.27").unwrap();
        let by_digest = sibling(&r, '@', DIGEST).unwrap();
        assert_eq!(
            by_digest.name(),
            format!("index.docker.io/library/nginx@{DIGEST}")
        );
        let by_tag = sibling(&by_digest, ':', "sha256-abc").unwrap();
        assert_eq!(by_tag.name(), "index.docker.io/library/nginx:sha256-abc");
        assert!(sibling(&r, ':', "not a tag").is_err());
    }

    #[test]
    fn invalid_references_name_the_image() {
        for bad in ["", "UPPER/case:v1", "a/b@sha256:short", "a/b:"] {
            let err = parse_reference(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
