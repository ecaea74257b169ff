//! Raw manifests and their media types.

use crate::error::{Error, Site, truncate};
use crate::json::{JsonLimits, ShapeError, parse_json_bounded};

/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker schema 2 manifest.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list.
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Every manifest media type we ask for and accept.
pub const ACCEPTED_MEDIA_TYPES: &[&str] = &[
    OCI_MANIFEST,
    OCI_INDEX,
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
];

/// A fetched manifest: digest-verified bytes and parsed JSON.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// `sha256:…` of `bytes`.
    pub digest: String,
    /// One of [`ACCEPTED_MEDIA_TYPES`].
    pub media_type: String,
    /// Exact bytes served (what signatures cover).
    pub bytes: Vec<u8>,
    /// `bytes` parsed, for reading descriptors and media types.
    pub json: serde_json::Value,
}

impl Manifest {
    /// True for an OCI index or Docker manifest list.
    pub fn is_index(&self) -> bool {
        self.media_type == OCI_INDEX || self.media_type == DOCKER_MANIFEST_LIST
    }

    /// Children of an index as `(digest, platform)`; empty for image manifests.
    pub fn children(&self) -> Vec<(String, Option<serde_json::Value>)> {
        self.json
            .get("manifests")
            .and_then(|m| m.as_array())
            .map(|entries| {
                entries
                    .iter()
                    .filter_map(|e| {
                        let d = e.get("digest")?.as_str()?.to_string();
                        Some((d, e.get("platform").cloned()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Reads `bytes` served for `image` by `registry` exactly as a fetched manifest is read.
    /// Entry point for the fuzz targets (`fuzz/`), not part of the supported API.
    #[doc(hidden)]
    pub fn from_served(
        image: &str,
        registry: &str,
        digest: String,
        bytes: Vec<u8>,
    ) -> Result<Self, Error> {
        let site = Site {
            op: crate::operation::Operation::FetchManifest,
            image,
            registry,
        };
        parse(&site, digest, bytes)
    }
}

/// Parses a registry answer into a JSON tree, refusing shapes that would grow far past the
/// body's size in memory. Errors are ivory's words, never the body's.
pub(crate) fn parse_json(
    site: &Site<'_>,
    what: &str,
    bytes: &[u8],
) -> Result<serde_json::Value, Error> {
    parse_json_bounded(bytes, &JsonLimits::MANIFEST).map_err(|e| {
        if let ShapeError::TooComplex { shape, .. } = &e {
            tracing::warn!(registry = %site.registry, image = %site.image, ?shape, "registry answer has too many JSON values");
        }
        site.invalid_manifest(format!("{what} {e}"))
    })
}

/// Parses manifest bytes, deciding the media type from the body (what the digest covers,
/// unlike the header); unknown or schema-1 types are refused. Errors never quote the body.
pub(crate) fn parse(site: &Site<'_>, digest: String, bytes: Vec<u8>) -> Result<Manifest, Error> {
    let json = parse_json(site, "manifest", &bytes)?;
    let obj = json
        .as_object()
        .ok_or_else(|| site.invalid_manifest("manifest is not a JSON object"))?;
    match obj.get("schemaVersion").and_then(|v| v.as_i64()) {
        Some(2) => {}
        Some(v) => {
            return Err(site.invalid_manifest(format!("unsupported schemaVersion {v}")));
        }
        None => return Err(site.invalid_manifest("missing schemaVersion")),
    }
    let media_type = match obj.get("mediaType").and_then(|v| v.as_str()) {
        Some(mt) if ACCEPTED_MEDIA_TYPES.contains(&mt) => mt.to_string(),
        Some(mt) => {
            tracing::info!(registry = %site.registry, image = %site.image,
                media_type = %truncate(mt), "manifest of an unknown media type");
            return Err(site.invalid_manifest("unknown media type"));
        }
        // mediaType is optional in OCI; the shape tells index from manifest.
        None if obj.contains_key("manifests") => OCI_INDEX.to_string(),
        None if obj.contains_key("config") => OCI_MANIFEST.to_string(),
        None => return Err(site.invalid_manifest("neither manifests nor config present")),
    };
    let is_index = media_type == OCI_INDEX || media_type == DOCKER_MANIFEST_LIST;
    let shape_ok = if is_index {
        obj.get("manifests").is_some_and(|m| m.is_array())
    } else {
        obj.get("config").is_some_and(|c| c.is_object())
    };
    if !shape_ok {
        return Err(site.invalid_manifest(format!("body does not match media type {media_type}")));
    }
    Ok(Manifest {
        digest,
        media_type,
        bytes,
        json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> Site<'static> {
        Site {
            op: crate::operation::Operation::FetchManifest,
            image: "r/x:1",
            registry: "r",
        }
    }

    fn p(body: &str) -> Result<Manifest, Error> {
        parse(&site(), "sha256:x".into(), body.as_bytes().to_vec())
    }

    #[test]
    fn accepts_every_known_type_and_infers_missing_media_type() {
        let m = p(r#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{},"layers":[]}"#).unwrap();
        assert!(!m.is_index());
        let m = p(
            r#"{"schemaVersion":2,"manifests":[{"digest":"sha256:a","platform":{"os":"linux"}}]}"#,
        )
        .unwrap();
        assert!(m.is_index());
        assert_eq!(m.media_type, OCI_INDEX);
        assert_eq!(m.children()[0].0, "sha256:a");
        let m = p(r#"{"schemaVersion":2,"config":{},"layers":[]}"#).unwrap();
        assert_eq!(m.media_type, OCI_MANIFEST);
    }

    #[test]
    fn parse_json_refuses_hostile_shapes_in_ivory_words() {
        let many = format!(
            "[{}]",
            vec![r#"{"a":0}"#; JsonLimits::MANIFEST.max_objects + 1].join(",")
        );
        let err = parse_json(&site(), "manifest", many.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("manifest holds"), "{err}");
        assert!(parse_json(&site(), "manifest", b"[0,0,0]").is_ok());
    }

    #[test]
    fn refuses_unknown_malformed_and_schema1() {
        for (body, want) in [
            (
                r#"{"schemaVersion":2,"mediaType":"application/x-evil","config":{}}"#,
                "unknown media type",
            ),
            (r#"{"schemaVersion":1,"name":"x"}"#, "schemaVersion 1"),
            ("[1,2]", "not a JSON object"),
            ("{oops", "not JSON"),
            (
                r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","config":{}}"#,
                "does not match",
            ),
        ] {
            let err = p(body).unwrap_err().to_string();
            assert!(err.contains(want), "{body}: {err}");
            assert!(err.contains("r/x:1"), "{err}");
        }
    }
}
