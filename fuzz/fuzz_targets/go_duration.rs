//! The `?timeout=` query parameter the API server appends to every webhook call (a Go
//! duration), and the request budget derived from it.
//!
//! Checked properties: the budget never exceeds the timeout and its deadline lies ahead of
//! the request start; a duration read from the query is the duration the parser gives.
//!
//! `budget.rs` is compiled into the target as is: it needs only std and tokio, and depending
//! on ivory-server would build kube, k8s-openapi and axum with sanitizers for one parser.
#![no_main]

#[path = "../../crates/ivory-server/src/budget.rs"]
#[allow(dead_code)]
mod budget;

use std::time::Duration;

use budget::{Budget, parse_go_duration, timeout_from_query};
use libfuzzer_sys::fuzz_target;
use tokio::time::Instant;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse_go_duration(text);
    if !text.contains(['&', '=']) {
        assert_eq!(timeout_from_query(Some(&format!("timeout={text}"))), parsed);
    }
    let from_query = timeout_from_query(Some(text));
    let start = Instant::now();
    for timeout in [parsed, from_query] {
        for policy in [None, Some(Duration::from_secs(30))] {
            let b = Budget::new(start, timeout, policy);
            assert!(
                b.budget <= b.timeout,
                "budget above the timeout for {text:?}"
            );
            assert!(
                b.deadline >= start,
                "deadline before the start for {text:?}"
            );
        }
    }
});
