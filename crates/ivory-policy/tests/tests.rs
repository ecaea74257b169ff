//! Integration tests: every shipped policy file (Kyverno examples, samples, default) loads.

mod files;
