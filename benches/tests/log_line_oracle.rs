//! The oracle of the binary's hand-written log path: the admission lines written through
//! `crates/ivory/src/json_log.rs`'s format and `crates/ivory/src/log_writer.rs`'s batching
//! writer are the lines tracing-subscriber's `json()` layer writes through tracing-appender's
//! `non_blocking` writer, byte for byte but for the timestamps (each takes its own clock
//! reading). The two modules are included by path, as the `log_line` bench includes them.

// Helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::Dispatch;

#[path = "../../crates/ivory/src/json_log.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod json_log;
#[path = "../../crates/ivory/src/log_writer.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod log_writer;

/// A shared buffer both writers write into.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The lines written, each with its timestamp's value blanked.
    fn lines(&self) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                let stamp = value["timestamp"].as_str().unwrap();
                line.replacen(stamp, "T", 1)
            })
            .collect()
    }
}

/// `ivory_server::routes::log_admission`'s event, with values that need escaping too.
fn lines() {
    for (i, name) in ["web-1", "we\"b\\2", "tab\there", "ünïcode\u{202e}", "\u{1}"]
        .into_iter()
        .enumerate()
    {
        tracing::info!(
            route = "/validate/ivpol/verify-images",
            uid = "8f2b8c1e-5f0e-4c36-9d43-2f1a7c5d9e01",
            kind = "Pod",
            namespace = "team-a",
            name,
            operation = "CREATE",
            dry_run = i % 2 == 0,
            outcome = "allowed",
            elapsed_ms = i as u64,
            budget_ms = 9000u64,
            warnings = i,
            denial = "",
            "admission"
        );
    }
}

#[test]
fn ivory_writes_the_lines_the_stock_layer_and_appender_write() {
    let ours = Captured::default();
    {
        let bounds = log_writer::Bounds {
            lines: 8192,
            bytes: 16 << 20,
        };
        let (log, sink) = log_writer::BatchedLog::start(ours.clone(), bounds).unwrap();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(false)
            .event_format(json_log::JsonLines::new())
            .with_writer(sink)
            .finish();
        let activity = log.activity();
        tracing::dispatcher::with_default(&Dispatch::new(subscriber), || {
            activity(true);
            lines();
            activity(false);
        });
        drop(log); // writes out what waits
    }
    let theirs = Captured::default();
    {
        let (writer, guard) = tracing_appender::non_blocking(theirs.clone());
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(writer)
            .finish();
        tracing::dispatcher::with_default(&Dispatch::new(subscriber), lines);
        drop(guard); // flushes
    }
    let (ours, theirs) = (ours.lines(), theirs.lines());
    assert_eq!(ours.len(), 5);
    assert_eq!(ours, theirs);
}
