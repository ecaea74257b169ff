//! ivory-verify: cosign and Sigstore signature verification for ivory, implementing the
//! engine's [`ivory_engine::verifier::ImageVerifier`] seam.
//!
//! * [`check`]: the synchronous core (no IO): legacy `.sig`/`.att` layers and Sigstore bundles
//!   v0.1–v0.3 checked by sigstore-verify against each attestor's trust material.
//! * [`plan`]: an attestor turned into keys, identities and a trust root.
//! * [`envelope`]: signature material as stored in registries.

mod chain;
pub mod check;
pub mod envelope;
mod keys;
pub mod plan;
pub mod trust;

pub use check::{Accepted, evaluate};
pub use envelope::{Envelope, Legacy};
pub use plan::Plan;
pub use trust::PUBLIC_GOOD_TRUSTED_ROOT;
pub use verifier::{CosignVerifier, CredentialsResolver, VerifierConfig};

mod verifier;
