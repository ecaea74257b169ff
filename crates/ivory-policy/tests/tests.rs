//! Integration tests: every shipped policy file (Kyverno examples, samples, default) loads;
//! the deploy/ manifests match the serde model and render.

mod crds;
mod files;
