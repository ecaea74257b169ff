//! ivory-engine: admission decisions for image validating policies.
//!
//! Given an AdmissionRequest and the compiled policies a route selects, it matches, extracts
//! images, evaluates CEL, asks the [`verifier::ImageVerifier`] seam for digests and signatures,
//! and returns a [`decision::Decision`]. It does no IO of its own.

pub mod admission;
mod bindings;
pub mod decision;
pub mod exceptions;
pub mod images;
pub mod matching;
pub mod mutate;
pub mod resources;
pub mod validate;
pub mod verifier;
