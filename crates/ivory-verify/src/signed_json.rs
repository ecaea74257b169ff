//! JSON read from signature material (blobs, payloads, log entry bodies), parsed under
//! [`JsonLimits::SIGNATURE`] so no blob can make ivory build a tree far larger than its bytes.
//! A leaf: every reader of signature JSON (`envelope`, `verdict`, `legacy_tlog`,
//! `rekor_v2_dsse`, `notation`, `blob`) depends on it and it on none of them.

use ivory_registry::{JsonLimits, ShapeError, json_shape, parse_json_bounded};
use serde::de::DeserializeOwned;

use crate::rejection::Rejection;

/// Parses JSON read from a signature or attestation blob under [`JsonLimits::SIGNATURE`], so
/// no blob can make ivory build a tree far larger than its bytes. `what` names the document
/// in the reason; the blob's text never appears in it.
pub(crate) fn parse_signed_json<T: DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T, Rejection> {
    parse_json_bounded(bytes, &JsonLimits::SIGNATURE).map_err(|e| shape_reason(what, &e))
}

/// Refuses `bytes` when their JSON shape breaks [`JsonLimits::SIGNATURE`], for documents a
/// library parses itself.
pub(crate) fn check_signed_shape(bytes: &[u8], what: &str) -> Result<(), Rejection> {
    let shape = json_shape(bytes);
    if shape.fits(&JsonLimits::SIGNATURE) {
        return Ok(());
    }
    let e = ShapeError::TooComplex {
        shape,
        limits: JsonLimits::SIGNATURE,
    };
    Err(shape_reason(what, &e))
}

fn shape_reason(what: &str, e: &ShapeError) -> Rejection {
    if e.is_too_complex() {
        tracing::warn!(document = what, error = %e, "signature blob refused for its JSON shape");
        Rejection::Malformed(format!("{what} refused as hostile: it {e}"))
    } else {
        Rejection::Malformed(format!("malformed {what}: it {e}"))
    }
}
