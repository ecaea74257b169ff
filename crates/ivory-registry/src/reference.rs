//! Image references for oci-client, parsed by `ivory-reference` (go-containerregistry's rules,
//! which Kyverno uses) rather than by oci-spec's parser: that one compiles a large regex on
//! first use and runs it with captures on every call, which dominated both a one-shot CLI
//! verification and the warm path (figures: BENCHMARKS.md).

use ivory_reference::ImageReference;
use oci_client::Reference;

use crate::error::{Error, Result};

/// `image` as an oci-client [`Reference`]. Docker Hub names get `index.docker.io` and the
/// `library/` namespace, as oci-client resolves them anyway.
pub fn parse_reference(image: &str) -> Result<Reference> {
    let parsed = ImageReference::parse(image).map_err(|e| Error::InvalidReference {
        image: image.to_owned(),
        registry: String::new(),
        detail: e.reason.to_string(),
    })?;
    let registry = parsed.registry().to_owned();
    let repository = parsed.repository().to_owned();
    Ok(match (parsed.digest(), parsed.original_tag()) {
        (Some(digest), Some(tag)) => {
            Reference::with_tag_and_digest(registry, repository, tag.to_owned(), digest.to_owned())
        }
        (Some(digest), None) => Reference::with_digest(registry, repository, digest.to_owned()),
        (None, _) => Reference::with_tag(
            registry,
            repository,
            parsed.tag().unwrap_or("latest").to_owned(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501";

    #[test]
    fn tags_digests_and_docker_hub_names() {
        let r = parse_reference("nginx").unwrap();
        assert_eq!(
            (r.resolve_registry(), r.repository(), r.tag(), r.digest()),
            ("index.docker.io", "library/nginx", Some("latest"), None)
        );
        let r = parse_reference(&format!("127.0.0.1:5000/a/b:v1@{DIGEST}")).unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag(), r.digest()),
            ("127.0.0.1:5000", "a/b", Some("v1"), Some(DIGEST))
        );
        assert_eq!(r.whole(), format!("127.0.0.1:5000/a/b:v1@{DIGEST}"));
        let r = parse_reference(&format!("ghcr.io/o/r@{DIGEST}")).unwrap();
        assert_eq!((r.tag(), r.digest()), (None, Some(DIGEST)));
    }

    #[test]
    fn invalid_references_name_the_image() {
        for bad in ["", "UPPER/case:v1", "a/b@sha256:short", "a/b:"] {
            let err = parse_reference(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
