//! [`Failures`]: case tables that report every failing case, not just the first.
//!
//! A scenario test lists its cases as a table (`struct Case { name, input..., expect... }`),
//! checks each into one [`Failures`], and ends with [`Failures::assert_none`], so one run
//! names every case that broke.

use std::fmt::{Debug, Display, Write as _};

/// The failures of a case table so far: each case's name and why it failed.
#[derive(Debug, Default)]
#[must_use = "a case table ends with assert_none, or its failures go unreported"]
pub struct Failures {
    failed: Vec<(String, String)>,
}

impl Failures {
    /// No failures yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that case `case` failed because of `reason`.
    pub fn fail(&mut self, case: &str, reason: impl Display) {
        self.failed.push((case.to_owned(), reason.to_string()));
    }

    /// Records a failure of case `case` unless `holds`; `reason` says what was expected.
    pub fn check(&mut self, case: &str, holds: bool, reason: impl FnOnce() -> String) {
        if !holds {
            self.fail(case, reason());
        }
    }

    /// Records a failure of case `case` when its `what` is `actual` instead of `expected`.
    pub fn check_eq<A, E>(&mut self, case: &str, what: &str, actual: A, expected: E)
    where
        A: PartialEq<E> + Debug,
        E: Debug,
    {
        if actual != expected {
            self.fail(
                case,
                format!("{what}: got {actual:?}, expected {expected:?}"),
            );
        }
    }

    /// Records the error of a case's result, if it has one.
    pub fn check_ok<T, E: Display>(&mut self, case: &str, result: Result<T, E>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(err) => {
                self.fail(case, err);
                None
            }
        }
    }

    /// Whether no case has failed.
    pub fn is_empty(&self) -> bool {
        self.failed.is_empty()
    }

    /// Panics listing every failed case, one a line, when there is any.
    #[track_caller]
    pub fn assert_none(self) {
        if self.failed.is_empty() {
            return;
        }
        let mut report = format!("{} case(s) failed:", self.failed.len());
        for (case, reason) in &self.failed {
            let _ = write!(report, "\n  {case}: {reason}");
        }
        panic!("{report}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_is_reported() {
        let mut failures = Failures::new();
        failures.check_eq("one", "answer", 1, 1);
        failures.check_eq("two", "answer", 2, 3);
        failures.check("three", false, || "was false".to_owned());
        failures.fail("four", "broke");
        assert!(!failures.is_empty());
        let panic = std::panic::catch_unwind(|| failures.assert_none()).unwrap_err();
        let text = panic.downcast_ref::<String>().unwrap();
        assert!(text.starts_with("3 case(s) failed:"), "{text}");
        assert!(text.contains("two: answer: got 2, expected 3"), "{text}");
        assert!(text.contains("three: was false"), "{text}");
        assert!(text.contains("four: broke"), "{text}");
        assert!(!text.contains("one"), "{text}");
    }

    #[test]
    fn no_failures_pass() {
        let mut failures = Failures::new();
        assert_eq!(failures.check_ok("ok", Ok::<_, String>(5)), Some(5));
        failures.assert_none();
    }
}
