//! Shared by the `ivory-bench` load harness and the divan micro-benchmarks: the realistic
//! AdmissionReview and the key-verification policy.

pub mod policy;
pub mod review;
