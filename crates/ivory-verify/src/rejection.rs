//! Why an image is not verified by an attestor: the engine's typed [`Rejection`], which
//! `Verification::NotVerified` carries as it is (through every cache, the shared one included),
//! so its text is rendered only where people read it.

pub use ivory_engine::verifier::{Rejection, Sought};
