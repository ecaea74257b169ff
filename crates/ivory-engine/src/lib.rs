//! ivory-engine: admission decisions for image validating policies.
//!
//! Given an AdmissionRequest and the compiled policies a route selects, it matches, extracts
//! images, evaluates CEL, asks the [`verifier::ImageVerifier`] seam for digests and signatures,
//! and returns a [`decision::Decision`]. It does no IO of its own. Every front end judges a
//! request through [`pipeline::Pipeline::judge`].

pub mod admission;
mod bindings;
pub mod decision;
pub mod exceptions;
pub mod images;
pub mod json_text;
pub mod keyed;
pub mod matching;
pub mod mutate;
pub mod pipeline;
pub mod resources;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod validate;
pub mod verifier;
