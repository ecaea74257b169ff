//! Bounded JSON parsing for registry bytes: a byte scan refuses a document whose parsed
//! `serde_json` tree would grow far past its size before any tree is built.

use serde::de::DeserializeOwned;

/// Most a counted value may cost once parsed: its `Value` slot, `Vec` doubling slack or a
/// B-tree entry shared with its key, and the smallest heap chunk of a short string.
pub const VALUE_COST_BYTES: usize = 96;
/// Most an object may cost once parsed beyond its entries: one B-tree leaf node (eleven key
/// and value slots) with allocator rounding.
pub const OBJECT_COST_BYTES: usize = 768;

/// How much of a tree a JSON document may describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonLimits {
    /// Values, counted as the scan counts them (see [`JsonShape::values`]).
    pub max_values: usize,
    /// Objects (`{`), the nodes that cost far more per byte than anything else.
    pub max_objects: usize,
}

impl JsonLimits {
    /// Registry answers that describe images: manifests, indexes, referrers, tag pages.
    pub const MANIFEST: Self = Self {
        max_values: 64 * 1024,
        max_objects: 8 * 1024,
    };

    /// Signature and attestation payloads (DSSE envelopes, in-toto statements carrying
    /// SBOMs, simple-signing payloads, Rekor bodies, image configs). Sized so the
    /// worst-case tree, `max_values * VALUE_COST_BYTES + max_objects * OBJECT_COST_BYTES`
    /// plus the document's own string bytes, stays within [`Self::SIGNATURE_TREE_BUDGET`]
    /// while an SPDX or CycloneDX SBOM of a few thousand packages (each an object with
    /// checksum and reference objects) still fits. Objects are the scarcer allowance because
    /// they cost several times more per byte than any other value.
    pub const SIGNATURE: Self = Self {
        max_values: 200 * 1024,
        max_objects: 16 * 1024,
    };

    /// The worst-case tree, in bytes, that [`Self::SIGNATURE`] allows beyond string bytes.
    pub const SIGNATURE_TREE_BUDGET: usize = 32 * 1024 * 1024;

    /// The worst-case tree these limits allow, string contents aside.
    pub const fn worst_case_tree_bytes(&self) -> usize {
        self.max_values * VALUE_COST_BYTES + self.max_objects * OBJECT_COST_BYTES
    }
}

const _: () =
    assert!(JsonLimits::SIGNATURE.worst_case_tree_bytes() <= JsonLimits::SIGNATURE_TREE_BUDGET);

/// Counts of what a JSON text would become once parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonShape {
    /// One for the document plus one per `,`, `:` and `[` outside strings: an upper bound
    /// on the values and map entries the tree holds.
    pub values: usize,
    /// `{` outside strings.
    pub objects: usize,
}

impl JsonShape {
    /// Whether this shape stays within `limits`.
    pub fn fits(&self, limits: &JsonLimits) -> bool {
        self.values <= limits.max_values && self.objects <= limits.max_objects
    }
}

/// Why bounded parsing refused a document. Neither variant carries the document's text.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    /// The document would build a tree past its limits; nothing was parsed.
    #[error(
        "holds {} JSON values and {} objects, more than the {} values or {} objects allowed",
        shape.values, shape.objects, limits.max_values, limits.max_objects
    )]
    TooComplex {
        /// What the scan counted.
        shape: JsonShape,
        /// The limits it broke.
        limits: JsonLimits,
    },
    /// The document is not JSON of the expected form. Shown as the error class and
    /// position only: `serde_json` messages may quote the input.
    #[error("is not JSON of the expected form ({})", where_malformed(.0))]
    Malformed(#[from] serde_json::Error),
}

impl ShapeError {
    /// Whether the document was refused for its shape (a hostile sign) rather than its syntax.
    pub fn is_too_complex(&self) -> bool {
        matches!(self, Self::TooComplex { .. })
    }
}

fn where_malformed(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let class = match e.classify() {
        Category::Io => "read error",
        Category::Syntax => "syntax error",
        Category::Data => "unexpected content",
        Category::Eof => "truncated",
    };
    format!("{class} at line {} column {}", e.line(), e.column())
}

/// A byte scan (strings skipped) counting objects and values, so a hostile body can be
/// refused before `serde_json` builds its tree. Approximate for invalid JSON, which the
/// parser refuses anyway.
pub fn json_shape(bytes: &[u8]) -> JsonShape {
    let (mut values, mut objects) = (1usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => objects += 1,
            b',' | b'[' | b':' => values += 1,
            _ => {}
        }
    }
    JsonShape { values, objects }
}

/// Parses registry bytes into `T` only if their shape fits `limits`, so no document can
/// make ivory build a tree much larger than a small multiple of its bytes.
pub fn parse_json_bounded<T: DeserializeOwned>(
    bytes: &[u8],
    limits: &JsonLimits,
) -> Result<T, ShapeError> {
    let shape = json_shape(bytes);
    if !shape.fits(limits) {
        return Err(ShapeError::TooComplex {
            shape,
            limits: *limits,
        });
    }
    Ok(serde_json::from_slice(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn json_shape_counts_values_and_objects_outside_strings() {
        let shape = json_shape(br#"{"a":[1,2,{"b":"x,y:{[\"]"}],"c":null}"#);
        assert_eq!(
            shape,
            JsonShape {
                values: 8,
                objects: 2
            }
        );
    }

    #[test]
    fn refuses_shapes_past_the_limits_before_parsing() {
        let limits = JsonLimits::MANIFEST;
        let many = format!("[{}]", vec![r#"{"a":0}"#; limits.max_objects + 1].join(","));
        let err = parse_json_bounded::<Value>(many.as_bytes(), &limits).unwrap_err();
        assert!(err.is_too_complex(), "{err}");
        assert!(err.to_string().contains("objects allowed"), "{err}");
        assert!(!err.to_string().contains("\"a\""), "{err}");
        let wide = format!("[{}]", vec!["0"; limits.max_values + 1].join(","));
        assert!(
            parse_json_bounded::<Value>(wide.as_bytes(), &limits)
                .unwrap_err()
                .is_too_complex()
        );
        let err = parse_json_bounded::<Value>(b"[0,", &limits).unwrap_err();
        assert!(!err.is_too_complex(), "{err}");
        let err = parse_json_bounded::<Vec<u8>>(br#"["secret-text"]"#, &limits).unwrap_err();
        assert_eq!(
            err.to_string(),
            "is not JSON of the expected form (unexpected content at line 1 column 14)"
        );
        let ok: Vec<u8> = parse_json_bounded(b"[0,0,0]", &limits).unwrap();
        assert_eq!(ok, [0, 0, 0]);
    }

    #[test]
    fn signature_limits_admit_what_manifest_limits_admit() {
        let (m, s) = (JsonLimits::MANIFEST, JsonLimits::SIGNATURE);
        assert!(s.max_values >= m.max_values && s.max_objects >= m.max_objects);
    }
}
