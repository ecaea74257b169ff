//! Shared by the `ivory-bench` load harness and the divan micro-benchmarks: the realistic
//! AdmissionReview and the key-verification policy.

#![warn(missing_docs)]

pub mod policy;
pub mod review;
